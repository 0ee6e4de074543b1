#!/usr/bin/env bash
# Builds the llm-d peer's harness (harness/: llm-d's KV-cache indexer fed kvpool's KV events, see
# harness/main.go) into the peer's venv, $VIRTUAL_ENV/bin/llmd-harness. Run by scripts/peers.sh as this
# peer's `build=` command (peer.conf), with PEER_DIR (this folder) and VIRTUAL_ENV set.
#
# Go: the `go` on PATH, else /usr/local/go/bin/go; go.mod names the oldest Go it builds with. The modules
# come from the Go module proxy (GOPROXY as the machine sets it) into the machine's module cache, pinned
# by harness/go.sum: -mod=readonly refuses a build that would change go.mod or go.sum. Pure Go
# (CGO_ENABLED=0): llm-d's ZMQ subscriber is github.com/go-zeromq/zmq4, so no libzmq headers are needed.
set -euo pipefail
: "${PEER_DIR:?PEER_DIR (the peer folder) is not set}" "${VIRTUAL_ENV:?VIRTUAL_ENV is not set}"

go=$(command -v go || true)
[[ -n $go ]] || go=/usr/local/go/bin/go
if [[ ! -x $go ]]; then
    echo "build.sh: no Go toolchain (no go on PATH, no /usr/local/go/bin/go): install Go 1.25 or newer" >&2
    exit 1
fi
cd "$PEER_DIR/harness"
echo "build.sh: $("$go" version), module cache $("$go" env GOMODCACHE), proxy $("$go" env GOPROXY)"
started=$SECONDS
# local: never fetch another toolchain (go.mod's go line is a minimum the local Go must meet).
GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" "$go" mod download
echo "build.sh: modules downloaded or found in $((SECONDS - started))s"
GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0 \
    "$go" build -trimpath -o "$VIRTUAL_ENV/bin/llmd-harness" .
echo "build.sh: built $VIRTUAL_ENV/bin/llmd-harness in $((SECONDS - started))s"
