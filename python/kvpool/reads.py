"""The read path of ``kvpool.Client`` (``get``, ``get_batch``, ``get_into``, ``get_into_batch``).

A read first looks for remembered locations (``kvpool.locations``) under the read lease, noting the cache's
snapshot before anything is looked up; the rest is asked of the master in one batch (and remembered, unless an
invalidation since the snapshot covers it). Then copies in rounds, local ones first
(``kvpool.ranged.read_copies``): from a mapped segment with the check-copy-check of ``kvpool.shm``, else
NODE_READ into the caller's memory. Copies from remembered locations are confirmed after (``Leasing.settle``);
the unconfirmed ones, and remembered locations that missed, are asked of the master once more.

One key with a remembered location takes a shorter way (``read_one``), the same steps for one object without
the batch bookkeeping: its cost is what a single small ``get_into`` pays on top of the copy or the node's
round trip, a few microseconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from . import protocol as p
from .buffers import Buffer, as_memoryview
from .protocol import ResultCode
from .ranged import read_copies, read_copy
from .results import MISS, TOO_SMALL

if TYPE_CHECKING:
    from .channels import Channels
    from .leased_puts import Leases
    from .locations import Locations

_EMPTY = memoryview(b"")


def view_of(buffer: Buffer, key: str, writable: bool) -> memoryview:
    """``buffer`` as a byte view (``writable`` for a read's buffer); the error names the key (as the value or the
    buffer for it), the name made only when there is an error to raise."""
    try:
        return as_memoryview(buffer, writable=writable)
    except (TypeError, ValueError):
        what = "buffer" if writable else "value"
        return as_memoryview(buffer, writable=writable, what=f"{what} for key {p.abbreviate(key)!r}")


def read_into(ch: Channels, leases: Leases, keys: Sequence[str], buffers: Sequence[Buffer], batch: bool,
              strict: bool) -> list[int]:
    """``get_into`` (``strict``: a buffer too small raises) and ``get_into_batch`` (it reads ``TOO_SMALL``)."""
    if len(keys) != len(buffers):
        raise ValueError(f"{len(keys)} keys but {len(buffers)} buffers")
    views = [view_of(b, k, True) for k, b in zip(keys, buffers)]
    if len(keys) == 1 and not batch:
        got = read_one(ch, leases, keys[0], views[0], strict)
        if got is not None:
            return [got]

    def dst(i: int, length: int) -> memoryview | None:
        if views[i].nbytes >= length:
            return views[i][:length]
        if strict:
            raise ValueError(f"buffer for key {p.abbreviate(keys[i])!r} has {views[i].nbytes} bytes; "
                             f"the value has {length}")
        return None

    return read(ch, leases, keys, dst, batch)


def read_one(ch: Channels, leases: Leases, key: str, view: memoryview, strict: bool) -> int | None:
    """``get_into`` of one key from its remembered location: the length read, or None when there is no such
    location, the lease does not run, or the copy missed or was not confirmed (the caller then reads the usual
    way, asking the master)."""
    if not ch.location_cache:
        return None
    leasing = leases.here()
    cache = leasing.reading()
    if cache is None:
        return None
    snapshot = cache.snapshot()
    k = p.encode_key(key)
    w = cache.get(k, ch.master.run)
    if w is None:
        return None
    n = w.value_length
    if view.nbytes < n:
        if strict:
            raise ValueError(f"buffer for key {p.abbreviate(key)!r} has {view.nbytes} bytes; the value has {n}")
        return None
    if read_copy(ch, w, view[:n] if view.nbytes != n else view) and leasing.read.valid() \
            and cache.confirm(k, snapshot):
        cache.touched(k)
        return n
    cache.invalidate([k])
    return None


def read(ch: Channels, leases: Leases, keys: Sequence[str], dst: Callable[[int, int], memoryview | None],
         batch: bool) -> list[int]:
    """Reads ``keys`` into the views ``dst(i, length)`` gives (None: the key's value does not fit, ``TOO_SMALL``);
    the length read per key, or ``MISS`` (see the module notes)."""
    kb = p.encode_keys_checked(keys)
    lengths = [MISS] * len(keys)
    if not kb:
        return lengths
    leasing = leases.here() if ch.location_cache else None
    cache = leasing.reading() if leasing is not None else None
    snapshot = cache.snapshot() if cache is not None else 0  # before anything is looked up
    where: list[p.ReplicaList | None] = [None] * len(kb)
    cached: list[int] = []
    if cache is not None:
        run = ch.master.run
        for i, k in enumerate(kb):
            w = where[i] = cache.get(k, run)
            if w is not None:
                cached.append(i)
    views: list[memoryview] = [_EMPTY] * len(keys)
    ask = [i for i, w in enumerate(where) if w is None]
    locate_and_read(ch, kb, ask, batch, where, dst, views, lengths, cache, snapshot, cached)
    if cached and leasing is not None:
        retry = leasing.settle(kb, cached, lengths, snapshot)
        if retry:
            locate_and_read(ch, kb, retry, True, where, dst, views, lengths, cache,
                            leasing.locations.snapshot(), [])
    return lengths


def locate_and_read(ch: Channels, kb: list[bytes], ask: list[int], batch: bool, where: list[p.ReplicaList | None],
                    dst: Callable[[int, int], memoryview | None], views: list[memoryview], lengths: list[int],
                    cache: Locations | None, snapshot: int, known: list[int]) -> None:
    """Asks the master where items ``ask`` are (remembering what it says in ``cache``, unless an invalidation
    since ``snapshot`` covers it), then reads those and the items ``known`` already located."""
    if ask:
        runs: list[int] = []
        got = ch.lookup([kb[i] for i in ask], batch, runs)
        for i, w, run in zip(ask, got, runs):
            where[i] = w
            if cache is not None and w.code == ResultCode.OK and w.replicas:
                cache.remember(kb[i], w, snapshot, run)
    items = []
    for i in sorted(known + ask) if known else ask:
        at = where[i]
        if at is not None and at.code == ResultCode.OK and at.replicas:
            d = dst(i, at.value_length)
            if d is None:
                lengths[i] = TOO_SMALL
            else:
                views[i] = d
                items.append(i)
    if items:
        read_copies(ch, where, None, views, lengths, items)
