"""Paged KV caches: a block's bytes are the Java reference engine's block layout
(kvpool-engine KvBlocks: block b at b * blockBytes, then (2 * layer + k_or_v) * partBytes, then
token * kvDim * 4, then head * headDim * 4 + d * 4), and the per-layer views are vLLM's shapes over
the same memory."""

from __future__ import annotations

import struct

import pytest

from kvpool.connector import HND, NHD, LayeredPagedKv, PagedKvCache

np = pytest.importorskip("numpy")

NB, L, BS, H, D = 5, 3, 4, 2, 8


def java_offset(block: int, layer: int, v: int, token: int, head: int, d: int) -> int:
    """KvBlocks.offset(block, layer, v, slot) + the element's place in the token's kvDim vector."""
    kv_dim = H * D
    part = BS * kv_dim * 4
    block_bytes = 2 * L * part
    return block * block_bytes + (2 * layer + v) * part + token * kv_dim * 4 + (head * D + d) * 4


def fill(cache: PagedKvCache) -> None:
    """A distinct value per element, written through vLLM's NHD per-layer views."""
    for layer in range(L):
        view = cache.layer(layer)  # (2, NB, BS, H, D)
        for v in range(2):
            for b in range(NB):
                for t in range(BS):
                    for h in range(H):
                        for d in range(D):
                            view[v, b, t, h, d] = float(((((b * L + layer) * 2 + v) * BS + t) * H + h) * D + d)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_block_bytes_are_the_java_layout(backend: str) -> None:
    if backend == "torch":
        pytest.importorskip("torch")
    cache = PagedKvCache(NB, L, BS, H, D, backend=backend)
    assert cache.block_bytes == L * 2 * BS * H * D * 4
    assert cache.kv_dtype == "f32"
    fill(cache)
    raw = b"".join(bytes(memoryview(np.ascontiguousarray(
        cache.block(b).numpy() if backend == "torch" else cache.block(b))).cast("B")) for b in range(NB))
    for b, layer, v, t, h, d in [(0, 0, 0, 0, 0, 0), (1, 2, 1, 3, 1, 7), (4, 1, 0, 2, 1, 3), (3, 0, 1, 1, 0, 5)]:
        want = float(((((b * L + layer) * 2 + v) * BS + t) * H + h) * D + d)
        assert struct.unpack_from("<f", raw, java_offset(b, layer, v, t, h, d))[0] == want


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_layer_views_share_memory_with_the_blocks(backend: str) -> None:
    if backend == "torch":
        pytest.importorskip("torch")
    cache = PagedKvCache(NB, L, BS, H, D, backend=backend)
    assert tuple(cache.layer(1).shape) == (2, NB, BS, H, D)
    assert tuple(cache.layer_hnd(1).shape) == (2, NB, H, BS, D)  # vLLM's CPU backend
    cache.layer_hnd(2)[1, 3, 1, 2, 5] = 42.0  # V, block 3, head 1, token 2, dim 5
    assert float(cache.layer(2)[1, 3, 2, 1, 5]) == 42.0
    assert float(cache.block_view(3)[2, 1, 2, 1, 5]) == 42.0
    blk = cache.block(3)
    flat = blk.numpy().view(np.uint8) if backend == "torch" else blk
    off = java_offset(3, 2, 1, 2, 1, 5) - 3 * cache.block_bytes
    assert struct.unpack_from("<f", flat.tobytes(), off)[0] == 42.0


def test_wrapping_an_existing_tensor_and_bad_shapes() -> None:
    data = np.zeros((NB, L, 2, BS, H, D), dtype=np.float16)
    cache = PagedKvCache(data=data)
    assert (cache.num_blocks, cache.num_layers, cache.block_size, cache.num_kv_heads, cache.head_size) == (NB, L, BS, H, D)
    assert cache.kv_dtype == "f16" and cache.block_bytes == L * 2 * BS * H * D * 2
    cache.block(0)[:] = 1
    assert data[0].view(np.uint8).min() == 1
    with pytest.raises(ValueError, match="shape"):
        PagedKvCache(data=np.zeros((NB, L, 3, BS, H, D), dtype=np.float32))
    with pytest.raises(ValueError, match="num_layers"):
        PagedKvCache(NB, 0, BS, H, D)
    with pytest.raises(IndexError):
        cache.block(NB)


@pytest.mark.parametrize("layout", [HND, NHD], ids=["HND", "NHD"])
def test_layered_caches_gather_and_scatter_the_same_bytes(layout: tuple) -> None:
    """vLLM's per-layer caches (CPU backend: HND) moved through the pool's block layout."""
    torch = pytest.importorskip("torch")
    ref = PagedKvCache(NB, L, BS, H, D, backend="torch")
    fill(ref)
    if layout == HND:
        layers = [ref.layer_hnd(layer).contiguous() for layer in range(L)]
    else:
        layers = [ref.layer(layer).contiguous() for layer in range(L)]
    kv = LayeredPagedKv(layers, BS, layout)
    assert kv.block_bytes == ref.block_bytes and kv.num_layers == L and kv.num_blocks == NB
    for b in range(NB):
        assert torch.equal(kv.gather(b), ref.block_view(b))
    # scatter block 1's bytes into block 4 through the staged load path
    targets, commit = kv.load_targets([4, 2])
    targets[0].copy_(ref.block_view(1))
    targets[1].fill_(-1.0)
    commit([True, False])  # block 2's read "failed": left untouched
    assert torch.equal(kv.gather(4), ref.block_view(1))
    assert torch.equal(kv.gather(2), ref.block_view(2))
    (src,) = kv.save_sources([4])
    assert src.is_contiguous() and torch.equal(src, ref.block_view(1))


def test_layered_caches_refuse_mismatches() -> None:
    torch = pytest.importorskip("torch")
    a = torch.zeros(2, NB, H, BS, D)
    with pytest.raises(ValueError, match="layer 1"):
        LayeredPagedKv([a, torch.zeros(2, NB, H, BS, D + 1)], BS, HND)
    with pytest.raises(ValueError, match="block size"):
        LayeredPagedKv([a], BS * 2, HND)
    with pytest.raises(ValueError, match="layout"):
        LayeredPagedKv([a], BS, ("kv", "blocks", "x", "tokens", "dim"))
