"""The layer-by-layer half of :class:`~kvpool.connector.pool_connector.PoolConnector`
(``granularity="layer"``), the twin of the Java ``LayerTransfers``.

A block is one pool object, layer-major, so layer ``l`` of a block is the byte range
``[l * layer_bytes, (l + 1) * layer_bytes)`` of its value; keys and bytes are the same as in whole-block
mode (and as the Java engine's), so either mode reads what the other wrote.

* :func:`load`: the step's blocks are located once (``locate``: one master round trip), then layer 0 of
  every block is read in one ranged read (``get_ranges_into``), then layer 1, ...; :class:`LayersIn`
  says layer ``l`` is in as soon as it is, so the engine computes layer 0 while later layers arrive.
  A block that missed, or whose object has another size, reads nothing more and is reported failed.
  Where a layer's part of a block is small, one read brings several layers (:func:`layers_a_read`: each
  block's range at least ``MIN_RANGE_BYTES``, 256 KiB by default; 4 layers a read at Llama-3-8B's 64 KiB
  pages). Why: on the same-machine path a range costs the Python client about 9 us beside its copy, and
  ranges of 64 KiB are too small to spread over the copy lanes (:mod:`kvpool.lanes`). On a 16-core GPU
  machine the 8,192 single-layer ranges of a 512 MiB load (256 blocks, 32 layers) took 129 to 160 ms,
  against 33 ms for reading the whole objects, so the overlap with the compute never won back what the
  load lost (python/gpu_tests/bench_layers.py, docs/benchmarks.md).
* :class:`StepSaves`: the step's saves are reserved at the first layer saved (``begin_put``) and written
  in parts, a layer at a time as the engine reports it computed (:meth:`StepSaves.through`), in layer
  order on the connector's save thread, then made visible after the last layer (``finish``).

The GIL. On the same-machine path a layer's copies hold the interpreter lock, so an engine thread woken
for layer ``l`` would wait for the interpreter's switch interval (5 ms by default) while layer ``l + 1``
is copied; the load yields the lock (``time.sleep(0)``) after a layer an engine thread waits for
(:class:`LayersIn`), which brought layer 0 of 64 blocks of 32 layers from about the whole load's time
to a fifth of it (scripts/bench-python-layers.py).

Threads. :meth:`StepSaves.through` and :meth:`StepSaves.finish_early` are the engine thread's (they only
record what was computed and never block on the pool); :meth:`StepSaves.run` is the save thread's: it
waits for layers as they are reported, so a step's saves occupy the save thread from the step's first
saved layer to its last (steps are saved one after another, as in whole-block mode).

Resets. The save thread holds the connector's fence (shared) only around the finish, which first checks
the generation: a reset between the begin and the finish either comes before the finish (which then sees
the generation moved and abandons: nothing becomes visible) or after it (and removes what it stored).
Puts in parts that a ``remove_all(force=True)`` finds in flight are fenced by the pool itself.

What a store must offer here (``kvpool.Client`` does; the contract tests give an in-memory one):
``locate(keys)`` returning an object with ``value_length(i)`` and ``pick(items)``,
``get_ranges_into(located, offsets, buffers)``, and ``begin_put(keys, value_lengths)`` returning an object
with ``write_many(items, offsets, sources)``, ``finish()`` and ``abandon()``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, NamedTuple, Optional, Sequence

from ..results import PutStatus
from .fence import Fence
from .paged import PagedKv
from .values import Load, Save

__all__ = ["LayersIn", "load", "layers_a_read", "MIN_RANGE_BYTES", "StepSaves", "Outcomes"]

log = logging.getLogger("kvpool.connector")


class LayersIn:
    """How many layers of a step's loads are in (or failed): raised by the load thread, waited for by the
    engine thread. A layer that an engine thread waits for yields the GIL to it (see the module docstring)."""

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self._cond = threading.Condition()
        self._in = 0  # layers 0 .. _in - 1 are in
        self._waiting = 0

    def through(self, layer: int) -> None:
        """Layers up to ``layer`` are in."""
        with self._cond:
            self._in = max(self._in, min(layer + 1, self.num_layers))
            self._cond.notify_all()
            waiting = self._waiting
        if waiting:
            time.sleep(0)

    def all(self) -> None:
        """Every layer is in or failed: no waiter waits any longer (a load that stopped early)."""
        self.through(self.num_layers - 1)

    def wait(self, layer: int, timeout: Optional[float] = None) -> bool:
        """Returns once layer ``layer`` (the last one, if beyond) is in: True, or False when ``timeout`` seconds
        passed first."""
        layer = max(0, min(layer, self.num_layers - 1))
        with self._cond:
            self._waiting += 1
            try:
                return self._cond.wait_for(lambda: self._in > layer, timeout)
            finally:
                self._waiting -= 1


#: Least bytes of a block that one ranged read of a layer-by-layer load asks for: layers whose part of a block is
#: smaller are read several at a time (see the module docstring).
MIN_RANGE_BYTES = 256 << 10


def layers_a_read(kv: PagedKv, min_range: int = MIN_RANGE_BYTES) -> int:
    """Layers one ranged read of a layer-by-layer load brings: enough that each block's range is at least
    ``min_range`` bytes, where the cache takes runs of layers (``PagedKv.layer_runs``); else one."""
    if min_range <= 0 or not kv.layer_runs or kv.layer_bytes <= 0:
        return 1
    return max(1, min(kv.num_layers, -(-min_range // kv.layer_bytes)))


def load(store: Any, loads: Sequence[Load], kv: PagedKv, layers_in: LayersIn, gate: Any = None,
         min_range: int = MIN_RANGE_BYTES) -> list[Load]:
    """Reads ``loads`` into their blocks a layer at a time, raising ``layers_in`` as each layer is in.
    Returns the loads that failed: a block missing, of another size, or one of whose ranges missed (the
    engine recomputes it). Never raises: a failed call fails every load (and the caller releases the
    layers' waiters). ``gate`` (``budget.LoadGate``): each layer lands only through it, and the
    load stops once the engine abandoned it. ``min_range``: see :func:`layers_a_read`."""
    n = len(loads)
    lb = kv.layer_bytes
    run = layers_a_read(kv, min_range)
    failed = [True] * n
    try:
        located = store.locate([l.key for l in loads])
        live = [i for i in range(n) if located.value_length(i) == kv.block_bytes]
        for i in live:
            failed[i] = False
        if len(live) < n:
            located = located.pick(live)  # the rest read nothing more
        for first in range(0, kv.num_layers, run):
            count = min(run, kv.num_layers - first)
            if gate is not None and gate.abandoned:
                return list(loads)
            if live:
                targets, commit = kv.layer_run_targets([loads[i].block_id for i in live], first, count)
                if gate is not None:
                    targets, commit = gate.staged(targets, commit)
                got = store.get_ranges_into(located, [first * lb] * len(live), targets)
                ok = [int(g) == count * lb for g in got]
                if gate is not None:
                    with gate.lock:
                        if gate.abandoned:
                            return list(loads)
                        commit(ok)
                else:
                    commit(ok)
                if not all(ok):
                    for i, good in zip(live, ok):
                        failed[i] |= not good
                    still = [j for j, good in enumerate(ok) if good]
                    located = located.pick(still)
                    live = [live[j] for j in still]
            layers_in.through(first + count - 1)
    except Exception as e:  # noqa: BLE001 - reported as failed blocks, never raised into the engine
        log.warning("kvpool layer-by-layer load of %d blocks failed: %s", n, e)
        failed = [True] * n
    return [l for l, bad in zip(loads, failed) if bad]


class Outcomes(NamedTuple):
    """What a step's saves report to the connector."""

    counted: Callable[[Sequence[Any], int], None]
    """The saves' final statuses (a ``PutStatus`` per save, in order) and the bytes of a block."""
    dropped: Callable[[int], None]
    """``n`` saves dropped without a status (the generation moved, or a call failed)."""
    over: Callable[[Sequence[Save]], None]
    """The saves are over (every status counted): their requests may be reported finished."""


class StepSaves:
    """A step's saves in parts (see the module docstring). Blocks of a request whose load failed are not
    written from the moment the connector knows of the failure (``keep``), so they fail at the finish and
    nothing of them becomes visible: a failed load voids what was computed over it.

    Args:
        saves: the step's saves (their blocks' keys and block ids).
        kv: the engine's paged KV, read a layer at a time on the save thread.
        planned: the cache generation the step was planned in.
    """

    def __init__(self, saves: Sequence[Save], kv: PagedKv, planned: int) -> None:
        self.saves = list(saves)
        self.kv = kv
        self.planned = planned
        self._cond = threading.Condition()
        self._through = -1  # layers computed through this one (engine thread, under _cond)
        self._keep = [True] * len(self.saves)
        self._finishing = False

    @property
    def open(self) -> bool:
        """True until the last layer was reported or the step ended early: more layers may come."""
        with self._cond:
            return not self._finishing

    # ---------------------------------------------------------------------------- engine thread

    def through(self, layer: int, keep: Sequence[bool]) -> None:
        """Layers up to ``layer`` were computed: their writes are queued (those not queued yet), and the
        finish after the last layer. ``keep[i]``: save ``i`` is still worth writing. Calls after the last
        layer, or for layers already queued, do nothing."""
        last = self.kv.num_layers - 1
        with self._cond:
            if self._finishing:
                return
            self._through = max(self._through, min(layer, last))
            self._keep = list(keep)
            self._finishing = self._through == last
            self._cond.notify_all()

    def finish_early(self, keep: Sequence[bool]) -> None:
        """The step ended without its last layer saved: finishes what was written (the rest fails)."""
        with self._cond:
            if self._finishing:
                return
            self._keep = list(keep)
            self._finishing = True
            self._cond.notify_all()

    # ---------------------------------------------------------------------------- save thread

    def run(self, store: Any, fence: Fence, outcomes: Outcomes) -> None:
        """Begins the puts, writes each layer as it is reported, and finishes after the last (or abandons,
        if the generation moved). Returns once the step's saves are over; never raises."""
        n = len(self.saves)
        kv = self.kv
        parts: Optional[Any] = None
        try:
            if self.planned == fence.generation():
                parts = store.begin_put([s.key for s in self.saves], [kv.block_bytes] * n)
            written = 0
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._through >= written or self._finishing)
                    through, keep, finishing = self._through, list(self._keep), self._finishing
                if parts is not None:
                    for layer in range(written, through + 1):
                        self._write(parts, layer, keep)
                written = max(written, through + 1)
                if finishing:
                    break
            if parts is None:
                outcomes.dropped(n)  # planned before a reset or weight switch
                return
            with fence.shared() as gen:
                if gen != self.planned:
                    parts.abandon()
                    outcomes.dropped(n)
                    return
                statuses = parts.finish()
            outcomes.counted([st if k else PutStatus.FAILED for st, k in zip(statuses, keep)], kv.block_bytes)
        except Exception as e:  # noqa: BLE001 - counted, never raised into the engine
            log.warning("kvpool layer-by-layer save of %d blocks failed: %s", n, e)
            if parts is not None:
                try:
                    parts.abandon()
                except Exception:  # noqa: BLE001 - nothing more to do
                    pass
            outcomes.dropped(n)
        finally:
            outcomes.over(self.saves)

    def _write(self, parts: Any, layer: int, keep: Sequence[bool]) -> None:
        items = [i for i, k in enumerate(keep) if k]
        if not items:
            return
        lb = self.kv.layer_bytes
        sources = self.kv.layer_sources([self.saves[i].block_id for i in items], layer)
        parts.write_many(items, [layer * lb] * len(items), sources)

