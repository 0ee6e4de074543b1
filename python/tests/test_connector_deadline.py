"""A pool that is slow costs no more than recomputing: a step's loads past their deadline are abandoned and
reported failed (the engine recomputes those blocks), the engine's memory is never written by them afterwards;
a lookup past its deadline is a miss; the pool is then left alone (lookups miss at once, saves are skipped) and
comes back into use by itself once a probe of it answers. The pool here is frozen with SIGSTOP (master and node:
one ``kvpool serve``), so nothing of it can answer until it is thawed; the breaker's clock is the test's, and its
probes run when a request starts them, inline: nothing depends on how fast anything is."""

from __future__ import annotations

import contextlib
import os
import time
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

import kvpool
from conftest import start_pool
from kvpool.connector import BlockHasher, ConnectorRequest, KeyFormat, PagedKvCache, PoolConnector, ScheduledRequest
from kvpool.connector.budget import FIRST_BACKOFF_S, PoolBreaker

np = pytest.importorskip("numpy")

BS, LAYERS, HEADS, DIM = 16, 2, 2, 8


@pytest.fixture
def own_pool() -> Iterator[Any]:
    p = start_pool(segment_size="64MiB")
    try:
        yield p
    finally:
        os.killpg(p.proc.pid, signal.SIGCONT)
        p.stop()


def freeze(pool: Any) -> None:
    """SIGSTOPs the pool (master and node: one ``kvpool serve``) and returns once every thread of it is stopped: from
    then on it answers nothing."""
    os.killpg(pool.proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 30
    while True:
        states = []
        for task in Path(f"/proc/{pool.proc.pid}/task").iterdir():
            try:
                states.append(task.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0])
            except OSError:
                continue  # a thread that ended meanwhile
        if states and all(s == "T" for s in states):
            return
        assert time.monotonic() < deadline, f"the pool did not stop: thread states {states}"
        time.sleep(0.01)


class Clock:
    """The breaker's clock: moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stepped(pc: PoolConnector) -> Clock:
    """``pc``'s breaker on a clock the test moves, its probes run inline by the request that starts them."""
    clock = Clock()
    pc._budget.breaker = PoolBreaker(clock, start=lambda fn: fn())
    return clock


def saved(client: kvpool.Client, keys: KeyFormat, tokens: list[int]) -> PagedKvCache:
    """Saves the prompt's two full blocks (random KV in blocks 1 and 2) and returns the cache."""
    kv = PagedKvCache(8, LAYERS, BS, HEADS, DIM)
    kv.data[:] = np.random.default_rng(3).standard_normal(kv.data.shape, dtype=np.float32)
    with PoolConnector(client, BlockHasher(BS, "0"), keys) as pc:
        r = ConnectorRequest("w", tokens)
        pc.update_state_after_alloc(r, [1, 2], 0)
        pc.start_load_kv(pc.build_connector_meta([ScheduledRequest(r, [1, 2], 0, 2 * BS)]), kv)
        for layer in range(LAYERS):
            pc.save_kv_layer(layer, kv)
        pc.wait_for_save()
        assert pc.saved_blocks == 2
    return kv


@contextlib.contextmanager
def connector_on(pool: Any, name: str, **kw: Any) -> Iterator[Any]:
    """A connector over ``pool`` (TCP only, a client timeout far past any deadline here) whose pool holds the test
    prompt's two blocks, with its breaker on the test's clock; closed afterwards."""
    keys = KeyFormat(name, "v1", "f32")
    tokens = list(range(1, 2 * BS + 2))
    with kvpool.Client(pool.master, shared_memory=False, timeout=300) as client:
        src = saved(client, keys, tokens)
        kv = PagedKvCache(8, LAYERS, BS, HEADS, DIM)
        kv.data.fill(np.nan)
        pc = PoolConnector(client, BlockHasher(BS, "0"), keys, **kw)
        try:
            yield SimpleNamespace(pc=pc, clock=stepped(pc), tokens=tokens, src=src, kv=kv)
        finally:
            pc.close()


@pytest.mark.parametrize("granularity", ["block", "layer"])
def test_loads_past_their_deadline_are_abandoned_and_the_pool_comes_back(own_pool: Any, granularity: str) -> None:
    with connector_on(own_pool, f"deadline-{granularity}", granularity=granularity, load_deadline=120.0) as t:
        pc, clock, tokens, src, kv = t.pc, t.clock, t.tokens, t.src, t.kv
        r = ConnectorRequest("r", tokens)
        m = pc.get_num_new_matched_tokens(r, 0)
        assert m.tokens == 2 * BS
        pc.update_state_after_alloc(r, [4, 5, 6], m.tokens)
        meta = pc.build_connector_meta([ScheduledRequest(r, [4, 5, 6], m.tokens, m.tokens + 1)])

        freeze(own_pool)  # the pool answers nothing from here on
        pc.load_deadline = 0.5
        pc.start_load_kv(meta, kv)
        for layer in range(LAYERS):
            pc.wait_for_layer_load(layer)  # returns at the deadline: the 300 s client timeout never matters
        assert pc.block_ids_with_load_errors() == {4, 5}
        assert pc.stats().abandoned_loads == 2

        # left alone: the next request is a miss without asking the pool, no probe before the backoff
        assert pc.get_num_new_matched_tokens(ConnectorRequest("lone", tokens), 0).tokens == 0
        assert pc.stats().skipped_lookups == 1

        os.killpg(own_pool.proc.pid, signal.SIGCONT)
        pc.load_deadline = 120.0
        clock.now += FIRST_BACKOFF_S
        # this request starts the probe (the abandoned loads again) and skips the pool itself; the probe answers
        assert pc.get_num_new_matched_tokens(ConnectorRequest("probe", tokens), 0).tokens == 0
        assert pc._budget.in_use()
        # the next step's load runs after the abandoned one on the load thread, and lands
        r2 = ConnectorRequest("r2", tokens)
        m = pc.get_num_new_matched_tokens(r2, 0)
        pc.update_state_after_alloc(r2, [1, 2, 3], m.tokens)
        meta = pc.build_connector_meta([ScheduledRequest(r2, [1, 2, 3], m.tokens, m.tokens + 1)])
        kv.data[1:3] = 0
        pc.start_load_kv(meta, kv)
        for layer in range(LAYERS):
            pc.wait_for_layer_load(layer)
        assert pc.block_ids_with_load_errors() == set()
        assert np.array_equal(kv.data[1:3], src.data[1:3])
        # the abandoned load finished by now (it ran first), and never wrote the blocks it had been given
        assert np.isnan(kv.data[4:6]).all()


def test_async_loads_past_their_deadline_are_reported_failed(own_pool: Any) -> None:
    with connector_on(own_pool, "deadline-async", async_loads=True, load_deadline=120.0) as t:
        pc, clock, tokens, kv = t.pc, t.clock, t.tokens, t.kv
        r = ConnectorRequest("a", tokens)
        m = pc.get_num_new_matched_tokens(r, 0)
        pc.update_state_after_alloc(r, [4, 5, 6], m.tokens)
        r2 = ConnectorRequest("b", tokens)  # matched before the freeze, planned after the pool is left alone
        pc.update_state_after_alloc(r2, [1, 2, 3], pc.get_num_new_matched_tokens(r2, 0).tokens)
        meta = pc.build_connector_meta([])
        freeze(own_pool)
        pc.load_deadline = 0.5
        b_meta = type(meta)([l for l in meta.loads if l.request_id == "b"], [], meta.generation)
        meta = type(meta)([l for l in meta.loads if l.request_id == "a"], [], meta.generation)
        pc.start_load_kv(meta, kv)
        done: set = set()
        failed: set = set()
        while "a" not in done:
            time.sleep(0.01)  # as an engine's steps poll
            d, f = pc.finished_loads()
            done |= d
            failed |= f
        assert failed == {"a"} and pc.stats().abandoned_loads == 2
        pc.start_load_kv(b_meta, kv)  # left alone: b's loads fail at once, nothing waits for the frozen pool
        assert pc.finished_loads() == ({"b"}, {"b"})
        os.killpg(own_pool.proc.pid, signal.SIGCONT)
        assert pc.finished_loads(wait=True) == (set(), set())  # reported once
        assert np.isnan(kv.data[1:6]).all()
        pc.load_deadline = 120.0
        clock.now += FIRST_BACKOFF_S
        assert pc.get_num_new_matched_tokens(ConnectorRequest("probe", tokens), 0).tokens == 0  # starts the probe
        assert pc.get_num_new_matched_tokens(ConnectorRequest("c", tokens), 0).tokens == 2 * BS


def test_a_lookup_past_its_deadline_is_a_miss_and_the_pool_is_left_alone(own_pool: Any) -> None:
    with connector_on(own_pool, "deadline-lookup", load_deadline=0.5) as t:
        pc, clock, tokens = t.pc, t.clock, t.tokens
        freeze(own_pool)  # a master that answers nothing: as behind a partition
        assert pc.get_num_new_matched_tokens(ConnectorRequest("r", tokens), 0).tokens == 0  # at the deadline
        assert pc.get_num_new_matched_tokens(ConnectorRequest("s", tokens), 0).tokens == 0  # without asking
        assert pc.stats().skipped_lookups == 1
        clock.now += FIRST_BACKOFF_S
        assert pc.get_num_new_matched_tokens(ConnectorRequest("t", tokens), 0).tokens == 0  # its probe times out
        assert not pc._budget.in_use()
        os.killpg(own_pool.proc.pid, signal.SIGCONT)
        pc.load_deadline = 120.0
        clock.now += 2 * FIRST_BACKOFF_S  # the backoff doubled
        assert pc.get_num_new_matched_tokens(ConnectorRequest("u", tokens), 0).tokens == 0  # probe answers
        assert pc.get_num_new_matched_tokens(ConnectorRequest("v", tokens), 0).tokens == 2 * BS


def test_kvpool_vllm_takes_the_deadline_from_its_config_and_refuses_a_bad_one(pool: Any, tmp_path: Any) -> None:
    from kvpool.vllm import KVConnectorRole, KvPoolConnector

    def config(**extra: Any) -> Any:
        return SimpleNamespace(
            kv_transfer_config=SimpleNamespace(kv_connector_extra_config={
                "master": pool.master, "hash_seed": "0", "model": "m", "fence_path": str(tmp_path / "f"), **extra}),
            cache_config=SimpleNamespace(block_size=BS, cache_dtype="auto"),
            model_config=SimpleNamespace(model="m", dtype="float32"),
            parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1))
    c = KvPoolConnector(config(load_deadline_ms=250, recompute_tokens_per_s=8000), KVConnectorRole.SCHEDULER)
    try:
        assert c.connector.load_deadline == pytest.approx(0.25)
        assert c.connector.recompute_tokens_per_s == 8000.0
    finally:
        c.shutdown()
    with pytest.raises(ValueError, match="load_deadline_ms must be a positive number, got 'soon'"):
        KvPoolConnector(config(load_deadline_ms="soon"), KVConnectorRole.SCHEDULER)


def test_the_measured_prefill_rate_bounds_loads(pool: Any) -> None:
    """``load_deadline_prefill``: the connector times the engine's steps without loads (start_load_kv to
    wait_for_save) and bounds a load of ``t`` tokens by the factor times what ``t`` tokens took; steps with loads
    are not timed. The clock is the test's: nothing depends on how fast anything runs."""
    from kvpool.connector.budget import PrefillRate

    class Tick:
        now = 0.0

        def __call__(self) -> float:
            return self.now

    tick = Tick()
    with kvpool.Client(pool.master) as c, PoolConnector(c, BlockHasher(BS, "0"), KeyFormat("prefill", "v1", "f32"),
                                                       load_deadline_prefill=2.0) as pc:
        pc._budget.prefill = PrefillRate(tick)
        kv = PagedKvCache(64, LAYERS, BS, HEADS, DIM)
        assert pc._budget.seconds(160) is None, "unknown until measured: no limit"
        for i in range(20):  # steps of 16 tokens, each 16 ms of (test) time: 1 ms a token
            r = ConnectorRequest(f"p{i}", list(range(i * 100, i * 100 + BS)))
            pc.update_state_after_alloc(r, [i + 1], 0)
            pc.start_load_kv(pc.build_connector_meta([ScheduledRequest(r, [i + 1], 0, BS)]), kv)
            tick.now += 0.016
            for layer in range(LAYERS):
                pc.save_kv_layer(layer, kv)
            pc.wait_for_save()
        assert pc._budget.prefill.timed_tokens == 20 * BS
        assert pc._budget.seconds(160) == pytest.approx(2.0 * 160 * 0.001)
        # a step with loads is not timed, however long it takes
        r = ConnectorRequest("p0-again", list(range(0, BS)) + [7])
        m = pc.get_num_new_matched_tokens(r, 0)
        assert m.tokens == BS
        pc.update_state_after_alloc(r, [40, 41], m.tokens)
        meta = pc.build_connector_meta([ScheduledRequest(r, [40, 41], BS, BS + 1)])
        assert meta.loads
        pc.start_load_kv(meta, kv)
        tick.now += 10.0
        pc.wait_for_save()
        assert pc._budget.prefill.timed_tokens == 20 * BS
    with pytest.raises(ValueError, match="load_deadline_prefill"):
        PoolConnector(object(), BlockHasher(BS, "0"), KeyFormat("prefill", "v1", "f32"), load_deadline_prefill=0)
