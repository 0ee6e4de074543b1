"""kvpool as an LMCache remote store: ``KvPoolConnector`` (LMCache's ``RemoteConnector``) and
``KvPoolConnectorAdapter`` (its ``ConnectorAdapter``), loaded by LMCache's remote storage plugin
framework. The design note is in :mod:`kvpool.lmcache`; the settings in :mod:`kvpool.lmcache.settings`.

This module imports LMCache (0.5.6, ``peers/lmcache``); ``import kvpool.lmcache`` does not,
so a missing LMCache surfaces here as an ImportError that names it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Iterable, List, Optional, Sequence

try:
    from lmcache.utils import CacheEngineKey  # type: ignore[import-not-found]
    from lmcache.v1.memory_management import MemoryObj  # type: ignore[import-not-found]
    from lmcache.v1.protocol import RemoteMetadata  # type: ignore[import-not-found]
    from lmcache.v1.storage_backend.connector import (  # type: ignore[import-not-found]
        ConnectorAdapter, ConnectorContext,
    )
    from lmcache.v1.storage_backend.connector.base_connector import (  # type: ignore[import-not-found]
        RemoteConnector,
    )
except ImportError as e:  # pragma: no cover - the engine-free suite never imports this module
    raise ImportError(f"kvpool.lmcache needs LMCache (tested with lmcache==0.5.6, see peers/lmcache): "
                      f"{e}") from e

from ..buffers import as_memoryview
from ..client import Client
from ..results import MISS, TOO_SMALL, PutStatus
from .settings import PLUGIN_TYPE, Settings, SettingsError, choose_layout, plugin_type, pool_key

log = logging.getLogger("kvpool.lmcache")

class KvPoolConnector(RemoteConnector):  # type: ignore[misc]
    """LMCache's remote connector over a kvpool pool (see :mod:`kvpool.lmcache` for the layout)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, local_cpu_backend: Any, config: Any,
                 plugin_name: Optional[str] = None, metadata: Any = None,
                 client: Optional[Client] = None) -> None:
        if metadata is None:
            metadata = getattr(local_cpu_backend, "metadata", None)
        if metadata is None:
            raise SettingsError("kvpool.lmcache: no LMCacheMetadata (neither the connector context nor the local CPU "
                                "backend has one)")
        super().__init__(config, metadata)  # shapes, dtypes, format, chunk sizes, the RemoteMetadata format
        self.settings = Settings.from_extra_config(getattr(config, "extra_config", None), plugin_name)
        self.layout = choose_layout(self.settings, getattr(config, "remote_serde", None),
                                    bool(getattr(config, "use_layerwise", False)))
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.client = client if client is not None else Client(self.settings.master, timeout=self.settings.timeout)
        self.closed = False
        log.info("kvpool.lmcache: plugin %s on pool %s, layout %s, key prefix %r, reset %s", self.settings.plugin_name,
                 self.client.master, self.layout, self.settings.key_prefix, self.settings.reset)

    def __repr__(self) -> str:
        return f"<KvPoolConnector {self.settings.plugin_name} {self.client.master} layout={self.layout}>"

    # ------------------------------------------------------------------------------------ keys

    def pool_key(self, key: CacheEngineKey) -> str:
        """The pool key of an LMCache key (``key_prefix`` + ``CacheEngineKey.to_string()``)."""
        return pool_key(self.settings.key_prefix, key.to_string())

    def _pool_keys(self, keys: Iterable[CacheEngineKey]) -> list[str]:
        return [self.pool_key(k) for k in keys]

    # ---------------------------------------------------------------------------------- lookup

    async def exists(self, key: CacheEngineKey) -> bool:
        return bool(await asyncio.to_thread(self.client.exists, self.pool_key(key)))

    def exists_sync(self, key: CacheEngineKey) -> bool:
        return bool(self.client.exists(self.pool_key(key)))

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: List[CacheEngineKey]) -> int:
        """How many of ``keys``, in order, the pool holds: one PREFIX_MATCH at the master."""
        return self.client.prefix_match(self._pool_keys(keys)) if keys else 0

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: List[CacheEngineKey], pin: bool = False) -> int:
        if not keys:
            return 0
        return int(await asyncio.to_thread(self.client.prefix_match, self._pool_keys(keys)))

    # ------------------------------------------------------------------------------------ puts

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        await self.batched_put([key], [memory_obj])

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: Sequence[CacheEngineKey], memory_objs: Sequence[MemoryObj]) -> None:
        """Stores the chunks with one reservation at the master and one write per node. The caller's
        references keep the objects alive until this returns (LMCache's InstrumentedRemoteConnector
        drops them after), so no timeout may end it early while the bytes are still being sent."""
        if not keys:
            return
        pks = self._pool_keys(keys)
        values = [self._value(o) for o in memory_objs]
        statuses = await asyncio.to_thread(self.client.put_batch, pks, values, replicas=self.settings.replicas)
        failed = [(k, s) for k, s in zip(pks, statuses) if s not in (PutStatus.OK, PutStatus.ALREADY_EXISTS)]
        if failed:
            kinds = sorted({s.value for _, s in failed})
            level = logging.INFO if kinds == [PutStatus.FENCED.value] else logging.WARNING
            log.log(level, "kvpool.lmcache: %d of %d chunk(s) not stored (%s), first %r", len(failed), len(pks),
                    ", ".join(kinds), failed[0][0])

    def _value(self, obj: MemoryObj) -> Any:
        payload = as_memoryview(obj.byte_array, what="LMCache memory object")
        if self.layout == "raw":
            return payload  # sent from the object's own memory
        header = RemoteMetadata(payload.nbytes, obj.get_shapes(), obj.get_dtypes(), obj.get_memory_format()).serialize()
        assert len(header) == self.remote_metadata_bytes
        return b"".join((header, payload))

    # ------------------------------------------------------------------------------------ gets

    async def get(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        return (await self.batched_get([key]))[0]

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: List[CacheEngineKey]) -> List[Optional[MemoryObj]]:
        if not keys:
            return []
        if self.layout == "raw":
            return await self._get_raw(keys)
        return await self._get_meta(keys)

    def _allocate(self, shapes: Any, dtypes: Any, fmt: Any) -> Optional[MemoryObj]:
        # no busy loop: this runs on LMCache's event loop, which the puts that would free memory also need
        return self.local_cpu_backend.allocate(shapes, dtypes, fmt, eviction=True, busy_loop=False)

    async def _get_raw(self, keys: List[CacheEngineKey]) -> List[Optional[MemoryObj]]:
        """Reads each value straight into a full-chunk memory object, then trims it to the tokens read."""
        objs: list[Optional[MemoryObj]] = [self._allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt)
                                           for _ in keys]
        want = [i for i, o in enumerate(objs) if o is not None]
        if len(want) < len(keys):
            log.warning("kvpool.lmcache: no local CPU memory for %d of %d chunk(s); they read as misses",
                        len(keys) - len(want), len(keys))
        pks = self._pool_keys(keys)
        lengths = await asyncio.to_thread(self._read_into, [pks[i] for i in want],
                                          [as_memoryview(objs[i].byte_array, writable=True)  # type: ignore[union-attr]
                                           for i in want])
        out: list[Optional[MemoryObj]] = [None] * len(keys)
        for i, n in zip(want, lengths):
            obj = objs[i]
            assert obj is not None
            if n == MISS:
                obj.ref_count_down()
                continue
            try:
                out[i] = self.reshape_partial_chunk(obj, n)
            except ValueError as e:
                log.warning("kvpool.lmcache: %r holds %d bytes, not a whole number of this engine's tokens (%s); "
                            "read as a miss (a writer with another model shape or layout 'meta'?)", pks[i], n, e)
                obj.ref_count_down()
        return out

    def _read_into(self, pks: list[str], views: list[memoryview]) -> list[int]:
        """``get_into_batch``; a value larger than its buffer (another shape or layout under the key) is a miss."""
        if not pks:
            return []
        out = self.client.get_into_batch(pks, views)
        for k, v, n in zip(pks, views, out):
            if n == TOO_SMALL:
                log.warning("kvpool.lmcache: %r is larger than this engine's %d-byte chunk; read as a miss", k, v.nbytes)
        return [MISS if n == TOO_SMALL else n for n in out]

    async def _get_meta(self, keys: List[CacheEngineKey]) -> List[Optional[MemoryObj]]:
        """Reads whole values, then allocates each object from the shapes in its header."""
        pks = self._pool_keys(keys)
        values = await asyncio.to_thread(self.client.get_batch, pks)
        return [None if v is None else self._from_meta_value(k, v) for k, v in zip(pks, values)]

    def _from_meta_value(self, pk: str, value: bytes) -> Optional[MemoryObj]:
        h = self.remote_metadata_bytes
        if len(value) < h:
            log.warning("kvpool.lmcache: %r has %d bytes, less than LMCache's %d-byte header; read as a miss",
                        pk, len(value), h)
            return None
        try:
            meta = RemoteMetadata.deserialize(value[:h])
        except Exception as e:  # noqa: BLE001 - a foreign or corrupt header is a miss, never a crash
            log.warning("kvpool.lmcache: %r has no valid LMCache header (%s); read as a miss", pk, e)
            return None
        if meta.length != len(value) - h:
            log.warning("kvpool.lmcache: %r header says %d bytes, the value has %d; read as a miss",
                        pk, meta.length, len(value) - h)
            return None
        obj = self._allocate(meta.shapes, meta.dtypes, meta.fmt)
        if obj is None:
            log.warning("kvpool.lmcache: no local CPU memory for %r; read as a miss", pk)
            return None
        dst = as_memoryview(obj.byte_array, writable=True)
        if dst.nbytes != meta.length:
            log.warning("kvpool.lmcache: %r: an object of the header's shapes has %d bytes, the header says %d; "
                        "read as a miss", pk, dst.nbytes, meta.length)
            obj.ref_count_down()
            return None
        dst[:] = memoryview(value)[h:]
        return obj

    # ------------------------------------------------------------------------- removal, reset

    def remove_sync(self, key: CacheEngineKey) -> bool:
        """Removes one chunk (LMCache's ``StorageManager.remove`` / ``LMCacheEngine.clear(tokens)``)."""
        return bool(self.client.remove(self.pool_key(key)))

    def clear(self) -> int:
        """The reset: ``remove_all(force=True)`` (empties the pool and fences puts in flight) or, with
        ``reset: prefix``, removes the keys under ``key_prefix``. The number of objects removed."""
        if self.settings.reset == "prefix":
            n = self.client.remove_prefix(self.settings.key_prefix)
        else:
            n = self.client.remove_all(force=True)
        log.info("kvpool.lmcache: reset (%s) removed %d object(s)", self.settings.reset, n)
        return n

    # ------------------------------------------------------------------------------- the rest

    async def list(self) -> List[str]:
        """Not offered: a kvpool master lists no keys (LMCache uses ``list`` only for diagnostics)."""
        return []

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        """0 when the master answers, 1 otherwise (LMCache's health check reads non-zero as down)."""
        try:
            await asyncio.to_thread(self.client.ping)
            return 0
        except Exception as e:  # noqa: BLE001
            log.warning("kvpool.lmcache: ping of %s failed: %s", self.client.master, e)
            return 1

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.client.close()


class KvPoolConnectorAdapter(ConnectorAdapter):  # type: ignore[misc]
    """Builds a ``KvPoolConnector`` for ``plugin://kvpool`` (``remote_storage_plugins: ["kvpool"]``) with
    the plugin's name and LMCache's metadata from the connector context."""

    def __init__(self) -> None:
        super().__init__(f"plugin://{PLUGIN_TYPE}")

    def can_parse(self, url: str) -> bool:
        return url.startswith("plugin://") and plugin_type(url[len("plugin://"):]) == PLUGIN_TYPE

    def create_connector(self, context: ConnectorContext) -> KvPoolConnector:
        return KvPoolConnector(loop=context.loop, local_cpu_backend=context.local_cpu_backend, config=context.config,
                               plugin_name=context.plugin_name, metadata=context.metadata)


def remote_connectors(target: Any) -> list[Any]:
    """The remote connectors inside an ``LMCacheEngine``, a ``StorageManager`` or a ``RemoteBackend``
    (unwrapped from LMCache's ``InstrumentedRemoteConnector``)."""
    sm = getattr(target, "storage_manager", None)
    backends = getattr(sm if sm is not None else target, "storage_backends", None)
    found = list(backends.values()) if backends is not None else [target]
    out = []
    for b in found:
        conn = getattr(b, "connection", None)
        if conn is not None:
            out.append(getattr(conn, "_connector", conn))
    return out


def reset(target: Any, local: bool = True) -> int:
    """Empties what LMCache keeps remotely, and locally unless ``local`` is False, for an
    ``LMCacheEngine``, ``StorageManager`` or ``RemoteBackend``: every kvpool connector's ``clear()`` and
    every Mooncake connector's ``store.remove_all(True)`` (LMCache 0.5.6's own ``clear()`` skips remote
    backends). Returns the number of remote objects removed."""
    removed = 0
    for c in remote_connectors(target):
        if isinstance(c, KvPoolConnector):
            removed += c.clear()
        elif hasattr(getattr(c, "store", None), "remove_all"):
            n = c.store.remove_all(True)
            if n < 0:
                raise RuntimeError(f"remove_all on {c!r} failed with Mooncake code {n}")
            removed += n
        else:
            log.warning("kvpool.lmcache.reset: %r has no reset; left as it is", c)
    if local:
        sm = getattr(target, "storage_manager", target)
        if hasattr(sm, "clear") and hasattr(sm, "storage_backends"):
            sm.clear(["LocalCPUBackend", "LocalDiskBackend"])
    return removed


__all__ = ["KvPoolConnector", "KvPoolConnectorAdapter", "remote_connectors", "reset"]
