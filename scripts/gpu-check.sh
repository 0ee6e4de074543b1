#!/usr/bin/env bash
# The GPU check of kvpool's device edge (docs/engines.md, "GPU engines"): one command on a machine with one
# NVIDIA GPU, a CUDA PyTorch and no network. It starts a pool (one `kvpool serve`), runs the device tests on
# CUDA tensors (python/gpu_tests: every vLLM 0.32 KV cache layout and page kind, shared memory and TCP,
# streams and events, layer by layer, the Mooncake API on device addresses), then measures save and load GB/s
# at 2 MiB blocks against a plain device <-> pinned-host copy in the same run and prints one table
# (also written to .gpu-check/table.txt), then times a Llama-3-8B-shaped engine's first token with whole blocks
# against layer by layer (python/gpu_tests/bench_layers.py, appended to the table). Under 10 minutes: the tests
# get 5, the device bench 2, the layers bench 3.
#
#   scripts/gpu-check.sh --prepare     on a build machine (JDK 25, network): builds the jar if missing, makes a
#                                      Java runtime with jlink (.gpu-check/jre, packed as .gpu-check/jre.tgz), puts
#                                      pytest in .gpu-check/site and the crc32c wheel for the GPU machine's Python
#                                      (GPU_PYTHON_VERSION, default 3.12) in .gpu-check/wheels, so that the GPU
#                                      machine needs neither a JDK nor the network. Carry the jar, jre.tgz and
#                                      wheels (and site, where the GPU machine has no pytest): 42 MiB
#   scripts/gpu-check.sh               on the GPU machine: the check (exit 0 all passed, 1 a failure)
#   scripts/gpu-check.sh --device cpu  the same on the device edge's CPU implementation (a dry run anywhere)
#
# Environment: PYTHON (default python3, the one with the CUDA torch), KVPOOL_JAVA (a java to use instead of
# .gpu-check/jre), KVPOOL_GPU_BENCH_BLOCKS (default 64 blocks of 2 MiB a batch), KVPOOL_GPU_SKIP_TESTS=1 (the
# benches only), and bench_layers.py's KVPOOL_GPU_LAYERS_* (its docstring).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=$root/.gpu-check
jar=$root/kvpool-cli/target/kvpool.jar
device=cuda

die() { echo "gpu-check: $*" >&2; exit 1; }

prepare() {
    local jdk=${JAVA_HOME:-/usr/lib/jvm/temurin-25-jdk-amd64}
    [[ -x $jdk/bin/jlink ]] || die "no jlink in $jdk (set JAVA_HOME to a JDK 25)"
    [[ -f $jar ]] || ./kvpool build >/dev/null || die "building the jar failed"
    mkdir -p "$out"
    local modules
    modules=$("$jdk/bin/jdeps" --ignore-missing-deps --print-module-deps "$jar") || die "jdeps failed"
    # java.desktop only draws the bench's charts (xchart), which `serve` never does: 15 MiB less to carry
    modules=$(tr , '\n' <<<"$modules" | grep -vx java.desktop | paste -sd,)
    rm -rf "$out/jre"
    "$jdk/bin/jlink" --add-modules "$modules" --strip-java-debug-attributes \
        --strip-native-debug-symbols=objcopy=/usr/bin/objcopy --no-man-pages --no-header-files \
        --compress=zip-9 --output "$out/jre" || die "jlink failed"
    # the runtime unpacked is 48 MiB, too much beside the jar for a 64 MiB transfer; packed, 28 MiB
    tar -C "$out" -czf "$out/jre.tgz" jre || die "packing the Java runtime failed"
    rm -rf "$out/site" "$out/wheels"
    # pytest 8.3 (8.4 needs pygments); tomli and exceptiongroup for a Python older than 3.11 there
    "${PYTHON:-python3}" -m pip install -q --no-compile --target "$out/site" pytest==8.3.5 tomli==2.2.1 \
        exceptiongroup==1.3.0 >/dev/null || die "pip could not fetch pytest into $out/site"
    # CRC32C in C for the GPU machine's Python: without it (or Debian's libisal2) a put checksums in pure Python,
    # and the bench's TCP saves of 512 MiB outlast their time limit
    "${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: --implementation cp \
        --python-version "${GPU_PYTHON_VERSION:-3.12}" --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$out/wheels" crc32c==2.9.post0 \
        >/dev/null || die "pip could not fetch the crc32c wheel into $out/wheels"
    du -sh "$out/jre.tgz" "$out/site" "$out/wheels" "$jar" | sed 's/^/gpu-check: /'
    echo "gpu-check: carry kvpool-cli/target/kvpool.jar, .gpu-check/jre.tgz and .gpu-check/wheels to the GPU machine"
}

case "${1:-}" in
    --prepare) prepare; exit 0 ;;
    --device) device=${2:?--device cuda|cpu}; shift 2 ;;
    "") ;;
    *) die "unknown argument $1 (--prepare, --device cuda|cpu)" ;;
esac

[[ -f $jar ]] || die "no $jar (run scripts/gpu-check.sh --prepare where a JDK is, and carry the result)"
if [[ -z ${KVPOOL_JAVA:-} && ! -x $out/jre/bin/java && -f $out/jre.tgz ]]; then
    tar -C "$out" -xzf "$out/jre.tgz" || die "unpacking $out/jre.tgz failed"
fi
java=${KVPOOL_JAVA:-$out/jre/bin/java}
if [[ ! -x $java ]]; then
    java=$(command -v java || true)
    [[ -n $java ]] || die "no Java runtime: run --prepare (it makes .gpu-check/jre) or set KVPOOL_JAVA"
fi
python=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
[[ -d $out/site ]] && PYTHONPATH="$PYTHONPATH:$out/site"
if compgen -G "$out/wheels/*.whl" >/dev/null && ! "$python" -c 'import crc32c' 2>/dev/null; then
    if "$python" -m pip install -q --no-index --no-deps --no-compile --target "$out/wheel-site" "$out"/wheels/*.whl; then
        PYTHONPATH="$PYTHONPATH:$out/wheel-site"
    else
        echo "gpu-check: warning: the wheels in $out/wheels do not install for $python (GPU_PYTHON_VERSION at --prepare?)"
    fi
fi
"$python" -c 'import pytest' 2>/dev/null || die "$python has no pytest (run --prepare, or install it)"
"$python" - "$device" <<'PY' || exit 1
import sys, torch
want = sys.argv[1]
if want == "cuda" and not torch.cuda.is_available():
    sys.exit(f"gpu-check: torch {torch.__version__} sees no CUDA device (--device cpu runs the dry run)")
from kvpool import crc
print(f"gpu-check: torch {torch.__version__}, "
      + (torch.cuda.get_device_name() if want == "cuda" else "CPU edge (dry run)") + f", checksums: {crc.BACKEND}")
if crc.BACKEND == "python":
    print("gpu-check: warning: CRC32C in pure Python makes puts over TCP crawl; install libisal2 or the crc32c wheel")
PY

port=$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
node_port=$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
log=$out/serve.log
"$java" --enable-native-access=ALL-UNNAMED -Xmx1g -jar "$jar" serve --port "$port" --node-port "$node_port" \
    --http-port -1 --segment-size 1GiB >"$log" 2>&1 &
pid=$!
stop() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
trap stop EXIT
for _ in $(seq 600); do
    grep -q "kvpool serving: " "$log" && break
    kill -0 "$pid" 2>/dev/null || { tail -20 "$log" >&2; die "kvpool serve exited"; }
    sleep 0.1
done
grep -q "kvpool serving: " "$log" || { tail -20 "$log" >&2; die "kvpool serve not ready in 60 s"; }
export KVPOOL_MASTER=127.0.0.1:$port KVPOOL_GPU_DEVICE=$device

rc=0
if [[ ${KVPOOL_GPU_SKIP_TESTS:-0} != 1 ]]; then
    timeout 300 "$python" -m pytest -q -p no:cacheprovider python/gpu_tests || rc=1
fi
timeout 120 "$python" python/gpu_tests/bench_device.py | tee "$out/table.txt" || rc=1
timeout 180 "$python" python/gpu_tests/bench_layers.py | tee -a "$out/table.txt" || rc=1
[[ $rc == 0 ]] && echo "gpu-check: passed ($device)" || echo "gpu-check: FAILED ($device)"
exit $rc
