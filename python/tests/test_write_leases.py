"""Single-copy puts from Python under write leases (docs/protocol.md 4.27, 4.28, 6.1), against real pools.

* A small put is one exchange, over TCP (NODE_WRITE_COMMIT) and over shared memory (the COMMIT), and the objects are
  visible only once committed, byte-exact, at 64-byte aligned offsets with rising generations.
* A removeAll(force) from another client (Python or Java) fences the leases this client keeps: nothing put
  before it is readable after it, and no put that begins after it returned is lost.
* A master restart or a node restart with a kept lease writes nothing to the wrong place.
* A forked child never uses its parent's leases (read or write).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import threading
import time
from typing import Any

import pytest

import kvpool
from conftest import Cluster, Pool, in_forked_child, opcodes_of, start_pool, wait_until
from kvpool import PutStatus, write_leases
from kvpool import protocol as p
from kvpool.protocol import Opcode, ResultCode


@pytest.fixture
def leaser(either: kvpool.Client) -> kvpool.Client:
    """The conftest's ``either``: a client on the same-machine path, then one on TCP; the pool emptied first."""
    return either


def test_a_small_put_is_one_exchange(leaser: kvpool.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over TCP a leased put is one NODE_WRITE_COMMIT, whose node sends the COMMIT (version 17); on the node's
    machine (version 16) the client stamps the object in its range and the COMMIT is the only exchange."""
    c = leaser
    v = os.urandom(4096)
    first = opcodes_of(lambda: c.put_from("first", v), monkeypatch)
    assert Opcode.WRITE_LEASE in first and Opcode.PUT_START not in first, first
    one = [Opcode.COMMIT] if c._ch.segments.shm.enabled else [Opcode.NODE_WRITE_COMMIT]
    for i in range(5):
        assert opcodes_of(lambda: c.put_from(f"k{i}", v), monkeypatch) == one
    assert c.counters["write_leases"] == 1 and c.counters["objects_leased"] == 6
    assert c.counters["bytes_written_shm" if c._ch.segments.shm.enabled else "bytes_written_tcp"] == 6 * 4096
    # a batch is one exchange too, and the lease kept from the single puts serves it
    vals = [os.urandom(4096) for _ in range(50)]
    assert opcodes_of(lambda: c.put_batch([f"b{i}" for i in range(50)], vals), monkeypatch) == one
    assert c.get_batch([f"b{i}" for i in range(50)]) == vals
    # over TCP, a batch too large for one lane goes in NODE_WRITE frames in parallel lanes, then the client's COMMIT
    if not c._ch.segments.shm.enabled and c._ch.copy_lanes > 1:
        big = [os.urandom(1 << 20) for _ in range(8)]
        sent = opcodes_of(lambda: c.put_batch([f"big{i}" for i in range(8)], big), monkeypatch)
        assert Opcode.NODE_WRITE_COMMIT not in sent and sent.count(Opcode.COMMIT) == 1 and \
            Opcode.NODE_WRITE in sent, sent
        assert c.get_batch([f"big{i}" for i in range(8)]) == big


def test_multi_replica_and_pinned_puts_stay_two_phase(leaser: kvpool.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    c = leaser
    sent = opcodes_of(lambda: c.put("pinned", b"x" * 100, pin_seconds=60), monkeypatch)
    assert sent[0] == Opcode.PUT_START and Opcode.COMMIT not in sent
    c.write_leases = False
    assert opcodes_of(lambda: c.put("plain", b"z"), monkeypatch)[0] == Opcode.PUT_START
    assert c.counters["objects_leased"] == 0
    assert c.get("pinned") == b"x" * 100 and c.get("plain") == b"z"


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
def test_leased_puts_are_visible_only_once_committed_and_byte_exact(pool: Pool, leaser: kvpool.Client, batch: bool,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    c = leaser
    sizes = [0, 1, 63, 64, 65, 4096, 100_003, (1 << 20) + 13]
    keys = [f"v/{n}" for n in sizes]
    vals = [os.urandom(n) for n in sizes]
    pending: list[str] = []  # the keys of the put under way
    seen_before: list[tuple[bool, object]] = []
    from kvpool._net import Connection
    real = Connection.call
    with kvpool.Client(pool.master) as shm_reader, kvpool.Client(pool.master, shared_memory=False) as tcp_reader:

        def spy(self: Connection, opcode: int, *a: Any, **kw: Any) -> Any:
            # on the same machine the bytes are in the segment before the client's COMMIT; over TCP they go with
            # the exchange whose node commits them (NODE_WRITE_COMMIT): nobody may see the objects before either
            if opcode in (Opcode.COMMIT, Opcode.NODE_WRITE_COMMIT):
                seen_before.extend((r.exists(k), r.get(k)) for r in (shm_reader, tcp_reader) for k in pending)
            reply = real(self, opcode, *a, **kw)
            if opcode == Opcode.NODE_WRITE_COMMIT:  # answered: committed, so everybody sees them
                seen_after.extend(r.get(k) == vals[keys.index(k)] for r in (shm_reader, tcp_reader) for k in pending)
            return reply

        seen_after: list[bool] = []
        monkeypatch.setattr(Connection, "call", spy)
        if batch:
            pending[:] = keys
            assert c.put_batch(keys, vals) == [PutStatus.OK] * len(keys)
        else:
            for k, v in zip(keys, vals):
                pending[:] = [k]
                assert c.put_from(k, v) is PutStatus.OK
        monkeypatch.undo()
        assert len(seen_before) == 2 * len(keys) and all(s == (False, None) for s in seen_before), seen_before
        assert all(seen_after) and len(seen_after) == (0 if c._ch.segments.shm.enabled else 2 * len(keys))
        for r in (shm_reader, tcp_reader, c):
            assert r.get_batch(keys) == vals
            for k, v in zip(keys, vals):
                buf = bytearray(len(v) + 7)
                assert r.get_into(k, buf) == len(v) and buf[:len(v)] == v
    # one lease, filled in order: 64-byte aligned regions one after the other, generations rising by one
    where = c.replica_locations(keys)
    assert all(w is not None and len(w[2]) == 1 for w in where)
    offsets = [w[2][0][2] for w in where if w]
    gens = [w[1] for w in where if w]
    assert all(o % 64 == 0 for o in offsets)
    assert [b - a for a, b in zip(offsets, offsets[1:])] == \
        [p.region_length(len(k.encode()), n) for k, n in zip(keys, sizes)][:-1]
    assert [b - a for a, b in zip(gens, gens[1:])] == [1] * (len(gens) - 1)
    assert c.counters["write_leases"] == 1


def test_a_put_of_a_taken_key_and_an_upsert_under_a_lease(leaser: kvpool.Client) -> None:
    c = leaser
    assert c.put("k", b"one") is PutStatus.OK
    assert c.put_batch(["k", "k2"], [b"two", b"x"]) == [PutStatus.ALREADY_EXISTS, PutStatus.OK]
    assert c.get("k") == b"one"
    assert c.upsert("k", b"three") is PutStatus.OK and c.get("k") == b"three"
    assert c.upsert_batch(["k", "k3"], [b"four", b"y"]) == [PutStatus.OK, PutStatus.OK]
    assert c.get_batch(["k", "k2", "k3"]) == [b"four", b"x", b"y"]
    assert c.counters["objects_leased"] == 5  # the refused put is not committed


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "tcp"])
def test_a_forced_remove_all_by_another_client_fences_the_leases_kept(pool: Pool, shm: bool) -> None:
    with kvpool.Client(pool.master, shared_memory=shm) as c, kvpool.Client(pool.master) as other:
        other.remove_all(force=True)
        assert c.put("before", b"b" * 5000) is PutStatus.OK
        kept = c._leases.here().leases.kept()
        assert len(kept) == 1
        other.remove_all(force=True)
        assert c.get("before") is None and other.get("before") is None
        # the kept lease is of the old epoch: the put that begins now takes a fresh one and lands
        v = os.urandom(5000)
        assert c.put("after", v) is PutStatus.OK
        assert c.counters["write_leases"] == 2
        assert other.get("after") == v and c.get("after") == v
        assert kept[0].node is None, "a doomed lease let go of its range on the node"


def test_no_put_that_begins_after_a_forced_remove_all_returned_is_lost(pool: Pool) -> None:
    """A writer putting without pause (into two kept leases) while another client empties the pool again and
    again: every put that neither overlapped a removal nor began before one is OK and readable; nothing from
    before the last removal is readable after it."""
    with kvpool.Client(pool.master) as w, kvpool.Client(pool.master) as admin:
        admin.remove_all(force=True)
        started = [0]  # removals begun
        returned = [0]  # removals returned
        done = threading.Event()
        log: list[tuple[str, int, int, PutStatus]] = []

        def writer() -> None:
            i = 0
            while not done.is_set():
                before = returned[0]
                k = f"w/{i}"
                # two preferences, so two leases kept: a put that overlaps a removal uses up only one of them
                st = w.put(k, k.encode() * 50, preferred_segment=None if i % 2 else "")
                log.append((k, before, started[0], st))
                i += 1

        t = threading.Thread(target=writer)
        t.start()
        try:
            for _ in range(8):
                mark = len(log)
                wait_until(lambda: len(log) >= mark + 5, "the writer to put between removals")
                started[0] += 1
                admin.remove_all(force=True)
                returned[0] += 1
            mark = len(log)
            wait_until(lambda: len(log) >= mark + 5, "the writer to put after the last removal")
        finally:
            done.set()
            t.join(60)
        clean = [(k, st) for k, before, after, st in log if before == after]
        assert clean and all(st is PutStatus.OK for _, st in clean), [x for x in clean if x[1] is not PutStatus.OK]
        for k, before, after, st in log:
            got = admin.get(k)
            if after < started[0]:
                assert got is None, f"{k} put before the last removal is readable after it"
            elif before == returned[0]:
                assert got == k.encode() * 50
        assert w.counters["write_leases"] > 8


def test_a_forced_remove_all_from_java_fences_python_leases_and_both_read_each_other(pool: Pool, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A Java client and a Python client, each putting under leases it keeps, on one pool and one segment."""
    with JavaPeer(pool, tmp_path) as java, kvpool.Client(pool.master) as c:
        c.remove_all(force=True)
        assert java.ask("put j1/ 20") == "OK 20"
        assert [c.put_from(k, value_of(k)) for k in keys("p1/", 20)] == [PutStatus.OK] * 20
        assert c.get_batch(keys("j1/", 20)) == [value_of(k) for k in keys("j1/", 20)]
        assert java.ask("check p1/ 20") == "EXACT 20"
        # both keep their leases: more puts from each interleave on the same segment
        assert java.ask("put j2/ 20") == "OK 20"
        assert c.put_batch(keys("p2/", 20), [value_of(k) for k in keys("p2/", 20)]) == [PutStatus.OK] * 20
        assert java.ask("check p2/ 20") == "EXACT 20" and java.ask("check j1/ 20") == "EXACT 20"
        assert c.get_batch(keys("j2/", 20)) == [value_of(k) for k in keys("j2/", 20)]
        assert c.counters["write_leases"] == 1 and c.counters["objects_leased"] == 40
        # Java empties the pool, fencing the lease Python keeps; Python's next puts land
        assert java.ask("removeall") == "REMOVED 80"
        assert all(v is None for v in c.get_batch(keys("p1/", 20) + keys("j2/", 20)))
        assert [c.put(k, value_of(k)) for k in keys("p3/", 20)] == [PutStatus.OK] * 20
        assert java.ask("check p3/ 20") == "EXACT 20" and java.ask("check p1/ 20") == "EXACT 0"
        assert c.counters["write_leases"] == 2


# ------------------------------------------------------------------------------------ restarts, fork


def test_a_lease_of_an_earlier_master_run_writes_nothing() -> None:
    """The client meets a new master run while its connections, its kept lease and its segment table are the old
    run's: the lease's segment id may name another node now, so not a byte goes anywhere (test_master_runs.py
    has the two-phase put's side)."""
    with Cluster(nodes=2) as cl, kvpool.Client(cl.master, timeout=5, connect_timeout=1) as c:
        assert c.put("before", b"x" * 4096) is PutStatus.OK and len(c._leases.here().leases.kept()) == 1
        with c._ch.master.lock:
            c._ch.master.run += 1  # the table is left as it was: only the run tells it is the old one
        written = c.counters["bytes_written_shm"] + c.counters["bytes_written_tcp"]
        assert c.put("stale", os.urandom(4096)) is PutStatus.FAILED
        assert c.counters["bytes_written_shm"] + c.counters["bytes_written_tcp"] == written
        for conn in c._ch.master.connections()._idle:  # connections that greet the master now: puts go on
            conn.broken = True
        c._ch.master.connections()._idle.clear()
        c._ch.master.connections()._open = 0
        v = os.urandom(4096)
        assert c.put("after", v) is PutStatus.OK and c.get("after") == v


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "tcp"])
def test_kept_leases_across_a_master_restart(shm: bool) -> None:
    with Cluster(nodes=2) as cl, kvpool.Client(cl.master, shared_memory=shm, timeout=10, connect_timeout=1) as c:
        names = [s.name for s in c.status().segments]
        before = {f"before/{i}": os.urandom(3000 + i) for i in range(20)}
        for i, (k, v) in enumerate(before.items()):  # a lease kept on each node
            assert c.put(k, v, preferred_segment=names[i % 2]) is PutStatus.OK
        leases = c._leases.here().leases
        assert len(leases.kept()) == 2
        era = leases._era
        cl.restart_master()
        wait_until(lambda: objects_on_active_segments(cl.master) == (2, 20),
                   "both nodes registered with the new master with their 20 objects", timeout=60, interval=0.1)
        # the read lease meets the new master's incarnation on its own thread, and dooms every lease kept from
        # before (the client may have missed removals): wait for that, so that the leases counted below are the
        # ones granted after it, whenever the poller got there (before, a lease granted just ahead of the doom
        # was doomed and replaced: five leases instead of four, once in about a dozen runs)
        wait_until(lambda: leases._era > era, "the read lease met the new master", timeout=60, interval=0.05)
        after = {f"after/{i}": os.urandom(3000 + i) for i in range(20)}
        for i, (k, v) in enumerate(after.items()):
            assert c.put(k, v, preferred_segment=names[i % 2]) is PutStatus.OK
        assert c.counters["write_leases"] == 4, "the leases of the old master were not used again"
        with kvpool.Client(cl.master) as fresh:
            assert fresh.get_batch(list(before)) == list(before.values())
            assert fresh.get_batch(list(after)) == list(after.values())


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "tcp"])
def test_a_kept_lease_on_a_node_that_restarted_lands_nothing_on_others_objects(shm: bool) -> None:
    """The node restarts on its port and adopts its file under a new segment id; another client fills the new
    segment; the kept lease's next put (a copy into the adopted file, or a NODE_WRITE to the new process) must
    not touch those objects, and lands under a fresh lease."""
    with Cluster(nodes=1) as cl, kvpool.Client(cl.master, shared_memory=shm, timeout=10, connect_timeout=1) as c:
        old = c.status().segments[0].id
        mine = {f"a/{i}": os.urandom(5000 + i) for i in range(10)}
        assert [c.put(k, v) for k, v in mine.items()] == [PutStatus.OK] * 10
        assert len(c._leases.here().leases.kept()) == 1
        cl.restart_node(0)

        def back() -> bool:
            with kvpool.Client(cl.master, timeout=5, connect_timeout=1) as probe:
                segs = probe.status().segments
                return len(segs) == 1 and segs[0].active and segs[0].id != old and segs[0].objects == 10
        wait_until(back, "the restarted node registered with its 10 objects", timeout=60, interval=0.1)
        with kvpool.Client(cl.master, shared_memory=shm) as b:
            theirs = {f"b/{i}": os.urandom(4000 + i) for i in range(200)}
            assert [b.put(k, v) for k, v in theirs.items()] == [PutStatus.OK] * 200
        more = {f"a2/{i}": os.urandom(5000 + i) for i in range(10)}
        assert [c.put(k, v) for k, v in more.items()] == [PutStatus.OK] * 10
        # the kept lease failed, and fresh ones took the puts (while the master holds the old lease's range on
        # the new segment, a lease gets no room beyond its first object, so each put takes one)
        assert c.counters["write_leases"] >= 2
        with kvpool.Client(cl.master, shared_memory=False) as fresh:
            for group in (mine, theirs, more):
                assert fresh.get_batch(list(group)) == list(group.values())


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "tcp"])
def test_a_put_whose_commit_the_master_took_before_it_went_away_answers_ok(shm: bool,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 32, item 3: the master carries out the COMMIT, then restarts before its reply arrives (a failover is
    the same to the client); the node lists the object to the new master under the generation the client gave it.
    The client asks the new master again (EXPIRED: it never granted the lease) and answers OK, since the key holds
    its own object, rather than writing it once more and answering ALREADY_EXISTS. Over TCP the node sends the
    COMMIT (NODE_WRITE_COMMIT), and it is the node's reply that never arrives: the client asks the new master
    whether the key holds its generation before it writes anything again."""
    from kvpool._net import Connection
    with Cluster(nodes=1) as cl, kvpool.Client(cl.master, shared_memory=shm, timeout=30, connect_timeout=1) as c:
        assert c.put("warm", os.urandom(3000)) is PutStatus.OK
        real = Connection.call
        lost: list[bool] = []

        def call(self: Connection, opcode: int, *a: Any, **kw: Any) -> Any:
            reply = real(self, opcode, *a, **kw)
            if opcode == (Opcode.COMMIT if shm else Opcode.NODE_WRITE_COMMIT) and not lost:
                lost.append(True)
                cl.restart_master()
                wait_until(lambda: objects_on_active_segments(cl.master) == (1, 2),
                           "the node registered with the new master with both objects", timeout=60, interval=0.1)
                self.broken = True  # as a read that meets the closed socket marks it
                raise ConnectionError("the master went away before the COMMIT's reply arrived")
            return reply
        monkeypatch.setattr(Connection, "call", call)
        v = os.urandom(6000)
        assert c.put("taken", v) is PutStatus.OK
        assert lost and c.get("taken") == v
        assert c.counters["write_leases"] == 1, "not written again under a fresh lease"


def test_a_forked_child_never_uses_its_parents_leases(pool: Pool) -> None:
    with kvpool.Client(pool.master) as c:
        c.remove_all(force=True)
        assert c.put("p/0", b"parent-0" * 100) is PutStatus.OK
        parent = c._leases.here()
        lease_ids = [lease.id for lease in parent.leases.kept()]
        assert len(lease_ids) == 1 and parent.read.valid()

        def child() -> bool:  # puts land under leases and a read lease of the child's own
            ok = all(c.put(f"c/{i}", f"child-{i}".encode() * 100) is PutStatus.OK for i in range(3))
            mine = c._leases.here()
            own = mine is not parent and all(lease.id not in lease_ids for lease in mine.leases.kept()) \
                and mine.read._session != parent.read._session and mine.read.valid()
            ok = ok and own and c.counters["write_leases"] == 2
            c.close()  # the child's own leases: its read lease ends, its write lease goes back
            return ok

        assert in_forked_child(child)
        # the parent's kept lease is intact and still its own: its next put goes on in it
        assert c.put("p/1", b"parent-1" * 100) is PutStatus.OK
        assert [lease.id for lease in c._leases.here().leases.kept()] == lease_ids
        assert c._leases.here() is parent and c.counters["write_leases"] == 1
        with kvpool.Client(pool.master) as fresh:
            assert fresh.get_batch(["p/0", "p/1"]) == [b"parent-0" * 100, b"parent-1" * 100]
            assert fresh.get_batch([f"c/{i}" for i in range(3)]) == [f"child-{i}".encode() * 100 for i in range(3)]


def test_idle_leases_are_released_and_the_read_lease_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kept lease idle for half the master's idle timeout goes back (its unused range freed); once none is
    kept, the read lease ends, so an idle process holds up no removal; the next put takes both again."""
    monkeypatch.setattr(write_leases, "IDLE_STOP", 0.5)
    with start_pool(extra=["--put-timeout", "2s"]) as pool, kvpool.Client(pool.master) as c:
        v = os.urandom(4096)
        assert c.put("a", v) is PutStatus.OK
        leasing = c._leases.here()
        assert len(leasing.leases.kept()) == 1 and leasing.read._poller is not None
        wait_until(lambda: not leasing.leases.kept(), "the idle lease to be released", timeout=10)
        wait_until(lambda: leasing.read._poller is None, "the read lease to be given up", timeout=10)
        assert not leasing.read.valid()
        assert c.status().segments[0].used == p.region_length(1, 4096), "the lease's unused range went back"
        assert c.put("b", v) is PutStatus.OK and c.counters["write_leases"] == 2 and leasing.read.valid()
        assert c.get_batch(["a", "b"]) == [v, v]


def test_the_mooncake_api_puts_under_leases(store: Any, pool: Pool) -> None:
    data = os.urandom(4096)
    assert store.put("mc/0", data) == 0
    assert store.put_batch(["mc/1", "mc/2"], [data, data]) == 0
    assert store._client.counters["objects_leased"] == 3
    with kvpool.Client(pool.master) as c:
        assert c.get_batch(["mc/0", "mc/1", "mc/2"]) == [data] * 3


# --------------------------------------------------------------------------------------------- helpers


def objects_on_active_segments(master: str) -> tuple[int, int]:
    try:
        with kvpool.Client(master, timeout=5, connect_timeout=1) as probe:
            segs = [s for s in probe.status().segments if s.active]
            return len(segs), sum(s.objects for s in segs)
    except kvpool.KvPoolError:
        return 0, 0


def keys(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def value_of(key: str) -> bytes:
    """The value both peers put under ``key``: its SHA-256 digest d repeated to 100 + (d[0] | d[1] << 8) % 9000
    bytes."""
    d = hashlib.sha256(key.encode()).digest()
    n = 100 + (d[0] | d[1] << 8) % 9000
    return (d * (n // 32 + 1))[:n]


JAVA_PEER = r"""
import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.util.Arrays;
import java.util.Optional;

/** A Java client under test commands on stdin: put PREFIX N, check PREFIX N, removeall. */
public class LeasingPeer {
    static byte[] valueOf(String key) throws Exception {
        byte[] d = MessageDigest.getInstance("SHA-256").digest(key.getBytes(StandardCharsets.UTF_8));
        int n = 100 + (((d[0] & 0xFF) | (d[1] & 0xFF) << 8) % 9000);
        byte[] out = new byte[n];
        for (int i = 0; i < n; i++) out[i] = d[i % 32];
        return out;
    }

    public static void main(String[] args) throws Exception {
        try (KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster(args[0]))) {
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            System.out.println("READY");
            String line;
            while ((line = in.readLine()) != null) {
                String[] f = line.split(" ");
                String out;
                if (f[0].equals("put")) {
                    int ok = 0;
                    for (int i = 0; i < Integer.parseInt(f[2]); i++) {
                        ok += c.put(f[1] + i, valueOf(f[1] + i)) == PutStatus.OK ? 1 : 0;
                    }
                    out = "OK " + ok;
                } else if (f[0].equals("check")) {
                    int exact = 0;
                    for (int i = 0; i < Integer.parseInt(f[2]); i++) {
                        Optional<byte[]> got = c.get(f[1] + i);
                        exact += got.isPresent() && Arrays.equals(got.get(), valueOf(f[1] + i)) ? 1 : 0;
                    }
                    out = "EXACT " + exact;
                } else {
                    out = "REMOVED " + c.removeAll(true);
                }
                System.out.println(out);
                System.out.flush();
            }
        }
    }
}
"""


class JavaPeer:
    """The Java client of ``JAVA_PEER``, run from the jar, answering one line per command."""

    def __init__(self, pool: Pool, tmp_path: Any) -> None:
        src = tmp_path / "LeasingPeer.java"
        src.write_text(JAVA_PEER)
        self.proc = subprocess.Popen([str(pool.java), "--enable-native-access=ALL-UNNAMED", "-cp", str(pool.jar),
                                      str(src), pool.master], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        assert self.ask(None) == "READY"

    def ask(self, command: str | None) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if command is not None:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline().strip()
        assert line, f"the Java peer exited ({self.proc.poll()}) without answering {command!r}"
        return line

    def __enter__(self) -> JavaPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except Exception:  # noqa: BLE001
            self.proc.kill()
            self.proc.wait()


def test_the_lease_ask_grows_for_a_streaming_writer_and_falls_back() -> None:
    """``LeaseSize``, as the Java client's: a lease used up within a second of its grant doubles the next ask, up
    to 8x; one that took over ten seconds halves it; a lease let go idle sets it back to 1x."""
    s = write_leases.LeaseSize()
    assert (s.bytes(1 << 20), s.generations(1)) == (32 << 20, 1024)
    assert (s.bytes(100 << 20), s.generations(5000)) == (100 << 20, 5000), "never less than the batch needs"
    asks = []
    for _ in range(5):
        s.used_up(write_leases.FAST_SECONDS - 0.001)
        asks.append(s.bytes(0) >> 20)
    assert asks == [64, 128, 256, 256, 256] and s.generations(0) == 8192
    s.used_up(write_leases.FAST_SECONDS)  # not under a second: unchanged
    s.used_up(write_leases.SLOW_SECONDS)  # not over ten: unchanged
    assert s.factor == 8
    s.used_up(write_leases.SLOW_SECONDS + 0.001)
    assert s.factor == 4
    s.idled()
    assert s.factor == 1
    s.used_up(write_leases.SLOW_SECONDS + 1)
    assert s.factor == 1, "never under 1x"


def test_a_lease_given_back_used_up_at_once_grows_the_next_ask() -> None:
    """``give_back`` of a lease with no room left, a moment after its grant, grows the ask; one with room does not,
    nor one of an earlier master run (its pace says nothing about this writer's now)."""
    from types import SimpleNamespace
    ch: Any = SimpleNamespace(master=SimpleNamespace(run=3))
    pool = write_leases.WriteLeasePool(ch, lambda: True)
    released: list[write_leases.Lease] = []
    pool.release = released.append  # type: ignore[method-assign]
    g = p.WriteLease(ResultCode.OK, lease_id=42, epoch=0, term=3, segment_id=2, offset=0, length=16 << 20,
                     first_generation=1, generation_count=1024, idle_millis=60_000)

    roomy = write_leases.Lease(g, "", 0, 3, time.monotonic())
    pool.give_back(roomy)
    assert pool.size.factor == 1 and not released, "kept: room left"

    full = write_leases.Lease(g, "", 0, 3, time.monotonic())
    full.next = full.end
    pool.give_back(full)
    assert pool.size.factor == 2 and released == [full]

    old = write_leases.Lease(g, "", 0, 2, time.monotonic())
    old.next = old.end
    pool.give_back(old)
    assert pool.size.factor == 2, "a lease of an earlier master run"
