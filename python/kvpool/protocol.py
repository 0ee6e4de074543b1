"""kvpool's wire protocol, version 15, as docs/protocol.md draws it.

This module is the Python side of the contract: the 32-byte frame header, the body primitives, the
opcode, result-code and frame-status tables, and an encoder or decoder for every body the client
sends or receives. It does no I/O (``kvpool._net`` does). Every integer is little-endian. A decoder
reads with bounds checks and rejects trailing bytes, as the Java ``BodyReader`` does, so a reply that
drifts from the document fails loudly here instead of being misread.

Frame header (section 2.1)::

     0  magic u16 = 0x504B ("KP" on the wire) | version u8 = 15 | opcode u8
     4  flags u8 (bit 0 reply) | reserved u8 = 0 | status u16
     8  request id u64
    16  body length u32
    20  reserved u32 = 0
    24  payload length u64
    32  body, then payload
"""

from __future__ import annotations

import enum
import hashlib as _hashlib
import hmac as _hmac
import struct
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple, Sequence

from .codec import (  # noqa: F401 - the body primitives, re-exported: kvpool.protocol names them all
    MAX_KEY_BYTES, BodyReader, BodyWriter, ProtocolError, abbreviate, decode_error, encode_key,
    encode_keys_checked,
)

VERSION = 15
MAGIC = 0x504B
HEADER = struct.Struct("<HBBBBHQIIQ")
HEADER_BYTES = HEADER.size  # 32
FLAG_REPLY = 0x01

MAX_ERROR_MESSAGE_BYTES = 6003
DEFAULT_MAX_BODY_BYTES = 64 << 20
DEFAULT_MAX_PAYLOAD_BYTES = 1 << 30
#: The client splits longer key lists into several master frames (section 9).
MAX_KEYS_PER_FRAME = 16_384
#: The client splits node frames at this many items (section 9).
MAX_ITEMS_PER_NODE_FRAME = 4_096

ROLE_CLIENT = 0

#: PUT_START pin seconds (section 4.5): a pin that lasts until the object is removed or replaced.
PIN_FOREVER = -1
#: PUT_START reply flags of an OK result: the master granted the pin asked for.
PUT_FLAG_PINNED = 0x01

TIER_MEMORY = 0
TIER_DISK = 1

# The object layout in a segment (section 8).
OBJECT_ALIGNMENT = 64
OBJECT_MAGIC = 0x424F564B
OBJECT_VERSION = 1
OBJECT_STATE_DEAD = 0
OBJECT_STATE_WRITING = 1
OBJECT_STATE_COMPLETE = 2
OBJECT_KEY_OFFSET = 48
#: magic u32, version u8, state u8, key length u16, value length u64, generation u64 (bytes 0..23).
OBJECT_HEAD = struct.Struct("<IBBHQQ")


def align64(n: int) -> int:
    """``n`` rounded up to a multiple of 64."""
    return (n + 63) & ~63


def value_offset(key_length: int) -> int:
    """Offset of the value from the start of its region: ``align64(48 + key length)``."""
    return align64(OBJECT_KEY_OFFSET + key_length)


def region_length(key_length: int, value_length: int) -> int:
    """Bytes an object takes in its segment: its value offset plus the value rounded up to 64."""
    return value_offset(key_length) + align64(value_length)


class Opcode(enum.IntEnum):
    """Operation codes (section 4.1). The master serves 0x01..0x7F, nodes 0x80..0xFF."""

    HELLO = 0x01
    PING = 0x02
    LEASE = 0x03
    AUTH_BEGIN = 0x04
    AUTH_PROVE = 0x05
    PUT_START = 0x10
    BATCH_PUT_START = 0x11
    PUT_END = 0x12
    BATCH_PUT_END = 0x13
    PUT_REVOKE = 0x14
    BATCH_PUT_REVOKE = 0x15
    WRITE_LEASE = 0x16
    COMMIT = 0x17
    RELEASE = 0x18
    GET_REPLICA_LIST = 0x20
    BATCH_GET_REPLICA_LIST = 0x21
    EXIST_KEY = 0x22
    BATCH_EXIST_KEY = 0x23
    PREFIX_MATCH = 0x24
    OBJECT_SIZE = 0x25
    PREFIX_MATCH_DIGEST = 0x26
    BATCH_EXIST_DIGEST = 0x27
    TIER_LOOKUP = 0x28  # version 13: the tier of each key (section 4.38)
    BLOCK_INFO = 0x29  # version 14: what the engine knows of blocks, for the KV events (section 4.39)
    REMOVE = 0x30
    BATCH_REMOVE = 0x31
    REMOVE_BY_PREFIX = 0x32
    REMOVE_ALL = 0x33
    CLUSTER_STATS = 0x40
    NODE_WRITE = 0x80
    NODE_READ = 0x81
    NODE_SHM_WRITE_BEGIN = 0x84
    NODE_SHM_WRITE_END = 0x85
    NODE_SHM_LEASE = 0x86
    NODE_SHM_LEASE_WRITE = 0x87
    NODE_READ_RANGE = 0x89  # version 11: ranges of values (section 4.34)
    NODE_PART_BEGIN = 0x8A  # version 11: writes in parts (section 4.35)
    NODE_PART_WRITE = 0x8B
    NODE_PART_END = 0x8C


class ResultCode(enum.IntEnum):
    """Per-item outcomes inside an OK reply (section 5.1): values, not errors."""

    OK = 0
    NOT_FOUND = 1
    ALREADY_EXISTS = 2
    POOL_FULL = 3
    FENCED = 4
    EXPIRED = 5
    NO_SEGMENT = 6  # from a node (version 12): it takes no writes while it registers or drains
    FAILED = 7
    TOO_LARGE = 8
    DEPOSED = 9  # a node refused a write authorised by a master that is no longer the leader (version 6)
    QUOTA_EXCEEDED = 10  # version 14: the key's tenant is at its memory quota (section 5.1)


class FrameStatus(enum.IntEnum):
    """Whole-frame outcomes in a reply header (section 5.2)."""

    OK = 0
    MALFORMED_FRAME = 1
    UNSUPPORTED_VERSION = 2
    UNKNOWN_OPCODE = 3
    FRAME_TOO_LARGE = 4
    BAD_REQUEST = 5
    INTERNAL_ERROR = 6
    UNAUTHORIZED = 7




# ------------------------------------------------------------------------------------------- header


class Header(NamedTuple):
    """A decoded frame header (a tuple: made for every reply, cheaper than a frozen dataclass)."""

    version: int
    opcode: int
    flags: int
    status: int
    request_id: int
    body_length: int
    payload_length: int


def encode_header(opcode: int, request_id: int, body_length: int, payload_length: int = 0,
                  *, flags: int = 0, status: int = 0, version: int = VERSION) -> bytes:
    """The 32 header bytes of a frame."""
    return HEADER.pack(MAGIC, version, opcode, flags, 0, status, request_id, body_length, 0, payload_length)


def decode_header(data: bytes | bytearray | memoryview) -> Header:
    """Decodes and checks a header; raises ProtocolError naming the field that is wrong.

    A version other than this client's is reported as such (before any other field is trusted), so a
    client talking to a master of another release gets a message that says so.
    """
    if len(data) < HEADER_BYTES:
        raise ProtocolError(f"a frame header has {HEADER_BYTES} bytes, got {len(data)}")
    magic, version, opcode, flags, reserved, status, rid, body_len, reserved2, payload_len = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic 0x{magic:04x} (expected 0x{MAGIC:04x}): the peer is not a kvpool server")
    if version != VERSION:
        raise ProtocolError(f"the peer speaks kvpool protocol version {version}; this client speaks version "
                            f"{VERSION} (client and servers must be of the same release)")
    if flags & ~FLAG_REPLY or reserved or reserved2:
        raise ProtocolError(f"malformed header: flags 0x{flags:02x}, reserved {reserved}/{reserved2}")
    if body_len >= 1 << 31 or payload_len >= 1 << 63:
        raise ProtocolError(f"implausible lengths in header: body {body_len}, payload {payload_len}")
    return Header(version, opcode, flags, status, rid, body_len, payload_len)


# ------------------------------------------------------------------------------- master messages


@dataclass(frozen=True, slots=True)
class HelloReply:
    incarnation: int
    epoch: int
    max_key_bytes: int
    max_value_bytes: int
    default_replicas: int
    term: int = 0


def encode_hello(client_id: tuple[int, int], host: str, pid: int) -> bytes:
    """HELLO (section 4.3) from a client: role, 128-bit id, own host, process id."""
    return (BodyWriter().u8(ROLE_CLIENT).i64(client_id[0]).i64(client_id[1]).string(host).i64(pid)).bytes()


def decode_hello_reply(body: bytes) -> HelloReply:
    r = BodyReader(body, "HELLO reply")
    out = HelloReply(r.i64("master incarnation"), r.i64("cluster epoch"), r.i32("max key bytes"),
                     r.i64("max value bytes"), r.u8("default replicas"), r.i64("master term"))
    r.done()
    return out


def encode_ping(client_id: tuple[int, int]) -> bytes:
    return BodyWriter().i64(client_id[0]).i64(client_id[1]).bytes()


def decode_i64(body: bytes, what: str) -> int:
    r = BodyReader(body, what)
    v = r.i64(what)
    r.done()
    return v


def decode_i32(body: bytes, what: str) -> int:
    r = BodyReader(body, what)
    v = r.i32(what)
    r.done()
    return v


@dataclass(frozen=True, slots=True)
class Replica:
    """One copy of an object: segment id, tier and region offset."""

    segment_id: int
    tier: int
    offset: int


def _replica(r: BodyReader) -> Replica:
    seg = r.i32("segment id")
    tier = r.u8("tier")
    if tier not in (TIER_MEMORY, TIER_DISK):
        raise ProtocolError(f"{r.what}: unknown tier {tier}")
    return Replica(seg, tier, r.i64("region offset"))


def _replicas(r: BodyReader) -> tuple[Replica, ...]:
    return tuple(_replica(r) for _ in range(r.u8("replica count")))


#: A write grant's MAC (section 4.32): the first 16 bytes of an HMAC-SHA256 only master and nodes can make.
GRANT_MAC_BYTES = 16


@dataclass(frozen=True, slots=True)
class WriteGrant:
    """The master's permission to write ``[offset, offset + length)`` of one segment under the
    generations ``[first_generation, first_generation + generation_count)`` (version 9, section 4.32).

    The client relays it unchanged with each write; a node serving a connection that proved only the
    cluster secret writes nothing a grant does not cover.
    """

    offset: int
    length: int
    first_generation: int
    generation_count: int
    mac: bytes

    def write(self, w: BodyWriter) -> None:
        w.i64(self.offset).i64(self.length).i64(self.first_generation).i32(self.generation_count).fixed(self.mac)

    @staticmethod
    def read(r: BodyReader) -> WriteGrant:
        return WriteGrant(r.i64("grant offset"), r.i64("grant length"), r.i64("grant first generation"),
                          r.i32("grant generation count"), r.fixed(GRANT_MAC_BYTES, "grant mac"))


#: No grant: for a writer that proved the admin secret, or an open pool.
NO_GRANT = WriteGrant(0, 0, 0, 0, bytes(GRANT_MAC_BYTES))


def _code(r: BodyReader) -> ResultCode:
    v = r.u8("result code")
    try:
        return ResultCode(v)
    except ValueError:
        raise ProtocolError(f"{r.what}: unknown result code {v}") from None


def encode_put_start(upsert: bool, replicas: int, preferred: str, items: Sequence[tuple[bytes, int]],
                     pin_seconds: int = 0) -> bytes:
    """PUT_START (section 4.5): items are (key, value length); no generation condition. ``pin_seconds``:
    0 no pin, a positive count of seconds, or ``PIN_FOREVER``."""
    if not PIN_FOREVER <= pin_seconds <= 0x7FFFFFFF:
        raise ValueError(f"pin_seconds must be 0 (none), 1..{0x7FFFFFFF} or PIN_FOREVER (-1), got {pin_seconds}")
    w = BodyWriter().boolean(upsert).u8(replicas).string(preferred).i32(pin_seconds).i32(len(items))
    for k, length in items:
        w.bstr(k).i64(length).i64(0)
    return w.bytes()


@dataclass(frozen=True, slots=True)
class PutStartResult:
    code: ResultCode
    generation: int = 0
    replicas: tuple[Replica, ...] = ()
    pinned: bool = False
    """The master granted the pin the put asked for."""
    macs: tuple[bytes, ...] = ()
    """Per replica, the MAC of its write grant (version 9)."""

    def grant(self, i: int, region_bytes: int) -> WriteGrant:
        """Replica ``i``'s grant: its region of ``region_bytes`` (:func:`region_length`) and this generation."""
        return WriteGrant(self.replicas[i].offset, region_bytes, self.generation, 1, self.macs[i])


def decode_put_start_reply(body: bytes) -> tuple[int, int, list[PutStartResult]]:
    """(epoch and master term of the reservations, one result per item); node writes carry both."""
    r = BodyReader(body, "PUT_START reply")
    epoch = r.i64("epoch")
    term = r.i64("master term")
    out = []
    for _ in range(r.count("result count", 1)):
        code = _code(r)
        if code == ResultCode.OK:
            gen = r.i64("generation")
            flags = r.u8("flags")
            reps, macs = [], []
            for _ in range(r.u8("replica count")):
                reps.append(_replica(r))
                macs.append(r.fixed(GRANT_MAC_BYTES, "grant mac"))
            out.append(PutStartResult(code, gen, tuple(reps), bool(flags & PUT_FLAG_PINNED), tuple(macs)))
        else:
            out.append(PutStartResult(code))
    r.done()
    return epoch, term, out


def encode_put_end(items: Sequence[tuple[bytes, int, int]]) -> bytes:
    """PUT_END / PUT_REVOKE (sections 4.6, 4.7): items are (key, generation, failed-replica mask)."""
    w = BodyWriter().i32(len(items))
    for k, gen, mask in items:
        w.bstr(k).i64(gen).i64(mask)
    return w.bytes()


_CODES = list(ResultCode)


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


def encode_release(lease_id: int) -> bytes:
    """RELEASE: the writer is done with the lease."""
    return BodyWriter().i64(lease_id).bytes()


def encode_shm_lease(epoch: int, term: int, offset: int, length: int, grant: WriteGrant) -> bytes:
    """NODE_SHM_LEASE: a same-machine writer sets [offset, offset + length) of its lease aside on the node.

    ``grant``: the lease's (:meth:`WriteLease.grant`). The objects copied there are then recorded with
    NODE_SHM_LEASE_WRITE, whose body is NODE_WRITE's (:func:`encode_node_write`) without payload.
    """
    w = BodyWriter().i64(epoch).i64(term).i64(offset).i64(length)
    grant.write(w)
    return w.bytes()


def decode_codes(body: bytes, what: str) -> list[ResultCode]:
    """A result-code list: i32 count, one u8 per item."""
    raw = _byte_items(body, what, "result count")
    if raw and max(raw) >= len(_CODES):
        raise ProtocolError(f"{what}: unknown result code {max(raw)}")
    return [_CODES[b] for b in raw]


def _byte_items(body: bytes, what: str, count: str) -> bytes:
    """The items of a list of one-byte items (i32 count, then the bytes), checked (by the reader, for its
    message, when the count does not match the body)."""
    if len(body) < 4 or len(body) != 4 + int.from_bytes(body[:4], "little", signed=True):
        r = BodyReader(body, what)
        r._take(r.count(count, 1), "items")
        r.done()
    return body[4:]


def encode_keys(keys: Sequence[bytes]) -> bytes:
    return BodyWriter().keys(keys).bytes()


@dataclass(frozen=True, slots=True)
class ReplicaList:
    """Where one object lives (GET_REPLICA_LIST, section 4.8)."""

    code: ResultCode
    value_length: int = 0
    generation: int = 0
    replicas: tuple[Replica, ...] = ()


def decode_replica_lists(body: bytes) -> list[ReplicaList]:
    r = BodyReader(body, "GET_REPLICA_LIST reply")
    out = []
    for _ in range(r.count("result count", 1)):
        code = _code(r)
        if code == ResultCode.OK:
            length = r.i64("value length")
            if length < 0:
                raise ProtocolError("GET_REPLICA_LIST reply: value length is negative")
            out.append(ReplicaList(code, length, r.i64("generation"), _replicas(r)))
        else:
            out.append(ReplicaList(code))
    r.done()
    return out


def decode_flags(body: bytes, what: str) -> list[bool]:
    raw = _byte_items(body, what, "flag count")
    if raw and max(raw) > 1:
        raise ProtocolError(f"{what}: flag must be 0 or 1, got {max(raw)}")
    return list(map(bool, raw))


def decode_tier_codes(body: bytes) -> bytes:
    """TIER_LOOKUP's reply: a code per key (0 absent, 1 a copy in memory, 2 on the SSD tier only)."""
    raw = _byte_items(body, "TIER_LOOKUP reply", "tier count")
    if raw and max(raw) > 2:
        raise ProtocolError(f"TIER_LOOKUP reply: tier code must be 0, 1 or 2, got {max(raw)}")
    return bytes(raw)


def decode_sizes(body: bytes) -> list[int]:
    r = BodyReader(body, "OBJECT_SIZE reply")
    out = [r.i64("value length") for _ in range(r.count("size count", 8))]
    r.done()
    return out


def decode_removed(body: bytes, what: str) -> tuple[int, int]:
    """(objects removed, cluster epoch afterwards) of REMOVE_BY_PREFIX / REMOVE_ALL."""
    r = BodyReader(body, what)
    out = (r.i64("objects removed"), r.i64("cluster epoch"))
    r.done()
    return out


TIER_STAT_NAMES = (
    "memory_bytes_read", "memory_bytes_written", "memory_objects_read", "disk_capacity", "disk_used",
    "disk_objects", "disk_hits", "disk_bytes_read", "disk_bytes_written", "disk_spill_queue_bytes",
    "disk_spills_dropped", "disk_evicted", "disk_promoted", "disk_checksum_failures",
)


@dataclass(frozen=True, slots=True)
class SegmentStats:
    """One registered segment, as CLUSTER_STATS lists it (section 4.15)."""

    id: int
    name: str
    host: str
    port: int
    capacity: int
    used: int
    objects: int
    active: bool
    heartbeat_age_ms: int
    shm_path: str
    tiers: dict[str, int] = field(default_factory=dict)
    #: version 12: its node stops for a restart (nothing new is placed on it; what it holds is still listed)
    draining: bool = False

    @property
    def state(self) -> str:
        """joining (listing its objects), active, or draining."""
        return "draining" if self.draining else "active" if self.active else "joining"


#: CLUSTER_STATS segment states (section 4.15)
SEGMENT_JOINING, SEGMENT_ACTIVE, SEGMENT_DRAINING = 0, 1, 2


@dataclass(frozen=True, slots=True)
class PoolStats:
    """A snapshot of the cluster (CLUSTER_STATS)."""

    incarnation: int
    epoch: int
    keys: int
    pending_puts: int
    allocated_bytes: int
    capacity_bytes: int
    active_clients: int
    segments: list[SegmentStats]


def decode_cluster_stats(body: bytes) -> PoolStats:
    r = BodyReader(body, "CLUSTER_STATS reply")
    head = [r.i64(f) for f in ("incarnation", "epoch", "objects", "puts in flight", "allocated", "capacity")]
    clients = r.i32("active clients")
    segs = []
    for _ in range(r.count("segment count", 40)):
        sid = r.i32("segment id")
        name = r.string("name")
        host = r.string("host")
        port = r.i32("port")
        cap, used, regions = r.i64("capacity"), r.i64("used"), r.i64("regions")
        state = r.u8("state")
        age = r.i64("heartbeat age")
        shm = r.string("shm path")
        tiers = {n: r.i64(n) for n in TIER_STAT_NAMES}
        if state not in (SEGMENT_JOINING, SEGMENT_ACTIVE, SEGMENT_DRAINING):
            raise ProtocolError(f"CLUSTER_STATS reply: segment {name} has unknown state {state}")
        segs.append(SegmentStats(sid, name, host, port, cap, used, regions, state == SEGMENT_ACTIVE, age, shm, tiers,
                                 state == SEGMENT_DRAINING))
    r.done()
    return PoolStats(head[0], head[1], head[2], head[3], head[4], head[5], clients, segs)


# ------------------------------------------------------------------------------------ key digests

from .digests import DIGEST_BYTES, encode_digests, key_digest  # noqa: E402,F401  (kvpool.digests; named here too)


# --------------------------------------------------------------------------------- node messages


class WriteItem(NamedTuple):
    """One object of a NODE_WRITE / NODE_SHM_WRITE_BEGIN (section 4.19); a tuple, made per object written."""

    offset: int
    generation: int
    key: bytes
    length: int
    crc: int
    grant: WriteGrant
    """The master's grant covering this write (version 9), relayed unchanged."""


def encode_node_write(epoch: int, term: int, items: Iterable[WriteItem]) -> bytes:
    """NODE_WRITE / NODE_SHM_WRITE_BEGIN / NODE_SHM_LEASE_WRITE: the reservation's epoch and master term, then the items."""
    items = list(items)
    w = BodyWriter().i64(epoch).i64(term).i32(len(items))
    for it in items:
        w.i64(it.offset).i64(it.generation).bstr(it.key).i64(it.length)
        w.buf += struct.pack("<I", it.crc & 0xFFFFFFFF)
        it.grant.write(w)
    return w.bytes()


def encode_shm_write_end(items: Iterable[tuple[int, int, bool]]) -> bytes:
    """NODE_SHM_WRITE_END (section 4.23): (region offset, generation, copied)."""
    items = list(items)
    w = BodyWriter().i32(len(items))
    for off, gen, copied in items:
        w.i64(off).i64(gen).boolean(copied)
    return w.bytes()


_READ_ITEM = struct.Struct("<qqqB")


def encode_node_read(items: Sequence[tuple[int, int, int, int]]) -> bytes:
    """NODE_READ (section 4.20): (region offset, generation, value length, tier), 25 bytes each."""
    out = bytearray(struct.pack("<i", len(items)))
    for it in items:
        out += _READ_ITEM.pack(*it)
    return bytes(out)


_RANGE_ITEM = struct.Struct("<qqqBqq")
_PART_ITEM = struct.Struct("<qqqq")
_PART_END_ITEM = struct.Struct("<qqI?")


def encode_node_read_range(items: Sequence[tuple[int, int, int, int, int, int]]) -> bytes:
    """NODE_READ_RANGE (version 11, section 4.34): (region offset, generation, value length, tier, range
    offset, range length), 41 bytes each; the reply is NODE_READ's, its payload the OK items' ranges."""
    out = bytearray(struct.pack("<i", len(items)))
    for it in items:
        out += _RANGE_ITEM.pack(*it)
    return bytes(out)


def encode_part_write(items: Sequence[tuple[int, int, int, int]]) -> bytes:
    """NODE_PART_WRITE (version 11, section 4.35): (region offset, generation, range offset, range length),
    32 bytes each; the payload is the parts in item order. NODE_PART_BEGIN's body is NODE_WRITE's
    (:func:`encode_node_write`, checksums 0)."""
    out = bytearray(struct.pack("<i", len(items)))
    for it in items:
        out += _PART_ITEM.pack(*it)
    return bytes(out)


def encode_part_end(items: Sequence[tuple[int, int, int, bool]]) -> bytes:
    """NODE_PART_END (version 11, section 4.35): (region offset, generation, value CRC32C, complete), 21 bytes
    each."""
    out = bytearray(struct.pack("<i", len(items)))
    for off, gen, crc, complete in items:
        out += _PART_END_ITEM.pack(off, gen, crc & 0xFFFFFFFF, complete)
    return bytes(out)


# ------------------------------------------------------------------------- authentication (version 8)
# Section 4.31: AUTH_BEGIN / AUTH_PROVE, a mutual HMAC-SHA256 challenge-response at connect.

AUTH_NONCE_BYTES = 32
AUTH_MODE_OPEN = 0
AUTH_MODE_SECURED = 1
ACCESS_DATA = 1
ACCESS_ADMIN = 2
_SERVER_LABEL = b"kvpool auth v8 server\x00"
_CLIENT_LABEL = b"kvpool auth v8 client\x00"


def server_proof(cluster_key: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    """The server's proof that it knows the cluster secret."""
    return _hmac.new(cluster_key, _SERVER_LABEL + client_nonce + server_nonce, _hashlib.sha256).digest()


def client_proof(key: bytes, level: int, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """The client's proof that it knows the secret of ``level`` (1 cluster, 2 admin)."""
    return _hmac.new(key, _CLIENT_LABEL + bytes([level]) + server_nonce + client_nonce, _hashlib.sha256).digest()


def encode_auth_begin(client_nonce: bytes) -> bytes:
    return BodyWriter().bstr(client_nonce).bytes()


def decode_auth_begin_reply(body: bytes) -> tuple[int, bytes, bytes]:
    """(mode, server nonce, server proof)."""
    r = BodyReader(body, "AUTH_BEGIN reply")
    mode = r.u8("mode")
    nonce = r.bstr("server nonce")
    proof = r.bstr("server proof")
    r.done()
    return mode, nonce, proof


def encode_auth_prove(level: int, proof: bytes) -> bytes:
    return BodyWriter().u8(level).bstr(proof).bytes()


def decode_auth_prove_reply(body: bytes) -> int:
    r = BodyReader(body, "AUTH_PROVE reply")
    level = r.u8("granted level")
    r.done()
    return level
