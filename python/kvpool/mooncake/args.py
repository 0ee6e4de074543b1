"""Argument checking as pybind11 and Mooncake do it: integer and string conversions, sizes and flags in
Mooncake's text forms, the master address, buffer lists, the host-memory check and the regex plan."""

from __future__ import annotations

import bisect
import ctypes
import operator
import os
import string
import threading
from typing import Any, Optional, Sequence

from .codes import log

try:
    from ..protocol import MAX_KEY_BYTES as _MAX_KEY_BYTES
except ImportError:  # pragma: no cover - the protocol module always defines it
    _MAX_KEY_BYTES = 512

#: Mooncake's master port, which is also kvpool's default master port.
DEFAULT_MASTER_PORT = 50051
DEFAULT_MASTER_SERVER_ADDR = "127.0.0.1:50051"
DEFAULT_CLIENT_HTTP_PORT = 9300

class _Required:
    """The default of a parameter the binding requires although one before it has a default (pybind11 allows
    ``f(key=None, file_name)``, Python does not): a call that leaves it out raises TypeError."""

    def __repr__(self) -> str:
        return "<required>"


REQUIRED: Any = _Required()

#: A key's buffers: ``(address, size)`` pieces, in order.
Pieces = list[tuple[int, int]]


#: C ``int`` and ``int64_t`` ranges, for ``_int_arg``.
I32 = (-(1 << 31), (1 << 31) - 1)
I64 = (-(1 << 63), (1 << 63) - 1)


def _int_arg(value: Any, what: str, bounds: tuple[int, int] = I32) -> int:
    """A signed C integer argument as pybind11 converts one: anything with ``__index__`` (not a float or text)
    within ``bounds``, else TypeError naming the argument."""
    if isinstance(value, (float, str, bytes, bytearray)):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(value).__name__}") from None
    if not bounds[0] <= n <= bounds[1]:
        raise TypeError(f"{what} is out of range for a {'C int' if bounds == I32 else 'signed 64-bit int'}: {n}")
    return n


def _uint(value: Any, what: str) -> int:
    """An unsigned integer argument, as pybind11 converts size_t / uintptr_t: TypeError otherwise."""
    if isinstance(value, bool):
        return int(value)
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be a non-negative int, got {type(value).__name__}") from None
    if n < 0 or n >= 1 << 64:
        raise TypeError(f"{what} must be a non-negative int below 2**64, got {n}")
    return n


def _str_arg(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise TypeError(f"{what} is not UTF-8") from None
    raise TypeError(f"{what} must be str, got {type(value).__name__}")


def _keys_arg(keys: Any, what: str = "keys") -> list[str]:
    if isinstance(keys, (str, bytes)):
        raise TypeError(f"{what} must be a list of str, got a single {type(keys).__name__}")
    try:
        return [_str_arg(k, "key") for k in keys]
    except TypeError:
        raise
    except Exception:
        raise TypeError(f"{what} must be a list of str") from None


def _uint_list(values: Any, what: str) -> list[int]:
    try:
        items = list(values)
    except TypeError:
        raise TypeError(f"{what} must be a list of int") from None
    return [_uint(v, what) for v in items]


def _key_ok(key: str) -> bool:
    """True if kvpool can hold the key (1..512 UTF-8 bytes)."""
    try:
        n = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    return 1 <= n <= _MAX_KEY_BYTES


def _log_mismatch(op: str, keys: int, buffers: int, sizes: int) -> None:
    log.error("kvpool.mooncake %s: mismatched sizes for keys (%d), buffers (%d) and sizes (%d)", op, keys, buffers,
              sizes)


def _flat_pieces(op: str, keys: Any, buffer_ptrs: Any, sizes: Any) -> tuple[list[str], Optional[list[Pieces]]]:
    """The keys and one piece per key from parallel lists (``batch_put_from``, ``batch_get_into``); the
    pieces are None, after logging, when the lists' lengths differ."""
    ks = _keys_arg(keys)
    ptrs = _uint_list(buffer_ptrs, "buffer_ptrs")
    ns = _uint_list(sizes, "sizes")
    if not len(ks) == len(ptrs) == len(ns):
        _log_mismatch(op, len(ks), len(ptrs), len(ns))
        return ks, None
    return ks, [[(a, n)] for a, n in zip(ptrs, ns)]


def _nested_pieces(op: str, keys: Any, all_buffer_ptrs: Any, all_sizes: Any,
                   ) -> tuple[list[str], Optional[list[Pieces]]]:
    """The keys and each key's pieces from nested lists (the ``*_multi_buffers`` calls); the pieces are
    None, after logging, when any lengths differ (Mooncake fails the whole batch)."""
    ks = _keys_arg(keys)
    ptr_lists = [_uint_list(p, "all_buffer_ptrs") for p in all_buffer_ptrs]
    size_lists = [_uint_list(s, "all_sizes") for s in all_sizes]
    if not len(ks) == len(ptr_lists) == len(size_lists):
        _log_mismatch(op, len(ks), len(ptr_lists), len(size_lists))
        return ks, None
    pieces: list[Pieces] = []
    for k, pl, sl in zip(ks, ptr_lists, size_lists):
        if len(pl) != len(sl):
            log.error("kvpool.mooncake %s: mismatched buffers and sizes of key %r", op, k[:80])
            return ks, None  # Mooncake fails the whole batch (BuildNestedSlicesFromBuffers)
        pieces.append(list(zip(pl, sl)))
    return ks, pieces


def parse_byte_size(text: Any) -> Optional[int]:
    """A size as Mooncake's ``setup(dict)`` reads one (``try_string_to_byte_size`` in utils.h):
    a number (decimals allowed) with an optional unit B, K/KB, M/MB, G/GB, T/TB (case-insensitive,
    powers of 1024, blanks allowed between), or ``infinite``. None if it does not parse."""
    s = str(text).strip(" \t\r\n")
    if not s:
        return None
    if s == "infinite":
        return (1 << 64) - 1
    i = 0
    while i < len(s) and (s[i].isdigit() or s[i] in "+-.eE"):
        i += 1
    # back off over a trailing 'e'/'E' that belongs to no exponent ("4e" is not a number)
    num, unit = s[:i], s[i:]
    while num and num[-1] in "eE+-":
        unit = num[-1] + unit
        num = num[:-1]
    try:
        value = float(num)
    except ValueError:
        return None
    if value < 0:
        return None
    unit = unit.lstrip(" \t\r\n").upper()
    mult = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "G": 1 << 30,
            "GB": 1 << 30, "T": 1 << 40, "TB": 1 << 40}.get(unit)
    if mult is None:
        return None
    return int(value * mult)


def _parse_bool(text: Any) -> Optional[bool]:
    """Mooncake's TryParseBool (bool_parser.h, canonical token set)."""
    s = str(text).strip().lower()
    if s in ("1", "true", "yes", "on", "enable"):
        return True
    if s in ("0", "false", "no", "off", "disable"):
        return False
    return None


def _master_address(addr: str) -> str:
    """A kvpool master ``host:port`` from Mooncake's ``master_server_addr``; ValueError if kvpool cannot use it."""
    a = addr.strip()
    if not a:
        raise ValueError("master_server_addr is empty")
    if "://" in a:
        raise ValueError(f"master_server_addr {addr!r} names a discovery service; kvpool has no etcd/HA discovery, "
                         "give the kvpool master as host:port")
    if "," in a or ";" in a:
        raise ValueError(f"master_server_addr {addr!r} lists several masters; give the one kvpool master as host:port")
    if a.startswith("["):  # [v6] or [v6]:port
        return a if "]:" in a else f"{a}:{DEFAULT_MASTER_PORT}"
    if a.count(":") == 1:
        return a
    if ":" not in a:
        return f"{a}:{DEFAULT_MASTER_PORT}"
    return f"[{a}]:{DEFAULT_MASTER_PORT}"  # a bare IPv6 address


def _has_explicit_port(hostname: str) -> bool:
    h = hostname.strip()
    if h.startswith("["):
        return "]:" in h
    return h.count(":") == 1 and h.rsplit(":", 1)[1].isdigit()


# ------------------------------------------------------------------------------- host memory check

class _HostMemory:
    """Best-effort check that an address range is mapped host memory with the right permissions.

    Reads ``/proc/self/maps``; a snapshot is reused until a range fails against it, then re-read.
    Where there is no procfs, every range passes (and a bad address crashes, as in C).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._regions: list[tuple[int, int, bool, bool]] = []
        self._loaded = False
        self._available = os.path.exists("/proc/self/maps")

    def _reload(self) -> None:
        regions: list[tuple[int, int, bool, bool]] = []
        with open("/proc/self/maps", "rb") as f:
            for line in f:
                parts = line.split(None, 2)
                if len(parts) < 2:
                    continue
                lo, _, hi = parts[0].partition(b"-")
                perms = parts[1]
                regions.append((int(lo, 16), int(hi, 16), perms[:1] == b"r", perms[1:2] == b"w"))
        regions.sort()
        self._regions = regions
        self._starts = [r[0] for r in regions]
        self._loaded = True

    def _covered(self, address: int, end: int, writable: bool) -> bool:
        i = bisect.bisect_right(self._starts, address) - 1
        cur = address
        while cur < end:
            if i < 0 or i >= len(self._regions):
                return False
            lo, hi, r, w = self._regions[i]
            if not lo <= cur < hi or not r or (writable and not w):
                return False
            cur = hi
            i += 1
        return True

    def check(self, address: int, size: int, writable: bool) -> bool:
        if size == 0 or not self._available:
            return True
        if address <= 0:
            return False
        end = address + size
        with self._lock:
            try:
                if self._loaded and self._covered(address, end, writable):
                    return True
                self._reload()
            except OSError:
                self._available = False
                return True
            return self._covered(address, end, writable)


_host_memory = _HostMemory()


def _pieces_ok(pieces: Sequence[tuple[int, int]], writable: bool, op: str, key: str) -> bool:
    """True if every non-empty piece is host memory readable (and writable if asked); logs the first that is not."""
    for addr, n in pieces:
        if n == 0:
            continue
        if addr == 0 or not _host_memory.check(addr, n, writable):
            log.error("kvpool.mooncake %s: buffer [0x%x, +%d) for key %r is not %s host memory (device memory?); "
                      "kvpool reads and writes host memory only", op, addr, n, key[:80],
                      "writable" if writable else "readable")
            return False
    return True


def _memmove(dst: int, src: int, n: int) -> None:
    if n:
        ctypes.memmove(dst, src, n)


def _buffer_address(buf: bytearray) -> int:
    """The address of a non-empty bytearray's first byte (valid while it lives and is not resized)."""
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


# ------------------------------------------------------------------------------- remove_by_regex

_REGEX_META = set("^$\\.*+?()[]{}|")
_ESCAPABLE = set(string.punctuation)


def regex_removal_plan(pattern: str) -> Optional[tuple[str, str]]:
    """How kvpool can carry out Mooncake's ``remove_by_regex(pattern)`` (ECMAScript, ``regex_search``):
    ``("prefix", lit)``, ``("exact", lit)``, ``("all", "")``, or None if the matched set is not a key
    prefix (kvpool cannot enumerate keys to test a general pattern)."""
    anchored = pattern.startswith("^")
    body = pattern[1:] if anchored else pattern
    lit: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            if i + 1 < len(body) and body[i + 1] in _ESCAPABLE:
                lit.append(body[i + 1])  # an identity escape: the character itself
                i += 2
                continue
            return None  # \d, \w, \b, \n, \x.., \u.., back-references...: not literal text
        if c in _REGEX_META:
            break
        lit.append(c)
        i += 1
    rest = body[i:]
    text = "".join(lit)
    if rest not in ("", ".*", ".*?", "$"):
        return None
    if not anchored:
        # regex_search: unanchored text matches anywhere in the key; only match-everything is a prefix
        return ("all", "") if not text and rest in ("", ".*", ".*?") else None
    if rest == "$":
        return ("exact", text) if text else None
    return ("prefix", text) if text else ("all", "")
