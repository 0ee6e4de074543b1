"""kvpool.sglang.KvPoolStore in SGLang's own classes: created by SGLang's StorageBackendFactory through
its ``dynamic`` backend, over SGLang's real host memory pools (CPU), against a real kvpool pool."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import torch

import sglang_objects as so
from kvpool.sglang import KvPoolStore
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorageExtraInfo, PoolHitPolicy, PoolName, PoolTransfer, PoolTransferResult,
)
from sglang.srt.observability.metrics_collector import StorageMetrics


def hashes(n: int, tag: str = "p") -> list[str]:
    """Page keys shaped like SGLang's (sha256 hex of a chain)."""
    out, prev = [], b""
    for i in range(n):
        prev = hashlib.sha256(prev + f"{tag}{i}".encode()).digest()
        out.append(prev.hex())
    return out


def alloc_pages(host: Any, n: int) -> torch.Tensor:
    idx = host.alloc(n * host.page_size)
    assert idx is not None
    return idx


def page_starts(host: Any, idx: torch.Tensor) -> list[int]:
    return [int(i) for i in idx[:: host.page_size]]


def roundtrip_v1(make_store: Any, config: Any, writer_host: Any, reader_host: Any, n: int = 5) -> None:
    so.fill_random(writer_host, 1)
    so.fill_random(reader_host, 2)  # different bytes everywhere, so a page that is not read shows
    w = make_store(writer_host, config)
    r = make_store(reader_host, config)
    keys = hashes(n)
    widx = alloc_pages(writer_host, n)
    assert w.batch_set_v1(keys, widx) == [True] * n
    assert r.batch_exists(keys) == n
    alloc_pages(reader_host, 2)  # the reader's pages land at other host slots than the writer's
    ridx = alloc_pages(reader_host, n)
    assert page_starts(reader_host, ridx) != page_starts(writer_host, widx)
    assert r.batch_get_v1(keys, ridx) == [True] * n
    for a, b in zip(page_starts(writer_host, widx), page_starts(reader_host, ridx)):
        assert so.page_bytes(writer_host, a) == so.page_bytes(reader_host, b)


def test_factory_creates_kvpool_store_through_dynamic(make_store, storage_config, pool_client) -> None:
    host = so.mha_host_pool("page_first")
    store = make_store(host, storage_config(tp_rank=1, tp_size=2))
    assert type(store) is KvPoolStore
    assert store.namespace == "sglang/test-org-tiny-model/bfloat16-tl/"
    keys = hashes(1)
    assert store.batch_set_v1(keys, alloc_pages(host, 1)) == [True]
    # MHA: the TP rank and size are in the keys; one object for K and one for V
    assert pool_client.batch_exists([f"{store.namespace}{keys[0]}_1_2_k", f"{store.namespace}{keys[0]}_1_2_v"]) \
        == [True, True]


@pytest.mark.parametrize("layout", so.MHA_LAYOUTS)
def test_mha_v1_round_trip_every_layout(layout, make_store, storage_config, pool_client) -> None:
    roundtrip_v1(make_store, storage_config(page_first=layout != "layer_first"), so.mha_host_pool(layout),
                 so.mha_host_pool(layout))


@pytest.mark.parametrize("layout", so.MLA_LAYOUTS)
def test_mla_v1_round_trip_every_layout(layout, make_store, storage_config, pool_client) -> None:
    roundtrip_v1(make_store, storage_config(is_mla=True), so.mla_host_pool(layout), so.mla_host_pool(layout))


def test_exists_counts_the_stored_prefix_and_misses_fail(make_store, storage_config, pool_client) -> None:
    host = so.mha_host_pool("page_first")
    so.fill_random(host, 3)
    store = make_store(host, storage_config())
    keys = hashes(6)
    idx = alloc_pages(host, 6)
    ps = host.page_size
    assert store.batch_set_v1(keys[:4], idx[: 4 * ps]) == [True] * 4
    assert store.batch_exists(keys) == 4
    assert store.batch_exists(keys[:3]) == 3
    assert store.batch_exists(keys[4:] + keys[:4]) == 0
    assert store.batch_exists([], HiCacheStorageExtraInfo(prefix_keys=None)) == 0
    assert store.exists(keys[2]) and not store.exists(keys[5])
    # a page missing one of its objects (V) is not there
    pool_client.remove(f"{store.namespace}{keys[1]}_0_1_v")
    assert store.batch_exists(keys) == 1
    assert not store.exists(keys[1])
    # reads: the stored pages load, the missing ones fail
    before = so.page_bytes(host, int(idx[5 * ps]))
    assert store.batch_get_v1([keys[0], keys[1], keys[5]], idx[3 * ps:]) == [True, False, False]
    assert so.page_bytes(host, int(idx[5 * ps])) == before


def test_mla_keys_have_no_rank_and_are_shared_by_tp_ranks(make_store, storage_config, pool_client) -> None:
    h0, h1 = so.mla_host_pool("page_first"), so.mla_host_pool("page_first")
    so.fill_random(h0, 4)
    r0 = make_store(h0, storage_config(is_mla=True, tp_rank=0, tp_size=2))
    r1 = make_store(h1, storage_config(is_mla=True, tp_rank=1, tp_size=2))
    keys = hashes(3)
    i0 = alloc_pages(h0, 3)
    assert r0.batch_set_v1(keys, i0) == [True] * 3
    assert pool_client.exists(f"{r0.namespace}{keys[0]}_k")
    assert r1.batch_exists(keys) == 3
    i1 = alloc_pages(h1, 3)
    assert r1.batch_get_v1(keys, i1) == [True] * 3
    assert so.page_bytes(h0, int(i0[4])) == so.page_bytes(h1, int(i1[4]))


def test_mha_tp_ranks_keep_their_own_heads(make_store, storage_config, pool_client) -> None:
    h0, h1 = so.mha_host_pool("page_first"), so.mha_host_pool("page_first")
    so.fill_random(h0, 5)
    r0 = make_store(h0, storage_config(tp_rank=0, tp_size=2))
    r1 = make_store(h1, storage_config(tp_rank=1, tp_size=2))
    keys = hashes(2)
    assert r0.batch_set_v1(keys, alloc_pages(h0, 2)) == [True, True]
    assert r1.batch_exists(keys) == 0
    assert r1.batch_get_v1(keys, alloc_pages(h1, 2)) == [False, False]


def test_layouts_and_dtypes_do_not_mix(make_store, storage_config, pool_client) -> None:
    pf, lf = so.mha_host_pool("page_first"), so.mha_host_pool("layer_first")
    f16 = so.mha_host_pool("page_first", dtype=torch.float16)
    so.fill_random(pf, 6)
    keys = hashes(2)
    assert make_store(pf, storage_config()).batch_set_v1(keys, alloc_pages(pf, 2)) == [True, True]
    assert make_store(lf, storage_config(page_first=False)).batch_exists(keys) == 0
    assert make_store(f16, storage_config()).batch_exists(keys) == 0
    assert make_store(so.mha_host_pool("page_first_direct"), storage_config()).batch_exists(keys) == 0


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_head"])
@pytest.mark.parametrize("is_mla", [False, True])
def test_tensor_calls_share_the_objects_of_the_zero_copy_calls(layout, is_mla, make_store, storage_config,
                                                               pool_client) -> None:
    """SGLang's older path (no interface_v1): batch_set / batch_get of flat pages (get_data_page,
    get_dummy_flat_data_page, set_from_flat_data_page, as HiCacheController does), same objects as v1."""
    if is_mla and layout == "page_head":
        layout = "page_first_direct"
    make = so.mla_host_pool if is_mla else so.mha_host_pool
    a, b = make(layout), make(layout)
    so.fill_random(a, 7)
    so.fill_random(b, 8)
    cfg = storage_config(is_mla=is_mla, extra={"interface_v1": 0})
    sa, sb = make_store(a, cfg), make_store(b, cfg)
    keys = hashes(4)
    ia, ib = alloc_pages(a, 4), alloc_pages(b, 4)
    ps = a.page_size
    # tensor write of pages 0-1, zero-copy write of pages 2-3
    assert sa.batch_set(keys[:2], [a.get_data_page(int(ia[i * ps])) for i in range(2)]) is True
    assert sa.batch_set_v1(keys[2:], ia[2 * ps:]) == [True, True]
    assert sb.batch_exists(keys) == 4
    # zero-copy read of pages 0-1, tensor read of pages 2-3
    assert sb.batch_get_v1(keys[:2], ib[: 2 * ps]) == [True, True]
    got = sb.batch_get(keys[2:], [b.get_dummy_flat_data_page() for _ in range(2)])
    assert all(g is not None for g in got)
    for i, g in enumerate(got):
        b.set_from_flat_data_page(int(ib[(2 + i) * ps]), g)
    for i in range(4):
        assert so.page_bytes(a, int(ia[i * ps])) == so.page_bytes(b, int(ib[i * ps]))
    assert sb.batch_get([hashes(1, "x")[0]], [b.get_dummy_flat_data_page()]) == [None]
    assert sb.get(keys[0], b.get_dummy_flat_data_page()) is not None
    assert sb.set(hashes(1, "y")[0], a.get_data_page(int(ia[0]))) is True


def test_split_heads_writer_serves_the_wider_tp_reader(make_store, storage_config, pool_client) -> None:
    """Heterogeneous TP (page_head, should_split_heads): a TP-2 rank with 4 heads writes its page as two
    head groups named in the lcm (TP-4) space; the TP-4 rank 1 (2 heads) reads the second group."""
    wide = so.mha_host_pool("page_head", heads=4)
    narrow = so.mha_host_pool("page_head", heads=2)
    so.fill_random(wide, 9)
    w = make_store(wide, storage_config(tp_rank=0, tp_size=2, should_split_heads=True, tp_lcm_size=4))
    r = make_store(narrow, storage_config(tp_rank=1, tp_size=4, tp_lcm_size=4))
    keys = hashes(2)
    wi = alloc_pages(wide, 2)
    assert w.batch_set_v1(keys, wi) == [True, True]
    assert r.batch_exists(keys) == 2
    ri = alloc_pages(narrow, 2)
    assert r.batch_get_v1(keys, ri) == [True, True]
    for p in range(2):
        wp = wide.kv_buffer[:, int(wi[p * 4]) // 4]  # [2, heads, page, layers, dim]
        rp = narrow.kv_buffer[:, int(ri[p * 4]) // 4]
        assert torch.equal(wp[:, 2:4].view(torch.uint8), rp.view(torch.uint8))


def hybrid(make_store: Any, storage_config: Any, seed: int) -> tuple[Any, dict[Any, Any]]:
    kv = so.mha_host_pool("page_first")
    pools = {PoolName.KV: kv, PoolName.MAMBA: so.mamba_host_pool(), PoolName.SWA: so.mha_host_pool("page_first"),
             PoolName.DRAFT: so.mla_host_pool("page_first")}
    for i, p in enumerate(pools.values()):
        so.fill_random(p, seed * 10 + i)
    store = make_store(kv, storage_config())
    for name, p in pools.items():  # as HybridCacheController registers its host pool group
        store.register_mem_host_pool_v2(p, name)
    return store, pools


def test_v2_hybrid_pools_round_trip_and_hit_policies(make_store, storage_config, pool_client) -> None:
    w, wp = hybrid(make_store, storage_config, 1)
    r, rp = hybrid(make_store, storage_config, 2)
    keys = hashes(4)
    widx = {n: alloc_pages(p, 4) for n, p in wp.items()}
    assert w.batch_set_v1(keys, widx[PoolName.KV]) == [True] * 4
    transfers = [PoolTransfer(name=n, host_indices=widx[n], keys=keys) for n in (PoolName.MAMBA, PoolName.SWA,
                                                                                 PoolName.DRAFT)]
    assert w.batch_set_v2(transfers) == {PoolName.MAMBA: [True] * 4, PoolName.SWA: [True] * 4,
                                         PoolName.DRAFT: [True] * 4}
    ns = w.namespace
    assert pool_client.batch_exists([f"{ns}{keys[0]}_mamba_0_1_temporal", f"{ns}{keys[0]}_mamba_0_1_conv_1",
                                     f"{ns}{keys[0]}_swa_0_1_v", f"{ns}{keys[0]}_draft_k"]) == [True] * 4
    # every pool of every page stored: all prefixes restorable
    probe = [PoolTransfer(name=PoolName.MAMBA, keys=keys[-1:], hit_policy=PoolHitPolicy.TRAILING_PAGES),
             PoolTransfer(name=PoolName.DRAFT, keys=keys, hit_policy=PoolHitPolicy.ALL_PAGES)]
    res = r.batch_exists_v2(keys, probe)
    assert isinstance(res, PoolTransferResult)
    assert (res.kv_hit_pages, res.restorable_prefix_pages) == (4, [1, 2, 3, 4])
    # Mamba state of page 3 (index 2) gone: a trailing window of 1 cannot end there
    pool_client.remove(f"{ns}{keys[2]}_mamba_0_1_conv_0")
    res = r.batch_exists_v2(keys, probe)
    assert res.restorable_prefix_pages == [1, 2, 4] and res.kv_hit_pages == 4
    assert res.extra_pool_hit_pages[PoolName.MAMBA] == 4
    # a draft page missing: every prefix past it is lost
    pool_client.remove(f"{ns}{keys[1]}_draft_k")
    res = r.batch_exists_v2(keys, probe)
    assert (res.kv_hit_pages, res.restorable_prefix_pages) == (1, [1])
    assert res.extra_pool_hit_pages[PoolName.DRAFT] == 1
    # KV missing from page 2 on: nothing of the side pools counts past it
    pool_client.remove(f"{ns}{keys[1]}_0_1_k")
    assert r.batch_exists_v2(keys, probe).kv_hit_pages == 1
    # reads: byte-exact where stored, False where an object is gone
    ridx = {n: alloc_pages(p, 4) for n, p in rp.items()}
    got = r.batch_get_v2([PoolTransfer(name=n, host_indices=ridx[n], keys=keys)
                          for n in (PoolName.MAMBA, PoolName.SWA, PoolName.DRAFT)])
    assert got == {PoolName.MAMBA: [True, True, False, True], PoolName.SWA: [True] * 4,
                   PoolName.DRAFT: [True, False, True, True]}
    for name in (PoolName.MAMBA, PoolName.SWA, PoolName.DRAFT):
        ps = wp[name].page_size
        for p in range(4):
            if got[name][p]:
                assert so.page_bytes(wp[name], int(widx[name][p * ps])) == \
                    so.page_bytes(rp[name], int(ridx[name][p * ps])), (name, p)
    # the KV pool through v2 is the v1 KV objects
    assert r.batch_get_v2([PoolTransfer(name=PoolName.KV, host_indices=ridx[PoolName.KV][:4], keys=keys[:1])]) \
        == {PoolName.KV: [True]}
    assert so.page_bytes(wp[PoolName.KV], int(widx[PoolName.KV][0])) == \
        so.page_bytes(rp[PoolName.KV], int(ridx[PoolName.KV][0]))
    # a transfer whose indices do not match its keys fails without I/O
    assert r.batch_get_v2([PoolTransfer(name=PoolName.SWA, host_indices=ridx[PoolName.SWA][:3], keys=keys[:1])]) \
        == {PoolName.SWA: [False]}
    with pytest.raises(ValueError, match="unregistered"):
        r.batch_get_v2([PoolTransfer(name=PoolName.INDEXER, host_indices=ridx[PoolName.SWA][:4], keys=keys[:1])])


def test_clear_removes_this_models_pages_only(make_store, storage_config, pool_client) -> None:
    host = so.mha_host_pool("page_first")
    mine = make_store(host, storage_config())
    other = make_store(host, storage_config(model="other/model"))
    keys = hashes(3)
    idx = alloc_pages(host, 3)
    assert mine.batch_set_v1(keys, idx) == [True] * 3
    assert other.batch_set_v1(keys, idx) == [True] * 3
    mine.clear()
    assert mine.batch_exists(keys) == 0
    assert other.batch_exists(keys) == 3
    assert pool_client.status().keys == 6


def test_stats_are_sglang_storage_metrics(make_store, storage_config, pool_client) -> None:
    host = so.mha_host_pool("layer_first")
    store = make_store(host, storage_config(metrics=True, page_first=False))
    keys = hashes(3)
    idx = alloc_pages(host, 3)
    assert store.batch_set_v1(keys, idx) == [True] * 3
    assert store.batch_get_v1(keys[:2], idx[: 2 * host.page_size]) == [True, True]
    m = store.get_stats()
    assert isinstance(m, StorageMetrics)
    assert (m.backup_pgs, m.prefetch_pgs) == ([3], [2])
    assert m.backup_bandwidth[0] > 0 and m.prefetch_bandwidth[0] > 0
    assert store.get_stats().backup_pgs == []  # taken once
