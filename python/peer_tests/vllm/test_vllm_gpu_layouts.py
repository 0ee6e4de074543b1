"""kvpool.vllm on the KV caches vLLM's GPU attention backends get, built on CPU by vLLM's own code: for every
``KVCacheLayout`` vLLM 0.32 has, and dense (f16, bf16), fp8 and MLA specs, vLLM's ``get_kv_cache_configs``
places the layers and ``allocate_kv_cache`` makes the ``[B, H, N, C]`` views; the worker connector reads them
through the ``KVCacheConfig`` (``device_edge: cpu``, the device edge's CPU implementation), saves blocks to
the pool and loads them back, byte for byte against the canonical block taken from the views the way the
backends read them (FlashAttention's ``kv_cache.transpose(1, 2).split(head_size, dim=-1)``; MLA's one latent
vector per token). A block saved from a GPU layout also loads into vLLM's CPU backend caches (its own layout
and kernels' K packing) with the same K and V, and back."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.core.kv_cache_utils import get_kv_cache_configs
from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.worker.utils import allocate_kv_cache

import kvpool
from kvpool.buffers import as_memoryview
from kvpool.vllm import KvPoolConnector
from vllm_objects import layer_names

BLOCK = 32
BLOCKS = 20


def specs() -> dict[str, Any]:
    return {
        "dense-f16": FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=16, dtype=torch.float16),
        "dense-bf16": FullAttentionSpec(block_size=BLOCK, num_kv_heads=4, head_size=8, dtype=torch.bfloat16),
        "fp8": FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=16, dtype=torch.uint8),
        "mla": MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=40, dtype=torch.bfloat16),
    }


KV_DTYPE = {"dense-f16": "f16", "dense-bf16": "bf16", "fp8": "fp8_e4m3", "mla": "bf16"}


def build(make_vllm_config: Any, tiny_llama_dir: Any, extra: dict, spec: Any, layout: KVCacheLayout,
          kv_dtype: str) -> tuple[KvPoolConnector, dict[str, Any], Any]:
    """A worker connector over caches vLLM allocates for ``spec`` in ``layout``."""
    vc = make_vllm_config(tiny_llama_dir, extra={**extra, "device_edge": "cpu", "kv_dtype": kv_dtype},
                          block_size=BLOCK)
    vc.cache_config.kv_cache_layout = layout.name
    layers = {name: spec for name in layer_names()}
    (cfg,) = get_kv_cache_configs(vc, [layers], [BLOCKS * spec.page_size_bytes * len(layers)])
    cfg.kv_cache_layout = layout.name
    caches = allocate_kv_cache(cfg, torch.device("cpu"), layout, [BLOCK])
    g = torch.Generator().manual_seed(hash(layout.name) & 0xFFFF)
    for t in caches.values():
        b = t.view(torch.uint8)
        b.copy_(torch.randint(0, 256, tuple(b.shape), generator=g, dtype=torch.uint8))
    worker = KvPoolConnector(vc, KVConnectorRole.WORKER, cfg)
    worker.register_kv_caches(caches)
    return worker, caches, cfg


def raw(t: Any) -> Any:
    """A tensor's bytes (random bytes hold NaNs, which never compare equal as floats)."""
    return t.contiguous().view(torch.uint8)


def canonical(caches: dict[str, Any], block: int, spec: Any) -> bytes:
    """A block as the pool stores it, from the views as the backends read them."""
    out = []
    for name in layer_names():
        t = caches[name]
        if isinstance(spec, MLAAttentionSpec):
            latent = t[block].transpose(0, 1)  # (N, 1, C): one latent vector per token
            out.append(latent.contiguous().view(torch.uint8).numpy().tobytes())
        else:
            k, v = t[block].transpose(0, 1).split(spec.head_size, dim=-1)  # FlashAttention's split
            out.append(k.contiguous().view(torch.uint8).numpy().tobytes())
            out.append(v.contiguous().view(torch.uint8).numpy().tobytes())
    return b"".join(out)


@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=[lay.name for lay in KVCacheLayout])
@pytest.mark.parametrize("kind", sorted(specs()))
def test_every_gpu_layout_and_spec_saves_canonical_blocks_and_loads_them_back(
        kvpool_pool: Any, kvpool_extra: dict, make_vllm_config: Any, tiny_llama_dir: Any, layout: KVCacheLayout,
        kind: str) -> None:
    spec = specs()[kind]
    worker, caches, cfg = build(make_vllm_config, tiny_llama_dir, kvpool_extra, spec, layout, KV_DTYPE[kind])
    try:
        kv = worker.kv
        assert type(kv).__name__ == "DeviceKv" and kv.num_blocks == cfg.num_blocks
        # vLLM really laid the views out in this layout: their physical axis order is the layout's
        t = caches[layer_names()[0]]
        dims = [d for d in layout.layer_view_order if t.shape[d] > 1]
        assert sorted(dims, key=lambda d: -t.stride(d)) == dims, (layout.name, t.stride())
        assert kv.block_bytes == len(layer_names()) * spec.page_size_bytes
        blocks = [7, 2, 11]
        want = [canonical(caches, b, spec) for b in blocks]
        assert [bytes(as_memoryview(s)) for s in kv.save_sources(blocks)] == want

        # through the pool: put the blocks, read them into other blocks of the same cache
        with kvpool.Client(kvpool_pool.master) as c:
            keys = [f"gpu-layout/{layout.name}/{kind}/{b}" for b in blocks]
            assert all(s.name == "OK" for s in c.put_batch(keys, kv.save_sources(blocks)))
            targets, commit = kv.load_targets([0, 1, 3])
            got = c.get_into_batch(keys, targets)
            assert got == [kv.block_bytes] * 3
            commit([True, True, True])
        for dst, src in ((0, 7), (1, 2), (3, 11)):
            assert canonical(caches, dst, spec) == canonical(caches, src, spec)
    finally:
        worker.shutdown()


def test_a_block_from_a_gpu_layout_loads_into_vllms_cpu_backend_and_back(
        kvpool_pool: Any, kvpool_extra: dict, make_vllm_config: Any, make_kv_cache_config: Any,
        tiny_llama_dir: Any) -> None:
    """The same model (the tiny Llama's f32 attention) in a GPU layout (BLNHC) and in vLLM's CPU backend's own
    layout: a block saved from one is the other's block with the same K and V, both ways."""
    import tiny_llama
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=tiny_llama.KV_HEADS, head_size=tiny_llama.HEAD_DIM,
                             dtype=torch.float32)
    gpu, gpu_caches, _ = build(make_vllm_config, tiny_llama_dir, kvpool_extra, spec, KVCacheLayout.BLNHC, "f32")
    vc = make_vllm_config(tiny_llama_dir, extra=kvpool_extra, block_size=BLOCK)
    cpu_cfg = make_kv_cache_config(vc, BLOCKS)
    cpu_caches = allocate_kv_cache(cpu_cfg, torch.device("cpu"), vc.cache_config.get_resolved_kv_cache_layout(),
                                   [BLOCK])
    cpu = KvPoolConnector(vc, KVConnectorRole.WORKER, cpu_cfg)
    cpu.register_kv_caches(cpu_caches)
    try:
        assert type(cpu.kv).__name__ == "LayeredPagedKv"
        with kvpool.Client(kvpool_pool.master) as c:
            for src, dst, names in ((gpu.kv, cpu.kv, ("gpu", 5, 9)), (cpu.kv, gpu.kv, ("cpu", 9, 1))):
                tag, from_block, to_block = names
                key = f"gpu-cpu/{tag}"
                assert c.put(key, src.save_sources([from_block])[0]) == kvpool.PutStatus.OK
                targets, commit = dst.load_targets([to_block])
                assert c.get_into_batch([key], targets) == [dst.block_bytes]
                commit([True])
        # K and V of every token and head as each backend reads them
        for name in layer_names():
            k, v = gpu_caches[name][1].transpose(0, 1).split(tiny_llama.HEAD_DIM, dim=-1)
            k5, v5 = gpu_caches[name][5].transpose(0, 1).split(tiny_llama.HEAD_DIM, dim=-1)
            ck, cv = cpu._caches.split_kv(cpu_caches[name])  # (B, N, H, D) each, as the CPU kernels read them
            assert torch.equal(raw(ck[9]), raw(k5)) and torch.equal(raw(cv[9]), raw(v5))
            assert torch.equal(raw(k), raw(k5)) and torch.equal(raw(v), raw(v5))
    finally:
        gpu.shutdown()
        cpu.shutdown()
