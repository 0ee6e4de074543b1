"""The object layout in a segment (section 8): where a value starts after its header and key, and how much
of the segment an object takes."""

from __future__ import annotations

import struct


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
