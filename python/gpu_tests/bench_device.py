"""Save and load GB/s of the device edge at 2 MiB blocks against a plain device <-> pinned-host copy of the
same bytes, in one run (``scripts/gpu-check.sh``; ``KVPOOL_GPU_DEVICE=cpu`` for a dry run without a GPU).

Rows: the baseline copies (one contiguous device buffer <-> pinned host memory); the device edge alone (gather
into canonical order plus the copy to host, no pool); kvpool save (edge plus the put) and load (the get plus
edge) over shared memory and over TCP; and the cost of saving beside a step: a step of matrix products on the
engine's stream, timed alone and with a save of 64 blocks staged at its start."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import kvpool  # noqa: E402
from kvpool.device import CpuEdge, CudaEdge, DeviceKv, PageFormat  # noqa: E402

DEVICE = os.environ.get("KVPOOL_GPU_DEVICE", "cuda")
LAYERS, HEADS, TOKENS, HEAD = 32, 8, 16, 128  # f16 K and V: a layer's page 64 KiB, a block 2 MiB
BLOCKS = int(os.environ.get("KVPOOL_GPU_BENCH_BLOCKS", "64"))
ROUNDS = int(os.environ.get("KVPOOL_GPU_BENCH_ROUNDS", "5"))


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def best(fn: Callable[[], Any]) -> float:
    """The fastest of ROUNDS runs (after one warm-up), in seconds."""
    fn()
    sync()
    times = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    master = os.environ["KVPOOL_MASTER"]
    edge = CudaEdge() if DEVICE == "cuda" else CpuEdge()
    content = 2 * HEAD * 2
    total_blocks = 2 * BLOCKS
    # LBNHC, the FlashAttention default: each layer a region of its own
    raw = torch.empty(LAYERS * total_blocks * TOKENS * HEADS * content, dtype=torch.uint8, device=DEVICE)
    raw.random_(0, 256)
    view = raw.view(LAYERS, total_blocks, TOKENS, HEADS, content).permute(0, 1, 3, 2, 4)
    layers = [view[i] for i in range(LAYERS)]
    kv = DeviceKv(layers, PageFormat(HEADS, TOKENS, content, HEAD * 2), TOKENS, edge, "f16")
    nbytes = BLOCKS * kv.block_bytes
    ids = list(range(BLOCKS))
    load_ids = list(range(BLOCKS, 2 * BLOCKS))
    dev = torch.empty(nbytes, dtype=torch.uint8, device=DEVICE)
    host = edge.host(nbytes)
    rows: list[tuple[str, float, str]] = []

    d2h = best(lambda: host.copy_(dev, non_blocking=True))
    h2d = best(lambda: dev.copy_(host, non_blocking=True))
    rows.append(("device -> pinned host, one copy (baseline)", nbytes / d2h / 1e9, ""))
    rows.append(("pinned host -> device, one copy (baseline)", nbytes / h2d / 1e9, ""))
    stage = best(lambda: kv.save_sources(ids))
    rows.append(("edge: gather + device -> host, no pool", nbytes / stage / 1e9, f"{d2h / stage:.2f}x baseline"))

    for shm in (True, False):
        path = "shared memory" if shm else "TCP"
        with kvpool.Client(master, shared_memory=shm) as c:
            keys = [f"bench/{shm}/{i}" for i in ids]

            def save() -> None:
                c.remove_all(force=True)
                st = c.put_batch(keys, kv.save_sources(ids))
                assert all(s.name == "OK" for s in st), st[:3]

            def load() -> None:
                targets, commit = kv.load_targets(load_ids)
                got = c.get_into_batch(keys, targets)
                assert got == [kv.block_bytes] * BLOCKS
                commit([True] * BLOCKS)

            s_t = best(save)
            save()
            l_t = best(load)
            rows.append((f"kvpool save, {path}", nbytes / s_t / 1e9, f"{d2h / s_t:.2f}x device -> pinned"))
            rows.append((f"kvpool load, {path}", nbytes / l_t / 1e9, f"{h2d / l_t:.2f}x pinned -> device"))
            c.remove_all(force=True)

    # saving beside a step
    n = 2048 if DEVICE == "cuda" else 256  # a dry run on CPU keeps the step short
    a = torch.randn(n, n, device=DEVICE)

    def step() -> None:
        x = a
        for _ in range(20):
            x = (x @ a) / n
    alone = best(step)
    staged: list[Any] = []

    def step_with_save() -> None:
        staged.append(kv.stage_save(ids))
        step()
        staged.pop().wait()
    beside = best(step_with_save)
    rows.append(("step time with a save of %d blocks beside it" % BLOCKS, beside / alone, "x the step alone"))

    print(f"\nkvpool device edge on {DEVICE} ({torch.cuda.get_device_name() if DEVICE == 'cuda' else 'CPU'}), "
          f"torch {torch.__version__}, {BLOCKS} blocks of {kv.block_bytes >> 20} MiB, best of {ROUNDS}\n")
    print(f"{'what':58} {'GB/s or ratio':>14}  note")
    for what, v, note in rows:
        print(f"{what:58} {v:14.2f}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
