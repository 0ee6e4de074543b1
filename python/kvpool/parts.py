"""Puts in parts (protocol version 11, docs/protocol.md section 4.35): ``Client.begin_put`` reserves every
object, ``PutInParts.write`` stores byte ranges of their values as they become available (many per object,
in any order, from any thread), and ``finish`` makes the objects visible. A layer-by-layer save writes layer
``l`` of each block as the range ``[l * layer_bytes, (l + 1) * layer_bytes)`` of its object as soon as the
layer is computed.

Guarantees (the Java ``PutInParts`` gives the same):

* Nothing is visible before ``finish``. An object becomes visible only if every byte of its value was
  written, by ranges that do not overlap (an overlapping range is refused with ValueError); one with any byte
  unwritten fails (``PutStatus.FAILED``) and nothing of it is readable.
* The checksum stored is the CRC32C of the caller's bytes: each part is checksummed when written and the
  parts' checksums combined at the end (``crc.crc32c_combine``), so no byte is read twice.
* A ``remove_all(force=True)`` or a new master between the begin and the finish fences the objects (FENCED
  or FAILED). ``abandon`` (and leaving a ``with`` block unfinished) drops everything.

How the bytes move: the objects are reserved with PUT_START (this client has no write leases) and the nodes
admit every copy at the begin (NODE_PART_BEGIN, on one connection per node, held to the end: the node ties
the writes to it). A part for a segment this process has mapped is copied into it at once, after checking
that the object's header still says this write is in progress there; a part for another node goes as a
NODE_PART_WRITE from the caller's memory, without a staging copy, one frame per call and node. Those frames
are pipelined (docs/protocol.md, section 1.2): a write returns once its frame is on the socket, so layer l+1's
part follows layer l's without a round trip between them; a part the node refused fails its copy when its
answer is taken (at a later write, up to ``PIPELINED_WRITES`` frames and ``PIPELINED_PARTS`` parts unanswered,
or at the finish). ``finish`` ends the writes (NODE_PART_END with each value's checksum) and completes them (PUT_END, and
PUT_REVOKE for what landed nowhere). The reservation lasts the master's put timeout (30 s by default).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import deque
from typing import TYPE_CHECKING, Sequence

from . import protocol as p
from ._net import Connection, ConnectionPool, frame_end
from .buffers import Buffer, as_memoryview
from .crc import crc32c, crc32c_combine
from .errors import KvPoolError
from .protocol import Opcode, ResultCode, SegmentStats
from .results import PutStatus
from .shm import Mapping

if TYPE_CHECKING:
    from .channels import Channels

log = logging.getLogger("kvpool")

_REFUSALS = {ResultCode.ALREADY_EXISTS: PutStatus.ALREADY_EXISTS, ResultCode.POOL_FULL: PutStatus.POOL_FULL,
             ResultCode.NO_SEGMENT: PutStatus.NO_SEGMENT, ResultCode.QUOTA_EXCEEDED: PutStatus.QUOTA_EXCEEDED}


#: Most NODE_PART_WRITE frames unanswered on one connection, and most parts in them: an answer is a 36-byte frame
#: and a byte a part, so the answers not read yet stay within about 19 KiB, well inside a socket's buffers (the
#: node never stalls writing an answer while this side still writes parts, which would stall both).
PIPELINED_WRITES = 64
PIPELINED_PARTS = 16384


class _Session:
    """A segment's connection, held from the begin to the end, and the part writes sent on it and not answered
    yet (the copies of each frame, oldest first)."""

    __slots__ = ("seg", "pool", "mapping", "conn", "lock", "copies", "unanswered", "unanswered_parts")

    def __init__(self, seg: SegmentStats, pool: ConnectionPool, mapping: Mapping | None) -> None:
        self.seg = seg
        self.pool = pool
        self.mapping = mapping if mapping is not None and mapping.writable else None
        self.conn: Connection | None = None
        self.lock = threading.Lock()
        self.copies: list[_Copy] = []
        self.unanswered: deque[list[_Copy]] = deque()
        self.unanswered_parts = 0


class _Copy:
    """One copy of one item: its region, and how its write stands (``outcome`` OK while it does)."""

    __slots__ = ("item", "replica", "chunk", "offset", "generation", "grant", "session", "begun", "outcome")

    def __init__(self, item: int, replica: int, chunk: int, offset: int, generation: int,
                 grant: p.WriteGrant) -> None:
        self.item = item
        self.replica = replica
        self.chunk = chunk
        self.offset = offset
        self.generation = generation
        self.grant = grant
        self.session: _Session | None = None
        self.begun = False
        self.outcome = ResultCode.FAILED

    def fail(self, code: ResultCode) -> None:
        if self.outcome == ResultCode.OK:
            self.outcome = ResultCode.FAILED if code == ResultCode.OK else code


class PutInParts:
    """A put whose values are written in parts; made by ``Client.begin_put``. Usable as a context manager
    (leaving the block without ``finish`` abandons it)."""

    def __init__(self, ch: Channels, keys: Sequence[str], kb: list[bytes], lengths: list[int]) -> None:
        self._ch = ch
        self.keys = list(keys)
        self._kb = kb
        self._lengths = lengths
        self._refused: list[PutStatus | None] = [None] * len(kb)
        self._copies: list[list[_Copy]] = [[] for _ in kb]
        # per PUT_START chunk: (epoch, term, master run, first item, generations of its OK items)
        self._chunks: list[tuple[int, int, int, int, dict[int, int]]] = []
        self._sessions: dict[tuple[int, int], _Session] = {}  # by (master run, segment id)
        self._parts: list[dict[int, tuple[int, int]]] = [{} for _ in kb]  # start -> (end, crc)
        self._parts_lock = threading.Lock()
        self._state = "open"
        self._writers = 0
        self._gate = threading.Condition()
        self._final: list[PutStatus] | None = None

    # ------------------------------------------------------------------------------------- begin

    @classmethod
    def begin(cls, ch: Channels, keys: Sequence[str], value_lengths: Sequence[int], replicas: int,
              preferred: str, pin_seconds: int) -> PutInParts:
        if len(keys) != len(value_lengths):
            raise ValueError(f"{len(keys)} keys but {len(value_lengths)} value lengths")
        kb = p.encode_keys_checked(keys)
        lengths = [int(n) for n in value_lengths]
        for k, n in zip(keys, lengths):
            if not 0 <= n <= ch.master.max_value_bytes:
                raise ValueError(f"value length {n} for key {p.abbreviate(k)!r} is outside "
                                 f"0..{ch.master.max_value_bytes} (the pool's largest value)")
        if not 0 <= replicas <= 255:
            raise ValueError(f"replicas must be 0..8 (0 = the master's default), got {replicas}")
        put = cls(ch, keys, kb, lengths)
        try:
            put._reserve(replicas, preferred, pin_seconds)
            put._begin()
        except BaseException:
            put.abandon()
            raise
        return put

    def _reserve(self, replicas: int, preferred: str, pin_seconds: int) -> None:
        for lo in range(0, len(self._kb), p.MAX_KEYS_PER_FRAME):
            hi = min(len(self._kb), lo + p.MAX_KEYS_PER_FRAME)
            items = [(self._kb[i], self._lengths[i]) for i in range(lo, hi)]
            (epoch, term, results), run = self._ch.master.call_in_run(
                Opcode.BATCH_PUT_START if len(self._kb) > 1 else Opcode.PUT_START,
                p.encode_put_start(False, replicas, preferred, items, pin_seconds), p.decode_put_start_reply)
            if len(results) != hi - lo:
                raise p.ProtocolError(f"PUT_START reply has {len(results)} results for {hi - lo} items")
            chunk = len(self._chunks)
            self._chunks.append((epoch, term, run, lo, {}))
            for j, r in enumerate(results):
                i = lo + j
                if r.code != ResultCode.OK:
                    self._refused[i] = _REFUSALS.get(r.code, PutStatus.FAILED)
                    continue
                self._chunks[chunk][4][i] = r.generation
                region = p.region_length(len(self._kb[i]), self._lengths[i])
                for rep_no, rep in enumerate(r.replicas):
                    c = _Copy(i, rep_no, chunk, rep.offset, r.generation, r.grant(rep_no, region))
                    self._copies[i].append(c)
                    s = self._sessions.get((run, rep.segment_id))
                    if s is None:
                        seg = self._ch.segments.segment(rep.segment_id, run)
                        if seg is None:
                            continue  # the master changed since: this copy fails
                        s = self._sessions[(run, rep.segment_id)] = _Session(seg, self._ch.segments.node_pool(seg),
                                                                             self._ch.segments.shm.mapping(seg))
                    c.session = s
                    s.copies.append(c)

    def _begin(self) -> None:
        def begin_on(s: _Session) -> None:
            with s.lock:
                try:
                    s.conn = s.pool.borrow(self._ch.timeout)
                    for chunk, (epoch, term, _, _, _) in enumerate(self._chunks):
                        copies = [c for c in s.copies if c.chunk == chunk]
                        for lo in range(0, len(copies), p.MAX_ITEMS_PER_NODE_FRAME):
                            part = copies[lo:lo + p.MAX_ITEMS_PER_NODE_FRAME]
                            body = p.encode_node_write(epoch, term, [p.WriteItem(
                                c.offset, c.generation, self._kb[c.item], self._lengths[c.item], 0, c.grant)
                                for c in part])
                            reply, _ = s.conn.call(Opcode.NODE_PART_BEGIN, body, self._ch.timeout)
                            for c, code in zip(part, p.decode_codes(reply, "NODE_PART_BEGIN reply")):
                                c.begun = code == ResultCode.OK
                                c.outcome = code
                except (OSError, KvPoolError, ValueError) as e:
                    _broken(s, "begin", e)

        self._ch.run_tasks([functools.partial(begin_on, s) for s in self._sessions.values()])

    # ------------------------------------------------------------------------------------- state

    def __len__(self) -> int:
        return len(self.keys)

    def value_length(self, item: int) -> int:
        return self._lengths[item]

    def status(self, item: int) -> PutStatus | None:
        """The item's outcome as far as it is known: None while it can still succeed; the begin's refusal
        (``ALREADY_EXISTS``, ``POOL_FULL``, ``NO_SEGMENT``); ``FENCED`` or ``FAILED`` once every copy failed;
        after ``finish``, its final status. Writes to an item with a status move no bytes."""
        if self._final is not None:
            return self._final[item]
        if self._refused[item] is not None:
            return self._refused[item]
        copies = self._copies[item]
        if any(c.outcome == ResultCode.OK for c in copies):
            return None
        return PutStatus.FENCED if any(c.outcome == ResultCode.FENCED for c in copies) else PutStatus.FAILED

    # ------------------------------------------------------------------------------------- parts

    def write(self, item: int, offset: int, src: Buffer) -> bool:
        """Writes ``src`` at ``offset`` of item ``item``'s value. True if the bytes reached at least one copy
        (False: refused at the begin, or every copy failed; ``status`` says why and ``finish`` reports it).

        Raises ValueError naming the key for a range outside the value or overlapping one written before,
        and RuntimeError after ``finish`` or ``abandon``."""
        return self.write_many([item], [offset], [src])[0]

    def write_many(self, items: Sequence[int], offsets: Sequence[int], srcs: Sequence[Buffer]) -> list[bool]:
        """Writes many parts at once (one NODE_PART_WRITE per node instead of one per part): ``srcs[k]`` at
        ``offsets[k]`` of item ``items[k]``. Every part is checked before any byte moves."""
        if not len(items) == len(offsets) == len(srcs):
            raise ValueError(f"{len(items)} items but {len(offsets)} offsets and {len(srcs)} sources")
        views = []
        for item, off, src in zip(items, offsets, srcs):
            if not 0 <= item < len(self.keys):
                raise ValueError(f"item {item} of a put in parts of {len(self.keys)} objects")
            v = as_memoryview(src, what=f"part of key {p.abbreviate(self.keys[item])!r}")
            if off < 0 or off > self._lengths[item] - v.nbytes:
                raise ValueError(f"range [{off}, {off} + {v.nbytes}) of key {p.abbreviate(self.keys[item])!r} is "
                                 f"outside its value of {self._lengths[item]} bytes")
            views.append(v)
        with self._gate:
            if self._state != "open":
                raise RuntimeError(f"put in parts is {self._state}; no more parts can be written")
            self._writers += 1
        try:
            crcs = [crc32c(v) if v.nbytes else 0 for v in views]
            self._record(items, offsets, views, crcs)
            by_session: dict[int, list[tuple[_Copy, int, memoryview]]] = {}
            for item, off, v in zip(items, offsets, views):
                for c in self._copies[item]:
                    if c.outcome != ResultCode.OK or not v.nbytes or c.session is None:
                        continue
                    s = c.session
                    if s.mapping is not None:
                        if not s.mapping.write_part(c.offset, c.generation, len(self._kb[item]), off, v):
                            c.fail(ResultCode.FENCED)
                        else:
                            self._ch.count("bytes_written_shm", v.nbytes)
                    else:
                        by_session.setdefault(id(s), []).append((c, off, v))
            if by_session:
                self._ch.run_tasks([functools.partial(self._send, parts) for parts in by_session.values()])
            return [self.status(item) is None for item in items]
        finally:
            with self._gate:
                self._writers -= 1
                self._gate.notify_all()

    def _record(self, items: Sequence[int], offsets: Sequence[int], views: list[memoryview], crcs: list[int]) -> None:
        with self._parts_lock:
            added: list[tuple[int, int]] = []
            for item, off, v, crc in zip(items, offsets, views, crcs):
                if not v.nbytes:
                    continue
                end = off + v.nbytes
                for start, (stop, _) in self._parts[item].items():
                    if start < end and off < stop:
                        for i, o in added:
                            del self._parts[i][o]
                        raise ValueError(f"range [{off}, {end}) of key {p.abbreviate(self.keys[item])!r} overlaps the "
                                         f"range [{start}, {stop}) written before")
                self._parts[item][off] = (end, crc)
                added.append((item, off))

    def _send(self, parts: list[tuple[_Copy, int, memoryview]]) -> None:
        s = parts[0][0].session
        assert s is not None
        with s.lock:
            if s.conn is None:
                for c, _, _ in parts:
                    c.fail(ResultCode.FAILED)
                return
            try:
                start = 0
                while start < len(parts):
                    end = frame_end([v.nbytes for _, _, v in parts], start, p.DEFAULT_MAX_PAYLOAD_BYTES)
                    chunk = parts[start:end]
                    body = p.encode_part_write([(c.offset, c.generation, off, v.nbytes) for c, off, v in chunk])
                    while s.unanswered and (len(s.unanswered) >= PIPELINED_WRITES
                                            or s.unanswered_parts + len(chunk) > PIPELINED_PARTS):
                        self._answered(s)
                    # pipelined: the next part (the next layer) goes without waiting for this one's answer
                    s.conn.send(Opcode.NODE_PART_WRITE, body, self._ch.timeout, [v for _, _, v in chunk])
                    s.unanswered.append([c for c, _, _ in chunk])
                    s.unanswered_parts += len(chunk)
                    self._ch.count("bytes_written_tcp", sum(v.nbytes for _, _, v in chunk))
                    start = end
            except (OSError, KvPoolError, ValueError) as e:
                _broken(s, "part write", e)

    def _answered(self, s: _Session) -> None:
        """Takes the oldest unanswered NODE_PART_WRITE's answer: the parts it refused fail their copies. Caller
        holds the session's lock."""
        assert s.conn is not None
        copies = s.unanswered.popleft()
        s.unanswered_parts -= len(copies)
        reply, _ = s.conn.receive(self._ch.timeout)
        codes = p.decode_codes(reply, "NODE_PART_WRITE reply")
        if len(codes) != len(copies):
            raise p.ProtocolError(f"{s.seg.name} answered {len(codes)} codes to a part write of {len(copies)} parts")
        for c, code in zip(copies, codes):
            if code != ResultCode.OK:
                c.fail(code)

    # ------------------------------------------------------------------------------------- end

    def _combined(self, item: int) -> int | None:
        """The CRC32C of the item's whole value from its parts, or None when they do not cover it exactly."""
        at, crc = 0, 0
        for start in sorted(self._parts[item]):
            end, part = self._parts[item][start]
            if start != at:
                return None
            crc = crc32c_combine(crc, part, end - at)
            at = end
        return crc if at == self._lengths[item] else None

    def _close_writes(self, state: str) -> None:
        with self._gate:
            if self._state != "open":
                raise RuntimeError(f"put in parts is already {self._state}")
            self._state = state
            self._gate.wait_for(lambda: self._writers == 0)

    def finish(self) -> list[PutStatus]:
        """Ends every write and completes the objects at the master: a status per item. An item with any byte
        of its value unwritten is ``FAILED`` and not visible. RuntimeError if already finished or abandoned."""
        self._close_writes("finished")
        crcs = [self._combined(i) for i in range(len(self._kb))]

        def end_on(s: _Session) -> None:
            with s.lock:
                begun = [c for c in s.copies if c.begun]
                try:
                    if s.conn is None:
                        return
                    while s.unanswered:
                        self._answered(s)
                    for lo in range(0, len(begun), p.MAX_ITEMS_PER_NODE_FRAME):
                        part = begun[lo:lo + p.MAX_ITEMS_PER_NODE_FRAME]
                        body = p.encode_part_end([(c.offset, c.generation, crcs[c.item] or 0,
                                                   crcs[c.item] is not None and c.outcome == ResultCode.OK)
                                                  for c in part])
                        reply, _ = s.conn.call(Opcode.NODE_PART_END, body, self._ch.timeout)
                        for c, code in zip(part, p.decode_codes(reply, "NODE_PART_END reply")):
                            if c.outcome == ResultCode.OK:
                                c.outcome = ResultCode.FAILED if crcs[c.item] is None else code
                    s.pool.release(s.conn)
                    s.conn = None
                except (OSError, KvPoolError, ValueError) as e:
                    _broken(s, "end", e)

        self._ch.run_tasks([functools.partial(end_on, s) for s in self._sessions.values()])
        status: list[PutStatus] = [r if r is not None else PutStatus.FAILED for r in self._refused]
        ends: list[tuple[bytes, int, int]] = []
        end_idx: list[int] = []
        revokes: list[tuple[bytes, int, int]] = []
        for chunk in self._chunks:
            for i, gen in chunk[4].items():
                copies = self._copies[i]
                failed = sum(1 << c.replica for c in copies if c.outcome != ResultCode.OK)
                if any(c.outcome == ResultCode.OK for c in copies):
                    ends.append((self._kb[i], gen, failed))
                    end_idx.append(i)
                else:
                    revokes.append((self._kb[i], gen, 0))
                    status[i] = PutStatus.FENCED if any(c.outcome == ResultCode.FENCED for c in copies) \
                        else PutStatus.FAILED
        self._revoke(revokes)
        for lo in range(0, len(ends), p.MAX_KEYS_PER_FRAME):
            codes = self._ch.master.call(Opcode.BATCH_PUT_END, p.encode_put_end(ends[lo:lo + p.MAX_KEYS_PER_FRAME]),
                                         lambda b: p.decode_codes(b, "PUT_END reply"))
            for i, code in zip(end_idx[lo:lo + p.MAX_KEYS_PER_FRAME], codes):
                status[i] = PutStatus.OK if code == ResultCode.OK else \
                    PutStatus.FENCED if code == ResultCode.FENCED else PutStatus.FAILED
        self._final = status
        return list(status)

    def _revoke(self, revokes: list[tuple[bytes, int, int]]) -> None:
        for lo in range(0, len(revokes), p.MAX_KEYS_PER_FRAME):
            try:
                self._ch.master.call(Opcode.BATCH_PUT_REVOKE, p.encode_put_end(revokes[lo:lo + p.MAX_KEYS_PER_FRAME]),
                                     lambda b: p.decode_codes(b, "PUT_REVOKE reply"))
            except KvPoolError as e:
                log.debug("kvpool: revoke failed; the master reclaims the space at its put timeout: %s", e)

    def abandon(self) -> None:
        """Drops the put: the nodes drop what was written, the master gets the reservations back, nothing
        becomes visible. Does nothing once finished or abandoned."""
        try:
            self._close_writes("abandoned")
        except RuntimeError:
            return
        for s in self._sessions.values():
            with s.lock:
                _broken(s, "abandon", None)
        self._revoke([(self._kb[i], gen, 0) for chunk in self._chunks for i, gen in chunk[4].items()])
        self._final = [r if r is not None else PutStatus.FAILED for r in self._refused]

    def __enter__(self) -> PutInParts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abandon()

    def __repr__(self) -> str:
        return f"PutInParts({len(self.keys)} objects, {self._state})"


def _broken(s: _Session, what: str, e: Exception | None) -> None:
    """The session's connection failed (or the put was abandoned): its copies fail, and closing it makes the
    node drop every write begun on it."""
    if e is not None:
        log.debug("kvpool: put in parts: %s on %s failed: %s", what, s.seg.name, e)
    for c in s.copies:
        c.fail(ResultCode.FAILED)
    s.unanswered.clear()
    s.unanswered_parts = 0
    if s.conn is not None:
        s.conn.close()
        s.pool.release(s.conn)
        s.conn = None
