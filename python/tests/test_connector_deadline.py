"""A pool that is slow costs no more than recomputing: a step's loads past their deadline are abandoned and
reported failed (the engine recomputes those blocks), the engine's memory is never written by them afterwards,
and the pool comes back into use by itself. The pool here is frozen with SIGSTOP (master and node: one
``kvpool serve``), so its loads cannot finish until it is thawed; nothing depends on how fast anything is."""

from __future__ import annotations

import os
import time
import signal
from typing import Any, Iterator

import pytest

import kvpool
from conftest import start_pool
from kvpool.connector import BlockHasher, ConnectorRequest, KeyFormat, PagedKvCache, PoolConnector, ScheduledRequest

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


@pytest.mark.parametrize("granularity", ["block", "layer"])
def test_loads_past_their_deadline_are_abandoned_and_the_pool_comes_back(own_pool: Any, granularity: str) -> None:
    keys = KeyFormat(f"deadline-{granularity}", "v1", "f32")
    tokens = list(range(1, 2 * BS + 2))
    with kvpool.Client(own_pool.master, shared_memory=False, timeout=300) as client:
        src = saved(client, keys, tokens)
        kv = PagedKvCache(8, LAYERS, BS, HEADS, DIM)
        kv.data.fill(np.nan)
        pc = PoolConnector(client, BlockHasher(BS, "0"), keys, granularity=granularity, load_deadline=0.5)
        try:
            r = ConnectorRequest("r", tokens)
            m = pc.get_num_new_matched_tokens(r, 0)
            assert m.tokens == 2 * BS
            pc.update_state_after_alloc(r, [4, 5, 6], m.tokens)
            meta = pc.build_connector_meta([ScheduledRequest(r, [4, 5, 6], m.tokens, m.tokens + 1)])

            os.killpg(own_pool.proc.pid, signal.SIGSTOP)  # the pool answers nothing from here on
            pc.start_load_kv(meta, kv)
            for layer in range(LAYERS):
                pc.wait_for_layer_load(layer)  # returns at the deadline: the 300 s client timeout never matters
            assert pc.block_ids_with_load_errors() == {4, 5}
            assert pc.stats().abandoned_loads == 2

            os.killpg(own_pool.proc.pid, signal.SIGCONT)
            # the next step's load runs after the abandoned one on the load thread, and lands
            pc.load_deadline = 120.0
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
        finally:
            pc.close()


def test_async_loads_past_their_deadline_are_reported_failed(own_pool: Any) -> None:
    keys = KeyFormat("deadline-async", "v1", "f32")
    tokens = list(range(1, 2 * BS + 2))
    with kvpool.Client(own_pool.master, shared_memory=False, timeout=300) as client:
        saved(client, keys, tokens)
        kv = PagedKvCache(8, LAYERS, BS, HEADS, DIM)
        kv.data.fill(np.nan)
        pc = PoolConnector(client, BlockHasher(BS, "0"), keys, async_loads=True, load_deadline=0.5)
        try:
            r = ConnectorRequest("a", tokens)
            m = pc.get_num_new_matched_tokens(r, 0)
            pc.update_state_after_alloc(r, [4, 5, 6], m.tokens)
            meta = pc.build_connector_meta([])
            os.killpg(own_pool.proc.pid, signal.SIGSTOP)
            pc.start_load_kv(meta, kv)
            done: set = set()
            failed: set = set()
            while "a" not in done:
                time.sleep(0.01)  # as an engine's steps poll
                d, f = pc.finished_loads()
                done |= d
                failed |= f
            assert failed == {"a"} and pc.stats().abandoned_loads == 2
            os.killpg(own_pool.proc.pid, signal.SIGCONT)
            assert pc.finished_loads(wait=True) == (set(), set())  # reported once
            assert np.isnan(kv.data[4:6]).all()
        finally:
            pc.close()


def test_kvpool_vllm_takes_the_deadline_from_its_config_and_refuses_a_bad_one(pool: Any, tmp_path: Any) -> None:
    from types import SimpleNamespace
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
