"""Copy and checksum lanes: the same-machine path's bytes moved by a few threads at once (puts: ``copy_in``;
reads: ``copy_out``).

Why
---
A memoryview slice assignment into a mapped segment copies while holding the GIL: one core, about 4 GB/s,
and the checksum (ISA-L) waits behind it. ``ctypes.memmove``, ``madvise`` called through ctypes and ISA-L's
``crc32_iscsi`` are foreign calls, which run without the GIL, so a few threads copy, prefault and checksum
really in parallel, as the Java client's lanes do (``NodeWrites.MAX_LANES``).

How
---
A call's values are cut into at most ``lanes`` parts of contiguous values of about equal bytes (a value is
never split, so each part touches its own stretch of the segment and its own prefault windows). The
caller's thread runs the first part and a pool of ``MAX_LANES - 1`` threads of this process the others
(made at first use, and made again in a forked child, which never uses its parent's threads). Each value in
a part: prefault its windows of the segment (``Mapping.prefault``), checksum the caller's bytes (unless the
checksum is known from an earlier pass), copy them. The call returns only once every part has ended, even
when one failed: the addresses the lanes use (the caller's buffers, pinned by ``kvpool.buffers.Pins``, and
the mapping's, pinned by ``Mapping.pin``) stay valid until then.

Puts under a write lease over TCP use the same runs (``kvpool.leased_puts``): each lane checksums its share and
sends it on a pooled connection of its own. Reads (``copy_out``) are cut the same way; each lane does the check-copy-check of ``Mapping.read_range`` for
its objects, the copy a ``memmove`` into the caller's buffer, and a copy the object changed under does not stand.

Below ``MIN_PARALLEL_BYTES`` in a call everything runs in the caller's thread, with slice copies (handing a part
to a thread costs tens of microseconds, and pinning buffers for foreign calls a microsecond a value, more than a
few small copies take); with one lane, in the caller's thread with foreign calls.

Safety: a destination range outside the mapping is refused (ValueError) before any byte moves; a memmove
past the mapping would not raise, it would crash the process.
"""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Callable, Sequence

from ._net import pid
from .buffers import Filler, Pins
from .crc import crc32c, crc32c_at
from .shm import POPULATE_WINDOW, Mapping

#: Most threads (the caller's included) one call's copies are spread over.
MAX_LANES = 4
#: A call moving fewer bytes than this copies in the caller's thread alone.
MIN_PARALLEL_BYTES = 4 << 20
#: Smallest part given to a lane.
MIN_PART_BYTES = 1 << 20
#: Smallest mean item a call spreads over lanes. Each item's copy is a foreign call that lets go of the GIL and
#: takes it back: with items of 64 KiB (a layer of a 2 MiB block) the lanes spent more on passing the lock than
#: they saved, 60 to 70 ms for 512 MiB of ranged reads on 2 lanes against 37 ms on one (2 cores), and 151 ms
#: against a whole-object read's 40 ms on 4 lanes of a 16-core GPU machine. Even at 256 KiB, ahead from 512 KiB.
MIN_LANE_ITEM_BYTES = 256 << 10

_memmove = ctypes.memmove  # a foreign call: the GIL is released while it copies


def default_lanes() -> int:
    """Lanes a client copies with by default: ``MAX_LANES``, at most the cores this process may run on."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(MAX_LANES, cores))


_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_pid = 0


def _executor() -> ThreadPoolExecutor:
    global _pool, _pool_pid
    with _lock:
        if _pool is None or _pool_pid != pid():
            _pool = ThreadPoolExecutor(max_workers=MAX_LANES - 1, thread_name_prefix="kvpool-lane")
            _pool_pid = pid()
        return _pool


def parts(sizes: Sequence[int], lanes: int) -> list[tuple[int, int]]:
    """[lo, hi) runs of consecutive items covering them all, at most ``lanes`` of them (one below
    ``MIN_PARALLEL_BYTES`` in all or ``MIN_LANE_ITEM_BYTES`` an item, none smaller than about ``MIN_PART_BYTES``),
    of about equal total size."""
    n = len(sizes)
    total = sum(sizes)
    spread = total >= MIN_PARALLEL_BYTES and total >= n * MIN_LANE_ITEM_BYTES
    k = min(lanes, n, total // MIN_PART_BYTES) if spread else 1
    out: list[tuple[int, int]] = []
    lo = acc = 0
    for i, size in enumerate(sizes):
        acc += size
        # close a run once it holds its share, leaving an item at least for each run still to come
        if len(out) < k - 1 and acc * k >= total * (len(out) + 1) and n - i - 1 >= k - 1 - len(out):
            out.append((lo, i + 1))
            lo = i + 1
    out.append((lo, n))
    return out


def run_parts(runs: list[tuple[int, int]], fn: Callable[[int, int], None]) -> None:
    """Runs ``fn(lo, hi)`` for every run, the first in this thread and the rest in the lanes; returns once all
    ended, raising the first failure."""
    if len(runs) == 1:
        fn(*runs[0])
        return
    ex = _executor()
    futures: list[Future[None]] = [ex.submit(fn, lo, hi) for lo, hi in runs[1:]]
    first: BaseException | None = None
    try:
        fn(*runs[0])
    except BaseException as e:  # noqa: BLE001 - raised below, once the lanes are done with the addresses
        first = e
    wait(futures)
    for f in futures:
        failed = f.exception()
        if failed is not None and first is None:
            first = failed
    if first is not None:
        raise first


def prefault_ahead(mapping: Mapping, start: int, end: int) -> None:
    """Starts prefaulting the windows of [start, end) of the mapping in the lanes and returns at once: a put
    calls it as soon as it knows where its bytes go, so the page tables are filled while it waits for the node
    to admit the range (the pages' contents are not touched). A copy that reaches a window being prefaulted
    waits for it (``Mapping.prefault``)."""
    if end <= start or not mapping.prefaulting():
        return
    w = POPULATE_WINDOW
    todo = [(lo, min(lo + w, end)) for lo in range(start - start % w, end, w) if not mapping.prefaulted(lo)]
    if todo:
        ex = _executor()
        for lo, hi in todo:
            ex.submit(mapping.prefault, max(lo, start), hi)


def copy_in(mapping: Mapping, dests: Sequence[int], values: Sequence[memoryview], crcs: list[int | None],
            lanes: int) -> None:
    """Copies ``values[i]`` to offset ``dests[i]`` of the mapping and fills in ``crcs[i]`` (the CRC32C of the
    value) where it is None, in up to ``lanes`` threads. Raises ValueError if the mapping is read-only or closed,
    or a destination lies outside it (nothing copied then)."""
    for at, v in zip(dests, values):
        if at < 0 or at + v.nbytes > mapping.size:
            raise ValueError(f"a copy of {v.nbytes} bytes to offset {at} lies outside the {mapping.size}-byte segment")
    base = mapping.pin()
    if base is None:
        raise ValueError("the segment is not mapped for writing here (read-only, or closed)")
    fills = [i for i, v in enumerate(values) if isinstance(v, Filler)]
    if fills:  # values that write themselves into the segment (a device's DMA), checksummed where they land
        address, view = ctypes.addressof(base), mapping.view
        for i in fills:
            at, n = dests[i], values[i].nbytes
            mapping.prefault(at, at + n)
            filler: Any = values[i]
            filler.fill(address + at, mapping)
            crcs[i] = crc32c(view[at:at + n]) if n else 0
        filled = set(fills)
        keep = [i for i in range(len(values)) if i not in filled]
        if not keep:
            del base
            return
        sub = [crcs[i] for i in keep]
        copy_in(mapping, [dests[i] for i in keep], [values[i] for i in keep], sub, lanes)
        for i, c in zip(keep, sub):
            crcs[i] = c
        del base
        return
    sizes = [v.nbytes for v in values]
    if sum(sizes) < MIN_PARALLEL_BYTES:  # in this thread; slice copies cost less than pinning for foreign calls
        view = mapping.view
        # a value's checksum is taken where it landed, at the segment's own (pinned) address: no buffer of the
        # caller's to pin per value, which cost more than the checksum of a small one
        crc_at, address = crc32c_at, ctypes.addressof(base)
        for i, (at, v) in enumerate(zip(dests, values)):
            mapping.prefault(at, at + sizes[i])
            view[at:at + sizes[i]] = v
            if crcs[i] is None:
                crcs[i] = crc_at(address + at, sizes[i]) if crc_at is not None and sizes[i] else crc32c(v)
        del base
        return
    address = ctypes.addressof(base)
    crc_at = crc32c_at
    with Pins() as pins:
        srcs = [pins.address(v) for v in values]

        def run(lo: int, hi: int) -> None:
            for i in range(lo, hi):
                n = values[i].nbytes
                if not n:
                    crcs[i] = 0 if crcs[i] is None else crcs[i]
                    continue
                at = dests[i]
                mapping.prefault(at, at + n)
                if crcs[i] is None:
                    crcs[i] = crc_at(srcs[i], n) if crc_at is not None else crc32c(values[i])
                _memmove(address + at, srcs[i], n)

        run_parts(parts(sizes, lanes), run)
    del base


def copy_out(mapping: Mapping, reads: Sequence[tuple[int, int, int, int, memoryview]], lanes: int) -> list[bool]:
    """Same-machine reads: for each ``(offset, generation, value length, range offset, dst)``, the check-copy-check
    of ``Mapping.read_range`` with the copy a ``memmove`` without the GIL, spread over up to ``lanes`` threads;
    True per read that stands. Below ``MIN_PARALLEL_BYTES`` in all, or on a mapping without an address (read-only,
    closed), the checks copy with slices in this thread."""
    sizes = [r[4].nbytes for r in reads]
    base = mapping.pin()
    ok = [False] * len(reads)
    if base is None or lanes < 2 or sum(sizes) < MIN_PARALLEL_BYTES:
        for j, (off, gen, length, at, dst) in enumerate(reads):
            ok[j] = mapping.read_range(off, gen, length, at, dst)
        return ok
    address = ctypes.addressof(base)
    with Pins() as pins:
        dsts = [pins.address(r[4]) for r in reads]

        def run(lo: int, hi: int) -> None:
            for j in range(lo, hi):
                off, gen, length, at, dst = reads[j]
                ok[j] = mapping.read_range(off, gen, length, at, dst, _copy_to(dsts[j], address))

        run_parts(parts(sizes, lanes), run)
    del base
    return ok


def _copy_to(dst: int, address: int) -> Callable[[int, memoryview], None]:
    """A copy from offset ``at`` of the mapping at ``address`` to ``dst``, of ``view.nbytes`` bytes."""
    def copy(at: int, view: memoryview) -> None:
        _memmove(dst, address + at, view.nbytes)
    return copy
