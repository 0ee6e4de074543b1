"""Mooncake's tensor helpers on the store, first part: whole tensors (``put_tensor``, ``get_tensor`` and their
batch, upsert and ``pub`` forms), tensor objects in buffers by address (``*_from``, ``*_into``), the CUDA
reads (refused: host memory only) and tensor parallelism (``*_with_tp*``). The ``*_with_parallelism*``
calls and the safetensors export and import are the second part, tensors_parallel.py.

Objects are Mooncake's own bytes (tensor_layout.py), so an object kvpool stores reads in Mooncake and the
reverse. PyTorch is imported only by the calls that need it; without it those calls log why and fail as
Mooncake does (-600, or None).
"""

from __future__ import annotations

import copy
import importlib
from typing import TYPE_CHECKING, Any, Optional, Sequence

from .args import _host_memory, _keys_arg, _str_arg, _uint, _uint_list
from .codes import _INVALID, _OK, log
from .parallelism import _Axis, _Spec, _Src, _i32, _list_arg, _parallel_key, _shard_meta, _tp_key, _with_tp
from .tensor_layout import (META_SIZE, _DTYPES, _Meta, _dtype_code, _gather_shard, _host_tensor, _object, _shard_range,
                            _tensor_of, _uniform_ok, _user_memory, _valid)
from .transfer import _Item, get_values

__all__: list[str] = []


def _torch(ctx: str) -> Any:
    """The torch module, or None after logging that PyTorch is missing."""
    try:
        return importlib.import_module("torch")
    except ImportError:
        log.error("kvpool.mooncake %s: PyTorch is not installed; Mooncake's tensor calls need torch", ctx)
        return None


# ------------------------------------------------------------------------------------- the mixin

def _config_error(config: Any) -> int:
    """Mooncake's validate_replicate_config for pub calls: preferred_segments, when given, name one segment
    per replica."""
    if config is None:
        return _OK
    segs = getattr(config, "preferred_segments", None) or []
    n = int(getattr(config, "replica_num", 1) or 0)
    if segs and len(segs) != n:
        log.error("kvpool.mooncake: preferred segments size (%d) must match replica_num (%d)", len(segs), n)
        return _INVALID
    return _OK


def _groups_ok(config: Any, n: int, ctx: str) -> bool:
    g = getattr(config, "group_ids", None) if config is not None else None
    if g is not None and len(g) != n:
        log.error("kvpool.mooncake %s: group_ids size must match keys size", ctx)
        return False
    return True


def _regroup(config: Any, index: Sequence[int]) -> Any:
    """The config for the keys of a batch at ``index``, which may repeat (their group ids, in that order)."""
    g = getattr(config, "group_ids", None) if config is not None else None
    if g is None:
        return config
    c = copy.copy(config)
    c.group_ids = [g[i] for i in index if i < len(g)]
    return c


class _TensorMethods:
    """The tensor methods of ``MooncakeDistributedStore`` (a mixin; the store class composes it)."""

    if TYPE_CHECKING:  # what the methods here use of the store core
        def _require(self, what: str) -> Any: ...

        def _write(self, op: str, items: Sequence[Optional[_Item]], config: Any, upsert: bool) -> list[int]: ...

        def put_from(self, key: str, buffer_ptr: int, size: int, config: Any = None) -> int: ...

        def upsert_from(self, key: str, buffer_ptr: int, size: int, config: Any = None) -> int: ...

        def batch_put_from(self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int],
                           config: Any = None) -> list[int]: ...

        def batch_upsert_from(self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int],
                              config: Any = None) -> list[int]: ...

        def get_into(self, key: str, buffer_ptr: int, size: int) -> int: ...

        def batch_get_into(self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]) -> list[int]:
            ...

    # ----------------------------------------------------------------------------- plumbing

    def _t_write(self, op: str, objs: Sequence[tuple[str, Optional[Any]]], config: Any,
                 upsert: bool, groups: bool = True) -> list[int]:
        """Stores each (key, object bytes) pair (None: already refused, -600); a code per pair."""
        if groups and not _groups_ok(config, len(objs), op):
            return [_INVALID] * len(objs)
        if not objs:
            return []
        items = [None if v is None else _Item(k, view=memoryview(v)) for k, v in objs]
        return self._write(op, items, config, upsert)

    def _t_fetch(self, op: str, keys: list[str]) -> Optional[list[Optional[bytes]]]:
        client = self._require(op)
        if client is None:
            return None
        return get_values(client, keys, op)

    def _t_load(self, op: str, key: str) -> Optional[_Src]:
        got = self._t_fetch(op, [key])
        data = got[0] if got else None
        if data is None:
            return None
        meta = _Meta.parse(data, len(data))
        return None if meta is None else _Src(key, meta, data)

    def _t_sources(self, keys: list[str], ctx: str) -> Optional[list[_Src]]:
        got = self._t_fetch(ctx, keys)
        if got is None:
            return None
        out = []
        for k, data in zip(keys, got):
            meta = _Meta.parse(data, len(data)) if data is not None else None
            if meta is None or data is None:
                log.error("kvpool.mooncake %s: missing reconstructed shard source for key %r", ctx, k[:80])
                return None
            out.append(_Src(k, meta, data))
        return out

    def _t_objects(self, op: str, keys: list[str]) -> list[Any]:
        """A tensor or None per key."""
        got = self._t_fetch(op, keys)
        if got is None:
            return [None] * len(keys)
        if all(v is None for v in got):
            return [None] * len(keys)
        torch = _torch(op)
        if torch is None:
            return [None] * len(keys)
        return [None if v is None else _tensor_of(torch, bytearray(v), len(v), op) for v in got]

    def _t_raw(self, ptr: int, size: int, ctx: str) -> Optional[tuple[_Meta, Any]]:
        """The metadata of the tensor object at [ptr, +size) and that memory, None (logged) if it is not one."""
        if ptr == 0:
            log.error("kvpool.mooncake %s: buffer pointer cannot be null", ctx)
            return None
        if size < META_SIZE:
            log.error("kvpool.mooncake %s: buffer size too small for tensor metadata", ctx)
            return None
        if not _host_memory.check(ptr, size, writable=False):
            log.error("kvpool.mooncake %s: [0x%x, +%d) is not readable host memory (device memory?); kvpool reads "
                      "host memory only", ctx, ptr, size)
            return None
        mem = _user_memory(ptr, size)
        meta = _Meta.parse(memoryview(mem).cast("B"), size)
        if meta is None:
            log.error("kvpool.mooncake %s: invalid tensor metadata", ctx)
            return None
        return meta, mem

    def _t_into_tensor(self, ptr: int, total: int, ctx: str) -> Any:
        torch = _torch(ctx)
        if torch is None:
            return None
        return _tensor_of(torch, _user_memory(ptr, total), total, ctx)

    # --------------------------------------------------------------------------- whole tensors

    def _t_put_one(self, op: str, key: str, tensor: Any, config: Any,
                   upsert: bool) -> int:
        torch = _torch(op)
        host = _host_tensor(torch, tensor, key, op) if torch is not None else None
        obj = None if host is None else _valid(_object(_Meta(host.code, host.shape, host.shape), host.ptr,
                                                       host.nbytes))
        if obj is None:
            return _INVALID
        return self._t_write(op, [(key, obj)], config, upsert)[0]

    def _t_put_many(self, op: str, keys: list[str], tensors: list[Any], config: Any,
                    upsert: bool) -> list[int]:
        if len(tensors) != len(keys):
            log.error("kvpool.mooncake %s: keys and tensors size mismatch", op)
            return [_INVALID] * len(keys)
        torch = _torch(op) if keys else None
        objs: list[tuple[str, Optional[Any]]] = []
        for k, t in zip(keys, tensors):
            host = _host_tensor(torch, t, k, op) if torch is not None else None
            objs.append((k, None if host is None else _valid(
                _object(_Meta(host.code, host.shape, host.shape), host.ptr, host.nbytes))))
        return self._t_write(op, objs, config, upsert)

    def _t_batch_entry(self, op: str, keys: Any, tensors_list: Any, config: Any,
                       upsert: bool, pub: bool) -> list[int]:
        ks = _keys_arg(keys)
        tl = _list_arg(tensors_list, "tensors_list")
        if self._t_batch_refused(op, ks, tl, config, pub):
            return [_INVALID] * len(ks)
        return self._t_put_many(op, ks, tl, config, upsert)

    def _t_batch_refused(self, op: str, ks: list[str], tl: list[Any], config: Any, pub: bool) -> bool:
        """Whether a batch of tensors gets -600 per key: before setup, no keys, lists of different lengths
        (logged), or (``pub``) a config Mooncake refuses."""
        if self._require(op) is None:
            return True
        if len(ks) != len(tl) or not ks:
            if ks:
                log.error("kvpool.mooncake %s: size mismatch (%d keys, %d tensors)", op, len(ks), len(tl))
            return True
        return bool(pub and _config_error(config))

    def put_tensor(self, key: str, tensor: Any) -> int:
        """Stores a PyTorch tensor as Mooncake's tensor object ``[TensorMetadata][data]``: 0 (also when the
        key exists, leaving it unchanged), -600 for a non-tensor, an unsupported dtype or before setup,
        another negative code on failure."""
        k = _str_arg(key, "key")
        if self._require("put_tensor") is None:
            return _INVALID
        return self._t_put_one("put_tensor", k, tensor, None, False)

    def upsert_tensor(self, key: str, tensor: Any) -> int:
        """``put_tensor`` that replaces an existing object: 0 or a negative code."""
        k = _str_arg(key, "key")
        if self._require("upsert_tensor") is None:
            return _INVALID
        return self._t_put_one("upsert_tensor", k, tensor, None, True)

    def pub_tensor(self, key: str, tensor: Any, config: Any = None) -> int:
        """``put_tensor`` with a ReplicateConfig (replicas, preferred segments, pins): 0 or a negative code
        (-600 when ``preferred_segments`` does not name ``replica_num`` segments)."""
        k = _str_arg(key, "key")
        if self._require("pub_tensor") is None:
            return _INVALID
        code = _config_error(config)
        return code or self._t_put_one("pub_tensor", k, tensor, config, False)

    def upsert_pub_tensor(self, key: str, tensor: Any, config: Any = None) -> int:
        """``pub_tensor`` that replaces an existing object: 0 or a negative code."""
        k = _str_arg(key, "key")
        if self._require("upsert_pub_tensor") is None:
            return _INVALID
        code = _config_error(config)
        return code or self._t_put_one("upsert_pub_tensor", k, tensor, config, True)

    def batch_put_tensor(self, keys: Sequence[str], tensors_list: list) -> list[int]:
        """``put_tensor`` for many keys: a code per key ([] for no keys, -600 each when the lists' lengths
        differ)."""
        return self._t_batch_entry("batch_put_tensor", keys, tensors_list, None, False, False)

    def batch_upsert_tensor(self, keys: Sequence[str], tensors_list: list) -> list[int]:
        """``upsert_tensor`` for many keys: a code per key."""
        return self._t_batch_entry("batch_upsert_tensor", keys, tensors_list, None, True, False)

    def batch_pub_tensor(self, keys: Sequence[str], tensors_list: list,
                         config: Any = None) -> list[int]:
        """``pub_tensor`` for many keys with one config: a code per key."""
        return self._t_batch_entry("batch_pub_tensor", keys, tensors_list, config, False, True)

    def batch_upsert_pub_tensor(self, keys: Sequence[str], tensors_list: list,
                                config: Any = None) -> list[int]:
        """``upsert_pub_tensor`` for many keys with one config: a code per key."""
        return self._t_batch_entry("batch_upsert_pub_tensor", keys, tensors_list, config, True, True)

    def get_tensor(self, key: str) -> Any:
        """The tensor stored under ``key`` (a CPU tensor owning a copy of the bytes; a 0-d tensor comes back
        with shape ``(1,)`` as in Mooncake), or None: missing key, an object that is not a tensor object,
        before setup, no PyTorch."""
        k = _str_arg(key, "key")
        if self._require("get_tensor") is None:
            return None
        return self._t_objects("get_tensor", [k])[0]

    def batch_get_tensor(self, keys: Sequence[str]) -> list[Any]:
        """``get_tensor`` for many keys: a tensor or None per key."""
        ks = _keys_arg(keys)
        if self._require("batch_get_tensor") is None:
            return [None] * len(ks)
        return self._t_objects("batch_get_tensor", ks) if ks else []

    # ----------------------------------------------------------------------- buffers by address

    def _t_from_one(self, op: str, key: Any, buffer_ptr: Any, size: Any, config: Any,
                    upsert: bool) -> int:
        k = _str_arg(key, "key")
        ptr, n = _uint(buffer_ptr, "buffer_ptr"), _uint(size, "size")
        if ptr == 0:
            log.error("kvpool.mooncake %s: buffer pointer cannot be null", op)
            return _INVALID
        if self._require(op) is None:
            return _INVALID
        if self._t_raw(ptr, n, op) is None:
            return _INVALID
        return (self.upsert_from if upsert else self.put_from)(k, ptr, n, config)

    def _t_from_many(self, op: str, keys: Any, buffer_ptrs: Any, sizes: Any,
                     config: Any, upsert: bool) -> list[int]:
        ks = _keys_arg(keys)
        ptrs, ns = _uint_list(buffer_ptrs, "buffer_ptrs"), _uint_list(sizes, "sizes")
        if self._require(op) is None:
            return [_INVALID] * len(ks)
        if not ks:
            return []
        if not len(ks) == len(ptrs) == len(ns):
            log.error("kvpool.mooncake %s: keys, buffer_ptrs and sizes must have the same length", op)
            return [_INVALID] * len(ks)
        for i, (p, n) in enumerate(zip(ptrs, ns)):
            if self._t_raw(p, n, f"{op} (buffer at index {i})") is None:
                return [_INVALID] * len(ks)  # Mooncake refuses the whole batch
        return (self.batch_upsert_from if upsert else self.batch_put_from)(ks, ptrs, ns, config)

    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """Stores ``size`` bytes at ``buffer_ptr`` that hold a tensor object ``[TensorMetadata][data]`` (what
        ``get_tensor_into`` fills): 0, or -600 for a null pointer, a short buffer or invalid metadata."""
        return self._t_from_one("put_tensor_from", key, buffer_ptr, size, None, False)

    def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """``put_tensor_from`` that replaces an existing object: 0 or a negative code."""
        return self._t_from_one("upsert_tensor_from", key, buffer_ptr, size, None, True)

    def batch_put_tensor_from(self, keys: Sequence[str], buffer_ptrs: Sequence[int],
                              sizes: Sequence[int]) -> list[int]:
        """``put_tensor_from`` for many buffers: a code per key; one invalid buffer fails the whole batch
        (-600 each), as in Mooncake."""
        return self._t_from_many("batch_put_tensor_from", keys, buffer_ptrs, sizes, None, False)

    def batch_upsert_tensor_from(self, keys: Sequence[str], buffer_ptrs: Sequence[int],
                                 sizes: Sequence[int]) -> list[int]:
        """``upsert_tensor_from`` for many buffers: a code per key."""
        return self._t_from_many("batch_upsert_tensor_from", keys, buffer_ptrs, sizes, None, True)

    def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> Any:
        """Reads the tensor object into ``size`` bytes at ``buffer_ptr`` and returns a tensor over that memory
        (its data starts 304 bytes in), or None: missing key, buffer too small, not a tensor object, null
        pointer, before setup."""
        k = _str_arg(key, "key")
        ptr, n = _uint(buffer_ptr, "buffer_ptr"), _uint(size, "size")
        if self._require("get_tensor_into") is None:
            return None
        if ptr == 0:
            log.error("kvpool.mooncake get_tensor_into: buffer pointer cannot be null")
            return None
        got = self.get_into(k, ptr, n)
        if got < 0:
            log.error("kvpool.mooncake get_tensor_into %r failed with error code %d", k[:80], got)
            return None
        return self._t_into_tensor(ptr, got, "get_tensor_into")

    def batch_get_tensor_into(self, keys: Sequence[str], buffer_ptrs: Sequence[int],
                              sizes: Sequence[int]) -> list[Any]:
        """``get_tensor_into`` for many keys: a tensor or None per key; -600 per key (ints, as Mooncake
        answers) before setup, for lists of different lengths or a null pointer."""
        ks = _keys_arg(keys)
        ptrs, ns = _uint_list(buffer_ptrs, "buffer_ptrs"), _uint_list(sizes, "sizes")
        op = "batch_get_tensor_into"
        if self._require(op) is None:
            return [_INVALID] * len(ks)
        if not len(ks) == len(ptrs) == len(ns):
            log.error("kvpool.mooncake %s: keys, buffer_ptrs and sizes must have the same length", op)
            return [_INVALID] * len(ks)
        if any(p == 0 for p in ptrs):
            log.error("kvpool.mooncake %s: buffer pointer cannot be null", op)
            return [_INVALID] * len(ks)
        if not ks:
            return []
        got = self.batch_get_into(ks, ptrs, ns)
        out: list[Any] = []
        for k, p, n in zip(ks, ptrs, got):
            if n < 0:
                log.error("kvpool.mooncake %s %r failed with error code %d", op, k[:80], n)
                out.append(None)
            else:
                out.append(self._t_into_tensor(p, n, op))
        return out

    def get_tensor_into_cuda(self, key: str, tensor: Any) -> int:
        """Mooncake fills a CUDA tensor through CUDA IPC only with its dummy (standalone) client; with a real
        client, which is what ``setup`` gives, it answers -600, and so does kvpool (host memory only)."""
        _str_arg(key, "key")
        return self.batch_get_tensor_into_cuda([key], [tensor])[0]

    def batch_get_tensor_into_cuda(self, keys: Sequence[str],
                                   tensors_list: list) -> list[int]:
        """``get_tensor_into_cuda`` for many keys: -600 per key (see there); read with ``get_tensor_into``
        into host memory instead."""
        ks = _keys_arg(keys)
        tl = _list_arg(tensors_list, "tensors_list")
        op = "batch_get_tensor_into_cuda"
        if self._require(op) is None:
            return [_INVALID] * len(ks)
        if len(ks) != len(tl):
            log.error("kvpool.mooncake %s: keys and tensors size mismatch", op)
        else:
            log.error("kvpool.mooncake %s: CUDA IPC tensor reads need Mooncake's dummy client and device memory; "
                      "kvpool reads into host memory only (use get_tensor_into)", op)
        return [_INVALID] * len(ks)

    # ------------------------------------------------------------------------- tensor parallel

    def _t_tp_objects(self, op: str, key: str, tensor: Any, tp_size: int,
                      split_dim: int, catch: bool = True) -> Optional[list[tuple[str, Any]]]:
        """Every TP shard of a full tensor as (key, object): ``<key>_tp_<r>`` with a one-axis TP layout, or
        the parallelism keys of ``spec`` with its TP rank set to r. None (logged) when it cannot be split."""
        torch = _torch(op)
        if torch is None:
            return None
        try:
            code = _dtype_code(torch, tensor.dtype)
            if code < 0:
                log.error("kvpool.mooncake %s: unsupported tensor dtype for %r", op, key[:80])
                return None
            shape = [int(d) for d in tensor.shape]
            if not _uniform_ok(shape, split_dim, tp_size, op):
                return None
            out = []
            for rank in range(tp_size):
                start, extent = _shard_range(shape[split_dim], rank, tp_size)
                axes = [_Axis("tp", rank, tp_size, split_dim, None, None)]
                skey = _tp_key(key, rank)
                host = _host_tensor(torch, tensor.narrow(split_dim, start, extent), skey, op)
                meta = None if host is None else _shard_meta(code, shape, host.shape, axes, host.nbytes)
                obj = None if host is None or meta is None else _valid(_object(meta, host.ptr, host.nbytes))
                if obj is None:
                    return None
                out.append((skey, obj))
            return out
        except Exception as e:  # noqa: BLE001 - Mooncake catches and fails the put
            if not catch:
                raise
            log.error("kvpool.mooncake %s: failed to split tensor for %r: %s", op, key[:80], e)
            return None

    def _t_tp_one(self, op: str, key: str, tensor: Any, config: Any, tp_size: int,
                  split_dim: int) -> int:
        objs = self._t_tp_objects(op, key, tensor, tp_size, split_dim)
        if objs is None:
            return _INVALID
        codes = self._t_write(op, objs, config, False)
        return next((c for c in codes if c != _OK), _OK)

    def _t_tp_many(self, op: str, keys: list[str], tensors: list[Any], config: Any,
                   tp_size: int, split_dim: int) -> list[int]:
        out = [_INVALID] * len(keys)
        if not _groups_ok(config, len(keys), op):
            return out
        objs: list[tuple[str, Any]] = []
        done: list[int] = []
        try:
            for i, (k, t) in enumerate(zip(keys, tensors)):
                if t is None or not tuple(t.shape):  # an object without .shape aborts the batch, as in Mooncake
                    continue
                shards = self._t_tp_objects(op, k, t, tp_size, split_dim, catch=False)
                if shards is not None:
                    objs += shards
                    done.append(i)
        except Exception as e:  # noqa: BLE001
            log.error("kvpool.mooncake %s: batch put with TP failed: %s", op, e)
            return [_INVALID] * len(keys)
        if not objs:
            return out
        codes = self._t_write(op, objs, _regroup(config, [i for i in done for _ in range(tp_size)]), False,
                             groups=False)
        for j, i in enumerate(done):
            part = codes[j * tp_size:(j + 1) * tp_size]
            out[i] = next((c for c in part if c != _OK), _OK)
        return out

    def put_tensor_with_tp(self, key: str, tensor: Any, tp_rank: int = 0,
                           tp_size: int = 1, split_dim: int = 0) -> int:
        """Splits the tensor into ``tp_size`` equal shards along ``split_dim`` and stores shard r under
        ``<key>_tp_<r>`` (every shard, whatever ``tp_rank``); ``tp_size <= 1`` is ``put_tensor``. 0 or the first
        failing shard's code; -600 when the dim is out of range or not divisible, or not a tensor."""
        k = _str_arg(key, "key")
        _i32(tp_rank, "tp_rank")
        size, sd = _i32(tp_size, "tp_size"), _i32(split_dim, "split_dim")
        if self._require("put_tensor_with_tp") is None:
            return _INVALID
        if size <= 1:
            return self.put_tensor(k, tensor)
        return self._t_tp_one("put_tensor_with_tp", k, tensor, None, size, sd)

    def pub_tensor_with_tp(self, key: str, tensor: Any, config: Any = None,
                           tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> int:
        """``put_tensor_with_tp`` with a ReplicateConfig: 0 or a negative code."""
        k = _str_arg(key, "key")
        _i32(tp_rank, "tp_rank")
        size, sd = _i32(tp_size, "tp_size"), _i32(split_dim, "split_dim")
        if self._require("pub_tensor_with_tp") is None:
            return _INVALID
        code = _config_error(config)
        if code:
            return code
        if size <= 1:
            return self.pub_tensor(k, tensor, config)
        return self._t_tp_one("pub_tensor_with_tp", k, tensor, config, size, sd)

    def batch_put_tensor_with_tp(self, base_keys: Sequence[str], tensors_list: list,
                                 tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> list[int]:
        """``put_tensor_with_tp`` for many tensors: a code per key (a tensor that cannot be split gets -600; an
        element that is not tensor-like fails the whole batch, as in Mooncake)."""
        return self._t_tp_batch("batch_put_tensor_with_tp", base_keys, tensors_list, None, tp_rank, tp_size,
                                split_dim, False)

    def batch_pub_tensor_with_tp(self, base_keys: Sequence[str], tensors_list: list,
                                 config: Any = None, tp_rank: int = 0, tp_size: int = 1,
                                 split_dim: int = 0) -> list[int]:
        """``batch_put_tensor_with_tp`` with a ReplicateConfig: a code per key."""
        return self._t_tp_batch("batch_pub_tensor_with_tp", base_keys, tensors_list, config, tp_rank, tp_size,
                                split_dim, True)

    def _t_tp_batch(self, op: str, base_keys: Any, tensors_list: Any, config: Any,
                    tp_rank: Any, tp_size: Any, split_dim: Any, pub: bool) -> list[int]:
        ks = _keys_arg(base_keys)
        tl = _list_arg(tensors_list, "tensors_list")
        _i32(tp_rank, "tp_rank")
        size, sd = _i32(tp_size, "tp_size"), _i32(split_dim, "split_dim")
        if size <= 1:
            return (self.batch_pub_tensor(ks, tl, config) if pub else self.batch_put_tensor(ks, tl))
        if self._t_batch_refused(op, ks, tl, config, pub):
            return [_INVALID] * len(ks)
        return self._t_tp_many(op, ks, tl, config, size, sd)

    def _t_tp_raw_objects(self, op: str, key: str, meta: _Meta, mem: Any,
                          tp_size: int, split_dim: int, spec: Optional[_Spec] = None, decoded: bool = True,
                          only: Optional[int] = None) -> Optional[list[tuple[str, bytearray]]]:
        """The TP shards (all, or rank ``only``) of the tensor object in ``mem``, None (logged) if it cannot be
        split. ``decoded``: the object's local shape is the full shape (Mooncake decodes the buffer to a tensor
        first); else its global shape is kept and must match the local one (Mooncake's raw shard plan)."""
        shape = meta.local_shape
        global_shape = shape
        if not decoded:
            global_shape = meta.global_shape
            if any(d != split_dim and global_shape[d] != shape[d] for d in range(len(shape))):
                log.error("kvpool.mooncake %s: unsupported non-split local shape", op)
                return None
            if 0 <= split_dim < len(shape) and global_shape[split_dim] != shape[split_dim]:
                log.error("kvpool.mooncake %s: a shard object cannot be split again", op)
                return None
        if not _uniform_ok(shape, split_dim, tp_size, op):
            return None
        elem = _DTYPES[meta.dtype][1]
        out = []
        for rank in range(tp_size) if only is None else [only]:
            _, extent = _shard_range(shape[split_dim], rank, tp_size)
            local = list(shape)
            local[split_dim] = extent
            axes = _with_tp(spec, rank) if spec else [_Axis("tp", rank, tp_size, split_dim, None, None)]
            skey = _parallel_key(key, axes) if spec else _tp_key(key, rank)
            m = _shard_meta(meta.dtype, global_shape, local, axes, 0)
            if m is None:
                return None
            data = _gather_shard(mem, meta.data_offset, shape, elem, split_dim, rank, tp_size)
            m.data_bytes = len(data)
            obj = _valid(bytearray(m.pack() + data))
            if obj is None:
                log.error("kvpool.mooncake %s: invalid shard metadata for %r", op, skey[:80])
                return None
            out.append((skey, obj))
        return out

    def put_tensor_with_tp_from(self, key: str, buffer_ptr: int, size: int,
                                tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> int:
        """Splits the tensor object ``[TensorMetadata][data]`` at ``buffer_ptr`` into ``tp_size`` shards and
        stores them as ``put_tensor_with_tp`` does (``tp_size <= 1``: ``put_tensor_from``): 0 or a negative
        code (-600 for a buffer that is not a tensor object or a split that does not divide)."""
        k = _str_arg(key, "key")
        ptr, n = _uint(buffer_ptr, "buffer_ptr"), _uint(size, "size")
        _i32(tp_rank, "tp_rank")
        tps, sd = _i32(tp_size, "tp_size"), _i32(split_dim, "split_dim")
        op = "put_tensor_with_tp_from"
        if self._require(op) is None:
            return _INVALID
        if ptr == 0 or n < META_SIZE:
            log.error("kvpool.mooncake %s: %s", op, "buffer pointer cannot be null" if ptr == 0
                      else "buffer size too small for tensor metadata")
            return _INVALID
        if tps <= 1:
            return self.put_tensor_from(k, ptr, n)
        raw = self._t_raw(ptr, n, op)
        objs = None if raw is None else self._t_tp_raw_objects(op, k, raw[0], raw[1], tps, sd)
        if objs is None:
            return _INVALID
        codes = self._t_write(op, objs, None, False)
        return next((c for c in codes if c != _OK), _OK)

    def batch_put_tensor_with_tp_from(self, base_keys: Sequence[str],
                                      buffer_ptrs: Sequence[int], sizes: Sequence[int], tp_rank: int = 0,
                                      tp_size: int = 1, split_dim: int = 0) -> list[int]:
        """``put_tensor_with_tp_from`` for many buffers: a code per key (an invalid buffer fails its key)."""
        ks = _keys_arg(base_keys)
        ptrs, ns = _uint_list(buffer_ptrs, "buffer_ptrs"), _uint_list(sizes, "sizes")
        _i32(tp_rank, "tp_rank")
        tps, sd = _i32(tp_size, "tp_size"), _i32(split_dim, "split_dim")
        op = "batch_put_tensor_with_tp_from"
        if self._require(op) is None:
            return [_INVALID] * len(ks)
        if tps <= 1:
            return self.batch_put_tensor_from(ks, ptrs, ns)
        if not len(ks) == len(ptrs) == len(ns) or not ks:
            if ks:
                log.error("kvpool.mooncake %s: base_keys, buffer_ptrs and sizes must have the same length", op)
            return [_INVALID] * len(ks)
        out = [_OK] * len(ks)
        objs: list[tuple[str, Any]] = []
        done: list[int] = []
        for i, (k, p, n) in enumerate(zip(ks, ptrs, ns)):
            raw = self._t_raw(p, n, f"{op} (buffer at index {i})")
            shards = None if raw is None else self._t_tp_raw_objects(op, k, raw[0], raw[1], tps, sd)
            if shards is None:
                out[i] = _INVALID
                continue
            objs += shards
            done.append(i)
        if objs:
            codes = self._t_write(op, objs, None, False)
            for j, i in enumerate(done):
                out[i] = next((c for c in codes[j * tps:(j + 1) * tps] if c != _OK), _OK)
        return out

    def get_tensor_with_tp(self, key: str, tp_rank: int = 0, tp_size: int = 1,
                           split_dim: int = 0) -> Any:
        """The shard ``<key>_tp_<tp_rank>`` as a tensor (``tp_size <= 1``: ``get_tensor(key)``), or None."""
        k = _str_arg(key, "key")
        rank, size = _i32(tp_rank, "tp_rank"), _i32(tp_size, "tp_size")
        _i32(split_dim, "split_dim")
        return self.get_tensor(k if size <= 1 else _tp_key(k, rank))

    def batch_get_tensor_with_tp(self, base_keys: Sequence[str], tp_rank: int = 0,
                                 tp_size: int = 1) -> list[Any]:
        """``get_tensor_with_tp`` for many keys: a tensor or None per key."""
        ks = _keys_arg(base_keys)
        rank, size = _i32(tp_rank, "tp_rank"), _i32(tp_size, "tp_size")
        return self.batch_get_tensor(ks if size <= 1 else [_tp_key(k, rank) for k in ks])

    def get_tensor_with_tp_into(self, key: str, buffer_ptr: int, size: int,
                                tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> Any:
        """``get_tensor_into`` of the shard ``<key>_tp_<tp_rank>`` (``tp_size <= 1``: of ``key``): a tensor over
        the buffer, or None."""
        k = _str_arg(key, "key")
        ptr, n = _uint(buffer_ptr, "buffer_ptr"), _uint(size, "size")
        rank, tps = _i32(tp_rank, "tp_rank"), _i32(tp_size, "tp_size")
        _i32(split_dim, "split_dim")
        if self._require("get_tensor_with_tp_into") is None:
            return None
        return self.get_tensor_into(k if tps <= 1 else _tp_key(k, rank), ptr, n)

    def batch_get_tensor_with_tp_into(self, base_keys: Sequence[str],
                                      buffer_ptrs: Sequence[int], sizes: Sequence[int], tp_rank: int = 0,
                                      tp_size: int = 1) -> list[Any]:
        """``batch_get_tensor_into`` of each key's shard for ``tp_rank``: a tensor or None per key."""
        ks = _keys_arg(base_keys)
        ptrs, ns = _uint_list(buffer_ptrs, "buffer_ptrs"), _uint_list(sizes, "sizes")
        rank, tps = _i32(tp_rank, "tp_rank"), _i32(tp_size, "tp_size")
        if self._require("batch_get_tensor_with_tp_into") is None:
            return [None] * len(ks)
        return self.batch_get_tensor_into(ks if tps <= 1 else [_tp_key(k, rank) for k in ks], ptrs, ns)

