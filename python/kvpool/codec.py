"""The body primitives of kvpool's wire protocol (docs/protocol.md, section 2.3): keys, the
little-endian writer and the bounds-checked reader that rejects trailing bytes, and error bodies.
Split from ``kvpool.protocol``, which re-exports every name here and holds the header, the tables and
the messages."""

from __future__ import annotations

import struct
from typing import Sequence

from .errors import KvPoolError

MAX_KEY_BYTES = 512


class ProtocolError(KvPoolError):
    """A frame or body that breaks the protocol (the peer is not kvpool, or speaks another version)."""



def encode_key(key: str | bytes) -> bytes:
    """A key's UTF-8 bytes, checked against 1..512 bytes (ValueError naming the key otherwise)."""
    k = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    if not 1 <= len(k) <= MAX_KEY_BYTES:
        raise ValueError(f"key {abbreviate(key)!r} has {len(k)} UTF-8 bytes; keys must have 1..{MAX_KEY_BYTES}")
    return k


def encode_keys_checked(keys: Sequence[str | bytes]) -> list[bytes]:
    """``encode_key`` for a list, checked in one pass (the lookup path encodes 1024 keys per call)."""
    try:
        kb = list(map(str.encode, keys))  # type: ignore[arg-type]
    except TypeError:
        kb = [k.encode("utf-8") if isinstance(k, str) else bytes(k) for k in keys]
    if kb and (min(map(len, kb)) < 1 or max(map(len, kb)) > MAX_KEY_BYTES):
        for k in keys:
            encode_key(k)  # raises, naming the first bad key
    return kb


def signed64(v: int) -> int:
    """An unsigned 64-bit value as the signed i64 the wire carries."""
    return v - (1 << 64) if v >= 1 << 63 else v


def abbreviate(key: str | bytes, limit: int = 80) -> str:
    """A key shortened for messages."""
    s = key if isinstance(key, str) else bytes(key).decode("utf-8", "replace")
    return s if len(s) <= limit else s[: limit - 3] + "..."


_U16 = [struct.pack("<H", i) for i in range(MAX_KEY_BYTES + 1)]


class BodyWriter:
    """Appends body fields in wire order (section 3.1)."""

    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def u8(self, v: int) -> BodyWriter:
        self.buf.append(v & 0xFF)
        return self

    def boolean(self, v: bool) -> BodyWriter:
        self.buf.append(1 if v else 0)
        return self

    def u16(self, v: int) -> BodyWriter:
        self.buf += struct.pack("<H", v)
        return self

    def i32(self, v: int) -> BodyWriter:
        self.buf += struct.pack("<i", v)
        return self

    def i64(self, v: int) -> BodyWriter:
        self.buf += struct.pack("<q", v)
        return self

    def fixed(self, b: bytes) -> BodyWriter:
        """Bytes of a length both sides know (a MAC): no length prefix."""
        self.buf += b
        return self

    def bstr(self, b: bytes) -> BodyWriter:
        if len(b) > 0xFFFF:
            raise ValueError(f"byte string of {len(b)} bytes exceeds 65535")
        self.buf += struct.pack("<H", len(b))
        self.buf += b
        return self

    def string(self, s: str) -> BodyWriter:
        return self.bstr(s.encode("utf-8"))

    def keys(self, keys: Sequence[bytes]) -> BodyWriter:
        """A key list: i32 count, then each key as a byte string (each at most 65535 bytes)."""
        self.i32(len(keys))
        parts: list[bytes] = [b""] * (2 * len(keys))  # lengths and keys interleaved, joined once: no pair copies
        try:
            parts[::2] = map(_U16.__getitem__, map(len, keys))
            parts[1::2] = keys
            self.buf += b"".join(parts)
        except IndexError:
            for k in keys:
                self.bstr(k)  # a byte string longer than a key: checked one by one
        return self

    def bytes(self) -> bytes:
        return bytes(self.buf)


class BodyReader:
    """Reads body fields with bounds checks; ``done()`` rejects trailing bytes."""

    __slots__ = ("data", "pos", "what")

    def __init__(self, data: bytes | bytearray | memoryview, what: str) -> None:
        self.data = data
        self.pos = 0
        self.what = what

    def _take(self, n: int, field_name: str) -> int:
        p = self.pos
        if p + n > len(self.data):
            raise ProtocolError(f"{self.what} body ends early reading {field_name}")
        self.pos = p + n
        return p

    def u8(self, f: str) -> int:
        return self.data[self._take(1, f)]

    def boolean(self, f: str) -> bool:
        v = self.u8(f)
        if v > 1:
            raise ProtocolError(f"{self.what}: {f} must be 0 or 1, got {v}")
        return v == 1

    def u16(self, f: str) -> int:
        return struct.unpack_from("<H", self.data, self._take(2, f))[0]

    def i32(self, f: str) -> int:
        return struct.unpack_from("<i", self.data, self._take(4, f))[0]

    def i64(self, f: str) -> int:
        return struct.unpack_from("<q", self.data, self._take(8, f))[0]

    def count(self, f: str, min_item_bytes: int) -> int:
        n = self.i32(f)
        if n < 0 or n * min_item_bytes > len(self.data) - self.pos:
            raise ProtocolError(f"{self.what}: item count of {n} does not fit the "
                                f"{len(self.data) - self.pos} bytes left in the body")
        return n

    def fixed(self, n: int, f: str) -> bytes:
        p = self._take(n, f)
        return bytes(self.data[p:p + n])

    def bstr(self, f: str) -> bytes:
        n = self.u16(f)
        p = self._take(n, f)
        return bytes(self.data[p:p + n])

    def string(self, f: str) -> str:
        raw = self.bstr(f)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ProtocolError(f"{self.what}: {f} is not valid UTF-8 ({e.reason} at byte {e.start})") from None

    def done(self) -> None:
        left = len(self.data) - self.pos
        if left:
            raise ProtocolError(f"{self.what} body has {left} unexpected trailing bytes")


def decode_error(body: bytes | bytearray | memoryview) -> str:
    """The message of an error reply (section 2.4); tolerant, since it is only ever shown."""
    if len(body) < 2:
        return "(no message)"
    n = struct.unpack_from("<H", body, 0)[0]
    return bytes(body[2:2 + n]).decode("utf-8", "replace")
