"""kvpool.vllm on a hybrid model under vLLM's real scheduler with its hybrid allocator: two KV cache groups
(full attention on layers 0 and 2, a 64-token sliding window on layers 1 and 3), placed by vLLM's own
``get_kv_cache_configs`` (the groups overlay one allocation), allocated by ``allocate_kv_cache`` in a GPU
layout on CPU (the device edge's CPU implementation), scheduled by vLLM's ``Scheduler`` with the connector
declaring ``SupportsHMA``. The forward pass is the one stand-in: each layer writes every computed token's K and
V (a function of the token, its position and the layer) into its group's blocks, as FlashAttention's cache
update would (``kv_cache.transpose(1, 2).split(head_size)``).

Engine 1 computes a prompt and saves it; engine 2 (empty caches, empty local prefix cache) takes it from the
pool: vLLM holds the request while its loads run (``WAITING_FOR_REMOTE_KVS``), the connector reports them,
and the request then computes only what follows the loaded blocks; every position of every group's kept blocks
holds exactly its tokens' K and V. With the window group's block 3 gone from the pool, engine 3's hit ends at
block 3 (never a hit in one group beside a miss in another)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole, supports_hma
from vllm.forward_context import set_forward_context
from vllm.v1.core.kv_cache_utils import get_kv_cache_configs
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.worker.utils import allocate_kv_cache

import kvpool
from vllm_objects import create_model_runner_output, create_request, create_scheduler

BS, H, D, WINDOW = 32, 2, 8, 64
LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(4)]
FULL, SWA = LAYERS[0::2], LAYERS[1::2]
PROMPT = [(i * 37 + 11) % 250 + 3 for i in range(4 * BS + 5)]  # 4 full blocks and 5 tokens


def value(token: int, pos: int, layer: int) -> torch.Tensor:
    """K then V of every head of ``token`` at ``pos`` in ``layer``: ``[H, 2D]``."""
    base = float(token) * 1000.0 + float(pos) + layer * 0.25
    k = torch.full((H, D), base) + torch.arange(D, dtype=torch.float32) / 1024.0
    return torch.cat([k, k + 0.125], dim=1)


class HybridEngine:
    """vLLM's scheduler and the worker connector over the hybrid model's caches (see the module docstring)."""

    def __init__(self, make_vllm_config: Any, model_dir: Any, extra: dict) -> None:
        vc = make_vllm_config(model_dir, extra={**extra, "device_edge": "cpu"}, block_size=BS)
        vc.scheduler_config.disable_hybrid_kv_cache_manager = False
        vc.cache_config.kv_cache_layout = KVCacheLayout.LBNHC.name
        full = FullAttentionSpec(block_size=BS, num_kv_heads=H, head_size=D, dtype=torch.float32)
        swa = SlidingWindowSpec(block_size=BS, num_kv_heads=H, head_size=D, dtype=torch.float32,
                                sliding_window=WINDOW)
        specs = {name: (full if name in FULL else swa) for name in LAYERS}
        (cfg,) = get_kv_cache_configs(vc, [specs], [64 * full.page_size_bytes * len(LAYERS)])
        cfg.kv_cache_layout = KVCacheLayout.LBNHC.name
        assert len(cfg.kv_cache_groups) == 2, cfg.kv_cache_groups
        self.group_of = {n: gi for gi, g in enumerate(cfg.kv_cache_groups) for n in g.layer_names}
        self.config, self.kv_cache_config = vc, cfg
        self.scheduler = create_scheduler(vc, kv_cache_config=cfg)
        self.worker = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, cfg)
        self.caches = allocate_kv_cache(cfg, torch.device("cpu"), KVCacheLayout.LBNHC, [BS, BS])
        self.worker.register_kv_caches(self.caches)
        self.requests: dict[str, Any] = {}
        self.computed: dict[str, set[int]] = {}  # positions each request's forward passes computed
        self.tables: dict[str, tuple] = {}

    def add(self, tokens: list[int], max_tokens: int = 2) -> Any:
        r = create_request(tokens, max_tokens=max_tokens, block_size=BS)
        self.requests[r.request_id] = r
        self.scheduler.add_request(r)
        return r

    def table(self, rid: str) -> tuple:
        if rid in self.scheduler.requests:
            t = tuple(list(g) for g in self.scheduler.kv_cache_manager.get_block_ids(rid))
            if any(t):
                self.tables[rid] = t
        return self.tables[rid]

    def step(self) -> SchedulerOutput:
        so = self.scheduler.schedule()
        w = self.worker
        w.bind_connector_metadata(so.kv_connector_metadata)
        w.handle_preemptions(so.kv_connector_metadata)
        with set_forward_context(None, self.config):
            if so.has_sync_kv_loads:
                w.start_load_kv(None)
            self._forward(so)
            if not so.has_sync_kv_loads:
                w.start_load_kv(None)
        w.wait_for_save()
        results = w.get_transfer_results(so.finished_req_ids)
        kv_out = KVConnectorOutput(finished_sending=results.finished_sending or None,
                                   finished_recving=results.finished_recving or None,
                                   failed_recving=results.failed_recving, invalid_block_ids=set())
        w.clear_connector_metadata()
        reqs = [self.requests[r] for r in so.num_scheduled_tokens]
        mro = create_model_runner_output(reqs, kv_connector_output=kv_out)
        mro.sampled_token_ids = [[] if r.num_computed_tokens < r.num_tokens else [7] for r in reqs]
        self.scheduler.update_from_output(so, mro)
        return so

    def run(self, timeout: float = 120.0) -> None:
        """Steps until no request is left. A step that schedules nothing (a request waiting for its loads)
        yields for a moment, as an idle engine loop would, instead of spinning."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.scheduler.has_requests() and not self.scheduler.finished_req_ids:
                return
            if self.step().total_num_scheduled_tokens == 0:
                time.sleep(0.005)
        raise AssertionError(f"requests left after {timeout} s: {list(self.scheduler.requests)}")

    def _forward(self, so: SchedulerOutput) -> None:
        starts = {nr.req_id: nr.num_computed_tokens for nr in so.scheduled_new_reqs}
        cached = so.scheduled_cached_reqs
        starts.update(zip(cached.req_ids, cached.num_computed_tokens))
        work = []
        for rid, n in so.num_scheduled_tokens.items():
            positions = range(starts[rid], starts[rid] + n)
            self.computed.setdefault(rid, set()).update(positions)
            work.append((self.requests[rid].all_token_ids, positions, self.table(rid)))
        for li, name in enumerate(LAYERS):
            self.worker.wait_for_layer_load(name)
            cache = self.caches[name]  # [B, H, N, C]
            for tokens, positions, tables in work:
                table = tables[self.group_of[name]]
                for p in positions:
                    cache[table[p // BS], :, p % BS, :] = value(tokens[p], p, li)
            self.worker.save_kv_layer(name, cache, None)

    def wrong(self, rid: str, upto: int) -> list[tuple[str, int]]:
        """(layer, position) below ``upto`` whose K|V in a kept block is not what the tokens give."""
        tables, tokens, bad = self.table(rid), self.requests[rid].all_token_ids, []
        for li, name in enumerate(LAYERS):
            table = tables[self.group_of[name]]
            for p in range(upto):
                block = table[p // BS]
                if block == 0:  # the null block: the window no longer sees it
                    continue
                if not torch.equal(self.caches[name][block, :, p % BS, :], value(tokens[p], p, li)):
                    bad.append((name, p))
        return bad

    def shutdown(self) -> None:
        self.worker.shutdown()
        self.scheduler.connector.shutdown()


@pytest.fixture
def engines(make_vllm_config: Any, tiny_llama_dir: Any, kvpool_extra: dict) -> Any:
    made: list[HybridEngine] = []

    def make() -> HybridEngine:
        e = HybridEngine(make_vllm_config, tiny_llama_dir, kvpool_extra)
        made.append(e)
        return e
    yield make
    for e in made:
        e.shutdown()


def test_a_hybrid_model_shares_its_groups_through_the_pool_under_vllms_scheduler(engines: Any,
                                                                                 kvpool_pool: Any) -> None:
    e1 = engines()
    assert supports_hma(e1.scheduler.connector) and e1.scheduler.connector.hybrid is not None
    a = e1.add(PROMPT)
    e1.run()
    assert e1.wrong(a.request_id, len(PROMPT)) == []
    stats = e1.worker.connector.stats()
    assert stats.saved_blocks >= 4 + 2  # 4 full-attention blocks, and the window's kept blocks

    e2 = engines()
    b = e2.add(PROMPT)
    e2.run()
    s2 = e2.worker.connector.stats()
    assert s2.loaded_blocks >= 4 + 2 and s2.failed_loads == 0
    assert min(e2.computed[b.request_id]) == 4 * BS  # the 4 blocks came from the pool: only the rest computed
    assert e2.wrong(b.request_id, len(PROMPT)) == []

    # the window's block 3 gone: the full-attention group still has 4 blocks, but a hit ends where the window's
    # blocks before it are all there (block 3), never at 4 beside a miss
    with kvpool.Client(kvpool_pool.master) as c:
        sched = e1.scheduler.connector
        hashes = sched.connector.planner.hashes(sched._view(a))
        from kvpool.connector.groups import group_keys
        swa_keys = group_keys(sched.connector.keys, 1, "swa")
        assert c.remove(swa_keys.key(hashes[3]))
    e3 = engines()
    r = e3.add(PROMPT)
    e3.run()
    assert min(e3.computed[r.request_id]) == 3 * BS and e3.worker.connector.stats().failed_loads == 0
    assert e3.wrong(r.request_id, len(PROMPT)) == []
