"""The read lease (version 3, section 4.25) and write leases (version 5, section 4.27) bodies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from ..codec import BodyReader, BodyWriter, ProtocolError
from .frames import ResultCode
from .master import _CODES, _code, GRANT_MAC_BYTES, WriteGrant
from .node import WriteItem, encode_node_write


# Read leases (version 3, section 4.25): the renewal that also acknowledges the invalidations applied.

#: LEASE request flag: the client is done with its lease; the master stops counting on it.
LEASE_FLAG_END = 0x01
#: LEASE reply flag: the client must drop everything it derived from earlier replies (RESYNC).
LEASE_FLAG_RESYNC = 0x01
#: Invalidation kinds in a LEASE reply.
INVALIDATE_KEYS = 1
INVALIDATE_PREFIX = 2
INVALIDATE_ALL = 3


def encode_lease(session: tuple[int, int], incarnation: int, applied_seq: int, hold_millis: int,
                 end: bool = False) -> bytes:
    """LEASE: session id (two i64, most significant first), the position applied, the hold, END."""
    if hold_millis < 0:
        raise ValueError(f"hold_millis must be >= 0, got {hold_millis}")
    return (BodyWriter().i64(session[0]).i64(session[1]).i64(incarnation).i64(applied_seq).i32(hold_millis)
            .u8(LEASE_FLAG_END if end else 0)).bytes()


@dataclass(frozen=True, slots=True)
class Invalidation:
    """One record of a LEASE reply: what it covers (``keys`` for KEYS, ``prefix`` for PREFIX, ALL: all)."""

    seq: int
    kind: int
    keys: tuple[bytes, ...] = ()
    prefix: bytes = b""


@dataclass(frozen=True, slots=True)
class LeaseReply:
    """A LEASE reply: the master's incarnation, where the client stands once it applied the records (or
    resynchronised), and the lease granted, counted from when the request was sent."""

    incarnation: int
    seq: int
    lease_millis: int
    resync: bool
    records: tuple[Invalidation, ...] = ()


def decode_lease_reply(body: bytes) -> LeaseReply:
    r = BodyReader(body, "LEASE reply")
    incarnation, seq, millis = r.i64("master incarnation"), r.i64("sequence"), r.i32("lease millis")
    flags = r.u8("flags")
    if flags & ~LEASE_FLAG_RESYNC:
        raise ProtocolError(f"LEASE reply: unknown flags 0x{flags:02x}")
    records = []
    for _ in range(r.count("record count", 9)):
        rec_seq = r.i64("invalidation sequence")
        kind = r.u8("invalidation kind")
        if kind == INVALIDATE_KEYS:
            records.append(Invalidation(rec_seq, kind, tuple(r.bstr("key") for _ in range(r.count("key count", 2)))))
        elif kind == INVALIDATE_PREFIX:
            records.append(Invalidation(rec_seq, kind, prefix=r.bstr("prefix")))
        elif kind == INVALIDATE_ALL:
            records.append(Invalidation(rec_seq, kind))
        else:
            raise ProtocolError(f"LEASE reply: unknown invalidation kind {kind}")
    r.done()
    return LeaseReply(incarnation, seq, millis, bool(flags & LEASE_FLAG_RESYNC), tuple(records))


# Write leases (version 5, section 4.27): single-copy puts without a master exchange before the bytes move
# (``kvpool.leased_puts``).


def encode_write_lease(preferred: str, least_bytes: int, wanted_bytes: int, generations: int) -> bytes:
    """WRITE_LEASE: a range of one segment of ``least_bytes`` to about ``wanted_bytes``."""
    return BodyWriter().string(preferred).i64(least_bytes).i64(wanted_bytes).i32(generations).bytes()


@dataclass(frozen=True, slots=True)
class WriteLease:
    """A WRITE_LEASE reply; ``code`` is OK or why none was granted (the other fields are then 0)."""

    code: ResultCode
    lease_id: int = 0
    epoch: int = 0
    term: int = 0
    segment_id: int = 0
    offset: int = 0
    length: int = 0
    first_generation: int = 0
    generation_count: int = 0
    idle_millis: int = 0
    mac: bytes = bytes(GRANT_MAC_BYTES)

    def grant(self) -> WriteGrant:
        """The lease's range and generations as the grant to relay with each write into it (version 9)."""
        return WriteGrant(self.offset, self.length, self.first_generation, self.generation_count, self.mac)


def decode_write_lease(body: bytes) -> WriteLease:
    r = BodyReader(body, "WRITE_LEASE reply")
    code = _code(r)
    if code != ResultCode.OK:
        r.done()
        return WriteLease(code)
    out = WriteLease(code, r.i64("lease id"), r.i64("epoch"), r.i64("master term"), r.i32("segment id"), r.i64("offset"),
                     r.i64("length"), r.i64("first generation"), r.i32("generation count"), r.i32("idle millis"),
                     r.fixed(GRANT_MAC_BYTES, "grant mac"))
    r.done()
    return out


def encode_commit(lease_id: int, upsert: bool, items: Sequence[tuple[bytes, int, int, int]]) -> bytes:
    """COMMIT: (key, offset, value length, generation) per object written in the lease, in order."""
    w = BodyWriter().i64(lease_id).boolean(upsert).i32(len(items))
    for key, offset, length, generation in items:
        w.bstr(key).i64(offset).i64(length).i64(generation)
    return w.bytes()


def encode_node_write_commit(lease_id: int, upsert: bool, segment_id: int, epoch: int, term: int,
                             items: Iterable[WriteItem]) -> bytes:
    """NODE_WRITE_COMMIT (version 17, section 4.41): the lease, upsert and the lease's segment id, then NODE_WRITE's
    body. The values follow as payload; the node commits what landed at its master for the writer."""
    head = BodyWriter().i64(lease_id).boolean(upsert).i32(segment_id).bytes()
    return head + encode_node_write(epoch, term, items)


def decode_node_write_commit_reply(body: bytes) -> tuple[bool, list[ResultCode], list[ResultCode]]:
    """NODE_WRITE_COMMIT reply: whether the node committed what landed (False: the writer sends the COMMIT), then
    per item the node's write code and the master's COMMIT code (FAILED unless the item landed and was committed)."""
    r = BodyReader(body, "NODE_WRITE_COMMIT reply")
    committed = r.boolean("committed")
    n = r.count("result count", 2)
    at = r._take(2 * n, "results")
    r.done()
    raw = bytes(r.data[at:at + 2 * n])
    if raw and max(raw) >= len(_CODES):
        raise ProtocolError(f"NODE_WRITE_COMMIT reply: unknown result code {max(raw)}")
    return committed, [_CODES[b] for b in raw[0::2]], [_CODES[b] for b in raw[1::2]]


def encode_release(lease_id: int) -> bytes:
    """RELEASE: the writer is done with the lease."""
    return BodyWriter().i64(lease_id).bytes()


def encode_shm_lease(epoch: int, term: int, offset: int, length: int, grant: WriteGrant) -> bytes:
    """NODE_SHM_LEASE: a same-machine writer sets [offset, offset + length) of its lease aside on the node.

    ``grant``: the lease's (:meth:`WriteLease.grant`). The objects copied there are then stamped by the writer
    (version 16, ``stamp``), or, when the reply says so, recorded with NODE_SHM_LEASE_WRITE, whose body is
    NODE_WRITE's (:func:`encode_node_write`) without payload.
    """
    w = BodyWriter().i64(epoch).i64(term).i64(offset).i64(length)
    grant.write(w)
    return w.bytes()


def decode_shm_lease_reply(body: bytes) -> tuple[ResultCode, bool]:
    """NODE_SHM_LEASE reply (version 16): the result-code list with one code, then whether the writer may stamp
    its objects in the range (true) or must record each with NODE_SHM_LEASE_WRITE (a node with
    ``--verify-writes``)."""
    r = BodyReader(body, "NODE_SHM_LEASE reply")
    n = r.i32("result count")
    if n != 1:
        raise ProtocolError(f"NODE_SHM_LEASE reply has {n} results, not 1")
    code = _code(r)
    stamps = r.boolean("stamps")
    r.done()
    return code, stamps
