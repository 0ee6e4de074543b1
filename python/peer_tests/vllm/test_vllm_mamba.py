"""kvpool.vllm on a Mamba hybrid (full attention on layers 0 and 2, Mamba / linear-attention state on layers 1
and 3) under vLLM's real scheduler in ``align`` cache mode, its ``MambaManager`` deciding which block of the
position-indexed state table holds which state, and the prefill checkpoint rule vLLM's backends follow
(``hybrid_engine``: everything but the forward pass is vLLM's).

Engine 1 computes a prompt of 4 blocks and 5 tokens in one chunk: vLLM keeps the state at 133 in column 4 and
exports the checkpoint (the state at 128) into column 3; kvpool saves the attention blocks and that state.
Engine 2 (empty caches) takes 128 tokens from the pool, vLLM carrying the recurrence on from the loaded state:
its final state matches the one computed from nothing only if the loaded state was right. With the state gone
from the pool, engine 3 gets no hit at all, although the attention blocks are all there: a hit in one group
never pairs with a miss in another."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

import kvpool

BS, H, D = 32, 2, 8
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.mixer", "model.layers.2.self_attn.attn",
          "model.layers.3.mixer"]
PROMPT = [(i * 53 + 5) % 250 + 3 for i in range(4 * BS + 5)]  # 4 full blocks and 5 tokens


@pytest.fixture
def engines(hybrid_engines: Any) -> Any:
    def make() -> Any:
        full = FullAttentionSpec(block_size=BS, num_kv_heads=H, head_size=D, dtype=torch.float32)
        # a conv state and an SSM state, padded to the attention page (vLLM unifies the page sizes)
        state = MambaSpec(block_size=BS, shapes=((3, 16), (2, 8, 8)), dtypes=(torch.float32, torch.float32),
                          page_size_padded=full.page_size_bytes, mamba_cache_mode="align",
                          num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=BS)
        return hybrid_engines({n: (state if "mixer" in n else full) for n in LAYERS}, BS, mamba_cache_mode="align")
    return make


def test_mamba_state_goes_through_the_pool_and_the_recurrence_goes_on_from_it(engines: Any,
                                                                              kvpool_pool: Any) -> None:
    e1 = engines()
    rules = e1.scheduler.connector.hybrid.rules
    assert [(r.kind, r.window_blocks) for r in rules] == [("full", None), ("mamba", 1)]
    a = e1.add(PROMPT)
    e1.run()
    assert e1.wrong(a.request_id, len(PROMPT)) == [] and e1.wrong_state(a.request_id) == []
    s1 = e1.worker.connector.stats()
    assert s1.saved_blocks >= 4 + 1  # 4 attention blocks, and the checkpoint state at 128

    e2 = engines()
    b = e2.add(PROMPT)
    e2.run()
    s2 = e2.worker.connector.stats()
    assert s2.loaded_blocks == 4 + 1 and s2.failed_loads == 0
    assert min(e2.computed[b.request_id]) == 4 * BS  # 128 tokens came from the pool: only the rest computed
    assert e2.wrong(b.request_id, len(PROMPT)) == []
    assert e2.wrong_state(b.request_id) == []  # the recurrence went on from the loaded state

    with kvpool.Client(kvpool_pool.master) as c:
        sched = e1.scheduler.connector
        hashes = sched.connector.planner.hashes(sched._view(a))
        from kvpool.connector.groups import group_keys
        assert c.remove(group_keys(sched.connector.keys, 1, "mamba").key(hashes[3]))
    e3 = engines()
    r = e3.add(PROMPT)
    e3.run()
    assert min(e3.computed[r.request_id]) == 0 and e3.worker.connector.stats().loaded_blocks == 0
    assert e3.wrong_state(r.request_id) == []
