"""Argument checking as pybind11 and Mooncake do it: integer and string conversions, sizes and flags in
Mooncake's text forms, the master address, buffer lists, the host-memory check and the regex plan."""

from __future__ import annotations

import bisect
import ctypes
import errno
import mmap
import operator
import os
import string
import struct
import threading
import weakref
from typing import Any, Optional, Sequence

from .codes import log

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no procfs either, so every range passes
    fcntl = None  # type: ignore[assignment]

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

#: PROCMAP_QUERY (Linux 6.11, include/uapi/linux/fs.h): ``_IOWR('f', 17, struct procmap_query)``, an ioctl on
#: /proc/self/maps that describes the mapping covering one address. The struct's fields in order: size,
#: query_flags, query_addr (in); vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode (out);
#: dev_major, dev_minor (out), vma_name_size, build_id_size (in/out, 0: not asked); vma_name_addr, build_id_addr.
_PROCMAP_QUERY_ARG = struct.Struct("=9Q4I2Q")
_PROCMAP_QUERY = (3 << 30) | (_PROCMAP_QUERY_ARG.size << 16) | (ord("f") << 8) | 17
_PROCMAP_QUERY_TEMPLATE = _PROCMAP_QUERY_ARG.pack(_PROCMAP_QUERY_ARG.size, *[0] * 14)
_QUERY_ADDR = struct.Struct("=Q")  # query_addr, at 16
_QUERY_VMA = struct.Struct("=3Q")  # vma_start, vma_end, vma_flags, at 24
_VMA_READABLE, _VMA_WRITABLE = 0x1, 0x2  # PROCMAP_QUERY_VMA_READABLE, PROCMAP_QUERY_VMA_WRITABLE
_MADV_POPULATE_READ, _MADV_POPULATE_WRITE = 22, 23  # Linux 5.14

_SURELY_MAPPED = ctypes.create_string_buffer(1)
#: An address in readable and writable memory, to try the kernel's answers on.
_SURELY_MAPPED_ADDRESS = ctypes.addressof(_SURELY_MAPPED)

#: Where the kernel has no PROCMAP_QUERY: the largest range confirmed by a populate probe, whose cost grows with
#: the pages (40 to 70 us a MiB, about what reading /proc/self/maps costs once per 4 MiB); a larger range is
#: judged by reading /proc/self/maps afresh.
PROBE_MAX_BYTES = 4 << 20


#: A mapping as the check knows it: start, end, readable, writable.
_Region = tuple[int, int, bool, bool]


def _covers(starts: list[int], regions: list[_Region], address: int, end: int, writable: bool) -> bool:
    """True if ``regions`` (sorted by start, ``starts`` their starts) cover [address, end) readable (and writable
    if asked) without a gap."""
    i = bisect.bisect_right(starts, address) - 1
    cur = address
    while cur < end:
        if i < 0 or i >= len(regions):
            return False
        lo, hi, r, w = regions[i]
        if not lo <= cur < hi or not r or (writable and not w):
            return False
        cur = hi
        i += 1
    return True


class _Seen:
    """What one call has learnt of the mappings, for its other ranges: a batch's buffers mostly lie in a few
    mappings, which are then asked about once a call, not once a buffer. Start one per call
    (``_host_memory.seen()``); never keep one beyond the call, since the mappings may change after it."""

    __slots__ = ("starts", "regions", "complete")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.regions: list[_Region] = []
        self.complete = False  # the regions are all of /proc/self/maps as read during this call

    def add(self, lo: int, hi: int, r: bool, w: bool) -> None:
        i = bisect.bisect_left(self.starts, lo)
        if i < len(self.starts) and self.starts[i] == lo:
            _, h, r0, w0 = self.regions[i]
            if hi >= h and r >= r0 and w >= w0:
                self.regions[i] = (lo, hi, r, w)
            return
        self.starts.insert(i, lo)
        self.regions.insert(i, (lo, hi, r, w))


class _HostMemory:
    """Best-effort check that an address range is mapped host memory with the right permissions, judged by the
    mappings as they are at the time of the call: never by what an earlier call saw, since an address seen
    readable and writable may since have been unmapped and mapped again without access (a freed buffer's
    address reused by another mapping).

    Where Linux answers PROCMAP_QUERY (6.11 and later), one ioctl on an open /proc/self/maps per mapping the
    range spans reads those mappings' permissions (about a microsecond, whatever the range's size or the
    process's number of mappings). On older kernels a range up to ``PROBE_MAX_BYTES`` is probed: the kernel
    is asked to populate it readable, or writable (MADV_POPULATE_READ/WRITE, Linux 5.14), which succeeds only if
    every page of it is mapped with that access now (its pages are faulted in, as the call's copy would).
    A larger range, or one the probe refuses, is judged by reading /proc/self/maps afresh (what a kernel
    without the probe does for every range). With a ``_Seen``, what one range's check learnt serves the call's
    later ranges. Where there is no procfs, every range passes (and a bad address crashes, as in C).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._raw = b""
        self._starts: list[int] = []
        self._regions: list[_Region] = []
        self._available = os.path.exists("/proc/self/maps")
        self._query_fd: Optional[int] = None
        self._query_id = (0, 0)  # the open /proc/self/maps' device and inode
        self._query_ok: Optional[bool] = None  # None: not tried yet
        self._madvise: Any = None
        self._probe_ok: Optional[bool] = None  # None: not tried yet
        if hasattr(os, "register_at_fork"):
            ref = weakref.ref(self)
            os.register_at_fork(after_in_child=lambda: _after_fork_in_child(ref))

    @staticmethod
    def seen() -> _Seen:
        return _Seen()

    def check(self, address: int, size: int, writable: bool, seen: Optional[_Seen] = None) -> bool:
        """True if ``[address, address + size)`` is mapped readable (and writable if asked) now."""
        if size == 0 or not self._available:
            return True
        if address <= 0:
            return False
        end = address + size
        if seen is not None and seen.regions:
            if _covers(seen.starts, seen.regions, address, end, writable):
                return True
            if seen.complete:
                return False
        verdict = self._query(address, end, writable, seen)
        if verdict is not None:
            return verdict
        if size <= PROBE_MAX_BYTES and self._probe(address, end, writable):
            if seen is not None:
                page = mmap.PAGESIZE
                seen.add(address & -page, -(-end // page) * page, True, writable)
            return True
        return self._read_maps(address, end, writable, seen)

    def _forked(self) -> None:
        """In a fork's child: the open /proc/self/maps describes the parent's memory, so open it again."""
        fd, self._query_fd = self._query_fd, None
        self._lock = threading.Lock()
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    # --------------------------------------------------------------- PROCMAP_QUERY (Linux 6.11)

    def _query_open(self) -> Optional[int]:
        """The descriptor to ask PROCMAP_QUERY on, None where the kernel does not answer it."""
        with self._lock:
            if self._query_fd is not None or self._query_ok is False:
                return self._query_fd
            if fcntl is None:
                self._query_ok = False
                return None
            try:
                fd = os.open("/proc/self/maps", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self._query_ok = False
                return None
            arg = bytearray(_PROCMAP_QUERY_TEMPLATE)
            _QUERY_ADDR.pack_into(arg, 16, _SURELY_MAPPED_ADDRESS)
            try:
                fcntl.ioctl(fd, _PROCMAP_QUERY, arg, True)
            except OSError:
                os.close(fd)
                self._query_ok = False
                return None
            st = os.fstat(fd)
            self._query_id = (st.st_dev, st.st_ino)
            self._query_ok = True
            self._query_fd = fd
            return fd

    def _query(self, address: int, end: int, writable: bool, seen: Optional[_Seen]) -> Optional[bool]:
        """The verdict from PROCMAP_QUERY, None where the kernel does not give one."""
        fd = self._query_fd
        if fd is None:
            fd = self._query_open()
            if fd is None:
                return None
        need = _VMA_READABLE | _VMA_WRITABLE if writable else _VMA_READABLE
        arg = bytearray(_PROCMAP_QUERY_TEMPLATE)
        cur = address
        try:
            while True:  # one mapping after the other until the range's end
                _QUERY_ADDR.pack_into(arg, 16, cur)
                fcntl.ioctl(fd, _PROCMAP_QUERY, arg, True)
                lo, hi, flags = _QUERY_VMA.unpack_from(arg, 24)
                if not lo <= cur < hi:
                    return False
                if seen is not None:
                    seen.add(lo, hi, bool(flags & _VMA_READABLE), bool(flags & _VMA_WRITABLE))
                if flags & need != need:
                    return False
                if hi >= end:
                    return True
                cur = hi
        except OSError as e:
            if e.errno == errno.ENOENT:
                return False  # no mapping covers cur
        # not expected once a query has worked: forget the descriptor (closing it only if it is still the one
        # opened: a library that closes descriptors it does not own may have let another file have its number)
        with self._lock:
            if self._query_fd == fd:
                self._query_fd = None
                try:
                    st = os.fstat(fd)
                    if (st.st_dev, st.st_ino) == self._query_id:
                        os.close(fd)
                except OSError:
                    pass
        return None

    # --------------------------------------------------------------- older kernels: probe, else read the maps

    def _probe(self, address: int, end: int, writable: bool) -> bool:
        """True if the kernel populated [address, end) readable (writable): every page is so mapped now."""
        if self._probe_ok is None:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                madvise = libc.madvise
                madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                madvise.restype = ctypes.c_int
                here = _SURELY_MAPPED_ADDRESS & -mmap.PAGESIZE
                self._madvise = madvise
                self._probe_ok = madvise(here, mmap.PAGESIZE, _MADV_POPULATE_WRITE) == 0
            except (OSError, AttributeError):
                self._probe_ok = False
        if not self._probe_ok:
            return False
        lo = address & -mmap.PAGESIZE
        return self._madvise(lo, end - lo, _MADV_POPULATE_WRITE if writable else _MADV_POPULATE_READ) == 0

    def _read_maps(self, address: int, end: int, writable: bool, seen: Optional[_Seen]) -> bool:
        """The verdict of /proc/self/maps read now (which the call's later ranges are then judged by)."""
        with self._lock:
            try:
                self._reload()
            except OSError:
                self._available = False
                return True
            starts, regions = self._starts, self._regions
        if seen is not None:
            seen.starts, seen.regions, seen.complete = list(starts), list(regions), True
        return _covers(starts, regions, address, end, writable)

    def _reload(self) -> None:
        with open("/proc/self/maps", "rb") as f:
            raw = f.read()
        if raw == self._raw:
            return
        regions: list[_Region] = []
        for line in raw.splitlines():
            parts = line.split(None, 2)
            if len(parts) < 2:
                continue
            lo, _, hi = parts[0].partition(b"-")
            perms = parts[1]
            regions.append((int(lo, 16), int(hi, 16), perms[:1] == b"r", perms[1:2] == b"w"))
        regions.sort()
        self._raw = raw
        self._regions = regions
        self._starts = [r[0] for r in regions]


def _after_fork_in_child(ref: "weakref.ref[_HostMemory]") -> None:
    m = ref()
    if m is not None:
        m._forked()


_host_memory = _HostMemory()


def _pieces_ok(pieces: Sequence[tuple[int, int]], writable: bool, op: str, key: str,
               seen: Optional[_Seen] = None) -> bool:
    """True if every non-empty piece is host memory readable (and writable if asked); logs the first that is not.
    ``seen``: the call's ``_Seen``, for a call that checks several keys' pieces."""
    for addr, n in pieces:
        if n == 0:
            continue
        if addr == 0 or not _host_memory.check(addr, n, writable, seen):
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
