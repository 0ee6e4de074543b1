"""How long the pool may make a request wait, the Python twin of Java's ``LoadBudget``, ``PoolBreaker`` and
``LoadGate``: a pool that is slow, frozen or partitioned must cost no more than recomputing.

* Deadlines. A step's loads and each lookup get at most ``load_deadline`` seconds, or what recomputing their
  tokens takes at ``recompute_tokens_per_s`` (the engine's prefill rate), the shorter when both are set; without
  either nothing has a deadline and lookups run on the caller's thread, as before. A lookup with a deadline runs
  on a thread of its own; past the deadline it is a miss (it finishes unused).
* :class:`LoadGate`: one step's loads past their deadline are abandoned and never write the engine's memory
  afterwards.
* :class:`PoolBreaker`: a pool that missed a deadline is left alone (lookups are misses at once, loads fail at
  once, saves are skipped), so the requests behind do not each pay the deadline again; it is probed off the
  requests' path (the failed lookup or loads again, started by a request once the backoff passed: 1 s, doubling
  while it keeps failing, at most 30 s) and back in use once a probe answers or loads land.

Clocks are injected (``time.monotonic`` by default), so tests step them.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
import time
from typing import Any, Callable, Optional, Sequence

from ..buffers import as_memoryview

__all__ = ["LoadGate", "PoolBreaker", "LoadBudget"]

log = logging.getLogger("kvpool.connector")

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0

#: A probe: the call that failed, asked again; True when the pool answered it.
Probe = Callable[[], bool]


class LoadGate:
    """One step's loads as the engine waits for them, with their deadline. The load thread puts what it read in
    place and records the outcome only through :meth:`finish`, under the gate's lock; the engine's thread
    abandons the loads (past the deadline) under the same lock. So an abandoned load never writes the engine's
    memory nor its error sets later, however long the pool kept it: with a deadline, reads go to staging
    buffers first (:meth:`staged`), never straight into the engine's blocks."""

    def __init__(self, deadline: Optional[float]) -> None:
        self.deadline = deadline
        self.lock = threading.Lock()
        self.abandoned = False
        self.done = False
        self.probe: Probe = lambda: True  # the loads again, should they miss the deadline (the connector sets it)

    def remaining(self) -> Optional[float]:
        """Seconds left (never negative), None without a deadline."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def abandon(self) -> bool:
        """Gives up on the loads unless they landed; True only if this call abandoned them (so they are counted
        once)."""
        with self.lock:
            if self.done or self.abandoned:
                return False
            self.abandoned = True
            return True

    def finish(self, land: Callable[[], None]) -> bool:
        """Runs ``land`` (put the bytes in place, record the outcome) unless the loads were abandoned."""
        with self.lock:
            if self.abandoned:
                return False
            land()
            self.done = True
            return True

    def staged(self, targets: list[Any], commit: Callable[[Sequence[bool]], None]) \
            -> tuple[list[Any], Callable[[Sequence[bool]], None]]:
        """With a deadline, ``targets`` behind staging buffers: the reads land there, and only the commit (under
        :meth:`finish`) copies them into the targets. Without one, the targets themselves."""
        if self.deadline is None:
            return targets, commit
        views = [as_memoryview(t, writable=True) for t in targets]
        stage = [bytearray(v.nbytes) for v in views]

        def copy_then_commit(ok: Sequence[bool]) -> None:
            for v, b, good in zip(views, stage, ok):
                if good:
                    v[:] = b
            commit(ok)
        return stage, copy_then_commit


class PoolBreaker:
    """Whether the pool is in use now (see the module docstring). ``start(fn)`` runs a probe off the caller's
    thread (default: a daemon thread; tests run it when they choose)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 start: Optional[Callable[[Callable[[], None]], None]] = None) -> None:
        self._clock = clock
        self._start = start or (lambda fn: threading.Thread(target=fn, name="kvpool-probe", daemon=True).start())
        self._lock = threading.Lock()
        self._open = False
        self._probing = False
        self._probe: Optional[Probe] = None
        self._retry_at = 0.0
        self._backoff = FIRST_BACKOFF_S
        self.skipped = 0
        self.trips = 0

    def admit(self) -> bool:
        """True when the pool is in use; False (counted) while it is left alone, maybe starting a probe."""
        with self._lock:
            if not self._open:
                return True
            self.skipped += 1
            if self._probing or self._clock() < self._retry_at or self._probe is None:
                return False
            self._probing = True
            probe = self._probe
        self._start(lambda: self._probed(probe))
        return False

    def _probed(self, probe: Probe) -> None:
        try:
            answered = bool(probe())
        except Exception:  # noqa: BLE001 - a probe that fails is the pool still unwell
            answered = False
        with self._lock:
            self._probing = False
            if answered:
                self._close("a probe answered")
            elif self._open:
                self._backoff = min(2 * self._backoff, MAX_BACKOFF_S)
                self._retry_at = self._clock() + self._backoff

    def closed(self) -> bool:
        with self._lock:
            return not self._open

    def failed(self, why: str, probe: Probe) -> None:
        """The pool made a request wait past its deadline or failed it: leave it alone, probe it with ``probe``."""
        with self._lock:
            self._probe = probe
            if self._open:
                return
            self._open = True
            self._backoff = FIRST_BACKOFF_S
            self._retry_at = self._clock() + self._backoff
            self.trips += 1
        log.warning("kvpool: %s; the engine recomputes without the pool until a probe of it answers (the first in "
                    "%.0f s)", why, FIRST_BACKOFF_S)

    def succeeded(self) -> None:
        """Loads landed: the pool is in use again."""
        with self._lock:
            self._close("loads landed")

    def _close(self, why: str) -> None:
        if self._open:
            self._open = False
            self._backoff = FIRST_BACKOFF_S
            log.info("kvpool: %s again; the pool is back in use", why)


class PrefillRate:
    """The engine's measured prefill cost, seconds a token, from the steps it computed without loads (the Java
    ``PrefillRate``'s twin): a step is timed from ``start_load_kv`` to ``wait_for_save`` (the forward pass), an
    exponentially weighted average by tokens, unknown until :data:`MIN_TOKENS` tokens were timed."""

    MIN_TOKENS = 256
    #: the shortest deadline given: a load of a block or two still gets time for one round trip
    FLOOR_S = 1e-3

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.seconds_per_token = float("nan")
        self.timed_tokens = 0
        self._step: Optional[tuple[int, float]] = None

    def step_started(self, tokens: int, loads: bool) -> None:
        """A step of ``tokens`` computed tokens starts; one with loads is not timed (its time includes waits)."""
        self._step = (tokens, self.clock()) if tokens > 0 and not loads else None

    def step_ended(self) -> None:
        if self._step is None:
            return
        tokens, started = self._step
        self._step = None
        per = (self.clock() - started) / tokens
        w = min(1.0, tokens / 2048.0) / 8 + 1.0 / 64
        self.seconds_per_token = per if math.isnan(self.seconds_per_token) else \
            self.seconds_per_token + w * (per - self.seconds_per_token)
        self.timed_tokens += tokens

    def seconds(self, tokens: int, factor: float) -> Optional[float]:
        """How long recomputing ``tokens`` tokens would take, times ``factor``; None while unknown."""
        if self.timed_tokens < self.MIN_TOKENS or math.isnan(self.seconds_per_token):
            return None
        return max(self.FLOOR_S, tokens * self.seconds_per_token * factor)


class LoadBudget:
    """Deadlines of lookups and loads, and the breaker (see the module docstring). ``prefill_factor``: a load of
    ``t`` tokens may also take at most ``factor`` times what the engine's measured prefill (:class:`PrefillRate`)
    takes for them, once measured."""

    def __init__(self, block_size: int, load_deadline: Optional[float], recompute_tokens_per_s: Optional[float],
                 breaker: Optional[PoolBreaker] = None, prefill_factor: Optional[float] = None) -> None:
        for name, v in (("load_deadline", load_deadline), ("recompute_tokens_per_s", recompute_tokens_per_s),
                        ("load_deadline_prefill", prefill_factor)):
            if v is not None and not v > 0:
                raise ValueError(f"{name} must be a positive number of seconds, tokens a second or a factor, got {v!r}")
        self.block_size = block_size
        self.load_deadline = load_deadline
        self.recompute_tokens_per_s = recompute_tokens_per_s
        self.prefill_factor = prefill_factor
        self.prefill = PrefillRate()
        self.breaker = breaker or PoolBreaker()
        self._lookups: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._last_warning = float("-inf")

    @property
    def active(self) -> bool:
        return self.load_deadline is not None or self.recompute_tokens_per_s is not None \
            or self.prefill_factor is not None

    def seconds(self, tokens: int) -> Optional[float]:
        """How long moving ``tokens`` tokens' KV may take, None for no limit (the shortest budget holds)."""
        budgets = []
        if self.load_deadline is not None:
            budgets.append(self.load_deadline)
        if self.recompute_tokens_per_s is not None:
            budgets.append(tokens / self.recompute_tokens_per_s)
        measured = None if self.prefill_factor is None else self.prefill.seconds(tokens, self.prefill_factor)
        if measured is not None:
            budgets.append(measured)
        return min(budgets) if budgets else None

    def deadline(self, blocks: int) -> Optional[float]:
        """When a step's loads of ``blocks`` blocks must be in (``time.monotonic()``), None for no limit."""
        s = self.seconds(blocks * self.block_size)
        return None if s is None else time.monotonic() + s

    def admit(self) -> bool:
        """False while the pool is left alone: the request skips it (a miss, or loads failed at once)."""
        return not self.active or self.breaker.admit()

    def in_use(self) -> bool:
        """False while the pool is left alone: saves are skipped."""
        return not self.active or self.breaker.closed()

    def lookup(self, ask: Callable[[], int], tokens: int) -> int:
        """``ask()``'s answer, or 0 (a miss) when it fails or takes longer than the budget for ``tokens`` tokens
        (with a budget, the pool is then left alone; without, the failure is logged at most every 10 s)."""
        limit = self.seconds(tokens)
        probe: Probe = lambda: self.within(ask, self.seconds(tokens))[0]  # noqa: E731
        if limit is None:
            try:
                return int(ask())
            except Exception as e:  # noqa: BLE001 - a lookup failure is a miss, never an engine error
                now = time.monotonic()
                if now - self._last_warning > 10.0:
                    self._last_warning = now
                    log.warning("kvpool lookup failed (%s); treating as a miss (logged at most every 10 s)", e)
                return 0
        try:
            done, present = self.within(ask, limit)
        except Exception as e:  # noqa: BLE001
            self.breaker.failed(f"a lookup failed ({e})", probe)
            return 0
        if not done:
            self.breaker.failed(f"a lookup took longer than {limit * 1e3:.0f} ms (recomputing would take no longer)",
                                probe)
            return 0
        return int(present)

    def within(self, call: Callable[[], Any], limit: Optional[float]) -> tuple[bool, Any]:
        """``(True, call())`` when it returns within ``limit`` seconds (None: however long), else ``(False,
        None)`` (the call goes on, unused, on a thread of its own). What the call raises is raised."""
        if limit is None:
            return True, call()
        if self._lookups is None:
            self._lookups = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="kvpool-lookup")
        f = self._lookups.submit(call)
        try:
            return True, f.result(limit)
        except concurrent.futures.TimeoutError:
            return False, None

    def close(self) -> None:
        if self._lookups is not None:
            self._lookups.shutdown(wait=False)


def loads_again(budget: LoadBudget, client: Any, keys: Sequence[str], sizes: Sequence[int]) -> bool:
    """A probe of a pool left alone after loads of ``keys`` were abandoned: the same loads into scratch memory;
    True when they came back within the budget for them (a link that is only slow still misses it)."""
    limit = budget.seconds(len(keys) * budget.block_size)
    return budget.within(lambda: client.get_into_batch(list(keys), [bytearray(n) for n in sizes]), limit)[0]
