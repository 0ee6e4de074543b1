#!/usr/bin/env bash
# Fuzzing campaigns (Jazzer) for the parsers that read what a peer or a file hands kvpool.
#
#   scripts/fuzz.sh                 every target, one after another, each for its @FuzzTest maxDuration (10 min)
#   scripts/fuzz.sh frames http     some of them (names below)
#
# The README's test command runs the same targets in regression mode (their seeds and any inputs a
# campaign found) as ordinary JUnit tests. A campaign's findings (crash-*, timeout-* files) are written
# into the target's *Inputs directory under src/test/resources, so they become regression tests once
# committed; the log of each run is in target/fuzz/NAME.log. Modules the target depends on are built
# in the same reactor (-am), so nothing is installed into the local Maven repository.
set -euo pipefail
cd "$(dirname "$0")/.."
export JAVA_HOME="${JAVA_HOME:-/usr/lib/jvm/temurin-25-jdk-amd64}"

# name -> module, test, and optional Maven flags (-D system properties reach the test JVM). Jazzer
# instruments only the classes built in the project (target/classes) unless told otherwise; the http
# target adds Jackson, whose parser is most of what a body goes through, so coverage guides the
# fuzzer through it too.
declare -A TARGETS=(
  [frames]="kvpool-protocol io.kvpool.protocol.FrameDecodersFuzzTest#everyBodyDecoderAcceptsWholeBodiesOrRefusesCleanly"
  [headers]="kvpool-protocol io.kvpool.protocol.FrameDecodersFuzzTest#frameHeadersAreCheckedBeforeAnythingIsAllocated"
  [logs]="kvpool-node io.kvpool.node.disk.LogScannerFuzzTest#aScanReportsOnlyWholeRecordsInsideTheFile"
  [offload]="kvpool-connector io.kvpool.connector.config.OffloadConfigsFuzzTest#anyConfigTextIsParsedOrRefusedWithAMessage"
  [http]="kvpool-engine io.kvpool.engine.RequestBodiesFuzzTest#anyBodyIsARequestOrARefusalNamingTheField -Djazzer.instrument=io.kvpool.**,com.fasterxml.jackson.**"
)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(frames headers logs offload http)
mkdir -p target/fuzz
status=0
for n in "${names[@]}"; do
  spec="${TARGETS[$n]:-}"
  [ -n "$spec" ] || { echo "fuzz: unknown target $n (known: ${!TARGETS[*]})"; exit 2; }
  read -r module test flags <<<"$spec"
  read -r -a extra <<<"${flags:-}" # words, never globbed
  echo "fuzz: $n ($test) ..."
  if JAZZER_FUZZ=1 ./mvnw -B -o test -pl "$module" -am -Dtest="$test" -Dsurefire.failIfNoSpecifiedTests=false \
      ${extra[@]+"${extra[@]}"} > "target/fuzz/$n.log" 2>&1; then
    result="no finding"
  else
    result="FINDING (see target/fuzz/$n.log)"; status=1
  fi
  stats="$(grep -h -E '^#[0-9]+\s+DONE' "$module"/target/surefire-reports/*-output.txt 2>/dev/null | tail -1 || true)"
  [ -n "$stats" ] || stats="$(grep -h -E '^#[0-9]+' "target/fuzz/$n.log" "$module"/target/surefire-reports/*-output.txt 2>/dev/null | tail -1 || true)"
  echo "fuzz: $n: $result; last libFuzzer line: ${stats:-none}"
done
exit "$status"
