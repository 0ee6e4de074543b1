"""kvpool's vLLM connector, loaded by vLLM from ``kv_transfer_config`` and driven by vLLM's real v1
scheduler and requests, with the worker side run on KV caches vLLM lays out for its CPU backend, all
against a real kvpool pool (see engine_harness.py for what a step runs)."""

from __future__ import annotations

from importlib.metadata import version
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import kvpool
from kvpool.vllm import KvPoolConnector, KvPoolConnectorMetadata
from vllm.platforms import current_platform

from engine_harness import Engine, kv_value
from kvpool_pools import LayerWrites
from vllm_objects import BLOCK_SIZE, VLLM_DIST, VLLM_VERSION

BS = BLOCK_SIZE


def prompt(n: int, start: int = 10) -> list[int]:
    return list(range(start, start + n))


def pool_keys(engine: Engine, req: Any, upto: int) -> list[str]:
    """The pool keys of the request's full blocks among its first ``upto`` tokens."""
    from kvpool.connector import ConnectorRequest
    pc = engine.connector.connector
    view = ConnectorRequest("probe", req.all_token_ids, upto)
    return pc.keys_for(view)


@pytest.fixture
def client(kvpool_pool: Any) -> Any:
    with kvpool.Client(kvpool_pool.master) as c:
        yield c


@pytest.fixture(params=[False, True], ids=["whole-blocks", "layerwise"])
def engines(tiny_llama_dir: Any, kvpool_extra: dict, make_vllm_config: Any, request: pytest.FixtureRequest) -> Any:
    """Engines whose connector moves KV whole blocks or (``layerwise: true``) layer by layer: every test
    runs both ways."""
    made: list[Engine] = []

    def make(num_blocks: int = 64, **kw: Any) -> Engine:
        extra = dict(kvpool_extra, layerwise=request.param, **kw.pop("extra", {}))
        e = Engine(make_vllm_config(tiny_llama_dir, extra=extra, **kw), num_blocks)
        made.append(e)
        return e
    yield make
    for e in made:
        e.shutdown()


def test_vllm_is_the_pinned_cpu_build_and_loads_the_connector(engines: Any) -> None:
    assert version(VLLM_DIST) == VLLM_VERSION
    assert current_platform.is_cpu()
    e = engines()
    assert type(e.connector) is KvPoolConnector and type(e.worker) is KvPoolConnector
    assert e.connector.role.name == "SCHEDULER" and e.worker.role.name == "WORKER"
    assert e.layout.name == "LBHNC"
    assert e.worker.kv is not None and e.worker.kv.num_layers == 2 and e.worker.kv.block_size == BS


def test_the_cpu_kernel_stores_k_transposed_and_v_as_is(engines: Any) -> None:
    """Where vLLM's CPU kernel puts a token's K and V inside a block (what the connector's reading of
    the [B, H, N, C] cache assumes): written with cpu_attn_reshape_and_cache, found by value."""
    e = engines()
    cache = e.caches[e.layers[0]]
    cache.zero_()
    nb, nh, bs, c = cache.size()
    d = c // 2
    key = torch.arange(1, d + 1, dtype=torch.float32).view(1, 1, d).expand(1, nh, d).contiguous()
    key_cache, value_cache = cache.view((nb, nh, bs * 2, -1)).chunk(2, dim=2)
    from vllm import _custom_ops as ops
    ops.cpu_attn_reshape_and_cache(key, -key, key_cache, value_cache, torch.tensor([3 * bs + 5]), e.isa)
    head = cache[3, 0].reshape(-1)  # [K half: D x N][V half: N x D]
    assert e.isa == "vec"
    for j in range(d):
        assert head[j * bs + 5] == j + 1  # K[dim j, token 5]
        assert head[bs * d + 5 * d + j] == -(j + 1)  # V[token 5, dim j]
    assert int((head != 0).sum()) == 2 * d


def test_a_second_engine_loads_the_first_engines_prefix_from_the_pool(engines: Any, make_request: Any,
                                                                        client: Any) -> None:
    a = engines()
    r1 = a.add(make_request(prompt(100), max_tokens=3))
    a.run()
    assert a.outputs[r1.request_id].finish_reason.name == "LENGTH"
    keys = pool_keys(a, r1, 96)
    assert len(keys) == 3 and client.prefix_match(keys) == 3
    # the pool objects hold the blocks' bytes in the reference layout, as vLLM's CPU kernel reads them
    obj = bytearray(a.worker.kv.block_bytes)
    # (the first engine's blocks are free now but not overwritten)
    b = engines()
    r2 = b.add(make_request(prompt(100), max_tokens=3))
    so = b.schedule()
    md = so.kv_connector_metadata
    assert isinstance(md, KvPoolConnectorMetadata)
    assert [l.block_index for l in md.meta.loads] == [0, 1, 2]
    assert so.has_sync_kv_loads
    assert so.scheduled_new_reqs[0].num_computed_tokens == 96  # 3 blocks from the pool, 4 tokens to compute
    assert so.num_scheduled_tokens[r2.request_id] == 4
    b.execute(so)
    b.run()
    assert b.written[r2.request_id] == set(range(96, 102))  # b computed only what the pool lacked
    assert b.wrong_positions(r2, 102) == []
    st = b.worker.stats()
    assert st.loaded_blocks == 3 and st.failed_loads == 0
    stats = b.scheduler.make_stats()
    assert stats is not None
    for i, key in enumerate(keys):
        assert client.get_into(key, obj) == len(obj)
        got = torch.frombuffer(obj, dtype=torch.float32).view(2, 2, BS, 1, 32)
        assert torch.equal(got, b.canonical_block(b.block_table(r2.request_id)[i]))


def test_partial_hits_local_prefix_then_pool_then_compute(engines: Any, make_request: Any, client: Any) -> None:
    a = engines()
    a.add(make_request(prompt(100), max_tokens=1))
    a.run()  # the pool holds blocks 0..2 of prompt(100)
    b = engines()
    # b's own prefix cache holds block 0 (a 40-token request with the same start)
    b.add(make_request(prompt(40), max_tokens=1))
    b.run()
    # a prompt sharing 64 tokens with what a saved, then different: local block 0, pooled block 1, rest computed
    p = prompt(64) + prompt(50, start=400)
    r = b.add(make_request(p, max_tokens=2))
    so = b.schedule()
    md = so.kv_connector_metadata
    assert [l.block_index for l in md.meta.loads] == [1]
    assert so.scheduled_new_reqs[0].num_computed_tokens == 64
    b.execute(so)
    b.run()
    assert b.written[r.request_id] == set(range(64, 115))
    assert b.wrong_positions(r, 115) == []
    # the lookup asked the pool only past the local hit, and only whole blocks before the last token
    assert b.connector.connector.stats().matched_tokens >= 32


def test_a_load_that_fails_is_recomputed(engines: Any, make_request: Any, client: Any) -> None:
    a = engines()
    r1 = a.add(make_request(prompt(100), max_tokens=1))
    a.run()
    keys = pool_keys(a, r1, 96)
    b = engines()
    r = b.add(make_request(prompt(100), max_tokens=2))
    so = b.schedule()
    assert so.scheduled_new_reqs[0].num_computed_tokens == 96
    # block 1 disappears from the pool between the lookup and the load
    b.execute(so, before_load=lambda: client.remove(keys[1]))
    bad = b.kv_outputs[-1].invalid_block_ids
    assert bad == {b.block_table(r.request_id)[1]}
    assert b.worker.stats().failed_loads == 1 and b.worker.stats().loaded_blocks == 2
    # vLLM (kv_load_failure_policy=recompute) rolls the request back to the failed block and recomputes
    assert r.num_computed_tokens == 32
    b.run()
    assert set(range(32, 101)) <= b.written[r.request_id]
    assert b.wrong_positions(r, 101) == []
    assert b.outputs[r.request_id].finish_reason.name == "LENGTH"


def test_a_failed_load_fails_the_request_under_the_fail_policy(engines: Any, make_request: Any, client: Any) -> None:
    a = engines()
    r1 = a.add(make_request(prompt(100), max_tokens=1))
    a.run()
    keys = pool_keys(a, r1, 96)
    b = engines(kv_load_failure_policy="fail")
    r = b.add(make_request(prompt(100), max_tokens=2))
    b.step(before_load=lambda: client.remove(keys[0]))
    b.run()
    assert b.outputs[r.request_id].finish_reason.name == "ERROR"


def test_preempted_requests_saves_finish_first_and_it_resumes_from_the_pool(engines: Any, make_request: Any,
                                                                           client: Any) -> None:
    # 9 usable blocks: both requests start, then decoding needs a tenth and vLLM preempts one
    e = engines(num_blocks=10, max_model_len=256, enable_prefix_caching=False)
    r1 = e.add(make_request(prompt(100), max_tokens=60))
    r2 = e.add(make_request(prompt(90, start=300), max_tokens=60))
    preempted_in = None
    for _ in range(300):
        if not e.scheduler.has_requests() and not e.scheduler.finished_req_ids:
            break
        so = e.step()
        if so.preempted_req_ids and preempted_in is None:
            preempted_in = so
    assert preempted_in is not None, "no request was preempted"
    victim = next(iter(preempted_in.preempted_req_ids))
    md = preempted_in.kv_connector_metadata
    assert md.preempted_req_ids == set(preempted_in.preempted_req_ids)
    # its full blocks were in the pool before its blocks were reused, and it resumed from them
    resumed = [m for m in e.metas if m is not None and any(l.request_id == victim for l in m.meta.loads)]
    assert resumed, "the preempted request did not load its blocks back from the pool"
    for r in (r1, r2):
        assert e.outputs[r.request_id].finish_reason.name == "LENGTH"
    assert e.worker.stats().failed_loads == 0


def test_an_aborted_request_keeps_its_blocks_until_its_saves_are_stored(engines: Any, make_request: Any,
                                                                       client: Any) -> None:
    from vllm.v1.request import RequestStatus
    e = engines(extra={"wait_for_save": False})
    free = e.free_blocks()
    r = e.add(make_request(prompt(100), max_tokens=50))
    e.step()  # the prefill: 3 blocks to save
    assert e.connector._reqs_with_saves == {r.request_id}
    e.scheduler.finish_requests(r.request_id, RequestStatus.FINISHED_ABORTED)
    # vLLM holds the blocks: the connector said saves are in flight
    assert e.free_blocks() < free
    e.step()  # the worker learns the request finished; its saves may still be running
    e.worker.connector.wait_for_save()  # (the test waits for them instead of stepping until they end)
    e.run()
    assert e.free_blocks() == free
    assert r.request_id in set().union(*(o.finished_sending or set() for o in e.kv_outputs))
    assert client.prefix_match(pool_keys(e, r, 96)) == 3


def test_reset_prefix_cache_with_reset_connector_empties_and_fences_the_pool(engines: Any, make_request: Any,
                                                                            client: Any) -> None:
    e = engines()
    r1 = e.add(make_request(prompt(100), max_tokens=1))
    e.run()
    keys = pool_keys(e, r1, 96)
    assert client.prefix_match(keys) == 3
    assert e.scheduler.reset_prefix_cache(reset_connector=True) is True
    assert client.prefix_match(keys) == 0
    # a step planned before a reset (its saves, gen g) and executed after it: nothing of it lands
    r2 = e.add(make_request(prompt(100, start=500), max_tokens=3))
    so = e.schedule()
    assert len(so.kv_connector_metadata.meta.saves) == 3
    # (vLLM resets the connector even while requests run; its own prefix cache reset then fails)
    assert e.scheduler.reset_prefix_cache(reset_connector=True) is False
    assert e.worker.stats().resets == 0 and e.connector.stats().resets == 2
    e.execute(so)
    assert e.worker.stats().dropped_saves == 3 and e.worker.stats().saved_blocks == 3  # r1's, before
    e.run()
    assert e.outputs[r2.request_id].finish_reason.name == "LENGTH"
    assert client.prefix_match(pool_keys(e, r2, 96)) == 0
    assert client.prefix_match(keys) == 0


def test_layerwise_writes_each_layer_of_a_step_without_loads_during_its_forward_pass(
        tiny_llama_dir: Any, kvpool_extra: dict, make_vllm_config: Any, make_request: Any, client: Any) -> None:
    """A prefill without pool hits: vLLM starts the step only after its forward pass (no synchronous
    loads), so the connector starts it at the first layer hook and layer i is in the step's puts before
    layer i + 1 is computed; after the step the blocks are whole in the pool."""
    e = Engine(make_vllm_config(tiny_llama_dir, extra=dict(kvpool_extra, layerwise=True)), 64)
    writes = LayerWrites(e.worker.connector)
    try:
        r = e.add(make_request(prompt(100), max_tokens=1))
        so = e.step(after_layer=writes.after_layer)
        assert not so.has_sync_kv_loads
        assert writes.each_before_the_next(e.worker.kv.layer_bytes, len(e.layers))
        e.run()
        assert client.prefix_match(pool_keys(e, r, 96)) == 3 and e.worker.stats().saved_blocks == 3
    finally:
        e.shutdown()
