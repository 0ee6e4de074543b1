"""kvpool.vllm with several KV cache groups (a hybrid model: full attention beside sliding-window attention),
on GPU-layout caches through the device edge's CPU implementation, against a real pool. vLLM's objects are
the shapes vLLM 0.32 hands a ``SupportsHMA`` connector (per-group block tables, the null block 0, a
``KVCacheConfig`` of two groups); the peer suite runs the same under vLLM's real scheduler.

What must hold: each group's blocks are saved under keys of their own (null blocks never); a lookup offers a
hit only where every group holds what it needs (all blocks of full attention, the window's blocks of the
sliding window, the state at the hit's end of Mamba / linear attention), so a hit in one group never pairs with
a miss in another; loads run across steps and are
reported per request (received, or failed: vLLM then recomputes); the bytes land in each group's blocks."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import kvpool
from conftest import wait_until

torch = pytest.importorskip("torch")

from kvpool.vllm import KVConnectorRole, KvPoolConnector  # noqa: E402

BS, H, D, BLOCKS = 16, 2, 8, 40
FULL = ["model.layers.0.attn", "model.layers.2.attn"]
SWA = ["model.layers.1.attn", "model.layers.3.attn"]
WINDOW = 2 * BS  # the sliding window: cdiv(31, 16) + 1 = 3 blocks before a hit's end


def spec(window: Any = None) -> Any:
    s = SimpleNamespace(block_size=BS, num_kv_heads=H, head_size=D, head_size_v=D, num_heads=H, num_states=BS,
                        state_content_bytes=None, state_content_size_bytes=2 * D * 4, sliding_window=window)
    return s


class SlidingWindowSpec(SimpleNamespace):
    """Named as vLLM's spec class is (the connector reads the kind from the class name)."""


def kv_cache_config() -> Any:
    swa = SlidingWindowSpec(**vars(spec(WINDOW)))
    return SimpleNamespace(num_blocks=BLOCKS, kv_cache_layout="BLNHC", kv_cache_groups=[
        SimpleNamespace(layer_names=FULL, kv_cache_spec=spec(), enable_kv_transfer=True),
        SimpleNamespace(layer_names=SWA, kv_cache_spec=swa, enable_kv_transfer=True)])


def caches(hnd: bool = False) -> dict[str, Any]:
    """Per-layer [B, H, N, C] f32 views, random: LBNHC (a GPU backend's), or LBHNC (``hnd``: vLLM's CPU
    backend's)."""
    g = torch.Generator().manual_seed(1)
    out = {}
    for name in FULL + SWA:
        if hnd:
            out[name] = torch.randn((BLOCKS, H, BS, 2 * D), generator=g)
        else:
            out[name] = torch.randn((BLOCKS, BS, H, 2 * D), generator=g).permute(0, 2, 1, 3)
    return out


def vllm_config(pool: Any, tmp_path: Path, edge: Any = "cpu") -> Any:
    extra = {"master": pool.master, "hash_seed": "0", "model": "hybrid-test", "fence_path": str(tmp_path / "fence"),
             "wait_for_save": True}
    if edge is not None:
        extra["device_edge"] = edge
    else:  # vLLM's CPU backend: its HND views, K packed for its vec kernel
        extra.update(kv_layout="HND", kv_cpu_isa="vec")
    return SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector_extra_config=extra),
        cache_config=SimpleNamespace(block_size=BS, cache_dtype="auto"),
        model_config=SimpleNamespace(model="hybrid-test", dtype="float32"),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1))


PROMPT = list(range(1, 5 * BS + 2))  # 5 full blocks and one token


def request(rid: str) -> Any:
    return SimpleNamespace(request_id=rid, all_token_ids=PROMPT, num_tokens=len(PROMPT), prompt_token_ids=PROMPT,
                           cache_salt=None, lora_request=None, mm_features=[], prompt_embeds=None)


def step_output(rid: str, tables: tuple, computed: int, scheduled: int) -> Any:
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=rid, block_ids=tables, num_computed_tokens=computed)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], resumed_req_ids=set(), new_block_ids=[],
                                              num_computed_tokens=[]),
        num_scheduled_tokens={rid: scheduled})


def run_step(worker: Any, meta: Any, layers: dict[str, Any]) -> None:
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(None)
    for name in sorted(layers, key=lambda n: int(n.split(".")[2])):
        worker.wait_for_layer_load(name)
        worker.save_kv_layer(name, layers[name], None)
    worker.wait_for_save()
    worker.clear_connector_metadata()


def raw(t: Any) -> Any:
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("edge", ["cpu", None], ids=["gpu-layout", "cpu-backend"])
def test_a_hybrid_model_saves_each_group_and_loads_only_whole_hits(pool: Any, client: kvpool.Client,
                                                                   tmp_path: Path, edge: Any) -> None:
    cfg = vllm_config(pool, tmp_path, edge)
    sched = KvPoolConnector(cfg, KVConnectorRole.SCHEDULER, kv_cache_config())
    worker = KvPoolConnector(cfg, KVConnectorRole.WORKER, kv_cache_config())
    layers = caches(hnd=edge is None)
    try:
        assert sched.hybrid is not None and [r.kind for r in sched.hybrid.rules] == ["full", "swa"]
        assert sched.hybrid.rules[1].window_blocks == 3
        worker.register_kv_caches(layers)
        assert type(worker.kv).__name__ == "GroupedKv"
        inner = {type(kv).__name__ for kv in worker.kv.groups.values()}
        assert inner == ({"DeviceKv"} if edge else {"LayeredPagedKv"})

        # 1. request a computes its prompt: full attention in blocks 1..6, the window group in 11..16 but for
        #    two null blocks (0) where the engine keeps nothing
        a = request("a")
        assert sched.get_num_new_matched_tokens(a, 0) == (0, False)
        full_a, swa_a = [1, 2, 3, 4, 5, 6], [0, 0, 13, 14, 15, 16]
        sched.update_state_after_alloc(a, (full_a, swa_a), 0)
        meta = sched.build_connector_meta(step_output("a", (full_a, swa_a), 0, len(PROMPT)))
        saves = meta.meta.saves
        assert sorted(s.block_index for s in saves if "/g1-swa/" not in s.key) == [0, 1, 2, 3, 4]
        assert sorted(s.block_index for s in saves if "/g1-swa/" in s.key) == [2, 3, 4]  # no null block saved
        run_step(worker, meta, layers)
        keys = [s.key for s in saves]
        assert all(client.batch_exists(keys))

        # 2. request b, the same prompt: a hit of all 5 blocks, loaded across steps, each group's blocks in place
        b = request("b")
        assert sched.get_num_new_matched_tokens(b, 0) == (5 * BS, True)
        full_b, swa_b = [21, 22, 23, 24, 25, 26], [0, 0, 32, 33, 34, 35]
        sched.update_state_after_alloc(b, (full_b, swa_b), 5 * BS)
        meta = sched.build_connector_meta(step_output("x", ([], []), 0, 0))  # b waits for its KV: not scheduled
        assert len(meta.meta.loads) == 5 + 3
        run_step(worker, meta, layers)
        got: set = set()
        wait_until(lambda: got.update(worker.get_transfer_results(set()).finished_recving) or "b" in got,
                   "b's loads reported")
        for name in FULL:
            for src, dst in zip(full_a[:5], full_b[:5]):
                assert torch.equal(raw(layers[name][dst]), raw(layers[name][src]))
        for name in SWA:
            for src, dst in zip(swa_a[2:5], swa_b[2:5]):
                assert torch.equal(raw(layers[name][dst]), raw(layers[name][src]))

        # 3. a window block gone: the full-attention blocks are all there, but no hit pairs them with a miss
        gone = next(s.key for s in saves if "/g1-swa/" in s.key and s.block_index == 3)
        assert client.remove(gone)
        m = sched.get_num_new_matched_tokens(request("c"), 0)
        assert m == (0, False)  # no hit end has all of the window's blocks before it: 2 and 4 are, 3 is not
        sched.update_state_after_alloc(request("c"), ([], []), 0)

        # 4. a block gone between the lookup and the load: the request is reported failed (vLLM recomputes it)
        d = request("d")
        client.put(gone, b"x" * worker.kv.groups[1].block_bytes)
        assert sched.get_num_new_matched_tokens(d, 0) == (5 * BS, True)
        sched.update_state_after_alloc(d, ([31, 32, 33, 34, 35, 36], [0, 0, 37, 38, 39, 30]), 5 * BS)
        meta = sched.build_connector_meta(step_output("x", ([], []), 0, 0))
        assert client.remove(keys[0])
        run_step(worker, meta, layers)
        failed: set = set()
        wait_until(lambda: failed.update(worker.get_transfer_results(set()).failed_recving) or "d" in failed,
                   "d reported failed")
        assert worker.get_block_ids_with_load_errors() == set()  # never per block with several groups
    finally:
        worker.shutdown()
        sched.shutdown()


MAMBA = ["model.layers.4.mixer", "model.layers.5.mixer"]
STATE_BYTES, PAGE = 4 * 8 * 4, 256  # a state of 128 bytes in a page padded to 256 (as vLLM pads to one page size)


class MambaSpec(SimpleNamespace):
    """vLLM's spec of Mamba / linear-attention state: its tensors' ``shapes`` and ``dtypes``."""


def mamba_spec(**over: Any) -> Any:
    fields = dict(block_size=BS, shapes=((4, 8),), dtypes=("f32",), mamba_cache_mode="align",
                  num_speculative_blocks=0, num_heads=1, num_states=1, state_content_size_bytes=STATE_BYTES)
    return MambaSpec(**{**fields, **over})


def with_mamba(cfg: Any, **over: Any) -> Any:
    cfg.kv_cache_groups.append(SimpleNamespace(layer_names=MAMBA, kv_cache_spec=mamba_spec(**over),
                                               enable_kv_transfer=True))
    return cfg


def state_views() -> dict[str, Any]:
    """Per Mamba layer the ``[B, 1, 1, C]`` byte view vLLM's ``create_kv_cache_views`` gives a state spec: the
    state's bytes at the start of each padded page."""
    g = torch.Generator().manual_seed(2)
    return {n: torch.randint(-128, 128, (BLOCKS, PAGE), dtype=torch.int8, generator=g)[:, :STATE_BYTES]
            .view(BLOCKS, 1, 1, STATE_BYTES) for n in MAMBA}


@pytest.mark.parametrize("edge", ["cpu", None], ids=["gpu-layout", "cpu-backend"])
def test_mamba_state_is_saved_where_vllm_keeps_it_and_a_hit_needs_the_state_at_its_end(
        pool: Any, client: kvpool.Client, tmp_path: Path, edge: Any) -> None:
    cfg = vllm_config(pool, tmp_path, edge)
    sched = KvPoolConnector(cfg, KVConnectorRole.SCHEDULER, with_mamba(kv_cache_config()))
    worker = KvPoolConnector(cfg, KVConnectorRole.WORKER, with_mamba(kv_cache_config()))
    layers = {**caches(hnd=edge is None), **state_views()}
    try:
        assert [(r.kind, r.window_blocks) for r in sched.hybrid.rules] == [("full", None), ("swa", 3), ("mamba", 1)]
        worker.register_kv_caches(layers)
        assert type(worker.kv.groups[2]).__name__ == "DeviceKv"  # state moves through the edge on either backend
        assert worker.kv.groups[2].block_bytes == len(MAMBA) * STATE_BYTES  # the page's padding never moves

        # 1. a computes its 81 tokens in one chunk: vLLM's align mode keeps the state at 81 in column 5 and the
        #    prefill checkpoint (the state at 80) in column 4; the columns before are null
        a = request("a")
        tables_a = ([1, 2, 3, 4, 5, 6], [0, 0, 13, 14, 15, 16], [0, 0, 0, 0, 24, 25])
        assert sched.get_num_new_matched_tokens(a, 0) == (0, False)
        sched.update_state_after_alloc(a, tables_a, 0)
        meta = sched.build_connector_meta(step_output("a", tables_a, 0, len(PROMPT)))
        states = [s for s in meta.meta.saves if "/g2-mamba/" in s.key]
        assert [(s.block_index, s.block_id >> 40, s.block_id & 0xFFFF) for s in states] == [(4, 2, 24)]
        run_step(worker, meta, layers)
        assert all(client.batch_exists([s.key for s in meta.meta.saves]))

        # 2. b: a hit of 5 blocks; its state table is nulls and the one block vLLM allocates for the state at 80
        b = request("b")
        assert sched.get_num_new_matched_tokens(b, 0) == (5 * BS, True)
        tables_b = ([21, 22, 23, 24, 25, 26], [0, 0, 32, 33, 34, 35], [0, 0, 0, 0, 36])
        sched.update_state_after_alloc(b, tables_b, 5 * BS)
        meta = sched.build_connector_meta(step_output("x", ([], [], []), 0, 0))
        assert len(meta.meta.loads) == 5 + 3 + 1
        run_step(worker, meta, layers)
        got: set = set()
        wait_until(lambda: got.update(worker.get_transfer_results(set()).finished_recving) or "b" in got,
                   "b's loads reported")
        for name in MAMBA:
            assert torch.equal(layers[name][36], layers[name][24])
        for name in FULL:
            assert torch.equal(raw(layers[name][25]), raw(layers[name][5]))

        # 3. the state gone: the attention groups hold every block, but without the state at a hit's end there
        #    is no hit (vLLM could not continue the recurrence from it)
        assert client.remove(states[0].key)
        assert sched.get_num_new_matched_tokens(request("c"), 0) == (0, False)
        sched.update_state_after_alloc(request("c"), ([], [], []), 0)
    finally:
        worker.shutdown()
        sched.shutdown()


def test_groups_kvpool_cannot_move_are_refused_naming_them(pool: Any, tmp_path: Path) -> None:
    cfg = vllm_config(pool, tmp_path)
    with pytest.raises(ValueError, match=r"KV cache group 2 .* Mamba / linear-attention state in cache mode 'none'"):
        KvPoolConnector(cfg, KVConnectorRole.SCHEDULER, with_mamba(kv_cache_config(), mamba_cache_mode="none"))
    with pytest.raises(ValueError, match=r"KV cache group 2 .* Mamba state with 1 speculative blocks"):
        KvPoolConnector(cfg, KVConnectorRole.SCHEDULER, with_mamba(kv_cache_config(), num_speculative_blocks=1))
    only_state = with_mamba(kv_cache_config())
    only_state.kv_cache_groups[:2] = []
    with pytest.raises(ValueError, match=r"keeps only Mamba / linear-attention state"):
        KvPoolConnector(cfg, KVConnectorRole.SCHEDULER, only_state)
    other = kv_cache_config()
    other.kv_cache_groups[1].kv_cache_spec.block_size = 2 * BS
    with pytest.raises(ValueError, match="holds 32 tokens a block; the engine's block size is 16"):
        KvPoolConnector(cfg, KVConnectorRole.SCHEDULER, other)
    cfg.kv_transfer_config.kv_connector_extra_config["layerwise"] = True
    with pytest.raises(ValueError, match="layerwise moves one KV cache group"):
        KvPoolConnector(cfg, KVConnectorRole.SCHEDULER, kv_cache_config())


def test_hit_end_against_a_reference_model() -> None:
    """``hit_end`` agrees with the rule spelled out naively (every candidate end, every group's needed blocks)
    on random presence patterns, for full-attention and sliding-window groups."""
    import random
    from kvpool.connector.groups import GroupRule, hit_end
    rng = random.Random(7)
    for _ in range(500):
        n = rng.randint(0, 12)
        start = rng.randint(0, n)
        rules = [GroupRule(0, "full")] + [GroupRule(i, "swa" if w else "full", w)
                                          for i, w in enumerate(rng.choice([[None], [2], [3, None], [1, 4]]), 1)]
        pres = {r.index: [rng.random() < 0.85 for _ in range(n)] for r in rules}

        def present(g: int, idx: Any) -> list[bool]:
            return [pres[g][b] for b in idx]
        want = start
        for e in range(n, start, -1):
            if all(all(pres[r.index][b] for b in r.needed(start, e)) for r in rules):
                want = e
                break
        assert hit_end(rules, start, n, present) == want, (n, start, rules, pres)
