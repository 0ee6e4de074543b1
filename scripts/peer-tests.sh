#!/usr/bin/env bash
# Runs the peer suite: for each peer NAME with a folder python/peer_tests/NAME/ (default: every one, in
# the order `scripts/peers.sh list` gives), installs the peer if missing or out of date
# (scripts/peers.sh) and runs that folder's tests with the peer's own interpreter. Every peer runs even
# when one before it failed; the exit status is 1 if any install or test failed, and a summary line per
# peer says which. Extra pytest arguments follow `--`:
#
#   scripts/peer-tests.sh                       every peer
#   scripts/peer-tests.sh vllm sglang           two of them
#   scripts/peer-tests.sh mooncake -- -k parity -x
#
# A test that cannot run fails: python/peer_tests/conftest.py turns any skip into a failure.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 1

names=()
while (($#)) && [[ $1 != -- ]]; do
    names+=("$1")
    shift
done
[[ ${1:-} == -- ]] && shift
if ((${#names[@]} == 0)); then
    mapfile -t all < <(scripts/peers.sh list) || exit 1
    for n in "${all[@]}"; do
        [[ -d python/peer_tests/$n ]] && names+=("$n")
    done
fi

summary=()
failed=0
for n in "${names[@]}"; do
    if [[ ! -d python/peer_tests/$n ]]; then
        echo "peer-tests: peer '$n' has no tests (no python/peer_tests/$n/)" >&2
        exit 2
    fi
    started=$SECONDS
    echo "=== peer $n" >&2
    if ! scripts/peers.sh install "$n"; then
        summary+=("peer $n: INSTALL FAILED")
        failed=1
        continue
    fi
    py=$(scripts/peers.sh python "$n") || exit 1
    if "$py" -m pytest -q -p no:cacheprovider -rs "python/peer_tests/$n" "$@"; then
        summary+=("peer $n: passed in $((SECONDS - started))s")
    else
        summary+=("peer $n: FAILED (after $((SECONDS - started))s)")
        failed=1
    fi
done
printf '%s\n' "${summary[@]}" >&2
exit $failed
