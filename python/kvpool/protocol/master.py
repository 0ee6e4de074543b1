"""The bodies the client exchanges with the master (sections 4.2 to 4.16): hello and ping, puts, replica
lists, probes, removals and the cluster table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..codec import BodyReader, BodyWriter, ProtocolError
from .frames import PIN_FOREVER, PUT_FLAG_PINNED, ResultCode, ROLE_CLIENT, TIER_DISK, TIER_MEMORY
from .layout import region_length


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
