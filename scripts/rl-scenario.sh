#!/usr/bin/env bash
# An RL scenario through the launcher: a pool of two local nodes, two engines using it, and a
# trainer that updates the weights every few steps and drives both engines through the reset
# cascade (or versioned keys). The trainer checks every rollout against a recompute that no cache
# can serve (--verify) and exits 1 on any stale output. Everything started here is stopped by PID on
# exit.
#
#   scripts/rl-scenario.sh [reset|versioned] [steps] [update-every] [freeze]
#
# freeze: a fault drill: the first pool node is stopped (SIGSTOP) just before the first weight
# update and continued (SIGCONT) after the first step under the new weights.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode="${1:-reset}"; steps="${2:-12}"; every="${3:-4}"; drill="${4:-}"
case "$drill" in
  ""|freeze) ;;
  *) echo "rl-scenario.sh: 4th argument: freeze or nothing, got '$drill'" >&2; exit 2 ;;
esac
if [ "${KVPOOL_RL_INNER:-}" = "1" ]; then
  # inside kvpool launch --run: KVPOOL_CONFIG_PATH names the pool
  pids=()
  trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
  extra=()
  [ "$mode" = versioned ] && extra=(--versioned-keys)
  # engine i saves to node i (as an engine saves to the node on its own host), so node-0 holds what
  # the first engine of each step computed, which the second one restores. A short pool request
  # timeout: while a node is stopped, a load or save that went to it fails (a miss, recomputed; a
  # dropped save) after 3 s instead of the client's default 30 s
  i=0
  for port in 8101 8102; do
    segment="$(sed -n 's/^kvpool node \([^ ]*\): .*/\1/p' "$KVPOOL_RL_LOGS/node-$i.log" | head -n1)"
    [ -n "$segment" ] || { echo "no address in $KVPOOL_RL_LOGS/node-$i.log"; exit 1; }
    KVPOOL_PREFERRED_SEGMENT="$segment" "$here/kvpool" engine --port "$port" --kv-blocks 256 --request-timeout 3s \
      "${extra[@]}" > "$KVPOOL_RL_LOGS/engine-$port.log" 2>&1 &
    pids+=($!)
    i=$((i + 1))
  done
  for port in 8101 8102; do
    for _ in $(seq 1 120); do
      curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
      sleep 0.5
    done
    curl -fs "http://127.0.0.1:$port/health" >/dev/null || { echo "engine on port $port did not start; see $KVPOOL_RL_LOGS"; exit 1; }
  done
  drill_flags=()
  if [ "$drill" = freeze ]; then
    drill_flags=(--freeze-pid "${KVPOOL_NODE_PIDS:?kvpool launch sets KVPOOL_NODE_PIDS}")
    drill_flags[1]="${drill_flags[1]%%,*}" # the first node
  fi
  "$here/kvpool" trainer --engines http://127.0.0.1:8101,http://127.0.0.1:8102 --mode "$mode" --steps "$steps" \
    --update-every "$every" --verify "${drill_flags[@]}"
  exit $?
fi
work="$(mktemp -d /tmp/kvpool-rl.XXXXXX)"
cat > "$work/pool.yaml" <<YAML
type: pool
cpu: 512MiB
YAML
mkdir -p "$work/logs"
launch_flags=()
# the drill keeps a node stopped for several seconds (about 6 s here: the reset cascade waits out the
# read lease once per engine, then a step runs); a node TTL well above that keeps the master from
# dropping it meanwhile, so the drill always exercises a node that is stopped but still a member
[ "$drill" = freeze ] && launch_flags=(--node-ttl 30s)
KVPOOL_RL_INNER=1 KVPOOL_RL_LOGS="$work/logs" exec "$here/kvpool" launch --local 2 --config "$work/pool.yaml" \
  --out "$work/client.json" --log-dir "$work/logs" --master-port 0 "${launch_flags[@]}" \
  --run "$here/scripts/rl-scenario.sh" "$mode" "$steps" "$every" $drill
