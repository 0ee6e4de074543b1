"""Reads over TCP: NODE_READ and NODE_READ_RANGE frames to one node, and large reads striped over several
connections.

Why stripes
-----------
One Python thread reading one loopback TCP stream tops out at about 3,400 to 4,600 values of 1 MiB a second on
this project's 2-core machine, with nothing of kvpool in it. Asking for the two halves of each value on two
connections at once and reading the two replies in turn in the same thread ran at 1.78x to 2.30x that at 1 MiB
and 1.12x to 1.50x at 4 MiB; reading them on two threads, at 1.72x to 2.01x and 1.71x to 2.10x
(``python3 scripts/py-recv-floor.py``). The sending side's work (the copy into the socket and the loopback's
transmit path) is done by the sender's thread, so two senders work in parallel while the reader takes one reply.
Against kvpool's node, a first cut that handed stripes to lane threads gained less than reading in turn does
(4 MiB gets 1.11x to 1.23x, against 1.20x to 1.35x below): handing work to a sleeping thread costs its wake-up.

How
---
A read from one node's memory whose items average at least ``STRIPE_MIN_ITEM_BYTES`` is cut into chunks of at
most ``CHUNK_BYTES`` (a value may be cut, into byte ranges), one NODE_READ_RANGE frame each, dealt round-robin over
up to ``copy_lanes`` pooled connections (at least ``STRIPE_BYTES`` each). Each connection has up to ``WINDOW``
frames sent ahead; the caller's thread reads the replies in chunk order, straight into the caller's buffers, and
sends each connection its next frame as it takes a reply. Chunks dealt in turn keep every sender busy: with one
large stripe per connection, the second sender stopped once the socket's buffers were full. A connection the
pool cannot lend at once (all in use by other threads) is not waited for: the read uses fewer.

Where it pays, in the same runs (``python3 scripts/py-striped-reads.py``: ``kvpool serve``, 2 cores, one
connection and striped in pairs of rounds): one process's gets of 4 MiB ran 1.20x to 1.35x faster striped, and its
batches of 16 x 4 MiB 1.15x to 1.33x; pairs of 1 MiB rounds, read on one connection both times, measured 0.90x to
1.17x, the run's noise. Two processes reading at once on the same two cores lost: 0.79x to 0.86x for 4 MiB gets
after the first pair, 0.84x to 1.01x for the batches (more connections and frames on busy cores). Values of
1 MiB gained nothing in earlier cuts of this, so items under 2 MiB go on one connection. ``copy_lanes = 1`` turns
striping off.

What a striped read returns is what an unstriped one does: every range names the object's generation, and the
node pins the object while it sends a range, so each range holds bytes of exactly the version located or is a
miss; an item is read only if every one of its ranges was. Objects in the SSD tier are never striped (the node
stages and verifies a disk object whole for every range asked of it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, NamedTuple, Sequence

from . import protocol as p
from ._net import Connection, frame_end
from .errors import KvPoolError
from .protocol import Opcode, ResultCode, SegmentStats

if TYPE_CHECKING:
    from .channels import Channels

log = logging.getLogger("kvpool")

#: A read from one node whose items average fewer bytes than this goes on one connection.
STRIPE_MIN_ITEM_BYTES = 2 << 20
#: Least bytes a connection is given: a read of B bytes uses at most B / STRIPE_BYTES connections.
STRIPE_BYTES = 1 << 20
#: Most bytes of one frame of a striped read.
CHUNK_BYTES = 2 << 20
#: Frames of a striped read sent ahead on one connection, not yet answered.
WINDOW = 4


class Piece(NamedTuple):
    """One NODE_READ(_RANGE) item: ``view.nbytes`` bytes from ``at`` of item ``item``'s value (``at`` None: the
    whole value, read with NODE_READ)."""
    item: int
    rep: p.Replica
    where: p.ReplicaList
    at: int | None
    view: memoryview


def read_over_tcp(ch: Channels, seg: SegmentStats, tcp: list[tuple[int, p.Replica, p.ReplicaList]],
                  offsets: Sequence[int] | None, views: list[memoryview], got: list[int]) -> None:
    """Reads the items ``tcp`` from one segment's node into ``views[i]``: whole values (``offsets`` None) or
    ``views[i].nbytes`` bytes from ``offsets[i]``; sets ``got[i]`` for each hit. Striped where it pays (see the
    module notes). Never raises for node failures."""
    pieces = [Piece(i, rep, w, offsets[i] if offsets is not None else None, views[i]) for i, rep, w in tcp]
    streams, chunks = plan(pieces, ch.copy_lanes)
    if streams == 1:
        ok = [read_pieces(ch, seg, pieces)]
        chunks = [pieces]
    else:
        ok = _read_striped(ch, seg, chunks, streams)
    missed = {pc.item for chunk, hits in zip(chunks, ok) for pc, hit in zip(chunk, hits) if not hit}
    n = 0
    for i, _, _ in tcp:
        if i not in missed:
            got[i] = views[i].nbytes
            n += got[i]
    ch.count("bytes_read_tcp", n)
    if streams > 1:
        ch.count("tcp_read_stripes", 1)


def plan(pieces: list[Piece], lanes_: int) -> tuple[int, list[list[Piece]]]:
    """How a read of ``pieces`` goes: (connections, chunks). One connection, and no chunks, with items averaging under
    ``STRIPE_MIN_ITEM_BYTES``, with an item in the SSD tier, or with one lane; else up to ``lanes_`` connections
    (at least ``STRIPE_BYTES`` each) and the pieces cut, in order, into chunks of at most ``CHUNK_BYTES`` (and
    at most a connection's share, and of at most a frame's items), a piece cut at a chunk's end into ranges of its
    value; an empty value is a piece of no bytes, so the node still says whether its object is there."""
    total = sum(pc.view.nbytes for pc in pieces)
    k = min(lanes_, total // STRIPE_BYTES)
    if k < 2 or total < len(pieces) * STRIPE_MIN_ITEM_BYTES or any(pc.rep.tier != p.TIER_MEMORY for pc in pieces):
        return 1, []
    size = min(CHUNK_BYTES, -(-total // k))
    out: list[list[Piece]] = [[]]
    room = size
    for pc in pieces:
        at = pc.at or 0
        view = pc.view
        if len(out[-1]) >= p.MAX_ITEMS_PER_NODE_FRAME:  # a frame's item limit, reached only by many empty values
            out.append([])
            room = size
        if not view.nbytes:  # nothing to copy, but the node must still say the object is there
            out[-1].append(Piece(pc.item, pc.rep, pc.where, at, view))
            continue
        while view.nbytes:
            if not room or len(out[-1]) >= p.MAX_ITEMS_PER_NODE_FRAME:
                out.append([])
                room = size
            take = min(room, view.nbytes)
            out[-1].append(Piece(pc.item, pc.rep, pc.where, at, view[:take]))
            at += take
            view = view[take:]
            room -= take
    return k, out


def _read_striped(ch: Channels, seg: SegmentStats, chunks: list[list[Piece]], streams: int) -> list[list[bool]]:
    """Reads ``chunks`` (one frame each) dealt round-robin over up to ``streams`` connections (fewer when the pool
    cannot lend that many at once), ``WINDOW`` frames ahead on each, the replies taken in chunk order; whether each
    piece of each chunk was read. A connection that fails misses the chunks it had not delivered."""
    ok = [[False] * len(chunk) for chunk in chunks]
    pool = ch.segments.node_pool(seg)
    try:
        conns = [pool.borrow(ch.timeout)]
    except KvPoolError as e:
        log.debug("kvpool: read from %s failed: %s", seg.name, e)
        return ok
    try:
        while len(conns) < streams:
            try:
                more = pool.try_borrow(ch.timeout)
            except KvPoolError as e:
                log.debug("kvpool: no second connection to %s: %s", seg.name, e)
                more = None
            if more is None:
                break
            conns.append(more)
        k = len(conns)
        sent = [0] * k  # per connection: frames sent, as chunk numbers j = c, c + k, c + 2k, ...
        dead = [False] * k

        def fail(c: int, e: BaseException) -> None:
            conns[c].close()
            dead[c] = True
            log.debug("kvpool: read from %s failed: %s", seg.name, e)

        def pump(c: int, taken: int) -> None:
            """Sends connection c's next frames while fewer than WINDOW are unanswered."""
            try:
                while not dead[c] and sent[c] - taken < WINDOW and c + sent[c] * k < len(chunks):
                    conns[c].send(Opcode.NODE_READ_RANGE, _range_body(chunks[c + sent[c] * k]), ch.timeout)
                    sent[c] += 1
            except (OSError, KvPoolError, ValueError) as e:
                fail(c, e)

        for c in range(k):
            pump(c, 0)
        for j, chunk in enumerate(chunks):
            c = j % k
            if dead[c]:
                continue
            try:
                _take_reply(conns[c], conns[c].receive(ch.timeout)[0], chunk, ok[j], 0, "NODE_READ_RANGE reply")
            except (OSError, KvPoolError, ValueError) as e:
                fail(c, e)
                continue
            pump(c, j // k + 1)
        return ok
    finally:
        for conn in conns:
            pool.release(conn)


def _range_body(part: list[Piece]) -> bytes:
    return p.encode_node_read_range([(pc.rep.offset, pc.where.generation, pc.where.value_length, pc.rep.tier,
                                      pc.at or 0, pc.view.nbytes) for pc in part])


def _take_reply(c: Connection, reply: bytes, part: list[Piece], hits: list[bool], first: int, what: str) -> None:
    """Reads the payload of one NODE_READ(_RANGE) reply into the views of ``part``: ``hits[first + k]`` for each
    item the node had."""
    codes = p.decode_codes(reply, what)
    if len(codes) != len(part):
        raise p.ProtocolError(f"{what} has {len(codes)} results for {len(part)} items")
    for k, (pc, code) in enumerate(zip(part, codes)):
        if code == ResultCode.OK:
            c.read_payload_into(pc.view)
            hits[first + k] = True


def read_pieces(ch: Channels, seg: SegmentStats, pieces: list[Piece]) -> list[bool]:
    """Reads ``pieces`` from one node, a frame per payload limit, on one pooled connection at a time: NODE_READ
    when every piece is a whole value, NODE_READ_RANGE otherwise; whether each piece was read. A frame that fails
    misses its pieces (its connection is closed), and the next frame borrows another connection."""
    ok = [False] * len(pieces)
    pool = ch.segments.node_pool(seg)
    whole = all(pc.at is None for pc in pieces)
    what = "NODE_READ reply" if whole else "NODE_READ_RANGE reply"
    sizes = [pc.view.nbytes for pc in pieces]
    a = 0
    while a < len(pieces):
        b = frame_end(sizes, a, p.DEFAULT_MAX_PAYLOAD_BYTES) if len(pieces) > 1 else 1
        part = pieces[a:b]
        try:
            c = pool.borrow(ch.timeout)
        except KvPoolError as e:
            log.debug("kvpool: read from %s failed: %s", seg.name, e)
            return ok
        try:
            if whole:
                reply, _ = c.call(Opcode.NODE_READ, p.encode_node_read(
                    [(pc.rep.offset, pc.where.generation, pc.where.value_length, pc.rep.tier) for pc in part]),
                    ch.timeout)
            else:
                reply, _ = c.call(Opcode.NODE_READ_RANGE, _range_body(part), ch.timeout)
            _take_reply(c, reply, part, ok, a, what)
        except (OSError, KvPoolError, ValueError) as e:
            c.close()
            log.debug("kvpool: read from %s failed: %s", seg.name, e)
        finally:
            pool.release(c)
        a = b
    return ok
