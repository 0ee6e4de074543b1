#!/usr/bin/env bash
# Runs a private Redis 7 (Debian's redis-server package) on loopback for `kvpool bench`, and stops it
# by PID. It never touches a system instance the package may have started (systemd, port 6379).
#
#   scripts/redis.sh start PORT DIR   install redis-server if missing, start it on 127.0.0.1:PORT
#                                     with its pidfile, log and working directory in DIR; print the PID
#   scripts/redis.sh stop DIR         stop the Redis whose pidfile is DIR/redis.pid (idempotent)
#   scripts/redis.sh version          print the installed redis-server version, or "not installed"
#
# Exit status: 0 ok, 1 failure, 2 usage, 3 redis-server is missing and cannot be installed here.
#
# Environment: REDIS_MAXMEMORY (default 6gb), REDIS_START_TIMEOUT seconds (default 20).
set -euo pipefail

PROG=$(basename "$0")

# die, die_unavailable (exit 3: cannot be installed here), as_root, install_debian_package
source "$(dirname "${BASH_SOURCE[0]}")/lib/debian.sh"

usage() {
    cat >&2 <<EOF
usage: $PROG start PORT DIR
       $PROG stop DIR
       $PROG version
EOF
    exit 2
}

ensure_installed() {
    if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
        return 0
    fi
    echo "$PROG: redis-server not found, installing Debian's redis-server package" >&2
    install_debian_package redis-server
    command -v redis-server >/dev/null 2>&1 || die "redis-server still not on PATH after installing it"
}

version() {
    if command -v redis-server >/dev/null 2>&1; then
        redis-server --version
    else
        echo "not installed"
    fi
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

start() {
    local port=$1 dir=$2
    is_port "$port" || die "PORT must be a number in 1..65535, got '$port'"
    ensure_installed
    mkdir -p "$dir" || die "cannot create $dir"
    dir=$(cd "$dir" && pwd)
    local pidfile=$dir/redis.pid log=$dir/redis.log
    local maxmemory=${REDIS_MAXMEMORY:-6gb} timeout=${REDIS_START_TIMEOUT:-20}

    local running
    running=$(live_pid "$pidfile")
    [[ -z $running ]] || die "a Redis is already running from $dir (PID $running); stop it first with: $PROG stop $dir"
    rm -f "$pidfile"
    : >"$log"

    # No config file: everything is on the command line, so /etc/redis/redis.conf (the system
    # instance's) plays no part. Values up to 512 MiB per bulk string are accepted.
    redis-server \
        --bind 127.0.0.1 \
        --port "$port" \
        --protected-mode yes \
        --save "" \
        --appendonly no \
        --dir "$dir" \
        --logfile "$log" \
        --pidfile "$pidfile" \
        --daemonize yes \
        --maxmemory "$maxmemory" \
        --maxmemory-policy allkeys-lru \
        --proto-max-bulk-len 512mb \
        --client-query-buffer-limit 1gb \
        || { log_tail "$log"; die "redis-server failed to start on port $port"; }

    local deadline=$((SECONDS + timeout)) reply="" why="did not answer PING within ${timeout}s"
    while ((SECONDS < deadline)); do
        reply=$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null || true)
        if [[ $reply == PONG && -s $pidfile ]]; then
            local pid served
            pid=$(live_pid "$pidfile")
            [[ -n $pid ]] || break
            # The PONG must come from our server, not from another one already on this port.
            served=$(redis-cli -h 127.0.0.1 -p "$port" info server 2>/dev/null | tr -d '\r' \
                | sed -n 's/^process_id://p')
            if [[ $served != "$pid" ]]; then
                log_tail "$log"
                stop "$dir" >/dev/null 2>&1 || true
                die "port $port is answered by another Redis (PID ${served:-?}), not the one started from $dir (PID $pid)"
            fi
            echo "$pid"
            return 0
        fi
        # A server that failed before writing its pidfile (port taken, bad option) logs why and exits.
        if [[ -z $(live_pid "$pidfile") ]] && grep -qE 'aborting|[Ff]atal|FATAL' "$log" 2>/dev/null; then
            why="exited during startup"
            break
        fi
        sleep 0.1
    done
    log_tail "$log"
    # Do not leave a half-started server behind.
    stop "$dir" >/dev/null 2>&1 || true
    die "Redis on 127.0.0.1:$port $why (last PING reply: '${reply:-none}'; see the log above)"
}

stop() {
    local dir=$1 pidfile pid
    pidfile=$dir/redis.pid
    pid=$(live_pid "$pidfile")
    if [[ -z $pid ]]; then
        rm -f "$pidfile"
        return 0
    fi
    # Make sure the PID is a redis-server before signalling it (a stale pidfile may name a reused PID).
    local comm
    comm=$(ps -o comm= -p "$pid" 2>/dev/null || true)
    if [[ $comm != redis-server* && $comm != redis-check* ]]; then
        echo "$PROG: PID $pid in $pidfile is '$comm', not redis-server: removing the stale pidfile only" >&2
        rm -f "$pidfile"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    local i
    for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "$PROG: Redis PID $pid ignored TERM for 10s, sending KILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
    fi
    rm -f "$pidfile"
}

main() {
    (($# >= 1)) || usage
    local cmd=$1
    shift
    case $cmd in
        start)
            (($# == 2)) || usage
            start "$1" "$2"
            ;;
        stop)
            (($# == 1)) || usage
            stop "$1"
            ;;
        version)
            (($# == 0)) || usage
            version
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
