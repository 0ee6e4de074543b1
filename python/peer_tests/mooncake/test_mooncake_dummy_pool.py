"""The dummy client's memory pool on the wheel and on kvpool: ``setup_dummy`` then ``alloc_from_mem_pool``,
``register_buffer`` / ``unregister_buffer`` of that memory, and ``MooncakeHostMemAllocator.free`` of it.

The wheel's dummy client is set up against the session's ``mooncake_client`` (the standalone store it
reaches over RPC and a Unix socket), kvpool's against the session's kvpool master; one script runs on each
and records what each call answers and what the memory looks like in ``/proc/self/maps``. The records must
be equal.
"""

from __future__ import annotations

import ctypes
import mmap
from pathlib import Path
from typing import Any, Callable, Optional

import mooncake.store as real  # the pinned wheel

import kvpool.mooncake as ours


def _mapping(addr: int) -> Optional[tuple[int, bool]]:
    """(length, is a memfd named mooncake_shm) of the mapping that holds ``addr``, or None."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= addr < hi:
            return hi - lo, "memfd:mooncake_shm" in line
    return None


def _script(store: Any, server: str, host: Any, key: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []

    def note(step: str, value: Any) -> None:
        out.append((step, value))

    def raises(fn: Callable[[], object]) -> str:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the exception's type is the observation
            return type(e).__name__
        return "no exception"

    kept: list[int] = []
    note("setup_dummy", store.setup_dummy(1 << 30, 16 << 20, server))
    note("get_hostname", store.get_hostname())
    for size in (4096, 1, 100, 5000, 1 << 20):
        a = store.alloc_from_mem_pool(size)
        if a:
            kept.append(a)
            ctypes.memset(a, 0x5A, size)
        note(f"alloc {size}", (a != 0, a % mmap.PAGESIZE == 0, _mapping(a) if a else None))
    note("alloc 0", store.alloc_from_mem_pool(0))
    note("alloc 2**50", store.alloc_from_mem_pool(1 << 50))
    for bad in (-1, "1", 1.5):
        note(f"alloc {bad!r}", raises(lambda: store.alloc_from_mem_pool(bad)))
    a = store.alloc_from_mem_pool(5000)
    if not a:  # nothing to register or write through
        note("alloc 5000 for registering", a)
        store.close()
        return out
    kept.append(a)
    note("register a part", store.register_buffer(a + 4096, 64))
    note("register too short", store.register_buffer(a, 4096))
    note("register its pages", store.register_buffer(a, 8192))
    note("register whole", store.register_buffer(a, 5000))
    note("register whole again", store.register_buffer(a, 5000))
    ctypes.memmove(a, b"hello dummy" * 10, 110)
    note("put_from pool memory", store.put_from(key, a, 110))
    note("get", store.get(key))
    b = store.alloc_from_mem_pool(4096)
    note("register another", store.register_buffer(b, 4096))
    note("get_into it", (store.get_into(key, b, 4096), ctypes.string_at(b, 110)))
    note("unregister", store.unregister_buffer(a))
    note("unregister again", store.unregister_buffer(a))
    note("unregister inside", store.unregister_buffer(b + 10))
    note("register after unregister", store.register_buffer(a, 5000))
    x = host.alloc(4096)
    kept.append(x)
    note("register host-allocator memory", store.register_buffer(x, 4096))
    note("host allocator frees pool memory", (host.free(b), _mapping(b)))
    note("remove", store.remove(key, True))
    note("close", store.close())
    note("pool memory after close", [_mapping(p) is not None for p in kept])
    note("host allocator frees the rest", [host.free(p) for p in kept])
    return out


def test_the_dummy_clients_pool_answers_as_the_wheels(mooncake_cluster: Any, kvpool_pool: Any) -> None:
    theirs = _script(real.MooncakeDistributedStore(), mooncake_cluster.store_address, real.MooncakeHostMemAllocator(),
                     "peer/dummy-pool")
    mine = _script(ours.MooncakeDistributedStore(), kvpool_pool.master, ours.MooncakeHostMemAllocator(),
                   "peer/dummy-pool")
    differ = [(step, t, m) for (step, t), (_, m) in zip(theirs, mine) if t != m]
    assert not differ, "\n".join(f"{step}: wheel {t!r}, kvpool {m!r}" for step, t, m in differ)
    assert [step for step, _ in mine] == [step for step, _ in theirs]
