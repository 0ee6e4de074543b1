"""The same-machine path: segments of nodes on this host, mapped from their /dev/shm files.

Reads without the node (the protocol, section 8; the Java ``SharedSegments`` does the same): the node
may reuse a region while a reader copies from it, but before it lets a write into reused space it
marks the old object's header dead. So a read checks the header (magic, version, state COMPLETE,
the generation the master gave, the value length), copies the value with one memory copy into the
caller's memory, then checks state and generation again. If the second check fails the copy may be
torn: it is discarded and the object is read over TCP instead (where the node pins it), which yields
the object or a miss. A read therefore never returns another object's bytes or a partial object.

The copy and the checks are plain loads. On x86-64 (the platform kvpool is built and tested on)
loads are not reordered with other loads, which is all the check-copy-check needs; the node's
stores of the dead mark happen before it admits the writer, under its own lock.

Writes: the node admits each write (NODE_SHM_WRITE_BEGIN: it waits for readers of the space, fences
old epochs and stamps the header WRITING), the client copies the value into the mapped region, and
NODE_SHM_WRITE_END on the same connection makes it readable.

Page faults: a fresh mapping has no page-table entries, so the first copy into or out of each 4 KiB
page takes a fault, which caps a cold copy at 1 to 3 GB/s (against 10 to 20 for a warm one). The
mapping is therefore prefaulted in windows of 64 MiB, each the first time a copy touches it, with
``madvise(MADV_POPULATE_READ)`` (Linux 5.14+), which on a shared tmpfs mapping installs writable
entries too and costs less than ``MADV_POPULATE_WRITE`` (the Java ``Prefault`` measured 78 against
184 ms per GiB): one system call per window instead of 16,384 faults, and only for the parts of the
segment this process uses (a ``MAP_POPULATE`` of the whole segment would cost every client process
about 70 ms and 2 MiB of page tables per GiB of segment at start). On a writable mapping the advice is a
foreign call (ctypes), so it runs without the GIL, in the copy lanes of ``kvpool.lanes``; a window two
lanes reach together is populated once, the second waiting for the first. Where the kernel refuses the
advice, copies fault as before.

Copies: a writable mapping exposes its address (``Mapping.pin``) for ``kvpool.lanes``, which copy with
``memmove`` without the GIL; the ctypes array behind the address is an export of the mapping, so a lane
still copying keeps the memory mapped even if the mapping is closed meanwhile (the map then goes with the
last reference). Small copies stay memoryview slice assignments.

Falling back: a segment is mapped only if its node is on this host, advertises a shared-memory file,
the file is visible here and at least the segment's size. It is mapped read-write when this process
may write the file, else read-only (reads still take the fast path, writes go over TCP). Anything
else uses TCP, and the log says so once per segment.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import socket
import threading
from typing import Callable

from . import protocol as p
from .protocol import SegmentStats

log = logging.getLogger("kvpool")


def is_local_host(host: str) -> bool:
    """True if ``host`` names this machine: a loopback address, or an address some local interface has.

    An address is local exactly when a socket can be bound to it, which needs no interface listing.
    """
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_UDP)
    except OSError:
        return False
    for family, _, _, _, addr in infos:
        ip = addr[0]
        if ip.startswith("127.") or ip == "::1":
            return True
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.bind((ip, 0) if family == socket.AF_INET else (ip, 0, 0, 0))
                return True
        except OSError:
            continue
    return False


#: Linux's madvise advice number (5.14+); Python 3.11's mmap module does not name it.
MADV_POPULATE_READ = 22
#: Bytes prefaulted at once, the first time a copy touches them.
POPULATE_WINDOW = 64 << 20

_libc = ctypes.CDLL(None, use_errno=True)
_madvise = _libc.madvise
_madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_madvise.restype = ctypes.c_int


class Mapping:
    """One mapped segment."""

    __slots__ = ("mm", "view", "writable", "size", "_base", "_populated", "_populate", "_lock", "_windows", "_on_close")

    def __init__(self, mm: mmap.mmap, writable: bool, size: int) -> None:
        self.mm = mm
        self.view = memoryview(mm)
        self.writable = writable
        self.size = size
        # the address of a writable mapping, for foreign calls (an export of the map: see the module notes)
        self._base: ctypes.Array[ctypes.c_char] | None = \
            (ctypes.c_char * size).from_buffer(mm) if writable and size else None
        self._populated: set[int] = set()
        self._populate = True
        self._lock = threading.Lock()
        self._windows: dict[int, threading.Lock] = {}
        self._on_close: list[Callable[[], None]] = []

    def on_close(self, fn: Callable[[], None]) -> None:
        """Calls ``fn`` when the mapping is closed, before it is unmapped (a device that registered the mapping
        unregisters it there)."""
        with self._lock:
            self._on_close.append(fn)

    def pin(self) -> ctypes.Array[ctypes.c_char] | None:
        """The ctypes array over the whole mapping (hold it while using its address), or None when the mapping
        is read-only or closed."""
        return self._base

    def prefaulting(self) -> bool:
        """Whether copies into this mapping are prefaulted (false once the kernel refused the advice)."""
        return self._populate

    def prefaulted(self, offset: int) -> bool:
        """Whether the window holding ``offset`` is prefaulted already."""
        return offset // POPULATE_WINDOW in self._populated

    def prefault(self, start: int, end: int) -> None:
        """Prefaults the windows of [start, end) not prefaulted yet (see the module notes); thread-safe."""
        if not self._populate or end <= start:
            return
        for w in range(start // POPULATE_WINDOW, (end - 1) // POPULATE_WINDOW + 1):
            if w in self._populated:
                continue
            with self._lock:
                lock = self._windows.setdefault(w, threading.Lock())
            with lock:
                if w in self._populated or not self._populate:
                    continue
                lo = w * POPULATE_WINDOW
                n = min(POPULATE_WINDOW, self.size - lo)
                base = self._base
                try:
                    if base is not None:
                        if _madvise(ctypes.addressof(base) + lo, n, MADV_POPULATE_READ) != 0:
                            raise OSError(ctypes.get_errno(), "madvise")
                    else:
                        self.mm.madvise(MADV_POPULATE_READ, lo, n)
                except (OSError, ValueError):
                    self._populate = False  # an older kernel: fault page by page
                    return
                self._populated.add(w)

    def close(self) -> None:
        with self._lock:
            hooks, self._on_close = self._on_close, []
        for fn in hooks:
            try:
                fn()
            except Exception:  # noqa: BLE001 - a hook never keeps the mapping from closing
                pass
        self._base = None  # a lane copying holds its own reference: the map stays until it lets go
        try:
            self.view.release()
            self.mm.close()
        except (BufferError, ValueError):
            pass  # a reader still holds a slice; the map goes when the last view does

    def read(self, offset: int, generation: int, length: int, dst: memoryview) -> bool:
        """Copies the object into ``dst[:length]``; False if it is not there or changed during the copy."""
        return self.read_range(offset, generation, length, 0, dst[:length])

    def read_range(self, offset: int, generation: int, length: int, range_offset: int, dst: memoryview,
                   copy: Callable[[int, memoryview], None] | None = None) -> bool:
        """Copies ``dst.nbytes`` bytes from ``range_offset`` of the object's value into ``dst`` (the caller
        checked the range is inside the value), with ``read``'s checks; False if not there or changed.
        ``copy(at, dst)``, if given, does the copy from offset ``at`` of the mapping (``kvpool.lanes``)."""
        if offset < 0 or offset + p.OBJECT_KEY_OFFSET > self.size:
            return False
        magic, version, state, key_len, value_len, gen = p.OBJECT_HEAD.unpack_from(self.mm, offset)
        if (magic != p.OBJECT_MAGIC or version != p.OBJECT_VERSION or state != p.OBJECT_STATE_COMPLETE
                or gen != generation or value_len != length or not 1 <= key_len <= p.MAX_KEY_BYTES):
            return False
        at = offset + p.value_offset(key_len)
        if at + length > self.size:
            return False
        n = dst.nbytes
        at += range_offset
        if self._populate and n:
            self.prefault(at, at + n)
        if copy is None:
            dst[:] = self.view[at:at + n]
        else:
            copy(at, dst)
        _, _, state, _, _, gen = p.OBJECT_HEAD.unpack_from(self.mm, offset)
        return state == p.OBJECT_STATE_COMPLETE and gen == generation

    def write_part(self, offset: int, generation: int, key_len: int, range_offset: int, part: memoryview) -> bool:
        """Copies ``part`` to ``range_offset`` of the value of a write begun with NODE_PART_BEGIN, if the
        header still says that write is in progress there (the node marks it dead when it drops the write,
        after which it may admit another writer there); False, copying nothing, otherwise."""
        _, _, state, _, _, gen = p.OBJECT_HEAD.unpack_from(self.mm, offset)
        if state != p.OBJECT_STATE_WRITING or gen != generation:
            return False
        at = offset + p.value_offset(key_len) + range_offset
        if self._populate and part.nbytes:
            self.prefault(at, at + part.nbytes)
        self.view[at:at + part.nbytes] = part
        return True

    def write_value(self, offset: int, key_len: int, value: memoryview) -> None:
        at = offset + p.value_offset(key_len)
        if self._populate and value.nbytes:
            self.prefault(at, at + value.nbytes)
        self.view[at:at + value.nbytes] = value


class SharedSegments:
    """Mappings of this host's segments, by shared-memory file; None for segments reached over TCP.

    Kept by file, never by segment id: ids are per master run, and a new master (a restart, or a
    failover to another elected master) numbers segments in the order their nodes register again, so
    a mapping kept by id would send copies for the segment now called N into the file of the node
    formerly called N (issue 25). The file name carries the node's address and process id.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self._mapped: dict[str, Mapping] = {}
        self._unmappable: set[str] = set()
        self._local: dict[str, bool] = {}

    def mapping(self, seg: SegmentStats) -> Mapping | None:
        path = seg.shm_path
        if not self.enabled or not path or path in self._unmappable:
            return None
        m = self._mapped.get(path)
        if m is not None and m.size == seg.capacity:
            return m
        with self._lock:
            m = self._mapped.get(path)
            if m is not None and m.size != seg.capacity:
                # the same file name for a segment of another size: not the segment mapped before
                self._mapped.pop(path).close()
                m = None
            if m is None and path not in self._unmappable:
                m = self._map(seg)
                if m is None:
                    self._unmappable.add(path)
                else:
                    self._mapped[path] = m
            return m

    def is_local(self, host: str) -> bool:
        """``is_local_host``, remembered per host name (it resolves and binds a socket)."""
        v = self._local.get(host)
        if v is None:
            v = self._local[host] = is_local_host(host)
        return v

    def _map(self, seg: SegmentStats) -> Mapping | None:
        if not self.is_local(seg.host):
            return None
        path = seg.shm_path
        try:
            size = os.stat(path).st_size
        except OSError as e:
            log.info("kvpool: segment %s: shared-memory file %s is not visible here (%s); using TCP", seg.name, path, e)
            return None
        if size < seg.capacity:
            log.info("kvpool: segment %s: %s has %d bytes, the segment %d; using TCP", seg.name, path, size,
                     seg.capacity)
            return None
        writable = os.access(path, os.R_OK | os.W_OK)
        try:
            fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
            try:
                mm = mmap.mmap(fd, seg.capacity, mmap.MAP_SHARED,
                               mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
            finally:
                os.close(fd)
        except OSError as e:
            log.info("kvpool: segment %s: cannot map %s (%s); using TCP", seg.name, path, e)
            return None
        log.info("kvpool: segment %s: same-machine path through %s (%s)", seg.name, path,
                 "reads and writes" if writable else "reads only; writes over TCP")
        return Mapping(mm, writable, seg.capacity)

    def retain(self, live: set[str]) -> None:
        """Forgets mappings of files no segment in the table has any more."""
        with self._lock:
            for path in [f for f in self._mapped if f not in live]:
                self._mapped.pop(path).close()
            self._unmappable &= live

    def close(self) -> None:
        with self._lock:
            for m in self._mapped.values():
                m.close()
            self._mapped.clear()
