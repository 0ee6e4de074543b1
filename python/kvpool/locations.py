"""Where recently read objects live, so a repeated read goes straight to the node or the shared segment
without asking the master first; the Java client's ``LocationCache`` (docs/architecture.md, "Read leases").

What the bytes' own checks cannot do
------------------------------------
Every read names the generation it expects and is checked where the bytes are: a node reads only a complete
region of that generation, and a same-machine copy is checked against the object's header before and after.
So a remembered location yields exactly the version it names, or a miss. But a removal makes a node mark the
old object dead only if the node is alive: a frozen or killed node's shared segment still holds intact
headers, and a copy out of it would serve an object the pool has removed (a weight update's old KV).

The rule (the same four as the Java client's)
---------------------------------------------
1. A remembered location is used only while this process holds its read lease (``kvpool.read_lease``), as
   granted by the master run the client talks to now; entries also carry the master run they were learned in
   and are never used in another (segment ids are per run).
2. Every removal, reset and upsert reaches the client as an invalidation, which ``apply`` applies (matching
   entries leave) before the lease it came with is counted, and before the client acknowledges it. The master
   completes the removal only once this client acknowledged it or its lease ran out.
3. A read notes ``snapshot()`` (a count of applied invalidations) before it looks anything up. After copying
   from a remembered location it calls ``confirm``: the lease must still run and no invalidation applied since
   the snapshot may cover the key; a failed confirmation makes the copy a miss, and the key is asked of the
   master once more.
4. A location the master gave is remembered (``remember``) only if no invalidation applied since the read's
   snapshot covers it, so an answer that raced a removal never enters the cache.

Hence: once a removal returned, either this client applied it (the entry is gone, and a copy in flight fails
its confirmation) or its lease has run out (every confirmation fails until a renewal brings the removal).
Everything is dropped when the lease is given up, on a resync or a gap in the invalidations, and when the
client meets a new master run (a restart, a failover).

Not covered, as in Java: eviction and node loss are not invalidations. An object evicted from a frozen or dead
node may still be read, byte-exact, from a remembered location until the entry is refreshed: reads served from
the cache are reported to the master every ``REPORT_INTERVAL`` (a batched GET_REPLICA_LIST, by the read lease's
thread), which keeps its LRU right and refreshes or drops their entries.

Bounded (least recently used entries leave first) and thread-safe: one lock guards the map and the recent
invalidations; ``snapshot`` and the fast path of ``confirm`` read one int; the reads to report are a dict
written without the lock (a note racing a report may go unreported, nothing worse).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import NamedTuple

from . import protocol as p

#: Locations a client remembers by default (``Client(location_cache=...)``; 0 turns the cache off).
DEFAULT_ENTRIES = 65_536
#: Applied invalidations kept to check reads in flight against; an older snapshot fails confirmation.
MAX_RECENT = 1024
#: Most reads remembered for the next report to the master; beyond this they are not reported.
MAX_TOUCHED = 1 << 16
#: Seconds between reports of the reads served from the cache.
REPORT_INTERVAL = 2.0


class _Applied(NamedTuple):
    """One applied invalidation, numbered locally: ``keys`` for KEYS, ``prefix`` for PREFIX."""

    local: int
    keys: frozenset[bytes] | None
    prefix: bytes | None

    def covers(self, key: bytes) -> bool:
        if self.keys is not None:
            return key in self.keys
        return self.prefix is not None and key.startswith(self.prefix)


class Locations:
    """Remembered replica lists by encoded key, each with the master run it was learned in."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"location_cache must be 0 (off) or more entries, got {capacity}")
        self.capacity = capacity
        self._lock = threading.Lock()
        self._map: OrderedDict[bytes, tuple[p.ReplicaList, int]] = OrderedDict()
        self._recent: deque[_Applied] = deque()
        self._floor = 0  # ``_recent`` holds every invalidation numbered above this
        self._applied = 0  # invalidations applied so far (local numbering, whole drops included)
        self._touched: dict[bytes, None] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._map)

    # ----------------------------------------------------------------------------- invalidations

    def snapshot(self) -> int:
        """The count of applied invalidations: take it before looking anything up for a read."""
        return self._applied

    def confirm(self, key: bytes, snapshot: int) -> bool:
        """After a copy from a remembered location (the caller checked the lease runs, after the copy): true if no
        invalidation applied since ``snapshot`` covers ``key``."""
        if self._applied == snapshot:
            return True
        with self._lock:
            return not self._covered_since(key, snapshot)

    def apply(self, rec: p.Invalidation) -> None:
        """Applies one invalidation of keys or a prefix (the read lease applies ALL, gaps and resyncs as
        ``drop_all``), recording it for reads in flight."""
        with self._lock:
            if rec.kind == p.INVALIDATE_KEYS:
                keys = frozenset(rec.keys)
                for k in keys:
                    self._map.pop(k, None)
                self._record(_Applied(self._applied + 1, keys, None))
            elif rec.kind == p.INVALIDATE_PREFIX:
                a = _Applied(self._applied + 1, None, rec.prefix)
                for k in [k for k in self._map if a.covers(k)]:
                    del self._map[k]
                self._record(a)
            else:
                self._drop_all_locked()

    def drop_all(self) -> None:
        """Forgets everything, and fails the confirmation of every read in flight."""
        with self._lock:
            self._drop_all_locked()

    def _drop_all_locked(self) -> None:
        self._map.clear()
        self._touched.clear()
        self._recent.clear()
        self._floor = self._applied + 1
        self._applied = self._floor  # last: a reader seeing it sees the cleared map

    def _record(self, a: _Applied) -> None:
        self._recent.append(a)
        while len(self._recent) > MAX_RECENT:
            self._floor = self._recent.popleft().local
        self._applied = a.local  # last

    def _covered_since(self, key: bytes, snapshot: int) -> bool:
        """True if an invalidation applied after ``snapshot`` covers ``key``, or if that cannot be told."""
        if snapshot < self._floor:
            return True
        for a in reversed(self._recent):
            if a.local <= snapshot:
                break
            if a.covers(key):
                return True
        return False

    # --------------------------------------------------------------------------------- locations

    def get(self, key: bytes, run: int) -> p.ReplicaList | None:
        """The remembered location of ``key`` learned in master run ``run``, or None. Use it only under the read
        lease, and confirm after."""
        with self._lock:
            e = self._map.get(key)
            if e is None:
                return None
            if e[1] != run:
                del self._map[key]
                return None
            self._map.move_to_end(key)
            return e[0]

    def remember(self, key: bytes, where: p.ReplicaList, snapshot: int, run: int) -> None:
        """Remembers where master run ``run`` said ``key`` is, unless an invalidation applied since ``snapshot``
        (taken before the master was asked) covers it."""
        if not self.capacity:
            return
        with self._lock:
            if self._covered_since(key, snapshot):
                return
            self._map[key] = (where, run)
            self._map.move_to_end(key)
            while len(self._map) > self.capacity:
                self._map.popitem(last=False)

    def invalidate(self, keys: list[bytes]) -> None:
        with self._lock:
            for k in keys:
                self._map.pop(k, None)

    def invalidate_prefix(self, prefix: bytes) -> None:
        with self._lock:
            for k in [k for k in self._map if k.startswith(prefix)]:
                del self._map[k]

    # ------------------------------------------------------------------------------------ reports

    def touched(self, key: bytes) -> None:
        """Notes a read served from the cache, for the next report to the master (no lock: one dict store, and a
        note lost to a racing report only leaves that read unreported)."""
        if len(self._touched) < MAX_TOUCHED:
            self._touched[key] = None

    def drain_touched(self, most: int) -> list[bytes]:
        """Takes up to ``most`` keys read from the cache since the last report."""
        out = list(self._touched)[:most]  # one C call, atomic under the GIL
        for k in out:
            self._touched.pop(k, None)
        return out
