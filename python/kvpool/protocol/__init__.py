"""kvpool's wire protocol, version 18, as docs/protocol.md draws it.

This package is the Python side of the contract: the 32-byte frame header, the body primitives, the
opcode, result-code and frame-status tables, and an encoder or decoder for every body the client
sends or receives. It does no I/O (``kvpool._net`` does). Every integer is little-endian. A decoder
reads with bounds checks and rejects trailing bytes, as the Java ``BodyReader`` does, so a reply that
drifts from the document fails loudly here instead of being misread.

Frame header (section 2.1)::

     0  magic u16 = 0x504B ("KP" on the wire) | version u8 = 18 | opcode u8
     4  flags u8 (bit 0 reply) | reserved u8 = 0 | status u16
     8  request id u64
    16  body length u32
    20  reserved u32 = 0
    24  payload length u64
    32  body, then payload
"""

from __future__ import annotations

from ..codec import (  # noqa: F401 - the body primitives, re-exported: kvpool.protocol names them all
    MAX_KEY_BYTES, BodyReader, BodyWriter, ProtocolError, abbreviate, decode_error, encode_key,
    encode_keys_checked,
)
from ..digests import DIGEST_BYTES, encode_digests, key_digest  # noqa: F401 - kvpool.digests; named here too
from .frames import (  # noqa: F401
    VERSION, MAGIC, HEADER, HEADER_BYTES, FLAG_REPLY, MAX_ERROR_MESSAGE_BYTES, DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_PAYLOAD_BYTES, MAX_KEYS_PER_FRAME, MAX_ITEMS_PER_NODE_FRAME, ROLE_CLIENT, PIN_FOREVER,
    PUT_FLAG_PINNED, TIER_MEMORY, TIER_DISK, Opcode, ResultCode, FrameStatus, Header, encode_header, decode_header,
)
from .layout import (  # noqa: F401
    OBJECT_ALIGNMENT, OBJECT_MAGIC, OBJECT_VERSION, OBJECT_STATE_DEAD, OBJECT_STATE_WRITING, OBJECT_STATE_COMPLETE,
    OBJECT_KEY_OFFSET, OBJECT_HEAD, align64, value_offset, region_length, object_header, stamp,
)
from .master import (  # noqa: F401
    HelloReply, encode_hello, decode_hello_reply, encode_ping, decode_i64, decode_i32, Replica, GRANT_MAC_BYTES,
    WriteGrant, NO_GRANT, encode_put_start, PutStartResult, decode_put_start_reply, encode_put_end, decode_codes,
    encode_keys, ReplicaList, decode_replica_lists, decode_flags, decode_tier_codes, decode_sizes, decode_removed,
    TIER_STAT_NAMES, SegmentStats, PoolStats, decode_cluster_stats,
)
from .node import (  # noqa: F401
    WriteItem, encode_node_write, encode_shm_write_end, encode_node_read, encode_node_read_range, encode_part_write,
    encode_part_end,
)
from .leases import (  # noqa: F401
    LEASE_FLAG_END, LEASE_FLAG_RESYNC, INVALIDATE_KEYS, INVALIDATE_PREFIX, INVALIDATE_ALL, encode_lease,
    Invalidation, LeaseReply, decode_lease_reply, encode_write_lease, WriteLease, decode_write_lease, encode_commit,
    encode_release, encode_shm_lease, decode_shm_lease_reply, encode_node_write_commit, decode_node_write_commit_reply,
)
from .auth import (  # noqa: F401
    AUTH_NONCE_BYTES, AUTH_MODE_OPEN, AUTH_MODE_SECURED, ACCESS_DATA, ACCESS_ADMIN, server_proof, client_proof,
    encode_auth_begin, decode_auth_begin_reply, encode_auth_prove, decode_auth_prove_reply,
)
