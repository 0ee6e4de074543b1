#!/usr/bin/env bash
# Runs a private single-member etcd 3.4 (Debian's etcd-server package) on loopback, for the masters'
# leader election and the tests of it, and stops it by PID. It never touches a system instance the
# package may have started (its service, port 2379 on a machine with systemd).
#
#   scripts/etcd.sh start DIR [CLIENT_PORT [PEER_PORT]]
#       install etcd-server if `etcd` is missing, start etcd on 127.0.0.1:CLIENT_PORT (default 2379)
#       and 127.0.0.1:PEER_PORT (default 2380) with its data in DIR/data, its log in DIR/etcd.log and
#       its PID in DIR/etcd.pid; wait until /health answers healthy; print the client URL.
#       Starting again on the same DIR and ports resumes the same data (keys, revisions, leases).
#       A port that something else holds (seen before starting, or etcd failing to bind it) is exit
#       status 4: the caller picks other ports and starts again (after removing DIR/data, which names
#       the member's peer URL).
#   scripts/etcd.sh stop DIR        stop the etcd whose PID is in DIR/etcd.pid (TERM, then KILL)
#   scripts/etcd.sh status DIR      print "running (PID N, URL)" or "not running"
#
# Exit status: 0 ok, 1 failure (etcd crashed, did not answer, answered as another etcd: the message
# has the tail of its log), 2 usage, 3 etcd is missing and cannot be installed here, 4 a port is in
# use. Only 3 means "no etcd here"; an etcd that is present but fails is 1.
#
# Environment: ETCD_NAME member name (default kvpool; keep it the same for one DIR),
# ETCD_START_TIMEOUT seconds (default 20), ETCD_EXTRA_ARGS more etcd flags (split on blanks),
# ETCD_BIN the etcd executable to run (default: etcd on PATH, installed when missing; one named here
# is never installed: a path that is not an executable file is a failure).
# Auto-compaction stays off and the heartbeat and election timeouts stay at etcd's defaults.
set -euo pipefail

PROG=$(basename "$0")

# die, die_unavailable (exit 3: cannot be installed here), as_root, install_debian_package
source "$(dirname "${BASH_SOURCE[0]}")/lib/debian.sh"

usage() {
    cat >&2 <<EOF
usage: $PROG start DIR [CLIENT_PORT [PEER_PORT]]
       $PROG stop DIR
       $PROG status DIR
EOF
    exit 2
}

# die_port_in_use MESSAGE: exit status 4, "choose other ports".
die_port_in_use() {
    printf '%s: %s\n' "$PROG" "$*" >&2
    exit 4
}

# Sets ETCD to the executable to run: ETCD_BIN as given, else etcd on PATH (installed when missing).
ensure_installed() {
    if [[ -n ${ETCD_BIN:-} ]]; then
        [[ -f $ETCD_BIN && -x $ETCD_BIN ]] || die "ETCD_BIN=$ETCD_BIN is not an executable file"
        ETCD=$ETCD_BIN
        return 0
    fi
    ETCD=etcd
    command -v etcd >/dev/null 2>&1 && return 0
    echo "$PROG: etcd not found, installing Debian's etcd-server package" >&2
    install_debian_package etcd-server
    command -v etcd >/dev/null 2>&1 || die "etcd still not on PATH after installing etcd-server"
}

is_port() {
    [[ $1 =~ ^[0-9]+$ ]] && ((10#$1 >= 1 && 10#$1 <= 65535))
}

# Prints the PID in PIDFILE if it names a live process, else nothing.
live_pid() {
    local pidfile=$1 pid
    [[ -f $pidfile ]] || return 0
    pid=$(tr -dc '0-9' <"$pidfile")
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
        echo "$pid"
    fi
}

log_tail() {
    local log=$1
    if [[ -f $log ]]; then
        echo "--- last lines of $log ---" >&2
        tail -n 30 "$log" >&2
    else
        echo "(no log at $log)" >&2
    fi
}

# http PORT METHOD PATH [BODY]: one HTTP/1.0 exchange with 127.0.0.1:PORT through bash's /dev/tcp
# (no curl needed), all of it within 5 s (a listener that never accepts would hang the connect);
# prints the response body, fails when nothing answers.
http() {
    local port=$1 method=$2 path=$3 body=${4:-}
    # shellcheck disable=SC2016 # expanded by the inner bash
    timeout 5 bash -c '
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf "%s %s HTTP/1.0\r\nHost: 127.0.0.1:%s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" \
            "$2" "$3" "$1" "${#4}" "$4" >&3
        cat <&3' _ "$port" "$method" "$path" "$body" 2>/dev/null | tr -d '\r' | sed '1,/^$/d'
}

# port_answers PORT: something on 127.0.0.1:PORT takes connections (within 2 s).
port_answers() {
    # shellcheck disable=SC2016 # expanded by the inner bash
    timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$1" 2>/dev/null
}

start() {
    local dir=$1 port=${2:-2379} peer=${3:-2380}
    is_port "$port" || die "CLIENT_PORT must be a number in 1..65535, got '$port'"
    is_port "$peer" || die "PEER_PORT must be a number in 1..65535, got '$peer'"
    ((10#$port != 10#$peer)) || die "CLIENT_PORT and PEER_PORT must differ, both are $port"
    ensure_installed
    mkdir -p "$dir" || die "cannot create $dir"
    dir=$(cd "$dir" && pwd)
    local pidfile=$dir/etcd.pid log=$dir/etcd.log name=${ETCD_NAME:-kvpool} timeout=${ETCD_START_TIMEOUT:-20}
    [[ $name =~ ^[A-Za-z0-9._-]+$ ]] || die "ETCD_NAME must match [A-Za-z0-9._-]+, got '$name'"
    [[ $timeout =~ ^[0-9]+$ ]] || die "ETCD_START_TIMEOUT must be a whole number of seconds, got '$timeout'"

    local running
    running=$(live_pid "$pidfile")
    [[ -z $running ]] || die "an etcd is already running from $dir (PID $running); stop it first with: $PROG stop $dir"
    rm -f "$pidfile"
    # Whatever answers on the ports now is not ours (a system etcd on 2379, say): refuse rather than
    # report a healthy cluster that is someone else's.
    ! port_answers "$port" || die_port_in_use "port $port on 127.0.0.1 is already in use: choose another CLIENT_PORT"
    ! port_answers "$peer" || die_port_in_use "port $peer on 127.0.0.1 is already in use: choose another PEER_PORT"

    local client_url=http://127.0.0.1:$port peer_url=http://127.0.0.1:$peer
    local -a extra=()
    if [[ -n ${ETCD_EXTRA_ARGS:-} ]]; then
        read -r -a extra <<<"$ETCD_EXTRA_ARGS"
    fi
    {
        echo "=== $(date -u +%FT%TZ) $PROG start: etcd on $client_url (peer $peer_url), data $dir/data"
    } >>"$log"
    # where this start's lines begin in the log (it keeps every start's)
    local log_from
    log_from=$(($(wc -c <"$log") + 1))
    # setsid: etcd gets a session of its own, so a terminal's or a test runner's signals to our
    # process group do not reach it; stdin from /dev/null so it holds no caller's pipe open.
    setsid "$ETCD" \
        --name "$name" \
        --data-dir "$dir/data" \
        --listen-client-urls "$client_url" \
        --advertise-client-urls "$client_url" \
        --listen-peer-urls "$peer_url" \
        --initial-advertise-peer-urls "$peer_url" \
        --initial-cluster "$name=$peer_url" \
        --initial-cluster-state new \
        "${extra[@]}" \
        </dev/null >>"$log" 2>&1 &
    local pid=$!
    echo "$pid" >"$pidfile"

    local deadline=$((SECONDS + timeout)) reply="" why="did not answer /health as healthy within ${timeout}s"
    while ((SECONDS < deadline)); do
        if ! kill -0 "$pid" 2>/dev/null; then
            why="exited during startup"
            break
        fi
        reply=$(http "$port" GET /health || true)
        if [[ $reply == *'"health":"true"'* ]]; then
            # The answer must come from our member: its name and peer URL, not another etcd's.
            local members
            members=$(http "$port" POST /v3/cluster/member/list '{}' || true)
            if [[ $members != *"\"name\":\"$name\""* || $members != *"\"$peer_url\""* ]]; then
                why="answers on port $port come from another etcd (member list: ${members:-none})"
                break
            fi
            echo "$client_url"
            return 0
        fi
        sleep 0.1
    done
    log_tail "$log"
    # Do not leave a half-started server behind.
    stop "$dir" >/dev/null 2>&1 || true
    # a port taken between the check above and etcd binding it (etcd says so and exits)
    if tail -c "+$log_from" "$log" | grep -q 'address already in use'; then
        die_port_in_use "etcd on $client_url (peer $peer_url) could not bind: a port is already in use (see the log above)"
    fi
    die "etcd on $client_url $why (last /health reply: '${reply:-none}'; see the log above)"
}

stop() {
    local dir=$1 pidfile pid
    dir=$(cd "$dir" 2>/dev/null && pwd) || dir=$1 # absolute, as start wrote it into etcd's command line
    pidfile=$dir/etcd.pid
    pid=$(live_pid "$pidfile")
    if [[ -z $pid ]]; then
        rm -f "$pidfile"
        return 0
    fi
    # Make sure the PID is the etcd this script started on DIR before signalling it (a stale pidfile
    # may name a reused PID): its command line names DIR/data as its data directory.
    if ! tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF -- "$dir/data"; then
        echo "$PROG: PID $pid in $pidfile is not an etcd with its data in $dir/data: removing the stale pidfile only" >&2
        rm -f "$pidfile"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    local i
    for ((i = 0; i < 50; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "$PROG: etcd PID $pid ignored TERM for 5s, sending KILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
    fi
    rm -f "$pidfile"
}

status() {
    local dir=$1 pid url
    pid=$(live_pid "$dir/etcd.pid")
    if [[ -n $pid ]]; then
        url=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | sed -n '/^--advertise-client-urls$/{n;p;q}' || true)
        echo "running (PID $pid${url:+, $url})"
    else
        echo "not running"
    fi
}

main() {
    (($# >= 1)) || usage
    local cmd=$1
    shift
    case $cmd in
        start)
            (($# >= 1 && $# <= 3)) || usage
            start "$@"
            ;;
        stop)
            (($# == 1)) || usage
            stop "$1"
            ;;
        status)
            (($# == 1)) || usage
            status "$1"
            ;;
        -h | --help | help)
            usage
            ;;
        *)
            echo "$PROG: unknown command '$cmd'" >&2
            usage
            ;;
    esac
}

main "$@"
