"""The Python client on a pool of separate processes: replicas on two nodes, and a node that vanishes."""

from __future__ import annotations

import os

import pytest

import kvpool
from conftest import Cluster
from kvpool import PutStatus


@pytest.fixture(scope="module")
def cluster():  # type: ignore[no-untyped-def]
    c = Cluster(nodes=2)
    yield c
    c.stop()


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "tcp"])
def test_replicas_survive_a_killed_node(shm: bool) -> None:
    with Cluster(nodes=2) as cl, kvpool.Client(cl.master, shared_memory=shm, timeout=5, connect_timeout=1) as c:
        vals = {f"r/{i}": os.urandom(100_000 + i) for i in range(40)}
        assert c.put_batch(list(vals), list(vals.values()), replicas=2) == [PutStatus.OK] * 40
        single = os.urandom(5000)
        assert c.put("one-copy", single, replicas=1) is PutStatus.OK
        segs = {s.id: s for s in c.status().segments}
        assert len(segs) == 2 and all(s.objects >= 40 for s in segs.values())  # both nodes hold every replica
        cl.kill_node(0)
        # every replicated key is still read, from the surviving node, byte-identical, with no error raised
        assert c.get_batch(list(vals)) == list(vals.values())
        for k, v in vals.items():
            buf = bytearray(len(v))
            assert c.get_into(k, buf) == len(v) and buf == v
        # a key whose only copy may have been on the dead node is a value or a miss, never an exception
        got = c.get("one-copy")
        assert got in (single, None)
        # once the master drops the dead node, puts go to the survivor
        cl.wait_active(1)
        assert c.put("after", b"x" * 1000) is PutStatus.OK
        assert c.get("after") == b"x" * 1000


def test_a_pool_with_no_node_answers_no_segment(cluster: Cluster) -> None:
    with Cluster(nodes=1) as cl, kvpool.Client(cl.master, timeout=5, connect_timeout=1) as c:
        assert c.put("a", b"1") is PutStatus.OK
        cl.kill_node(0)
        cl.wait_active(0)
        assert c.put("b", b"2") is PutStatus.NO_SEGMENT
        assert c.put_batch(["c", "d"], [b"3", b"4"]) == [PutStatus.NO_SEGMENT] * 2
        assert c.get("a") is None


def test_segments_on_two_nodes_are_read_in_parallel(cluster: Cluster) -> None:
    with kvpool.Client(cluster.master) as c:
        c.remove_all(force=True)
        keys = [f"p/{i}" for i in range(64)]
        vals = [os.urandom(65536) for _ in keys]
        # half on each node (a batch under a write lease lands in that lease's one segment)
        names = [s.name for s in c.status().segments]
        assert c.put_batch(keys[:32], vals[:32], preferred_segment=names[0]) == [PutStatus.OK] * 32
        assert c.put_batch(keys[32:], vals[32:], preferred_segment=names[1]) == [PutStatus.OK] * 32
        holders = {s.name: s.objects for s in c.status().segments}
        assert all(n > 0 for n in holders.values()), holders
        assert c.get_batch(keys) == vals
