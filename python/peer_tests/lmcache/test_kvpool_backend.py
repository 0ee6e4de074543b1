"""kvpool's native LMCache backend (``kvpool.lmcache``), loaded by LMCache's remote storage plugin
framework from the yaml a user writes, driven through LMCache's real StorageManager, RemoteBackend,
LocalCPUBackend allocator, CacheEngineKey and MemoryObj, against a real kvpool pool: store, lookup,
retrieve (bytes identical), removal and reset.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import pytest

import kvpool
import kvpool.lmcache
from kvpool.lmcache import KvPoolConnector
from lmcache_support import (CHUNK, HIDDEN, LAYERS, TOKEN_BYTES, Chunks, assert_reads_back, connector, object_bytes,
                             on_loop, release, remote_backend, retrieve, wait_stored)

FULL_CHUNK_BYTES = CHUNK * TOKEN_BYTES


def kvpool_yaml(master: str, *, layout: Optional[str] = None, plugin: str = "kvpool",
                class_name: str = "KvPoolConnectorAdapter", reset: Optional[str] = None, key_prefix: Optional[str] = None,
                serde: str = "naive") -> str:
    s = f"""\
chunk_size: {CHUNK}
local_cpu: false
max_local_cpu_size: 0.05
remote_serde: {serde}
remote_storage_plugins: ["{plugin}"]
extra_config:
  remote_storage_plugin.{plugin}.module_path: kvpool.lmcache
  remote_storage_plugin.{plugin}.class_name: {class_name}
  remote_storage_plugin.{plugin}.master: "{master}"
"""
    for name, value in (("layout", layout), ("reset", reset), ("key_prefix", key_prefix)):
        if value is not None:
            s += f'  remote_storage_plugin.{plugin}.{name}: "{value}"\n'
    return s


@pytest.mark.parametrize("layout", ["raw", "meta"])
def test_store_lookup_retrieve(kvpool_pool: Any, make_config: Callable[[str], Any], make_manager: Callable[..., Any],
                               model_name: str, layout: str) -> None:
    sm = make_manager(make_config(kvpool_yaml(kvpool_pool.master, layout=layout)), model_name)
    conn = connector(sm)
    assert isinstance(conn, KvPoolConnector)
    assert conn.layout == layout

    chunks = Chunks(sm, model_name, 4, last_tokens=5, seed=11)  # 3 full chunks and a 5-token one
    keys, expected = chunks.keys, chunks.expected
    absent = Chunks(sm, model_name, 1, seed=12)
    release(absent.objs)
    chunks.put(sm)
    rb = remote_backend(sm)
    wait_stored(rb, keys)

    # lookup: exists, LMCache's prefix lookups (sync and async), a gap ends the prefix
    assert sm.contains(keys[0]) == "RemoteBackend-kvpool"
    assert conn.exists_sync(keys[3]) and not conn.exists_sync(absent.keys[0])
    assert sm.batched_contains(keys + absent.keys)[0] == 4
    assert sm.batched_contains(keys[:2] + absent.keys + keys[2:])[0] == 2
    assert on_loop(sm, rb.batched_async_contains("lookup-1", keys + absent.keys)) == 4
    assert on_loop(sm, rb.batched_async_contains("lookup-2", absent.keys + keys)) == 0

    # the object layout in the pool: key_prefix + CacheEngineKey.to_string(); the KV bytes, after
    # LMCache's RemoteMetadata header in the meta layout
    with kvpool.Client(kvpool_pool.master) as c:
        stored = [c.get("lmcache/" + k.to_string()) for k in keys]
    header = conn.remote_metadata_bytes if layout == "meta" else 0
    assert [s[header:] if s is not None else None for s in stored] == expected
    assert len(stored[3]) == header + 5 * TOKEN_BYTES

    hits, got = retrieve(sm, keys)
    try:
        assert hits == 4
        assert [object_bytes(o) for o in got] == expected
        assert [tuple(o.get_shape()) for o in got] == [(2, LAYERS, CHUNK, HIDDEN)] * 3 + [(2, LAYERS, 5, HIDDEN)]
    finally:
        release(got)


def test_connector_class_and_plugin_instance_name(kvpool_pool: Any, make_config: Callable[[str], Any],
                                                 make_manager: Callable[..., Any], model_name: str) -> None:
    """``class_name: KvPoolConnector`` (the RemoteConnector itself, which LMCache wraps in its
    DynamicConnectorAdapter; that passes no plugin name, so the settings are read under ``kvpool``), and
    the adapter with a plugin instance ``kvpool.primary`` whose settings are under its own name."""
    sm = make_manager(make_config(kvpool_yaml(kvpool_pool.master, class_name="KvPoolConnector")), model_name)
    conn = connector(sm)
    assert isinstance(conn, KvPoolConnector)
    assert conn.settings.plugin_name == "kvpool" and conn.settings.master == kvpool_pool.master

    yaml = kvpool_yaml(kvpool_pool.master, plugin="kvpool.primary", key_prefix="p1/")
    sm = make_manager(make_config(yaml), model_name)
    conn = connector(sm)
    assert conn.settings.plugin_name == "kvpool.primary" and conn.settings.key_prefix == "p1/"
    chunks = Chunks(sm, model_name, 2, seed=13)
    chunks.put(sm)
    wait_stored(remote_backend(sm), chunks.keys)
    with kvpool.Client(kvpool_pool.master) as c:
        assert c.batch_exists(["p1/" + k.to_string() for k in chunks.keys]) == [True, True]


def test_second_instance_hits(kvpool_pool: Any, make_config: Callable[[str], Any], make_manager: Callable[..., Any],
                              model_name: str) -> None:
    """Another LMCache instance (its own StorageManager, allocator and client) finds and reads what the
    first stored: the cross-instance prefix hit the pool is for."""
    yaml = kvpool_yaml(kvpool_pool.master)
    writer = make_manager(make_config(yaml), model_name)
    chunks = Chunks(writer, model_name, 3, seed=14)
    chunks.put(writer)
    wait_stored(remote_backend(writer), chunks.keys)

    assert_reads_back(make_manager(make_config(yaml), model_name), chunks)


@pytest.mark.parametrize("scope", ["all", "prefix"])
def test_reset_leaves_nothing_stale(kvpool_pool: Any, make_config: Callable[[str], Any],
                                    make_manager: Callable[..., Any], model_name: str, scope: str) -> None:
    sm = make_manager(make_config(kvpool_yaml(kvpool_pool.master, reset=scope)), model_name)
    chunks = Chunks(sm, model_name, 3, seed=15)
    keys = chunks.keys
    chunks.put(sm)
    rb = remote_backend(sm)
    wait_stored(rb, keys)
    with kvpool.Client(kvpool_pool.master) as c:
        assert c.put("not-lmcache/other-user", b"x" * 100) in (kvpool.PutStatus.OK, kvpool.PutStatus.ALREADY_EXISTS)
        epoch = c.ping()

        # LMCache 0.5.6's own clear() does not reach remote backends
        sm.clear()
        assert sm.batched_contains(keys)[0] == 3

        assert kvpool.lmcache.reset(sm) >= 3
        assert sm.batched_contains(keys)[0] == 0
        assert not any(rb.contains(k) for k in keys)
        assert rb.batched_get_blocking(keys) == [None, None, None]
        assert c.batch_exists(["lmcache/" + k.to_string() for k in keys]) == [False] * 3
        if scope == "all":  # the whole pool, and a new epoch that fences puts begun before it
            assert not c.exists("not-lmcache/other-user")
            assert c.ping() > epoch
        else:  # only LMCache's prefix
            assert c.exists("not-lmcache/other-user")
            c.remove("not-lmcache/other-user")

    # the backend keeps working after the reset
    again = Chunks(sm, model_name, 1, seed=16)
    again.put(sm)
    wait_stored(rb, again.keys)


def test_remove_through_lmcache(kvpool_pool: Any, make_config: Callable[[str], Any], make_manager: Callable[..., Any],
                                model_name: str) -> None:
    """LMCache's per-chunk removal (StorageManager.remove, what LMCacheEngine.clear(tokens) calls) reaches the pool."""
    sm = make_manager(make_config(kvpool_yaml(kvpool_pool.master)), model_name)
    chunks = Chunks(sm, model_name, 3, seed=17)
    keys = chunks.keys
    chunks.put(sm)
    rb = remote_backend(sm)
    wait_stored(rb, keys)
    assert sm.remove(keys[1]) >= 1
    assert [rb.contains(k) for k in keys] == [True, False, True]
    assert sm.batched_contains(keys)[0] == 1


def test_raw_reads_foreign_values_as_misses(kvpool_pool: Any, make_config: Callable[[str], Any],
                                            make_manager: Callable[..., Any], model_name: str) -> None:
    """A value that is not a whole number of this engine's tokens, or larger than a chunk, reads as a miss
    (never a crash, never a wrong shape), and the rest of the batch is still read."""
    sm = make_manager(make_config(kvpool_yaml(kvpool_pool.master, layout="raw")), model_name)
    chunks = Chunks(sm, model_name, 3, seed=18)
    keys, expected = chunks.keys, chunks.expected
    chunks.put(sm)
    rb = remote_backend(sm)
    wait_stored(rb, keys)
    with kvpool.Client(kvpool_pool.master) as c:
        c.upsert("lmcache/" + keys[0].to_string(), b"\x01" * (TOKEN_BYTES + 3))   # not whole tokens
        c.upsert("lmcache/" + keys[2].to_string(), b"\x02" * (FULL_CHUNK_BYTES + TOKEN_BYTES))  # too large
    got = rb.batched_get_blocking(keys)
    try:
        assert got[0] is None and got[2] is None
        assert got[1] is not None and object_bytes(got[1]) == expected[1]
    finally:
        release(got)


def test_reads_what_lmcaches_mooncake_connector_wrote(kvpool_pool: Any, make_config: Callable[[str], Any],
                                                      make_manager: Callable[..., Any], model_name: str) -> None:
    """The meta layout is the one LMCache's Mooncake connector writes (save_chunk_meta): with an empty
    key prefix, kvpool's backend reads chunks that connector stored through kvpool.mooncake."""
    mooncake = f"""\
chunk_size: {CHUNK}
local_cpu: false
max_local_cpu_size: 0.05
remote_storage_plugins: ["mooncakestore"]
extra_config:
  mooncake_master_server_addr: "{kvpool_pool.master}"
  mooncake_local_hostname: "127.0.0.1"
  mooncake_metadata_server: "P2PHANDSHAKE"
  save_chunk_meta: true
  transfer_timeout: 30
"""
    writer = make_manager(make_config(mooncake), model_name)
    chunks = Chunks(writer, model_name, 3, last_tokens=7, seed=19)
    chunks.put(writer)
    wait_stored(remote_backend(writer), chunks.keys)

    reader = make_manager(make_config(kvpool_yaml(kvpool_pool.master, layout="meta", key_prefix="")), model_name)
    hits, got = retrieve(reader, chunks.keys)
    try:
        assert hits == 3
        assert [object_bytes(o) for o in got] == chunks.expected
        assert tuple(got[2].get_shape()) == (2, LAYERS, 7, HIDDEN)
    finally:
        release(got)


def test_raw_layout_refused_with_other_serde(kvpool_pool: Any, make_config: Callable[[str], Any],
                                                   make_manager: Callable[..., Any], model_name: str) -> None:
    """layout raw with a serde other than naive (cachegen's compressed chunks vary in shape; kivi is
    LMCache's other one, and cachegen needs the model's config from the hub) cannot work: the connector
    refuses to start (LMCache logs that and runs without the remote backend); unset, the layout is meta."""
    sm = make_manager(make_config(kvpool_yaml(kvpool_pool.master, layout="raw", serde="kivi")), model_name)
    rbs = [b for n, b in sm.storage_backends.items() if n.startswith("RemoteBackend")]
    assert len(rbs) == 1 and rbs[0].connection is None
    sm = make_manager(make_config(kvpool_yaml(kvpool_pool.master, serde="kivi")), model_name)
    assert connector(sm).layout == "meta"
