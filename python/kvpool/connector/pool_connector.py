"""The connector over a kvpool, the Python twin of the Java ``io.kvpool.connector.PoolConnector``.

One pool object per KV block, named by :class:`~kvpool.connector.keys.KeyFormat` from the block's
chained hash (:class:`~kvpool.connector.hashing.BlockHasher`). A lookup is one ``prefix_match``; a
step's loads are one ``get_into_batch`` straight into the engine's blocks (views of the paged cache,
no intermediate bytes); a step's saves are one ``put_batch`` straight from them, on a background
thread fed by a bounded queue (a full queue drops the step's saves and counts them).

Granularity
-----------
``granularity="block"`` (the default) moves whole blocks as above: the first ``wait_for_layer_load`` waits
for the whole step's loads, and the saves are one ``put_batch`` once the last layer is saved.
``granularity="layer"`` moves the same objects layer by layer (:mod:`~kvpool.connector.layers`): the
step's blocks are located once and read a layer at a time, so ``wait_for_layer_load(l)`` waits for layer
``l`` only and layer 0 computes while later layers arrive; the step's saves are reserved at the first
``save_kv_layer`` and each layer is written as it is computed, made visible after the last. A block is
one object with its layers one after another (``[layer][K/V][token][head][dim]``), so keys and bytes are
the same in both modes and in Java's: either mode, in either language, reads what the other wrote.

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
a load planned before the reset fails (the engine recomputes) rather than fill a block with old KV,
and so do loads the engine accepted, or a match it was offered, before the reset but had not yet put
in a step (they become void loads: :mod:`~kvpool.connector.planner`). Versioned keys
(:meth:`PoolConnector.switch_weights`) change every key instead, with the same generation bump.

A failed load voids what was computed over it
---------------------------------------------
A block's KV depends on every block before it. When a request's load of block i fails, the blocks
after i that the step computed are wrong, so the step's saves of them are dropped
(:meth:`ConnectorMeta.saves_not_over_failed_loads`); the engine recomputes from block i (and saves
them then) or fails the request, by its load failure policy.

The scheduler side is :class:`~kvpool.connector.planner.Planner`, the values
:mod:`~kvpool.connector.values`, the fences :mod:`~kvpool.connector.fence`; this module re-exports
them. The contract all three connectors (this one, Java's ``PoolConnector`` and
``LocalOffloadConnector``) keep is the table of scenarios in
``kvpool-connector/src/test/resources/connector-contract-vectors.json``.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from typing import Any, Callable, NamedTuple, Optional, Sequence

from .budget import LoadBudget, LoadGate, loads_again
from .describe import DescribeBlocks
from .fence import Fence, FileFence, LocalFence
from .hashing import BlockHasher
from . import layers
from .keys import KeyFormat
from .paged import PagedKv, Staged
from .planner import GroupBlocks, Planner
from .values import (
    COUNTERS, EMPTY_META, NO_MATCH, ConnectorMeta, ConnectorRequest, ConnectorStats, Load, Match, ResetResult, Save,
    ScheduledRequest, check_settings,
)

__all__ = [
    "ConnectorRequest", "ScheduledRequest", "Match", "Load", "Save", "ConnectorMeta", "ResetResult",
    "ConnectorStats", "Fence", "LocalFence", "FileFence", "PoolConnector", "EMPTY_META", "NO_MATCH",
]

log = logging.getLogger("kvpool.connector")


class _SaveJob(NamedTuple):
    saves: list[Save]
    generation: int
    kv: PagedKv
    staged: Staged  # the blocks on their way to host memory (started on the engine's thread)


_STOP = object()


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
        granularity: ``"block"`` (whole blocks) or ``"layer"`` (layer by layer; the client then also needs
            ``locate``, ``get_ranges_into`` and ``begin_put``). See the module docstring.
        async_loads: loads run across steps, reported per request (:meth:`finished_loads`) instead of per
            block within the step: what an engine needs when a block id alone does not name a block (vLLM with
            several KV cache groups). The requests must not run until reported; whole blocks only.
        load_deadline: seconds a step's loads and a lookup may take at most (None: no limit); loads past it are
            abandoned and reported failed, so the engine recomputes those blocks instead of waiting, and a lookup
            past it is a miss (:mod:`~kvpool.connector.budget`).
        recompute_tokens_per_s: the engine's prefill rate; loads or a lookup of ``t`` tokens may then take at most
            ``t`` divided by it (the time recomputing them would take), or ``load_deadline`` if that is less;
        load_deadline_prefill: a factor: loads of ``t`` tokens may take at most that times the engine's own prefill of
            ``t`` tokens, as measured on its steps without loads (start_load_kv to the last layer's save or
            wait_for_save; kvpool.vllm starts a step at its first layer hook).
            With either set, a pool that missed a deadline is left alone (lookups miss, loads fail at once, saves
            are skipped) until a probe of it answers.
        layer_read_bytes: layer by layer, the least bytes of each block one ranged read asks for: layers whose part
            of a block is smaller are read several at a time (default 256 KiB: 4 layers a read at Llama-3-8B's
            64 KiB; 0: one layer a read). Small ranges cost the Python client more than their bytes
            (:mod:`~kvpool.connector.layers`).

    Counters are attributes (``lookups``, ``matched_tokens``, ``loaded_blocks``, ``loaded_bytes``,
    ``failed_loads``, ``saved_blocks``, ``saved_bytes``, ``skipped_saves``, ``dropped_saves``,
    ``resets``, ``queue_full_drops``, ``fenced_saves``); :meth:`stats` takes a consistent snapshot.
    """

    def __init__(self, client: Any, hasher: BlockHasher, keys: KeyFormat, *, reset_scope: str = "all",
                 max_queued_saves: int = 64, fence: Optional[Fence] = None, granularity: str = "block",
                 async_loads: bool = False, load_deadline: Optional[float] = None,
                 recompute_tokens_per_s: Optional[float] = None, load_deadline_prefill: Optional[float] = None,
                 layer_read_bytes: int = layers.MIN_RANGE_BYTES) -> None:
        check_settings(client, hasher, keys, reset_scope, max_queued_saves, granularity, async_loads, layer_read_bytes)
        self.layer_read_bytes = layer_read_bytes
        self.client = client
        self.hasher = hasher
        self.keys = keys
        self.reset_scope = reset_scope
        self.granularity = granularity
        self.async_loads = async_loads
        self._budget = LoadBudget(hasher.block_size, load_deadline, recompute_tokens_per_s, None, load_deadline_prefill)
        self._gate = LoadGate(None)  # the current step's sync loads
        # async loads: (request ids, future of the ids that failed), in start order; ids already failed
        self._async_jobs: list[tuple[set[str], concurrent.futures.Future, LoadGate, int]] = []
        self._async_failed: set[str] = set()
        self.fence: Fence = fence if fence is not None else LocalFence()

        # scheduler side
        self.planner = Planner(hasher)

        # worker side
        self._current: ConnectorMeta = EMPTY_META
        self._current_load: Optional[concurrent.futures.Future] = None
        self._load_awaited = True
        self._errors_lock = threading.Lock()  # the load thread adds errors while the engine thread reads them
        self._load_errors: set[int] = set()  # until the engine asks
        self._step_load_errors: set[int] = set()  # this step's (the saves need them after the engine asked)
        self._layers_in: Optional[layers.LayersIn] = None  # "layer": which layers of the step's loads are in
        self._step_saves: Optional[layers.StepSaves] = None  # "layer": the step's saves, from its first saved layer
        self._loader = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvpool-load")
        self._saves_started_for: Optional[int] = None  # id() of the meta whose saves were queued
        self._staged: Optional[Staged] = None  # the step's blocks on their way to host memory

        # saves in flight, by request (guarded by _save_lock)
        self._save_lock = threading.Lock()
        self._pending_saves: dict[str, int] = {}
        self._saw_saves: set[str] = set()
        self._finished_with_saves: set[str] = set()
        self._done_saving: set[str] = set()
        self._save_queue: "queue.Queue[Any]" = queue.Queue(maxsize=max_queued_saves)
        self._outcomes = layers.Outcomes(self._counted, lambda n: self._count(dropped_saves=n), self._over)
        self._saver = threading.Thread(target=self._save_loop, name="kvpool-save", daemon=True)
        self._saver.start()
        self._reclaimer: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._closed = False

        self._stats_lock = threading.Lock()
        for c in COUNTERS:
            setattr(self, c, 0)

    # -------------------------------------------------------------------------- helpers

    @property
    def load_deadline(self) -> Optional[float]:
        return self._budget.load_deadline

    @load_deadline.setter
    def load_deadline(self, seconds: Optional[float]) -> None:
        self._budget.load_deadline = seconds

    @property
    def recompute_tokens_per_s(self) -> Optional[float]:
        return self._budget.recompute_tokens_per_s

    def _count(self, **delta: int) -> None:
        with self._stats_lock:
            for k, v in delta.items():
                setattr(self, k, getattr(self, k) + v)

    def stats(self) -> ConnectorStats:
        """A consistent snapshot of the counters."""
        with self._stats_lock:
            return ConnectorStats(**{c: getattr(self, c) for c in COUNTERS})

    def generation(self) -> int:
        """The current cache generation."""
        return self.fence.generation()

    def keys_for(self, request: ConnectorRequest) -> list[str]:
        """The pool keys of the request's full blocks, in order."""
        k = self.keys
        return [k.key(h) for h in self.planner.hashes(request)[:self.hasher.full_blocks(request.num_tokens)]]

    # -------------------------------------------------------------------------- scheduler side

    def get_num_new_matched_tokens(self, request: ConnectorRequest, num_computed_tokens: int) -> Match:
        """How many tokens past ``num_computed_tokens`` the pool can supply for ``request``: whole
        blocks, by one ``prefix_match``. A probe: plans nothing. A failed lookup is a miss."""
        self._count(lookups=1)
        start = self.planner.first_block(request, num_computed_tokens)
        if start < 0:
            return self.planner.answer(request, num_computed_tokens, start, 0)
        if not self._budget.admit():  # the pool is left alone for now: a miss at once
            self._count(skipped_lookups=1)
            return self.planner.answer(request, num_computed_tokens, start, 0)
        h = self.planner.hashes(request)
        full = self.hasher.full_blocks(request.num_tokens)
        k = self.keys
        ask = [k.key(h[b]) for b in range(start, full)]
        present = self._budget.lookup(lambda: int(self.client.prefix_match(ask)), len(ask) * self.hasher.block_size)
        m = self.planner.answer(request, num_computed_tokens, start, present)
        self._count(matched_tokens=m.tokens)
        return m

    def update_state_after_alloc(self, request: ConnectorRequest, block_ids: Sequence[int],
                                 num_external_tokens: int, groups: Sequence[GroupBlocks] = ()) -> None:
        """The engine allocated ``block_ids`` (the request's whole block table) and takes
        ``num_external_tokens`` tokens from the pool (0: it decided not to): plan their loads. Tokens
        the last lookup did not offer, off a block boundary or past the blocks allocated are refused
        (``ValueError``)."""
        self.planner.alloc(request, block_ids, num_external_tokens, self.keys, groups)

    def build_connector_meta(self, scheduled: Sequence[ScheduledRequest],
                             groups: Optional[dict[str, Sequence[GroupBlocks]]] = None) -> ConnectorMeta:
        """This step's work: the loads planned since the last call, and saves of the blocks that
        become full this step (``groups``: each request's blocks in a hybrid model's other KV cache groups)."""
        return self.planner.build(scheduled, self.keys, self.fence.generation(), groups)

    def request_finished(self, request: ConnectorRequest, block_ids: Sequence[int] = ()) -> bool:
        """The request is done. True if saves of its blocks are still in flight: the engine keeps
        those blocks until :meth:`get_finished` reports the request."""
        self.planner.forget(request.id)
        with self._save_lock:
            if self._pending_saves.get(request.id, 0) > 0:
                self._finished_with_saves.add(request.id)
                return True
            self._saw_saves.discard(request.id)
            return False

    def forget(self, request_id: str) -> None:
        """Drops what the scheduler side remembers of a request (its hashes, a pending match)."""
        self.planner.forget(request_id)

    def reset_cache(self) -> ResetResult:
        """Drops everything the pool holds (``reset_scope="all"``: ``remove_all(force=True)``) or this
        model's keys (``"model"``). After success no lookup finds anything saved before, and no save
        planned or started before lands after. Failures are a value, not an exception."""
        try:
            with self.fence.bump() as gen:
                self.planner.void_all()  # their engine expects them: fail them
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
            self.planner.void_all()
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
        self._settle_load()  # the previous step's load, if the engine never waited for it
        self._end_step_saves()  # the previous step never saved its last layer: what is unwritten fails
        self._current = meta
        self._budget.prefill.step_started(meta.step_tokens, bool(meta.loads or meta.void_loads))
        self._saves_started_for = None
        with self._errors_lock:
            self._load_errors.clear()
            self._step_load_errors.clear()
        if self.async_loads:
            self._start_async(meta, kv)
            return
        if meta.void_loads:
            self._fail(meta.void_loads)  # accepted before a reset: the KV they name is gone or stale
        self._layers_in = None
        if meta.loads and not self._budget.admit():
            self._fail(meta.loads)  # the pool is left alone for now: recomputed at once
            meta = self._current = ConnectorMeta([], meta.saves, meta.generation)
        if not meta.loads:
            self._current_load = None
            self._load_awaited = True
            return
        self._gate = gate = self._gate_for(meta.loads, kv)
        if self.granularity == "layer":
            self._layers_in = layers.LayersIn(kv.num_layers)
            self._current_load = self._loader.submit(self._load_by_layer, meta, kv, self._layers_in, gate)
        else:
            self._current_load = self._loader.submit(self._load, meta, kv, gate)
        self._load_awaited = False

    def _gate_for(self, loads: Sequence[Load], kv: PagedKv) -> LoadGate:
        """The gate of a step's ``loads``, with their deadline and the probe that asks for them again should they
        miss it (its limit read when it runs, so a budget changed meanwhile holds)."""
        gate = LoadGate(self._budget.deadline(len(loads)))
        keys, sizes = [l.key for l in loads], [kv.object_bytes(l.block_id) for l in loads]
        gate.probe = lambda: loads_again(self._budget, self.client, keys, sizes)
        return gate

    def _abandon(self, gate: LoadGate, loads: Sequence[Load]) -> bool:
        """Abandons ``loads`` if their deadline passed and they are not in yet: they fail (the engine recomputes
        their blocks) and nothing of them reaches the engine's memory later; the pool is left alone until a probe
        of it answers. True if abandoned."""
        if gate.abandon():
            self._fail(loads)
            self._count(abandoned_loads=len(loads))
            self._budget.breaker.failed(f"{len(loads)} block loads passed their deadline", gate.probe)
        return gate.abandoned

    def _load(self, meta: ConnectorMeta, kv: PagedKv, gate: LoadGate) -> None:
        if gate.abandoned:
            return  # queued behind a load that hung: its step gave up on it already
        with self.fence.shared() as gen:
            if meta.generation != gen:
                gate.finish(lambda: self._fail(meta.loads))  # planned before a reset: the KV it names is stale
                return
            keys = [l.key for l in meta.loads]
            try:
                targets, commit = gate.staged(*kv.load_targets([l.block_id for l in meta.loads]))
                got = self.client.get_into_batch(keys, targets)
                ok = [int(g) == kv.object_bytes(l.block_id) for g, l in zip(got, meta.loads)]
            except Exception as e:  # noqa: BLE001 - reported as failed blocks
                log.warning("kvpool load of %d blocks failed: %s", len(keys), e)
                gate.finish(lambda: self._fail(meta.loads))
                return

            def land() -> None:
                commit(ok)
                self._loaded(meta.loads, [l for l, good in zip(meta.loads, ok) if not good], kv)
            gate.finish(land)

    def _start_async(self, meta: ConnectorMeta, kv: PagedKv) -> None:
        """Async loads: the step's loads go to the load thread as one job; nothing in the step waits for them."""
        self._current_load = None
        self._load_awaited = True
        self._layers_in = None
        self._count(failed_loads=len(meta.void_loads))
        self._async_failed |= {l.request_id for l in meta.void_loads}  # accepted before a reset
        if meta.loads and not self._budget.admit():  # the pool is left alone for now: recomputed at once
            self._count(failed_loads=len(meta.loads))
            self._async_failed |= {l.request_id for l in meta.loads}
        elif meta.loads:
            ids = {l.request_id for l in meta.loads}
            gate = self._gate_for(meta.loads, kv)
            self._async_jobs.append((ids, self._loader.submit(self._load_async, meta, kv, gate), gate,
                                     len(meta.loads)))

    def _load_async(self, meta: ConnectorMeta, kv: PagedKv, gate: LoadGate) -> set[str]:
        """One step's async loads; the requests any of whose blocks did not load."""
        everyone = {l.request_id for l in meta.loads}
        if gate.abandoned:
            return everyone
        try:
            with self.fence.shared() as gen:
                if meta.generation != gen:
                    gate.finish(lambda: self._count(failed_loads=len(meta.loads)))
                    return everyone
                targets, commit = gate.staged(*kv.load_targets([l.block_id for l in meta.loads]))
                got = self.client.get_into_batch([l.key for l in meta.loads], targets)
                ok = [int(g) == kv.object_bytes(l.block_id) for g, l in zip(got, meta.loads)]
        except Exception as e:  # noqa: BLE001 - reported as failed requests
            log.warning("kvpool async load of %d blocks failed: %s", len(meta.loads), e)
            gate.finish(lambda: self._count(failed_loads=len(meta.loads)))
            return everyone
        bad = [l for l, good in zip(meta.loads, ok) if not good]

        def land() -> None:
            commit(ok)
            if len(bad) < len(meta.loads):
                self._budget.breaker.succeeded()
            self._count(loaded_blocks=len(meta.loads) - len(bad), failed_loads=len(bad),
                        loaded_bytes=sum(kv.object_bytes(l.block_id) for l, good in zip(meta.loads, ok) if good))
        if not gate.finish(land):
            return everyone
        return {l.request_id for l in bad}

    def finished_loads(self, wait: bool = False) -> tuple[set[str], set[str]]:
        """Async loads: (requests whose loads are over, those of them that failed), each reported once; the
        failed ones must be recomputed. ``wait``: wait for every load started so far."""
        done: set[str] = set()
        failed, self._async_failed = self._async_failed, set()
        keep = []
        for ids, fut, gate, n in self._async_jobs:
            if not (wait or fut.done()):
                left = gate.remaining()
                if left is not None and left <= 0 and self._abandon_async(gate, n):
                    done |= ids  # past its deadline: reported failed now, recomputed by the engine
                    failed |= ids
                    continue
                keep.append((ids, fut, gate, n))
                continue
            done |= ids
            try:
                failed |= fut.result()
            except Exception as e:  # noqa: BLE001
                log.warning("kvpool async load failed: %s", e)
                failed |= ids
        self._async_jobs = keep
        return done | failed, failed

    def _abandon_async(self, gate: LoadGate, blocks: int) -> bool:
        if gate.abandon():
            self._count(failed_loads=blocks, abandoned_loads=blocks)
            self._budget.breaker.failed(f"{blocks} block loads passed their deadline", gate.probe)
        return gate.abandoned

    def _load_by_layer(self, meta: ConnectorMeta, kv: PagedKv, layers_in: layers.LayersIn, gate: LoadGate) -> None:
        """Layer by layer: the step's loads, a layer at a time (:func:`layers.load`), under the fence."""
        try:
            if gate.abandoned:
                return
            with self.fence.shared() as gen:
                if meta.generation != gen:
                    gate.finish(lambda: self._fail(meta.loads))
                    return
                bad = layers.load(self.client, meta.loads, kv, layers_in, gate, self.layer_read_bytes)
                gate.finish(lambda: self._loaded(meta.loads, bad, kv))
        finally:
            layers_in.all()  # a load that stopped early releases every layer's waiter

    def _loaded(self, loads: Sequence[Load], bad: Sequence[Load], kv: PagedKv) -> None:
        n = len(loads) - len(bad)
        if n > 0:
            self._budget.breaker.succeeded()
        failed = {id(l) for l in bad}
        self._count(loaded_blocks=n, loaded_bytes=sum(kv.object_bytes(l.block_id) for l in loads if id(l) not in failed))
        self._fail(bad)

    def _fail(self, loads: Sequence[Load]) -> None:
        with self._errors_lock:
            for l in loads:
                self._step_load_errors.add(l.block_id)
                self._load_errors.add(l.block_id)
        self._count(failed_loads=len(loads))

    def _step_errors(self) -> frozenset[int]:
        with self._errors_lock:
            return frozenset(self._step_load_errors)

    def _settle_load(self) -> None:
        if self._load_awaited:
            return
        self._load_awaited = True
        f = self._current_load
        if f is None:
            return
        gate = self._gate
        try:
            f.result(gate.remaining())
        except concurrent.futures.TimeoutError:
            self._abandon(gate, self._current.loads)
        except Exception as e:  # noqa: BLE001
            log.warning("kvpool load failed: %s", e)
            self._fail(self._current.loads)

    def wait_for_layer_load(self, layer: int) -> None:
        """Returns once layer ``layer`` of the step's loads is in place or has failed. Whole blocks
        (``granularity="block"``): a block holds all its layers, so the first layer waits for everything."""
        layers_in = self._layers_in
        if self._load_awaited or layers_in is None:
            self._settle_load()
            return
        if not layers_in.wait(layer, self._gate.remaining()):
            if self._abandon(self._gate, self._current.loads):
                layers_in.all()
        if layer >= layers_in.num_layers - 1:
            self._settle_load()

    def save_kv_layer(self, layer: int, kv: PagedKv) -> None:
        """Layer ``layer`` of the step was computed. Whole blocks: after the last layer the step's saves
        are queued. Layer by layer: the step's saves are reserved at the first call, and the layers up to
        ``layer`` are written (in order, in the background); after the last they are made visible."""
        if self.granularity == "layer":
            self._save_layer(layer, kv)
        elif layer == kv.num_layers - 1:
            self.start_saves(kv)

    def start_saves(self, kv: PagedKv) -> None:
        """Queues the current step's saves for the save thread (once per step), but those of blocks
        computed over a failed load. A full queue drops them and counts them. Layer by layer: every
        layer not written yet is written now (the forward pass is over), and the saves are finished."""
        self._budget.prefill.step_ended()  # the forward pass is over: vLLM's step end (it may not wait_for_save)
        if self.granularity == "layer":
            self._save_layer(kv.num_layers - 1, kv)
            return
        saves = self._plan_saves(settle=True)
        if saves:
            staged = kv.stage_save([s.block_id for s in saves])
            if self._queue(_SaveJob(saves, self._current.generation, kv, staged), saves):
                self._staged = staged

    def wait_for_device_copies(self) -> None:
        """Waits until the step's saved blocks have left the engine's (device) memory for host memory: the
        engine may overwrite them after this, while the puts still run (never waits for the network)."""
        staged, self._staged = self._staged, None
        if staged is not None:
            staged.wait()

    def _plan_saves(self, settle: bool) -> list[Save]:
        """The current step's saves, once per step (empty after the first call), but those computed over a
        failed load known now. ``settle``: wait for the step's loads first (whole blocks: every load error
        is known); layer by layer, saving starts while later layers still load, and load errors found
        later stop the writes of the saves over them (:meth:`_keep`)."""
        meta = self._current
        if self._saves_started_for == id(meta):
            return []
        self._saves_started_for = id(meta)
        if not meta.saves:
            return []
        if not self._budget.in_use():  # the pool is left alone for now
            self._count(skipped_saves=len(meta.saves))
            return []
        if settle:
            self._settle_load()
        saves = meta.saves_not_over_failed_loads(self._step_errors())
        if meta.infos:  # ahead of the puts, on the same thread: their stores then carry the tokens
            self._queue(DescribeBlocks(meta.infos), ())
        with self._save_lock:
            for s in meta.saves:
                self._saw_saves.add(s.request_id)
        self._count(dropped_saves=len(meta.saves) - len(saves))
        return list(saves)

    def _queue(self, job: Any, saves: Sequence[Save]) -> bool:
        """Queues ``job`` for the save thread and counts its saves as pending; False (the saves dropped
        and counted) when the queue is full."""
        n = len(saves)
        with self._save_lock:
            try:
                self._save_queue.put_nowait(job)
            except queue.Full:
                self._count(dropped_saves=n, queue_full_drops=n)
                return False
            for s in saves:
                self._pending_saves[s.request_id] = self._pending_saves.get(s.request_id, 0) + 1
        return True

    def _save_layer(self, layer: int, kv: PagedKv) -> None:
        """Layer by layer: layer ``layer`` of the step was computed: reserve the saves at the first call, write it."""
        if self._step_saves is None:
            saves = self._plan_saves(settle=False)  # empty once planned: there were none, or they were ended
            if not saves:
                return
            job = layers.StepSaves(saves, kv, self._current.generation)
            if not self._queue(job, saves):
                return
            self._step_saves = job
        last = kv.num_layers - 1
        kv.layer_computed(min(layer, last))
        if layer >= last:
            self._settle_load()  # every load of the step is in: the final word on which saves stand
        self._step_saves.through(min(layer, last), self._keep(self._step_saves))

    def _keep(self, job: layers.StepSaves) -> list[bool]:
        """Which of the step's saves are still worth writing, given the load errors known now."""
        ok = set(self._current.saves_not_over_failed_loads(self._step_errors()))
        return [s in ok for s in job.saves]

    def _end_step_saves(self) -> None:
        """Layer by layer: a step whose last layer was never saved finishes what was written (the rest fails)."""
        job = self._step_saves
        self._step_saves = None
        if job is not None and job.open:
            job.finish_early(self._keep(job))

    def _counted(self, statuses: Sequence[Any], block_bytes: Any) -> None:
        """Counts the saves' final statuses; ``block_bytes``: each save's object bytes, or one size for all."""
        sizes = block_bytes if isinstance(block_bytes, (list, tuple)) else [block_bytes] * len(statuses)
        saved = skipped = dropped = fenced = saved_bytes = 0
        for st, size in zip(statuses, sizes):
            name = getattr(st, "name", str(st))
            if name == "OK":
                saved += 1
                saved_bytes += size
            elif name in ("ALREADY_EXISTS", "POOL_FULL", "NO_SEGMENT"):
                skipped += 1
            else:  # FENCED, FAILED
                dropped += 1
                fenced += name == "FENCED"
        self._count(saved_blocks=saved, saved_bytes=saved_bytes, skipped_saves=skipped,
                    dropped_saves=dropped, fenced_saves=fenced)

    def _over(self, saves: Sequence[Save]) -> None:
        """These saves are over: their requests may be reported finished."""
        with self._save_lock:
            for s in saves:
                left = self._pending_saves.get(s.request_id, 0) - 1
                if left <= 0:
                    self._pending_saves.pop(s.request_id, None)
                    if s.request_id in self._finished_with_saves:
                        self._finished_with_saves.discard(s.request_id)
                        self._done_saving.add(s.request_id)
                else:
                    self._pending_saves[s.request_id] = left

    def _save_loop(self) -> None:
        while True:
            job = self._save_queue.get()
            try:
                if job is _STOP:
                    return
                if isinstance(job, (layers.StepSaves, DescribeBlocks)):
                    job.run(self.client, self.fence, self._outcomes)
                else:
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
                sources = job.staged.sources()
                self._counted(self.client.put_batch(keys, sources),
                              [job.kv.object_bytes(s.block_id) for s in job.saves])
        except Exception as e:  # noqa: BLE001 - counted, never raised into the engine
            log.warning("kvpool save of %d blocks failed: %s", n, e)
            self._count(dropped_saves=n)
        finally:
            self._over(job.saves)

    def wait_for_save(self) -> None:
        """Waits for every save queued so far (and settles the step's loads). Layer by layer, a step
        whose last layer was not saved yet is finished first with what was written (the rest fails)."""
        self._budget.prefill.step_ended()
        self._settle_load()
        self._end_step_saves()
        self._save_queue.join()

    def wait_for_request_saves(self, request_ids: Any) -> None:
        """Waits until no save of these requests is queued or running (before their blocks are
        reused, e.g. on preemption)."""
        ids = set(request_ids)
        with self._save_lock:
            busy = any(self._pending_saves.get(r, 0) > 0 for r in ids)
        if busy:
            self._end_step_saves()
            self._save_queue.join()

    def saves_in_flight(self) -> int:
        """Blocks whose saves are queued or running now (a gauge: what a pause or a reset finds in flight)."""
        with self._save_lock:
            return sum(self._pending_saves.values())

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
        self._budget.close()
        if self._reclaimer is not None:
            self._reclaimer.shutdown(wait=True)

    def __enter__(self) -> "PoolConnector":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
