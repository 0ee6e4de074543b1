"""Segment ids are per master run: an answer naming segments is used only in the run that gave it.

A new master (a restart, a failover) numbers the segments in the order their nodes register again, so
an id of the old run may name another node now. The client tags each master connection with the run
its HELLO met and its segment table with the run it came from (``Client.__init__``).
"""

from __future__ import annotations

import os

import kvpool
from conftest import Cluster, wait_until
from kvpool import PutStatus


def test_regions_from_an_old_masters_connection_are_not_written() -> None:
    with Cluster(nodes=2) as cl, kvpool.Client(cl.master, timeout=5, connect_timeout=1) as c:
        assert c.put("before", b"x" * 4096) is PutStatus.OK
        # the client meets a new master (as its HELLO on another connection would tell it), while its
        # pooled connections are still the old master's: what they answer is the old run's
        with c._ch.master.lock:
            c._ch.master.run += 1
            c._ch.segments._segments = {}
            c._ch.segments._table_run = c._ch.master.run
        written = c.counters["bytes_written_shm"] + c.counters["bytes_written_tcp"]
        assert c.put("stale", os.urandom(4096)) is PutStatus.FAILED
        assert c.counters["bytes_written_shm"] + c.counters["bytes_written_tcp"] == written, \
            "no byte went anywhere on an old run's regions"
        assert c._ch.segments.segments() == [], "a table answered in the old run is not taken"
        # a connection that greets the master now belongs to the run met last: puts go on
        for conn in c._ch.master.connections()._idle:
            conn.broken = True
        c._ch.master.connections()._idle.clear()
        c._ch.master.connections()._open = 0
        v = os.urandom(4096)
        assert c.put("after", v) is PutStatus.OK
        assert c.get("after") == v


def test_a_put_answered_by_a_restarted_master_on_its_retry_lands() -> None:
    with Cluster(nodes=1) as cl, kvpool.Client(cl.master, timeout=10, connect_timeout=1) as c:
        before = {f"before/{i}": os.urandom(8192 + i) for i in range(8)}
        assert c.put_batch(list(before), list(before.values())) == [PutStatus.OK] * 8
        cl.restart_master()

        def back() -> bool:
            try:
                with kvpool.Client(cl.master, timeout=5, connect_timeout=1) as probe:
                    return any(s.active and s.objects == 8 for s in probe.status().segments)
            except kvpool.KvPoolError:
                return False
        wait_until(back, "the node registered with the new master with its 8 objects", timeout=60, interval=0.1)
        # this client meets the new master only now, on the retry of this very put
        after = {f"after/{i}": os.urandom(8192 + i) for i in range(8)}
        assert c.put_batch(list(after), list(after.values())) == [PutStatus.OK] * 8
        assert c.get_batch(list(before)) == list(before.values())
        assert c.get_batch(list(after)) == list(after.values())
