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
* **Layers** (docs/architecture.md, "The clients' layers"): this module is the facade. It checks arguments,
  turns outcomes into values and forwards to the operations (``reads``, ``two_phase``, ``leased_puts``,
  ``ranged``, ``parts``) over one ``kvpool.channels.Channels``; nothing below imports it.
* **Threads and processes**: every method may be called from any thread; connections are pooled per
  peer. After ``fork()`` the child opens its own connections (``kvpool._net``) and takes its own read and
  write leases (``Leases.here``); it never uses its parent's.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any, Sequence

from . import protocol as p
from . import ranged, reads, two_phase
from .auth import Secrets
from .block_info import BlockInfo, decode_kept, encode_block_infos
from .buffers import Buffer, Filler, materialize
from ._net import DEFAULT_BUSY_POLL, check_busy_poll
from .channels import Channels
from .config import master_from_environment
from .errors import KvPoolError
from .leased_puts import Leases
from .locations import DEFAULT_ENTRIES as DEFAULT_LOCATIONS
from .parts import PutInParts
from .protocol import Opcode, PoolStats, ResultCode
from .ranged import Located
from .results import MISS, PutResult, PutStatus
from .tiers import TierCounts
from .tls import from_environment as tls_from_environment

log = logging.getLogger("kvpool")

class Client:
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
    ``busy_poll`` is how long (seconds) a connection polls its socket for a reply before it blocks: on a machine
    whose idle CPUs sleep it saves waking the waiting thread's CPU, tens of microseconds a round trip on a VM;
    a connection whose replies take longer polls ever less often. 0 turns it off; at most 1 ms.
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
                 location_cache: int = DEFAULT_LOCATIONS, busy_poll: float = DEFAULT_BUSY_POLL) -> None:
        if master is None:
            master = master_from_environment()
        if not timeout > 0 or not connect_timeout > 0:
            raise ValueError(f"timeouts must be positive, got timeout={timeout}, connect_timeout={connect_timeout}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        if location_cache < 0:
            raise ValueError(f"location_cache must be 0 (off) or more entries, got {location_cache}")
        check_busy_poll(busy_poll)
        self._ch = Channels(master, timeout=float(timeout), connect_timeout=float(connect_timeout),
                            shared_memory=shared_memory, max_connections=max_connections,
                            secrets=Secrets.from_environment() if secrets is None else secrets,
                            tls=tls_from_environment() if tls is None else tls, write_leases=write_leases,
                            location_cache=location_cache, busy_poll=busy_poll)
        self._leases = Leases(self._ch)
        self._closed = False
        try:
            self.refresh()
        except BaseException:
            self._ch.close()
            raise

    # ---------------------------------------------------------------------------- settings

    @property
    def master(self) -> str:
        """The pool's address: ``host:port``, or the etcd URL the leader is found through."""
        return self._ch.master.address

    @property
    def timeout(self) -> float:
        """Bounds every network wait of a call (seconds)."""
        return self._ch.timeout

    @property
    def connect_timeout(self) -> float:
        return self._ch.connect_timeout

    @property
    def max_connections(self) -> int:
        """Pooled connections per peer (master, each node)."""
        return self._ch.max_connections

    @property
    def secrets(self) -> Secrets:
        """What this client proves to a secured pool (docs/security.md); by default the environment's."""
        return self._ch.secrets

    @property
    def tls(self) -> ssl.SSLContext | None:
        """The TLS context of master and node connections (None: plain TCP); by default the environment's."""
        return self._ch.tls

    @property
    def shm_write_min_bytes(self) -> int:
        """Node frames with fewer value bytes go over TCP even to a mapped segment
        (``kvpool.channels.SHM_WRITE_MIN_BYTES``)."""
        return self._ch.shm_write_min_bytes

    @shm_write_min_bytes.setter
    def shm_write_min_bytes(self, n: int) -> None:
        self._ch.shm_write_min_bytes = n

    @property
    def write_leases(self) -> bool:
        """Single-copy puts go under write leases while a read lease is held (else two-phase)."""
        return self._ch.write_leases

    @write_leases.setter
    def write_leases(self, on: bool) -> None:
        self._ch.write_leases = on

    @property
    def copy_lanes(self) -> int:
        """Threads a same-machine copy of a large call is spread over (``kvpool.lanes``; 1: the caller's only)."""
        return self._ch.copy_lanes

    @copy_lanes.setter
    def copy_lanes(self, n: int) -> None:
        self._ch.copy_lanes = n

    @property
    def location_cache(self) -> int:
        """Keys whose locations reads remember (``kvpool.locations``); 0: every read asks the master."""
        return self._ch.location_cache

    @property
    def max_value_bytes(self) -> int:
        """The largest value the master takes (its HELLO)."""
        return self._ch.master.max_value_bytes

    @property
    def default_replicas(self) -> int:
        """Copies a put makes when it does not say (the master's ``--replicas``), from its HELLO."""
        return self._ch.master.default_replicas

    @property
    def epoch(self) -> int:
        """The pool's epoch, as the master last said."""
        return self._ch.master.epoch

    @property
    def counters(self) -> dict[str, int]:
        """Counters since the client was made (``kvpool.channels.COUNTERS``): bytes moved per path, reads the
        shared-memory check sent to TCP because the object changed under the copy, write leases granted and
        objects committed under them."""
        return self._ch.counters

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
        pref = self._ch.segments.preferred(preferred)
        wanted = replicas or self.default_replicas
        leasing = self._leases.here() if wanted == 1 and pin_seconds == 0 and self.write_leases and keys else None
        for start in range(0, len(keys), p.MAX_KEYS_PER_FRAME):
            end = min(len(keys), start + p.MAX_KEYS_PER_FRAME)
            if leasing is not None and leasing.ready():
                leasing.put(kb, views, start, end, pref, upsert, status)
                copies[start:end] = [1] * (end - start)
            else:
                materialize(views, start, end)
                two_phase.write_chunk(self._ch, kb, views, start, end, upsert, replicas, pin_seconds, pref, batch,
                                      status, copies, pinned)
        out = []
        for i, st in enumerate(status):
            ok = st == PutStatus.OK
            out.append(PutResult(st, copies[i] if ok else 0, wanted, ok and pinned[i]))
            if ok and copies[i] < wanted:
                log.debug("kvpool: put of %r wrote %d of %d copies; the master repairs it when there is room",
                          p.abbreviate(kb[i]), copies[i], wanted)
        return out

    def _forget(self, kb: list[bytes], prefix: bytes | None = None) -> None:
        """This client changes or removes these keys (or every key with ``prefix``): it forgets their locations."""
        leasing = self._leases.current()
        if leasing is not None:
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

        lengths = reads.read(self._ch, self._leases, keys, alloc, _batch)
        return [bytes(b) if n != MISS and b is not None else None for b, n in zip(out, lengths)]

    def get_into(self, key: str, buffer: Buffer) -> int:
        """Reads the value under ``key`` straight into ``buffer``; its length, or ``MISS`` (-1).

        Raises ValueError (naming both sizes) if the buffer is smaller than the value. On a miss the
        buffer's contents are unspecified.
        """
        return reads.read_into(self._ch, self._leases, [key], [buffer], False, strict=True)[0]

    def get_into_batch(self, keys: Sequence[str], buffers: Sequence[Buffer], *, _batch: bool = True) -> list[int]:
        """``get_into`` for many keys: element i is the length read into ``buffers[i]``, ``MISS``, or
        ``TOO_SMALL`` when the value is larger than ``buffers[i]`` (that buffer is left alone; a value of
        another size under one key does not fail the batch's other reads)."""
        return reads.read_into(self._ch, self._leases, keys, buffers, _batch, strict=False)

    # --------------------------------------------------------------------- ranges and parts

    def locate(self, keys: Sequence[str]) -> Located:
        """Looks ``keys`` up once (one master round trip per 16,384 keys) for ``get_ranges_into``
        (``kvpool.ranged``)."""
        return ranged.locate(self._ch, keys)

    def get_ranges_into(self, located: Located, offsets: Sequence[int], buffers: Sequence[Buffer]) -> list[int]:
        """Reads, for each located object ``i``, ``len(buffers[i])`` bytes from ``offsets[i]`` of its value into
        ``buffers[i]``: element ``i`` is the bytes read, or ``MISS`` (missing when located, removed or replaced
        since, or its node unreachable; never other bytes).

        Raises ValueError naming the key when a range lies outside its value, or when the lists' lengths
        differ. On a miss the buffer's contents are unspecified.
        """
        return ranged.get_ranges_into(self._ch, located, offsets, buffers)

    def get_range_into(self, key: str, offset: int, buffer: Buffer) -> int:
        """``get_ranges_into`` of one key, located first: the bytes read into ``buffer``, or ``MISS``."""
        return ranged.get_ranges_into(self._ch, ranged.locate(self._ch, [key]), [offset], [buffer])[0]

    def begin_put(self, keys: Sequence[str], value_lengths: Sequence[int], *, replicas: int = 0,
                  preferred_segment: str | None = None, pin_seconds: int = 0) -> PutInParts:
        """Begins a put whose values are written in parts (``kvpool.parts.PutInParts``): reserves an object of
        ``value_lengths[i]`` bytes under each key; ``write`` stores ranges of the values, ``finish`` makes the
        objects visible. A key that is taken is refused at once (``status(i)`` is ``ALREADY_EXISTS``)."""
        return PutInParts.begin(self._ch, keys, value_lengths, replicas,
                                self._ch.segments.preferred(preferred_segment), pin_seconds)

    # --------------------------------------------------------------------------------- probes

    def exists(self, key: str) -> bool:
        """True if a complete object is stored under ``key``. Not a read for eviction."""
        return self._ch.master.call(Opcode.EXIST_KEY, p.encode_keys([p.encode_key(key)]),
                                    lambda b: p.decode_flags(b, "EXIST_KEY reply"))[0]

    def batch_exists(self, keys: Sequence[str]) -> list[bool]:
        """``exists`` for many keys, one flag per key."""
        kb = p.encode_keys_checked(keys)
        out: list[bool] = []
        for start in range(0, len(kb), p.MAX_KEYS_PER_FRAME):
            out += self._ch.master.call(Opcode.BATCH_EXIST_KEY, p.encode_keys(kb[start:start + p.MAX_KEYS_PER_FRAME]),
                                        lambda b: p.decode_flags(b, "BATCH_EXIST_KEY reply"))
        return out

    def prefix_match(self, keys: Sequence[str]) -> int:
        """How many of ``keys``, in order, are present before the first absent one (the engine's lookup)."""
        kb = p.encode_keys_checked(keys)
        matched = 0
        for start in range(0, len(kb), p.MAX_KEYS_PER_FRAME):
            part = kb[start:start + p.MAX_KEYS_PER_FRAME]
            n = self._ch.master.call(Opcode.PREFIX_MATCH, p.encode_keys(part),
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
            part = self._ch.master.call(Opcode.TIER_LOOKUP, p.encode_keys(kb[start:start + p.MAX_KEYS_PER_FRAME]),
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
            kept += self._ch.master.call(Opcode.BLOCK_INFO, encode_block_infos(infos[start:end]), decode_kept)
            start = end
        return kept

    def replica_locations(self, keys: Sequence[str]) -> list[tuple[int, int, list[tuple[str, int, int]]] | None]:
        """Where each key's copies are now: the master's answer to the lookup every read starts with
        (GET_REPLICA_LIST; like a read, it counts as an access for eviction). Per key, None if absent,
        else ``(value length, generation, [(segment name, tier, region offset), ...])``: the segment
        name is its node's ``host:port`` ("" if the master no longer lists that segment), the tier
        ``protocol.TIER_MEMORY`` or ``TIER_DISK``, the region offset where a memory copy starts in the
        segment (its value starts ``protocol.value_offset(key bytes)`` further; a disk copy is found by
        generation, and its offset is 0 or, while it is being spilled, where its memory copy was). A new generation means a new object under the key."""
        kb = p.encode_keys_checked(keys)
        out: list[tuple[int, int, list[tuple[str, int, int]]] | None] = []
        for w in self._ch.lookup(kb, True) if kb else []:
            if w.code != ResultCode.OK:
                out.append(None)
                continue
            copies = []
            for r in w.replicas:
                seg = self._ch.segments.segment(r.segment_id)
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
            out += self._ch.master.call(Opcode.OBJECT_SIZE, p.encode_keys(kb[start:start + p.MAX_KEYS_PER_FRAME]),
                                        p.decode_sizes)
        return out

    # -------------------------------------------------------------------------------- removal

    def remove(self, key: str) -> bool:
        """Removes the object under ``key``; True if there was one. Once it returns no reader gets it."""
        k = p.encode_key(key)
        self._forget([k])
        return self._ch.master.call(Opcode.REMOVE, p.encode_keys([k]),
                                    lambda b: p.decode_codes(b, "REMOVE reply"))[0] == ResultCode.OK

    def remove_batch(self, keys: Sequence[str]) -> list[bool]:
        """Removes many keys; True for each key that had an object."""
        kb = p.encode_keys_checked(keys)
        self._forget(kb)
        out: list[bool] = []
        for start in range(0, len(kb), p.MAX_KEYS_PER_FRAME):
            out += [c == ResultCode.OK for c in self._ch.master.call(
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
        return self._ch.master.call(Opcode.REMOVE_BY_PREFIX, p.BodyWriter().bstr(b).bytes(),
                                    lambda r: p.decode_removed(r, "REMOVE_BY_PREFIX reply"))[0]

    def remove_all(self, force: bool = False) -> int:
        """Empties the pool; the count removed. ``force`` also fences every put in flight (a new epoch)."""
        removed, epoch = self._ch.master.call(Opcode.REMOVE_ALL, p.BodyWriter().boolean(force).bytes(),
                                              lambda r: p.decode_removed(r, "REMOVE_ALL reply"))
        self._forget([], b"")
        self._ch.master.epoch = epoch
        return removed

    # ---------------------------------------------------------------------------------- admin

    def refresh(self) -> PoolStats:
        """Asks the master for the cluster's state (CLUSTER_STATS) and takes its segment table
        (``kvpool.segment_directory``)."""
        return self._ch.segments.refresh()

    def status(self) -> PoolStats:
        """A snapshot of the cluster: epoch, objects, capacity, and every segment."""
        return self.refresh()

    def ping(self) -> int:
        """Checks the master is there; the cluster epoch."""
        return self._ch.master.ping()

    def close(self) -> None:
        """Closes every connection and mapping. The client cannot be used afterwards."""
        if self._closed:
            return
        self._leases.close()  # first, while the master is there: ends the read lease, gives back unused space
        self._closed = True
        self._ch.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"kvpool.Client(master={self.master!r})"

