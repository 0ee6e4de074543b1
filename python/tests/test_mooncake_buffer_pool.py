"""kvpool.mooncake's BufferPool and its leases, over a real kvpool pool (the allocator and NUMA helpers:
test_mooncake_host_memory.py).

Behaviour checked against the wheel mooncake-transfer-engine-non-cuda 0.3.13.post1 (and Mooncake's
buffer_pool.cpp, test_buffer_pool_native.py and store_kv_bench.py's ZcopyBufferPool). Waits are bounded and
ordered with threads and events; no assertion depends on how long something took.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import threading
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import kvpool
from kvpool import mooncake as mc
from kvpool.mooncake import BufferLease, BufferLeaseView, BufferPool, MooncakeDistributedStore
from kvpool.mooncake import buffer_pool as bp

import conftest

LOCAL = 4 << 20  # the local_buffer_size the stores below are set up with
INVALID = -600
JOIN = 30.0  # the most a test waits for a thread it has let go


def rand(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.fixture
def store(pool: conftest.Pool, client: kvpool.Client) -> Iterator[MooncakeDistributedStore]:
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, LOCAL, "tcp", "", pool.master) == 0
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mc.codes, "_warned", set())


class Spy:
    """A store wrapper (as Mooncake accepts: ``_get_pyclient_capsule``) that records registrations."""

    def __init__(self, store: MooncakeDistributedStore, register_rc: int | None = None) -> None:
        self.store = store
        self.calls: list[tuple[str, int, int]] = []
        self.register_rc = register_rc

    def _get_pyclient_capsule(self) -> Any:
        return self.store

    def register_buffer(self, ptr: int, size: int) -> int:
        self.calls.append(("reg", ptr, size))
        if self.register_rc is not None:
            return self.register_rc
        return self.store.register_buffer(ptr, size)

    def unregister_buffer(self, ptr: int) -> int:
        self.calls.append(("unreg", ptr, 0))
        return self.store.unregister_buffer(ptr)


def in_thread(fn: Any) -> tuple[threading.Thread, threading.Event, list[Any]]:
    """Runs ``fn`` in a thread; the event is set just before the call, the list gets its result or exception."""
    started = threading.Event()
    out: list[Any] = []

    def run() -> None:
        started.set()
        try:
            out.append(fn())
        except BaseException as e:  # noqa: BLE001
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert started.wait(JOIN)
    return t, started, out


def bounded(fn: Any) -> Any:
    """``fn()``'s result or exception, from a thread that must finish within JOIN seconds (a wait that
    should time out fails the test instead of hanging it)."""
    t, _, out = in_thread(fn)
    t.join(JOIN)
    assert not t.is_alive(), "the call did not return"
    return out[0]


def raised(fn: Any, match: str) -> None:
    result = bounded(fn)
    assert isinstance(result, RuntimeError) and match in str(result), result


# ----------------------------------------------------------------------------------------- names

def test_names_are_exported_and_the_registered_names_are_the_same_classes() -> None:
    for name in bp.__all__:
        assert getattr(mc, name) is getattr(bp, name)
    assert mc.RegisteredBufferPool is BufferPool
    assert mc.RegisteredBufferLease is BufferLease
    assert mc.RegisteredBufferLeaseView is BufferLeaseView
    with pytest.raises(TypeError, match="No constructor"):
        BufferLease()
    with pytest.raises(TypeError, match="No constructor"):
        BufferLeaseView()


# ------------------------------------------------------------------------------ data round trips

def test_put_from_a_lease_and_get_into_a_lease(store: MooncakeDistributedStore) -> None:
    pool = BufferPool(store)
    data = rand(100_000, 1)
    with pool.acquire(data.nbytes) as src:
        np.frombuffer(src.buffer, dtype=np.uint8)[:] = data
        assert store.put_from("bp-rt", src.ptr, src.size) == 0
    with pool.buffer(data.nbytes) as dst:
        assert store.get_into("bp-rt", dst.ptr, dst.size) == data.nbytes
        view = dst.buffer
        assert bytes(view) == data.tobytes()
        del view
    assert store.get("bp-rt") == data.tobytes()
    pool.close()


def test_lease_buffer_is_a_writable_byte_view_numpy_and_torch_can_use(store: MooncakeDistributedStore) -> None:
    torch = pytest.importorskip("torch")
    pool = BufferPool(store)
    lease = pool.acquire(16)
    view = lease.buffer
    assert isinstance(view, memoryview) and view.format == "B" and not view.readonly
    assert len(view) == 16 and view.nbytes == 16
    assert isinstance(view.obj, BufferLeaseView)
    inner = view.obj.buffer
    assert isinstance(inner, memoryview) and len(inner) == 16 and inner.format == "B"
    view[:4] = b"abcd"
    assert bytes(inner[:4]) == b"abcd"
    assert ctypes.string_at(lease.ptr, 4) == b"abcd"
    t = torch.frombuffer(lease.buffer, dtype=torch.uint8)
    t[:] = 7
    assert bytes(view) == b"\x07" * 16
    del view, inner, t
    gc.collect()
    lease.release()
    pool.close()


@pytest.mark.parametrize("size", [0, 1, 128 * 1024 + 1])
def test_any_size_is_leased_exactly(store: MooncakeDistributedStore, size: int) -> None:
    pool = BufferPool(store, 1024 * 1024, max_size_class=128 * 1024, alignment=4096)
    lease = pool.acquire(size)
    assert lease.size == size
    assert len(lease.buffer) == size
    lease.release()
    pool.close()


# ------------------------------------------------------------------- registration and alignment

def test_local_buffer_is_registered_for_the_pools_life_and_overflow_for_a_leases(
        store: MooncakeDistributedStore) -> None:
    spy = Spy(store)
    pool = BufferPool(spy, alignment=1 << 20)
    assert spy.calls == []  # the local buffer is the store's own business, as in Mooncake
    small = pool.acquire(1000)
    base = small.ptr  # the first lease starts the local buffer
    assert base % 64 == 0
    assert store.register_buffer(base + 100, 10) == INVALID  # inside a registered range
    big = pool.acquire(LOCAL)  # does not fit beside `small`: an overflow buffer
    big_ptr = big.ptr
    assert spy.calls == [("reg", big_ptr, LOCAL)]  # through the object the pool was given
    assert big_ptr % (1 << 20) == 0  # overflow buffers honour `alignment`
    assert not base <= big_ptr < base + LOCAL
    big.release()
    assert spy.calls[1] == ("unreg", big_ptr, 0)
    small.release()
    assert len(spy.calls) == 2
    local = pool._local
    assert local is not None and local.mapping._mm is not None
    pool.close()
    assert store.unregister_buffer(base) == INVALID  # close() unregistered it
    assert local.mapping._mm is None  # and unmapped it


def test_alignment_and_size_class_checks(store: MooncakeDistributedStore) -> None:
    for bad in (12345, 4, 3):
        with pytest.raises(RuntimeError, match="alignment must be a power of two"):
            BufferPool(store, 1024 * 1024, alignment=bad)
    with pytest.raises(RuntimeError, match="must be positive"):
        BufferPool(store, alignment=0)
    with pytest.raises(RuntimeError, match="must be positive"):
        BufferPool(store, min_size_class=0)
    BufferPool(store, alignment=8).close()


def test_overflow_registration_failure_raises_and_returns_the_budget(store: MooncakeDistributedStore) -> None:
    spy = Spy(store, register_rc=-1)
    pool = BufferPool(spy, max_regions=2)
    local = pool.acquire(LOCAL)
    with pytest.raises(RuntimeError, match="overflow buffer registration failed"):
        pool.acquire(10, block=False)
    spy.register_rc = None
    again = pool.acquire(10, block=False)  # an overflow again: the failed attempt holds no region
    assert spy.calls[-1] == ("reg", again.ptr, 10)
    again.release()
    local.release()
    pool.close()


# ------------------------------------------------------------------------------- reuse, budget

def test_a_released_buffer_is_reused(store: MooncakeDistributedStore) -> None:
    pool = BufferPool(store, min_size_class=4096, alignment=4096)
    ptrs = []
    for _ in range(3):
        lease = pool.acquire(1000)
        ptrs.append(lease.ptr)
        lease.release()
    assert len(set(ptrs)) == 1
    a, b = pool.acquire(100), pool.acquire(100)
    assert a.ptr != b.ptr and (a.ptr + 100 <= b.ptr or b.ptr + 100 <= a.ptr)
    a.release()
    b.release()
    pool.close()


def test_default_budget_is_twice_the_local_buffer(store: MooncakeDistributedStore) -> None:
    pool = BufferPool(store)
    with pytest.raises(RuntimeError, match="requested buffer size exceeds pool capacity"):
        pool.acquire(2 * LOCAL + 1)
    with pytest.raises(RuntimeError, match="exceeds pool capacity"):
        pool.acquire((1 << 64) - 1)
    local = pool.acquire(LOCAL)
    overflow = pool.acquire(LOCAL, block=False)
    raised(lambda: pool.acquire(1, block=False), "buffer pool is exhausted")
    overflow.release()
    one = pool.acquire(1, block=False)
    one.release()
    local.release()
    pool.close()


def test_max_bytes_is_at_least_the_local_buffer(store: MooncakeDistributedStore) -> None:
    small = BufferPool(store, max_bytes=1)
    small.acquire(LOCAL).release()
    with pytest.raises(RuntimeError, match="exceeds pool capacity"):
        small.acquire(LOCAL + 1)
    small.close()
    large = BufferPool(store, max_bytes=3 * LOCAL)
    lease = large.acquire(3 * LOCAL, block=False)
    raised(lambda: large.acquire(1, block=False), "buffer pool is exhausted")
    lease.release()
    large.close()


def test_max_regions_bounds_live_leases(store: MooncakeDistributedStore) -> None:
    pool = BufferPool(store, max_regions=2, block_on_exhaustion=False)
    a, b = pool.acquire(1), pool.acquire(1)
    raised(lambda: pool.acquire(1), "buffer pool is exhausted")
    raised(lambda: pool.acquire(1, block=True, timeout=0), "timed out waiting for buffer")
    a.release()
    pool.acquire(1).release()
    b.release()
    pool.close()
    none = BufferPool(store, max_regions=0)
    raised(lambda: none.acquire(1, block=False), "buffer pool is exhausted")
    none.close()


def test_local_store_size_sets_the_budget_and_zero_is_refused(store: MooncakeDistributedStore) -> None:
    store._local_buffer_size = 1 << 20  # type: ignore[attr-defined]
    pool = BufferPool(store)
    lease = pool.acquire(2 << 20)  # 2 x local
    with pytest.raises(RuntimeError, match="exceeds pool capacity"):
        pool.acquire((2 << 20) + 1)
    lease.release()
    pool.close()
    store._local_buffer_size = 0  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="requires a store configured with a local buffer"):
        BufferPool(store)


# ---------------------------------------------------------------------- blocking and timeouts

def test_blocking_acquire_waits_for_a_release(store: MooncakeDistributedStore) -> None:
    pool = BufferPool(store, max_regions=1)
    held = pool.acquire(1)
    t, _, out = in_thread(lambda: pool.acquire(1))
    t.join(0.2)
    assert t.is_alive() and not out  # still waiting: the only region is held
    held.release()
    t.join(JOIN)
    assert not t.is_alive()
    assert isinstance(out[0], BufferLease)
    out[0].release()
    pool.close()


def test_timeout_wait_gets_a_late_release_and_expires_without_one(store: MooncakeDistributedStore) -> None:
    pool = BufferPool(store, max_regions=1)
    held = pool.acquire(1)
    t, _, out = in_thread(lambda: pool.acquire(1, timeout=JOIN))
    held.release()
    t.join(JOIN)
    assert isinstance(out[0], BufferLease)
    raised(lambda: pool.acquire(1, timeout=0.05), "timed out waiting for buffer")
    out[0].release()
    pool.close()


def test_pool_defaults_for_block_and_timeout(store: MooncakeDistributedStore) -> None:
    pool = BufferPool(store, max_regions=1, block_on_exhaustion=False, default_timeout=0.05)
    held = pool.acquire(1)
    raised(lambda: pool.acquire(1), "buffer pool is exhausted")
    raised(lambda: pool.acquire(1, block=True), "timed out waiting for buffer")  # default_timeout bounds it
    held.release()
    pool.close()
    negative = BufferPool(store, default_timeout=-1)
    with pytest.raises(RuntimeError, match="timeout must be non-negative"):
        negative.acquire(1)
    negative.close()


def test_argument_errors(store: MooncakeDistributedStore) -> None:
    pool = BufferPool(store)
    with pytest.raises(TypeError):
        pool.acquire(-1)
    with pytest.raises(TypeError):
        pool.acquire("1")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        pool.acquire(1.0)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="timeout must be non-negative"):
        pool.acquire(1, timeout=-1)
    with pytest.raises(RuntimeError, match="to C\\+\\+ type 'double'"):
        pool.acquire(1, timeout="x")
    with pytest.raises(RuntimeError, match="to C\\+\\+ type 'bool'"):
        pool.acquire(1, block="x")
    pool.acquire(1, block=1, timeout=1).release()
    with pytest.raises(TypeError):
        pool.prewarm(-1, 3)
    assert pool.prewarm(1024, 3) is None
    with pytest.raises(TypeError):
        BufferPool(store, max_bytes=-1)
    for kw in ({"max_regions": -1}, {"max_size_class": "x"}, {"default_timeout": "x"},
               {"prewarm_size": "x", "prewarm_count": 1}):
        with pytest.raises(RuntimeError, match="Unable to cast"):
            BufferPool(store, **kw)
    BufferPool(store, prewarm_size="x").close()  # not read when prewarm_count is 0, as in Mooncake
    BufferPool(store, 0, 4096, None, 4096, False, None, None, 1024, 2).close()
    BufferPool(store=store).close()
    pool.close()


def test_store_argument_errors(store: MooncakeDistributedStore) -> None:
    with pytest.raises(RuntimeError, match="is not initialized"):
        BufferPool(None)
    with pytest.raises(RuntimeError, match="is not initialized"):
        BufferPool(MooncakeDistributedStore())
    with pytest.raises(RuntimeError, match="_get_pyclient_capsule"):
        BufferPool(object())

    class NoneCapsule:
        def _get_pyclient_capsule(self) -> None:
            return None

    class OddCapsule:
        def _get_pyclient_capsule(self) -> int:
            return 5

    with pytest.raises(RuntimeError, match="is not initialized"):
        BufferPool(NoneCapsule())
    with pytest.raises(RuntimeError, match="non-capsule"):
        BufferPool(OddCapsule())


# ---------------------------------------------------------------------------- lease lifetimes

def test_double_release_and_use_after_release(store: MooncakeDistributedStore) -> None:
    pool = BufferPool(store)
    lease = pool.acquire(10)
    with lease as entered:
        assert entered is lease
    lease.release()  # a second release does nothing
    assert lease.size == 10
    with pytest.raises(RuntimeError, match="buffer lease is closed"):
        lease.ptr
    with pytest.raises(BufferError):
        lease.buffer
    pool.close()


def test_release_is_refused_while_views_live(store: MooncakeDistributedStore) -> None:
    pool = BufferPool(store, 4096, min_size_class=4096, alignment=4096)
    lease = pool.acquire(16)
    view = lease.buffer
    with pytest.raises(RuntimeError, match="exported views"):
        lease.release()
    part = view[2:4]
    arr = np.frombuffer(view, dtype=np.uint8)
    del view
    with pytest.raises(RuntimeError, match="exported views"):
        lease.release()
    del part
    with pytest.raises(RuntimeError, match="exported views"):
        lease.release()
    del arr
    gc.collect()
    lease.release()
    pool.close()


def test_a_dropped_lease_is_released_and_a_view_keeps_it(store: MooncakeDistributedStore) -> None:
    pool = BufferPool(store, max_regions=1, block_on_exhaustion=False)
    lease = pool.acquire(10)
    del lease
    gc.collect()
    lease = pool.acquire(10)  # the dropped one went back
    view = lease.buffer
    del lease
    gc.collect()
    raised(lambda: pool.acquire(10), "buffer pool is exhausted")  # the view holds the lease
    view[:3] = b"xyz"
    del view
    gc.collect()
    pool.acquire(10).release()
    pool.close()


def test_a_lease_outlives_its_pool_object(store: MooncakeDistributedStore) -> None:
    pool = BufferPool(store)
    lease = pool.acquire(64)
    del pool
    gc.collect()
    lease.buffer[:] = b"q" * 64
    assert store.put_from("bp-outlive", lease.ptr, 64) == 0
    assert store.get("bp-outlive") == b"q" * 64
    lease.release()


def test_collected_lease_wakes_a_waiter(store: MooncakeDistributedStore) -> None:
    pool = BufferPool(store, max_regions=1)
    held = [pool.acquire(1)]
    t, _, out = in_thread(lambda: pool.acquire(1, timeout=JOIN))
    held.clear()  # dropped, never released: the collector returns it
    gc.collect()
    t.join(JOIN)
    assert isinstance(out[0], BufferLease)
    out[0].release()
    pool.close()


# ----------------------------------------------------------------------------------------- close

def test_close_refuses_active_leases_and_then_works(store: MooncakeDistributedStore) -> None:
    pool = BufferPool(store, 1024 * 1024, min_size_class=4096, alignment=4096)
    lease = pool.acquire(1)
    with pytest.raises(RuntimeError, match="cannot close buffer pool with active leases"):
        pool.close()
    other = pool.acquire(1, block=False)  # still open
    other.release()
    lease.release()
    pool.close()
    pool.close()
    with pytest.raises(RuntimeError, match="buffer pool is closed"):
        pool.acquire(1)


def test_close_fails_a_waiting_acquire(store: MooncakeDistributedStore) -> None:
    pool = BufferPool(store, max_regions=0)  # every acquire waits
    t, _, out = in_thread(lambda: pool.acquire(1))
    t.join(0.2)
    assert t.is_alive()
    pool.close()
    t.join(JOIN)
    assert not t.is_alive()
    assert isinstance(out[0], RuntimeError) and "buffer pool is closed" in str(out[0])


def test_a_collected_pool_unregisters_its_local_buffer(store: MooncakeDistributedStore) -> None:
    pool = BufferPool(store)
    lease = pool.acquire(1)
    base = lease.ptr
    lease.release()
    assert store.register_buffer(base, 10) == INVALID  # registered
    del pool, lease
    gc.collect()
    assert store.unregister_buffer(base) == INVALID  # no longer


# ------------------------------------------------------------------------------- thread safety

def test_threads_share_a_pool_without_overlap(store: MooncakeDistributedStore) -> None:
    pool = BufferPool(store, max_regions=3)
    size = 300_000  # up to 1.5 MB a lease, three at a time: the local buffer (4 MiB) and overflow buffers
    errors: list[BaseException] = []
    go = threading.Event()

    def worker(i: int) -> None:
        try:
            assert go.wait(JOIN)
            for j in range(20):
                n = size * (1 + (i + j) % 5)
                with pool.acquire(n, timeout=JOIN) as lease:
                    view = lease.buffer
                    view[:] = bytes([i]) * n
                    key = f"bp-thr-{i}-{j}"
                    assert store.put_from(key, lease.ptr, n) == 0
                    assert bytes(view) == bytes([i]) * n  # nobody else wrote into this lease
                    del view
                assert store.get(key) == bytes([i]) * n
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(6)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(JOIN * 4)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    pool.close()  # nothing is left out
