#!/usr/bin/env bash
# Makes `promtool` available (Debian's prometheus package) for the checks of deploy/prometheus/ and
# deploy/grafana/ (PromtoolIT), and runs a private Prometheus server on loopback for a try, stopped
# by PID. Installing never leaves the package's own server running or enabled: this machine only
# needs its tools.
#
#   scripts/prometheus.sh               print promtool's path, installing the package if it is missing
#   scripts/prometheus.sh --check       print promtool's path if it is there, else exit 3
#   scripts/prometheus.sh start DIR PORT CONFIG
#       run prometheus with CONFIG (e.g. deploy/prometheus/prometheus.yml) on 127.0.0.1:PORT, its
#       data in DIR/data, log in DIR/prometheus.log, PID in DIR/prometheus.pid; wait until /-/ready
#       answers; print the URL
#   scripts/prometheus.sh stop DIR      stop the prometheus whose PID is in DIR/prometheus.pid
#   scripts/prometheus.sh status DIR    print "running (PID N)" or "not running"
#
# Exit status: 0 ok, 1 failure, 2 usage, 3 promtool is missing and cannot be installed here.
# Environment: PROMETHEUS_START_TIMEOUT seconds (default 30).
set -euo pipefail

PROG=$(basename "$0")
PACKAGE=prometheus
POLICY=/usr/sbin/policy-rc.d
DEBIAN_PACKAGE=$PACKAGE


# die, die_unavailable (exit 3: cannot be installed here), as_root, install_debian_package
source "$(dirname "${BASH_SOURCE[0]}")/lib/debian.sh"

usage() {
    cat >&2 <<EOF
usage: $PROG [--check]
       $PROG start DIR PORT CONFIG
       $PROG stop DIR
       $PROG status DIR
EOF
    exit 2
}


# The package's maintainer scripts start and enable its service: a policy-rc.d that answers 101
# ("action forbidden") keeps invoke-rc.d and deb-systemd-invoke from starting it. One we put there
# ourselves is removed on exit; an existing one (containers ship one) is left alone.
forbid_service_starts() {
    [[ -e $POLICY ]] && return 0
    as_root sh -c "printf '#!/bin/sh\n# written by kvpool scripts/prometheus.sh for one install\nexit 101\n' >$POLICY && chmod 755 $POLICY"
    trap 'as_root rm -f "$POLICY"' EXIT
}

# Stops, by its PID, a server the package started despite the policy, and disables its service.
# Only called when this script installed the package, so an operator's own Prometheus is never touched.
quiet_the_service() {
    if [[ -d /run/systemd/system ]]; then
        as_root systemctl disable "$PACKAGE.service" >/dev/null 2>&1 || true
    else
        # no systemd running: what `systemctl disable` would remove
        as_root rm -f "/etc/systemd/system/multi-user.target.wants/$PACKAGE.service"
    fi
    as_root update-rc.d "$PACKAGE" disable >/dev/null 2>&1 || true
    local pid=""
    if [[ -d /run/systemd/system ]]; then
        pid=$(systemctl show -p MainPID --value "$PACKAGE.service" 2>/dev/null || true)
    elif [[ -f /run/prometheus/prometheus.pid ]]; then
        pid=$(tr -dc '0-9' </run/prometheus/prometheus.pid)
    fi
    if [[ -n $pid && $pid != 0 ]] && [[ $(ps -o comm= -p "$pid" 2>/dev/null || true) == prometheus ]]; then
        echo "$PROG: stopping the Prometheus server the package started (PID $pid)" >&2
        as_root kill -TERM "$pid" || true
    fi
}

ensure_promtool() {
    command -v promtool >/dev/null 2>&1 && return 0
    local had_package=0
    dpkg-query -W -f '${Status}' "$PACKAGE" 2>/dev/null | grep -q 'install ok installed' && had_package=1
    echo "$PROG: promtool not found, installing Debian's $PACKAGE package (its server is not started)" >&2
    forbid_service_starts
    install_debian_package "$PACKAGE" --no-install-recommends
    ((had_package)) || quiet_the_service
    command -v promtool >/dev/null 2>&1 || die "promtool still not on PATH after installing $PACKAGE"
}

live_pid() {
    local pidfile=$1 pid
    [[ -f $pidfile ]] || return 0
    pid=$(tr -dc '0-9' <"$pidfile")
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then echo "$pid"; fi
}

# ready PORT: true when 127.0.0.1:PORT answers /-/ready with 200 (bash's /dev/tcp, no curl needed).
ready() {
    local status
    status=$( (exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf 'GET /-/ready HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
        timeout 5 head -n 1 <&3) 2>/dev/null || true)
    [[ $status == *" 200 "* ]]
}

start() {
    local dir=$1 port=$2 config=$3
    [[ $port =~ ^[0-9]+$ ]] && ((10#$port >= 1 && 10#$port <= 65535)) || die "PORT must be a number in 1..65535, got '$port'"
    [[ -f $config ]] || die "CONFIG $config does not exist"
    command -v prometheus >/dev/null 2>&1 || ensure_promtool
    command -v prometheus >/dev/null 2>&1 || die "the prometheus server binary is missing (package $PACKAGE)"
    mkdir -p "$dir" || die "cannot create $dir"
    dir=$(cd "$dir" && pwd)
    config=$(cd "$(dirname "$config")" && pwd)/$(basename "$config")
    local pidfile=$dir/prometheus.pid log=$dir/prometheus.log timeout=${PROMETHEUS_START_TIMEOUT:-30} running
    running=$(live_pid "$pidfile")
    [[ -z $running ]] || die "a prometheus is already running from $dir (PID $running); stop it first: $PROG stop $dir"
    ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || die "port $port on 127.0.0.1 is already in use: choose another PORT"
    echo "=== $(date -u +%FT%TZ) $PROG start: $config on 127.0.0.1:$port" >>"$log"
    setsid prometheus --config.file="$config" --storage.tsdb.path="$dir/data" \
        --web.listen-address="127.0.0.1:$port" --storage.tsdb.retention.time=1d \
        </dev/null >>"$log" 2>&1 &
    local pid=$!
    echo "$pid" >"$pidfile"
    local deadline=$((SECONDS + timeout))
    while ((SECONDS < deadline)); do
        kill -0 "$pid" 2>/dev/null || break
        if ready "$port"; then
            echo "http://127.0.0.1:$port"
            return 0
        fi
        sleep 0.2
    done
    tail -n 20 "$log" >&2
    stop "$dir" >/dev/null 2>&1 || true
    die "prometheus on 127.0.0.1:$port did not become ready within ${timeout}s (log above: $log)"
}

stop() {
    local pidfile=$1/prometheus.pid pid i
    pid=$(live_pid "$pidfile")
    if [[ -n $pid && $(ps -o comm= -p "$pid" 2>/dev/null || true) == prometheus ]]; then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
    elif [[ -n $pid ]]; then
        echo "$PROG: PID $pid in $pidfile is not prometheus: removing the stale pidfile only" >&2
    fi
    rm -f "$pidfile"
}

case ${1:-} in
    "") ensure_promtool; command -v promtool ;;
    --check) command -v promtool || die_unavailable "promtool is not installed (run $PROG to install it)" ;;
    start) (($# == 4)) || usage; start "$2" "$3" "$4" ;;
    stop) (($# == 2)) || usage; stop "$2" ;;
    status)
        (($# == 2)) || usage
        pid=$(live_pid "$2/prometheus.pid")
        if [[ -n $pid ]]; then echo "running (PID $pid)"; else echo "not running"; fi ;;
    *) usage ;;
esac
