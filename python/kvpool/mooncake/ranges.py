"""Mooncake's ranged reads and writes and its put and get sessions on the store.

Design. kvpool's protocol reads and writes whole objects, and a put reserves and completes in one client
call: there are no ranged transfers and no reservation a client can hold open. So the sessions live in
memory owned by the store object:

* Put session. ``batch_put_session_start`` checks each key (one stored already gives -705, as Mooncake's
  master answers) and allocates a zero-filled staging buffer of the declared size. Ranged puts copy into
  it (``ctypes.memmove``, no RPC). ``batch_put_session_end`` stores every staged object with one batch put
  and drops its staging; until then the object is not in the pool, so nobody can read a partial object.
  ``batch_put_session_revoke`` drops the staging.
* Get session. ``batch_get_session_start`` reads each whole object once (one batch get) and keeps the
  bytes; ranged gets copy out of them (no RPC) until ``batch_get_session_end``. Reading at start, not per
  call: the layerwise caller (vLLM's connector) reads one layer's slice of every object per call, one call
  per layer, so whole-object reads per call would move the data once per layer; reading lazily on the
  first ranged get costs the same memory and would make ``start`` a bare existence check.
* ``get_into_ranges`` (no session, as in Mooncake): locates every object the call names once (one master
  round trip) and reads each range straight into its destination (``Client.get_ranges_into``: a copy out of
  the node's shared segment, or NODE_READ_RANGE), so only the ranges' bytes move and nothing is staged.

Memory. A store holds the declared sizes of its open put sessions plus the sizes of the objects in its open
get sessions, until each ends or is revoked, or the store is closed (``_drop_sessions``). A caller bounds
it by how many keys it keeps in sessions at once (a layerwise connector: the blocks it is loading or
saving, ended after their last layer); ``SESSION_BYTES_LIMIT`` (None: no limit) caps the total per store:
a start beyond it gives -200 (NO_AVAILABLE_HANDLE), as Mooncake's does when the pool has no room.
``get_into_ranges`` holds nothing.

Threads. One lock per store guards its session tables; copies run outside it (``ctypes.memmove`` releases
the GIL). A put session counts its ranged copies in flight; end and revoke first seal it (later ranged
puts get -600) and wait for them, as Mooncake does.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Optional, Protocol, Sequence

from ..buffers import RawBuffer
from .args import Pieces, _Seen, _buffer_address, _host_memory, _key_ok, _keys_arg, _memmove, _pieces_ok, _uint
from .codes import (_EXISTS, _INTERNAL, _INVALID, _NO_SPACE, _NOT_FOUND, _OK, ErrorCode, _code_for, _put_code,
                    _warn_once, log)
from .transfer import _replication

__all__: list[str] = []

#: Bytes a store may hold in open put and get sessions together; None for no limit. Read at each start.
SESSION_BYTES_LIMIT: Optional[int] = None

_NOT_READY = int(ErrorCode.REPLICA_IS_NOT_READY)
_INVALID_REPLICA = int(ErrorCode.INVALID_REPLICA)

_state_lock = threading.Lock()  # creates a store's session tables (the store's own lock is not used here)


# ------------------------------------------------------------------------------ argument shapes

def _seq(value: Any, what: str) -> list[Any]:
    """A list from a sequence argument, as pybind11 converts a std::vector (str, bytes, dict: TypeError)."""
    if isinstance(value, (str, bytes, bytearray, dict)) or not hasattr(value, "__len__") \
            or not hasattr(value, "__getitem__"):
        raise TypeError(f"{what} must be a list, got {type(value).__name__}")
    return list(value)


def _uints(value: Any, what: str) -> list[int]:
    return [_uint(v, what) for v in _seq(value, what)]


def _ranged_args(keys: Any, all_buffer_ptrs: Any, all_sizes: Any, all_offsets: Any,
                 offsets_name: str) -> tuple[list[str], list[list[int]], list[list[int]], list[list[int]]]:
    """The argument lists of a multi-buffer ranged call, converted as the binding converts them."""
    return (_keys_arg(keys), _uints2(all_buffer_ptrs, "all_buffer_ptrs"), _uints2(all_sizes, "all_sizes"),
            _uints2(all_offsets, offsets_name))


def _lists_match(op: str, ks: list[str], ptrs: list[list[int]], sizes: list[list[int]], offs: list[list[int]],
                 offsets_name: str) -> bool:
    """True if the lists have one entry per key; else False and the error logged (every key then -600)."""
    if len(ks) == len(ptrs) == len(sizes) == len(offs):
        return True
    log.error("kvpool.mooncake %s: mismatched sizes for keys (%d), all_buffer_ptrs (%d), all_sizes (%d) and %s (%d)",
              op, len(ks), len(ptrs), len(sizes), offsets_name, len(offs))
    return False


def _uints2(value: Any, what: str) -> list[list[int]]:
    return [_uints(v, what) for v in _seq(value, what)]


def _uints3(value: Any, what: str) -> list[list[list[int]]]:
    return [_uints2(v, what) for v in _seq(value, what)]


def _overflows(offset: int, size: int, limit: int) -> bool:
    """True if ``[offset, offset + size)`` is not inside an object of ``limit`` bytes."""
    return size > limit or offset > limit - size


def _shaped(nbuf: int, all_keys: list[list[str]], all_dst: list[list[list[int]]], code: int) -> list[list[list[int]]]:
    """``get_into_ranges``' answer filled with ``code``, shaped as Mooncake shapes it: a row per buffer, in it
    a row per key (one if the keys are missing), in that a value per destination offset (one if missing)."""
    out: list[list[list[int]]] = []
    for i in range(nbuf):
        nkeys = len(all_keys[i]) if i < len(all_keys) else 1
        rows = []
        for j in range(nkeys):
            nfrag = len(all_dst[i][j]) if i < len(all_dst) and j < len(all_dst[i]) else 1
            rows.append([code] * nfrag)
        out.append(rows)
    return out


def _bytes_address(data: bytes) -> int:
    """The address of an immutable bytes object's first byte (valid while it lives)."""
    return ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0


# ------------------------------------------------------------------------------- session state

class _PutSession:
    """One object being written: its staging buffer, the put's options, and the seal."""

    __slots__ = ("buf", "base", "size", "kw", "cond", "writable", "inflight", "busy")

    def __init__(self, buf: bytearray, kw: dict[str, Any]) -> None:
        self.buf = buf
        self.base = _buffer_address(buf)
        self.size = len(buf)
        self.kw = kw
        self.cond = threading.Condition(threading.Lock())
        self.writable = True  # False once end or revoke began (or the store closed)
        self.inflight = 0     # ranged copies running
        self.busy = False     # an end is storing it

    def seal(self) -> None:
        """Refuses further ranged puts and waits for those running."""
        with self.cond:
            self.writable = False
            self.cond.wait_for(lambda: self.inflight == 0)


class _GetSession:
    """One object's bytes, read at session start."""

    __slots__ = ("data", "base")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.base = _bytes_address(data)


class _Sessions:
    """A store's open sessions and the bytes they hold."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.puts: dict[str, _PutSession] = {}
        self.gets: dict[str, _GetSession] = {}
        self.held = 0

    def room(self, extra: int) -> bool:
        limit = SESSION_BYTES_LIMIT
        return limit is None or self.held + extra <= limit


class _SameNodeIgnored:
    """A ReplicateConfig read without its ``prefer_alloc_in_same_node``."""

    def __init__(self, config: Any) -> None:
        self._config = config

    def __getattr__(self, name: str) -> Any:
        return False if name == "prefer_alloc_in_same_node" else getattr(self._config, name)


def _status_code(status: Any) -> int:
    """A session end's code for a kvpool ``PutStatus``: an object stored by someone else meanwhile is -705
    (the staged bytes were not stored), unlike a plain put, which Mooncake answers 0."""
    return _EXISTS if getattr(status, "name", "") == "ALREADY_EXISTS" else _put_code(status, False)


class _Store(Protocol):
    """What the methods here use of ``MooncakeDistributedStore`` (their ``self``; a mixin's self-type)."""

    _lock: threading.Lock
    _registered: dict[int, int]
    _range_sessions: Optional[_Sessions]

    def _require(self, what: str) -> Any: ...


def _sessions(store: _Store) -> _Sessions:
    """The store's session tables, created on first use."""
    st = store._range_sessions
    if st is None:
        with _state_lock:
            st = store._range_sessions
            if st is None:
                st = store._range_sessions = _Sessions()
    return st


def _staged_keys(store: _Store, keys: Sequence[str]) -> set[str]:
    """Those of ``keys`` in the store's open put sessions (Mooncake: not readable yet, -703)."""
    st = store._range_sessions
    if st is None:
        return set()
    with st.lock:
        return {k for k in keys if k in st.puts}


def _registered_room(store: _Store, ptr: int) -> Optional[int]:
    """Bytes from ``ptr`` to the end of the registered buffer holding it, or None if none does."""
    with store._lock:
        regions = list(store._registered.items())
    for base, size in regions:
        if base <= ptr < base + size:
            return base + size - ptr
    return None


def _ranges_ok(op: str, key: str, total: int, ptr: int, room: Optional[int], dsts: list[int], srcs: list[int],
               sizes: list[int], seen: Optional[_Seen] = None) -> list[bool]:
    """Which of one key's ranges can be read into one buffer (each refused one logged: it stays -600)."""
    ok = []
    for d, s, n in zip(dsts, srcs, sizes):
        if room is not None and (d > room or n > room - d):
            log.error("kvpool.mooncake %s: range [%d, +%d) of key %r overflows its registered buffer (%d bytes "
                      "from 0x%x)", op, d, n, key[:80], room, ptr)
            ok.append(False)
        elif _overflows(s, n, total):
            log.error("kvpool.mooncake %s: range overflow: src_offset=%d + size=%d > %d bytes of key %r", op,
                      s, n, total, key[:80])
            ok.append(False)
        else:
            ok.append(not n or _pieces_ok([(ptr + d, n)], True, op, key, seen))
    return ok


def _store_staged(op: str, client: Any, sessions: dict[str, _PutSession]) -> dict[str, int]:
    """Puts the staged objects, one batch per set of put options; a code per key."""
    groups: dict[tuple[tuple[str, Any], ...], list[str]] = {}
    for k, s in sessions.items():
        groups.setdefault(tuple(sorted(s.kw.items())), []).append(k)
    codes: dict[str, int] = {}
    for opts, group in groups.items():
        kw = dict(opts)
        values = [sessions[k].buf for k in group]
        try:
            if len(group) == 1:
                status = [client.put(group[0], values[0], **kw)]
            else:
                status = client.put_batch(group, values, **kw)
            codes.update((k, _status_code(ps)) for k, ps in zip(group, status))
        except Exception as e:  # noqa: BLE001
            c = _code_for(e, data=True)
            log.error("kvpool.mooncake %s: storing %d object(s) failed (%d): %s", op, len(group), c, e)
            codes.update((k, c) for k in group)
    for k, c in codes.items():
        if c == _EXISTS:
            log.error("kvpool.mooncake %s: key %r was stored by another writer during the session; the staged "
                      "bytes were discarded", op, k[:80])
    return codes


def _read_ranges(op: str, client: Any, todo: list[str], wanted: dict[str, list[tuple[int, int]]], ptrs: list[int],
                 rooms: list[Optional[int]], dsts: list[list[list[int]]], srcs: list[list[list[int]]],
                 sizes: list[list[list[int]]], out: list[list[list[int]]], failed: dict[str, int]) -> None:
    """Locates ``todo`` once and reads every range of theirs that fits into its destination, in one
    ``get_ranges_into``: fills ``out`` with the bytes read, ``failed`` with the keys missing (-704)."""
    located = client.locate(todo)
    slots: list[tuple[str, int, int, int]] = []  # key, buffer, key row, range
    offsets: list[int] = []
    targets: list[RawBuffer | bytearray] = []
    seen = _host_memory.seen()
    for n_key, k in enumerate(todo):
        total = located.value_length(n_key)
        if total < 0:
            failed[k] = _NOT_FOUND
            continue
        for i, j in wanted[k]:
            fits = _ranges_ok(op, k, total, ptrs[i], rooms[i], dsts[i][j], srcs[i][j], sizes[i][j], seen)
            for r, ok in enumerate(fits):
                if ok:
                    n = sizes[i][j][r]
                    slots.append((k, i, j, r))
                    offsets.append(srcs[i][j][r])
                    targets.append(RawBuffer(ptrs[i] + dsts[i][j][r], n) if n else bytearray(0))
    if not slots:
        return
    index = {k: n_key for n_key, k in enumerate(todo)}
    got = client.get_ranges_into(located.pick([index[k] for k, _, _, _ in slots]), offsets, targets)
    for (k, i, j, r), n in zip(slots, got):
        if n < 0:
            failed[k] = _NOT_FOUND
        else:
            out[i][j][r] = n


# ------------------------------------------------------------------------------------ the mixin

class _RangeMethods:
    """The ranged and session methods of ``MooncakeDistributedStore`` (a mixin; the store class composes it)."""

    _range_sessions: Optional[_Sessions] = None

    def _drop_sessions(self) -> None:
        """Discards every open put and get session and its memory (for ``close()``): staged objects are not
        stored. Takes only the session lock, so it may be called with the store's lock held."""
        st = self._range_sessions
        if st is None:
            return
        with st.lock:
            puts, gets = list(st.puts.values()), len(st.gets)
            st.puts, st.gets, st.held = {}, {}, 0
        for s in puts:
            with s.cond:
                s.writable = False  # a ranged put still copying keeps its buffer alive until it returns
        if puts:
            log.warning("kvpool.mooncake close: %d put session(s) were open; their objects were not stored", len(puts))
        if gets:
            log.info("kvpool.mooncake close: %d get session(s) dropped", gets)

    # ---------------------------------------------------------------------------- get_into_ranges

    def get_into_ranges(self: _Store, buffer_ptrs: Sequence[int],
                        all_keys: Sequence[Sequence[str]], all_dst_offsets: Sequence[Sequence[Sequence[int]]],
                        all_src_offsets: Sequence[Sequence[Sequence[int]]],
                        all_sizes: Sequence[Sequence[Sequence[int]]]) -> list[list[list[int]]]:
        """Copies byte ranges of objects into buffers: for each buffer ``i``, key ``j`` and range ``k``,
        ``all_sizes[i][j][k]`` bytes of object ``all_keys[i][j]`` from ``all_src_offsets[i][j][k]`` to
        ``buffer_ptrs[i] + all_dst_offsets[i][j][k]``. Returns ``result[i][j][k]``: the bytes copied, or a
        negative code: -704 in every range of a missing key (-703 for one in this store's put session), -600
        for a range outside the object or outside its registered buffer, for a null buffer, and everywhere
        the list shapes differ (shaped by ``buffer_ptrs``, ``all_keys`` and ``all_dst_offsets``).

        The objects are located once and each range read straight into its destination (a ranged read: only
        its bytes move). Buffers need no ``register_buffer`` here; a registered one bounds its ranges."""
        op = "get_into_ranges"
        ptrs = _uints(buffer_ptrs, "buffer_ptrs")
        keys = [_keys_arg(ks, "all_keys[i]") for ks in _seq(all_keys, "all_keys")]
        dsts = _uints3(all_dst_offsets, "all_dst_offsets")
        srcs = _uints3(all_src_offsets, "all_src_offsets")
        sizes = _uints3(all_sizes, "all_sizes")
        out = _shaped(len(ptrs), keys, dsts, _INVALID)
        client = self._require(op)
        if client is None:
            return out
        if not len(ptrs) == len(keys) == len(dsts) == len(srcs) == len(sizes):
            log.error("kvpool.mooncake %s: mismatched sizes for buffer_ptrs (%d), all_keys (%d), all_dst_offsets "
                      "(%d), all_src_offsets (%d) and all_sizes (%d)", op, len(ptrs), len(keys), len(dsts),
                      len(srcs), len(sizes))
            return out
        # the (buffer, key) pairs to serve, by key
        wanted: dict[str, list[tuple[int, int]]] = {}
        rooms: list[Optional[int]] = []
        for i, ptr in enumerate(ptrs):
            rooms.append(_registered_room(self, ptr) if ptr else None)
            if ptr == 0:
                log.error("kvpool.mooncake %s: buffer %d is a null pointer", op, i)
                continue
            if not len(keys[i]) == len(dsts[i]) == len(srcs[i]) == len(sizes[i]):
                log.error("kvpool.mooncake %s: buffer %d has %d keys but %d/%d/%d offset/size lists", op, i,
                          len(keys[i]), len(dsts[i]), len(srcs[i]), len(sizes[i]))
                continue
            for j, k in enumerate(keys[i]):
                if not len(dsts[i][j]) == len(srcs[i][j]) == len(sizes[i][j]):
                    log.error("kvpool.mooncake %s: key %r in buffer %d has mismatched offset and size lists", op,
                              k[:80], i)
                    continue
                wanted.setdefault(k, []).append((i, j))
        if not wanted:
            return out
        failed: dict[str, int] = {}
        staged = _staged_keys(self, list(wanted))
        todo: list[str] = []
        for k in wanted:
            if k in staged:
                failed[k] = _NOT_READY
            elif not _key_ok(k):
                failed[k] = _NOT_FOUND
            else:
                todo.append(k)
        try:
            _read_ranges(op, client, todo, wanted, ptrs, rooms, dsts, srcs, sizes, out, failed)
        except Exception as e:  # noqa: BLE001
            c = _code_for(e, data=True)
            log.error("kvpool.mooncake %s: reading %d object(s) failed (%d): %s", op, len(todo), c, e)
            failed.update((k, c) for k in todo)
        for k, c in failed.items():
            for i, j in wanted[k]:
                out[i][j] = [c] * len(out[i][j])
        return out

    # -------------------------------------------------------------------------------- get sessions

    def batch_get_session_start(self: _Store, keys: Sequence[str]) -> list[int]:
        """Opens a get session per key: reads each object whole, once, and keeps its bytes in this store until
        ``batch_get_session_end``. A code per key: 0, -704 missing (-703 while in this store's put session),
        -200 beyond ``SESSION_BYTES_LIMIT``, another negative code if the read failed. A key's earlier
        session is replaced, or dropped when the new start fails."""
        op = "batch_get_session_start"
        ks = _keys_arg(keys)
        client = self._require(op)
        if client is None:
            return [_INVALID] * len(ks)
        if not ks:
            return []
        codes: dict[str, int] = {}
        staged = _staged_keys(self, ks)
        todo = []
        for k in dict.fromkeys(ks):
            if k in staged:
                codes[k] = _NOT_READY
            elif not _key_ok(k):
                codes[k] = _NOT_FOUND
            else:
                todo.append(k)
        got: dict[str, bytes] = {}
        if todo:
            try:
                for k, v in zip(todo, client.get_batch(todo)):
                    if v is None:
                        codes[k] = _NOT_FOUND
                    else:
                        got[k] = v
            except Exception as e:  # noqa: BLE001
                c = _code_for(e, data=True)
                log.error("kvpool.mooncake %s: reading %d object(s) failed (%d): %s", op, len(todo), c, e)
                codes.update((k, c) for k in todo)
        st = _sessions(self)
        with st.lock:
            for k in dict.fromkeys(ks):
                old = st.gets.pop(k, None)
                if old is not None:
                    st.held -= len(old.data)
                data = got.get(k)
                if data is None:
                    continue
                if not st.room(len(data)):
                    log.error("kvpool.mooncake %s: key %r (%d bytes) would exceed SESSION_BYTES_LIMIT (%d bytes held)",
                              op, k[:80], len(data), st.held)
                    codes[k] = _NO_SPACE
                    continue
                st.gets[k] = _GetSession(data)
                st.held += len(data)
                codes[k] = _OK
        return [codes[k] for k in ks]

    def batch_get_into_multi_buffer_ranges(self: _Store, keys: Sequence[str],
                                           all_buffer_ptrs: Sequence[Sequence[int]],
                                           all_sizes: Sequence[Sequence[int]],
                                           all_src_offsets: Sequence[Sequence[int]]) -> list[int]:
        """Copies, for each key in a get session, ``all_sizes[i][j]`` bytes from ``all_src_offsets[i][j]`` of the
        object to ``all_buffer_ptrs[i][j]`` (no RPC). A value per key: the bytes copied (the sum of its sizes),
        or -600 without a session, for a range outside the object, for mismatched list lengths, or for a
        buffer that is not writable host memory (then nothing of that key is copied)."""
        op = "batch_get_into_multi_buffer_ranges"
        ks, ptrs, sizes, offs = _ranged_args(keys, all_buffer_ptrs, all_sizes, all_src_offsets, "all_src_offsets")
        out = [_INVALID] * len(ks)
        if self._require(op) is None or not _lists_match(op, ks, ptrs, sizes, offs, "all_src_offsets"):
            return out
        st = _sessions(self)
        seen = _host_memory.seen()
        for i, k in enumerate(ks):
            if not len(ptrs[i]) == len(sizes[i]) == len(offs[i]):
                log.error("kvpool.mooncake %s: key %r has mismatched buffer, size and offset lists", op, k[:80])
                continue
            with st.lock:
                g = st.gets.get(k)
            if g is None:
                log.error("kvpool.mooncake %s: key %r has no get session", op, k[:80])
                continue
            total = len(g.data)
            if any(_overflows(s, n, total) for s, n in zip(offs[i], sizes[i])):
                log.error("kvpool.mooncake %s: a range of key %r overflows its %d bytes", op, k[:80], total)
                continue
            pieces: Pieces = list(zip(ptrs[i], sizes[i]))
            if not _pieces_ok(pieces, True, op, k, seen):
                continue
            for (ptr, n), s in zip(pieces, offs[i]):
                _memmove(ptr, g.base + s, n)
            out[i] = sum(sizes[i])
        return out

    def batch_get_session_end(self: _Store, keys: Sequence[str]) -> int:
        """Ends the keys' get sessions and frees their bytes; 0 (also for keys without one), -1 before setup."""
        ks = _keys_arg(keys)
        if self._require("batch_get_session_end") is None:
            return _INTERNAL
        st = self._range_sessions
        if st is not None:
            with st.lock:
                for k in ks:
                    g = st.gets.pop(k, None)
                    if g is not None:
                        st.held -= len(g.data)
        return _OK

    # -------------------------------------------------------------------------------- put sessions

    def batch_put_session_start(self: _Store, keys: Sequence[str], sizes: Sequence[int],
                                config: Any = None) -> list[int]:
        """Opens a put session per key for an object of ``sizes[i]`` bytes, staged in this store (zero-filled)
        until ``batch_put_session_end`` stores it. A code per key: 0; -705 if the object exists (also for a
        key's second occurrence); -600 if the key already has a session here, for a zero size, a key or size
        kvpool cannot hold, mismatched lengths or a refused ``config`` (replica_num 0, NoF replicas beyond
        Mooncake's one flexible NoF copy, ``group_ids`` not one per key...); -200 when the staging memory
        cannot be had or would exceed ``SESSION_BYTES_LIMIT``. ``config`` applies when the session ends;
        ``prefer_alloc_in_same_node`` is accepted here and ignored, as kvpool places replicas itself."""
        op = "batch_put_session_start"
        ks = _keys_arg(keys)
        ns = _uints(sizes, "sizes")
        client = self._require(op)
        if client is None:
            return [_INVALID] * len(ks)
        if len(ks) != len(ns):
            log.error("kvpool.mooncake %s: %d keys but %d sizes", op, len(ks), len(ns))
            return [_INVALID] * len(ks)
        group_ids = getattr(config, "group_ids", None) if config is not None else None
        if group_ids is not None and len(group_ids) != len(ks):
            log.error("kvpool.mooncake %s: group_ids has %d entries for %d keys", op, len(group_ids), len(ks))
            return [_INVALID] * len(ks)
        if config is not None:
            nof = int(getattr(config, "nof_replica_num", 0) or 0)
            flexible = (int(getattr(config, "dfs_replica_num", 0) or 0) == 0 and
                        int(getattr(config, "replica_num", 1) or 0) == 1 and nof == 1)
            if nof and not flexible:
                log.error("kvpool.mooncake %s: NoF replicas (nof_replica_num=%d) are refused for put sessions, as "
                          "in Mooncake (only replica_num=1 with nof_replica_num=1 is accepted)", op, nof)
                return [_INVALID] * len(ks)
        if config is not None and getattr(config, "prefer_alloc_in_same_node", False):
            # Mooncake's puts refuse it but its session start takes it; kvpool places replicas by its own rules
            _warn_once("session_same_node", "kvpool.mooncake %s: prefer_alloc_in_same_node ignored: kvpool places "
                       "replicas by its own rules", op)
            config = _SameNodeIgnored(config)
        code, kw = _replication(config, op)
        if code:
            return [code] * len(ks)
        out = [_INVALID] * len(ks)
        st = _sessions(self)
        with st.lock:
            open_keys = {k for k in ks if k in st.puts}
        max_value = getattr(client, "max_value_bytes", None)
        first: dict[str, int] = {}
        for i, (k, n) in enumerate(zip(ks, ns)):
            if k in open_keys:
                log.error("kvpool.mooncake %s: key %r already has a put session", op, k[:80])
            elif not _key_ok(k):
                log.error("kvpool.mooncake %s: key %r is empty or longer than kvpool's limit", op, k[:80])
            elif n == 0:
                log.error("kvpool.mooncake %s: size 0 for key %r", op, k[:80])
            elif max_value is not None and n > max_value:
                log.error("kvpool.mooncake %s: %d bytes for key %r; the kvpool master accepts at most %d", op, n,
                          k[:80], max_value)
            elif k in first:
                out[i] = _EXISTS  # Mooncake: the master has the first occurrence's object in progress
            else:
                first[k] = i
        if first:
            try:
                present = client.batch_exists(list(first))
            except Exception as e:  # noqa: BLE001
                c = _code_for(e, data=False)
                log.error("kvpool.mooncake %s: checking %d key(s) failed (%d): %s", op, len(first), c, e)
                for i in first.values():
                    out[i] = c
                return out
            for k, there in zip(list(first), present):
                if there:
                    out[first.pop(k)] = _EXISTS
        for k, i in first.items():
            try:
                buf = bytearray(ns[i])
            except MemoryError:
                log.error("kvpool.mooncake %s: no memory to stage %d bytes for key %r", op, ns[i], k[:80])
                out[i] = _NO_SPACE
                continue
            with st.lock:
                if k in st.puts:  # another thread opened it meanwhile
                    log.error("kvpool.mooncake %s: key %r already has a put session", op, k[:80])
                    continue
                if not st.room(ns[i]):
                    log.error("kvpool.mooncake %s: key %r (%d bytes) would exceed SESSION_BYTES_LIMIT (%d bytes held)",
                              op, k[:80], ns[i], st.held)
                    out[i] = _NO_SPACE
                    continue
                st.puts[k] = _PutSession(buf, kw)
                st.held += ns[i]
            out[i] = _OK
        return out

    def batch_put_from_multi_buffer_ranges(self: _Store, keys: Sequence[str],
                                           all_buffer_ptrs: Sequence[Sequence[int]],
                                           all_sizes: Sequence[Sequence[int]],
                                           all_dst_offsets: Sequence[Sequence[int]]) -> list[int]:
        """Copies, for each key in a put session, ``all_sizes[i][j]`` bytes at ``all_buffer_ptrs[i][j]`` to
        offset ``all_dst_offsets[i][j]`` of the staged object (no RPC; ranges are copied in list order, so
        where they overlap the later one wins). A value per key: the bytes copied; -600 without an open
        session (none, or ended, revoked, ending), for a range outside the object, mismatched list lengths,
        or a buffer that is not readable host memory (then nothing of that key is copied); -702 for a key
        with no ranges, as Mooncake answers."""
        op = "batch_put_from_multi_buffer_ranges"
        ks, ptrs, sizes, offs = _ranged_args(keys, all_buffer_ptrs, all_sizes, all_dst_offsets, "all_dst_offsets")
        out = [_INVALID] * len(ks)
        if self._require(op) is None or not _lists_match(op, ks, ptrs, sizes, offs, "all_dst_offsets"):
            return out
        st = _sessions(self)
        seen = _host_memory.seen()
        for i, k in enumerate(ks):
            if not len(ptrs[i]) == len(sizes[i]) == len(offs[i]):
                log.error("kvpool.mooncake %s: key %r has mismatched buffer, size and offset lists", op, k[:80])
                continue
            with st.lock:
                s = st.puts.get(k)
            if s is None or not s.writable:
                log.error("kvpool.mooncake %s: key %r has no open put session", op, k[:80])
                continue
            if any(_overflows(o, n, s.size) for o, n in zip(offs[i], sizes[i])):
                log.error("kvpool.mooncake %s: a range of key %r overflows its %d bytes", op, k[:80], s.size)
                continue
            if not ptrs[i]:
                log.error("kvpool.mooncake %s: no ranges for key %r", op, k[:80])
                out[i] = _INVALID_REPLICA
                continue
            pieces: Pieces = list(zip(ptrs[i], sizes[i]))
            if not _pieces_ok(pieces, False, op, k, seen):
                continue
            with s.cond:
                if not s.writable:
                    log.error("kvpool.mooncake %s: the put session of key %r was ended or revoked", op, k[:80])
                    continue
                s.inflight += 1
            try:
                for (ptr, n), o in zip(pieces, offs[i]):
                    _memmove(s.base + o, ptr, n)
            finally:
                with s.cond:
                    s.inflight -= 1
                    if not s.inflight:
                        s.cond.notify_all()
            out[i] = sum(sizes[i])
        return out

    def batch_put_session_end(self: _Store, keys: Sequence[str]) -> list[int]:
        """Stores each key's staged object (one batch put) and ends its session. A code per key: 0; -600 without
        an open session (none, revoked, already ended, or being ended by another call); -705 if the key was
        stored by someone else meanwhile; another negative code if the put failed. A failed key keeps its
        session, sealed against ranged puts: end it again or revoke it."""
        op = "batch_put_session_end"
        ks = _keys_arg(keys)
        client = self._require(op)
        if client is None:
            return [_INVALID] * len(ks)
        st = _sessions(self)
        mine: dict[str, _PutSession] = {}
        with st.lock:
            for k in ks:
                s = st.puts.get(k)
                if k in mine or s is None or s.busy:
                    continue
                s.busy = True
                mine[k] = s
        for k in ks:
            if k not in mine:
                log.error("kvpool.mooncake %s: key %r has no put session", op, k[:80])
        for s in mine.values():
            s.seal()
        codes = _store_staged(op, client, mine)
        with st.lock:
            for k, s in mine.items():
                s.busy = False
                if codes[k] == _OK and st.puts.get(k) is s:
                    del st.puts[k]
                    st.held -= s.size
        return [codes.get(k, _INVALID) for k in ks]

    def batch_put_session_revoke(self: _Store, keys: Sequence[str]) -> list[int]:
        """Ends each key's put session without storing anything and frees its staging. A code per key: 0, or
        -600 without an open session (none, already ended or revoked, or being ended by another call)."""
        op = "batch_put_session_revoke"
        ks = _keys_arg(keys)
        if self._require(op) is None:
            return [_INVALID] * len(ks)
        st = _sessions(self)
        mine: dict[str, _PutSession] = {}
        with st.lock:
            for k in ks:
                s = st.puts.get(k)
                if k in mine or s is None or s.busy:
                    continue
                del st.puts[k]
                st.held -= s.size
                mine[k] = s
        for s in mine.values():
            s.seal()
        out = []
        for k in ks:
            if k in mine:
                out.append(_OK)
            else:
                log.error("kvpool.mooncake %s: key %r has no put session", op, k[:80])
                out.append(_INVALID)
        return out
