#!/usr/bin/env bash
# Multi-host test on one machine: three "hosts" are network namespaces on a bridge, each with its
# own address (veth pairs), an etcd listens on the bridge, and kvpool launch --hosts --masters 2
# brings up a master on each of the first two hosts (elected through that etcd: one leads, the
# other stands by) and a node on each. Checks, printing PASS or FAIL for each:
#   (a) a prefix cached by an engine on host 1 is served to an engine on host 2 (from the pool);
#   (b) each host's puts land in its own node's segment (auto-detected), and KVPOOL_PREFERRED_SEGMENT
#       overrides that;
#   (c) killing one node mid-run leaves the others serving, with misses only for what was on it;
#   (d) killing the leading master (on host 1) hands the pool to the standby on host 2: objects
#       stay readable, puts succeed, and kvpool status names the new leader and a higher term;
#   (e) the pool runs with the cluster and admin secrets (it listens on the bridge): a client without
#       them is refused with a message naming KVPOOL_SECRET_FILE.
# Needs root (ip netns). Everything it creates is removed on exit; processes are stopped by PID.
#
#   scripts/multihost-netns.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kvpool="$here/kvpool"
[ "$(id -u)" -eq 0 ] || { echo "multihost-netns: needs root (network namespaces)"; exit 3; }
command -v ip >/dev/null || { echo "multihost-netns: needs iproute2 (apt-get install iproute2)"; exit 3; }
net=10.77.$(( (RANDOM % 200) + 20 ))
tag="kvp$$"
br="${tag}br"
work="$(mktemp -d /tmp/kvpool-multihost.XXXXXX)"
launcher=""
engines=()
killed=()
failures=0

cleanup() {
  set +e
  for p in "${engines[@]}"; do kill "$p" 2>/dev/null; done
  [ -n "$launcher" ] && kill "$launcher" 2>/dev/null && wait "$launcher" 2>/dev/null
  "$here/scripts/etcd.sh" stop "$work/etcd" >/dev/null 2>&1
  for i in 1 2 3; do
    # anything still running in a namespace (nothing should be) is stopped before it goes
    for p in $(ip netns pids "${tag}h$i" 2>/dev/null); do kill "$p" 2>/dev/null; done
  done
  sleep 1
  for i in 1 2 3; do
    for p in $(ip netns pids "${tag}h$i" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    ip netns del "${tag}h$i" 2>/dev/null
    ip link del "${tag}v$i" 2>/dev/null
  done
  ip link del "$br" 2>/dev/null
  # a node killed with SIGKILL leaves its segment file (it is never restarted here to adopt it)
  for p in "${killed[@]}"; do rm -f /dev/shm/kvpool-*-"$p".seg; done
}
trap cleanup EXIT
if ! ip netns add "${tag}probe" 2>/dev/null; then
  echo "multihost-netns: cannot create network namespaces here (needs CAP_SYS_ADMIN and CAP_NET_ADMIN)"
  exit 3
fi
ip netns del "${tag}probe"

check() { # name, condition result (0 = pass)
  if [ "$2" -eq 0 ]; then echo "PASS $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi
}

# the pool listens on the bridge, so it needs its secrets: every process started below inherits them
umask 077
head -c 32 /dev/urandom | base64 > "$work/cluster.secret"
head -c 32 /dev/urandom | base64 > "$work/admin.secret"
head -c 32 /dev/urandom | base64 > "$work/engine.token"
umask 022
export KVPOOL_SECRET_FILE="$work/cluster.secret" KVPOOL_ADMIN_SECRET_FILE="$work/admin.secret"
# the engines listen on the bridge too, so their control endpoints need the bearer token
export KVPOOL_ENGINE_TOKEN_FILE="$work/engine.token"
auth="Authorization: Bearer $(cat "$work/engine.token")"

ip link add "$br" type bridge
ip addr add "$net.1/24" dev "$br"
ip link set "$br" up
: > "$work/hosts"
for i in 1 2 3; do
  ns="${tag}h$i"
  ip netns add "$ns"
  ip link add "${tag}v$i" type veth peer name eth0 netns "$ns"
  ip link set "${tag}v$i" master "$br" up
  ip netns exec "$ns" ip addr add "$net.1$i/24" dev eth0
  ip netns exec "$ns" ip link set eth0 up
  ip netns exec "$ns" ip link set lo up
  echo "$net.1$i netns:$ns" >> "$work/hosts"
done
cat > "$work/pool.yaml" <<YAML
type: pool
cpu: 128MiB
YAML

[ -f "$here/kvpool-cli/target/kvpool.jar" ] || "$kvpool" build >/dev/null # ./kvpool rebuilds by itself when stale
# etcd on the bridge, so the masters and nodes in every namespace reach it (and on loopback for the script)
etcd_port=$(( 23000 + RANDOM % 5000 ))
ETCD_EXTRA_ARGS="--listen-client-urls http://127.0.0.1:$etcd_port,http://$net.1:$etcd_port --advertise-client-urls http://$net.1:$etcd_port" \
  "$here/scripts/etcd.sh" start "$work/etcd" "$etcd_port" "$(( etcd_port + 1 ))" >/dev/null \
  || { echo "multihost-netns: cannot start etcd (scripts/etcd.sh)"; exit 3; }
"$kvpool" launch --hosts "$work/hosts" --config "$work/pool.yaml" --out "$work/client.json" --log-dir "$work/logs" \
  --masters 2 --etcd "etcd://$net.1:$etcd_port/multihost" > "$work/launch.out" 2>&1 &
launcher=$!
for _ in $(seq 1 240); do grep -q "^export KVPOOL_CONFIG_PATH" "$work/launch.out" && break; sleep 0.5; done
grep -q "^export KVPOOL_CONFIG_PATH" "$work/launch.out" || { cat "$work/launch.out"; echo "FAIL launch"; exit 1; }
master="$(jq -r .master "$work/client.json")"
echo "pool up: masters on $net.11 and $net.12 elected through $master, nodes on $net.11, $net.12, $net.13"

in_host() { local i=$1; shift; ip netns exec "${tag}h$i" "$@"; }
objects_on() { # objects stored in the segment of host $1's node
  "$kvpool" status --master "$master" | awk -v h="$net.1$1:" '$1 ~ /^[0-9]+$/ && index($2, h) == 1 {print $(NF-3)}'
}
segment_of() { "$kvpool" status --master "$master" | awk -v h="$net.1$1:" '$1 ~ /^[0-9]+$/ && index($2, h) == 1 {print $2}'; }

# (b) puts land on the local node; KVPOOL_PREFERRED_SEGMENT overrides
in_host 2 "$kvpool" put --master "$master" on-host-2 --value two >/dev/null
in_host 3 "$kvpool" put --master "$master" on-host-3 --value three >/dev/null
check "(b) a put from host 2 lands in host 2's segment" $([ "$(objects_on 2)" = 1 ] && echo 0 || echo 1)
check "(b) a put from host 3 lands in host 3's segment" $([ "$(objects_on 3)" = 1 ] && echo 0 || echo 1)
KVPOOL_PREFERRED_SEGMENT="$(segment_of 3)" in_host 2 "$kvpool" put --master "$master" preferred-3 --value x >/dev/null
check "(b) KVPOOL_PREFERRED_SEGMENT sends host 2's put to host 3" $([ "$(objects_on 3)" = 2 ] && echo 0 || echo 1)

# (a) an engine on host 1 computes a prompt; an engine on host 2 gets its KV from the pool
for i in 1 2; do
  # not through in_host: $! must be the engine itself (ip netns exec and ./kvpool both exec)
  KVPOOL_CONFIG_PATH="$work/client.json" ip netns exec "${tag}h$i" "$kvpool" engine --model tiny --host "$net.1$i" \
    --port 8300 > "$work/logs/engine-$i.log" 2>&1 &
  engines+=($!)
done
for i in 1 2; do
  for _ in $(seq 1 120); do curl -fs "http://$net.1$i:8300/health" >/dev/null 2>&1 && break; sleep 0.5; done
done
prompt="$(printf 'the shared system prompt of a multi-host test %.0s' $(seq 1 6))"
body="$(jq -cn --arg p "$prompt" '{prompt: $p, max_tokens: 4}')"
first="$(curl -fs -X POST -H "$auth" "http://$net.11:8300/v1/completions" -d "$body")"
sleep 1 # saves are asynchronous
second="$(curl -fs -X POST -H "$auth" "http://$net.12:8300/v1/completions" -d "$body")"
hit="$(echo "$second" | jq .kvpool.external_hit_tokens)"
echo "host 2's engine loaded $hit prompt tokens from the pool"
check "(a) host 1's prefix is served to host 2's engine from the pool" $([ "$hit" -gt 0 ] && echo 0 || echo 1)
check "(a) the same answer on both hosts" $([ "$(echo "$first" | jq -c .choices[0].token_ids)" = "$(echo "$second" | jq -c .choices[0].token_ids)" ] && echo 0 || echo 1)
code="$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://$net.12:8300/v1/completions" -d "$body")"
check "(e) an engine on the bridge refuses a prompt without its bearer token (HTTP $code)" $([ "$code" = 401 ] && echo 0 || echo 1)

# (e) the pool is on a shared network: a process without the secrets is refused, naming what to set
set +e
refusal="$(env -u KVPOOL_SECRET_FILE -u KVPOOL_ADMIN_SECRET_FILE ip netns exec "${tag}h3" "$kvpool" get \
  --master "$master" on-host-2 2>&1)"; refused=$?
set -e
check "(e) a client without the cluster secret is refused" $([ "$refused" -ne 0 ] && echo "$refusal" | grep -q "KVPOOL_SECRET_FILE" && echo 0 || echo 1)

# (c) kill host 3's node mid-run: the rest keeps serving, misses only for what was on host 3
victim="$(sed -n 's/^started node-2 on .* (pid \([0-9]*\)).*/\1/p' "$work/launch.out")"
kill -9 "$victim"
killed+=("$victim")
in_host 1 "$kvpool" get --master "$master" on-host-2 >/dev/null; check "(c) host 2's object still served after host 3 died" $?
set +e
in_host 1 "$kvpool" get --master "$master" on-host-3 >/dev/null 2>&1; lost=$?
set -e
check "(c) host 3's object is a miss, not an error" $([ "$lost" = 1 ] && echo 0 || echo 1)
in_host 1 "$kvpool" put --master "$master" after-loss --value y >/dev/null; check "(c) puts still succeed" $?
sleep 1
grep -q "node lost: node-2" "$work/launch.out"; check "(c) the launcher reports the lost node" $?
kill -0 "$launcher"; check "(c) the launcher keeps the pool up" $?

# (d) kill the leading master: the standby on host 2 takes over
leader_line() { "$kvpool" status --master "$master" | sed -n 's/^election .*: leader \(m[0-9]*\) at .*, term \([0-9]*\).*/\1 \2/p'; }
read -r first_leader first_term <<<"$(leader_line)"
echo "leader before: $first_leader (term $first_term)"
check "(d) master m1 on host 1 leads" $([ "$first_leader" = m1 ] && echo 0 || echo 1)
victim="$(sed -n 's/^started master-1 on .* (pid \([0-9]*\)).*/\1/p' "$work/launch.out")"
kill -9 "$victim"
in_host 3 "$kvpool" get --master "$master" on-host-2 >/dev/null; check "(d) an object is served after the leader died" $?
in_host 3 "$kvpool" put --master "$master" after-failover --value z >/dev/null; check "(d) a put succeeds through the new leader" $?
read -r next_leader next_term <<<"$(leader_line)"
echo "leader after: $next_leader (term $next_term)"
check "(d) the standby on host 2 leads at a higher term" $([ "$next_leader" = m2 ] && [ "$next_term" -gt "$first_term" ] && echo 0 || echo 1)
sleep 1
grep -q "master lost: master-1" "$work/launch.out"; check "(d) the launcher reports the lost master and keeps the pool up" $?
kill -0 "$launcher"; check "(d) the launcher is still running" $?

for p in "${engines[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
engines=()
echo "logs: $work/logs"
[ "$failures" -eq 0 ] && echo "multihost: all checks passed" || echo "multihost: $failures checks FAILED"
exit "$failures"
