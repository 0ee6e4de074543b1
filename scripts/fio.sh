#!/usr/bin/env bash
# Sequential write and read throughput of a directory with fio, as the SSD-tier baseline of
# `kvpool bench`. Installs fio from Debian's packages if it is missing.
#   scripts/fio.sh DIR SIZE     e.g. scripts/fio.sh /mnt/nvme/kvpool 1G
# Prints two lines: "write BYTES_PER_SECOND" and "read BYTES_PER_SECOND".
set -euo pipefail

dir="${1:?usage: scripts/fio.sh DIR SIZE}"
size="${2:-1G}"

if ! command -v fio >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null 2>&1; then
    echo "fio is not installed and cannot be installed without root; install Debian's fio package" >&2
    exit 3
  fi
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq >/dev/null 2>&1 || true
  if ! DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq fio >/dev/null 2>&1; then
    echo "cannot install fio (apt-get install fio failed)" >&2
    exit 3
  fi
fi

mkdir -p "$dir"
work="$dir/kvpool-fio.$$"
trap 'rm -f "$work"' EXIT

run() {
  fio --name=kvpool-baseline --filename="$work" --rw="$1" --bs=1M --size="$size" --direct=1 \
      --ioengine=libaio --iodepth=16 --output-format=json 2>/dev/null \
    | python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(j["write" if sys.argv[1]=="write" else "read"]["bw_bytes"])' "$1"
}

echo "write $(run write)"
echo "read $(run read)"
