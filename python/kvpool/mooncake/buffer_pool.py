"""Mooncake's registered buffer pools: ``BufferPool``, ``BufferLease``, ``BufferLeaseView`` and the ``Registered*``
names (the allocator and NUMA helpers are in ``host_memory``).

Design note (``BufferPool``). Mooncake's pool leases scratch buffers for ``put_from``/``get_into`` out of the
store's *local buffer* (the ``local_buffer_size`` bytes a Mooncake client maps and registers at setup) and,
when that is full, out of *overflow* buffers: memory aligned to ``alignment``, registered with
``store.register_buffer`` for the life of one lease and unregistered when it is released. A kvpool client
owns no local buffer, so each pool maps its own: one anonymous mapping of the store's ``local_buffer_size``
bytes, registered with the kvpool store itself when the pool is created (as Mooncake's setup registers its
local buffer; a wrapper's ``register_buffer`` is not called for it), unregistered and unmapped by ``close()``
(or when the pool is collected). Leases are carved out of it first fit, at 64-byte granularity, and go back to
it on release, so the next lease that fits reuses a released buffer. Overflow leases are anonymous
mappings aligned to ``alignment``, registered and unregistered around each lease, as in Mooncake.

The budget, the errors and the lifetimes are Mooncake's (buffer_pool.cpp, and the wheel's behaviour):
live leases' sizes (``max(size, 1)`` each) stay within ``max_bytes`` (0 means twice the local buffer; a
smaller value is raised to the local buffer) and their number within ``max_regions``; ``min_size_class``,
``max_size_class`` and ``prewarm`` are checked and otherwise have no effect (Mooncake sizes a lease
exactly). Failures raise ``RuntimeError`` with Mooncake's messages; argument types raise ``TypeError``.

``lease.buffer`` is a new memoryview each time over a ``BufferLeaseView``: a ctypes byte array at the
lease's address which holds the lease. ``release()`` refuses while any such view lives (slices, numpy and
torch arrays built on one keep it alive), so memory is never returned under a live view; a lease dropped
without ``release()`` is released when it is collected, and a lease keeps its pool alive. That release
from a collector never blocks: when the pool's lock is busy the lease's memory is queued, and whoever
holds or next takes the lock returns it (waiters re-check at least every half second).
"""

from __future__ import annotations

import collections
import ctypes
import functools
import itertools
import mmap
import operator
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Optional

from .args import _uint
from .codes import _warn_once, log

if TYPE_CHECKING:
    from .store import MooncakeDistributedStore

__all__: list[str] = [
    "BufferPool", "BufferLease", "BufferLeaseView", "RegisteredBufferPool", "RegisteredBufferLease",
    "RegisteredBufferLeaseView",
]

#: The local buffer Mooncake's setup() maps when none is given (types.h DEFAULT_LOCAL_BUFFER_SIZE); what a
#: pool assumes when the store does not say what ``local_buffer_size`` it was set up with.
DEFAULT_LOCAL_BUFFER_SIZE = 16 * 1024 * 1024

#: Leases carved out of a pool's local buffer start on this boundary.
_LOCAL_GRAIN = 64

#: The longest a waiting ``acquire`` sleeps before it looks again for leases released by the collector.
_WAIT_SLICE = 0.5

_SIZE_T_MAX = (1 << 64) - 1


# ------------------------------------------------------------------------------- pybind11-style casts

def _cast_error(value: Any, ctype: str) -> RuntimeError:
    return RuntimeError(f"Unable to cast Python instance of type {type(value)} to C++ type '{ctype}'")


def _obj_bool(value: Any) -> bool:
    """``py::object.cast<bool>()``: a bool, or anything with ``__bool__``; RuntimeError otherwise."""
    if value is True or value is False:
        return bool(value)
    if hasattr(type(value), "__bool__"):
        return bool(value)
    raise _cast_error(value, "bool")


def _obj_double(value: Any) -> float:
    """``py::object.cast<double>()``: a float, an int or anything with ``__float__``/``__index__``."""
    if isinstance(value, (str, bytes, bytearray)):
        raise _cast_error(value, "double")
    if hasattr(type(value), "__float__"):
        return float(value)
    if hasattr(type(value), "__index__"):
        return float(operator.index(value))
    raise _cast_error(value, "double")


def _obj_size_t(value: Any) -> int:
    """``py::object.cast<size_t>()``: a non-negative int below 2**64; RuntimeError otherwise."""
    if isinstance(value, float):
        raise _cast_error(value, "unsigned long")
    try:
        n = operator.index(value)
    except TypeError:
        raise _cast_error(value, "unsigned long") from None
    if not 0 <= n <= _SIZE_T_MAX:
        raise _cast_error(value, "unsigned long")
    return n


def _bool_arg(value: Any, what: str) -> bool:
    """A parameter declared ``bool`` (pybind11 converts None and anything with ``__bool__``)."""
    if value is None:
        return False
    if value is True or value is False or hasattr(type(value), "__bool__"):
        return bool(value)
    raise TypeError(f"{what} must be a bool, got {type(value).__name__}")


def _rc(value: Any, what: str) -> int:
    """A store call's return code, as Mooncake reads it (``py::cast<int>``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            return operator.index(value)
        except TypeError:
            raise RuntimeError(f"{what} returned {type(value).__name__}, not an int") from None
    return value


# --------------------------------------------------------------------------------------- memory

class _Mapping:
    """Private anonymous memory of ``size`` bytes whose address is a multiple of ``alignment`` (a power of
    two); the mapping is larger by ``alignment`` less a page when that exceeds a page (never touched)."""

    __slots__ = ("_mm", "addr", "size")

    def __init__(self, size: int, alignment: int) -> None:
        pad = alignment - mmap.PAGESIZE if alignment > mmap.PAGESIZE else 0
        self._mm: Optional[mmap.mmap] = mmap.mmap(-1, size + pad, flags=mmap.MAP_PRIVATE,
                                                  prot=mmap.PROT_READ | mmap.PROT_WRITE)
        probe = ctypes.c_char.from_buffer(self._mm)
        start = ctypes.addressof(probe)
        del probe  # the probe is an export of the mmap; close() needs none
        self.addr = (start + alignment - 1) & ~(alignment - 1)
        self.size = size

    def close(self) -> None:
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # pragma: no cover - nothing exports it; then the collector unmaps it
                pass


def _mapping_or_none(size: int, alignment: int) -> Optional[_Mapping]:
    """A mapping, or None when the system refuses one (posix_memalign failing, for Mooncake)."""
    try:
        return _Mapping(size, alignment)
    except (OSError, ValueError, OverflowError, MemoryError) as e:
        log.debug("kvpool.mooncake BufferPool: cannot map %d bytes aligned to %d: %s", size, alignment, e)
        return None


class _LocalBuffer:
    """A pool's stand-in for Mooncake's local buffer: one mapping, handed out first fit in 64-byte grains."""

    def __init__(self, capacity: int) -> None:
        self.capacity = -(-capacity // _LOCAL_GRAIN) * _LOCAL_GRAIN
        self.mapping = _Mapping(self.capacity, mmap.PAGESIZE)
        self.addr = self.mapping.addr
        self._free: list[list[int]] = [[0, self.capacity]]  # [offset, length], sorted by offset, coalesced

    def alloc(self, size: int) -> Optional[tuple[int, int]]:
        """(offset, length) of a free block for ``size`` bytes, or None."""
        need = -(-size // _LOCAL_GRAIN) * _LOCAL_GRAIN
        for i, (off, length) in enumerate(self._free):
            if length >= need:
                if length == need:
                    del self._free[i]
                else:
                    self._free[i] = [off + need, length - need]
                return off, need
        return None

    def free(self, off: int, length: int) -> None:
        blocks = self._free
        i = 0
        while i < len(blocks) and blocks[i][0] < off:
            i += 1
        blocks.insert(i, [off, length])
        if i + 1 < len(blocks) and off + length == blocks[i + 1][0]:
            blocks[i][1] += blocks[i + 1][1]
            del blocks[i + 1]
        if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == off:
            blocks[i - 1][1] += blocks[i][1]
            del blocks[i]


class _Region:
    """The memory behind one lease: a block of the local buffer, or an overflow mapping."""

    __slots__ = ("addr", "size", "local", "overflow")

    def __init__(self, addr: int, size: int, local: Optional[tuple[int, int]], overflow: Optional[_Mapping]) -> None:
        self.addr = addr
        self.size = size
        self.local = local
        self.overflow = overflow


# ----------------------------------------------------------------------------------- store handle

def _unwrap_store(store: Any) -> Optional[MooncakeDistributedStore]:
    """The kvpool ``MooncakeDistributedStore`` behind ``store`` (itself, or what a wrapper's
    ``_get_pyclient_capsule()`` returns), or None when that store is missing; RuntimeError for other objects."""
    from .store import MooncakeDistributedStore
    if store is None:
        return None
    if isinstance(store, MooncakeDistributedStore):
        return store
    getter = getattr(store, "_get_pyclient_capsule", None)
    if getter is None:
        raise RuntimeError("BufferPool store parameter must be a PyClient or store wrapper that implements "
                           "_get_pyclient_capsule()")
    handle = getter()
    if handle is None:
        return None
    if isinstance(handle, MooncakeDistributedStore):
        return handle
    if type(handle).__name__ == "PyCapsule":
        raise RuntimeError("store wrapper returned an unexpected PyClient capsule type")
    raise RuntimeError("store wrapper returned a non-capsule PyClient handle")


def _local_buffer_size(core: Any) -> int:
    """The ``local_buffer_size`` the store was set up with (Mooncake's local buffer capacity)."""
    size = getattr(core, "_local_buffer_size", None)
    if size is None:
        _warn_once("bufferpool-local", "kvpool.mooncake BufferPool: the store does not record its "
                   "local_buffer_size; assuming Mooncake's default of %d bytes", DEFAULT_LOCAL_BUFFER_SIZE)
        return DEFAULT_LOCAL_BUFFER_SIZE
    return int(size)


def _store_is_set_up(core: Any) -> bool:
    return getattr(core, "_client", None) is not None


# -------------------------------------------------------------------------------------- the views

class BufferLeaseView:
    """What ``BufferLease.buffer`` views: the lease's bytes as a writable byte buffer (format ``B``), holding
    the lease while it lives. Not constructible; ``view.buffer`` is a memoryview of it."""

    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("kvpool.mooncake.BufferLeaseView: No constructor defined!")

    @property
    def buffer(self) -> memoryview:
        """A memoryview (format ``B``, writable) over this view's bytes."""
        return memoryview(self).cast("B")  # type: ignore[arg-type]  # the concrete class is a ctypes array


@functools.lru_cache(maxsize=256)
def _view_type(size: int) -> Any:
    """The concrete ``BufferLeaseView`` for ``size`` bytes: a ctypes byte array (the buffer protocol in C)."""
    return type("BufferLeaseView", (BufferLeaseView, ctypes.c_ubyte * size), {"__module__": __name__})


class BufferLease:
    """A buffer leased from a ``BufferPool``: ``ptr`` (its address, for ``put_from``/``get_into``), ``size``
    (the size asked for), ``buffer`` (a memoryview over ``size`` bytes), ``release()``; a context manager
    that releases on exit. Not constructible; ``BufferPool.acquire`` makes them."""

    __slots__ = ("_pool", "_region", "_size", "_views", "__weakref__")

    _pool: Optional[BufferPool]
    _region: Optional[_Region]
    _size: int
    _views: dict[int, None]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("kvpool.mooncake.BufferLease: No constructor defined!")

    @classmethod
    def _new(cls, pool: BufferPool, region: _Region, size: int) -> BufferLease:
        lease: BufferLease = object.__new__(cls)
        lease._pool = pool
        lease._region = region
        lease._size = size
        lease._views = {}  # live views, by token (dict operations are atomic; the collector removes them)
        return lease

    @property
    def ptr(self) -> int:
        """The lease's address; RuntimeError once released."""
        region = self._region
        if region is None:
            raise RuntimeError("buffer lease is closed")
        return region.addr

    @property
    def size(self) -> int:
        """The size asked for (also after release)."""
        return self._size

    @property
    def buffer(self) -> memoryview:
        """A new writable memoryview (format ``B``) over the lease's ``size`` bytes; its ``obj`` is a
        ``BufferLeaseView``. BufferError once released."""
        pool = self._pool
        if pool is None or self._region is None:
            raise BufferError("Error getting buffer: buffer lease is closed")
        pool._enter()
        try:
            region = self._region
            if region is None:
                raise BufferError("Error getting buffer: buffer lease is closed")
            view = _view_type(self._size).from_address(region.addr)
            view._lease = self  # a view keeps its lease, and so the memory, alive
            token = next(_view_tokens)
            self._views[token] = None
            weakref.finalize(view, _forget_view, self._views, token).atexit = False
        finally:
            pool._leave()
        return memoryview(view).cast("B")

    def release(self) -> None:
        """Returns the buffer to the pool; None. A second release does nothing. RuntimeError while views from
        ``buffer`` live (delete them first), or when the store refuses to unregister an overflow buffer."""
        pool = self._pool
        if pool is not None:
            pool._release(self)

    def __enter__(self) -> BufferLease:
        """The lease itself."""
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        """Releases the lease (see ``release``); None, so an exception from the block propagates."""
        self.release()

    def __del__(self) -> None:
        pool, region = getattr(self, "_pool", None), getattr(self, "_region", None)
        if pool is not None and region is not None:
            try:
                pool._release_collected(self)
            except Exception:  # noqa: BLE001 - nothing may escape a finaliser
                pass


_view_tokens = itertools.count()


def _forget_view(views: dict[int, None], token: int) -> None:
    views.pop(token, None)


# ------------------------------------------------------------------------------------------ the pool

class BufferPool:
    """Mooncake's ``BufferPool`` over a kvpool store: scratch buffers for the zero-copy calls.

    ``BufferPool(store, max_bytes=0, min_size_class=65536, max_size_class=None, alignment=8388608,
    block_on_exhaustion=True, default_timeout=None, max_regions=None, prewarm_size=None, prewarm_count=0)``.
    ``store`` is a set-up kvpool ``MooncakeDistributedStore`` (or a wrapper whose ``_get_pyclient_capsule()``
    returns one). See the module notes for where the memory comes from and the rules a lease follows.
    """

    def __init__(self, store: Any, max_bytes: int = 0, min_size_class: int = 65536, max_size_class: Any = None,
                 alignment: int = 8388608, block_on_exhaustion: bool = True, default_timeout: Any = None,
                 max_regions: Any = None, prewarm_size: Any = None, prewarm_count: int = 0) -> None:
        self._closed = True  # until constructed, so that a half-built pool never frees anything
        max_bytes = _uint(max_bytes, "max_bytes")
        min_size_class = _uint(min_size_class, "min_size_class")
        alignment = _uint(alignment, "alignment")
        block = _bool_arg(block_on_exhaustion, "block_on_exhaustion")
        prewarm_count = _uint(prewarm_count, "prewarm_count")
        core = _unwrap_store(store)
        if core is None or not _store_is_set_up(core):
            raise RuntimeError("MooncakeDistributedStore is not initialized")
        if min_size_class == 0 or alignment == 0:
            raise RuntimeError("min_size_class and alignment must be positive")
        if alignment < ctypes.sizeof(ctypes.c_void_p) or alignment & (alignment - 1):
            raise RuntimeError("alignment must be a power of two and at least sizeof(void*)")
        local = _local_buffer_size(core)
        if local == 0:
            raise RuntimeError("BufferPool requires a store configured with a local buffer")
        if max_bytes == 0:
            self._max_bytes = local if local > _SIZE_T_MAX - local else 2 * local
        else:
            self._max_bytes = max(max_bytes, local)
        self._min_size_class = min_size_class
        self._max_size_class = self._max_bytes if max_size_class is None else _obj_size_t(max_size_class)
        self._alignment = alignment
        self._block = block
        self._default_timeout = None if default_timeout is None else _obj_double(default_timeout)
        self._max_regions = None if max_regions is None else _obj_size_t(max_regions)
        prewarm = _obj_size_t(prewarm_size) if prewarm_size is not None and prewarm_count > 0 else None
        self._store = store
        self._core = core

        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._in_use: set[_Region] = set()
        self._total = 0
        self._reserved_bytes = 0
        self._reserved_regions = 0
        self._closing = False
        self._orphans: collections.deque[_Region] = collections.deque()

        try:
            arena = _LocalBuffer(local)
        except (OSError, ValueError, OverflowError, MemoryError) as e:
            raise RuntimeError(f"BufferPool cannot map a local buffer of {local} bytes: {e}") from None
        rc = core.register_buffer(arena.addr, arena.capacity)  # the store's own, as Mooncake's setup registers it
        if rc != 0:
            arena.mapping.close()
            raise RuntimeError(f"BufferPool cannot register its local buffer with the store (error {rc})")
        self._local: Optional[_LocalBuffer] = arena
        self._closed = False
        self._finalizer = weakref.finalize(self, _dispose_pool, store, core, arena, self._orphans)
        self._finalizer.atexit = False
        if prewarm is not None:
            self.prewarm(prewarm, prewarm_count)

    # ------------------------------------------------------------------------ public calls

    def acquire(self, size: int, block: Any = None, timeout: Any = None) -> BufferLease:
        """A lease of ``size`` bytes (``block``/``timeout`` default to the pool's ``block_on_exhaustion`` and
        ``default_timeout``). RuntimeError: "requested buffer size exceeds pool capacity" (more than
        ``max_bytes``), "buffer pool is exhausted" (not blocking), "timed out waiting for buffer", "timeout
        must be non-negative", "buffer pool is closed"/"closing", "overflow buffer registration failed"."""
        n = _uint(size, "size")
        should_block = self._block if block is None else _obj_bool(block)
        timeout_s = self._default_timeout if timeout is None else _obj_double(timeout)
        if timeout_s is not None and timeout_s < 0:
            raise RuntimeError("timeout must be non-negative")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        need = max(n, 1)
        if need > self._max_bytes:
            raise RuntimeError("requested buffer size exceeds pool capacity")
        self._enter()
        try:
            while True:
                self._drain_locked()
                self._raise_unless_open_locked()
                region = self._try_acquire_locked(need)
                if region is not None:
                    return BufferLease._new(self, region, n)
                if not should_block:
                    raise RuntimeError("buffer pool is exhausted")
                if deadline is None:
                    self._cond.wait(_WAIT_SLICE)
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise RuntimeError("timed out waiting for buffer")
                    self._cond.wait(min(left, _WAIT_SLICE))
        finally:
            self._leave()

    def buffer(self, size: int, block: Any = None, timeout: Any = None) -> BufferLease:
        """The same as ``acquire`` (the name reads well in ``with pool.buffer(n) as lease:``)."""
        return self.acquire(size, block, timeout)

    def prewarm(self, size: int, count: int) -> None:
        """None. As in Mooncake, nothing is allocated ahead: leases are sized exactly, on demand, and the
        local buffer already exists."""
        _uint(size, "size")
        _uint(count, "count")

    def close(self) -> None:
        """Closes the pool: unregisters and unmaps its local buffer; None (a second close does nothing).
        RuntimeError "cannot close buffer pool with active leases" while leases are out (the pool stays open).
        Acquires waiting meanwhile fail with "buffer pool is closed"."""
        self._enter()
        try:
            self._drain_locked()
            if self._closed:
                return
            self._closing = True
            while self._reserved_regions:
                self._cond.wait(_WAIT_SLICE)
            self._drain_locked()
            if self._in_use:
                self._closing = False
                self._cond.notify_all()
                raise RuntimeError("cannot close buffer pool with active leases")
            self._closed = True
            self._closing = False
            self._local = None  # the finaliser holds it until it unmaps it, below
            self._cond.notify_all()
        finally:
            self._leave()
        self._finalizer()

    # ------------------------------------------------------------------------------- internals

    def _enter(self) -> None:
        self._lock.acquire()

    def _leave(self) -> None:
        """Unlocks, first returning what the collector queued; then frees overflow memory outside the lock."""
        overflow = self._drain_locked()
        self._lock.release()
        _dispose_overflow(self._store, self._core, overflow)
        while self._orphans and self._lock.acquire(blocking=False):
            overflow = self._drain_locked()
            self._lock.release()
            _dispose_overflow(self._store, self._core, overflow)

    def _drain_locked(self) -> list[_Region]:
        """Returns the regions of collected leases to the pool; the overflow ones, to unmap after unlocking."""
        overflow: list[_Region] = []
        while self._orphans:
            region = self._orphans.popleft()
            if self._forget_locked(region):
                overflow.append(region)
        return overflow

    def _forget_locked(self, region: _Region) -> bool:
        """Takes a region out of use; True if it is an overflow region (to unregister and unmap)."""
        self._in_use.discard(region)
        self._total = max(0, self._total - region.size)
        if region.local is not None and self._local is not None:
            self._local.free(*region.local)
        self._cond.notify_all()
        return region.overflow is not None

    def _raise_unless_open_locked(self) -> None:
        if self._closed:
            raise RuntimeError("buffer pool is closed")
        if self._closing:
            raise RuntimeError("buffer pool is closing")

    def _has_capacity_locked(self, size: int) -> bool:
        if size > self._max_bytes or self._total + self._reserved_bytes + size > self._max_bytes:
            return False
        return self._max_regions is None or len(self._in_use) + self._reserved_regions < self._max_regions

    def _try_acquire_locked(self, size: int) -> Optional[_Region]:
        """A region of ``size`` bytes within the budget (the local buffer first, else an overflow mapping
        made and registered with the lock released), or None."""
        if not self._has_capacity_locked(size):
            return None
        block = self._local.alloc(size) if self._local is not None else None
        if block is not None:
            assert self._local is not None
            region = _Region(self._local.addr + block[0], size, block, None)
        else:
            self._reserved_bytes += size
            self._reserved_regions += 1
            mapping: Optional[_Mapping] = None
            self._lock.release()
            try:
                mapping = _mapping_or_none(size, self._alignment)
                if mapping is not None:
                    try:
                        rc = _rc(self._store.register_buffer(mapping.addr, size), "register_buffer")
                    except BaseException:
                        mapping.close()
                        raise
                    if rc != 0:
                        mapping.close()
                        raise RuntimeError("overflow buffer registration failed")
            finally:
                self._lock.acquire()
                self._reserved_bytes -= size
                self._reserved_regions -= 1
                self._cond.notify_all()
            if mapping is None:
                return None
            region = _Region(mapping.addr, size, None, mapping)
            if self._closing or self._closed:
                self._lock.release()
                try:
                    _dispose_overflow(self._store, self._core, [region])
                finally:
                    self._lock.acquire()
                raise RuntimeError("buffer pool is closing")
        self._in_use.add(region)
        self._total += size
        return region

    def _release(self, lease: BufferLease) -> None:
        region: Optional[_Region] = None
        self._enter()
        try:
            if lease._region is None:
                return
            if lease._views:
                raise RuntimeError("cannot release buffer while exported views exist")
            region, lease._region, lease._pool = lease._region, None, None
            overflow = self._forget_locked(region)
        finally:
            self._leave()
        if overflow:
            _unregister_overflow(self._store, region)

    def _release_collected(self, lease: BufferLease) -> None:
        """A lease being collected: its region goes back without blocking (queued if the lock is busy)."""
        region, lease._region, lease._pool = lease._region, None, None
        if region is None:
            return
        self._orphans.append(region)
        if self._lock.acquire(blocking=False):
            overflow = self._drain_locked()
            self._lock.release()
            _dispose_overflow(self._store, self._core, overflow)


def _unregister_overflow(store: Any, region: _Region) -> None:
    """Unregisters and unmaps an overflow region; RuntimeError if the store refuses (as Mooncake)."""
    try:
        rc = _rc(store.unregister_buffer(region.addr), "unregister_buffer")
    finally:
        if region.overflow is not None:
            region.overflow.close()
    if rc != 0:
        raise RuntimeError("overflow buffer unregistration failed")


def _dispose_overflow(store: Any, core: Any, regions: list[_Region]) -> None:
    """Overflow regions of collected leases: unregistered (when the store is still set up) and unmapped."""
    for region in regions:
        try:
            if _store_is_set_up(core):
                _unregister_overflow(store, region)
            elif region.overflow is not None:
                region.overflow.close()
        except Exception as e:  # noqa: BLE001 - a collected lease has no caller to tell
            log.warning("kvpool.mooncake BufferPool: releasing a collected lease: %s", e)


def _dispose_pool(store: Any, core: Any, local: _LocalBuffer, orphans: collections.deque[_Region]) -> None:
    """What closing (or collecting) a pool frees: queued overflow regions, then the local buffer."""
    pending = [r for r in orphans if r.overflow is not None]
    orphans.clear()
    _dispose_overflow(store, core, pending)
    if _store_is_set_up(core):
        try:
            rc = core.unregister_buffer(local.addr)
            if rc != 0:
                log.warning("kvpool.mooncake BufferPool: the store did not unregister the local buffer (%d)", rc)
        except Exception as e:  # noqa: BLE001 - closing frees the memory whatever the store says
            log.warning("kvpool.mooncake BufferPool: unregistering the local buffer: %s", e)
    local.mapping.close()


#: Mooncake's older names; the same classes.
RegisteredBufferPool = BufferPool
RegisteredBufferLease = BufferLease
RegisteredBufferLeaseView = BufferLeaseView
