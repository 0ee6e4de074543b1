"""LMCache's own Mooncake connector (``mooncakestore``, lmcache/v1/storage_backend/connector/
mooncakestore_connector.py) over ``kvpool.mooncake`` registered as ``mooncake.store``, driven through
LMCache's real StorageManager, RemoteBackend, LocalCPUBackend allocator, CacheEngineKey and MemoryObj,
against a real kvpool pool.

The configuration is what a Mooncake user of LMCache writes: ``remote_storage_plugins: ["mooncakestore"]``
with ``mooncake_*`` setup keys in ``extra_config``, or Mooncake's JSON config named by
``MOONCAKE_CONFIG_PATH``; the master address is the kvpool master's.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import pytest

import kvpool
import kvpool.lmcache
import kvpool.mooncake
from lmcache_support import (CHUNK, TOKEN_BYTES, Chunks, assert_reads_back, connector, object_bytes, on_loop, release,
                             remote_backend, retrieve, wait_stored)


def mooncake_yaml(master: str, save_chunk_meta: bool) -> str:
    return f"""\
chunk_size: {CHUNK}
local_cpu: false
max_local_cpu_size: 0.05
remote_serde: naive
remote_storage_plugins: ["mooncakestore"]
extra_config:
  mooncake_master_server_addr: "{master}"
  mooncake_local_hostname: "127.0.0.1"
  mooncake_metadata_server: "P2PHANDSHAKE"
  mooncake_protocol: "tcp"
  mooncake_global_segment_size: "0"
  save_chunk_meta: {str(save_chunk_meta).lower()}
  transfer_timeout: 30
"""


@pytest.mark.parametrize("save_chunk_meta", [True, False], ids=["put_parts+batch_get_buffer", "zero_copy"])
def test_store_lookup_retrieve(kvpool_pool: Any, make_config: Callable[[str], Any], make_manager: Callable[..., Any],
                               model_name: str, save_chunk_meta: bool) -> None:
    sm = make_manager(make_config(mooncake_yaml(kvpool_pool.master, save_chunk_meta)), model_name)
    conn = connector(sm)
    # LMCache's own class, set up over kvpool's drop-in (not the real binding)
    assert type(conn).__name__ == "MooncakestoreConnector"
    assert isinstance(conn.store, kvpool.mooncake.MooncakeDistributedStore)
    assert conn.save_chunk_meta is save_chunk_meta
    assert conn.store.health_check() == 0

    chunks = Chunks(sm, model_name, 4, last_tokens=5, seed=1)  # 3 full chunks and a 5-token one
    keys, expected = chunks.keys, chunks.expected
    absent = Chunks(sm, model_name, 1, seed=2)
    release(absent.objs)
    chunks.put(sm)
    rb = remote_backend(sm)
    wait_stored(rb, keys)

    # lookup: one key, a prefix of keys (the absent key ends the prefix), LMCache's async lookup
    assert sm.contains(keys[0]) == "RemoteBackend-mooncakestore"
    assert not rb.contains(absent.keys[0])
    assert sm.batched_contains(keys + absent.keys)[0] == 4
    assert sm.batched_contains(keys[:2] + absent.keys + keys[2:])[0] == 2
    assert on_loop(sm, rb.batched_async_contains("lookup-1", keys + absent.keys)) == 4

    # the objects are in the pool under LMCache's key strings; their bytes are the chunk's
    # (after LMCache's RemoteMetadata header when save_chunk_meta is on)
    with kvpool.Client(kvpool_pool.master) as c:
        raw = c.get(keys[1].to_string())
    assert raw is not None
    assert raw[-len(expected[1]):] == expected[1]
    assert len(raw) == len(expected[1]) + (conn.remote_metadata_bytes if save_chunk_meta else 0)

    hits, got = retrieve(sm, keys)
    try:
        assert hits == 4
        assert [object_bytes(o) for o in got] == expected  # bytes identical, the partial chunk trimmed to 5 tokens
        assert [tuple(o.get_shape()) for o in got][-1] == (2, 2, 5, 16)
        assert got[-1].get_size() == 5 * TOKEN_BYTES
    finally:
        release(got)


def test_config_from_mooncake_config_path(kvpool_pool: Any, make_config: Callable[[str], Any],
                                          make_manager: Callable[..., Any], model_name: str, tmp_path: Any,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Mooncake's JSON config (MOONCAKE_CONFIG_PATH) instead of extra_config, and a second LMCache
    instance that finds what the first stored: the cross-instance hit the pool is for."""
    cfg = tmp_path / "mooncake.json"
    cfg.write_text(json.dumps({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                               "master_server_address": kvpool_pool.master, "protocol": "tcp",
                               "device_name": "", "global_segment_size": 0, "transfer_timeout": 30}))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(cfg))
    yaml = f"""\
chunk_size: {CHUNK}
local_cpu: false
max_local_cpu_size: 0.05
remote_storage_plugins: ["mooncakestore"]
extra_config:
  save_chunk_meta: false
"""
    writer = make_manager(make_config(yaml), model_name)
    assert connector(writer).config.setup_config["master_server_address"] == kvpool_pool.master
    chunks = Chunks(writer, model_name, 3, seed=3)
    chunks.put(writer)
    wait_stored(remote_backend(writer), chunks.keys)

    assert_reads_back(make_manager(make_config(yaml), model_name), chunks)


def test_reset_leaves_nothing_readable(kvpool_pool: Any, make_config: Callable[[str], Any],
                                       make_manager: Callable[..., Any], model_name: str) -> None:
    sm = make_manager(make_config(mooncake_yaml(kvpool_pool.master, False)), model_name)
    chunks = Chunks(sm, model_name, 3, seed=4)
    keys = chunks.keys
    chunks.put(sm)
    rb = remote_backend(sm)
    wait_stored(rb, keys)

    # LMCache 0.5.6's own clear() skips remote backends (RemoteBackend has no clear()): still there
    sm.clear()
    assert sm.batched_contains(keys)[0] == 3

    # the reset: the connector's store.remove_all(True), Mooncake's (and vLLM's) hard reset
    assert kvpool.lmcache.reset(sm) >= 3  # remove_all: every object in the pool, these three among them
    assert sm.batched_contains(keys)[0] == 0
    assert not any(rb.contains(k) for k in keys)
    got = rb.batched_get_blocking(keys)
    assert got == [None, None, None]
    with kvpool.Client(kvpool_pool.master) as c:
        assert c.batch_exists([k.to_string() for k in keys]) == [False] * 3


def test_miss_is_none(kvpool_pool: Any, make_config: Callable[[str], Any], make_manager: Callable[..., Any],
                      model_name: str) -> None:
    sm = make_manager(make_config(mooncake_yaml(kvpool_pool.master, False)), model_name)
    never = Chunks(sm, model_name, 2, seed=5)
    release(never.objs)
    rb = remote_backend(sm)
    assert sm.batched_contains(never.keys)[0] == 0
    assert rb.batched_get_blocking(never.keys) == [None, None]


def test_legacy_remote_url(kvpool_pool: Any, make_config: Callable[[str], Any], make_manager: Callable[..., Any],
                           model_name: str) -> None:
    """The older form, ``remote_url: mooncakestore://...`` (deprecated by LMCache for
    remote_storage_plugins): the URL only selects the connector; the master comes from extra_config."""
    yaml = mooncake_yaml(kvpool_pool.master, False).replace('remote_storage_plugins: ["mooncakestore"]',
                                                            'remote_url: "mooncakestore://127.0.0.1:50051"')
    sm = make_manager(make_config(yaml), model_name)
    assert type(connector(sm)).__name__ == "MooncakestoreConnector"
    chunks = Chunks(sm, model_name, 2, seed=6)
    chunks.put(sm)
    wait_stored(remote_backend(sm), chunks.keys)
    assert_reads_back(sm, chunks)
