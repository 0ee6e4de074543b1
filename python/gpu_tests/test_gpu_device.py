"""kvpool's device edge on a GPU (``scripts/gpu-check.sh``): every KVCacheLayout of vLLM 0.32 and every page
kind (dense f16/bf16, fp8 bytes, MLA latents, Mamba state) on CUDA tensors, saved to the pool and loaded back on both paths
(shared memory and TCP), byte for byte against the canonical block; saves ordered after the engine's stream
(events), layer by layer; and kvpool.mooncake on device addresses."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import kvpool
from kvpool.buffers import as_memoryview
from kvpool.connector import BlockHasher, ConnectorRequest, KeyFormat, PoolConnector, ScheduledRequest
from kvpool.device import DeviceKv, PageFormat

LAYOUTS = {"LBHNC": (0, 1, 2, 3, 4), "LBNHC": (0, 1, 3, 2, 4), "LHBNC": (0, 2, 1, 3, 4),
           "BLHNC": (1, 0, 2, 3, 4), "BLNHC": (1, 0, 3, 2, 4), "BHLNC": (1, 2, 0, 3, 4)}
KINDS = {"dense-f16": (8, 2 * 64, torch.float16, 64), "dense-bf16": (4, 2 * 128, torch.bfloat16, 128),
         "fp8": (8, 2 * 64, torch.uint8, 64), "mla": (1, 576, torch.bfloat16, None)}


def allocate(device: str, layout: str, layers: int, blocks: int, heads: int, tokens: int, content: int,
             dtype: Any) -> list[Any]:
    shape = (layers, blocks, heads, tokens, content)
    strides = [0] * 5
    step = 1
    for dim in reversed(LAYOUTS[layout]):
        strides[dim] = step
        step *= shape[dim]
    raw = torch.empty(step * torch.tensor([], dtype=dtype).element_size(), dtype=torch.uint8, device=device)
    raw.random_(0, 256)
    view = torch.as_strided(raw.view(dtype), shape, strides)
    return [view[i] for i in range(layers)]


def canonical(layers: list[Any], block: int, k: int | None) -> bytes:
    out = []
    for t in layers:
        cells = t[block].transpose(0, 1)  # (N, H, C)
        planes = [cells] if k is None else list(cells.split([k, cells.shape[-1] - k], dim=-1))
        out += [p.contiguous().view(torch.uint8).cpu().numpy().tobytes() for p in planes]
    return b"".join(out)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_layouts_round_trip_through_the_pool(client: kvpool.Client, edge: Any, device: str, layout: str,
                                             kind: str) -> None:
    heads, content, dtype, k = KINDS[kind]
    item = torch.tensor([], dtype=dtype).element_size()
    fmt = PageFormat(heads, 16, content * item, None if k is None else k * item)
    layers = allocate(device, layout, 4, 10, heads, 16, content, dtype)
    kv = DeviceKv(layers, fmt, 16, edge, "x")
    blocks = [9, 0, 4]
    sources = kv.save_sources(blocks)
    assert [bytes(as_memoryview(s)) for s in sources] == [canonical(layers, b, k) for b in blocks]
    keys = [f"gpu/{layout}/{kind}/{b}" for b in blocks]
    assert all(s.name == "OK" for s in client.put_batch(keys, sources))
    targets, commit = kv.load_targets([1, 2, 3])
    assert client.get_into_batch(keys, targets) == [kv.block_bytes] * 3
    commit([True] * 3)
    for dst, src in ((1, 9), (2, 0), (3, 4)):
        assert canonical(layers, dst, k) == canonical(layers, src, k)


def test_mamba_state_pages_round_trip_through_the_pool(client: kvpool.Client, edge: Any, device: str) -> None:
    """A Mamba layer's page as vLLM views a ``MambaSpec``: ``[B, 1, 1, C]`` bytes at the start of a padded page."""
    layers, blocks, state, page = 3, 8, 2 * 1024 + 40, 4096
    mem = torch.empty(layers * blocks * page, dtype=torch.uint8, device=device)
    mem.random_(0, 256)
    views = [torch.as_strided(mem, (blocks, 1, 1, state), (page, state, state, 1), l * blocks * page)
             for l in range(layers)]
    kv = DeviceKv(views, PageFormat(1, 1, state), 16, edge, "x")
    want = [b"".join(t[b].reshape(-1).cpu().numpy().tobytes() for t in views) for b in (6, 2)]
    keys = ["gpu/mamba/6", "gpu/mamba/2"]
    assert all(s.name == "OK" for s in client.put_batch(keys, kv.save_sources([6, 2])))
    targets, commit = kv.load_targets([0, 1])
    assert client.get_into_batch(keys, targets) == [kv.block_bytes] * 2
    commit([True, True])
    assert [b"".join(t[b].reshape(-1).cpu().numpy().tobytes() for t in views) for b in (0, 1)] == want


def test_a_save_waits_for_the_engines_stream_not_the_cpu(edge: Any, device: str) -> None:
    """The engine's stream writes a block after a long kernel; the save is staged right after (the CPU never
    waited): it holds what the kernel wrote, because the side stream waits for the engine's event."""
    layers = allocate(device, "LBNHC", 2, 4, 8, 16, 2 * 64, torch.float16)
    kv = DeviceKv(layers, PageFormat(8, 16, 256, 128), 16, edge, "f16")
    if device == "cuda":
        big = torch.randn(4096, 4096, device=device)
        for _ in range(8):
            big = big @ big  # keeps the engine's stream busy
            big = big / big.norm()
    for t in layers:
        t[2].fill_(1.5)  # queued on the engine's stream after the matmuls
    staged = kv.stage_save([2])
    got = torch.frombuffer(bytearray(as_memoryview(staged.sources()[0])), dtype=torch.float16)
    assert torch.equal(got, torch.full((got.numel(),), 1.5, dtype=torch.float16))


def test_layer_by_layer_saves_and_loads(client: kvpool.Client, edge: Any, device: str) -> None:
    BS = 16
    layers = allocate(device, "BLNHC", 4, 8, 8, BS, 2 * 64, torch.bfloat16)
    fmt = PageFormat(8, BS, 2 * 64 * 2, 64 * 2)
    kv = DeviceKv(layers, fmt, BS, edge, "bf16")
    hasher, keys = BlockHasher(BS, "0"), KeyFormat("gpu-check", "v1", "bf16")
    r = ConnectorRequest("a", list(range(1, 2 * BS + 2)))
    with PoolConnector(client, hasher, keys, granularity="layer") as pc:
        pc.get_num_new_matched_tokens(r, 0)
        pc.update_state_after_alloc(r, [5, 6], 0)
        pc.start_load_kv(pc.build_connector_meta([ScheduledRequest(r, [5, 6], 0, 2 * BS)]), kv)
        for layer in range(4):
            pc.wait_for_layer_load(layer)
            pc.save_kv_layer(layer, kv)
        pc.wait_for_save()
        assert pc.saved_blocks == 2
    r2 = ConnectorRequest("b", list(range(1, 2 * BS + 2)))
    with PoolConnector(client, hasher, keys, granularity="layer") as pc:
        m = pc.get_num_new_matched_tokens(r2, 0)
        assert m.tokens == 2 * BS
        pc.update_state_after_alloc(r2, [0, 1, 2], m.tokens)
        pc.start_load_kv(pc.build_connector_meta([ScheduledRequest(r2, [0, 1, 2], m.tokens, m.tokens + 1)]), kv)
        for layer in range(4):
            pc.wait_for_layer_load(layer)
            assert torch.equal(layers[layer][0].view(torch.uint8), layers[layer][5].view(torch.uint8))
            assert torch.equal(layers[layer][1].view(torch.uint8), layers[layer][6].view(torch.uint8))
        assert not pc.block_ids_with_load_errors()


def test_mooncake_api_on_device_addresses(master: str, edge: Any, device: str) -> None:
    from kvpool.device.pointers import forget_edge, use_edge
    from kvpool.mooncake import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", master) == 0
    if device == "cpu":
        use_edge(edge)
        src, dst = edge.alloc(1 << 20), edge.alloc(1 << 20)
        src.random_(0, 256)
    else:
        src = torch.randint(0, 256, (1 << 20,), dtype=torch.uint8, device=device)
        dst = torch.zeros(1 << 20, dtype=torch.uint8, device=device)
    try:
        assert s.register_buffer(src.data_ptr(), src.numel()) == 0
        assert s.register_buffer(dst.data_ptr(), dst.numel()) == 0
        assert s.batch_put_from(["gpu/mc"], [src.data_ptr()], [src.numel()]) == [0]
        assert s.batch_get_into(["gpu/mc"], [dst.data_ptr()], [dst.numel()]) == [dst.numel()]
        assert torch.equal(src, dst)
    finally:
        s.remove_all()
        s.close()
        if device == "cpu":
            forget_edge(edge)
