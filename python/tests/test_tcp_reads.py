"""Large reads over TCP striped over several connections (``kvpool.tcp_reads``).

* How a read is cut: chunks covering every item's bytes once and in order, none over ``CHUNK_BYTES`` or a
  connection's share; no striping below the thresholds, for the SSD tier, for small items or with one lane.
* Against a real pool over TCP: whole gets, batches and ranged reads that are striped land byte-exact, and count
  as striped; an item is read only if every chunk of it was; a pool that cannot lend a second connection at once
  reads on one.
"""

from __future__ import annotations

import os
from typing import Iterator

import pytest

import kvpool
from conftest import Pool
from kvpool import MISS, tcp_reads
from kvpool._net import ConnectionPool
from kvpool import protocol as p
from kvpool.tcp_reads import CHUNK_BYTES, STRIPE_BYTES, STRIPE_MIN_ITEM_BYTES, Piece, plan

MIB = 1 << 20


def pieces(sizes: list[int], tier: int = p.TIER_MEMORY, offsets: list[int] | None = None) -> list[Piece]:
    out = []
    for i, n in enumerate(sizes):
        rep = p.Replica(segment_id=1, tier=tier, offset=4096 * i)
        w = p.ReplicaList(p.ResultCode.OK, value_length=n + (offsets[i] if offsets else 0), generation=i + 1,
                          replicas=(rep,))
        out.append(Piece(i, rep, w, offsets[i] if offsets else None, memoryview(bytearray(n))))
    return out


def covered(chunks: list[list[Piece]], sizes: list[int], offsets: list[int] | None = None) -> None:
    """Every item's bytes are in the chunks once, in order: the pieces of item i, chunk after chunk, are
    consecutive ranges from its offset, and their views tile its buffer."""
    at = {i: (offsets[i] if offsets else 0) for i in range(len(sizes))}
    seen = {i: 0 for i in range(len(sizes))}
    for chunk in chunks:
        for pc in chunk:
            assert pc.at == at[pc.item]
            at[pc.item] += pc.view.nbytes
            seen[pc.item] += pc.view.nbytes
    assert seen == dict(enumerate(sizes))
    assert {pc.item for chunk in chunks for pc in chunk} == set(range(len(sizes)))  # empty values asked for too


def chunk_bytes(chunks: list[list[Piece]]) -> list[int]:
    return [sum(pc.view.nbytes for pc in c) for c in chunks]


def test_items_under_the_threshold_are_not_striped() -> None:
    assert plan(pieces([STRIPE_MIN_ITEM_BYTES - 1]), 4) == (1, [])
    assert plan(pieces([STRIPE_MIN_ITEM_BYTES - 1] * 64), 4) == (1, [])


def test_one_lane_or_the_ssd_tier_is_not_striped() -> None:
    assert plan(pieces([4 * MIB]), 1)[0] == 1
    assert plan(pieces([4 * MIB], tier=p.TIER_DISK), 4)[0] == 1
    assert plan(pieces([4 * MIB, 4 * MIB], tier=p.TIER_DISK), 4)[0] == 1


def test_one_value_is_cut_into_ranges_a_connections_share_each() -> None:
    k, chunks = plan(pieces([2 * MIB]), 2)
    assert k == 2 and [[(pc.at, pc.view.nbytes) for pc in c] for c in chunks] == [[(0, MIB)], [(MIB, MIB)]]
    k, chunks = plan(pieces([4 * MIB]), 4)
    assert k == 4 and chunk_bytes(chunks) == [MIB] * 4


def test_a_large_batch_is_cut_into_chunks_dealt_over_the_connections() -> None:
    sizes = [4 * MIB] * 16
    k, chunks = plan(pieces(sizes), 2)
    assert k == 2 and chunk_bytes(chunks) == [CHUNK_BYTES] * (64 * MIB // CHUNK_BYTES)
    covered(chunks, sizes)


@pytest.mark.parametrize("lanes_", [2, 3, 4, 8])
def test_odd_sizes_and_ranges_are_covered_once_in_order(lanes_: int) -> None:
    sizes = [3 * MIB // 2 + 1, 5 * MIB + 7, 0, 2 * MIB - 3, 2 * MIB]
    offsets = [0, 12345, 3, 7, 1 << 20]
    k, chunks = plan(pieces(sizes, offsets=offsets), lanes_)
    total = sum(sizes)
    assert k == min(lanes_, total // STRIPE_BYTES)
    assert all(0 <= n <= min(CHUNK_BYTES, -(-total // k)) for n in chunk_bytes(chunks))
    covered(chunks, sizes, offsets)


def test_no_chunk_has_more_items_than_a_frame_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(p, "MAX_ITEMS_PER_NODE_FRAME", 4)
    sizes = [24 * MIB] + [0] * 8 + [3 * MIB]
    k, chunks = plan(pieces(sizes), 2)
    assert k == 2
    assert max(len(c) for c in chunks) <= 4
    covered(chunks, sizes)


@pytest.fixture
def tcp(pool: Pool) -> Iterator[kvpool.Client]:
    c = kvpool.Client(pool.master, shared_memory=False)
    c.remove_all(force=True)
    c.copy_lanes = 2
    try:
        yield c
    finally:
        c.close()


def test_striped_gets_and_batches_land_byte_exact(tcp: kvpool.Client) -> None:
    values = {f"stripe/{i}": os.urandom(2 * MIB + 17 * i) for i in range(6)}
    big = os.urandom(4 * MIB + 5)
    assert tcp.put_batch(list(values), list(values.values())) == [kvpool.PutStatus.OK] * len(values)
    assert tcp.put("stripe/big", big) == kvpool.PutStatus.OK
    before = tcp.counters["tcp_read_stripes"]
    bufs = [bytearray(len(v)) for v in values.values()]
    assert tcp.get_into_batch(list(values), bufs) == [len(v) for v in values.values()]
    assert [bytes(b) for b in bufs] == list(values.values())
    one = bytearray(len(big))
    assert tcp.get_into("stripe/big", one) == len(big)
    assert bytes(one) == big
    assert tcp.counters["tcp_read_stripes"] == before + 2  # the batch and the large get


def test_one_lane_reads_without_stripes(tcp: kvpool.Client) -> None:
    big = os.urandom(4 * MIB)
    assert tcp.put("stripe/one-lane", big) == kvpool.PutStatus.OK
    tcp.copy_lanes = 1
    buf = bytearray(len(big))
    assert tcp.get_into("stripe/one-lane", buf) == len(big) and bytes(buf) == big
    assert tcp.counters["tcp_read_stripes"] == 0


def test_striped_ranged_reads_land_byte_exact_and_a_removed_object_misses(tcp: kvpool.Client) -> None:
    a, b = os.urandom(4 * MIB), os.urandom(4 * MIB)
    assert tcp.put_batch(["stripe/a", "stripe/b"], [a, b]) == [kvpool.PutStatus.OK] * 2
    located = tcp.locate(["stripe/a", "stripe/b"])
    bufs = [bytearray(3 * MIB), bytearray(3 * MIB)]
    assert tcp.get_ranges_into(located, [MIB, 12345], bufs) == [3 * MIB, 3 * MIB]
    assert bytes(bufs[0]) == a[MIB:4 * MIB] and bytes(bufs[1]) == b[12345:12345 + 3 * MIB]
    assert tcp.counters["tcp_read_stripes"] == 1
    assert tcp.remove("stripe/a")
    assert tcp.get_ranges_into(located, [0, 0], [bytearray(4 * MIB), bytearray(4 * MIB)]) == [MISS, 4 * MIB]


def test_an_empty_value_in_a_striped_batch_is_asked_of_the_node(tcp: kvpool.Client) -> None:
    big = os.urandom(8 * MIB)
    assert tcp.put_batch(["stripe/big8", "stripe/empty"], [big, b""]) == [kvpool.PutStatus.OK] * 2
    located = tcp.locate(["stripe/big8", "stripe/empty"])
    assert tcp.get_ranges_into(located, [0, 0], [bytearray(8 * MIB), bytearray(0)]) == [8 * MIB, 0]
    assert tcp.remove("stripe/empty")
    assert tcp.get_ranges_into(located, [0, 0], [bytearray(8 * MIB), bytearray(0)]) == [8 * MIB, MISS]
    assert tcp.counters["tcp_read_stripes"] == 2


def test_an_item_is_read_only_if_every_chunk_of_it_was(tcp: kvpool.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    big = os.urandom(4 * MIB)
    assert tcp.put("stripe/half", big) == kvpool.PutStatus.OK
    real = tcp_reads._take_reply

    def second_half_missing(c: object, reply: bytes, part: list[Piece], hits: list[bool], first: int,
                            what: str) -> None:
        real(c, reply, part, hits, first, what)  # type: ignore[arg-type]
        for k, pc in enumerate(part):
            if (pc.at or 0) >= 2 * MIB:
                hits[first + k] = False

    monkeypatch.setattr(tcp_reads, "_take_reply", second_half_missing)
    assert tcp.get_into_batch(["stripe/half"], [bytearray(4 * MIB)]) == [MISS]
    monkeypatch.undo()
    buf = bytearray(4 * MIB)
    assert tcp.get_into_batch(["stripe/half"], [buf]) == [4 * MIB] and bytes(buf) == big


def test_a_pool_with_no_second_connection_to_lend_reads_on_one(pool: Pool) -> None:
    with kvpool.Client(pool.master, shared_memory=False, max_connections=1) as c:
        c.copy_lanes = 2
        big = os.urandom(4 * MIB)
        assert c.put("stripe/alone", big) == kvpool.PutStatus.OK
        buf = bytearray(4 * MIB)
        assert c.get_into("stripe/alone", buf) == 4 * MIB and bytes(buf) == big
        assert c.counters["tcp_read_stripes"] == 1  # planned for two; the one connection took every chunk


def test_try_borrow_never_waits_and_a_connection_with_a_reply_due_is_never_lent_again(pool: Pool) -> None:
    host, port = pool.master.rsplit(":", 1)
    cp = ConnectionPool(host, int(port), max_connections=1, connect_timeout=3)
    try:
        first = cp.try_borrow(3)
        assert first is not None
        assert cp.try_borrow(3) is None  # the only connection is lent: no wait, no second one
        first.send(p.Opcode.PING, p.encode_ping((1, 2)), 3)  # its reply is still due
        cp.release(first)
        again = cp.try_borrow(3)
        assert again is not None and again is not first and first.broken
        again.call(p.Opcode.PING, p.encode_ping((1, 2)), 3)  # a fresh connection: its first reply is its own
        cp.release(again)
        assert cp.try_borrow(3) is again
    finally:
        cp.close()
