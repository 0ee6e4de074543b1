"""Where the pool's segments are (the Java ``SegmentDirectory``): the master's segment table, tagged with the
master run it came from, a connection pool per node, and this process's mappings of the segments on its machine
(``kvpool.shm``).

A segment id means something only in the master run that named it (``kvpool.master_channel``): ``segment(sid,
run)`` answers from a table of that run or not at all, so a region of an old master is never resolved in a new
table, where it would send bytes to another node. The table is dropped when a HELLO meets a new run.
"""

from __future__ import annotations

import threading
import time

from . import protocol as p
from ._net import ConnectionPool
from .errors import KvPoolError
from .master_channel import MasterChannel
from .protocol import Opcode, PoolStats, SegmentStats
from .shm import SharedSegments

#: Oldest segment table used to pick a local segment for placement (as the Java client).
LOCAL_TABLE_AGE = 10.0


class SegmentDirectory:
    """The segment table of ``master``'s current run, the node connection pools and the local mappings."""

    def __init__(self, master: MasterChannel, *, shared_memory: bool) -> None:
        self._master = master
        self._segments: dict[int, SegmentStats] = {}
        self._table_run = 0
        self._table_at = 0.0
        self._nodes: dict[tuple[str, int], ConnectionPool] = {}
        self._nodes_lock = threading.Lock()
        #: This process's mappings of the segments on its machine (None of them with ``shared_memory=False``).
        self.shm = SharedSegments(shared_memory)
        master.on_new_run(self._drop_table)

    def _drop_table(self) -> None:
        # under the master channel's lock, with the new run
        self._segments = {}
        self._table_run = self._master.run
        self._table_at = 0.0

    def refresh(self) -> PoolStats:
        """Asks the master for the cluster's state (CLUSTER_STATS) and takes its segment table (unless a newer
        master answered meanwhile: then it asks once more, the answer was the old master's)."""
        for attempt in (0, 1):
            stats, run = self._master.call_in_run(Opcode.CLUSTER_STATS, b"", p.decode_cluster_stats)
            with self._master.lock:
                if run == self._master.run:
                    self._segments = {s.id: s for s in stats.segments}
                    self._table_run = run
                    self._table_at = time.monotonic()
                    self._master.epoch = stats.epoch
                    break
        self.shm.retain({s.shm_path for s in self._segments.values() if s.shm_path})
        return stats

    def segment(self, sid: int, run: int | None = None) -> SegmentStats | None:
        """The segment with this id, refreshing the table once if it is unknown. Given the master ``run`` an
        answer came in, None unless the table held is that run's (see the module notes)."""
        for attempt in (0, 1):
            if run is not None and (run != self._master.run or self._table_run != run):
                if attempt or run != self._master.run:
                    return None
            else:
                seg = self._segments.get(sid)
                if seg is not None or attempt:
                    return seg
            try:
                self.refresh()
            except KvPoolError:
                return None
        return None

    def segments(self) -> list[SegmentStats]:
        """The segments of the table held now."""
        return list(self._segments.values())

    def local_first(self, replicas: tuple[p.Replica, ...]) -> tuple[p.Replica, ...]:
        """``replicas`` with those on this machine's mapped segments first."""
        if len(replicas) < 2:
            return replicas
        local = tuple(r for r in replicas if (s := self._segments.get(r.segment_id)) is not None
                      and self.shm.is_local(s.host))
        return local + tuple(r for r in replicas if r not in local)

    def preferred(self, preferred: str | None) -> str:
        """The segment a put asks for first: ``preferred`` if given, else one this process has mapped ("": none)."""
        if preferred is not None:
            return preferred
        if not self.shm.enabled:
            return ""
        if time.monotonic() - self._table_at > LOCAL_TABLE_AGE:
            try:
                self.refresh()
            except KvPoolError:
                return ""
        for s in self._segments.values():
            if s.active and s.shm_path and self.shm.mapping(s) is not None:
                return s.name
        return ""

    def node_pool(self, seg: SegmentStats) -> ConnectionPool:
        """The connections to ``seg``'s node."""
        key = (seg.host, seg.port)
        pool = self._nodes.get(key)
        if pool is None:
            with self._nodes_lock:
                pool = self._nodes.get(key)
                if pool is None:
                    m = self._master
                    pool = self._nodes[key] = ConnectionPool(seg.host, seg.port, max_connections=m.max_connections,
                                                             connect_timeout=m.connect_timeout,
                                                             secrets=m.secrets, tls=m.tls, busy_poll=m.busy_poll)
        return pool

    def close(self) -> None:
        with self._nodes_lock:
            pools = list(self._nodes.values())
        for pool in pools:
            pool.close()
        self.shm.close()
