"""Canonical CBOR (RFC 8949, section 4.2.1 "core deterministic encoding") of the few value kinds
block hashing needs, byte for byte what ``cbor2.dumps(obj, canonical=True)`` writes for them and what
the Java side's ``io.kvpool.connector.hash.Cbor`` writes.

::

    initial byte: major type (3 bits) | additional info (5 bits)
    0 unsigned int   1 negative int (-1 - n)   2 byte string   3 text string (UTF-8)   4 array
    7 simple: 0xf4 false, 0xf5 true, 0xf6 null
    argument n (an int's value, a string's byte length, an array's element count), shortest form:
      n < 24      in the additional info itself
      n < 2**8    info 24, then 1 byte        n < 2**16   info 25, then 2 bytes (big-endian)
      n < 2**32   info 26, then 4 bytes       otherwise   info 27, then 8 bytes

Supported: ``None``, ``bool``, ``int`` in [-2**64, 2**64 - 1], ``bytes``/``bytearray``/``memoryview``,
``str``, and ``list``/``tuple`` of these (nested). Anything else (floats, dicts, bignums) raises
``TypeError`` or ``ValueError`` naming it, as the Java encoder refuses them: vLLM's extra keys are
strings, integers, bytes and tuples of those, and a float's canonical form is easy to get subtly
wrong. Integer-like objects with ``__index__`` (numpy integers) count as ints. Standard library only.
"""

from __future__ import annotations

import operator
from typing import Any

__all__ = ["encode", "write", "head", "integer"]

_MAX_ARG = (1 << 64) - 1


def head(out: bytearray, major: int, n: int) -> None:
    """Appends a major type and its argument ``n`` (0 <= n < 2**64) in the shortest form."""
    mt = major << 5
    if n < 24:
        out.append(mt | n)
    elif n < 0x100:
        out.append(mt | 24)
        out.append(n)
    elif n < 0x10000:
        out.append(mt | 25)
        out += n.to_bytes(2, "big")
    elif n < 0x100000000:
        out.append(mt | 26)
        out += n.to_bytes(4, "big")
    elif n <= _MAX_ARG:
        out.append(mt | 27)
        out += n.to_bytes(8, "big")
    else:
        raise ValueError(f"CBOR: argument {n} does not fit 64 bits")


def integer(out: bytearray, v: int) -> None:
    """Appends an integer: major type 0 for v >= 0, major type 1 (-1 - v) below."""
    if v >= 0:
        if v > _MAX_ARG:
            raise ValueError(f"CBOR: integer {v} is over 2**64 - 1 (bignums are not supported)")
        head(out, 0, v)
    else:
        n = -1 - v
        if n > _MAX_ARG:
            raise ValueError(f"CBOR: integer {v} is under -2**64 (bignums are not supported)")
        head(out, 1, n)


def write(out: bytearray, value: Any) -> None:
    """Appends the canonical encoding of ``value`` to ``out``."""
    if value is None:
        out.append(0xF6)
    elif value is True:
        out.append(0xF5)
    elif value is False:
        out.append(0xF4)
    elif isinstance(value, int):
        integer(out, int(value))
    elif isinstance(value, str):
        b = value.encode("utf-8")
        head(out, 3, len(b))
        out += b
    elif isinstance(value, (bytes, bytearray, memoryview)):
        b = bytes(value)
        head(out, 2, len(b))
        out += b
    elif isinstance(value, (list, tuple)):
        head(out, 4, len(value))
        for v in value:
            write(out, v)
    elif isinstance(value, (float, complex, dict, set, frozenset)):
        raise TypeError(f"CBOR: cannot encode a {type(value).__name__} (supported: None, bool, int, bytes, "
                        "str, and lists or tuples of these)")
    else:
        try:
            i = operator.index(value)  # numpy integers and other int-likes
        except TypeError:
            raise TypeError(f"CBOR: cannot encode a {type(value).__name__} (supported: None, bool, int, "
                            "bytes, str, and lists or tuples of these)") from None
        integer(out, i)


def encode(value: Any) -> bytes:
    """The canonical CBOR encoding of ``value``."""
    out = bytearray()
    write(out, value)
    return bytes(out)
