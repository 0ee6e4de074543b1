#!/usr/bin/env bash
# Installs what the Python client's tests and benchmark need, from Debian packages, for Debian's own
# interpreter /usr/bin/python3 (PyPI is never used). The client itself needs none of them: its core is
# standard library only; numpy and torch are optional extras and crc32c an optional accelerator.
#
#   scripts/python-deps.sh            install whatever of the list is missing (idempotent, quiet when done)
#   scripts/python-deps.sh --check    exit 0 if everything is there, 3 if not (prints what is missing)
#
# The packages: python3-pytest (the suite), python3-numpy and python3-torch (buffer and tensor tests,
# the paged KV cache), python3-cbor2 (cross-checks the connector's own CBOR encoder), python3-redis (the
# benchmark's baseline), python3-mypy (checks the package's type hints), libisal2 (Intel ISA-L: the client's fast CRC32C, through ctypes) and python3-crc32c
# (the second choice, cross-checked against it); without either, puts checksum in pure Python.
#
# Exit status: 0 ok, 1 failure, 2 usage, 3 a package is missing and cannot be installed here.
set -euo pipefail

PROG=$(basename "$0")
PY=/usr/bin/python3
# Python statement that succeeds when it is there -> Debian package
CHECKS=("import pytest:python3-pytest" "import numpy:python3-numpy" "import torch:python3-torch"
        "import cbor2:python3-cbor2" "import redis:python3-redis" "import crc32c:python3-crc32c" "import mypy:python3-mypy"
        "import ctypes; ctypes.CDLL('libisal.so.2').crc32_iscsi:libisal2")

missing() {
    local out=() m
    for m in "${CHECKS[@]}"; do
        if ! "$PY" -c "${m%:*}" >/dev/null 2>&1; then out+=("${m##*:}"); fi
    done
    echo "${out[@]:-}"
}

as_root() {
    if [[ $(id -u) -eq 0 ]]; then "$@"
    elif command -v sudo >/dev/null 2>&1; then sudo "$@"
    else
        printf '%s: not root and no sudo: run apt-get install %s as root\n' "$PROG" "$*" >&2
        exit 3
    fi
}

case "${1:-}" in
    "") ;;
    --check)
        todo=$(missing)
        if [[ -n "$todo" ]]; then printf '%s: missing: %s\n' "$PROG" "$todo" >&2; exit 3; fi
        exit 0 ;;
    *) echo "usage: $PROG [--check]" >&2; exit 2 ;;
esac

[[ -x "$PY" ]] || { printf '%s: %s not found: install Debian'"'"'s python3 package\n' "$PROG" "$PY" >&2; exit 3; }
todo=$(missing)
[[ -z "$todo" ]] && exit 0
command -v apt-get >/dev/null 2>&1 || { printf '%s: apt-get not available; install %s by hand\n' "$PROG" "$todo" >&2; exit 3; }
echo "$PROG: installing Debian packages for $PY: $todo" >&2
# shellcheck disable=SC2086
if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $todo >&2; then
    as_root apt-get update -q >&2 || { echo "$PROG: apt-get update failed" >&2; exit 3; }
    # shellcheck disable=SC2086
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $todo >&2 \
        || { echo "$PROG: apt-get install $todo failed" >&2; exit 3; }
fi
todo=$(missing)
[[ -z "$todo" ]] || { printf '%s: still missing after install: %s\n' "$PROG" "$todo" >&2; exit 3; }
