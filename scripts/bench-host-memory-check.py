#!/usr/bin/env python3
"""What kvpool.mooncake's host-memory check costs a call: the check alone, small ``put_from`` and
``get_into`` calls and a vLLM-shaped ``batch_get_into_multi_buffers`` (32 keys of 64 pieces each) on a real
pool, for the check in this tree and, with ``--baseline FILE``, for the
``_HostMemory`` class of another ``args.py`` (an older one: ``git show REV:python/kvpool/mooncake/args.py``),
interleaved in one process so that both see the same machine and the same mappings.

Starts a pool (``python/tests/conftest.py``'s ``Pool``, stopped at the end). ``--mappings N`` first maps N
separate one-page mappings, for the mapping count of a big process (CUDA, torch: thousands). Prints the
median over ``--repeats`` rounds of microseconds per call. The Java side must be built (``./kvpool build``).

    python3 scripts/bench-host-memory-check.py [--mappings 0 --repeats 7 --calls 2000 --baseline old_args.py]
                                               [--way default|probe|maps]
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import mmap
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

from kvpool.mooncake import args as mc_args  # noqa: E402
from kvpool.mooncake import ranges as mc_ranges  # noqa: E402
from kvpool.mooncake import store as mc_store  # noqa: E402
from kvpool.mooncake import tensors as mc_tensors  # noqa: E402
from kvpool.mooncake import transfer as mc_transfer  # noqa: E402


def load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Baseline:
    """Another args.py's ``_HostMemory`` behind this tree's interface (one with no ``seen`` ignores it)."""

    def __init__(self, path: Path) -> None:
        self.inner = load(path, "kvpool.mooncake._baseline_args")._HostMemory()

    def seen(self) -> Any:
        return self.inner.seen() if hasattr(self.inner, "seen") else None

    def check(self, address: int, size: int, writable: bool, seen: Any = None) -> bool:
        if seen is None:
            return bool(self.inner.check(address, size, writable))
        return bool(self.inner.check(address, size, writable, seen))


def use_checker(checker: Any) -> None:
    """Makes every caller of the host-memory check use ``checker``."""
    for module in (mc_args, mc_ranges, mc_store, mc_tensors, mc_transfer):
        if hasattr(module, "_host_memory"):
            module._host_memory = checker


def per_call(fn: Callable[[], object], calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mappings", type=int, default=0, help="extra one-page mappings to make first")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000, help="calls per measurement")
    ap.add_argument("--baseline", type=Path, help="an args.py whose _HostMemory to compare with")
    ap.add_argument("--way", choices=["default", "probe", "maps"], default="default",
                    help="force this tree's check to the way of a kernel without PROCMAP_QUERY (probe: Linux "
                         "5.14 to 6.10) or without MADV_POPULATE_* either (maps)")
    a = ap.parse_args(argv)
    hm = mc_args._host_memory
    if a.way != "default":
        hm._query = lambda *args: None  # type: ignore[method-assign]
    if a.way == "maps":
        hm._probe = lambda *args: False  # type: ignore[method-assign]

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    for i in range(a.mappings):  # alternating protections, so that the kernel cannot merge neighbours
        libc.mmap(None, mmap.PAGESIZE, mmap.PROT_READ | (mmap.PROT_WRITE if i % 2 else 0),
                  mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    with open("/proc/self/maps", "rb") as f:
        lines = sum(1 for _ in f)

    checkers = {"this tree": mc_args._host_memory}
    if a.baseline:
        checkers["baseline"] = Baseline(a.baseline)

    pools = load(REPO / "python" / "tests" / "conftest.py", "kvpool_pools")
    pool = pools.Pool()
    try:
        store = pools.setup_mooncake_store(pool.master)
        small = (ctypes.c_char * 4096)()
        big = (ctypes.c_char * (1 << 20))()
        p, q = ctypes.addressof(small), ctypes.addressof(big)
        assert store.put_from("bench-64", p, 64) == 0 and store.put_from("bench-4k", p, 4096) == 0
        # vLLM's layout: each key's block is one piece per layer, the pieces strided over one big buffer
        keys = [f"bench-mb{i}" for i in range(32)]
        ptrs = [[q + (layer * 32 + i) * 512 for layer in range(64)] for i in range(32)]
        sizes = [[512] * 64 for _ in keys]
        assert store.batch_put_from_multi_buffers(keys, ptrs, sizes) == [0] * 32
        cases: dict[str, Callable[[], object]] = {
            "check 64 B readable": lambda: mc_args._host_memory.check(p, 64, False),
            "check 4 KiB writable": lambda: mc_args._host_memory.check(p, 4096, True),
            "check 1 MiB writable": lambda: mc_args._host_memory.check(q, 1 << 20, True),
            "put_from 64 B": lambda: store.put_from("bench-64", p, 64),
            "get_into 64 B": lambda: store.get_into("bench-64", p, 64),
            "put_from 4 KiB": lambda: store.put_from("bench-4k", p, 4096),
            "get_into 4 KiB": lambda: store.get_into("bench-4k", p, 4096),
            "multi get 32 x 64 pieces": lambda: store.batch_get_into_multi_buffers(keys, ptrs, sizes),
        }
        results: dict[tuple[str, str], list[float]] = {}
        for _ in range(a.repeats):
            for case, fn in cases.items():
                for name, checker in checkers.items():
                    use_checker(checker)
                    n = a.calls if case.startswith("check") else max(1, a.calls // (400 if "32 x" in case else 4))
                    results.setdefault((case, name), []).append(per_call(fn, n))
        use_checker(checkers["this tree"])
        store.close()
    finally:
        pool.stop()

    print(f"/proc/self/maps: {lines} lines; this tree's check: {a.way}; medians of {a.repeats} rounds, "
          "microseconds per call")
    print(f"{'':24s}" + "".join(f"{name:>14s}" for name in checkers))
    for case in cases:
        print(f"{case:24s}" + "".join(f"{statistics.median(results[(case, name)]):14.2f}" for name in checkers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
