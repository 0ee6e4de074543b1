#!/usr/bin/env bash
# An RL scenario through the launcher: a pool of two local nodes, two engines using it, and a
# trainer that updates the weights every few steps and drives both engines through the reset
# cascade (or versioned keys). Everything started here is stopped by PID on exit.
#
#   scripts/rl-scenario.sh [reset|versioned] [steps] [update-every]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode="${1:-reset}"; steps="${2:-12}"; every="${3:-4}"
if [ "${KVPOOL_RL_INNER:-}" = "1" ]; then
  # inside kvpool launch --run: KVPOOL_CONFIG_PATH names the pool
  pids=()
  trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
  extra=()
  [ "$mode" = versioned ] && extra=(--versioned-keys)
  for port in 8101 8102; do
    "$here/kvpool" engine --port "$port" --kv-blocks 256 "${extra[@]}" > "$KVPOOL_RL_LOGS/engine-$port.log" 2>&1 &
    pids+=($!)
  done
  for port in 8101 8102; do
    for _ in $(seq 1 120); do
      curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
      sleep 0.5
    done
    curl -fs "http://127.0.0.1:$port/health" >/dev/null || { echo "engine on port $port did not start; see $KVPOOL_RL_LOGS"; exit 1; }
  done
  "$here/kvpool" trainer --engines http://127.0.0.1:8101,http://127.0.0.1:8102 --mode "$mode" --steps "$steps" --update-every "$every"
  exit $?
fi
work="$(mktemp -d /tmp/kvpool-rl.XXXXXX)"
cat > "$work/pool.yaml" <<YAML
type: pool
cpu: 512MiB
YAML
mkdir -p "$work/logs"
KVPOOL_RL_INNER=1 KVPOOL_RL_LOGS="$work/logs" exec "$here/kvpool" launch --local 2 --config "$work/pool.yaml" \
  --out "$work/client.json" --log-dir "$work/logs" --master-port 0 --run "$here/scripts/rl-scenario.sh" "$mode" "$steps" "$every"
