#!/usr/bin/env bash
# Prints the processes a test stage left running that it should have stopped: any still running from this
# checkout's jar or classes, or an etcd or Redis the tests started. Run between the stages of `./kvpool test`:
# one left spinning slows every later stage (a CI run once took 13 times as long for its Python suite), and
# this names it in the log. Prints nothing and exits 0 when nothing is left; never fails the run.
#
#   scripts/leftovers.sh STAGE
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
stage=${1:-stage}
left=$(pgrep -af -- "$here/kvpool-[a-z]*/target|kvpool-pytest|kvpool-it-|etcd --data-dir|redis-server" 2>/dev/null \
    | grep -v -e "leftovers.sh" -e "pgrep" || true)
if [[ -n "$left" ]]; then
    printf 'leftovers after %s: still running:\n%s\n' "$stage" "$left" >&2
    ps -o pid,ppid,pcpu,etime,args --no-headers -p "$(echo "$left" | awk '{print $1}' | paste -sd,)" >&2 || true
fi
exit 0
