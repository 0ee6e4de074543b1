#!/usr/bin/env python3
"""The Python connector's layer-by-layer load against its whole-block load, in one run.

Starts a pool (``python/tests/conftest.py``'s ``Pool``: master and node by PID, stopped at the end),
stores ``--blocks`` blocks of ``--layers`` layers (default 64 blocks of 2 MiB, 32 layers: Llama-3-8B's
geometry with 16-token blocks in f16) and then, ``--repeats`` times, has a ``PoolConnector`` load all of
them into a ``PagedKvCache`` in each of four ways, interleaved: whole blocks and layer by layer, over the
same-machine path (shm) and over TCP. Per load it takes the time from ``start_load_kv`` until
``wait_for_layer_load(0)`` returns (layer 0 is in: the engine could start computing) and until
``wait_for_layer_load(last)`` returns (everything is in). Prints the medians and the ratios of layer by
layer to whole blocks; ``--json FILE`` writes them. The Java side must be built (``./kvpool build``).

    python3 scripts/bench-python-layers.py [--blocks 64 --layers 32 --repeats 9 --json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

import kvpool  # noqa: E402
from kvpool.connector import BlockHasher, ConnectorMeta, KeyFormat, Load, PagedKvCache, PoolConnector  # noqa: E402

TOKENS, HEADS, DIM = 16, 8, 128  # with f16: 64 KiB a layer of a block


def pools() -> Any:
    spec = importlib.util.spec_from_file_location("kvpool_pools", REPO / "python" / "tests" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_once(pc: PoolConnector, kv: PagedKvCache, loads: list[Load]) -> tuple[float, float]:
    """One step's loads of every block: seconds until layer 0 is in, and until every layer is."""
    meta = ConnectorMeta(loads=loads, generation=pc.generation())
    t0 = time.perf_counter()
    pc.start_load_kv(meta, kv)
    pc.wait_for_layer_load(0)
    first = time.perf_counter() - t0
    pc.wait_for_layer_load(kv.num_layers - 1)
    done = time.perf_counter() - t0
    errors = pc.block_ids_with_load_errors()
    if errors:
        raise RuntimeError(f"{len(errors)} blocks failed to load")
    return first, done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    np = __import__("numpy")
    pool = pools().Pool(segment_size="1GiB")
    try:
        keys = KeyFormat("bench-layers", "v1", "f16")
        hasher = BlockHasher(TOKENS, "0")
        src = PagedKvCache(args.blocks, args.layers, TOKENS, HEADS, DIM, dtype="float16")
        src.data[:] = np.random.default_rng(0).standard_normal(src.data.shape).astype(np.float16)
        names = [f"bench-layers/block-{i}" for i in range(args.blocks)]
        with kvpool.Client(pool.master) as c:
            assert all(s == kvpool.PutStatus.OK for s in c.put_batch(names, [src.block(b) for b in range(args.blocks)]))
        loads = [Load("r", b, b, names[b]) for b in range(args.blocks)]
        ways = [(g, shm) for shm in (True, False) for g in ("block", "layer")]
        clients = {shm: kvpool.Client(pool.master, shared_memory=shm) for shm in (True, False)}
        conns = {(g, shm): PoolConnector(clients[shm], hasher, keys, granularity=g) for g, shm in ways}
        kv = PagedKvCache(args.blocks, args.layers, TOKENS, HEADS, DIM, dtype="float16")
        times: dict[tuple[str, bool], list[tuple[float, float]]] = {w: [] for w in ways}
        for w in ways:  # warm-up: connections, mappings, pages of the destination
            load_once(conns[w], kv, loads)
        assert np.array_equal(kv.data, src.data)
        for r in range(args.repeats):
            order = ways if r % 2 == 0 else ways[::-1]
            for w in order:
                kv.data.fill(0)
                times[w].append(load_once(conns[w], kv, loads))
                if not np.array_equal(kv.data, src.data):
                    raise RuntimeError(f"{w}: the loaded blocks differ from the stored ones")
        for pc in conns.values():
            pc.close()
        for c in clients.values():
            c.close()
    finally:
        pool.stop()
    out: dict[str, Any] = {"blocks": args.blocks, "layers": args.layers, "block_bytes": src.block_bytes,
                           "repeats": args.repeats, "median_ms": {}, "ratio_layer_to_block": {}}
    for shm in (True, False):
        path = "shm" if shm else "tcp"
        med = {}
        for g in ("block", "layer"):
            firsts, alls = zip(*times[(g, shm)])
            med[g] = (statistics.median(firsts) * 1e3, statistics.median(alls) * 1e3)
            out["median_ms"][f"{path} {g}"] = {"layer 0 in": round(med[g][0], 3), "all in": round(med[g][1], 3)}
        out["ratio_layer_to_block"][path] = {"layer 0 in": round(med["layer"][0] / med["block"][0], 3),
                                             "all in": round(med["layer"][1] / med["block"][1], 3)}
    mib = args.blocks * src.block_bytes / 2**20
    print(f"{args.blocks} blocks of {src.block_bytes >> 10} KiB ({args.layers} layers, {mib:.0f} MiB), "
          f"median of {args.repeats}:")
    for name, m in out["median_ms"].items():
        print(f"  {name:10s} layer 0 in {m['layer 0 in']:8.2f} ms   all in {m['all in']:8.2f} ms "
              f"({mib / 1024 / (m['all in'] / 1e3):.2f} GiB/s)")
    for path, rt in out["ratio_layer_to_block"].items():
        print(f"  {path}: layer by layer / whole blocks: layer 0 in {rt['layer 0 in']:.3f}x, all in {rt['all in']:.3f}x")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
