"""The kvpool client for Python: the same operations and semantics as the Java ``KvPoolClient``.

Design notes
------------
* **Puts** (docs/protocol.md 6.1): a single-copy put without a pin goes under a **write lease**
  (``kvpool.leased_puts``): its bytes go to the node at once, into a range of a segment the master leased
  to this process, and one COMMIT makes them visible, so a small put is one node exchange and one COMMIT.
  That needs the **read lease** (``kvpool.read_lease``), which is how a removeAll(force) reaches this
  client before it returns. Other puts, and every put while no read lease can be held, are **two-phase**
  (``kvpool.two_phase``): PUT_START, the node writes, PUT_END. The master never sees value bytes.
* **Reads** ask the master where each key is (GET_REPLICA_LIST), then read from the replicas in
  rounds, local ones first: from the mapped segment with the check-copy-check of ``kvpool.shm``, or
  with NODE_READ straight into the caller's memory. A replica that misses or fails is followed by
  the next one; a key whose every replica missed is a miss.
* **Remembered locations** (``kvpool.locations``, as the Java ``LocationCache``): a read of a key whose location
  this process learned before skips the master while the process holds its read lease, which is how every
  removal, reset and upsert reaches it before it returns; a copy from a remembered location stands only if the
  lease still runs after it and no invalidation since the read began covers the key, else the key is asked of
  the master. So a read that begins after a removal returned never yields the removed bytes, even from a frozen
  node's segment. ``location_cache=0`` asks the master on every read.
* **Values, not exceptions**: a miss is ``None`` / ``MISS``, "already exists", "pool full", "fenced"
  are ``PutStatus`` values. Exceptions are for bad arguments (ValueError naming the key or buffer) and
  for failed requests (``KvPoolError``; ``MasterUnreachable`` names the master).
* **Threads and processes**: every method may be called from any thread; connections are pooled per
  peer. After ``fork()`` the child opens its own connections (``kvpool._net``) and takes its own read and
  write leases (``_leasing_here``); it never uses its parent's.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence, TypeVar

from . import lanes
from . import protocol as p
from . import reads, two_phase
from ._net import Connection, ConnectionPool, frame_end, parse_host_port, pid
from .auth import Secrets
from .tls import from_environment as tls_from_environment
from .buffers import Buffer, Filler, materialize
from .config import master_from_environment
from .codec import signed64
from .etcd import LeaderInfo, LeaderWatch, parse_etcd_url
from .leased_puts import Leasing
from .locations import DEFAULT_ENTRIES as DEFAULT_LOCATIONS
from .errors import KvPoolError, MasterTimeout, MasterUnreachable
from .protocol import Opcode, PoolStats, ResultCode, SegmentStats
from .ranged import RangedIO
from .results import MISS, PutResult, PutStatus
from .shm import SharedSegments
from .tiers import TierCounts
from .block_info import BlockInfo, decode_kept, encode_block_infos

log = logging.getLogger("kvpool")

T = TypeVar("T")

#: Oldest segment table used to pick a local segment for placement (as the Java client).
LOCAL_TABLE_AGE = 10.0
#: A request after this long without a HELLO or PING is preceded by a PING on the same connection.
PING_INTERVAL = 4.0
#: A node frame carrying fewer value bytes than this goes over TCP (NODE_WRITE) even to a segment this
#: process has mapped: the same-machine write takes two exchanges with the node (SHM_WRITE_BEGIN and END)
#: where NODE_WRITE takes one, and below this size sending the bytes costs less than that exchange
#: (single puts measured on loopback, 2026-11-26: TCP 109 us and shared memory 149 us at 4 KiB, equal at
#: 512 KiB, shared memory 336 us and TCP 521 us at 1 MiB). ``Client.shm_write_min_bytes`` overrides it.
SHM_WRITE_MIN_BYTES = 512 << 10


_signed64 = signed64


class Client(RangedIO):
    """A connection to a kvpool pool: puts, gets, probes and removals against its master and nodes; ranged
    reads and puts in parts (``locate``, ``get_ranges_into``, ``begin_put``: ``kvpool.ranged``).

    ``master`` is ``host:port``, or ``etcd://host:port[,host:port...][/cluster]`` for masters elected
    through etcd (the client then talks to the leader that etcd names once it is ready, and moves to
    a new leader by itself: a call that fails at the connection level is retried on the next leader
    within ``timeout``); without it the address comes from ``KVPOOL_MASTER`` or the JSON client
    config named by ``KVPOOL_CONFIG_PATH``. The constructor connects (HELLO, which checks the
    protocol version) and raises ``MasterUnreachable`` naming the address if it cannot.

    ``timeout`` bounds every network wait of a call (seconds); ``connect_timeout`` each connect.
    ``shared_memory=False`` turns the same-machine path off (every byte over TCP).
    ``write_leases=False`` makes every put two-phase (PUT_START, node write, PUT_END), as before write leases.
    ``location_cache`` is how many keys' locations to remember for reads (0: ask the master on every read).
    ``max_connections`` caps the pooled connections per peer (master, each node).
    ``secrets`` (``kvpool.Secrets``) are proven on every connection to a secured pool; by default they
    come from ``KVPOOL_SECRET_FILE`` / ``KVPOOL_ADMIN_SECRET_FILE`` (docs/security.md). A wrong or
    missing secret raises ``AuthenticationError`` or a ``KvPoolError`` naming the secret to set.
    ``tls`` (an ``ssl.SSLContext``, see ``kvpool.tls.client_context``) runs every master and node
    connection in mutual TLS; by default it comes from ``KVPOOL_TLS_CERT``, ``KVPOOL_TLS_KEY`` and
    ``KVPOOL_TLS_CA`` (none set: plain TCP). The same-machine path needs none.
    """

    def __init__(self, master: str | None = None, *, timeout: float = 10.0, connect_timeout: float = 3.0,
                 shared_memory: bool = True, max_connections: int = 8, secrets: Secrets | None = None,
                 tls: ssl.SSLContext | None = None, write_leases: bool = True,
                 location_cache: int = DEFAULT_LOCATIONS) -> None:
        if master is None:
            master = master_from_environment()
        #: What this client proves to a secured pool (docs/security.md); by default the environment's.
        self.secrets = Secrets.from_environment() if secrets is None else secrets
        #: The TLS context of master and node connections (None: plain TCP); by default the environment's.
        self.tls = tls_from_environment() if tls is None else tls
        #: Node frames with fewer value bytes go over TCP even to a mapped segment (``SHM_WRITE_MIN_BYTES``).
        self.shm_write_min_bytes = SHM_WRITE_MIN_BYTES
        #: Single-copy puts go under write leases while a read lease is held (else two-phase).
        self.write_leases = write_leases
        #: Threads a same-machine copy of a large call is spread over (``kvpool.lanes``; 1: the caller's only).
        self.copy_lanes = lanes.default_lanes()
        if not timeout > 0 or not connect_timeout > 0:
            raise ValueError(f"timeouts must be positive, got timeout={timeout}, connect_timeout={connect_timeout}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        if location_cache < 0:
            raise ValueError(f"location_cache must be 0 (off) or more entries, got {location_cache}")
        #: Keys whose locations reads remember (``kvpool.locations``); 0: every read asks the master.
        self.location_cache = location_cache
        self.timeout = float(timeout)
        self._leaders: LeaderWatch | None = None
        self._leader: LeaderInfo | None = None
        if master.strip().lower().startswith("etcd://"):
            target = parse_etcd_url(master)
            self.master = str(target)
            self._leaders = LeaderWatch(target, timeout=connect_timeout).start()
            try:
                self._leader = self._leaders.wait_ready(self.timeout)
            except (TimeoutError, KvPoolError) as e:
                self._leaders.close()
                raise MasterUnreachable(f"no master to talk to in {target}: {e}") from e
            host, port = parse_host_port(self._leader.address, "leader address in etcd")
        else:
            host, port = parse_host_port(master, "master")
            self.master = f"{host}:{port}"
        self.connect_timeout = float(connect_timeout)
        self.max_connections = max_connections
        u = uuid.uuid4().int
        self._id = (_signed64(u >> 64), _signed64(u & ((1 << 64) - 1)))
        self._hostname = socket.gethostname()
        self._lock = threading.Lock()
        self._incarnation: int | None = None
        self._heard = 0.0  # when the master last heard HELLO or PING from this client
        self.max_value_bytes = p.DEFAULT_MAX_PAYLOAD_BYTES
        self.epoch = 0
        #: Copies a put makes when it does not say (the master's ``--replicas``), from its HELLO.
        self.default_replicas = 1
        # Segment ids are per master run: a new master (a restart, a failover) numbers the segments in the
        # order their nodes register again. Every master connection remembers the run its HELLO met, an
        # answer naming segments is valid in the run of the connection that carried it, and the table is
        # tagged with the run it came from: regions of an old master are never resolved in a new table,
        # where they would send bytes to another node (docs/architecture.md, "Master runs").
        self._master_run = 0
        self._segments: dict[int, SegmentStats] = {}
        self._table_run = 0
        self._table_at = 0.0
        self._shm = SharedSegments(shared_memory)
        self._nodes: dict[tuple[str, int], ConnectionPool] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._leasing: Leasing | None = None  # this process's read and write leases, made at its first leased put
        self._executor_pid = 0
        self._closed = False
        #: Counters since the client was made: bytes moved per path, reads the shared-memory check sent to TCP
        #: because the object changed under the copy, write leases granted and objects committed under them.
        self.counters: dict[str, int] = dict.fromkeys(
            ("bytes_written_shm", "bytes_written_tcp", "bytes_read_shm", "bytes_read_tcp", "shm_read_retries",
             "write_leases", "objects_leased"), 0)
        self._master = self._master_pool(host, port)
        self.refresh()

    def _master_pool(self, host: str, port: int) -> ConnectionPool:
        return ConnectionPool(host, port, max_connections=self.max_connections, connect_timeout=self.connect_timeout,
                              on_connect=self._hello, master=True, secrets=self.secrets, tls=self.tls)

    def _relocate(self, deadline: float) -> bool:
        """After the master failed at the connection level: moves to the leader etcd names now, waiting (up to
        ``deadline``) for a ready one other than the failed one. False without an election or when none came."""
        if self._leaders is None:
            return False
        failed = self._leader
        while not self._closed:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                leader = self._leaders.wait_ready(left)
            except (TimeoutError, KvPoolError):
                return False
            if failed is None or (leader.address, leader.term) != (failed.address, failed.term):
                with self._lock:
                    if self._leader is failed:
                        old = self._master
                        host, port = parse_host_port(leader.address, "leader address in etcd")
                        self._master = self._master_pool(host, port)
                        self._leader = leader
                        old.close()
                return True
            time.sleep(min(0.1, left))  # etcd still names the master that failed: its lease has not run out yet
        return False

    # ------------------------------------------------------------------------------ plumbing

    def _hello(self, c: Connection) -> None:
        body, _ = c.call(Opcode.HELLO, p.encode_hello(self._id, self._hostname, os.getpid()), self.timeout)
        r = p.decode_hello_reply(body)
        new_run = False
        with self._lock:
            if self._incarnation is not None and self._incarnation != r.incarnation:
                # a new master run: the old table and the remembered locations mean nothing now
                self._master_run += 1
                self._segments = {}
                self._table_run = self._master_run
                self._table_at = 0.0
                new_run = True
            self._incarnation = r.incarnation
            c.master_run = self._master_run
            self._heard = time.monotonic()
            self.max_value_bytes = min(r.max_value_bytes, p.DEFAULT_MAX_PAYLOAD_BYTES)
            self.epoch = r.epoch
            self.default_replicas = max(1, r.default_replicas)
        leasing = self._leasing
        if new_run and leasing is not None and leasing.pid == pid():
            leasing.locations.drop_all()

    def _call_master(self, opcode: Opcode, body: bytes, decode: Callable[[bytes], T]) -> T:
        """One master exchange; a pooled connection that turns out dead is replaced once, and with elected
        masters the call moves to the next leader until ``timeout``."""
        return self._call_master_in_run(opcode, body, decode)[0]

    def _call_master_in_run(self, opcode: Opcode, body: bytes, decode: Callable[[bytes], T]) -> tuple[T, int]:
        """``_call_master``, with the master run of the connection that answered (see ``__init__``)."""
        if self._closed:
            raise KvPoolError("client is closed")
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return self._call_master_once(opcode, body, decode)
            except MasterUnreachable:
                if not self._relocate(deadline):
                    raise
            except MasterTimeout:
                # a leader that stopped answering (frozen, cut off): go on only if etcd names another one now
                latest = self._leaders.latest() if self._leaders is not None else None
                current = self._leader
                if latest is None or current is None or not latest.ready \
                        or (latest.address, latest.term) == (current.address, current.term) \
                        or not self._relocate(time.monotonic() + self.timeout):
                    raise

    def _call_master_once(self, opcode: Opcode, body: bytes, decode: Callable[[bytes], T]) -> tuple[T, int]:
        for attempt in (0, 1):
            c = self._master.borrow(self.timeout)
            fresh = c.next_id <= 2  # HELLO was its only exchange
            try:
                if time.monotonic() - self._heard > PING_INTERVAL:
                    # keeps a busy client counted as active (the master's client TTL is 10 s)
                    self.epoch = p.decode_i64(c.call(Opcode.PING, p.encode_ping(self._id), self.timeout)[0], "PING reply")
                    self._heard = time.monotonic()
                reply, _ = c.call(opcode, body, self.timeout)
                return decode(reply), c.master_run
            except (ConnectionError, BrokenPipeError) as e:
                if attempt == 0 and not fresh:
                    # the master closed an idle connection (a restart): so it did the others; try a new one
                    self._master.drop_idle()
                    continue
                raise MasterUnreachable(f"master at {self.master}: {opcode.name} failed: {e}") from e
            except TimeoutError as e:
                raise MasterTimeout(f"master at {self.master}: {opcode.name} timed out after {self.timeout:.1f}s") from e
            except OSError as e:
                raise MasterUnreachable(f"master at {self.master}: {opcode.name} failed: {e}") from e
            finally:
                self._master.release(c)
        raise AssertionError("unreachable")

    def _count(self, name: str, n: int) -> None:
        with self._lock:
            self.counters[name] += n

    def _node_pool(self, seg: SegmentStats) -> ConnectionPool:
        key = (seg.host, seg.port)
        pool = self._nodes.get(key)
        if pool is None:
            with self._lock:
                pool = self._nodes.get(key)
                if pool is None:
                    pool = self._nodes[key] = ConnectionPool(seg.host, seg.port, max_connections=self.max_connections,
                                                             connect_timeout=self.connect_timeout,
                                                             secrets=self.secrets, tls=self.tls)
        return pool

    def _run(self, tasks: list[Callable[[], None]]) -> None:
        """Runs independent per-segment tasks, in parallel when there are several."""
        if len(tasks) == 1:
            tasks[0]()
            return
        with self._lock:
            if self._executor is None or self._executor_pid != os.getpid():
                self._executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="kvpool-io")
                self._executor_pid = os.getpid()
            ex = self._executor
        for f in [ex.submit(t) for t in tasks]:
            f.result()

    def refresh(self) -> PoolStats:
        """Asks the master for the cluster's state (CLUSTER_STATS) and takes its segment table (unless a newer
        master answered meanwhile: then it asks once more, the answer was the old master's)."""
        for attempt in (0, 1):
            stats, run = self._call_master_in_run(Opcode.CLUSTER_STATS, b"", p.decode_cluster_stats)
            with self._lock:
                if run == self._master_run:
                    self._segments = {s.id: s for s in stats.segments}
                    self._table_run = run
                    self._table_at = time.monotonic()
                    self.epoch = stats.epoch
                    break
        self._shm.retain({s.shm_path for s in self._segments.values() if s.shm_path})
        return stats

    def _segment(self, sid: int, run: int | None = None) -> SegmentStats | None:
        """The segment with this id, refreshing the table once if it is unknown. Given the master ``run`` an
        answer came in, None unless the table held is that run's (see ``__init__``)."""
        for attempt in (0, 1):
            if run is not None and (run != self._master_run or self._table_run != run):
                if attempt or run != self._master_run:
                    return None
            else:
                seg = self._segments.get(sid)
                if seg is not None or attempt:
                    return seg
            try:
                self.refresh()
            except KvPoolError:
                return None
        return None

    def _local_first(self, replicas: tuple[p.Replica, ...]) -> tuple[p.Replica, ...]:
        if len(replicas) < 2:
            return replicas
        local = tuple(r for r in replicas if (s := self._segments.get(r.segment_id)) is not None
                      and self._shm.is_local(s.host))
        return local + tuple(r for r in replicas if r not in local)

    def _preferred(self, preferred: str | None) -> str:
        if preferred is not None:
            return preferred
        if not self._shm.enabled:
            return ""
        if time.monotonic() - self._table_at > LOCAL_TABLE_AGE:
            try:
                self.refresh()
            except KvPoolError:
                return ""
        for s in self._segments.values():
            if s.active and s.shm_path and self._shm.mapping(s) is not None:
                return s.name
        return ""

    # ---------------------------------------------------------------------------------- puts

    def put(self, key: str, value: Buffer, *, replicas: int = 0, preferred_segment: str | None = None,
            pin_seconds: int = 0) -> PutStatus:
        """Stores ``value`` under ``key`` unless the key is present (then ``ALREADY_EXISTS``).

        ``replicas`` copies on distinct segments, on distinct hosts while another host has room (0: the
        master's default; at most 8); a copy that could not be made now is made later by the master's
        repair (``put_detailed`` says how many were written). ``preferred_segment`` names a segment
        (``host:port``) for the first copy; by default a segment on this host when there is one.
        ``pin_seconds`` asks that the object be evicted only after unpinned ones, for that many seconds
        (``PIN_FOREVER``: until removed or replaced); the master grants pins up to its ``--max-pinned``
        share of the pool.
        """
        return self._write([key], [value], False, replicas, preferred_segment, pin_seconds, False)[0].status

    def upsert(self, key: str, value: Buffer, *, replicas: int = 0, preferred_segment: str | None = None,
               pin_seconds: int = 0) -> PutStatus:
        """Stores ``value`` under ``key``, replacing what is there; once it returns, no reader gets the old value."""
        return self._write([key], [value], True, replicas, preferred_segment, pin_seconds, False)[0].status

    def put_from(self, key: str, buffer: Buffer, *, replicas: int = 0,
                 preferred_segment: str | None = None, pin_seconds: int = 0) -> PutStatus:
        """``put`` from the caller's memory (any buffer, or ``RawBuffer``): the bytes are sent from it directly."""
        return self.put(key, buffer, replicas=replicas, preferred_segment=preferred_segment, pin_seconds=pin_seconds)

    def put_batch(self, keys: Sequence[str], values: Sequence[Buffer], *, replicas: int = 0,
                  preferred_segment: str | None = None, pin_seconds: int = 0) -> list[PutStatus]:
        """Puts many keys with one reservation, one write per node and one completion: a status per key."""
        return [r.status for r in self._write(keys, values, False, replicas, preferred_segment, pin_seconds, True)]

    def upsert_batch(self, keys: Sequence[str], values: Sequence[Buffer], *, replicas: int = 0,
                     preferred_segment: str | None = None, pin_seconds: int = 0) -> list[PutStatus]:
        """``upsert`` for many keys: a status per key."""
        return [r.status for r in self._write(keys, values, True, replicas, preferred_segment, pin_seconds, True)]

    put_from_batch = put_batch

    def put_detailed(self, key: str, value: Buffer, *, replicas: int = 0, preferred_segment: str | None = None,
                     pin_seconds: int = 0) -> PutResult:
        """``put``, reporting the copies written against those asked for, and whether the pin was granted."""
        return self._write([key], [value], False, replicas, preferred_segment, pin_seconds, False)[0]

    def upsert_detailed(self, key: str, value: Buffer, *, replicas: int = 0, preferred_segment: str | None = None,
                        pin_seconds: int = 0) -> PutResult:
        """``upsert``, reporting as ``put_detailed`` does."""
        return self._write([key], [value], True, replicas, preferred_segment, pin_seconds, False)[0]

    def put_batch_detailed(self, keys: Sequence[str], values: Sequence[Buffer], *, upsert: bool = False,
                           replicas: int = 0, preferred_segment: str | None = None,
                           pin_seconds: int = 0) -> list[PutResult]:
        """``put_batch`` (or ``upsert_batch`` with ``upsert=True``), a ``PutResult`` per key."""
        return self._write(keys, values, upsert, replicas, preferred_segment, pin_seconds, True)

    def _write(self, keys: Sequence[str], values: Sequence[Buffer], upsert: bool, replicas: int,
               preferred: str | None, pin_seconds: int, batch: bool) -> list[PutResult]:
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys but {len(values)} values")
        if not 0 <= replicas <= 255:
            raise ValueError(f"replicas must be 0..8 (0 = the master's default), got {replicas}")
        if not p.PIN_FOREVER <= pin_seconds <= 0x7FFFFFFF:
            raise ValueError(f"pin_seconds must be 0 (no pin), a positive number of seconds or PIN_FOREVER (-1), "
                             f"got {pin_seconds}")
        kb = p.encode_keys_checked(keys)
        # a Filler (device KV) stays one until a path needs its bytes in host memory (see kvpool.buffers.Filler)
        views: list[Any] = [v if isinstance(v, Filler) else reads.view_of(v, k, False) for k, v in zip(keys, values)]
        for k, v in zip(keys, views):
            if v.nbytes > self.max_value_bytes:
                raise ValueError(f"value for key {p.abbreviate(k)!r} has {v.nbytes} bytes; the master accepts at "
                                 f"most {self.max_value_bytes}")
        self._forget(kb)
        status: list[PutStatus] = [PutStatus.FAILED] * len(keys)
        copies = [0] * len(keys)
        pinned = [False] * len(keys)
        pref = self._preferred(preferred)
        wanted = replicas or self.default_replicas
        leasing = self._leasing_here() if wanted == 1 and pin_seconds == 0 and self.write_leases and keys else None
        for start in range(0, len(keys), p.MAX_KEYS_PER_FRAME):
            end = min(len(keys), start + p.MAX_KEYS_PER_FRAME)
            if leasing is not None and leasing.ready():
                leasing.put(kb, views, start, end, pref, upsert, status)
                copies[start:end] = [1] * (end - start)
            else:
                materialize(views, start, end)
                two_phase.write_chunk(self, kb, views, start, end, upsert, replicas, pin_seconds, pref, batch, status,
                                      copies, pinned)
        out = []
        for i, st in enumerate(status):
            ok = st == PutStatus.OK
            out.append(PutResult(st, copies[i] if ok else 0, wanted, ok and pinned[i]))
            if ok and copies[i] < wanted:
                log.debug("kvpool: put of %r wrote %d of %d copies; the master repairs it when there is room",
                          p.abbreviate(kb[i]), copies[i], wanted)
        return out

    def _leasing_here(self) -> Leasing:
        """This process's leases: a forked child forgets its parent's (without touching them) and makes its own."""
        leasing = self._leasing
        if leasing is None or leasing.pid != pid():
            with self._lock:
                leasing = self._leasing
                if leasing is None or leasing.pid != pid():
                    if leasing is not None:
                        leasing.abandon()
                    leasing = self._leasing = Leasing(self)
        return leasing

    def _forget(self, kb: list[bytes], prefix: bytes | None = None) -> None:
        """This client changes or removes these keys (or every key with ``prefix``): it forgets their locations."""
        leasing = self._leasing
        if leasing is not None and leasing.pid == pid():
            if prefix is None:
                leasing.locations.invalidate(kb)
            else:
                leasing.locations.invalidate_prefix(prefix)

    # ---------------------------------------------------------------------------------- reads

    def get(self, key: str) -> bytes | None:
        """The value under ``key``, or None on a miss."""
        return self.get_batch([key], _batch=False)[0]

    def get_batch(self, keys: Sequence[str], *, _batch: bool = True) -> list[bytes | None]:
        """Values for many keys (None for misses): one master round trip, one read per node."""
        out: list[bytearray | None] = [None] * len(keys)

        def alloc(i: int, length: int) -> memoryview:
            b = out[i] = bytearray(length)
            return memoryview(b)

        lengths = reads.read(self, keys, alloc, _batch)
        return [bytes(b) if n != MISS and b is not None else None for b, n in zip(out, lengths)]

    def get_into(self, key: str, buffer: Buffer) -> int:
        """Reads the value under ``key`` straight into ``buffer``; its length, or ``MISS`` (-1).

        Raises ValueError (naming both sizes) if the buffer is smaller than the value. On a miss the
        buffer's contents are unspecified.
        """
        return reads.read_into(self, [key], [buffer], False, strict=True)[0]

    def get_into_batch(self, keys: Sequence[str], buffers: Sequence[Buffer], *, _batch: bool = True) -> list[int]:
        """``get_into`` for many keys: element i is the length read into ``buffers[i]``, ``MISS``, or
        ``TOO_SMALL`` when the value is larger than ``buffers[i]`` (that buffer is left alone; a value of
        another size under one key does not fail the batch's other reads)."""
        return reads.read_into(self, keys, buffers, _batch, strict=False)

    def _lookup(self, kb: list[bytes], batch: bool) -> list[p.ReplicaList]:
        """Where each key is, by the master (``kvpool.reads.lookup``)."""
        return reads.lookup(self, kb, batch)

    # --------------------------------------------------------------------------------- probes

    def exists(self, key: str) -> bool:
        """True if a complete object is stored under ``key``. Not a read for eviction."""
        return self._call_master(Opcode.EXIST_KEY, p.encode_keys([p.encode_key(key)]),
                                 lambda b: p.decode_flags(b, "EXIST_KEY reply"))[0]

    def batch_exists(self, keys: Sequence[str]) -> list[bool]:
        """``exists`` for many keys, one flag per key."""
        kb = p.encode_keys_checked(keys)
        out: list[bool] = []
        for start in range(0, len(kb), p.MAX_KEYS_PER_FRAME):
            out += self._call_master(Opcode.BATCH_EXIST_KEY, p.encode_keys(kb[start:start + p.MAX_KEYS_PER_FRAME]),
                                     lambda b: p.decode_flags(b, "BATCH_EXIST_KEY reply"))
        return out

    def prefix_match(self, keys: Sequence[str]) -> int:
        """How many of ``keys``, in order, are present before the first absent one (the engine's lookup)."""
        kb = p.encode_keys_checked(keys)
        matched = 0
        for start in range(0, len(kb), p.MAX_KEYS_PER_FRAME):
            part = kb[start:start + p.MAX_KEYS_PER_FRAME]
            n = self._call_master(Opcode.PREFIX_MATCH, p.encode_keys(part),
                                  lambda b: p.decode_i32(b, "PREFIX_MATCH reply"))
            matched += n
            if n < len(part):
                break
        return matched

    def tier_lookup(self, keys: Sequence[str]) -> TierCounts:
        """Of ``keys`` (a prompt's block keys, in order): how many leading ones the pool holds, and how many of
        those are in memory and how many on the SSD tier only (TIER_LOOKUP): what a router without an event stream
        asks. Does not count as a read for eviction."""
        kb = p.encode_keys_checked(keys)
        codes = bytearray(len(kb))
        for start in range(0, len(kb), p.MAX_KEYS_PER_FRAME):
            part = self._call_master(Opcode.TIER_LOOKUP, p.encode_keys(kb[start:start + p.MAX_KEYS_PER_FRAME]),
                                     p.decode_tier_codes)
            codes[start:start + len(part)] = part
            if TierCounts.of(part).prefix_blocks < len(part):
                break  # the prefix ended in this frame
        return TierCounts.of(bytes(codes))

    def describe_blocks(self, infos: Sequence[BlockInfo]) -> int:
        """Tells the master what the engine knows of the blocks it is about to save (BLOCK_INFO): tokens, block
        size, parent hash, LoRA and salt, which the master's KV events then carry in each key's ``BlockStored`` for
        routers that hash tokens themselves (Dynamo, llm-d). Send it before the puts. Returns how many infos the
        master kept: 0 when its events are off. Frames of at most 16,384 infos and about 4 MiB."""
        kept = start = 0
        while start < len(infos):
            end, size = start, 0
            while end < len(infos) and end - start < p.MAX_KEYS_PER_FRAME and (end == start or size < 4 << 20):
                size += len(infos[end].key) + 4 * len(infos[end].token_ids) + 64
                end += 1
            kept += self._call_master(Opcode.BLOCK_INFO, encode_block_infos(infos[start:end]), decode_kept)
            start = end
        return kept

    def replica_locations(self, keys: Sequence[str]) -> list[tuple[int, int, list[tuple[str, int, int]]] | None]:
        """Where each key's copies are now: the master's answer to the lookup every read starts with
        (GET_REPLICA_LIST; like a read, it counts as an access for eviction). Per key, None if absent,
        else ``(value length, generation, [(segment name, tier, region offset), ...])``: the segment
        name is its node's ``host:port`` ("" if the master no longer lists that segment), the tier
        ``protocol.TIER_MEMORY`` or ``TIER_DISK``, the region offset where a memory copy starts in the
        segment (its value starts ``protocol.value_offset(key bytes)`` further; 0 for a disk copy,
        found by generation). A new generation means a new object under the key."""
        kb = p.encode_keys_checked(keys)
        out: list[tuple[int, int, list[tuple[str, int, int]]] | None] = []
        for w in self._lookup(kb, True) if kb else []:
            if w.code != ResultCode.OK:
                out.append(None)
                continue
            copies = []
            for r in w.replicas:
                seg = self._segment(r.segment_id)
                copies.append((seg.name if seg is not None else "", r.tier, r.offset))
            out.append((w.value_length, w.generation, copies))
        return out

    def size(self, key: str) -> int | None:
        """The value length under ``key``, or None if absent."""
        n = self.batch_size([key])[0]
        return None if n < 0 else n

    def batch_size(self, keys: Sequence[str]) -> list[int]:
        """Value lengths, -1 for absent keys."""
        kb = p.encode_keys_checked(keys)
        out: list[int] = []
        for start in range(0, len(kb), p.MAX_KEYS_PER_FRAME):
            out += self._call_master(Opcode.OBJECT_SIZE, p.encode_keys(kb[start:start + p.MAX_KEYS_PER_FRAME]),
                                     p.decode_sizes)
        return out

    # -------------------------------------------------------------------------------- removal

    def remove(self, key: str) -> bool:
        """Removes the object under ``key``; True if there was one. Once it returns no reader gets it."""
        k = p.encode_key(key)
        self._forget([k])
        return self._call_master(Opcode.REMOVE, p.encode_keys([k]),
                                 lambda b: p.decode_codes(b, "REMOVE reply"))[0] == ResultCode.OK

    def remove_batch(self, keys: Sequence[str]) -> list[bool]:
        """Removes many keys; True for each key that had an object."""
        kb = p.encode_keys_checked(keys)
        self._forget(kb)
        out: list[bool] = []
        for start in range(0, len(kb), p.MAX_KEYS_PER_FRAME):
            out += [c == ResultCode.OK for c in self._call_master(
                Opcode.BATCH_REMOVE, p.encode_keys(kb[start:start + p.MAX_KEYS_PER_FRAME]),
                lambda b: p.decode_codes(b, "BATCH_REMOVE reply"))]
        return out

    def remove_prefix(self, prefix: str | bytes) -> int:
        """Removes every object whose key starts with ``prefix`` (1..512 UTF-8 bytes); the count removed."""
        b = prefix.encode("utf-8") if isinstance(prefix, str) else bytes(prefix)
        if not b:
            raise ValueError("remove_prefix with an empty prefix; use remove_all to empty the pool")
        if len(b) > p.MAX_KEY_BYTES:
            raise ValueError(f"remove_prefix with a {len(b)}-byte prefix, longer than any key ({p.MAX_KEY_BYTES} bytes)")
        self._forget([], b)
        return self._call_master(Opcode.REMOVE_BY_PREFIX, p.BodyWriter().bstr(b).bytes(),
                                 lambda r: p.decode_removed(r, "REMOVE_BY_PREFIX reply"))[0]

    def remove_all(self, force: bool = False) -> int:
        """Empties the pool; the count removed. ``force`` also fences every put in flight (a new epoch)."""
        removed, epoch = self._call_master(Opcode.REMOVE_ALL, p.BodyWriter().boolean(force).bytes(),
                                           lambda r: p.decode_removed(r, "REMOVE_ALL reply"))
        self._forget([], b"")
        self.epoch = epoch
        return removed

    # ---------------------------------------------------------------------------------- admin

    def status(self) -> PoolStats:
        """A snapshot of the cluster: epoch, objects, capacity, and every segment."""
        return self.refresh()

    def ping(self) -> int:
        """Checks the master is there; the cluster epoch."""
        self.epoch = self._call_master(Opcode.PING, p.encode_ping(self._id), lambda b: p.decode_i64(b, "PING reply"))
        return self.epoch

    def close(self) -> None:
        """Closes every connection and mapping. The client cannot be used afterwards."""
        if self._closed:
            return
        leasing = self._leasing
        if leasing is not None and leasing.pid == pid():
            leasing.close()  # first, while the master is there: ends the read lease, gives back unused space
        self._closed = True
        if self._leaders is not None:
            self._leaders.close()
        self._master.close()
        for pool in list(self._nodes.values()):
            pool.close()
        self._shm.close()
        if self._executor is not None and self._executor_pid == os.getpid():
            self._executor.shutdown(wait=False)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"kvpool.Client(master={self.master!r})"

