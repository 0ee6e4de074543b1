"""Remembered locations under the read lease (``kvpool.locations``; docs/architecture.md, "Read leases").

* A repeated read of a key goes straight to its copy: no master exchange (shared memory), one NODE_READ (TCP).
* What another client, Python or Java, removes (by key, by prefix, everything) or replaces (upsert) is never
  read from a remembered location afterwards, even from a frozen node's segment, whose headers still say
  the old objects are complete.
* A copy that raced a removal fails its confirmation and the key is asked of the master again.
* A master restart drops everything remembered, and nothing removed through the new master is read.
* The bookkeeping itself: snapshots, confirmations, answers that raced an invalidation, the history's floor.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from typing import Any

import pytest

import kvpool
from conftest import JAR, Cluster, Pool, find_java, opcodes_of, wait_until
from kvpool import PutStatus, read_lease, reads, write_leases
from kvpool import protocol as p
from kvpool._net import Connection
from kvpool.locations import MAX_RECENT, Locations
from kvpool.protocol import Opcode


@pytest.fixture
def reader(either: kvpool.Client) -> kvpool.Client:
    """The conftest's ``either``: a client on the same-machine path, then one on TCP; the pool emptied first."""
    return either


def test_a_repeated_read_goes_straight_to_the_copy(pool: Pool, reader: kvpool.Client,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    v = os.urandom(4096)
    assert reader.put("k", v) is PutStatus.OK
    buf = bytearray(8192)
    assert Opcode.GET_REPLICA_LIST in opcodes_of(lambda: reader.get_into("k", buf), monkeypatch)
    node = [] if reader._ch.segments.shm.enabled else [Opcode.NODE_READ]
    for _ in range(3):
        assert opcodes_of(lambda: reader.get_into("k", buf), monkeypatch) == node
        assert buf[:4096] == v
    assert opcodes_of(lambda: reader.get_batch(["k"]), monkeypatch) == node
    # a key not remembered yet is asked for alone, with the rest of its batch read from where it is remembered
    assert reader.put("k2", b"two") is PutStatus.OK
    assert opcodes_of(lambda: reader.get_batch(["k", "k2"]), monkeypatch)[0] == Opcode.BATCH_GET_REPLICA_LIST
    assert reader.get_batch(["k", "k2"]) == [v, b"two"]
    with kvpool.Client(pool.master, shared_memory=reader._ch.segments.shm.enabled, location_cache=0) as plain:
        assert plain.get("k") == v
        assert opcodes_of(lambda: plain.get_into("k", buf), monkeypatch)[0] == Opcode.GET_REPLICA_LIST
    with pytest.raises(ValueError, match="location_cache must be 0"):
        kvpool.Client(pool.master, location_cache=-1)


def test_a_copy_that_raced_a_removal_is_asked_of_the_master_again(pool: Pool, reader: kvpool.Client,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy from the remembered location succeeds (the object was still there), then the removal completes:
    the read must not return what it copied, and asks the master, which says the key is gone."""
    v = os.urandom(5000)
    assert reader.put("racy", v) is PutStatus.OK
    assert reader.get("racy") == v
    real = reads.read_copy
    with kvpool.Client(pool.master) as other:

        def copy_then_removed(client: Any, w: Any, view: memoryview) -> bool:
            got = real(client, w, view)
            assert got and bytes(view) == v  # the old bytes were copied
            assert other.remove("racy")  # returns once the reader applied the removal
            return got

        monkeypatch.setattr(reads, "read_copy", copy_then_removed)
        buf = bytearray(5000)
        assert reader.get_into("racy", buf) == kvpool.MISS
    monkeypatch.setattr(reads, "read_copy", real)
    assert reader.get("racy") is None


def test_an_idle_reader_gives_its_read_lease_up_and_forgets(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that only reads holds its read lease while it reads; once idle it gives it up (no removal waits
    for it), forgetting every location; its next read asks the master and takes the lease again."""
    monkeypatch.setattr(read_lease, "IDLE_STOP", 0.5)
    monkeypatch.setattr(write_leases, "IDLE_STOP", 0.5)
    with kvpool.Client(pool.master) as w:
        assert w.put("idle/k", b"v" * 100) is PutStatus.OK
    with kvpool.Client(pool.master, write_leases=False) as r:
        assert r.get("idle/k") == b"v" * 100
        leasing = r._leases.here()
        assert leasing.read._poller is not None and len(leasing.locations) == 1
        wait_until(lambda: leasing.read._poller is None, "the idle reader to give its read lease up", timeout=10)
        assert len(leasing.locations) == 0 and not leasing.read.valid()
        assert Opcode.GET_REPLICA_LIST in opcodes_of(lambda: r.get("idle/k"), monkeypatch)
        assert leasing.read._poller is not None and len(leasing.locations) == 1


def test_reads_served_from_remembered_locations_are_reported_to_the_master(pool: Pool,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """So its LRU sees them: the read lease's thread sends the keys read from the cache (a batched
    GET_REPLICA_LIST, a read for eviction), and the answer refreshes their entries."""
    monkeypatch.setattr(kvpool.locations, "REPORT_INTERVAL", 0.0)
    reported: list[bytes] = []
    real = Connection.call

    def spy(self: Connection, opcode: int, body: bytes, *a: Any, **kw: Any) -> Any:
        if opcode == Opcode.BATCH_GET_REPLICA_LIST and threading.current_thread().name == "kvpool-read-lease":
            reported.append(body)
        return real(self, opcode, body, *a, **kw)

    with kvpool.Client(pool.master) as r:
        assert r.put("lru/k", b"x" * 64) is PutStatus.OK and r.get("lru/k") == b"x" * 64
        monkeypatch.setattr(Connection, "call", spy)
        assert r.get("lru/k") == b"x" * 64  # from the remembered location
        wait_until(lambda: any(p.encode_keys([b"lru/k"]) == b for b in reported), "the cached read's report")
        assert len(r._leases.here().locations) == 1


# ------------------------------------------------------------------------ removals with a frozen node


def java_cli(master: str, *args: str, env: dict[str, str] | None = None) -> None:
    out = subprocess.run([str(find_java()), "--enable-native-access=ALL-UNNAMED", "-jar", str(JAR), *args,
                          "--master", master], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **(env or {})})
    assert out.returncode == 0, f"kvpool {' '.join(args)}: {out.stdout}{out.stderr}"


class Remover:
    """Removals and an upsert by another client: a Python client, or the Java CLI (a Java client each)."""

    def __init__(self, lang: str, master: str, elsewhere: str) -> None:
        self.lang = lang
        self.master = master
        self.elsewhere = elsewhere  # where the upsert's new value goes: not the frozen node
        self.py = kvpool.Client(master, shared_memory=False) if lang == "python" else None

    def remove(self, key: str) -> None:
        if self.py is not None:
            assert self.py.remove(key)
        else:
            java_cli(self.master, "rm", key)

    def remove_prefix(self, prefix: str) -> None:
        if self.py is not None:
            assert self.py.remove_prefix(prefix) == 2
        else:
            java_cli(self.master, "rm", "--prefix", prefix)

    def upsert(self, key: str, value: str) -> None:
        if self.py is not None:
            assert self.py.upsert(key, value.encode(), preferred_segment=self.elsewhere) is PutStatus.OK
        else:
            java_cli(self.master, "put", "--upsert", f"--value={value}", key,
                     env={"KVPOOL_PREFERRED_SEGMENT": self.elsewhere})

    def remove_all(self) -> None:
        if self.py is not None:
            self.py.remove_all(force=True)
        else:
            java_cli(self.master, "rm", "--all", "--force")

    def close(self) -> None:
        if self.py is not None:
            self.py.close()


def freeze(proc: subprocess.Popen[bytes], on: bool) -> None:
    os.killpg(proc.pid, signal.SIGSTOP if on else signal.SIGCONT)


@pytest.mark.parametrize("lang", ["python", "java"])
def test_what_another_client_removes_or_replaces_is_never_read_from_a_frozen_nodes_segment(lang: str) -> None:
    """The reader copies from node A's segment on this machine. A is frozen (its segment keeps intact headers
    of everything on it), then another client removes and replaces keys the reader remembers: each read after
    that returns what the pool holds now, never the bytes still lying in A's segment."""
    with Cluster(nodes=2, node_ttl="60s") as cl, kvpool.Client(cl.master, timeout=5) as r:
        a, b = (f"127.0.0.1:{port}" for port in cl.node_ports)
        vals = {k: os.urandom(3000) for k in ("gone/1", "pre/x/1", "pre/x/2", "up/1", "all/1")}
        for k, v in vals.items():
            assert r.put(k, v, preferred_segment=a) is PutStatus.OK
        assert r.get_batch(list(vals)) == list(vals.values())
        assert len(r._leases.here().locations) == len(vals)
        remover = Remover(lang, cl.master, b)
        freeze(cl.node_procs[0], True)
        try:
            remover.remove("gone/1")
            assert r.get("gone/1") is None
            remover.remove_prefix("pre/x/")
            assert r.get_batch(["pre/x/1", "pre/x/2"]) == [None, None]
            remover.upsert("up/1", "the new value")
            assert r.get("up/1") == b"the new value"
            buf = bytearray(3000)
            assert r.get_into("all/1", buf) == 3000 and buf == vals["all/1"]  # still there, still remembered
            remover.remove_all()
            assert r.get_into("all/1", buf) == kvpool.MISS
            assert r.counters["shm_read_retries"] == 0  # nothing was even tried where the old objects lie
        finally:
            freeze(cl.node_procs[0], False)
            remover.close()


def test_a_master_restart_drops_what_was_remembered() -> None:
    """Locations learned from a master are not used once a new master runs: what is removed through the new
    one while the node is frozen is not read from the node's segment."""
    with Cluster(nodes=1, node_ttl="60s") as cl, kvpool.Client(cl.master, timeout=5) as r:
        v = os.urandom(3000)
        assert r.put("k", v) is PutStatus.OK and r.get("k") == v
        locations = r._leases.here().locations
        assert len(locations) == 1
        cl.restart_master()

        def registered_again() -> bool:
            try:
                with kvpool.Client(cl.master, timeout=2, connect_timeout=1) as probe:
                    segs = probe.status().segments
                    return len(segs) == 1 and segs[0].active and segs[0].objects == 1
            except kvpool.KvPoolError:
                return False

        wait_until(registered_again, "the node registered with the new master", timeout=60, interval=0.1)
        wait_until(lambda: len(locations) == 0, "the reader dropped what the old master told it", timeout=30)
        freeze(cl.node_procs[0], True)
        try:
            with kvpool.Client(cl.master, shared_memory=False) as w:
                assert w.remove("k")
            assert r.get("k") is None
        finally:
            freeze(cl.node_procs[0], False)


# ------------------------------------------------------------------------------------- bookkeeping


def keys_record(seq: int, *keys: bytes) -> p.Invalidation:
    return p.Invalidation(seq, p.INVALIDATE_KEYS, tuple(keys))


def replicas(n: int) -> p.ReplicaList:
    return p.ReplicaList(p.ResultCode.OK, 100, n, (p.Replica(1, p.TIER_MEMORY, 64 * n),))


def test_confirmations_and_answers_that_raced_an_invalidation() -> None:
    c = Locations(100)
    c.remember(b"a", replicas(1), c.snapshot(), 0)
    c.remember(b"b", replicas(2), c.snapshot(), 0)
    assert c.get(b"a", 0) is not None and c.get(b"a", 1) is None  # another master run: dropped
    assert c.get(b"a", 0) is None
    snap = c.snapshot()
    c.apply(keys_record(1, b"b"))
    assert c.get(b"b", 0) is None
    assert not c.confirm(b"b", snap) and c.confirm(b"c", snap)
    c.remember(b"b", replicas(3), snap, 0)  # the master answered before the removal: not remembered
    assert c.get(b"b", 0) is None
    c.remember(b"b", replicas(3), c.snapshot(), 0)
    assert c.get(b"b", 0) is not None
    snap = c.snapshot()
    c.apply(p.Invalidation(2, p.INVALIDATE_PREFIX, prefix=b"pre/"))
    assert not c.confirm(b"pre/x", snap) and c.confirm(b"b", snap)
    c.drop_all()
    assert not c.confirm(b"b", snap) and len(c) == 0
    snap = c.snapshot()
    for i in range(MAX_RECENT + 1):
        c.apply(keys_record(10 + i, b"other%d" % i))
    assert not c.confirm(b"unrelated", snap)  # beyond the history kept: cannot tell, so not confirmed
    small = Locations(2)
    for k in (b"x", b"y", b"z"):
        small.remember(k, replicas(1), small.snapshot(), 0)
    assert small.get(b"x", 0) is None and small.get(b"z", 0) is not None  # least recently used left first
