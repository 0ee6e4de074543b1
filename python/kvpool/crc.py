"""CRC32C (Castagnoli), the checksum kvpool stores with every value (docs/protocol.md, section 8).

The standard library has only CRC32 (zlib's polynomial). In order of preference this module uses:

1. Intel's ISA-L (Debian's ``libisal2``), called through ctypes: ``crc32_iscsi`` is CRC32C with
   SIMD folding, tens of GB/s on one core, and ctypes releases the GIL for the call, so threads that
   checksum in parallel really run in parallel;
2. the ``crc32c`` module (Debian's ``python3-crc32c``), about 2 GB/s, holding the GIL;
3. a table-driven implementation in pure Python: correct, slow (tens of MB/s); the first large value
   checksummed this way logs a warning saying what to install.

``KVPOOL_CRC32C=isal|crc32c|python`` forces one (the tests check all three agree).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
from typing import Callable

from .buffers import Pins

log = logging.getLogger("kvpool")

_POLY = 0x82F63B78  # reflected Castagnoli polynomial


def _table() -> list[int]:
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (_POLY if c & 1 else 0)
        t.append(c)
    return t


_TABLE = _table()


def crc32c_pure(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC32C of ``data`` continuing from ``crc``, in pure Python."""
    c = crc ^ 0xFFFFFFFF
    t = _TABLE
    for b in memoryview(data).cast("B"):
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _isal_at() -> Callable[[int, int], int] | None:
    """ISA-L's CRC32C of ``n`` bytes at an address (a foreign call: the GIL is released while it runs)."""
    name = ctypes.util.find_library("isal") or "libisal.so.2"
    try:
        lib = ctypes.CDLL(name)
        fn = lib.crc32_iscsi
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    fn.restype = ctypes.c_uint32
    chunk = 1 << 30

    def at(addr: int, n: int) -> int:
        crc = 0xFFFFFFFF
        for off in range(0, n, chunk):
            crc = fn(addr + off, min(chunk, n - off), crc)
        return crc ^ 0xFFFFFFFF if n else 0

    return at


def _isal_of_bytes() -> Callable[[bytes], int] | None:
    """ISA-L's CRC32C of a ``bytes`` object, which ctypes passes as a pointer to its own buffer: no buffer export
    and no address arithmetic, so a short input (an object header) costs about a microsecond, not four."""
    name = ctypes.util.find_library("isal") or "libisal.so.2"
    try:
        fn = ctypes.CDLL(name).crc32_iscsi
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint32]
    fn.restype = ctypes.c_uint32

    def of_bytes(data: bytes) -> int:
        return fn(data, len(data), 0xFFFFFFFF) ^ 0xFFFFFFFF if data else 0

    return of_bytes


def _isal() -> Callable[[bytes | bytearray | memoryview], int] | None:
    native = _isal_at()
    native_of_bytes = _isal_of_bytes()
    if native is None or native_of_bytes is None:
        return None
    at: Callable[[int, int], int] = native
    of_bytes: Callable[[bytes], int] = native_of_bytes

    def isal(data: bytes | bytearray | memoryview) -> int:
        if type(data) is bytes and len(data) < 1 << 30:
            return of_bytes(data)
        mv = memoryview(data).cast("B") if not isinstance(data, memoryview) or data.format != "B" else data
        if not mv.nbytes:
            return 0
        pins = Pins()  # not ``buffers.address_of``: its generator costs more than a small value's checksum
        try:
            return at(pins.address(mv), mv.nbytes)
        finally:
            pins.release()

    return isal


def _module() -> Callable[[bytes | bytearray | memoryview], int] | None:
    try:
        import crc32c as _c  # type: ignore[import-not-found]
    except ImportError:
        return None
    fn = _c.crc32c
    return lambda data: fn(data) & 0xFFFFFFFF


def _choose(forced: str | None) -> tuple[Callable[[bytes | bytearray | memoryview], int], str]:
    order = {"isal": _isal, "crc32c": _module}
    if forced and forced not in (*order, "python"):
        raise ValueError(f"KVPOOL_CRC32C must be isal, crc32c or python, got {forced!r}")
    for name, make in order.items():
        if forced in (None, name):
            impl = make()
            if impl is not None:
                return impl, name
            if forced == name:
                raise ValueError(f"KVPOOL_CRC32C={name} but it is not available here")
    return crc32c_pure, "python"


_impl, BACKEND = _choose(os.environ.get("KVPOOL_CRC32C") or None)
#: CRC32C of ``n`` bytes at an address, with ISA-L (releasing the GIL), or None with another backend.
crc32c_at: Callable[[int, int], int] | None = _isal_at() if BACKEND == "isal" else None
_warned = False


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC32C of ``data`` (an unsigned 32-bit int)."""
    global _warned
    if BACKEND == "python" and not _warned and len(data) >= 1 << 16:
        _warned = True
        log.warning("kvpool: checksumming values in pure Python (slow); install Debian's libisal2 "
                    "(or python3-crc32c) for hardware CRC32C")
    return _impl(data)


# ------------------------------------------------------------------------------------- combining
# crc(A || B) = crc(A) * x^(8 |B|) mod P  xor  crc(B): CRC32C's preset and final inversion (both all ones)
# cancel out, so the checksum of a value written in parts, in any order, follows from the parts' checksums
# and lengths without their bytes (the Java ``Crc32cCombine`` does the same). Polynomials are bit-reflected
# as in the CRC register: x^0 is bit 31.

_ONE = 0x80000000


def _multiply(a: int, b: int) -> int:
    """``a * b mod P``, reflected."""
    product = 0
    bit = _ONE
    while bit:
        if a & bit:
            product ^= b
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
        bit >>= 1
    return product


def _x_power_of_bytes(n: int) -> int:
    """``x^(8 n) mod P``: the shift of appending n bytes."""
    p = _ONE
    square = _multiply(_ONE >> 1, _ONE >> 1)  # x^2
    square = _multiply(square, square)  # x^4
    square = _multiply(square, square)  # x^8
    while n:
        if n & 1:
            p = _multiply(square, p)
        n >>= 1
        square = _multiply(square, square)
    return p


@functools.lru_cache(maxsize=64)
def _shift_tables(length: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """Byte tables of the linear map ``c -> c * x^(8 length) mod P``: values written in parts of a few
    sizes (a model's layers) combine with four lookups per part."""
    op = _x_power_of_bytes(length)
    basis = [_multiply(op, 1 << bit) for bit in range(32)]
    tables = []
    for k in range(4):
        t = [0] * 256
        for v in range(1, 256):
            low = v & -v
            t[v] = t[v ^ low] ^ basis[8 * k + low.bit_length() - 1]
        tables.append(t)
    return tables[0], tables[1], tables[2], tables[3]


def crc32c_combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """CRC32C of ``A || B`` from ``crc32c(A)``, ``crc32c(B)`` and ``len(B)``."""
    if length_b < 0:
        raise ValueError(f"length {length_b} is negative")
    t0, t1, t2, t3 = _shift_tables(length_b)
    a = crc_a & 0xFFFFFFFF
    return t0[a & 0xFF] ^ t1[(a >> 8) & 0xFF] ^ t2[(a >> 16) & 0xFF] ^ t3[a >> 24] ^ (crc_b & 0xFFFFFFFF)
