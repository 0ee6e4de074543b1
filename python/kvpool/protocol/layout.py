"""The object layout in a segment (section 8): where a value starts after its header and key, and how much
of the segment an object takes."""

from __future__ import annotations

import struct

from ..crc import crc32c


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


#: key length u16, value length u64, generation u64, epoch u64, value CRC32C u32 (bytes 6..35).
_HEADER_FIELDS = struct.Struct("<HQQQI")
_MAGIC = struct.pack("<I", OBJECT_MAGIC)
#: magic, version and state COMPLETE (bytes 0..5) of a stamped header
_STAMPED_HEAD = _MAGIC + bytes((OBJECT_VERSION, OBJECT_STATE_COMPLETE))
#: header CRC32C u32, reserved u64 = 0 (bytes 36..47)
_HEADER_TAIL = struct.Struct("<IQ")


def object_header(key: bytes, value_length: int, generation: int, epoch: int, value_crc: int) -> bytes:
    """An object's header and key as section 8 lays them out, with the state COMPLETE: what a same-machine
    writer under a write lease stamps in its range (version 16, section 4.28; ``stamp``)."""
    fields = _HEADER_FIELDS.pack(len(key), value_length, generation, epoch, value_crc & 0xFFFFFFFF)
    return _STAMPED_HEAD + fields + _HEADER_TAIL.pack(crc32c(_MAGIC + fields + key), 0) + key


def stamp(view: memoryview, at: int, header: bytes) -> None:
    """Writes ``header`` (``object_header``) at offset ``at`` of a writable segment view: the state byte goes to
    WRITING first, then the rest, and COMPLETE last, so a node that reads COMPLETE there finds the whole header
    (the stores of one thread reach memory in program order on x86; the header's checksum and generation
    checks refuse a mix of old and new bytes elsewhere)."""
    view[at + 5] = OBJECT_STATE_WRITING
    view[at:at + 5] = header[:5]
    view[at + 6:at + len(header)] = header[6:]
    view[at + 5] = OBJECT_STATE_COMPLETE
