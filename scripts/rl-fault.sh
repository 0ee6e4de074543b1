#!/usr/bin/env bash
# A fault for the RL soak's fault mode (scripts/rl-scenario.sh soak ... faults), injected into the pool
# that `kvpool launch --restart-exited` supervises; run by `kvpool trainer --fault K:COMMAND` just
# before weight update K. It injects the fault, logs it with the time, and returns at once (the
# trainer goes on); a watcher left in the background logs how the pool came back (its pid is appended
# to $KVPOOL_RL_LOGS/fault-watchers, so that the scenario can wait for it). Processes are found by
# pid only: the launcher's $KVPOOL_RL_LOGS/pids (NAME PID per line, rewritten at every start) and, for
# the leader, the leader record in etcd.
#
#   scripts/rl-fault.sh kill-node [NODE]     SIGKILL the node (default node-0); the launcher starts it
#                                            again on its address, where it adopts its segment file
#   scripts/rl-fault.sh freeze-node [NODE]   SIGSTOP the node, SIGCONT it $KVPOOL_RL_FREEZE seconds later
#                                            (default 12: past the master's node TTL of 10 s, so the
#                                            master drops it and it registers again when it runs)
#   scripts/rl-fault.sh kill-leader          SIGKILL the elected master that leads (read from etcd); a
#                                            standby takes over; the launcher starts the killed one again
#                                            as a standby
#
# Needs KVPOOL_RL_LOGS (the launcher's log directory) and, for kill-leader, KVPOOL_CONFIG_PATH (the
# client config, naming etcd://HOST:PORT/CLUSTER). Exit status: 0 injected, 1 could not inject (the
# drill is void), 2 usage.
set -euo pipefail
logs="${KVPOOL_RL_LOGS:-}"
[ -n "$logs" ] || { echo "rl-fault.sh: KVPOOL_RL_LOGS (the log directory of the launcher) is not set" >&2; exit 2; }
what="${1:-}"
node="${2:-node-0}"

say() { echo "$(date +%H:%M:%S.%3N) rl-fault: $*"; }
die() { say "FAILED: $*" >&2; exit 1; }

# pid_of NAME: the current pid of a role, from the launcher's pids file
pid_of() {
  local p
  p="$(awk -v n="$1" '$1 == n { print $2 }' "$logs/pids" 2>/dev/null)"
  [ -n "$p" ] || die "no $1 in $logs/pids"
  echo "$p"
}

# await_new_pid NAME OLD SECONDS: waits until the pids file names another pid for NAME; prints it
await_new_pid() {
  local i p
  for i in $(seq 1 $(($3 * 10))); do
    p="$(awk -v n="$1" '$1 == n { print $2 }' "$logs/pids" 2>/dev/null)"
    if [ -n "$p" ] && [ "$p" != "$2" ]; then echo "$p"; return 0; fi
    sleep 0.1
  done
  return 1
}

# await_log FILE SKIP REGEX SECONDS: waits for a line matching REGEX after the first SKIP lines; prints it
await_log() {
  local i l
  for i in $(seq 1 $(($4 * 10))); do
    l="$(tail -n +"$(($2 + 1))" "$1" 2>/dev/null | grep -E -m1 "$3" || true)"
    if [ -n "$l" ]; then echo "$l"; return 0; fi
    sleep 0.1
  done
  return 1
}

# await_gone PID: SIGKILL is delivered at once, but the process is gone only once reaped
await_gone() {
  local i
  for i in $(seq 1 100); do
    kill -0 "$1" 2>/dev/null || return 0
    # a zombie counts as gone: it runs no more
    [ "$(ps -o stat= -p "$1" 2>/dev/null | cut -c1)" = Z ] && return 0
    sleep 0.05
  done
  return 1
}

lines() { wc -l < "$1" 2>/dev/null || echo 0; }

# the leader record in etcd, {"id", "address", "http", "term", "ready"}, through etcd's JSON gateway
etcd_url() {
  local m config="${KVPOOL_CONFIG_PATH:-}"
  [ -n "$config" ] || die "KVPOOL_CONFIG_PATH (the client config) is not set"
  m="$(sed -n 's|.*"master" *: *"\(etcd://[^"]*\)".*|\1|p' "$config" | head -n1)"
  [ -n "$m" ] || die "$KVPOOL_CONFIG_PATH names no etcd:// master: kill-leader needs elected masters (launch --masters 2)"
  echo "$m"
}
leader_record() { # etcd://HOST:PORT[,...]/CLUSTER -> the record's JSON, or nothing when there is no leader
  local rest="${1#etcd://}" endpoint cluster key answer value
  endpoint="${rest%%/*}"; endpoint="${endpoint%%,*}"
  cluster="${rest#*/}"; [ "$cluster" != "$rest" ] || cluster=default
  key="$(printf '/kvpool/%s/leader' "$cluster" | base64 -w0)"
  answer="$(curl -fsS --max-time 2 -X POST "http://$endpoint/v3/kv/range" -d "{\"key\":\"$key\"}" 2>/dev/null || true)"
  value="$(printf '%s' "$answer" | sed -n 's/.*"value":"\([^"]*\)".*/\1/p')"
  [ -n "$value" ] && printf '%s' "$value" | base64 -d
  return 0
}
field() { sed -n "s/.*\"$1\" *: *\"\{0,1\}\([^\",}]*\)\"\{0,1\}.*/\1/p" <<< "$2"; }

watcher() { # runs the function given in the background; its pid goes to the list the scenario waits for
  "$@" &
  echo $! >> "$logs/fault-watchers"
}

case "$what" in
  kill-node)
    pid="$(pid_of "$node")"
    log="$logs/$node.log"
    skip="$(lines "$log")"
    t0="$(date +%s.%N)"
    kill -KILL "$pid"
    await_gone "$pid" || die "$node (pid $pid) still runs 5 s after SIGKILL"
    say "killed $node (pid $pid) with SIGKILL; the launcher (--restart-exited) starts it again on its address"
    back() {
      local new reg
      new="$(await_new_pid "$node" "$pid" 60)" || { say "$node was not started again within 60 s"; return 1; }
      say "$node started again (pid $new) $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s after the kill"
      reg="$(await_log "$log" "$skip" 'registered as segment' 60)" || { say "$node did not register again within 60 s; see $log"; return 1; }
      say "$node back $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s after the kill:" \
        "$(tail -n +"$((skip + 1))" "$log" | grep -E -m1 'adopting|not adopting' | sed 's/.*\] //' || true)" \
        "... ${reg#*node }"
    }
    watcher back
    ;;
  freeze-node)
    seconds="${KVPOOL_RL_FREEZE:-12}"
    [[ "$seconds" =~ ^[0-9]+$ ]] && [ "$seconds" -ge 1 ] || die "KVPOOL_RL_FREEZE: whole seconds >= 1, got '$seconds'"
    pid="$(pid_of "$node")"
    log="$logs/$node.log"
    skip="$(lines "$log")"
    kill -STOP "$pid"
    say "stopped $node (pid $pid) with SIGSTOP for $seconds s"
    thaw() {
      sleep "$seconds"
      kill -CONT "$pid"
      say "continued $node (pid $pid) with SIGCONT after $seconds s"
      local reg
      # past the node TTL the master dropped it: it registers again and lists what it holds
      if reg="$(await_log "$log" "$skip" 'registered as segment' 20)"; then
        say "$node registered again after the freeze: ${reg#*node }"
      else
        say "$node did not register again within 20 s of SIGCONT (still a member: the freeze was shorter than the node TTL)"
      fi
    }
    watcher thaw
    ;;
  kill-leader)
    url="$(etcd_url)"
    record="$(leader_record "$url")"
    [ -n "$record" ] || die "no leader record in $url"
    id="$(field id "$record")"
    [[ "$id" =~ ^m[0-9]+$ ]] || die "the leader record names '$id', not a master the launcher started (m1, m2, ...): $record"
    name="master-${id#m}"
    pid="$(pid_of "$name")"
    log="$logs/$name.log"
    skip="$(lines "$log")"
    t0="$(date +%s.%N)"
    kill -KILL "$pid"
    await_gone "$pid" || die "$name (pid $pid) still runs 5 s after SIGKILL"
    say "killed the leader $id ($name, pid $pid, term $(field term "$record")) with SIGKILL; a standby takes over"
    failover() {
      local i r nid
      for i in $(seq 1 600); do
        r="$(leader_record "$url")"
        nid="$(field id "$r")"
        if [ -n "$nid" ] && [ "$nid" != "$id" ] && [ "$(field ready "$r")" = true ]; then
          say "new leader $nid ready (term $(field term "$r")) $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s after the kill"
          break
        fi
        sleep 0.1
      done
      [ "$nid" != "$id" ] || { say "no other leader within 60 s of the kill"; return 1; }
      local new
      new="$(await_new_pid "$name" "$pid" 60)" || { say "$name was not started again within 60 s"; return 1; }
      await_log "$log" "$skip" "standing for election" 60 > /dev/null || { say "$name (pid $new) did not stand for election within 60 s; see $log"; return 1; }
      say "$name back as a standby (pid $new) $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s after the kill"
    }
    watcher failover
    ;;
  *)
    echo "usage: rl-fault.sh kill-node [NODE] | freeze-node [NODE] | kill-leader" >&2
    exit 2
    ;;
esac
