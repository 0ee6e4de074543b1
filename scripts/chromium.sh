#!/usr/bin/env bash
# Headless Chromium for the status page's browser test (StatusPageIT) and for screenshots: installs
# Debian's chromium package when /usr/bin/chromium is missing, and runs it with the flags this kind
# of machine needs.
#
#   scripts/chromium.sh [install]     install chromium if missing (idempotent); print the binary's path
#   scripts/chromium.sh run ARGS...   run headless Chromium with the flags below, a fresh profile
#                                     directory (deleted afterwards) and ARGS, for example
#                                       scripts/chromium.sh run --virtual-time-budget=5000 --dump-dom URL
#                                       scripts/chromium.sh run --window-size=1440,1000 --screenshot=F.png URL
#   scripts/chromium.sh flags         print the flags `run` adds, one a line (without the profile)
#
# The flags: --headless --no-sandbox (containers, root) --disable-gpu, and no background traffic at all
# (--disable-quic --no-first-run --disable-background-networking --disable-component-update
# --disable-sync): on a machine without internet access Chromium otherwise waits on refused
# connections to Google's services and a one-shot --dump-dom can hang.
#
# Exit status: 0 ok, 1 failure (or Chromium's own status for `run`), 2 usage, 3 chromium is missing
# and cannot be installed here (callers may skip rather than fail).
#
# Environment: CHROMIUM the binary to use (default /usr/bin/chromium; not installed when set).
set -euo pipefail

PROG=$(basename "$0")
BIN=${CHROMIUM:-/usr/bin/chromium}

FLAGS=(
    --headless
    --no-sandbox
    --disable-gpu
    --disable-dev-shm-usage
    --disable-quic
    --no-first-run
    --no-default-browser-check
    --disable-background-networking
    --disable-component-update
    --disable-sync
    --disable-extensions
    --hide-scrollbars
    --mute-audio
)

# die, die_unavailable (exit 3: cannot be installed here), as_root, install_debian_package
source "$(dirname "${BASH_SOURCE[0]}")/lib/debian.sh"

usage() {
    cat >&2 <<EOF
usage: $PROG [install]
       $PROG run CHROMIUM_ARGS...
       $PROG flags
EOF
    exit 2
}

ensure_installed() {
    [[ -x $BIN ]] && return 0
    [[ -z ${CHROMIUM:-} ]] || die_unavailable "CHROMIUM=$CHROMIUM is not an executable file"
    echo "$PROG: $BIN not found, installing Debian's chromium package" >&2
    install_debian_package chromium --no-install-recommends
    [[ -x $BIN ]] || die "$BIN still missing after installing the chromium package"
}

run() {
    ensure_installed
    local status=0
    # global, not local: the EXIT trap runs after this function has returned
    PROFILE=$(mktemp -d "${TMPDIR:-/tmp}/kvpool-chromium.XXXXXX") || die "cannot create a profile directory"
    # A fresh profile every run: no state carried between runs, and two runs never share a lock.
    trap 'rm -rf "$PROFILE"' EXIT
    "$BIN" "${FLAGS[@]}" --user-data-dir="$PROFILE" "$@" </dev/null || status=$?
    return "$status"
}

main() {
    local cmd=${1:-install}
    (($# == 0)) || shift
    case $cmd in
        install)
            (($# == 0)) || usage
            ensure_installed
            echo "$BIN"
            ;;
        run)
            (($# >= 1)) || usage
            run "$@"
            ;;
        flags)
            (($# == 0)) || usage
            printf '%s\n' "${FLAGS[@]}"
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
