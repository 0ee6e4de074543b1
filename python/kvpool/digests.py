"""Key digests ("KD1", docs/protocol.md section 4.26): the 128-bit digest of a key that the lookups by digest
(PREFIX_MATCH_DIGEST, BATCH_EXIST_DIGEST) send instead of the key. ``kvpool.protocol`` re-exports these names."""

from __future__ import annotations

import struct
from typing import Sequence

__all__ = ["DIGEST_BYTES", "key_digest", "encode_digests"]

_M64 = (1 << 64) - 1
_KD_P1 = 0x9E3779B185EBCA87
_KD_P2 = 0xC2B2AE3D27D4EB4F
_KD_P3 = 0x165667B19E3779F9
_KD_P4 = 0x85EBCA77C2B2AE63
DIGEST_BYTES = 16


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _fmix(x: int) -> int:
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & _M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & _M64
    return x ^ (x >> 33)


def key_digest(key: bytes) -> tuple[int, int]:
    """The 128-bit digest of a key ("KD1", docs/protocol.md section 4.26) as unsigned (lo, hi).

    Pure Python and slow (microseconds a key): the lookups by digest are the Java client's; this
    client sends keys (PREFIX_MATCH, BATCH_EXIST_KEY), which is faster than digesting them here. It
    exists so that the function is specified twice, and the tests hold both to the same values.
    """
    n = len(key)
    a = (_KD_P3 + n * _KD_P1) & _M64
    c = (_KD_P4 + n * _KD_P2) & _M64
    full = n - n % 8
    for i in range(0, full, 8):
        w = int.from_bytes(key[i:i + 8], "little")
        a = (_rotl(a ^ ((w * _KD_P2) & _M64), 31) * _KD_P1) & _M64
        c = (_rotl(c ^ ((w * _KD_P1) & _M64), 27) * _KD_P2) & _M64
    if full < n:
        w = int.from_bytes(key[full:], "little")
        a = (_rotl(a ^ ((w * _KD_P3) & _M64), 23) * _KD_P2) & _M64
        c = (_rotl(c ^ ((w * _KD_P4) & _M64), 29) * _KD_P1) & _M64
    return _fmix((a + c) & _M64), _fmix(c ^ _rotl(a, 17))


def encode_digests(digests: Sequence[tuple[int, int]]) -> bytes:
    """The body of PREFIX_MATCH_DIGEST / BATCH_EXIST_DIGEST: i32 count, then (lo, hi) as u64 each."""
    out = bytearray(struct.pack("<i", len(digests)))
    for lo, hi in digests:
        out += struct.pack("<QQ", lo, hi)
    return bytes(out)
