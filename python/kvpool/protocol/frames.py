"""The frame: the protocol version, the 32-byte header (section 2.1), the limits a frame is held to, and the
opcode, result-code and frame-status tables (sections 4.1, 3 and 2.3)."""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

from ..codec import ProtocolError


VERSION = 18
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
    NODE_WRITE_COMMIT = 0x8D  # version 17: a put over TCP whose node commits it (section 4.41)


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
