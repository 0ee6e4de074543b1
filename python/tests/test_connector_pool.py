"""PoolConnector against a real pool: lookups, zero-copy loads into a paged cache, background saves
with a bounded queue, finished requests waiting for their saves, and resets that no earlier save
outlives. Ordering is forced with gates (events), never with sleeps."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import kvpool
from conftest import wait_until
from kvpool.connector import (
    BlockHasher, ConnectorRequest, FileFence, KeyFormat, PagedKvCache, PoolConnector, ScheduledRequest,
)

np = pytest.importorskip("numpy")

BS, LAYERS, HEADS, DIM = 16, 2, 2, 8


class Gated:
    """A client whose put_batch waits at a gate (each call signals ``entered`` first)."""

    def __init__(self, real: kvpool.Client) -> None:
        self.real = real
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def put_batch(self, keys: Any, values: Any, **kw: Any) -> Any:
        self.entered.release()
        assert self.release.wait(60), "test gate never opened"
        return self.real.put_batch(keys, values, **kw)


def make(client: Any, **kw: Any) -> tuple[PoolConnector, PagedKvCache]:
    pc = PoolConnector(client, BlockHasher(BS, "0"), KeyFormat("py-test", "v1", "f32"), **kw)
    kv = PagedKvCache(16, LAYERS, BS, HEADS, DIM)
    return pc, kv


def step(pc: PoolConnector, kv: PagedKvCache, scheduled: list, compute: Any = None) -> Any:
    """One engine step: meta, loads, 'forward' (compute fills blocks), saves."""
    meta = pc.build_connector_meta(scheduled)
    pc.start_load_kv(meta, kv)
    for layer in range(kv.num_layers):
        pc.wait_for_layer_load(layer)
    if compute:
        compute()
    for layer in range(kv.num_layers):
        pc.save_kv_layer(layer, kv)
    return meta


def prefill(pc: PoolConnector, kv: PagedKvCache, r: ConnectorRequest, blocks: list[int], seed: int = 1) -> Any:
    """A request computed from scratch: its blocks get random KV and its full blocks are saved."""
    assert pc.get_num_new_matched_tokens(r, 0).tokens == 0
    pc.update_state_after_alloc(r, blocks, 0)

    def compute() -> None:
        rnd = np.random.default_rng(seed)
        for b in blocks:
            kv.data[b] = rnd.standard_normal(kv.data[b].shape, dtype=np.float32)
    return step(pc, kv, [ScheduledRequest(r, blocks, 0, r.num_tokens)], compute)


def test_save_lookup_and_zero_copy_load(client: kvpool.Client) -> None:
    pc, kv = make(client)
    a = ConnectorRequest("a", list(range(40)))
    meta = prefill(pc, kv, a, [3, 5, 7])
    assert [s.block_id for s in meta.saves] == [3, 5]  # the partial third block is never saved
    pc.wait_for_save()
    assert pc.saved_blocks == 2 and pc.saved_bytes == 2 * kv.block_bytes
    keys = pc.keys_for(a)
    assert client.prefix_match(keys) == 2
    assert client.get(keys[0]) == kv.block(3).tobytes()

    b = ConnectorRequest("b", list(range(40)) + [99] * 8)
    m = pc.get_num_new_matched_tokens(b, 0)
    assert m.tokens == 32 and not m.load_async
    pc.update_state_after_alloc(b, [10, 11, 12], m.tokens)
    meta = step(pc, kv, [ScheduledRequest(b, [10, 11, 12], 32, 48)])
    assert [(l.block_id, l.block_index) for l in meta.loads] == [(10, 0), (11, 1)]
    assert pc.block_ids_with_load_errors() == set()
    assert np.array_equal(kv.data[10], kv.data[3]) and np.array_equal(kv.data[11], kv.data[5])
    assert pc.loaded_blocks == 2 and pc.loaded_bytes == 2 * kv.block_bytes
    pc.wait_for_save()
    assert client.prefix_match(pc.keys_for(b)) == 3  # b's third block was computed and saved
    pc.close()


def test_torch_cache_and_partly_computed_blocks(client: kvpool.Client) -> None:
    torch = pytest.importorskip("torch")
    pc = PoolConnector(client, BlockHasher(BS, "0"), KeyFormat("py-test", "v1", "f32"))
    kv = PagedKvCache(8, LAYERS, BS, HEADS, DIM, backend="torch")
    a = ConnectorRequest("a", list(range(64)))
    pc.update_state_after_alloc(a, [0, 1, 2, 3], 0)
    meta = pc.build_connector_meta([ScheduledRequest(a, [0, 1, 2, 3], 0, 64)])
    torch.manual_seed(0)
    kv.data.normal_()
    pc.start_load_kv(meta, kv)
    pc.save_kv_layer(LAYERS - 1, kv)
    pc.wait_for_save()
    # 20 tokens computed locally: the match starts at block 1 (loaded whole) and ends at 64
    b = ConnectorRequest("b", list(range(64)) + [1])
    m = pc.get_num_new_matched_tokens(b, 20)
    assert m.tokens == 64 - 20
    pc.update_state_after_alloc(b, [4, 5, 6, 7, 0], m.tokens)
    meta = step(pc, kv, [ScheduledRequest(b, [4, 5, 6, 7, 0], 64, 65)])
    assert [l.block_index for l in meta.loads] == [1, 2, 3]
    assert pc.block_ids_with_load_errors() == set()
    for src, dst in ((1, 5), (2, 6), (3, 7)):
        assert torch.equal(kv.data[src], kv.data[dst])
    with pytest.raises(ValueError, match="block boundary"):
        pc.get_num_new_matched_tokens(b, 20)
        pc.update_state_after_alloc(b, [4, 5, 6, 7, 0], 13)
    pc.close()


def test_a_vanished_block_is_reported_and_the_others_load(client: kvpool.Client) -> None:
    pc, kv = make(client)
    a = ConnectorRequest("a", list(range(48)))
    prefill(pc, kv, a, [0, 1, 2])
    pc.wait_for_save()
    b = ConnectorRequest("b", list(range(48)) + [5])
    m = pc.get_num_new_matched_tokens(b, 0)
    assert m.tokens == 48
    pc.update_state_after_alloc(b, [8, 9, 10, 11], 48)
    client.remove(pc.keys_for(b)[1])  # evicted between the lookup and the load
    step(pc, kv, [ScheduledRequest(b, [8, 9, 10, 11], 48, 49)])
    assert pc.block_ids_with_load_errors() == {9}
    assert pc.block_ids_with_load_errors() == set()  # reported once
    assert np.array_equal(kv.data[8], kv.data[0]) and np.array_equal(kv.data[10], kv.data[2])
    assert pc.failed_loads == 1 and pc.loaded_blocks == 2
    pc.close()


def test_a_step_whose_load_failed_saves_nothing_of_its_request(client: kvpool.Client) -> None:
    """b's fourth block is computed over a load that failed: it must not be saved (it would be wrong
    KV under a right key, and the recomputation's save would be refused as already present); c's
    block, computed in the same step, is saved."""
    pc, kv = make(client)
    a = ConnectorRequest("a", list(range(48)))
    prefill(pc, kv, a, [0, 1, 2])
    pc.wait_for_save()
    b = ConnectorRequest("b", list(range(64)) + [5])
    m = pc.get_num_new_matched_tokens(b, 0)
    assert m.tokens == 48
    pc.update_state_after_alloc(b, [8, 9, 10, 11, 12], 48)
    c = ConnectorRequest("c", [7] * 16)
    pc.update_state_after_alloc(c, [13], 0)
    client.remove(pc.keys_for(b)[1])  # evicted between the lookup and the load
    dropped = pc.dropped_saves
    meta = step(pc, kv, [ScheduledRequest(b, [8, 9, 10, 11, 12], 48, 65), ScheduledRequest(c, [13], 0, 16)])
    assert sorted(s.request_id for s in meta.saves) == ["b", "c"]
    pc.wait_for_save()
    assert pc.block_ids_with_load_errors() == {9}
    assert client.prefix_match(pc.keys_for(b)) == 1  # block 0 only: 1 vanished, 3 never saved
    assert not client.exists(pc.keys_for(b)[3])
    assert client.exists(pc.keys_for(c)[0])
    assert pc.dropped_saves - dropped == 1
    pc.close()


def test_a_failed_lookup_is_a_miss(client: kvpool.Client) -> None:
    class Broken(Gated):
        def prefix_match(self, keys: Any) -> int:
            raise kvpool.KvPoolError("master went away")

    pc, _ = make(Broken(client))
    assert pc.get_num_new_matched_tokens(ConnectorRequest("a", list(range(32))), 0).tokens == 0
    assert pc.lookups == 1
    pc.close()


def test_finished_requests_keep_their_blocks_until_saves_complete(client: kvpool.Client) -> None:
    gated = Gated(client)
    pc, kv = make(gated)
    a = ConnectorRequest("a", list(range(32)))
    prefill(pc, kv, a, [0, 1])
    assert gated.entered.acquire(timeout=30)  # the save is running, held at the gate
    assert pc.saves_in_flight() == 2
    assert pc.request_finished(a, [0, 1]) is True
    assert pc.get_finished({"a"}) == set()
    gated.release.set()
    pc.wait_for_save()
    assert pc.saves_in_flight() == 0
    assert pc.get_finished(set()) == {"a"}
    assert pc.get_finished(set()) == set()
    # no saves in flight: the blocks may go at once
    c = ConnectorRequest("c", list(range(8)))
    assert pc.request_finished(c, [2]) is False
    pc.close()


def test_a_full_save_queue_drops_the_step_and_counts_it(client: kvpool.Client) -> None:
    gated = Gated(client)
    pc, kv = make(gated, max_queued_saves=1)
    prefill(pc, kv, ConnectorRequest("a", list(range(32))), [0, 1])
    assert gated.entered.acquire(timeout=30)  # job 1 taken by the save thread
    prefill(pc, kv, ConnectorRequest("b", [7] * 32), [2, 3])  # job 2 waits in the queue
    c = ConnectorRequest("c", [8] * 48)
    prefill(pc, kv, c, [4, 5, 6])  # job 3: the queue is full
    assert pc.dropped_saves == 3 and pc.queue_full_drops == 3
    assert pc.request_finished(c, [4, 5, 6]) is False  # nothing of c is in flight
    gated.release.set()
    pc.wait_for_save()
    assert pc.saved_blocks == 4
    assert client.prefix_match(pc.keys_for(c)) == 0
    pc.close()


def test_a_save_queued_before_a_reset_never_lands_after_it(client: kvpool.Client) -> None:
    gated = Gated(client)
    pc, kv = make(gated)
    a, b = ConnectorRequest("a", list(range(32))), ConnectorRequest("b", [3] * 32)
    prefill(pc, kv, a, [0, 1])
    assert gated.entered.acquire(timeout=30)  # a's save is running
    prefill(pc, kv, b, [2, 3])  # b's save is queued, not started
    result: list = []
    t = threading.Thread(target=lambda: result.append(pc.reset_cache()))
    t.start()
    wait_until(lambda: pc.fence._writers_waiting == 1, "the reset to wait for the running save")  # type: ignore[attr-defined]
    gated.release.set()
    t.join(60)
    assert result and result[0].success
    pc.wait_for_save()
    assert client.prefix_match(pc.keys_for(a)) == 0  # ran before the reset: removed by it
    assert client.prefix_match(pc.keys_for(b)) == 0  # planned before the reset: dropped
    assert pc.saved_blocks == 2 and pc.dropped_saves == 2 and pc.resets == 1
    pc.close()


def test_work_planned_before_a_reset_is_void_after_it(client: kvpool.Client) -> None:
    pc, kv = make(client)
    a = ConnectorRequest("a", list(range(48)))
    prefill(pc, kv, a, [0, 1, 2])
    pc.wait_for_save()
    # b's loads are planned, then the pool is reset before the step runs
    b = ConnectorRequest("b", list(range(48)) + [1])
    m = pc.get_num_new_matched_tokens(b, 0)
    pc.update_state_after_alloc(b, [4, 5, 6, 7], m.tokens)
    c = ConnectorRequest("c", [9] * 32)
    pc.update_state_after_alloc(c, [8, 9], 0)
    meta = pc.build_connector_meta([ScheduledRequest(b, [4, 5, 6, 7], 48, 49), ScheduledRequest(c, [8, 9], 0, 32)])
    assert len(meta.loads) == 3 and len(meta.saves) == 2
    assert pc.reset_cache().success
    pc.start_load_kv(meta, kv)
    pc.save_kv_layer(LAYERS - 1, kv)
    pc.wait_for_save()
    assert pc.block_ids_with_load_errors() == {4, 5, 6}  # the engine recomputes them
    assert client.prefix_match(pc.keys_for(c)) == 0 and pc.dropped_saves == 2
    # loads planned, then a reset, then the meta built: reported as failed, nothing read
    m = pc.get_num_new_matched_tokens(a, 0)
    assert m.tokens == 0
    d = ConnectorRequest("d", [4] * 32)
    prefill(pc, kv, d, [10, 11])
    pc.wait_for_save()
    e = ConnectorRequest("e", [4] * 33)
    pc.update_state_after_alloc(e, [12, 13, 14], pc.get_num_new_matched_tokens(e, 0).tokens)
    assert pc.reset_cache().success
    meta = step(pc, kv, [ScheduledRequest(e, [12, 13, 14], 32, 33)])
    assert not meta.loads and len(meta.void_loads) == 2
    assert pc.block_ids_with_load_errors() == {12, 13}
    pc.close()


def test_put_outcomes_are_counted(client: kvpool.Client) -> None:
    class Outcomes(Gated):
        def put_batch(self, keys: Any, values: Any, **kw: Any) -> Any:
            return [kvpool.PutStatus.FENCED, kvpool.PutStatus.ALREADY_EXISTS, kvpool.PutStatus.FAILED,
                    kvpool.PutStatus.POOL_FULL][:len(keys)]

    pc, kv = make(Outcomes(client))
    prefill(pc, kv, ConnectorRequest("a", list(range(64))), [0, 1, 2, 3])
    pc.wait_for_save()
    s = pc.stats()
    assert (s.saved_blocks, s.skipped_saves, s.dropped_saves, s.fenced_saves) == (0, 2, 2, 1)
    pc.close()
    # the real pool: a block saved twice is skipped the second time
    pc, kv = make(client)
    prefill(pc, kv, ConnectorRequest("a", list(range(32))), [0, 1])
    prefill(pc, kv, ConnectorRequest("a2", list(range(32))), [2, 3])
    pc.wait_for_save()
    assert pc.saved_blocks == 2 and pc.skipped_saves == 2
    pc.close()


def test_versioned_keys_switch_and_reclaim(client: kvpool.Client) -> None:
    pc, kv = make(client)
    a = ConnectorRequest("a", list(range(48)))
    prefill(pc, kv, a, [0, 1, 2])
    pc.wait_for_save()
    old = pc.keys_for(a)
    fut = pc.switch_weights("v2", reclaim=True)
    assert fut.result(60) == 3
    assert pc.keys.weights == "v2" and pc.keys_for(a) != old
    assert client.prefix_match(old) == 0
    assert pc.get_num_new_matched_tokens(a, 0).tokens == 0
    pc.close()


def test_model_scope_reset_keeps_other_models(client: kvpool.Client) -> None:
    pc, kv = make(client, reset_scope="model")
    other = PoolConnector(client, BlockHasher(BS, "0"), KeyFormat("other-model", "v1", "f32"))
    a = ConnectorRequest("a", list(range(32)))
    prefill(pc, kv, a, [0, 1])
    prefill(other, kv, a, [0, 1])
    pc.wait_for_save()
    other.wait_for_save()
    r = pc.reset_cache()
    assert r.success and r.removed == 2
    assert client.prefix_match(pc.keys_for(a)) == 0 and client.prefix_match(other.keys_for(a)) == 2
    pc.close()
    other.close()


def test_scheduler_and_worker_objects_share_a_file_fence(client: kvpool.Client, tmp_path: Any) -> None:
    """vLLM's roles: one object plans, another carries out; the reset on the planner still drops the
    worker's saves planned before it."""
    fence = str(tmp_path / "fence")
    sched, _ = make(client, fence=FileFence(fence))
    worker, kv = make(client, fence=FileFence(fence))
    assert sched.generation() == worker.generation()
    a = ConnectorRequest("a", list(range(32)))
    sched.update_state_after_alloc(a, [0, 1], 0)
    meta = sched.build_connector_meta([ScheduledRequest(a, [0, 1], 0, 32)])
    assert sched.reset_cache().success
    assert worker.generation() == meta.generation + 1
    worker.start_load_kv(meta, kv)
    worker.save_kv_layer(LAYERS - 1, kv)
    worker.wait_for_save()
    assert worker.dropped_saves == 2 and client.prefix_match(sched.keys_for(a)) == 0
    # the worker reports the finished request once its (dropped) saves are over
    assert worker.get_finished({"a"}) == {"a"}
    sched.close()
    worker.close()


def test_file_fence_excludes_across_threads(tmp_path: Any) -> None:
    """A bump waits for a shared holder, whatever the timing: it cannot finish while the holder waits."""
    f = FileFence(str(tmp_path / "fence"))
    g0 = f.generation()
    order: list[str] = []
    holding, go = threading.Event(), threading.Event()

    def reader() -> None:
        with f.shared() as g:
            assert g == g0
            holding.set()
            assert go.wait(60)
            order.append("save done")

    def resetter() -> None:
        with f.bump() as g:
            order.append(f"reset to {g}")

    r = threading.Thread(target=reader)
    r.start()
    assert holding.wait(30)
    w = threading.Thread(target=resetter)
    w.start()
    w.join(0.2)
    assert w.is_alive() and order == []  # blocked by the reader, however long we look
    go.set()
    r.join(30)
    w.join(30)
    assert order == ["save done", f"reset to {g0 + 1}"] and f.generation() == g0 + 1
