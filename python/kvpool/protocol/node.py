"""The bodies the client sends to nodes (sections 4.17 to 4.24): writes, reads, ranges and parts."""

from __future__ import annotations

import struct
from typing import Iterable, NamedTuple, Sequence

from ..codec import BodyWriter
from .master import WriteGrant


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


#: an item's region offset i64, generation i64, key length u16 (then the key)
_ITEM_HEAD = struct.Struct("<qqH")
#: an item's value length i64, value CRC32C u32 (then its grant)
_ITEM_TAIL = struct.Struct("<qI")
#: a grant's offset i64, length i64, first generation i64, generation count i32 (then its MAC)
_GRANT = struct.Struct("<qqqi")


def encode_node_write(epoch: int, term: int, items: Iterable[WriteItem]) -> bytes:
    """NODE_WRITE / NODE_SHM_WRITE_BEGIN / NODE_SHM_LEASE_WRITE: the reservation's epoch and master term, then the items
    (packed a few fields at a time, and a grant the items share once: a batch's items all carry their lease's)."""
    items = list(items)
    buf = bytearray(struct.pack("<qqi", epoch, term, len(items)))
    grant: WriteGrant | None = None
    grant_bytes = b""
    for it in items:
        if len(it.key) > 0xFFFF:
            raise ValueError(f"byte string of {len(it.key)} bytes exceeds 65535")
        if it.grant is not grant:
            grant = it.grant
            grant_bytes = _GRANT.pack(grant.offset, grant.length, grant.first_generation,
                                      grant.generation_count) + grant.mac
        buf += _ITEM_HEAD.pack(it.offset, it.generation, len(it.key))
        buf += it.key
        buf += _ITEM_TAIL.pack(it.length, it.crc & 0xFFFFFFFF)
        buf += grant_bytes
    return bytes(buf)


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
