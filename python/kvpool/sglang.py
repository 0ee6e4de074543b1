"""SGLang HiCache storage backend over a kvpool: ``KvPoolStore`` (SGLang's L3 tier, ``--hicache-storage-backend``).

SGLang loads it through its ``dynamic`` backend (``StorageBackendFactory``, which imports ``module_path``
and calls ``class_name(storage_config, kwargs)``)::

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvpool", "module_path": "kvpool.sglang",
            "class_name": "KvPoolStore", "interface_v1": 1, "master": "10.0.0.5:50051"}'

``interface_v1: 1`` makes SGLang's HiCacheController use the zero-copy calls (``batch_get_v1`` /
``batch_set_v1``: values go straight between the host KV pool and the pool's nodes); without it the
controller uses the older tensor calls (``batch_get`` / ``batch_set`` of whole flat pages), which store
the same objects. Hybrid models (Mamba state, sliding-window, draft and other side pools) go through
the v2 calls (``batch_exists_v2`` / ``batch_get_v2`` / ``batch_set_v2``) whatever ``interface_v1`` says.

Other ``extra_config`` keys: ``master`` (``host:port`` or ``etcd://...``; default ``$KVPOOL_MASTER`` or
the JSON file named by ``$KVPOOL_CONFIG_PATH``, see ``kvpool.Client``), ``key_prefix`` (default
``"sglang/"``), ``replicas`` (copies per object, 0 = the master's default), ``timeout`` (seconds per
call, default 10), ``shared_memory`` (default true: same-host nodes are read and written through their
mapped segments).

Design
------
Keys. One object per page *component*, named ``{ns}{page_hash}{pool}{rank}_{component}``:

* ``ns`` = ``{key_prefix}{model}/{dtype}-{format}{shards}/``: the model name (``/`` -> ``-``), the anchor
  (KV) host pool's dtype, the byte order of a page in that pool's layout (below), and
  ``-pp{r}of{n}`` / ``-cp{r}of{n}`` / ``-dcp{r}of{n}-page{p}`` when pipeline, attention-context or
  decode-context parallelism is on. Pages stored in another dtype or order never load as this one.
* ``page_hash``: SGLang's page hash (a chain over the token ids; ``get_storage_hash_str``).
* ``pool``: empty for the KV pool, ``_{name}`` for a v2 side pool (``_mamba``, ``_swa``, ``_draft``...).
* ``rank``: ``_{tp_rank}_{tp_size}`` where a rank holds its own shard (MHA KV: each TP rank has its own
  heads; Mamba state; MHA side pools); none for MLA, whose KV is the same on every TP rank (SGLang
  lets only the shard writer store it). With ``should_split_heads`` (heterogeneous TP) an MHA rank
  writes and reads ``tp_lcm_size // tp_size`` head groups named by their ranks in the lcm space.
* ``component``: ``k`` and ``v`` for MHA-style pools, ``k`` for MLA, ``temporal`` and ``conv_{i}`` for
  Mamba, ``data`` for any other pool (everything of its page in one object).

Objects. A component is what the host pool's ``get_page_buffer_meta`` yields for it, in order:
piece ``j`` of a page belongs to component ``j % len(components)``. A one-piece component (K or V of
``page_first`` / ``page_first_direct`` / ``page_head``, MLA's ``page_first``, each Mamba state) is
written from and read into the host pool's memory directly (``RawBuffer``: no copy in Python). A
several-piece component is a *multi-buffer object*: its pieces concatenated in order (``layer_first``:
one piece per layer), gathered into a staging buffer on write and scattered back on read. Byte order of
a K (or V) object, which ``format`` names: ``tl`` = ``[token][layer][head][dim]`` (``page_first``),
``lt`` = ``[layer][token][head][dim]`` (``layer_first``, ``page_first_direct``), ``ht`` =
``[head][token][layer][dim]`` (``page_head``); MLA's the same with one head of ``kv_cache_dim``. The
tensor calls (``set``, ``batch_set``...) take SGLang's flat page (``get_data_page``), which is exactly K
then V (MHA) or K (MLA) in that order, and store it as those same objects, so both interfaces share
every page.

Semantics. Puts are ``put_batch`` (an existing key is kept: the page hash names the content, so
``ALREADY_EXISTS`` is success); a read succeeds only if every component object of the page is there
with exactly the expected length. ``batch_exists`` is one ``prefix_match`` on the pages' component keys.
``clear()`` removes this model's objects (``remove_prefix("{key_prefix}{model}/")``; every object when
both are empty). ``get_stats()`` returns SGLang's ``StorageMetrics`` (pages and GB/s per batch) when the
config enables storage metrics.
"""

from __future__ import annotations

import ctypes
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from .buffers import RawBuffer, as_memoryview
from .client import Client
from .errors import KvPoolError
from .results import PutStatus

try:
    from sglang.srt.mem_cache.hicache_storage import (  # type: ignore[import-not-found]
        HiCacheStorage,
        HiCacheStorageConfig,
        HiCacheStorageExtraInfo,
        PoolHitPolicy,
        PoolName,
        PoolTransfer,
        PoolTransferResult,
    )
except ImportError as _e:  # pragma: no cover - depends on the interpreter
    raise ImportError(f"kvpool.sglang needs SGLang (sglang==0.5.23, see peers/sglang/requirements.txt): {_e}") from _e

log = logging.getLogger("kvpool.sglang")

__all__ = ["KvPoolStore", "page_format"]

_PAGE_FORMATS = {"page_first": "tl", "layer_first": "lt", "page_first_direct": "lt", "page_head": "ht"}
_STORED = (PutStatus.OK, PutStatus.ALREADY_EXISTS)


def page_format(layout: str) -> str:
    """The byte-order tag of a page component stored from a host pool of ``layout`` (see the design note)."""
    return _PAGE_FORMATS.get(layout, layout)


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass
class _Obj:
    """One object of a transfer: its key, and the host memory it comes from or goes to."""

    key: str
    pieces: list[tuple[int, int]]  # (address, bytes) in order
    page: int  # index of its page in the call's key list
    slot: int  # index of its transfer (0 for v1)

    @property
    def size(self) -> int:
        return sum(n for _, n in self.pieces)


def _address(buf: bytearray) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


class KvPoolStore(HiCacheStorage):  # type: ignore[misc]
    """SGLang ``HiCacheStorage`` whose pages live in a kvpool (see the module docstring)."""

    def __init__(self, storage_config: Any = None, kwargs: Any = None) -> None:
        cfg = storage_config if storage_config is not None else HiCacheStorageConfig(
            tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
            enable_storage_metrics=False, is_page_first_layout=True, model_name=None)
        self.storage_config = cfg
        extra: dict[str, Any] = dict(cfg.extra_config or {})
        self.extra_config = extra
        self.is_mla = bool(cfg.is_mla_model)
        self.replicas = int(extra.get("replicas", 0))
        self.key_prefix = str(extra.get("key_prefix", "sglang/"))
        model = "-".join((cfg.model_name or "").split("/"))
        self.model = model
        client = kwargs.get("client") if isinstance(kwargs, dict) else None
        self.client: Client = client if client is not None else Client(
            extra.get("master"), timeout=float(extra.get("timeout", 10.0)),
            shared_memory=bool(extra.get("shared_memory", True)))
        # rank scopes: MHA KV (several with should_split_heads), and TP-sharded side pools
        self.tp_scope = f"_{cfg.tp_rank}_{cfg.tp_size}"
        self.split_factor = 1
        if getattr(cfg, "should_split_heads", False) and not self.is_mla:
            lcm = int(cfg.tp_lcm_size or cfg.tp_size)
            self.split_factor = lcm // cfg.tp_size
            self.kv_scopes = [f"_{cfg.tp_rank * self.split_factor + i}_{lcm}" for i in range(self.split_factor)]
        else:
            self.kv_scopes = [self.tp_scope]
        shards = ""
        if cfg.pp_size > 1:
            shards += f"-pp{cfg.pp_rank}of{cfg.pp_size}"
        if cfg.attn_cp_size > 1:
            shards += f"-cp{cfg.attn_cp_rank}of{cfg.attn_cp_size}"
        if getattr(cfg, "dcp_size", 1) > 1:
            shards += f"-dcp{cfg.dcp_rank}of{cfg.dcp_size}-page{cfg.logical_page_size}"
        self._shards = shards
        self._ns: Optional[str] = None
        self.mem_pool_host: Any = None
        self.registered_pools: dict[Any, Any] = {}
        self.enable_storage_metrics = bool(cfg.enable_storage_metrics)
        self.prefetch_pgs: list[int] = []
        self.backup_pgs: list[int] = []
        self.prefetch_bandwidth: list[float] = []
        self.backup_bandwidth: list[float] = []
        if kwargs is not None and not isinstance(kwargs, dict) and hasattr(kwargs, "get_page_buffer_meta"):
            self.register_mem_pool_host(kwargs)  # registered as a built-in: (storage_config, mem_pool_host)

    # ------------------------------------------------------------------------------ registration

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        self.mem_pool_host = mem_pool_host
        self._ns = (f"{self.key_prefix}{self.model}/{_dtype_name(getattr(mem_pool_host, 'dtype', 'uint8'))}-"
                    f"{page_format(str(getattr(mem_pool_host, 'layout', 'layer_first')))}{self._shards}/")

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        self.registered_pools[host_pool_name] = host_pool

    @property
    def namespace(self) -> str:
        """The key prefix of this rank's objects (set when SGLang registers the host KV pool)."""
        if self._ns is None:
            raise RuntimeError("KvPoolStore: no host KV pool registered yet (register_mem_pool_host)")
        return self._ns

    # ------------------------------------------------------------------------------ naming

    def _kv_components(self) -> list[str]:
        if self.is_mla:
            return ["_k"]
        return [f"{s}_{c}" for s in self.kv_scopes for c in ("k", "v")]

    def _components(self, name: Any, pool: Any) -> list[str]:
        """Key suffixes after the page hash, one per component, in the order of the pool's pieces."""
        if name == PoolName.KV or pool is None:
            return self._kv_components()
        tag = f"_{getattr(name, 'value', name)}"
        cls = {c.__name__ for c in type(pool).__mro__}
        if "MambaPoolHost" in cls:
            parts = [f"conv_{i}" for i in range(len(getattr(pool, "conv_buffer", None) or []))]
            if getattr(pool, "temporal_state_elem_size", 1) > 0:
                parts = ["temporal"] + parts
            return [f"{tag}{self.tp_scope}_{p}" for p in parts]
        if "MLATokenToKVPoolHost" in cls:
            return [f"{tag}_k"]
        if "MHATokenToKVPoolHost" in cls or (hasattr(pool, "k_buffer") and hasattr(pool, "v_buffer")):
            return [f"{tag}{self.tp_scope}_k", f"{tag}{self.tp_scope}_v"]
        return [f"{tag}_data" if self.is_mla else f"{tag}{self.tp_scope}_data"]

    def _keys(self, page_keys: Sequence[str], components: Sequence[str]) -> list[str]:
        ns = self.namespace
        return [f"{ns}{h}{c}" for h in page_keys for c in components]

    # ------------------------------------------------------------------------------ plans

    def _plan(self, page_keys: Sequence[str], host_indices: Any, pool: Any, components: Sequence[str],
              slot: int, kv: bool) -> list[_Obj]:
        """The objects of ``page_keys`` stored from / read into ``pool`` at ``host_indices``."""
        if kv and self.split_factor > 1:
            ptrs, sizes = pool.get_split_heads_page_buffer_meta(host_indices, self.split_factor)
        else:
            ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        n, c = len(page_keys), len(components)
        if n == 0:
            return []
        if len(ptrs) % n or (len(ptrs) // n) % c:
            raise ValueError(f"{type(pool).__name__}: {len(ptrs)} buffers for {n} pages do not split into "
                             f"{c} components per page ({list(components)})")
        per_page = len(ptrs) // n
        ns = self.namespace
        out = []
        for i, h in enumerate(page_keys):
            base = i * per_page
            for k, comp in enumerate(components):
                pieces = [(int(ptrs[base + j]), int(sizes[base + j])) for j in range(k, per_page, c)]
                out.append(_Obj(f"{ns}{h}{comp}", pieces, i, slot))
        return out

    # ------------------------------------------------------------------------------ I/O core

    def _put(self, objs: list[_Obj]) -> list[bool]:
        if not objs:
            return []
        values: list[Any] = []
        for o in objs:
            if len(o.pieces) == 1:
                values.append(RawBuffer(*o.pieces[0]))
            else:
                staging = bytearray(o.size)
                at = _address(staging)
                for ptr, size in o.pieces:
                    ctypes.memmove(at, ptr, size)
                    at += size
                values.append(staging)
        try:
            statuses = self.client.put_batch([o.key for o in objs], values, replicas=self.replicas)
        except (KvPoolError, ValueError, OSError) as e:
            log.warning("kvpool.sglang: put of %d objects failed: %s", len(objs), e)
            return [False] * len(objs)
        return [s in _STORED for s in statuses]

    def _get(self, objs: list[_Obj]) -> list[bool]:
        if not objs:
            return []
        dests: list[Any] = []
        for o in objs:
            dests.append(RawBuffer(*o.pieces[0]) if len(o.pieces) == 1 else bytearray(o.size))
        keys = [o.key for o in objs]
        try:  # a value larger than its buffer (another format under the key) reads as TOO_SMALL: a miss
            lengths = self.client.get_into_batch(keys, dests)
        except (KvPoolError, OSError) as e:
            log.warning("kvpool.sglang: get of %d objects failed: %s", len(objs), e)
            return [False] * len(objs)
        ok = []
        for o, d, n in zip(objs, dests, lengths):
            good = n == o.size
            if good and isinstance(d, bytearray):
                at = _address(d)
                for ptr, size in o.pieces:
                    ctypes.memmove(ptr, at, size)
                    at += size
            ok.append(good)
        return ok

    @staticmethod
    def _per_page(objs: list[_Obj], ok: list[bool], pages: int, slot: int = 0) -> list[bool]:
        out = [pages > 0] * pages
        for o, good in zip(objs, ok):
            if o.slot == slot and not good:
                out[o.page] = False
        return out

    def _record(self, prefetch: bool, pages: int, objs: list[_Obj], started: float) -> None:
        if not self.enable_storage_metrics or pages == 0:
            return
        gb = sum(o.size for o in objs) / 1e9
        rate = gb / max(time.perf_counter() - started, 1e-9)
        (self.prefetch_pgs if prefetch else self.backup_pgs).append(pages)
        (self.prefetch_bandwidth if prefetch else self.backup_bandwidth).append(rate)

    def _anchor_is_logical(self) -> bool:
        return self.mem_pool_host is not None and getattr(self.mem_pool_host, "kv_buffer", 0) is None

    # ------------------------------------------------------------------------------ v1 (zero copy)

    def batch_get_v1(self, keys: list[str], host_indices: Any,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> list[bool]:
        if self._anchor_is_logical():
            return [True] * len(keys)  # a logical anchor (DeepSeek V4) holds no KV: side pools carry it
        started = time.perf_counter()
        objs = self._plan(keys, host_indices, self.mem_pool_host, self._kv_components(), 0, True)
        result = self._per_page(objs, self._get(objs), len(keys))
        self._record(True, len(keys), objs, started)
        return result

    def batch_set_v1(self, keys: list[str], host_indices: Any,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> list[bool]:
        if self._anchor_is_logical():
            return [True] * len(keys)
        started = time.perf_counter()
        objs = self._plan(keys, host_indices, self.mem_pool_host, self._kv_components(), 0, True)
        result = self._per_page(objs, self._put(objs), len(keys))
        self._record(False, len(keys), objs, started)
        return result

    # ------------------------------------------------------------------------------ v0 (tensors)

    def _tensor_objs(self, key: str, tensor: Any, writable: bool) -> tuple[list[str], list[memoryview]]:
        """The component keys of page ``key`` and the slices of a flat page tensor they hold."""
        view = as_memoryview(tensor, writable=writable, what=f"page {key!r}")
        comps = self._kv_components()
        if view.nbytes % len(comps):
            raise ValueError(f"page {key!r} has {view.nbytes} bytes, not a multiple of {len(comps)} components")
        part = view.nbytes // len(comps)
        # the flat page is K (every head group) then V; the components go head group by head group
        chunks: list[memoryview] = []
        sf = 1 if self.is_mla else self.split_factor
        for q in range(len(comps)):
            group, kind = divmod(q, 1 if self.is_mla else 2)
            chunk = kind * sf + group
            chunks.append(view[chunk * part:(chunk + 1) * part])
        return self._keys([key], comps), chunks

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys: list[str], target_locations: Any = None, target_sizes: Any = None) -> list[Any]:
        if target_locations is None or len(target_locations) != len(keys):
            raise ValueError("KvPoolStore.batch_get needs one target tensor per key (a flat host page)")
        started = time.perf_counter()
        all_keys: list[str] = []
        views: list[memoryview] = []
        owner: list[int] = []
        for i, (k, t) in enumerate(zip(keys, target_locations)):
            ks, vs = self._tensor_objs(k, t, True)
            all_keys += ks
            views += vs
            owner += [i] * len(ks)
        ok = [True] * len(keys)
        try:  # a value larger than its buffer reads as TOO_SMALL, which fails only its page
            lengths = self.client.get_into_batch(all_keys, views)
        except (KvPoolError, OSError) as e:
            log.warning("kvpool.sglang: batch_get of %d pages failed: %s", len(keys), e)
            return [None] * len(keys)
        for j, n in enumerate(lengths):
            if n != views[j].nbytes:
                ok[owner[j]] = False
        if self.enable_storage_metrics and keys:
            nbytes = sum(v.nbytes for v in views)
            self.prefetch_pgs.append(len(keys))
            self.prefetch_bandwidth.append(nbytes / 1e9 / max(time.perf_counter() - started, 1e-9))
        return [t if good else None for t, good in zip(target_locations, ok)]

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        if values is None or len(values) != len(keys):
            raise ValueError("KvPoolStore.batch_set needs one value tensor per key (a flat host page)")
        if not keys:
            return True
        started = time.perf_counter()
        all_keys: list[str] = []
        views: list[memoryview] = []
        for k, t in zip(keys, values):
            ks, vs = self._tensor_objs(k, t.contiguous() if hasattr(t, "contiguous") else t, False)
            all_keys += ks
            views += vs
        try:
            statuses = self.client.put_batch(all_keys, views, replicas=self.replicas)
        except (KvPoolError, ValueError, OSError) as e:
            log.warning("kvpool.sglang: batch_set of %d pages failed: %s", len(keys), e)
            return False
        if self.enable_storage_metrics:
            self.backup_pgs.append(len(keys))
            self.backup_bandwidth.append(sum(v.nbytes for v in views) / 1e9
                                         / max(time.perf_counter() - started, 1e-9))
        return all(s in _STORED for s in statuses)

    # ------------------------------------------------------------------------------ existence

    def exists(self, key: str) -> bool:
        try:
            return all(self.client.batch_exists(self._keys([key], self._kv_components())))
        except KvPoolError as e:
            log.warning("kvpool.sglang: exists failed: %s", e)
            return False

    def batch_exists(self, keys: list[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        if not keys:
            return 0
        comps = self._kv_components()
        try:
            return self.client.prefix_match(self._keys(keys, comps)) // len(comps)
        except KvPoolError as e:
            log.warning("kvpool.sglang: batch_exists failed: %s", e)
            return 0

    def batch_exists_v2(self, keys: list[str], pool_transfers: Optional[list[PoolTransfer]] = None,
                        extra_info: Optional[HiCacheStorageExtraInfo] = None) -> PoolTransferResult:
        kv_pages = len(keys) if self._anchor_is_logical() else self.batch_exists(keys, extra_info)
        hit_count: dict[Any, int] = {PoolName.KV: kv_pages} if kv_pages else {}
        restorable = list(range(1, kv_pages + 1))
        if not restorable:
            return PoolTransferResult(0, hit_count, [])
        probes: list[tuple[PoolTransfer, int, int, int]] = []
        probe_keys: list[str] = []
        for t in pool_transfers or []:
            if t.hit_policy not in (PoolHitPolicy.ALL_PAGES, PoolHitPolicy.TRAILING_PAGES):
                raise ValueError(f"Unsupported pool hit policy: {t.hit_policy}")
            pool = self._pool(t.name)
            comps = self._components(t.name, pool)
            start = len(probe_keys)
            probe_keys += self._keys(keys[:kv_pages], comps)
            probes.append((t, len(comps), start, len(probe_keys)))
        try:
            found = self.client.batch_exists(probe_keys) if probe_keys else []
        except KvPoolError as e:
            log.warning("kvpool.sglang: batch_exists_v2 failed: %s", e)
            return PoolTransferResult(0, {}, [])
        for t, m, start, end in probes:
            if not restorable:
                break
            flags = found[start:end]
            page_ok = [all(flags[i * m:(i + 1) * m]) for i in range(kv_pages)]
            if t.hit_policy == PoolHitPolicy.ALL_PAGES:
                boundary = page_ok.index(False) if False in page_ok else kv_pages
                ok_ends = set(range(1, boundary + 1))
            else:  # TRAILING_PAGES: a prefix works when the window ending there is complete
                window = max(1, len(t.keys) if t.keys else 1)
                ok_ends = {end_ for end_ in range(1, kv_pages + 1)
                           if all(page_ok[max(0, end_ - window):end_])}
                boundary = max(ok_ends, default=0)
            if boundary:
                hit_count[t.name] = boundary
            restorable = [p for p in restorable if p in ok_ends]
        return PoolTransferResult(restorable[-1] if restorable else 0, hit_count, restorable)

    # ------------------------------------------------------------------------------ v2 (pools)

    def _pool(self, name: Any) -> Any:
        pool = self.registered_pools.get(name)
        if pool is None and name == PoolName.KV:
            pool = self.mem_pool_host
        if pool is None:
            raise ValueError(f"KvPoolStore: unregistered host pool {name!r} (register_mem_host_pool_v2)")
        return pool

    def _batch_io_v2(self, transfers: list[PoolTransfer], io: Callable[[list[_Obj]], list[bool]],
                     prefetch: bool) -> dict[Any, list[bool]]:
        started = time.perf_counter()
        objs: list[_Obj] = []
        results: dict[Any, list[bool]] = {}
        planned: list[tuple[int, PoolTransfer]] = []
        for slot, t in enumerate(transfers):
            keys = list(t.keys or [])
            pool = self._pool(t.name)
            if not keys:
                results[t.name] = []
                continue
            page = getattr(pool, "logical_page_size", None) or getattr(pool, "page_size", 1) or 1
            if t.host_indices is None or t.host_indices.numel() != len(keys) * page:
                log.error("kvpool.sglang: %s transfer has %s host indices for %d pages of %d",
                          t.name, None if t.host_indices is None else t.host_indices.numel(), len(keys), page)
                results[t.name] = [False] * len(keys)
                continue
            kv = t.name == PoolName.KV
            objs += self._plan(keys, t.host_indices, pool, self._components(t.name, pool), slot, kv)
            planned.append((slot, t))
        ok = io(objs)
        for slot, t in planned:
            results[t.name] = self._per_page(objs, ok, len(t.keys or []), slot)
        self._record(prefetch, sum(len(t.keys or []) for _, t in planned), objs, started)
        return results

    def batch_get_v2(self, transfers: list[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> dict[Any, list[bool]]:
        return self._batch_io_v2(transfers, self._get, True)

    def batch_set_v2(self, transfers: list[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> dict[Any, list[bool]]:
        return self._batch_io_v2(transfers, self._put, False)

    # ------------------------------------------------------------------------------ admin

    def clear(self) -> None:
        prefix = f"{self.key_prefix}{self.model}/" if self.model else self.key_prefix
        try:
            removed = self.client.remove_prefix(prefix) if prefix else self.client.remove_all()
        except KvPoolError as e:
            log.warning("kvpool.sglang: clear failed: %s", e)
            return
        log.info("kvpool.sglang: cleared %d objects under %r", removed, prefix)

    def get_stats(self) -> Any:
        from sglang.srt.observability.metrics_collector import StorageMetrics  # type: ignore[import-not-found]

        m = StorageMetrics()
        for name in ("prefetch_pgs", "backup_pgs", "prefetch_bandwidth", "backup_bandwidth"):
            got: list[Any] = getattr(self, name)
            getattr(m, name).extend(got)
            got.clear()
        return m

    def close(self) -> None:
        self.client.close()
