"""kvpool as a remote store of LMCache (``lmcache`` 0.5.6): a native backend through LMCache's remote
storage plugin framework.

Configuration (LMCache's yaml, ``LMCACHE_CONFIG_FILE``)::

    chunk_size: 256
    local_cpu: false
    max_local_cpu_size: 5                      # GB; LMCache stages remote chunks in this memory
    remote_serde: naive
    remote_storage_plugins: ["kvpool"]
    extra_config:
      remote_storage_plugin.kvpool.module_path: kvpool.lmcache
      remote_storage_plugin.kvpool.class_name: KvPoolConnectorAdapter
      remote_storage_plugin.kvpool.master: "10.0.0.5:50051"

Design
------
**Interface.** LMCache 0.5.6 offers third-party remote stores the *remote storage plugin* framework:
``remote_storage_plugins: [name]`` makes its ``StorageManager`` create a ``RemoteBackend`` for
``plugin://name``, and ``extra_config`` ``remote_storage_plugin.<name>.module_path`` / ``class_name``
name the class that serves it: a ``ConnectorAdapter`` or a ``RemoteConnector``. LMCache's own warnings
point there ("remote_url is deprecated ... use remote_storage_plugins"; the ``external://`` connector
"is due for deprecation ... use the Remote Storage Plugin Framework"), and it is the layer LMCache's
own Mooncake, Redis and fs stores live at, so kvpool sits beside them under the same
``RemoteBackend``, serde, local-CPU staging and lookup code. ``KvPoolConnectorAdapter`` is the class to
name (it receives the plugin's instance name and LMCache's metadata); ``KvPoolConnector`` (the
``RemoteConnector``) may be named directly too. The multiprocess mode's L2 adapters
(``plugin_l2_adapter``) are a different server-side API, not covered here.

**Keys.** A chunk's pool key is ``key_prefix`` (default ``lmcache/``) followed by
``CacheEngineKey.to_string()``: ``model@world_size@worker_id@chunk_hash_hex@dtype[@layer][@tag%value...]``.
Everything that makes two chunks' KV differ for the same tokens is in it (model, TP world and rank,
dtype, LMCache's chained chunk hash, and request tags such as a cache salt), and LMCache engines on
any host derive the same string, so they share chunks through the pool. A key over the pool's 512-byte
limit becomes ``key_prefix + "sha256:" + sha256(key)``.

**Object layout and metadata.** ``raw`` (the default when LMCache's serde is ``naive`` and chunks are
not layerwise): the value is the chunk's KV bytes exactly as LMCache's memory object holds them
(``KV_2LTD``: ``[2, layers, tokens, hidden]``, or the MLA format), written from that memory and read
straight into a memory object LMCache's local CPU backend allocates, with no copy in Python. Shapes,
dtypes and format are not stored: the reader takes them from its own ``LMCacheMetadata`` (the key
already pins model, world size and dtype), and the token count of a partial last chunk from the
value's length (LMCache's ``reshape_partial_chunk``; a length that is not a whole number of tokens is a
miss). ``meta`` (chosen when the serde is cachegen/kivi or chunks are layerwise, whose shapes vary):
the value is LMCache's own ``RemoteMetadata`` header (length, format, per group dtype and 4-D shape;
``4 * (2 + 5 * groups)`` bytes) then the bytes, the layout LMCache's Mooncake connector writes with
``save_chunk_meta``; the reader allocates from the header, at the cost of one copy each way.

**Calls.** Lookup is one ``PREFIX_MATCH`` at the master for a whole request (``batched_contains`` /
``batched_async_contains``), not one probe per chunk; stores are one ``put_batch`` (one reservation,
one write per node, shared memory when the node is on this host); reads one ``get_into_batch``.
Blocking pool calls run in threads, off LMCache's event loop. A put never times out early: LMCache
releases the memory object when ``batched_put`` returns, so returning while bytes are still being sent
would let them be overwritten. A put refused because a reset fenced it is logged, not raised.

**Reset.** ``KvPoolConnector.clear()``, or ``kvpool.lmcache.reset(engine_or_storage_manager)`` for every
remote connector LMCache holds: ``remove_all(force=True)`` by default, which also fences puts in flight
so none lands after the reset; ``reset: prefix`` removes only ``key_prefix``'s keys. LMCache 0.5.6's own
``LMCacheEngine.clear()`` never reaches remote backends (``RemoteBackend`` has no ``clear``); per-chunk
removal (``clear(tokens)``, ``StorageManager.remove``) does, through ``remove_sync``.

This package's ``__init__`` imports no LMCache: ``settings`` is engine-free; ``connector`` (and the
names below, loaded on first use) needs LMCache and raises an ImportError naming it when it is absent.
"""

from __future__ import annotations

from typing import Any

from .settings import LAYOUTS, PLUGIN_TYPE, RESETS, Settings, SettingsError, choose_layout, plugin_type, pool_key

_LAZY = ("KvPoolConnector", "KvPoolConnectorAdapter", "remote_connectors", "reset")

__all__ = ["LAYOUTS", "PLUGIN_TYPE", "RESETS", "Settings", "SettingsError", "choose_layout", "plugin_type", "pool_key",
           *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import connector
        return getattr(connector, name)
    raise AttributeError(f"module 'kvpool.lmcache' has no attribute {name!r}")
