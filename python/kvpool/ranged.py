"""Ranged reads and puts in parts (protocol version 11): what a layer-by-layer load and save are built on.

A pool object holds one KV block with its layers one after another, so layer ``l`` of a block is the byte
range ``[l * layer_bytes, (l + 1) * layer_bytes)`` of its value. A layerwise load locates a step's blocks
once (``locate``: one master round trip) and then, per layer, reads that range of every block
(``get_ranges_into``); a layerwise save reserves the blocks when the first layer is ready
(``begin_put``), writes each layer's range as it is computed, and makes the blocks visible after the last
(``PutInParts.finish``, in ``kvpool.parts``). Keys and values are the same as for whole puts and gets, so
either side may use either mode.

Reads move bytes as whole reads do: from a segment this process has mapped, a memory copy between two
checks of the object's header (``Mapping.read_range``); otherwise one NODE_READ_RANGE per node and payload
limit (striped over several connections when large: ``kvpool.tcp_reads``), the node pinning each object while
it sends the range. So a range is of the version located, or a
miss, never other bytes.

Misses. An item that misses is asked of the master once more: if the key still holds the same version
(generation), somewhere else now (moved to the SSD tier, another copy), it is read from there and the
``Located`` remembers the new place; another version, nothing, or a second miss makes it a miss for good,
so a node that cannot be reached costs one extra lookup per item, not one per layer.

``kvpool.Client``'s ``locate``, ``get_ranges_into`` and ``get_range_into`` are the functions here; its
``begin_put`` is ``kvpool.parts.PutInParts.begin``.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import TYPE_CHECKING, Sequence

from . import lanes
from . import protocol as p
from ._net import frame_end
from .buffers import Buffer, as_memoryview
from .errors import KvPoolError
from .protocol import Opcode, ResultCode, SegmentStats
from .results import MISS
from .tcp_reads import read_over_tcp

if TYPE_CHECKING:
    from .channels import Channels

log = logging.getLogger("kvpool")


class Located:
    """Where a batch of objects was when ``Client.locate`` looked them up: per key its value length (or
    ``MISS``), its version and its copies, for ``get_ranges_into`` to read ranges of, as often as needed.

    It names object versions: a read through it yields bytes of exactly the version located, or a miss. An
    object removed or replaced since is a miss, and so is one whose node cannot be reached; once a read
    found an item gone, ``value_length(i)`` is ``MISS``. Thread-safe.
    """

    def __init__(self, keys: Sequence[str], where: list[p.ReplicaList | None]) -> None:
        self.keys = list(keys)
        self._where = where
        self._rechecked = [False] * len(where)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.keys)

    def value_length(self, i: int) -> int:
        """Item ``i``'s value length, or ``MISS`` if it was missing when located or found gone since."""
        w = self._where[i]
        return w.value_length if _present(w) and w is not None else MISS

    @property
    def value_lengths(self) -> list[int]:
        return [self.value_length(i) for i in range(len(self.keys))]

    def pick(self, items: Sequence[int]) -> Located:
        """A ``Located`` whose item ``m`` is this one's item ``items[m]`` (repeats allowed), without asking the
        master: one ``get_ranges_into`` then reads several ranges of one object."""
        where = self._snapshot()
        return Located([self.keys[i] for i in items], [where[i] for i in items])

    def _snapshot(self) -> list[p.ReplicaList | None]:
        with self._lock:
            return list(self._where)

    def _recheck(self, i: int) -> bool:
        with self._lock:
            if self._rechecked[i]:
                return False
            self._rechecked[i] = True
            return True

    def _relocated(self, i: int, now: p.ReplicaList) -> bool:
        """The master's answer after a miss: the same version elsewhere replaces the location (True);
        anything else makes the item a miss for good."""
        with self._lock:
            was = self._where[i]
            same = (_present(now) and was is not None and _present(was) and now.generation == was.generation
                    and now.value_length == was.value_length)
            self._where[i] = now if same else None
            return same

    def _gone(self, i: int) -> None:
        with self._lock:
            self._where[i] = None

    def __repr__(self) -> str:
        return f"Located({len(self.keys)} keys, {sum(1 for w in self._where if _present(w))} present)"


def _present(w: p.ReplicaList | None) -> bool:
    return w is not None and w.code == ResultCode.OK and bool(w.replicas)


def locate(ch: Channels, keys: Sequence[str]) -> Located:
    """``Client.locate``: ``keys`` looked up once (one master round trip per 16,384 keys)."""
    kb = p.encode_keys_checked(keys)
    where: list[p.ReplicaList | None] = list(ch.lookup(kb, True)) if kb else []
    return Located(keys, where)


def get_ranges_into(ch: Channels, located: Located, offsets: Sequence[int], buffers: Sequence[Buffer]) -> list[int]:
    """``Client.get_ranges_into``: for each located object ``i``, ``len(buffers[i])`` bytes from ``offsets[i]`` of
    its value into ``buffers[i]``; the bytes read per object, or ``MISS``."""
    n = len(located)
    if len(offsets) != n or len(buffers) != n:
        raise ValueError(f"{n} located objects but {len(offsets)} range offsets and {len(buffers)} buffers")
    views = [as_memoryview(b, writable=True, what=f"buffer for key {p.abbreviate(k)!r}")
             for k, b in zip(located.keys, buffers)]
    where = located._snapshot()
    got = [MISS] * n
    items: list[int] = []
    for i, w in enumerate(where):
        if w is None or not _present(w):
            continue
        off, size = offsets[i], views[i].nbytes
        if off < 0 or off > w.value_length - size:
            raise ValueError(f"range [{off}, {off} + {size}) of key {p.abbreviate(located.keys[i])!r} is outside "
                             f"its value of {w.value_length} bytes")
        items.append(i)
    if items:
        read_copies(ch, where, offsets, views, got, items)
    recheck = []
    for i in items:
        if got[i] == MISS:
            if located._recheck(i):
                recheck.append(i)
            else:
                located._gone(i)
    if recheck:
        now = ch.lookup([p.encode_key(located.keys[i]) for i in recheck], True)
        again = [i for i, w in zip(recheck, now) if located._relocated(i, w)]
        if again:
            where = located._snapshot()
            read_copies(ch, where, offsets, views, got, again)
            for i in again:
                if got[i] == MISS:
                    located._gone(i)
    return got


def read_copies(ch: Channels, where: list[p.ReplicaList | None], offsets: Sequence[int] | None,
                views: list[memoryview], got: list[int], items: list[int]) -> None:
    """Reads ``views[i].nbytes`` bytes from ``offsets[i]`` of each item's value into ``views[i]`` (with
    ``offsets`` None, whole values: ``Client.get``), trying the copies in rounds, local ones first: round 0
    reads every item from its first copy, one request per segment in parallel; round 1 retries the misses
    from their second copy, and so on. Sets ``got[i]`` to the bytes read for each hit."""
    order: dict[int, tuple[p.Replica, ...]] = {}
    for i in items:
        w = where[i]
        assert w is not None
        order[i] = ch.segments.local_first(w.replicas)
    for attempt in range(max(len(o) for o in order.values())):
        by_segment: dict[int, list[tuple[int, p.Replica]]] = {}
        for i, o in order.items():
            if got[i] == MISS and attempt < len(o):
                by_segment.setdefault(o[attempt].segment_id, []).append((i, o[attempt]))
        if not by_segment:
            break
        ch.run_tasks([functools.partial(_read_segment, ch, sid, slots, where, offsets, views, got)
                      for sid, slots in by_segment.items()])


def read_copy(ch: Channels, w: p.ReplicaList, view: memoryview) -> bool:
    """Reads one whole object, ``view.nbytes`` (its value length) bytes, into ``view``, trying its copies in turn,
    local ones first: what ``read_copies`` does for one item, without the batch's bookkeeping (a single small
    ``get_into`` pays for little else)."""
    reps = ch.segments.local_first(w.replicas) if len(w.replicas) > 1 else w.replicas
    got = [MISS]
    for rep in reps:
        seg = ch.segments.segment(rep.segment_id)
        if seg is None:
            continue
        if rep.tier == p.TIER_MEMORY:
            mapping = ch.segments.shm.mapping(seg)
            if mapping is not None:
                if mapping.read_range(rep.offset, w.generation, w.value_length, 0, view):
                    ch.count("bytes_read_shm", view.nbytes)
                    return True
                ch.count("shm_read_retries", 1)
        read_over_tcp(ch, seg, [(0, rep, w)], None, [view], got)
        if got[0] != MISS:
            return True
    return False


def _read_segment(ch: Channels, sid: int, slots: list[tuple[int, p.Replica]], where: list[p.ReplicaList | None],
                  offsets: Sequence[int] | None, views: list[memoryview], got: list[int]) -> None:
    """One round's reads from one segment: copies out of its mapping where this process has one (a copy
    that the object changed under goes over TCP, where the node pins it), NODE_READ or NODE_READ_RANGE for
    the rest."""
    seg = ch.segments.segment(sid)
    if seg is None:
        return
    mapping = ch.segments.shm.mapping(seg)
    tcp: list[tuple[int, p.Replica, p.ReplicaList]] = []
    shm_bytes = retries = 0
    local: list[tuple[int, p.Replica, p.ReplicaList]] = []
    for i, rep in slots:
        w = where[i]
        assert w is not None
        if rep.tier == p.TIER_MEMORY and mapping is not None:
            local.append((i, rep, w))
        else:
            tcp.append((i, rep, w))  # another host, or the disk tier: the node reads it
    if local:
        assert mapping is not None
        copied = lanes.copy_out(mapping, [(rep.offset, w.generation, w.value_length, offsets[i] if offsets else 0,
                                           views[i]) for i, rep, w in local], ch.copy_lanes)
        for (i, rep, w), ok in zip(local, copied):
            if ok:
                got[i] = views[i].nbytes
                shm_bytes += got[i]
            else:
                retries += 1
                tcp.append((i, rep, w))  # changed under the copy: the node pins it
    if shm_bytes:
        ch.count("bytes_read_shm", shm_bytes)
    if retries:
        ch.count("shm_read_retries", retries)
    if tcp:
        read_over_tcp(ch, seg, tcp, offsets, views, got)
