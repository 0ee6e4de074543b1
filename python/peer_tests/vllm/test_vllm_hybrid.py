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

from typing import Any

import pytest
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import supports_hma
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

import kvpool

BS, H, D, WINDOW = 32, 2, 8, 64
LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(4)]
FULL, SWA = LAYERS[0::2], LAYERS[1::2]
PROMPT = [(i * 37 + 11) % 250 + 3 for i in range(4 * BS + 5)]  # 4 full blocks and 5 tokens


@pytest.fixture
def engines(hybrid_engines: Any) -> Any:
    def make() -> Any:
        full = FullAttentionSpec(block_size=BS, num_kv_heads=H, head_size=D, dtype=torch.float32)
        swa = SlidingWindowSpec(block_size=BS, num_kv_heads=H, head_size=D, dtype=torch.float32,
                                sliding_window=WINDOW)
        return hybrid_engines({name: (full if name in FULL else swa) for name in LAYERS}, BS)
    return make


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
