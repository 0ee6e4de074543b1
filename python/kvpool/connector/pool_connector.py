"""The connector over a kvpool, the Python twin of the Java ``io.kvpool.connector.PoolConnector``.

One pool object per KV block, named by :class:`~kvpool.connector.keys.KeyFormat` from the block's
chained hash (:class:`~kvpool.connector.hashing.BlockHasher`). A lookup is one ``prefix_match``; a
step's loads are one ``get_into_batch`` straight into the engine's blocks (views of the paged cache,
no intermediate bytes); a step's saves are one ``put_batch`` straight from them, on a background
thread fed by a bounded queue (a full queue drops the step's saves and counts them).

The methods have vLLM's v1 connector shape (scheduler side: ``get_num_new_matched_tokens``,
``update_state_after_alloc``, ``build_connector_meta``, ``request_finished``, ``reset_cache``; worker
side: ``start_load_kv``, ``wait_for_layer_load``, ``save_kv_layer``, ``wait_for_save``,
``get_finished``, ``block_ids_with_load_errors``). One object can serve both sides (an engine in one
process, as the Java reference engine), or one object per side (vLLM's scheduler and worker
processes) sharing a :class:`FileFence`.

Reset: no stale KV, ever
------------------------
``reset_cache()`` calls ``remove_all(force=True)``: the pool fences puts in flight (a put started
before the reset is answered ``FENCED`` and never becomes visible). The connector closes the
remaining gap, saves planned or queued but not yet started: every step's work carries the cache
*generation* it was planned in, and a reset bumps the generation under the exclusive side of a
:class:`Fence` that loads and saves hold (shared side) while they run. So a save either runs entirely
before the reset (which then removes what it stored) or finds the generation changed and is dropped;
a load planned before the reset fails (the engine recomputes) rather than fill a block with old KV.
Versioned keys (:meth:`PoolConnector.switch_weights`) change every key instead, with the same
generation bump.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import logging
import os
import queue
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, NamedTuple, Optional, Sequence

from .hashing import BlockHasher, extra_keys_for
from .keys import KeyFormat
from .paged import PagedKv

__all__ = [
    "ConnectorRequest", "ScheduledRequest", "Match", "Load", "Save", "ConnectorMeta", "ResetResult",
    "ConnectorStats", "Fence", "LocalFence", "FileFence", "PoolConnector",
]

log = logging.getLogger("kvpool.connector")


# ------------------------------------------------------------------------------------------ values

@dataclass(frozen=True)
class ConnectorRequest:
    """A request as the connector sees it: its id, its tokens so far (prompt, then generated ones;
    only the first ``num_tokens`` count, default all), the extra keys that make its KV differ for the
    same tokens (a LoRA name, ...; ``None`` for none) and its cache salt (vLLM's ``cache_salt``,
    joined to the extra keys of block 0 only). ``tokens`` may be any sequence of ints (a list, a
    tuple, vLLM's ``ConstantList``, a numpy array)."""

    id: str
    tokens: Sequence[int]
    num_tokens: int = -1
    extra_keys: Optional[Sequence[Any]] = None
    cache_salt: Optional[str] = None

    def __post_init__(self) -> None:
        if self.id is None:
            raise ValueError("request id must not be None")
        if self.num_tokens == -1:
            object.__setattr__(self, "num_tokens", len(self.tokens))
        if not 0 <= self.num_tokens <= len(self.tokens):
            raise ValueError(f"request {self.id}: num_tokens {self.num_tokens} outside 0..{len(self.tokens)}")
        if self.cache_salt is not None and self.cache_salt == "":
            raise ValueError(f"request {self.id}: cache_salt must not be empty (None for none)")

    def extra_keys_for(self, block: int) -> Optional[list]:
        """The extra keys hashed with block ``block`` (the salt on block 0 only), or ``None``."""
        return extra_keys_for(self.extra_keys, self.cache_salt, block)


@dataclass(frozen=True)
class ScheduledRequest:
    """A request run this step: its block table (block i holds tokens ``[i*bs, (i+1)*bs)``) and the
    tokens whose KV exists before and after the step. Blocks that become full are saved."""

    request: ConnectorRequest
    block_ids: Sequence[int]
    computed_before: int
    computed_after: int

    def __post_init__(self) -> None:
        if self.computed_before < 0 or self.computed_after < self.computed_before:
            raise ValueError(f"request {self.request.id}: computed tokens go from {self.computed_before} "
                             f"to {self.computed_after}")


class Match(NamedTuple):
    """Tokens past those already computed that the pool can supply (whole blocks), and whether they
    load asynchronously across steps (never, for kvpool: loads complete within the step)."""

    tokens: int
    load_async: bool = False


NO_MATCH = Match(0, False)


class Load(NamedTuple):
    """Fill block ``block_id`` (request ``request_id``'s block number ``block_index``) from ``key``."""

    request_id: str
    block_id: int
    block_index: int
    key: str


class Save(NamedTuple):
    """Save block ``block_id`` (request ``request_id``'s block number ``block_index``) as ``key``."""

    request_id: str
    block_id: int
    block_index: int
    key: str


@dataclass
class ConnectorMeta:
    """One step's transfer work, built by the scheduler side and carried out by the worker side.
    ``generation`` is the cache generation the step was planned in: work planned before a reset is
    never carried out after it. ``void_loads`` were planned before a reset that came before this
    step was built: the worker reports their blocks as failed loads without reading anything.
    Picklable (vLLM ships it to worker processes)."""

    loads: list[Load] = field(default_factory=list)
    saves: list[Save] = field(default_factory=list)
    generation: int = 0
    void_loads: list[Load] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not self.loads and not self.saves and not self.void_loads


EMPTY_META = ConnectorMeta()


@dataclass(frozen=True)
class ResetResult:
    """Whether the pool is now empty of everything saved before, how many objects were removed, and
    why not if it failed."""

    success: bool
    removed: int = 0
    message: str = ""


@dataclass(frozen=True)
class ConnectorStats:
    """A snapshot of a connector's counters (they only grow). ``dropped_saves`` counts saves planned
    but never stored (a reset or weight switch in between, a full save queue, a fenced or failed put);
    ``queue_full_drops`` and ``fenced_saves`` are the parts of it that a full queue and the pool's
    fence caused. ``skipped_saves``: the pool already held the block, or was full."""

    lookups: int = 0
    matched_tokens: int = 0
    loaded_blocks: int = 0
    loaded_bytes: int = 0
    failed_loads: int = 0
    saved_blocks: int = 0
    saved_bytes: int = 0
    skipped_saves: int = 0
    dropped_saves: int = 0
    resets: int = 0
    queue_full_drops: int = 0
    fenced_saves: int = 0


_COUNTERS = tuple(ConnectorStats.__dataclass_fields__)


# ------------------------------------------------------------------------------------------ fences

class Fence:
    """The cache generation and the lock that orders resets against loads and saves."""

    def generation(self) -> int:
        """The current generation."""
        raise NotImplementedError

    def shared(self) -> "contextlib.AbstractContextManager[int]":
        """Held while a load or save runs; yields the generation, which cannot change meanwhile."""
        raise NotImplementedError

    def bump(self) -> "contextlib.AbstractContextManager[int]":
        """Exclusive: waits for running loads and saves, moves the generation on and yields the new
        one; no load or save starts until the block exits."""
        raise NotImplementedError


class LocalFence(Fence):
    """A fence for one process: a writer-preferring read-write lock around a counter (Java's
    ``ReentrantReadWriteLock`` plus ``generation``)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._gen = 1
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    def generation(self) -> int:
        return self._gen

    @contextlib.contextmanager
    def shared(self) -> Iterator[int]:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
            gen = self._gen
        try:
            yield gen
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def bump(self) -> Iterator[int]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = True
            self._gen += 1
            gen = self._gen
        try:
            yield gen
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class FileFence(Fence):
    """A fence shared by processes on one machine (vLLM's scheduler and worker processes): the
    generation is 8 bytes in ``path`` and the lock is ``flock`` on it (shared for loads and saves,
    exclusive for resets). Each acquisition opens its own descriptor, so threads of one process
    exclude each other as processes do. Processes on other machines are not covered."""

    def __init__(self, path: str) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.close(fd)

    def _read(self, fd: int) -> int:
        b = os.pread(fd, 8, 0)
        return struct.unpack("<q", b)[0] if len(b) == 8 else 1

    @contextlib.contextmanager
    def _locked(self, how: int) -> Iterator[int]:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, how)
            yield fd
        finally:
            os.close(fd)  # releases the lock

    def generation(self) -> int:
        with self._locked(fcntl.LOCK_SH) as fd:
            return self._read(fd)

    @contextlib.contextmanager
    def shared(self) -> Iterator[int]:
        with self._locked(fcntl.LOCK_SH) as fd:
            yield self._read(fd)

    @contextlib.contextmanager
    def bump(self) -> Iterator[int]:
        with self._locked(fcntl.LOCK_EX) as fd:
            gen = self._read(fd) + 1
            os.pwrite(fd, struct.pack("<q", gen), 0)
            os.fsync(fd)
            yield gen


# ------------------------------------------------------------------------------------------ connector

class _SaveJob(NamedTuple):
    saves: list[Save]
    generation: int
    kv: PagedKv


_STOP = object()


def saves_without_failed_loads(meta: ConnectorMeta, failed_blocks: set[int]) -> list[Save]:
    """The step's saves less those of every request one of whose loads in this step failed.

    A request's blocks computed in a step attend over the blocks loaded for it in that step; when
    one of those loads failed the block holds stale bytes, so all the request computed in the step
    is wrong (the engine recomputes it) and none of it may be saved: it would be wrong KV under a
    correct key, and the recomputation's save would be refused as already present. The Java
    connectors apply the same rule (``ConnectorMeta.savesWithoutFailedLoads``).
    """
    if not failed_blocks or not meta.saves:
        return list(meta.saves)
    poisoned = {l.request_id for l in (*meta.loads, *meta.void_loads) if l.block_id in failed_blocks}
    return [s for s in meta.saves if s.request_id not in poisoned]


class PoolConnector:
    """The connector over a kvpool. See the module docstring.

    Args:
        client: a ``kvpool.Client`` (not closed by this connector); anything with ``prefix_match``,
            ``get_into_batch``, ``put_batch``, ``remove_all`` and ``remove_prefix`` works.
        hasher: block size and hash seed; the engine's block size must equal ``hasher.block_size``.
        keys: model, weight version, ranks and dtype of this engine's KV.
        reset_scope: ``"all"``: ``remove_all(force=True)``, everything in the pool, puts in flight
            fenced (the RL default); ``"model"``: ``remove_prefix`` of this model's keys (other models'
            KV stays; puts in flight are not fenced by the pool, the generation still drops this
            connector's own).
        max_queued_saves: steps of saves that may wait for the save thread; a step's saves that find
            the queue full are dropped and counted (``dropped_saves``, ``queue_full_drops``).
        fence: the generation and its lock (default: a :class:`LocalFence` of this object; give both
            sides the same :class:`FileFence` when scheduler and worker are different objects).

    Counters are attributes (``lookups``, ``matched_tokens``, ``loaded_blocks``, ``loaded_bytes``,
    ``failed_loads``, ``saved_blocks``, ``saved_bytes``, ``skipped_saves``, ``dropped_saves``,
    ``resets``, ``queue_full_drops``, ``fenced_saves``); :meth:`stats` takes a consistent snapshot.
    """

    def __init__(self, client: Any, hasher: BlockHasher, keys: KeyFormat, *, reset_scope: str = "all",
                 max_queued_saves: int = 64, fence: Optional[Fence] = None) -> None:
        if client is None or hasher is None or keys is None:
            raise ValueError("client, hasher and keys are required")
        if reset_scope not in ("all", "model"):
            raise ValueError(f"reset_scope must be 'all' or 'model', got {reset_scope!r}")
        if max_queued_saves < 1:
            raise ValueError(f"max_queued_saves must be at least 1, got {max_queued_saves}")
        self.client = client
        self.hasher = hasher
        self.keys = keys
        self.reset_scope = reset_scope
        self.fence: Fence = fence if fence is not None else LocalFence()

        # scheduler side (guarded by _lock)
        self._lock = threading.RLock()
        self._hashes: dict[str, list[bytes]] = {}
        self._matched_from: dict[str, int] = {}
        self._planned_loads: list[Load] = []
        self._planned_generation = self.fence.generation()
        self._void_loads: list[Load] = []

        # worker side
        self._current: ConnectorMeta = EMPTY_META
        self._current_load: Optional[concurrent.futures.Future] = None
        self._load_awaited = True
        self._load_errors: set[int] = set()
        self._loader = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvpool-load")
        self._saves_started_for: Optional[int] = None  # id() of the meta whose saves were queued

        # saves in flight, by request (guarded by _save_lock)
        self._save_lock = threading.Lock()
        self._pending_saves: dict[str, int] = {}
        self._saw_saves: set[str] = set()
        self._finished_with_saves: set[str] = set()
        self._done_saving: set[str] = set()
        self._save_queue: "queue.Queue[Any]" = queue.Queue(maxsize=max_queued_saves)
        self._saver = threading.Thread(target=self._save_loop, name="kvpool-save", daemon=True)
        self._saver.start()
        self._reclaimer: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._closed = False

        self._stats_lock = threading.Lock()
        for c in _COUNTERS:
            setattr(self, c, 0)
        self._last_lookup_warning = 0.0

    # -------------------------------------------------------------------------- helpers

    def _count(self, **delta: int) -> None:
        with self._stats_lock:
            for k, v in delta.items():
                setattr(self, k, getattr(self, k) + v)

    def stats(self) -> ConnectorStats:
        """A consistent snapshot of the counters."""
        with self._stats_lock:
            return ConnectorStats(**{c: getattr(self, c) for c in _COUNTERS})

    def generation(self) -> int:
        """The current cache generation."""
        return self.fence.generation()

    def _hashes_for(self, r: ConnectorRequest) -> list[bytes]:
        with self._lock:
            h = self._hashes.get(r.id)
            full = self.hasher.full_blocks(r.num_tokens)
            if h is None or len(h) < full:
                grown = [] if h is None else list(h)
                parent = grown[-1] if grown else self.hasher.root
                bs = self.hasher.block_size
                for b in range(len(grown), full):
                    parent = self.hasher.next(parent, r.tokens, b * bs, r.extra_keys_for(b))
                    grown.append(parent)
                self._hashes[r.id] = grown
                h = grown
            return h

    def keys_for(self, request: ConnectorRequest) -> list[str]:
        """The pool keys of the request's full blocks, in order."""
        k = self.keys
        return [k.key(h) for h in self._hashes_for(request)[:self.hasher.full_blocks(request.num_tokens)]]

    # -------------------------------------------------------------------------- scheduler side

    def get_num_new_matched_tokens(self, request: ConnectorRequest, num_computed_tokens: int) -> Match:
        """How many tokens past ``num_computed_tokens`` the pool can supply for ``request``: whole
        blocks, by one ``prefix_match``. A probe: plans nothing. A failed lookup is a miss."""
        self._count(lookups=1)
        bs = self.hasher.block_size
        h = self._hashes_for(request)
        full = self.hasher.full_blocks(request.num_tokens)
        start = num_computed_tokens // bs
        if start >= full:
            return NO_MATCH
        k = self.keys
        ask = [k.key(h[b]) for b in range(start, full)]
        try:
            present = int(self.client.prefix_match(ask))
        except Exception as e:  # noqa: BLE001 - a lookup failure is a miss, never an engine error
            now = time.monotonic()
            if now - self._last_lookup_warning > 10.0:
                self._last_lookup_warning = now
                log.warning("kvpool lookup failed (%s); treating as a miss (logged at most every 10 s)", e)
            return NO_MATCH
        tokens = (start + present) * bs - num_computed_tokens
        if tokens <= 0:
            return NO_MATCH
        with self._lock:
            self._matched_from[request.id] = num_computed_tokens
        self._count(matched_tokens=tokens)
        return Match(tokens, False)

    def update_state_after_alloc(self, request: ConnectorRequest, block_ids: Sequence[int],
                                 num_external_tokens: int) -> None:
        """The engine allocated ``block_ids`` (the request's whole block table) and takes
        ``num_external_tokens`` tokens from the pool (0: it decided not to): plan their loads."""
        with self._lock:
            computed = self._matched_from.pop(request.id, None)
            if num_external_tokens <= 0 or computed is None:
                return
            bs = self.hasher.block_size
            if (computed + num_external_tokens) % bs != 0:
                raise ValueError(f"request {request.id}: {computed} computed plus {num_external_tokens} external "
                                 f"tokens do not end on a block boundary (block size {bs})")
            h = self._hashes_for(request)
            start = computed // bs  # a partly computed first block is loaded whole: same bytes
            end = (computed + num_external_tokens) // bs
            if end > len(h) or end > len(block_ids):
                raise ValueError(f"request {request.id}: {num_external_tokens} external tokens after {computed} "
                                 f"need {end} blocks; it has {len(block_ids)} allocated and {len(h)} full")
            k = self.keys
            for b in range(start, end):
                self._planned_loads.append(Load(request.id, int(block_ids[b]), b, k.key(h[b])))

    def build_connector_meta(self, scheduled: Sequence[ScheduledRequest]) -> ConnectorMeta:
        """This step's work: the loads planned since the last call, and saves of the blocks that
        become full this step."""
        with self._lock:
            bs = self.hasher.block_size
            k = self.keys
            saves: list[Save] = []
            for s in scheduled:
                first_new = s.computed_before // bs  # a block partly computed before may fill now
                filled = s.computed_after // bs
                if filled <= first_new:
                    continue
                if s.computed_after > s.request.num_tokens:
                    raise ValueError(f"request {s.request.id}: {s.computed_after} tokens computed but only "
                                     f"{s.request.num_tokens} known")
                h = self._hashes_for(s.request)
                for b in range(first_new, min(filled, len(s.block_ids))):
                    saves.append(Save(s.request.id, int(s.block_ids[b]), b, k.key(h[b])))
            meta = ConnectorMeta(list(self._planned_loads), saves, self.fence.generation(), list(self._void_loads))
            self._planned_loads.clear()
            self._void_loads.clear()
            return meta

    def request_finished(self, request: ConnectorRequest, block_ids: Sequence[int] = ()) -> bool:
        """The request is done. True if saves of its blocks are still in flight: the engine keeps
        those blocks until :meth:`get_finished` reports the request."""
        with self._lock:
            self._hashes.pop(request.id, None)
            self._matched_from.pop(request.id, None)
        with self._save_lock:
            if self._pending_saves.get(request.id, 0) > 0:
                self._finished_with_saves.add(request.id)
                return True
            self._saw_saves.discard(request.id)
            return False

    def forget(self, request_id: str) -> None:
        """Drops what the scheduler side remembers of a request (its hashes, a pending match)."""
        with self._lock:
            self._hashes.pop(request_id, None)
            self._matched_from.pop(request_id, None)

    def reset_cache(self) -> ResetResult:
        """Drops everything the pool holds (``reset_scope="all"``: ``remove_all(force=True)``) or this
        model's keys (``"model"``). After success no lookup finds anything saved before, and no save
        planned or started before lands after. Failures are a value, not an exception."""
        try:
            with self.fence.bump() as gen:
                with self._lock:
                    self._void_loads.extend(self._planned_loads)  # their engine expects them: fail them
                    self._planned_loads.clear()
                    self._matched_from.clear()
                if self.reset_scope == "all":
                    removed = int(self.client.remove_all(force=True))
                else:
                    removed = int(self.client.remove_prefix(KeyFormat.model_prefix(self.keys.model)))
            self._count(resets=1)
            log.info("kvpool connector: cache reset (%s), %d objects removed; generation %d",
                     self.reset_scope, removed, gen)
            return ResetResult(True, removed, "")
        except Exception as e:  # noqa: BLE001 - reported as a value
            log.warning("kvpool connector: cache reset failed: %s", e)
            return ResetResult(False, 0, f"kvpool reset failed: {e}")

    def switch_weights(self, weights: str, reclaim: bool = True) -> "concurrent.futures.Future[int]":
        """Versioned keys: from now on keys carry ``weights``; work planned under the old version is
        dropped. With ``reclaim`` the old version's objects are removed in the background
        (``remove_prefix``); the future gives how many."""
        with self.fence.bump():
            old = self.keys
            self.keys = old.with_weights(weights)
            with self._lock:
                self._void_loads.extend(self._planned_loads)
                self._planned_loads.clear()
                self._matched_from.clear()
                self._hashes.clear()
        old_prefix = old.version_prefix()
        done: concurrent.futures.Future[int] = concurrent.futures.Future()
        if not reclaim or old_prefix == self.keys.version_prefix():
            done.set_result(0)
            return done
        if self._reclaimer is None:
            self._reclaimer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvpool-reclaim")
        return self._reclaimer.submit(lambda: int(self.client.remove_prefix(old_prefix)))

    # -------------------------------------------------------------------------- worker side

    def start_load_kv(self, meta: ConnectorMeta, kv: PagedKv) -> None:
        """Starts the step's loads into ``kv`` (on the load thread)."""
        self._settle_load()
        self._current = meta
        self._saves_started_for = None
        self._load_errors.clear()
        if meta.void_loads:
            self._fail(meta.void_loads)
        if meta.loads:
            self._current_load = self._loader.submit(self._load, meta, kv)
            self._load_awaited = False
        else:
            self._current_load = None
            self._load_awaited = True

    def _load(self, meta: ConnectorMeta, kv: PagedKv) -> None:
        with self.fence.shared() as gen:
            if meta.generation != gen:
                self._fail(meta.loads)  # planned before a reset: the KV it names is gone or stale
                return
            keys = [l.key for l in meta.loads]
            try:
                targets, commit = kv.load_targets([l.block_id for l in meta.loads])
                got = self.client.get_into_batch(keys, targets)
                ok = [int(g) == kv.block_bytes for g in got]
                commit(ok)
            except Exception as e:  # noqa: BLE001 - reported as failed blocks
                log.warning("kvpool load of %d blocks failed: %s", len(keys), e)
                self._fail(meta.loads)
                return
            loaded = 0
            for l, good in zip(meta.loads, ok):
                if good:
                    loaded += 1
                else:
                    self._load_errors.add(l.block_id)
            self._count(loaded_blocks=loaded, loaded_bytes=loaded * kv.block_bytes,
                        failed_loads=len(meta.loads) - loaded)

    def _fail(self, loads: Sequence[Load]) -> None:
        for l in loads:
            self._load_errors.add(l.block_id)
        self._count(failed_loads=len(loads))

    def _settle_load(self) -> None:
        if self._load_awaited:
            return
        self._load_awaited = True
        f = self._current_load
        if f is None:
            return
        try:
            f.result()
        except Exception as e:  # noqa: BLE001
            log.warning("kvpool load failed: %s", e)
            self._fail(self._current.loads)

    def wait_for_layer_load(self, layer: int) -> None:
        """Returns once the step's loads are in place or have failed (a block holds all its layers,
        so the first layer waits for everything)."""
        self._settle_load()

    def save_kv_layer(self, layer: int, kv: PagedKv) -> None:
        """Layer ``layer`` of the step was computed; after the last layer the step's saves are queued."""
        if layer == kv.num_layers - 1:
            self.start_saves(kv)

    def start_saves(self, kv: PagedKv) -> None:
        """Queues the current step's saves for the save thread (once per step). A full queue drops
        them and counts them."""
        meta = self._current
        if not meta.saves or self._saves_started_for == id(meta):
            return
        self._saves_started_for = id(meta)
        self._settle_load()  # the step's load failures are known before anything is saved
        saves = saves_without_failed_loads(meta, self._load_errors)
        if len(saves) < len(meta.saves):
            self._count(dropped_saves=len(meta.saves) - len(saves))
        if not saves:
            return
        n = len(saves)
        with self._save_lock:
            for s in saves:
                self._saw_saves.add(s.request_id)
            try:
                self._save_queue.put_nowait(_SaveJob(saves, meta.generation, kv))
            except queue.Full:
                self._count(dropped_saves=n, queue_full_drops=n)
                return
            for s in saves:
                self._pending_saves[s.request_id] = self._pending_saves.get(s.request_id, 0) + 1

    def _save_loop(self) -> None:
        while True:
            job = self._save_queue.get()
            try:
                if job is _STOP:
                    return
                self._save(job)
            finally:
                self._save_queue.task_done()

    def _save(self, job: _SaveJob) -> None:
        n = len(job.saves)
        try:
            with self.fence.shared() as gen:
                if job.generation != gen:
                    self._count(dropped_saves=n)  # planned before a reset or weight switch
                    return
                keys = [s.key for s in job.saves]
                sources = job.kv.save_sources([s.block_id for s in job.saves])
                statuses = self.client.put_batch(keys, sources)
                saved = skipped = dropped = fenced = 0
                for st in statuses:
                    name = getattr(st, "name", str(st))
                    if name == "OK":
                        saved += 1
                    elif name in ("ALREADY_EXISTS", "POOL_FULL", "NO_SEGMENT"):
                        skipped += 1
                    else:  # FENCED, FAILED
                        dropped += 1
                        fenced += name == "FENCED"
                self._count(saved_blocks=saved, saved_bytes=saved * job.kv.block_bytes, skipped_saves=skipped,
                            dropped_saves=dropped, fenced_saves=fenced)
        except Exception as e:  # noqa: BLE001 - counted, never raised into the engine
            log.warning("kvpool save of %d blocks failed: %s", n, e)
            self._count(dropped_saves=n)
        finally:
            with self._save_lock:
                for s in job.saves:
                    left = self._pending_saves.get(s.request_id, 0) - 1
                    if left <= 0:
                        self._pending_saves.pop(s.request_id, None)
                        if s.request_id in self._finished_with_saves:
                            self._finished_with_saves.discard(s.request_id)
                            self._done_saving.add(s.request_id)
                    else:
                        self._pending_saves[s.request_id] = left

    def wait_for_save(self) -> None:
        """Waits for every save queued so far (and settles the step's loads)."""
        self._settle_load()
        self._save_queue.join()

    def wait_for_request_saves(self, request_ids: Any) -> None:
        """Waits until no save of these requests is queued or running (before their blocks are
        reused, e.g. on preemption)."""
        ids = set(request_ids)
        with self._save_lock:
            busy = any(self._pending_saves.get(r, 0) > 0 for r in ids)
        if busy:
            self._save_queue.join()

    def get_finished(self, finished_request_ids: Any = ()) -> set[str]:
        """Of the finished requests, those whose saves have all completed since the last call (the
        engine may free their blocks now). ``finished_request_ids``: requests that finished, as the
        worker learns of them; a request whose saves this worker carried out is reported once all of
        them completed, whether or not :meth:`request_finished` was called on this object (vLLM's
        scheduler and worker are different objects)."""
        with self._save_lock:
            for r in finished_request_ids or ():
                if r in self._saw_saves and r not in self._finished_with_saves:
                    if self._pending_saves.get(r, 0) > 0:
                        self._finished_with_saves.add(r)
                    else:
                        self._done_saving.add(r)
            out = set(self._done_saving)
            self._done_saving.clear()
            self._saw_saves -= out
            return out

    def block_ids_with_load_errors(self) -> set[int]:
        """Blocks whose load in the last step failed (their contents are undefined); then cleared."""
        self._settle_load()
        out = set(self._load_errors)
        self._load_errors -= out
        return out

    def close(self) -> None:
        """Waits for queued saves and stops the threads (the client is not closed)."""
        if self._closed:
            return
        self._closed = True
        self.wait_for_save()
        self._save_queue.put(_STOP)
        self._saver.join()
        self._loader.shutdown(wait=True)
        if self._reclaimer is not None:
            self._reclaimer.shutdown(wait=True)

    def __enter__(self) -> "PoolConnector":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
