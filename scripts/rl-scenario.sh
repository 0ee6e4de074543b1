#!/usr/bin/env bash
# An RL scenario through the launcher: a pool of two local nodes, two engines using it, and a
# trainer that updates the weights every few steps and drives both engines through the reset
# cascade (or versioned keys). The trainer checks every rollout against a recompute that no cache
# can serve (--verify) and exits 1 on any stale output. Everything started here is stopped by PID on
# exit.
#
#   scripts/rl-scenario.sh [reset|versioned] [steps] [update-every] [freeze]
#   scripts/rl-scenario.sh soak [updates] [update-every] [faults]
#
# freeze: a fault drill: the first pool node is stopped (SIGSTOP) just before the first weight
# update and continued (SIGCONT) after the first step under the new weights.
#
# soak (the RL soak; defaults: 1000 updates, one every 2 steps): one pool, and for each of three
# runs a fresh pair of engines (the small "tiny" model: the soak measures the cache, not the model)
# and a trainer with rollouts racing every update (--race) and every completed rollout verified:
#   1. a negative control: 5 updates with no remedy (--mode none --fixed-name: new weights under
#      the old name); its trainer must find stale outputs, or the verification could not see them and
#      the soak fails;
#   2. the hard reset, [updates] updates, every version under one name (--fixed-name), so that the
#      reset cascade alone keeps old KV out;   3. versioned keys, [updates] updates.
# Each trainer starts by emptying the pool (the runs use the same version names).
# Each trainer ends with its summary (updates, rollouts, verified, stale, hit rates, work in flight
# at the updates, time); exit code 0 only if the control found stale outputs and both remedies none.
#
# soak ... faults: the same with faults during each remedy run. The pool then has two masters elected
# through etcd (launch --masters 2, which starts etcd itself) and the launcher restarts a process that
# exits (launch --restart-exited), as a supervisor would. Each remedy trainer injects, through
# scripts/rl-fault.sh, just before these weight updates (K: [updates]/4, /2, 3/4, at least 1, 2, 3):
#   K1 kill-node:   node-0 killed with SIGKILL; started again on its address, it adopts its segment file
#   K2 freeze-node: node-0 stopped with SIGSTOP for KVPOOL_RL_FREEZE seconds (12: past the node TTL,
#                   10 s, and the pool request timeout, 3 s), then SIGCONT
#   K3 kill-leader: the leading master killed with SIGKILL; the standby takes over, the killed one comes
#                   back as a standby
# and its summary adds the hit rate before the first fault and after each (kvpool trainer --fault).
# Between the runs the scenario waits until every fault's watcher saw the pool back. The control runs
# without faults.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode="${1:-reset}"; steps="${2:-12}"; every="${3:-4}"; drill="${4:-}"
if [ "$mode" = soak ]; then
  case "$drill" in
    ""|faults) ;;
    *) echo "rl-scenario.sh soak: 4th argument: faults or nothing, got '$drill'" >&2; exit 2 ;;
  esac
else
  case "$drill" in
    ""|freeze) ;;
    *) echo "rl-scenario.sh: 4th argument: freeze or nothing, got '$drill'" >&2; exit 2 ;;
  esac
fi
if [ "$mode" = soak ]; then
  steps="${2:-1000}"; every="${3:-2}" # soak: steps is the number of updates
  [ "$steps" -ge 1 ] && [ "$every" -ge 2 ] || { echo "rl-scenario.sh soak: updates >= 1 and update-every >= 2 (a first and a later step per version)" >&2; exit 2; }
  [ "$drill" != faults ] || [ "$steps" -ge 3 ] || { echo "rl-scenario.sh soak ... faults: updates >= 3 (one fault before each of three updates)" >&2; exit 2; }
fi
if [ "${KVPOOL_RL_INNER:-}" = "1" ]; then
  # inside kvpool launch --run: KVPOOL_CONFIG_PATH names the pool
  pids=()
  # on the way out: engines stopped; a fault's watcher stopped, and a node it left stopped continued
  cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ -f "$KVPOOL_RL_LOGS/fault-watchers" ]; then
      for p in $(cat "$KVPOOL_RL_LOGS/fault-watchers"); do kill "$p" 2>/dev/null || true; done
    fi
    if [ -f "$KVPOOL_RL_LOGS/pids" ]; then
      for p in $(awk '$1 ~ /^node-/ { print $2 }' "$KVPOOL_RL_LOGS/pids"); do kill -CONT "$p" 2>/dev/null || true; done
    fi
  }
  trap cleanup EXIT
  # start_engines NAME FLAGS...: two engines on ports 8101 and 8102 (KVPOOL_RL_PORT: the first; the
  # second is the next one), logs engine-NAME-PORT.log.
  # Engine i saves to node i (as an engine saves to the node on its own host), so node-0 holds what
  # the first engine of each step computed, which the second one restores. A short pool request
  # timeout: while a node is stopped, a load or save that went to it fails (a miss, recomputed; a
  # dropped save) after 3 s instead of the client's default 30 s
  ports=("${KVPOOL_RL_PORT:-8101}" $((${KVPOOL_RL_PORT:-8101} + 1)))
  start_engines() {
    local name="$1" i=0 port segment
    shift
    engine_pids=()
    for port in "${ports[@]}"; do
      segment=""
      for _ in $(seq 1 100); do  # the node prints its address once it serves: wait for the line
        segment="$(sed -n 's/^kvpool node \([^ ]*\): .*/\1/p' "$KVPOOL_RL_LOGS/node-$i.log" | head -n1)"
        [ -n "$segment" ] && break
        sleep 0.1
      done
      [ -n "$segment" ] || { echo "no address in $KVPOOL_RL_LOGS/node-$i.log"; exit 1; }
      KVPOOL_PREFERRED_SEGMENT="$segment" "$here/kvpool" engine --port "$port" --kv-blocks 256 --request-timeout 3s \
        "$@" > "$KVPOOL_RL_LOGS/engine-$name-$port.log" 2>&1 &
      pids+=($!)
      engine_pids+=($!)
      i=$((i + 1))
    done
    for port in "${ports[@]}"; do
      for _ in $(seq 1 120); do
        curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
        sleep 0.5
      done
      curl -fs "http://127.0.0.1:$port/health" >/dev/null || { echo "engine on port $port did not start; see $KVPOOL_RL_LOGS"; exit 1; }
    done
  }
  stop_engines() {
    local p
    for p in "${engine_pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${engine_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  }
  engines="http://127.0.0.1:${ports[0]},http://127.0.0.1:${ports[1]}"
  # leaderships taken so far (elected masters log one line each time they start serving as leader)
  leaderships() { cat "$KVPOOL_RL_LOGS"/master-*.log 2>/dev/null | grep -c "serving as leader" || true; }
  # wait_faults: waits until every fault's watcher is done (it saw the pool back), at most 120 s each
  wait_faults() {
    local f="$KVPOOL_RL_LOGS/fault-watchers" p
    [ -f "$f" ] || return 0
    for p in $(cat "$f"); do
      for _ in $(seq 1 1200); do
        kill -0 "$p" 2>/dev/null || break
        sleep 0.1
      done
      if kill -0 "$p" 2>/dev/null; then
        echo "rl soak: a fault's watcher (pid $p) still waits for the pool after 120 s; stopping it"
        kill "$p" 2>/dev/null || true
      fi
    done
    rm -f "$f"
  }
  if [ "$mode" = soak ]; then
    updates="$steps"
    quiet=()
    [ "$updates" -ge 100 ] && quiet=(--quiet)
    # the scenario's step (four rollouts per engine over a 256-token task prefix, 8 tokens each) and
    # racing rollouts of 8 to 32 tokens; KVPOOL_RL_SOAK_STEP: other trainer flags for the step, e.g.
    # "--rollouts 2 --prefix-tokens 128" for a cheaper one
    read -r -a step_shape <<< "${KVPOOL_RL_SOAK_STEP:---rollouts 4 --prefix-tokens 256 --race-tokens 32}"
    soak=(--update-every "$every" --race --verify --seed 1 "${step_shape[@]}")
    echo "rl soak: negative control (no remedy, 5 updates): the verification must find stale outputs"
    start_engines control --model tiny
    control=0
    "$here/kvpool" trainer --engines "$engines" --mode none --fixed-name --steps $((5 * every + 1)) "${soak[@]}" || control=$?
    stop_engines
    [ "$control" = 1 ] || { echo "rl soak: the control exited $control, not 1: the verification did not see stale KV"; exit 1; }
    status=0
    faults=()
    if [ "$drill" = faults ]; then
      k1=$((updates / 4)); [ "$k1" -ge 1 ] || k1=1
      k2=$((updates / 2)); [ "$k2" -gt "$k1" ] || k2=$((k1 + 1))
      k3=$((updates * 3 / 4)); [ "$k3" -gt "$k2" ] || k3=$((k2 + 1))
      fault="$(printf '%q' "$here/scripts/rl-fault.sh")"
      # a reset cascade that fails while masters change leader is tried again, the engines staying paused
      faults=(--fault "$k1:$fault kill-node" --fault "$k2:$fault freeze-node" --fault "$k3:$fault kill-leader"
        --reset-retry 60s)
    fi
    for remedy in reset versioned; do
      echo "rl soak: $remedy, $updates updates${faults[*]:+, faults: node-0 killed before update $k1, frozen before $k2, the leader killed before $k3}"
      flags=(--model tiny)
      naming=(--fixed-name) # the reset: every version under one name, so that the reset alone keeps old KV out
      [ "$remedy" = versioned ] && flags+=(--versioned-keys) && naming=()
      start_engines "$remedy" "${flags[@]}"
      led="$(leaderships)"
      csv=() # with faults: the hit tokens by update, for a closer look than the summary's windows
      [ "$drill" = faults ] && csv=(--updates-csv "$KVPOOL_RL_LOGS/updates-$remedy.csv")
      rc=0
      "$here/kvpool" trainer --engines "$engines" --mode "$remedy" "${naming[@]}" --steps $((updates * every + 1)) \
        "${soak[@]}" "${quiet[@]}" "${faults[@]}" "${csv[@]}" || rc=$?
      stop_engines
      wait_faults
      if [ "$drill" = faults ]; then
        echo "rl soak: $remedy: leader changes during the run: $(($(leaderships) - led)) (one from kill-leader; any other: a" \
          "leader that could not renew its etcd lease in time stepped down)"
      fi
      echo "rl soak: $remedy exited $rc"
      [ "$rc" = 0 ] || status=1
    done
    exit "$status"
  fi
  extra=()
  [ "$mode" = versioned ] && extra=(--versioned-keys)
  start_engines "$mode" "${extra[@]}"
  drill_flags=()
  if [ "$drill" = freeze ]; then
    drill_flags=(--freeze-pid "${KVPOOL_NODE_PIDS:?kvpool launch sets KVPOOL_NODE_PIDS}")
    drill_flags[1]="${drill_flags[1]%%,*}" # the first node
  fi
  "$here/kvpool" trainer --engines "$engines" --mode "$mode" --steps "$steps" \
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
# the soak's faults: a leader to kill (two masters through etcd, which the launcher starts), and a
# supervisor that starts a killed process again
[ "$drill" = faults ] && launch_flags=(--masters 2 --restart-exited)
KVPOOL_RL_INNER=1 KVPOOL_RL_LOGS="$work/logs" exec "$here/kvpool" launch --local 2 --config "$work/pool.yaml" \
  --out "$work/client.json" --log-dir "$work/logs" --master-port 0 "${launch_flags[@]}" \
  --run "$here/scripts/rl-scenario.sh" "$mode" "$steps" "$every" $drill
