"""Chained block hashes over fixed-size token blocks, in vLLM's ``sha256_cbor`` scheme, identical to
the Java side's ``io.kvpool.connector.hash.BlockHasher``, so Python and Java engines name the same
blocks the same way::

    root      = SHA-256( CBOR( seed string ) )                       vLLM: NONE_HASH from PYTHONHASHSEED
    hash[0]   = SHA-256( CBOR( [ root,      [t0 .. t15],  extra keys or null ] ) )
    hash[i]   = SHA-256( CBOR( [ hash[i-1], [t16i .. ],   extra keys or null ] ) )

This is vLLM's ``hash_block_tokens(sha256_cbor, parent, tokens, extra_keys)`` with
``init_none_hash(sha256_cbor)`` (``vllm/v1/core/kv_cache_utils.py``): ``NONE_HASH =
sha256_cbor(os.getenv("PYTHONHASHSEED"))``. Only full blocks are hashed; the tokens after the last
full block have no hash. Hashes are 32-byte ``bytes``.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Optional, Sequence, Union

from . import cbor

__all__ = ["BlockHasher", "sha256_cbor", "extra_keys_for", "DEFAULT_BLOCK_SIZE", "HASH_BYTES"]

#: vLLM's default block size on GPUs, and the reference engine's.
DEFAULT_BLOCK_SIZE = 16
#: Bytes of one block hash.
HASH_BYTES = 32

ExtraKeys = Optional[Sequence[Any]]
ExtraKeysArg = Union[None, Sequence[Any], Callable[[int], ExtraKeys]]


def sha256_cbor(value: Any) -> bytes:
    """vLLM's ``sha256_cbor``: SHA-256 of the canonical CBOR encoding of ``value``."""
    return hashlib.sha256(cbor.encode(value)).digest()


def extra_keys_for(extra_keys: ExtraKeys, cache_salt: Optional[str], block: int) -> Optional[list]:
    """The extra keys hashed with block ``block``: ``extra_keys``, plus the cache salt appended for
    block 0 only (vLLM's ``generate_block_hash_extra_keys``); ``None`` when there are none (an empty
    list hashes as ``None``, as in vLLM). Same as Java's ``ConnectorRequest.extraKeysFor``."""
    if cache_salt is None or block != 0:
        return None if not extra_keys else list(extra_keys)
    keys = list(extra_keys) if extra_keys else []
    keys.append(cache_salt)
    return keys


class BlockHasher:
    """Block size and hash seed; computes chained block hashes. Thread-safe (no shared state).

    Args:
        block_size: tokens per block, at least 1.
        seed: the hash seed (vLLM reads it from ``PYTHONHASHSEED``; engines sharing a pool must use
            the same one). ``None`` is refused: vLLM would use random bytes, so nothing would be shared.
    """

    __slots__ = ("block_size", "seed", "root")

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE, seed: str = "0") -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block size must be at least 1 token, got {block_size!r}")
        if seed is None:
            raise ValueError("hash seed must not be None (vLLM would use random bytes: no sharing)")
        if not isinstance(seed, str):
            raise TypeError(f"hash seed must be a str (PYTHONHASHSEED's text), got {type(seed).__name__}")
        self.block_size: int = block_size
        self.seed: str = seed
        #: The parent of the first block (vLLM's NONE_HASH).
        self.root: bytes = sha256_cbor(seed)

    def full_blocks(self, token_count: int) -> int:
        """Full blocks in ``token_count`` tokens."""
        return token_count // self.block_size

    def next(self, parent: bytes, tokens: Sequence[int], start: int, extra_keys: ExtraKeys = None) -> bytes:
        """The hash of the block of ``block_size`` tokens starting at ``tokens[start]``, under ``parent``."""
        bs = self.block_size
        if start < 0 or start + bs > len(tokens):
            raise ValueError(f"block at {start} runs past the {len(tokens)} tokens")
        out = bytearray(b"\x83")  # array of 3
        cbor.write(out, bytes(parent))
        cbor.head(out, 4, bs)
        block = tokens[start:start + bs]
        for t in block:
            cbor.integer(out, t if type(t) is int else int(t))
        cbor.write(out, None if extra_keys is None else list(extra_keys))
        return hashlib.sha256(out).digest()

    def hashes(self, tokens: Sequence[int], length: Optional[int] = None,
               extra_keys: ExtraKeysArg = None) -> list[bytes]:
        """The hashes of the full blocks among the first ``length`` tokens (default: all).

        ``extra_keys`` is ``None``, one list for every block, or a function of the block index
        returning a block's list (or ``None``)."""
        n_tokens = len(tokens) if length is None else length
        if n_tokens < 0 or n_tokens > len(tokens):
            raise ValueError(f"length {length} outside 0..{len(tokens)}")
        keys: Callable[[int], ExtraKeys]
        if callable(extra_keys):
            keys = extra_keys
        else:
            fixed = extra_keys
            keys = lambda b: fixed  # noqa: E731
        out: list[bytes] = []
        parent = self.root
        for b in range(n_tokens // self.block_size):
            parent = self.next(parent, tokens, b * self.block_size, keys(b))
            out.append(parent)
        return out

    def __repr__(self) -> str:
        return f"BlockHasher(block_size={self.block_size}, seed={self.seed!r})"
