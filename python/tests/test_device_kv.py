"""The device edge's block mover (``kvpool.device``) on the CPU edge: every physical layout a vLLM 0.32 GPU
backend may allocate (the six ``KVCacheLayout`` stride permutations of the logical ``[L, B, H, N, C]``
cache, modelled here from the permutation alone; the peer suite builds them with vLLM's own functions),
dense K/V, MLA latents and fp8 bytes, checked byte for byte against the canonical block computed from the
logical view, through a real pool, and against the reference engine's layout (``PagedKvCache``)."""

from __future__ import annotations

from typing import Any

import pytest

import kvpool

torch = pytest.importorskip("torch")

from kvpool.connector import BlockHasher, ConnectorRequest, KeyFormat, PagedKvCache, PoolConnector, ScheduledRequest  # noqa: E402
from kvpool.buffers import as_memoryview  # noqa: E402
from kvpool.device import CpuEdge, DeviceKv, PageFormat  # noqa: E402

#: vLLM's KVCacheLayout members: logical axes [L, B, H, N, C] in physical order (outermost first)
LAYOUTS = {"LBHNC": (0, 1, 2, 3, 4), "LBNHC": (0, 1, 3, 2, 4), "LHBNC": (0, 2, 1, 3, 4),
           "BLHNC": (1, 0, 2, 3, 4), "BLNHC": (1, 0, 3, 2, 4), "BHLNC": (1, 2, 0, 3, 4)}


def allocate(layout: str, layers: int, blocks: int, heads: int, tokens: int, content: int, dtype: Any) -> list[Any]:
    """Per-layer ``[B, H, N, C]`` views of one flat buffer laid out in ``layout`` (C in elements of dtype)."""
    shape = (layers, blocks, heads, tokens, content)
    order = LAYOUTS[layout]
    strides = [0] * 5
    step = 1
    for dim in reversed(order):
        strides[dim] = step
        step *= shape[dim]
    raw = torch.zeros(step, dtype=dtype)
    view = torch.as_strided(raw, shape, strides)
    return [view[i] for i in range(layers)]


def raw(source: Any) -> bytes:
    """A saved block's bytes (a ``DeviceBlock``, materialized in host memory)."""
    return bytes(as_memoryview(source))


def fill(layers: list[Any], seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for t in layers:
        b = t.view(torch.uint8)
        b.copy_(torch.randint(0, 256, tuple(b.shape), generator=g, dtype=torch.uint8))


def canonical(layers: list[Any], block: int, fmt: PageFormat) -> bytes:
    """The canonical bytes of ``block``, written out from the logical views element by element order."""
    out = bytearray()
    for t in layers:
        page = t.view(torch.uint8)[block]  # (H, N, C bytes)
        planes = [(0, fmt.content)] if fmt.k_bytes is None else [(0, fmt.k_bytes), (fmt.k_bytes, fmt.content)]
        for lo, hi in planes:
            for n in range(fmt.tokens):
                for h in range(fmt.heads):
                    out += bytes(page[h, n, lo:hi].tolist())
    return bytes(out)


CASES = [  # name, heads, content elements, dtype, k elements (None: one plane)
    ("dense-f16", 2, 2 * 8, torch.float16, 8),
    ("dense-f32", 3, 2 * 4, torch.float32, 4),
    ("mla-bf16", 1, 24, torch.bfloat16, None),
    ("fp8-bytes", 2, 2 * 16, torch.uint8, 16),
    ("odd-f16", 3, 2 * 3, torch.float16, 3),  # 6-byte K and V: moved as 2-byte words
    ("odd-fp8", 2, 2 * 5, torch.uint8, 5),  # 5-byte K and V: moved byte by byte
]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_layout_saves_the_canonical_block_and_loads_it_back(layout: str, case: tuple) -> None:
    _, heads, content, dtype, k = case
    item = torch.tensor([], dtype=dtype).element_size()
    fmt = PageFormat(heads, 4, content * item, None if k is None else k * item)
    src = allocate(layout, 3, 6, heads, 4, content, dtype)
    fill(src, 7)
    kv = DeviceKv(src, fmt, 4, CpuEdge(), "f16")
    blocks = [4, 0, 5]
    got = [raw(s) for s in kv.save_sources(blocks)]
    assert got == [canonical(src, b, fmt) for b in blocks]
    # layer by layer: each layer's range of the block
    lb = fmt.page_bytes
    for layer in range(3):
        part = [raw(s) for s in kv.layer_sources([5], layer)]
        assert part == [got[2][layer * lb:(layer + 1) * lb]]

    # loads into another cache of another layout: only the loaded blocks change
    other = "BLNHC" if layout != "BLNHC" else "LBHNC"
    dst = allocate(other, 3, 6, heads, 4, content, dtype)
    fill(dst, 8)
    before = [t.clone() for t in dst]
    kv2 = DeviceKv(dst, fmt, 4, CpuEdge(), "f16")
    targets, commit = kv2.load_targets([1, 3, 2])
    for t, g in zip(targets, got):
        t.copy_(torch.frombuffer(bytearray(g), dtype=torch.uint8))
    commit([True, False, True])  # the second read failed: block 3 is left as it was
    for t_dst, t_src, t_before in zip(dst, src, before):
        assert torch.equal(t_dst[1].view(torch.uint8), t_src[4].view(torch.uint8))
        assert torch.equal(t_dst[2].view(torch.uint8), t_src[5].view(torch.uint8))
        assert torch.equal(t_dst[3].view(torch.uint8), t_before[3].view(torch.uint8))
        assert torch.equal(t_dst[0].view(torch.uint8), t_before[0].view(torch.uint8))
    # one layer
    targets, commit = kv2.layer_targets([0], 1)
    as_memoryview(targets[0], writable=True)[:] = got[1][lb:2 * lb]
    commit([True])
    assert torch.equal(dst[1][0].view(torch.uint8), src[1][0].view(torch.uint8))
    assert torch.equal(dst[0][0].view(torch.uint8), before[0][0].view(torch.uint8))


@pytest.mark.parametrize("block_outermost", [False, True], ids=["layer-outermost", "block-outermost"])
def test_mamba_state_pages_move_their_state_bytes_and_leave_the_padding(block_outermost: bool) -> None:
    """A Mamba / linear-attention layer's page, as vLLM's ``create_kv_cache_views`` gives a ``MambaSpec``: one
    ``[B, 1, 1, C]`` byte view of the state's C bytes at the start of each padded page (pages of all layers of a
    block together when block-outermost). The pool gets each layer's C bytes; the padding never moves."""
    layers, blocks, state, page = 2, 5, 72, 128
    g = torch.Generator().manual_seed(3)
    raw_mem = torch.randint(-128, 128, (layers * blocks * page,), dtype=torch.int8, generator=g)
    def views(mem: Any) -> list[Any]:
        layer_stride, block_stride = (page, layers * page) if block_outermost else (blocks * page, page)
        return [torch.as_strided(mem, (blocks, 1, 1, state), (block_stride, state, state, 1), l * layer_stride)
                for l in range(layers)]
    src = views(raw_mem)
    kv = DeviceKv(src, PageFormat(1, 1, state), 16, CpuEdge(), "bf16")
    assert kv.block_bytes == layers * state
    got = [raw(s) for s in kv.save_sources([3, 1])]
    assert got == [b"".join(bytes(t[b].reshape(-1).view(torch.uint8).tolist()) for t in src) for b in (3, 1)]
    dst_mem = torch.zeros_like(raw_mem)
    kv2 = DeviceKv(views(dst_mem), PageFormat(1, 1, state), 16, CpuEdge(), "bf16")
    targets, commit = kv2.load_targets([0, 4])
    for t, gb in zip(targets, got):
        t.copy_(torch.frombuffer(bytearray(gb), dtype=torch.uint8))
    commit([True, True])
    assert [raw(s) for s in kv2.save_sources([0, 4])] == got
    assert int((dst_mem != 0).sum()) <= 2 * layers * state  # nothing but the states' bytes was written


def test_dense_blocks_are_the_reference_engines_layout() -> None:
    """A dense f32 block of a GPU layout is byte for byte the reference engine's block
    ``[layer][K/V][token][head][dim]`` (PagedKvCache) of the same values."""
    L, B, H, N, D = 2, 3, 2, 4, 8
    ref = PagedKvCache(B, L, N, H, D, backend="torch")
    g = torch.Generator().manual_seed(3)
    ref.data.copy_(torch.randn(ref.data.shape, generator=g))
    for layout in LAYOUTS:
        views = allocate(layout, L, B, H, N, 2 * D, torch.float32)
        for layer in range(L):
            for b in range(B):
                views[layer][b, :, :, :D].copy_(ref.data[b, layer, 0].transpose(0, 1))
                views[layer][b, :, :, D:].copy_(ref.data[b, layer, 1].transpose(0, 1))
        kv = DeviceKv(views, PageFormat(H, N, 2 * D * 4, D * 4), N, CpuEdge(), "f32")
        for b, s in zip(range(B), kv.save_sources(list(range(B)))):
            assert raw(s) == ref.block(b).numpy().tobytes(), layout


def test_shapes_that_disagree_with_the_spec_are_refused_naming_them() -> None:
    views = allocate("LBNHC", 2, 3, 2, 4, 16, torch.float16)
    with pytest.raises(ValueError, match=r"layer 0 is \[B, H, N, C bytes\] = \(3, 2, 4, 32\)"):
        DeviceKv(views, PageFormat(2, 4, 16, 8), 4, CpuEdge(), "f16")
    with pytest.raises(ValueError, match="4-D"):
        DeviceKv([views[0][0]], PageFormat(2, 4, 32, 16), 4, CpuEdge(), "f16")
    with pytest.raises(ValueError, match="K takes 32 of 32"):
        PageFormat(2, 4, 32, 32)


BS, LAYERS, HEADS, DIM = 16, 2, 2, 8


@pytest.mark.parametrize("layerwise", [False, True], ids=["blocks", "layers"])
def test_a_gpu_layout_cache_and_the_reference_layout_share_blocks_through_the_pool(client: kvpool.Client,
                                                                                   layerwise: bool) -> None:
    """Blocks saved by a connector over a BLNHC device cache (CPU edge) load into the reference engine's
    cache, and the reference engine's blocks load into an LBHNC device cache: the same keys, the same bytes."""
    keys = KeyFormat(f"device-share-{layerwise}", "v1", "f32")
    hasher = BlockHasher(BS, "0")
    gran = "layer" if layerwise else "block"
    views = allocate("BLNHC", LAYERS, 8, HEADS, BS, 2 * DIM, torch.float32)
    fill(views, 11)
    dev = DeviceKv(views, PageFormat(HEADS, BS, 2 * DIM * 4, DIM * 4), BS, CpuEdge(), "f32")
    r = ConnectorRequest("a", list(range(1, 2 * BS + 2)))
    with PoolConnector(client, hasher, keys, granularity=gran) as pc:
        pc.get_num_new_matched_tokens(r, 0)
        pc.update_state_after_alloc(r, [3, 6], 0)
        meta = pc.build_connector_meta([ScheduledRequest(r, [3, 6], 0, 2 * BS)])
        pc.start_load_kv(meta, dev)
        for layer in range(LAYERS):
            pc.wait_for_layer_load(layer)
            pc.save_kv_layer(layer, dev)
        pc.wait_for_device_copies()
        pc.wait_for_save()
        assert pc.saved_blocks == 2

    ref = PagedKvCache(4, LAYERS, BS, HEADS, DIM, backend="torch")
    r2 = ConnectorRequest("b", list(range(1, 2 * BS + 2)))
    with PoolConnector(client, hasher, keys, granularity=gran) as pc:
        m = pc.get_num_new_matched_tokens(r2, 0)
        assert m.tokens == 2 * BS
        pc.update_state_after_alloc(r2, [1, 2, 3], m.tokens)
        meta = pc.build_connector_meta([ScheduledRequest(r2, [1, 2, 3], m.tokens, m.tokens + 1)])
        pc.start_load_kv(meta, ref)
        for layer in range(LAYERS):
            pc.wait_for_layer_load(layer)
        assert not pc.block_ids_with_load_errors()
    for got, want in ((1, 3), (2, 6)):
        assert ref.block(got).numpy().tobytes() == raw(dev.save_sources([want])[0])

    # and back: the reference blocks into a device cache of another layout
    back = allocate("LBHNC", LAYERS, 8, HEADS, BS, 2 * DIM, torch.float32)
    dev2 = DeviceKv(back, PageFormat(HEADS, BS, 2 * DIM * 4, DIM * 4), BS, CpuEdge(), "f32")
    r3 = ConnectorRequest("c", list(range(1, 2 * BS + 2)))
    with PoolConnector(client, hasher, keys, granularity=gran) as pc:
        m = pc.get_num_new_matched_tokens(r3, 0)
        pc.update_state_after_alloc(r3, [7, 0, 1], m.tokens)
        meta = pc.build_connector_meta([ScheduledRequest(r3, [7, 0, 1], m.tokens, m.tokens + 1)])
        pc.start_load_kv(meta, dev2)
        for layer in range(LAYERS):
            pc.wait_for_layer_load(layer)
        assert not pc.block_ids_with_load_errors()
    for layer in range(LAYERS):
        assert torch.equal(back[layer][7].view(torch.uint8), views[layer][3].view(torch.uint8))
        assert torch.equal(back[layer][0].view(torch.uint8), views[layer][6].view(torch.uint8))



@pytest.mark.parametrize("layout", ["LBNHC", "LBHNC"])
def test_kernel_blocks_smaller_than_the_cache_block_are_one_block_in_token_order(layout: str) -> None:
    """vLLM splits a cache block into R kernel blocks when its kernel takes fewer tokens (the views then hold
    ``num_blocks * R`` kernel blocks): the pool's block is the cache block's tokens in order, kernel block by
    kernel block."""
    R, n, H, C, B, L = 2, 4, 2, 8, 3, 2
    views = allocate(layout, L, B * R, H, n, C, torch.float16)
    fill(views, 5)
    fmt = PageFormat(H, R * n, C * 2, C)  # K and V halves of 4 f16 each
    kv = DeviceKv(views, fmt, R * n, CpuEdge(), "f16", num_blocks=B)
    assert kv.num_blocks == B
    got = raw(kv.save_sources([2])[0])
    want = bytearray()
    for t in views:
        pages = t.view(torch.uint8)
        for lo, hi in ((0, C), (C, 2 * C)):
            for tok in range(R * n):
                for h in range(H):
                    want += bytes(pages[2 * R + tok // n, h, tok % n, lo:hi].tolist())
    assert got == bytes(want)
    other = allocate(layout, L, B * R, H, n, C, torch.float16)
    kv2 = DeviceKv(other, fmt, R * n, CpuEdge(), "f16", num_blocks=B)
    targets, commit = kv2.load_targets([0])
    targets[0].copy_(torch.frombuffer(bytearray(got), dtype=torch.uint8))
    commit([True])
    for a, b in zip(other, views):
        assert torch.equal(a[0:R].view(torch.uint8), b[2 * R:3 * R].view(torch.uint8))
    with pytest.raises(ValueError, match="not a whole number"):
        DeviceKv(views, fmt, R * n, CpuEdge(), "f16", num_blocks=4)


def test_on_the_same_machine_a_block_goes_from_the_device_into_the_segment_in_one_copy(either: kvpool.Client) -> None:
    """A device block (``DeviceBlock``) is written by the edge straight into the node's mapped segment under a
    write lease and checksummed there: one copy of its bytes, never materialized in other host memory. Over TCP
    it is copied once into the edge's host memory and sent from there. Either way the pool holds its bytes."""
    views = allocate("BLNHC", 2, 4, 2, 16, 16, torch.float16)
    fill(views, 21)
    edge = CpuEdge()
    kv = DeviceKv(views, PageFormat(2, 16, 32, 16), 16, edge, "f16")
    want = [canonical(views, b, kv.fmt) for b in (1, 3)]
    blocks = kv.save_sources([1, 3])
    before = edge.bytes_copied
    assert all(r.status.name == "OK" for r in either.put_batch_detailed(["dev/1", "dev/3"], blocks))
    assert edge.bytes_copied - before == 2 * kv.block_bytes  # one copy of each block, on either path
    materialized = [b._host is not None for b in blocks]
    if either._ch.segments.shm.enabled:  # the same-machine path: filled in place in the segment
        assert either.counters["bytes_written_shm"] >= 2 * kv.block_bytes and either.counters["objects_leased"] >= 2
        assert materialized == [False, False]
    else:
        assert materialized == [True, True] and either.counters["bytes_written_tcp"] >= 2 * kv.block_bytes
    assert [either.get("dev/1"), either.get("dev/3")] == want


def test_a_registered_segment_mapping_is_unregistered_before_it_is_unmapped(pool: Any) -> None:
    """The edge registers a node's segment mapping once (the first block it fills there) and unregisters it
    when the client closes the mapping, before the pages go (a device registration must never outlive them)."""

    class Recording(CpuEdge):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[tuple[str, int]] = []

        def register_host(self, address: int, nbytes: int) -> bool:
            first = all(a != address for _, a in self.calls)
            self.calls.append(("register", address))
            return first

        def unregister_host(self, address: int) -> None:
            self.calls.append(("unregister", address))

    edge = Recording()
    views = allocate("LBNHC", 2, 4, 2, 16, 16, torch.float16)
    kv = DeviceKv(views, PageFormat(2, 16, 32, 16), 16, edge, "f16")
    c = kvpool.Client(pool.master, shared_memory=True)
    try:
        for i in range(3):
            assert c.put(f"reg/{i}", kv.save_sources([i])[0]) == kvpool.PutStatus.OK
        assert [k for k, _ in edge.calls] == ["register"] * 3  # asked each time, registered once
    finally:
        c.close()
    assert [k for k, _ in edge.calls] == ["register"] * 3 + ["unregister"]
    assert len({a for _, a in edge.calls}) == 1


def test_the_pointer_attributes_struct_has_room_for_what_newer_cuda_runtimes_write() -> None:
    """cudaPointerGetAttributes writes the whole struct its runtime knows: 88 bytes in CUDA 13 (four fields, a
    union and seven reserved longs). A 24-byte struct let it write past the end, and the process crashed later
    (seen on an H200). The four fields this module reads stay where every runtime since CUDA 11 puts them."""
    import ctypes

    from kvpool.device.cudart import _Attributes
    assert ctypes.sizeof(_Attributes) >= 256
    assert [getattr(_Attributes, f).offset for f in ("type", "device", "devicePointer", "hostPointer")] == [0, 4, 8, 16]
