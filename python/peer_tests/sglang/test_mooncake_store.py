"""SGLang's own Mooncake backend (``sglang.srt.mem_cache.storage.mooncake_store.MooncakeStore``, created by
``StorageBackendFactory`` as ``--hicache-storage-backend mooncake``) running over kvpool's Mooncake
drop-in: ``kvpool.mooncake.install()`` makes its ``from mooncake.store import ...`` give
``kvpool.mooncake``, and its extra_config points ``master_server_address`` at the kvpool master."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest

import kvpool.mooncake
import sglang_objects as so
from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.observability.metrics_collector import StorageMetrics
from test_kvpool_store import alloc_pages, hashes

kvpool.mooncake.install()


@pytest.fixture
def make_mooncake(kvpool_pool: Any, storage_config: Any) -> Iterator[Callable[..., Any]]:
    made: list[Any] = []

    def make(host_pool: Any, **config: Any) -> Any:
        # the configuration a user writes: --hicache-storage-backend mooncake
        # --hicache-storage-backend-extra-config '{"master_server_address": ..., ...}'
        extra = {"master_server_address": kvpool_pool.master, "protocol": "tcp", "device_name": "",
                 "metadata_server": "P2PHANDSHAKE", "global_segment_size": 0, "check_server": False,
                 "local_hostname": "127.0.0.1"}
        cfg = storage_config(extra=extra, **config)
        cfg.extra_config = extra  # only Mooncake's keys (storage_config adds the dynamic ones)
        store = StorageBackendFactory.create_backend("mooncake", cfg, host_pool)
        store.register_mem_pool_host(host_pool)
        made.append(store)
        return store

    yield make
    for s in made:
        s.store.close()


def test_the_store_under_sglang_is_kvpools(make_mooncake, pool_client) -> None:
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore
    store = make_mooncake(so.mha_host_pool("page_first"))
    assert type(store) is MooncakeStore
    assert type(store.store) is kvpool.mooncake.MooncakeDistributedStore
    assert store.config_prefix == "test-org-tiny-model"


@pytest.mark.parametrize("kind,layout", [("mha", "page_first"), ("mha", "page_first_direct"), ("mha", "page_head"),
                                         ("mla", "layer_first"), ("mla", "page_first"),
                                         ("mla", "page_first_direct")])
def test_v1_round_trip_exists_and_misses(kind, layout, make_mooncake, pool_client) -> None:
    make = so.mla_host_pool if kind == "mla" else so.mha_host_pool
    w_host, r_host = make(layout), make(layout)
    so.fill_random(w_host, 11)
    so.fill_random(r_host, 12)
    w = make_mooncake(w_host, is_mla=kind == "mla")
    r = make_mooncake(r_host, is_mla=kind == "mla")
    keys = hashes(5)
    ps = w_host.page_size
    widx = alloc_pages(w_host, 5)
    assert w.batch_set_v1(keys[:4], widx[: 4 * ps]) == [True] * 4
    # Mooncake's key names, as kvpool stores them: MHA {tag}_{hash}_{tp}_k/_v, MLA {tag}_{hash}__k
    first = f"test-org-tiny-model_{keys[0]}"
    want = [f"{first}__k"] if kind == "mla" else [f"{first}_0_k", f"{first}_0_v"]
    assert pool_client.batch_exists(want) == [True] * len(want)
    assert r.batch_exists(keys) == 4
    assert r.batch_exists(keys[4:] + keys[:4]) == 0
    alloc_pages(r_host, 1)
    ridx = alloc_pages(r_host, 5)
    assert r.batch_get_v1(keys, ridx) == [True] * 4 + [False]
    for p in range(4):
        assert so.page_bytes(w_host, int(widx[p * ps])) == so.page_bytes(r_host, int(ridx[p * ps]))
    # set again: the existing pages are skipped, the new one written
    assert w.batch_set_v1(keys, widx) == [True] * 5
    assert r.batch_exists(keys) == 5


def test_mha_layer_first_is_refused_by_sglangs_mooncake_backend(make_mooncake, pool_client) -> None:
    store = make_mooncake(so.mha_host_pool("layer_first"), page_first=False)
    with pytest.raises(RuntimeError, match="layer_first multi-buffer is only supported for MLA"):
        store.batch_set_v1(hashes(1), alloc_pages(store.mem_pool_host, 1))


def test_v2_hybrid_pools(make_mooncake, pool_client) -> None:
    def build(seed: int) -> tuple[Any, dict[Any, Any]]:
        kv = so.mha_host_pool("page_first")
        pools = {PoolName.MAMBA: so.mamba_host_pool(), PoolName.SWA: so.mha_host_pool("page_first"),
                 PoolName.DRAFT: so.mla_host_pool("page_first")}
        for i, p in enumerate([kv, *pools.values()]):
            so.fill_random(p, seed + i)
        store = make_mooncake(kv)
        for name, p in pools.items():
            store.register_mem_host_pool_v2(p, name)
        return store, pools

    w, wp = build(20)
    r, rp = build(30)
    keys = hashes(3)
    assert w.batch_set_v1(keys, alloc_pages(w.mem_pool_host, 3)) == [True] * 3
    widx = {n: alloc_pages(p, 3) for n, p in wp.items()}
    assert w.batch_set_v2([PoolTransfer(name=n, host_indices=widx[n], keys=keys) for n in wp]) == \
        {n: [True] * 3 for n in wp}
    probe = [PoolTransfer(name=PoolName.MAMBA, keys=keys[-1:], hit_policy=PoolHitPolicy.TRAILING_PAGES),
             PoolTransfer(name=PoolName.DRAFT, keys=keys, hit_policy=PoolHitPolicy.ALL_PAGES)]
    res = r.batch_exists_v2(keys, probe)
    assert (res.kv_hit_pages, res.restorable_prefix_pages) == (3, [1, 2, 3])
    pool_client.remove(f"test-org-tiny-model_{keys[1]}__draft_k")
    assert r.batch_exists_v2(keys, probe).kv_hit_pages == 1
    ridx = {n: alloc_pages(p, 3) for n, p in rp.items()}
    got = r.batch_get_v2([PoolTransfer(name=n, host_indices=ridx[n], keys=keys) for n in rp])
    assert got == {PoolName.MAMBA: [True] * 3, PoolName.SWA: [True] * 3, PoolName.DRAFT: [True, False, True]}
    for n in rp:
        ps = wp[n].page_size
        for p in range(3):
            if got[n][p]:
                assert so.page_bytes(wp[n], int(widx[n][p * ps])) == so.page_bytes(rp[n], int(ridx[n][p * ps]))


def test_clear_and_stats(make_mooncake, pool_client) -> None:
    store = make_mooncake(so.mha_host_pool("page_first"), metrics=True)
    keys = hashes(2)
    idx = alloc_pages(store.mem_pool_host, 2)
    assert store.batch_set_v1(keys, idx) == [True, True]
    assert store.batch_get_v1(keys, idx) == [True, True]
    m = store.get_stats()
    # SGLang's MooncakeStore counts the objects it wrote (K and V) as backup pages, the pages read as prefetch
    assert isinstance(m, StorageMetrics) and (m.backup_pgs, m.prefetch_pgs) == ([4], [2])
    store.clear()  # Mooncake's clear is remove_all: the whole pool
    assert store.batch_exists(keys) == 0
    assert pool_client.status().keys == 0
