"""Copies and pins from Python (protocol version 7): what a put reports, what the master grants, what
eviction spares, and the master's repair seen through GET_REPLICA_LIST after a node is killed."""

from __future__ import annotations

import os
import time

import pytest

import kvpool
from conftest import Cluster, start_pool
from kvpool import PIN_FOREVER, PutResult, PutStatus

KIB = 1024
MIB = 1024 * KIB


@pytest.fixture(scope="module")
def small_pool():  # type: ignore[no-untyped-def]
    """One node of 64 MiB whose pins may hold 2% of it (about 1.3 MiB)."""
    p = start_pool(segment_size="64MiB", extra=["--max-pinned", "0.02"])
    yield p
    p.stop()


def copies_of(c: kvpool.Client, keys: list[str]) -> list[int]:
    """Memory copies the master lists per key, on distinct segments."""
    return [len({r.segment_id for r in w.replicas if r.tier == kvpool.protocol.TIER_MEMORY})
            for w in c._ch.lookup([k.encode() for k in keys], True)]


def test_a_put_reports_the_copies_it_wrote(small_pool) -> None:  # type: ignore[no-untyped-def]
    with kvpool.Client(small_pool.master) as c:
        c.remove_all(force=True)
        assert c.default_replicas == 1
        assert c.put_detailed("one", b"v") == PutResult(PutStatus.OK, 1, 1, False)
        two = c.put_detailed("two", b"v", replicas=2)  # one segment: one copy now, the master owes the other
        assert (two.status, two.copies, two.copies_wanted, two.under_replicated) == (PutStatus.OK, 1, 2, True)
        # a put that stored nothing wrote no copies
        assert c.put_detailed("one", b"w", replicas=2) == PutResult(PutStatus.ALREADY_EXISTS, 0, 2, False)
        assert c.upsert_detailed("one", b"w").copies == 1 and c.get("one") == b"w"
        batch = c.put_batch_detailed(["b1", "b2", "one"], [b"1", b"2", b"3"], replicas=3)
        assert [(r.status, r.copies, r.copies_wanted) for r in batch] == [
            (PutStatus.OK, 1, 3), (PutStatus.OK, 1, 3), (PutStatus.ALREADY_EXISTS, 0, 3)]
        with pytest.raises(ValueError, match="pin_seconds"):
            c.put("bad", b"v", pin_seconds=-2)
        assert not c.exists("bad")


def test_pins_are_granted_up_to_the_cap_and_spared_by_eviction(small_pool) -> None:  # type: ignore[no-untyped-def]
    with kvpool.Client(small_pool.master) as c:
        c.remove_all(force=True)
        pinned = {f"pin/{i}": os.urandom(256 * KIB) for i in range(4)}
        results = [c.put_detailed(k, v, pin_seconds=3600 if i % 2 else PIN_FOREVER)
                   for i, (k, v) in enumerate(pinned.items())]
        assert all(r.status is PutStatus.OK and r.pinned for r in results), results
        # 1 MiB pinned of a 1.3 MiB cap: another 512 KiB pin is refused, the object stored unpinned
        over = c.put_detailed("pin/over", os.urandom(512 * KIB), pin_seconds=3600)
        assert over.status is PutStatus.OK and not over.pinned
        assert c.put_detailed("plain", b"v").pinned is False
        # three times the pool's capacity of unpinned values: eviction takes those, never the pins
        filler = [f"fill/{i}" for i in range(192)]
        for i in range(0, len(filler), 16):
            c.put_batch(filler[i:i + 16], [os.urandom(MIB) for _ in range(16)])
        assert sum(c.batch_exists(filler)) < len(filler)  # eviction did run
        assert c.get_batch(list(pinned)) == list(pinned.values())


@pytest.fixture(scope="module")
def two_nodes():  # type: ignore[no-untyped-def]
    c = Cluster(nodes=2)
    yield c
    c.stop()


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "tcp"])
def test_copies_go_to_both_nodes(two_nodes: Cluster, shm: bool) -> None:
    with kvpool.Client(two_nodes.master, shared_memory=shm) as c:
        c.remove_all(force=True)
        v = os.urandom(10_000)
        assert c.put_detailed("r2", v, replicas=2) == PutResult(PutStatus.OK, 2, 2, False)
        # three asked for, two segments: two written, reported, and the value whole on both
        r3 = c.put_detailed("r3", v, replicas=3)
        assert (r3.copies, r3.copies_wanted, r3.under_replicated) == (2, 3, True)
        assert copies_of(c, ["r2", "r3"]) == [2, 2]
        assert c.get("r2") == v and c.get("r3") == v


def test_the_master_repairs_copies_lost_with_a_node() -> None:
    with Cluster(nodes=3) as cl, kvpool.Client(cl.master, timeout=5, connect_timeout=1) as c:
        vals = {f"rep/{i}": os.urandom(20_000 + i) for i in range(60)}
        results = c.put_batch_detailed(list(vals), list(vals.values()), replicas=2, preferred_segment="")
        assert all(r.copies == 2 for r in results), results
        assert copies_of(c, list(vals)) == [2] * len(vals)
        cl.kill_node(0)
        cl.wait_active(2)
        # the dead node's copies are gone from the lists; the repair makes them again on the other two
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and copies_of(c, list(vals)) != [2] * len(vals):
            time.sleep(0.2)
        assert copies_of(c, list(vals)) == [2] * len(vals)
        assert c.get_batch(list(vals)) == list(vals.values())
