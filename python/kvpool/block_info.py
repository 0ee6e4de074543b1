"""What an engine knows of a block and the pool does not (BLOCK_INFO, docs/protocol.md section 4.39): its tokens,
the block size, the hash of the block before it, its LoRA and its cache salt. A connector sends it for the keys it is
about to save (``Client.describe_blocks``); the master's KV events for routers then carry it in each key's
``BlockStored``, as the engine's own events would. Routers such as Dynamo's and llm-d's hash the tokens themselves,
so a store event without them tells them nothing. The Java client's ``io.kvpool.protocol.BlockInfo`` is the same.

A connector key is a chained hash of the tokens up to its block, so a key's info never changes: the master keeps
infos past their objects (bounded, ``--kv-events-info-bytes``) and never tells a router anything stale.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

from .codec import BodyReader, BodyWriter, ProtocolError, encode_key, signed64

__all__ = ["BlockInfo", "router_block_hash", "encode_block_infos", "decode_kept", "MAX_TOKENS", "MAX_NAME_BYTES"]

#: The most tokens one block's info may carry (and the largest block size).
MAX_TOKENS = 65_536
#: The longest LoRA name or cache salt, in UTF-8 bytes.
MAX_NAME_BYTES = 1024
#: Hex digits of an engine's 32-byte block hash at the end of a connector key.
_HASH_HEX = 64
_HEX = frozenset(b"0123456789abcdefABCDEF")

_PARENT, _LORA_ID, _LORA_NAME, _CACHE_SALT = 1, 2, 4, 8


@dataclass(frozen=True)
class BlockInfo:
    """The block saved under ``key``: ``token_ids`` (at most :data:`MAX_TOKENS`, non-negative), ``block_size``
    tokens per block, ``parent_block_hash`` the block before's hash as routers are told it
    (:func:`router_block_hash` of its key; None for a first block), vLLM's deprecated ``lora_id``, the
    ``lora_name`` and the request's ``cache_salt`` (each None when there is none)."""

    key: str
    token_ids: Sequence[int]
    block_size: int
    parent_block_hash: int | None = None
    lora_id: int | None = None
    lora_name: str | None = None
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.block_size <= MAX_TOKENS:
            raise ValueError(f"block info for {self.key!r}: block size {self.block_size} is outside 1..{MAX_TOKENS}")
        if len(self.token_ids) > MAX_TOKENS:
            raise ValueError(f"block info for {self.key!r}: {len(self.token_ids)} tokens are more than {MAX_TOKENS}")
        if self.token_ids and (min(self.token_ids) < 0 or max(self.token_ids) > 0x7FFFFFFF):
            raise ValueError(f"block info for {self.key!r}: token ids must be in 0..2**31-1")
        if self.parent_block_hash is not None and not 0 <= self.parent_block_hash < 1 << 64:
            raise ValueError(f"block info for {self.key!r}: parent block hash must be an unsigned 64-bit int")
        if self.lora_id is not None and not -(1 << 63) <= self.lora_id < 1 << 63:
            raise ValueError(f"block info for {self.key!r}: LoRA id must fit 64 bits")
        for name in (self.lora_name, self.cache_salt):
            if name is not None and len(name.encode("utf-8")) > MAX_NAME_BYTES:
                raise ValueError(f"block info for {self.key!r}: a LoRA name or cache salt of more than "
                                 f"{MAX_NAME_BYTES} bytes")


def router_block_hash(key: str | bytes) -> int:
    """The block hash the master's KV events give for ``key`` (docs/operations.md, "KV events for routers"): for a
    connector key, whose last ``/`` part is the engine's 32-byte block hash in hex, vLLM's int form of it (its low
    64 bits); for any other key the same form of the key's SHA-256. The ``parent_block_hash`` of a block's info is
    this of its parent's key."""
    kb = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    last = kb.rsplit(b"/", 1)[-1]
    if len(last) == _HASH_HEX and all(c in _HEX for c in last):
        return int(last[-16:], 16)
    return _sha(kb)


def _sha(kb: bytes) -> int:
    return int.from_bytes(hashlib.sha256(kb).digest()[-8:], "big")


def encode_block_infos(infos: Sequence[BlockInfo]) -> bytes:
    """BLOCK_INFO's request body (section 4.39), byte for byte what the Java ``BlockInfoList`` writes."""
    w = BodyWriter().i32(len(infos))
    for b in infos:
        w.bstr(encode_key(b.key))
        w.u8((_PARENT if b.parent_block_hash is not None else 0) | (_LORA_ID if b.lora_id is not None else 0)
             | (_LORA_NAME if b.lora_name is not None else 0) | (_CACHE_SALT if b.cache_salt is not None else 0))
        if b.parent_block_hash is not None:
            w.i64(signed64(b.parent_block_hash))
        w.i32(b.block_size).i32(len(b.token_ids))
        for t in b.token_ids:
            w.i32(t)
        if b.lora_id is not None:
            w.i64(b.lora_id)
        if b.lora_name is not None:
            w.string(b.lora_name)
        if b.cache_salt is not None:
            w.string(b.cache_salt)
    return w.bytes()


def decode_kept(body: bytes) -> int:
    """BLOCK_INFO's reply: how many infos the master kept (0 with its KV events off)."""
    r = BodyReader(body, "BLOCK_INFO reply")
    n = r.i32("kept count")
    r.done()
    if n < 0:
        raise ProtocolError(f"BLOCK_INFO reply: kept count {n} is negative")
    return n
