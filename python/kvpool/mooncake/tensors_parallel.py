"""Mooncake's tensor helpers on the store, second part: the ``*_with_parallelism*`` calls (writes under a
``TensorParallelism`` or a writer partition, reads through a ``ReadTarget``) and the safetensors export and
import. The first part, tensors.py, holds the plumbing these use.

Reads of a parallel layout fetch the shards whole and rebuild the requested full tensor or shard here
(Mooncake reads byte ranges); the results and the codes are Mooncake's.
"""

from __future__ import annotations

import ctypes
import os
import threading
import uuid
from typing import TYPE_CHECKING, Any, Optional, Sequence

from .args import REQUIRED, _keys_arg, _str_arg, _uint, _uint_list
from .codes import _INVALID, _OK, log
from .parallelism import (_Axis, _Recon, _Spec, _Src, _Writer, _assemble, _canonical, _cast_str, _equal_by_kind,
                          _list_arg, _matches, _parallel_key, _parse_parallelism, _parse_target, _parse_writer,
                          _shard_meta, _single_tp, _spec_of, _tp_compatible, _tp_index, _tp_key, _validate, _with_tp,
                          _writer_key)
from .tensor_layout import (_SHARD, _Meta, _dtype_code, _host_tensor, _manifest, _object, _parse_manifest,
                            _read_safetensors, _safetensors_bytes, _shard_range, _tensor_of, _uniform_ok, _user_memory,
                            _valid)
from .tensors import _TensorMethods, _config_error, _groups_ok, _regroup, _torch

__all__: list[str] = []

#: Mooncake's FILE_NOT_FOUND (save_tensor_to_safetensor of a key that holds no tensor).
_FILE_NOT_FOUND = -1100


if TYPE_CHECKING:
    # For mypy this mixin extends _TensorMethods, whose methods (and the store core's it declares) the methods
    # here use. At run time it stands first among the store class's bases, beside _TensorMethods: same MRO.
    _Base = _TensorMethods
else:
    _Base = object


class _ParallelTensorMethods(_Base):
    """The parallelism and safetensors methods of ``MooncakeDistributedStore`` (a mixin; the store class
    composes it beside ``_TensorMethods``)."""

    if TYPE_CHECKING:  # what the methods here use of the store core besides
        _lock: threading.Lock
        _registered: dict[int, int]

    # ------------------------------------------------------------------ parallelism: writes

    def _t_write_request(self, parallelism: Any, writer_partition: Any,
                         ctx: str) -> Optional[tuple[str, Any]]:
        """("direct", None), ("writer", _Writer), ("tp", spec) or ("generic", spec); None (logged) if refused."""
        if writer_partition is not None:
            if parallelism is not None:
                log.error("kvpool.mooncake %s: writer_partition cannot be combined with parallelism", ctx)
                return None
            w = _parse_writer(writer_partition, ctx)
            return None if w is None else ("writer", w)
        if parallelism is None:
            return "direct", None
        spec = _validate(_parse_parallelism(parallelism), ctx)
        if spec is None:
            return None
        return ("tp" if _tp_index(spec) is not None else "generic"), spec

    def _t_par_write(self, op: str, key: str, tensor: Any, parallelism: Any,
                     config: Any, writer_partition: Any, upsert: bool) -> int:
        req = self._t_write_request(parallelism, writer_partition, op)
        if req is None:
            return _INVALID
        route, arg = req
        if self._require(op) is None:
            return _INVALID
        if route == "direct":
            return _config_error(config) or self._t_put_one(op, key, tensor, config, upsert)
        torch = _torch(op)
        if torch is None:
            return _INVALID
        try:
            shape = [int(d) for d in tensor.shape]
            code = _dtype_code(torch, tensor.dtype)
        except Exception as e:  # noqa: BLE001 - Mooncake lets the AttributeError out; kvpool answers -600
            log.error("kvpool.mooncake %s: input for %r is not a PyTorch tensor: %s", op, key[:80], e)
            return _INVALID
        if route == "writer":
            w: _Writer = arg
            if not 0 <= w.split_dim < len(shape):
                log.error("kvpool.mooncake %s: split_dim out of range", op)
                return _INVALID
            if not _uniform_ok(shape, w.split_dim, w.size, op):
                return _INVALID
            if code < 0:
                log.error("kvpool.mooncake %s: unsupported tensor dtype", op)
                return _INVALID
            start, extent = _shard_range(shape[w.split_dim], w.rank, w.size)
            skey = _writer_key(key, w.rank, w.size, w.split_dim)
            host = _host_tensor(torch, tensor.narrow(w.split_dim, start, extent), skey, op)
            axes = [_Axis("tp", w.rank, w.size, w.split_dim, None, None)]
            meta = None if host is None else _shard_meta(code, shape, host.shape, axes, host.nbytes)
            obj = None if host is None or meta is None else _valid(_object(meta, host.ptr, host.nbytes))
            if obj is None:
                log.error("kvpool.mooncake %s: invalid writer shard tensor info", op)
                return _INVALID
            return self._t_write(op, [(skey, obj)], config, upsert)[0] or self._t_write(
                op, [(key + "__writer_manifest", _manifest(shape, code, w.split_dim, w.size))], config, upsert,
                groups=False)[0]
        spec: _Spec = arg
        if code < 0:
            log.error("kvpool.mooncake %s: unsupported tensor dtype for %r", op, key[:80])
            return _INVALID
        ti = _tp_index(spec)
        if ti is None:  # no TP axis: the tensor as it is, under the parallelism key
            pkey = _parallel_key(key, spec)
            host = _host_tensor(torch, tensor, pkey, op)
            meta = None if host is None else _shard_meta(code, host.shape, host.shape, spec, host.nbytes)
            obj = None if host is None or meta is None else _valid(_object(meta, host.ptr, host.nbytes))
            return _INVALID if obj is None else self._t_write(op, [(pkey, obj)], config, upsert)[0]
        tp = spec[ti]
        sd = tp.split_dim if tp.split_dim is not None else 0
        pkey = _parallel_key(key, spec)
        if len(spec) == 1:  # one TP axis: the tensor is this rank's shard; the full shape is inferred
            if not 0 <= sd < len(shape):
                return _INVALID
            global_shape = list(shape)
            global_shape[sd] *= tp.size
            if not _uniform_ok(global_shape, sd, tp.size, op):
                return _INVALID
            host = _host_tensor(torch, tensor, pkey, op)
            meta = None if host is None else _shard_meta(code, host.shape, host.shape, spec, host.nbytes)
            if meta is not None:
                meta.global_shape = global_shape
        else:  # several axes: the tensor is the full tensor; this rank's shard is cut from it
            global_shape = shape
            if not _uniform_ok(global_shape, sd, tp.size, op):
                return _INVALID
            start, extent = _shard_range(shape[sd], tp.rank, tp.size)
            host = _host_tensor(torch, tensor.narrow(sd, start, extent), pkey, op)
            meta = None if host is None else _shard_meta(code, global_shape, host.shape, spec, host.nbytes)
        obj = None if host is None or meta is None else _valid(_object(meta, host.ptr, host.nbytes))
        if obj is None:
            return _INVALID
        return self._t_write(op, [(pkey, obj)], config, upsert)[0] or self._t_write(
            op, [(key + "__parallelism_manifest", _manifest(global_shape, code, sd, tp.size))], config, upsert,
            groups=False)[0]

    def _t_par_write_from(self, op: str, key: str, ptr: int, size: int,
                          parallelism: Any, config: Any, writer_partition: Any, upsert: bool) -> int:
        req = self._t_write_request(parallelism, writer_partition, op)
        if req is None:
            return _INVALID
        route, arg = req
        if route == "direct":
            if ptr == 0:
                log.error("kvpool.mooncake %s: buffer pointer cannot be null", op)
                return _INVALID
            if self._require(op) is None or self._t_raw(ptr, size, op) is None:
                return _INVALID
            return _config_error(config) or (self.upsert_from if upsert else self.put_from)(key, ptr, size, config)
        if self._require(op) is None:
            return _INVALID
        raw = self._t_raw(ptr, size, op)
        if raw is None:
            return _INVALID
        meta, mem = raw
        if route == "writer":
            w: _Writer = arg
            objs = self._t_tp_raw_objects(op, key, meta, mem, w.size, w.split_dim, decoded=False, only=w.rank)
            if objs is None:
                return _INVALID
            skey = _writer_key(key, w.rank, w.size, w.split_dim)
            return self._t_write(op, [(skey, objs[0][1])], config, upsert, groups=False)[0] or self._t_write(
                op, [(key + "__writer_manifest", _manifest(meta.global_shape, meta.dtype, w.split_dim, w.size))],
                config, upsert, groups=False)[0]
        spec: _Spec = arg
        if route == "tp":  # every TP rank's shard of the full tensor in the buffer; no manifest
            tp = spec[_tp_index(spec) or 0]
            objs = self._t_tp_raw_objects(op, key, meta, mem, tp.size, tp.split_dim or 0, spec, decoded=False)
            if objs is None:
                return _INVALID
            for skey, obj in objs:
                code = self._t_write(op, [(skey, obj)], config, upsert, groups=False)[0]
                if code:
                    log.error("kvpool.mooncake %s failed for key %r with code %d", op, skey[:80], code)
                    return code
            return _OK
        m = _shard_meta(meta.dtype, meta.global_shape, meta.local_shape, spec, meta.data_bytes)
        if m is None:
            return _INVALID
        data = bytes(memoryview(mem).cast("B")[meta.data_offset:meta.data_offset + meta.data_bytes])
        return self._t_write(op, [(_parallel_key(key, spec), bytearray(m.pack() + data))], config, upsert,
                             groups=False)[0]

    def _t_par_batch(self, op: str, keys: list[str], count: int, parallelisms: Any,
                     config: Any, writer_partitions: Any, direct: Any, one: Any) -> list[int]:
        if not _groups_ok(config, len(keys), op):
            return [_INVALID] * len(keys)
        if parallelisms is not None and writer_partitions is not None:
            log.error("kvpool.mooncake %s: writer_partitions cannot be combined with parallelisms", op)
            return [_INVALID] * len(keys)
        if count != len(keys):
            log.error("kvpool.mooncake %s: values and keys must have the same length", op)
            return [_INVALID] * len(keys)
        if parallelisms is None and writer_partitions is None:
            return list(direct())
        reqs, name = (parallelisms, "parallelisms") if parallelisms is not None else (writer_partitions,
                                                                                    "writer_partitions")
        if not isinstance(reqs, list):
            log.error("kvpool.mooncake %s: %s must be a list or None", op, name)
            return [_INVALID] * len(keys)
        if len(reqs) != len(keys):
            log.error("kvpool.mooncake %s: keys and %s must have the same length", op, name)
            return [_INVALID] * len(keys)
        return [one(i, reqs[i] if parallelisms is not None else None,
                    reqs[i] if writer_partitions is not None else None) for i in range(len(keys))]

    def put_tensor_with_parallelism(self, key: str, tensor: Any, parallelism: Any = None,
                                    config: Any = None, writer_partition: Any = None) -> int:
        """Stores a tensor under a parallel layout. No request: ``pub_tensor``. ``writer_partition`` (rank,
        size, split_dim): this writer's slice of the full tensor under ``<key>__writer_<r>of<n>_sd<d>`` plus a
        manifest. ``parallelism`` with one TP axis: the tensor is this rank's shard, stored under
        ``<key>_tp_<rank>`` plus a manifest; with a TP axis among others: this rank's shard of the full
        tensor; without a TP axis: the tensor as it is, under the axes' key. 0 or a negative code (-600 for a
        refused request)."""
        return self._t_par_write("put_tensor_with_parallelism", _str_arg(key, "key"), tensor, parallelism, config,
                                 writer_partition, False)

    def upsert_tensor_with_parallelism(self, key: str, tensor: Any,
                                       parallelism: Any = None, config: Any = None,
                                       writer_partition: Any = None) -> int:
        """``put_tensor_with_parallelism`` that replaces existing objects: 0 or a negative code."""
        return self._t_par_write("upsert_tensor_with_parallelism", _str_arg(key, "key"), tensor, parallelism,
                                 config, writer_partition, True)

    def put_tensor_with_parallelism_from(self, key: str, buffer_ptr: int, size: int,
                                         parallelism: Any = None, config: Any = None,
                                         writer_partition: Any = None) -> int:
        """``put_tensor_with_parallelism`` of the full tensor object ``[TensorMetadata][data]`` at
        ``buffer_ptr``; a TP layout stores every rank's shard (no manifest), as Mooncake does. 0 or a
        negative code."""
        return self._t_par_write_from("put_tensor_with_parallelism_from", _str_arg(key, "key"),
                                      _uint(buffer_ptr, "buffer_ptr"), _uint(size, "size"), parallelism, config,
                                      writer_partition, False)

    def upsert_tensor_with_parallelism_from(self, key: str, buffer_ptr: int, size: int,
                                            parallelism: Any = None, config: Any = None,
                                            writer_partition: Any = None) -> int:
        """``put_tensor_with_parallelism_from`` that replaces existing objects: 0 or a negative code."""
        return self._t_par_write_from("upsert_tensor_with_parallelism_from", _str_arg(key, "key"),
                                      _uint(buffer_ptr, "buffer_ptr"), _uint(size, "size"), parallelism, config,
                                      writer_partition, True)

    def _t_par_tensors(self, op: str, keys: Any, tensors_list: Any, parallelisms: Any,
                       config: Any, writer_partitions: Any, upsert: bool) -> list[int]:
        ks = _keys_arg(keys)
        tl = _list_arg(tensors_list, "tensors_list")

        def direct() -> list[int]:
            if self._require(op) is None:
                return [_INVALID] * len(ks)
            code = _config_error(config)
            return [code] * len(ks) if code else self._t_put_many(op, ks, tl, config, upsert)

        return self._t_par_batch(op, ks, len(tl), parallelisms, config, writer_partitions, direct,
                                 lambda i, p, w: self._t_par_write(op, ks[i], tl[i], p, _regroup(config, [i]), w,
                                                                   upsert))

    def _t_par_buffers(self, op: str, keys: Any, buffer_ptrs: Any, sizes: Any,
                       parallelisms: Any, config: Any, writer_partitions: Any, upsert: bool) -> list[int]:
        ks = _keys_arg(keys)
        ptrs, ns = _uint_list(buffer_ptrs, "buffer_ptrs"), _uint_list(sizes, "sizes")

        def direct() -> list[int]:
            if self._require(op) is None:
                return [_INVALID] * len(ks)
            code = _config_error(config)
            return [code] * len(ks) if code else self._t_from_many(op, ks, ptrs, ns, config, upsert)

        return self._t_par_batch(op, ks, len(ptrs), parallelisms, config, writer_partitions, direct,
                                 lambda i, p, w: self._t_par_write_from(
                                     op, ks[i], ptrs[i], ns[i] if i < len(ns) else 0, p, _regroup(config, [i]), w,
                                     upsert))

    def batch_put_tensor_with_parallelism(self, keys: Sequence[str], tensors_list: list,
                                          parallelisms: Any = None, config: Any = None,
                                          writer_partitions: Any = None) -> list[int]:
        """``put_tensor_with_parallelism`` per key, with ``parallelisms`` or ``writer_partitions`` a list (one
        request per key) or None: a code per key; -600 each for lists of different lengths or both given."""
        return self._t_par_tensors("batch_put_tensor_with_parallelism", keys, tensors_list, parallelisms, config,
                                   writer_partitions, False)

    def batch_upsert_tensor_with_parallelism(self, keys: Sequence[str],
                                             tensors_list: list, parallelisms: Any = None, config: Any = None,
                                             writer_partitions: Any = None) -> list[int]:
        """``upsert_tensor_with_parallelism`` per key: a code per key."""
        return self._t_par_tensors("batch_upsert_tensor_with_parallelism", keys, tensors_list, parallelisms,
                                   config, writer_partitions, True)

    def batch_put_tensor_with_parallelism_from(self, keys: Sequence[str],
                                               buffer_ptrs: Sequence[int], sizes: Sequence[int],
                                               parallelisms: Any = None, config: Any = None,
                                               writer_partitions: Any = None) -> list[int]:
        """``put_tensor_with_parallelism_from`` per buffer: a code per key."""
        return self._t_par_buffers("batch_put_tensor_with_parallelism_from", keys, buffer_ptrs, sizes,
                                   parallelisms, config, writer_partitions, False)

    def batch_upsert_tensor_with_parallelism_from(self, keys: Sequence[str],
                                                  buffer_ptrs: Sequence[int], sizes: Sequence[int],
                                                  parallelisms: Any = None, config: Any = None,
                                                  writer_partitions: Any = None) -> list[int]:
        """``upsert_tensor_with_parallelism_from`` per buffer: a code per key."""
        return self._t_par_buffers("batch_upsert_tensor_with_parallelism_from", keys, buffer_ptrs, sizes,
                                   parallelisms, config, writer_partitions, True)

    # ------------------------------------------------------------------- parallelism: reads

    def _t_writer_recon(self, key: str, ctx: str) -> Optional[_Recon]:
        got = self._t_fetch(ctx, [key + "__writer_manifest"])
        man = _parse_manifest(got[0] if got else None)
        if man is None:
            return None
        if not 0 <= man.split_dim < len(man.global_shape):
            log.error("kvpool.mooncake %s: invalid writer split_dim", ctx)
            return None
        keys = [_writer_key(key, r, man.shards, man.split_dim) for r in range(man.shards)]
        sources = self._t_sources(keys, ctx)
        if sources is None:
            return None
        for r, src in enumerate(sources):
            spec = _spec_of(src.meta)
            if spec is None or not _single_tp(spec) or (spec[0].rank, spec[0].size, spec[0].split_dim) != \
                    (r, man.shards, man.split_dim):
                log.error("kvpool.mooncake %s: writer shard metadata mismatch for key %r", ctx, src.key[:80])
                return None
        return _Recon(sources, man.global_shape, man.split_dim, man.dtype)

    def _t_manifest_recon(self, key: str, spec: _Spec, ctx: str) -> Optional[_Recon]:
        ti = _tp_index(spec)
        if ti is None:
            log.error("kvpool.mooncake %s: reconstruction requires a TP axis", ctx)
            return None
        got = self._t_fetch(ctx, [key + "__parallelism_manifest"])
        man = _parse_manifest(got[0] if got else None)
        if man is None:
            return None
        req = spec[ti]
        if req.split_dim is not None and req.split_dim != man.split_dim:
            log.error("kvpool.mooncake %s: split_dim mismatch", ctx)
            return None
        dim = man.global_shape[man.split_dim]
        if dim % req.size or dim % man.shards:
            log.error("kvpool.mooncake %s: only uniform sharding is supported", ctx)
            return None
        canon = _canonical(spec)
        keys = [_parallel_key(key, _with_tp(canon, r, man.shards)) for r in range(man.shards)]
        sources = self._t_sources(keys, ctx)
        if sources is None:
            return None
        for r, src in enumerate(sources):
            want = _with_tp(canon, r, man.shards)
            stored = _tp_compatible(want, src.meta, ctx)
            if stored is None or not _equal_by_kind(want, stored):
                log.error("kvpool.mooncake %s: shard metadata mismatch for TP rank %d", ctx, r)
                return None
        return _Recon(sources, man.global_shape, man.split_dim, man.dtype)

    def _t_par_recon(self, key: str, spec: _Spec, ctx: str) -> Optional[_Recon]:
        """The shards a full tensor of layout ``spec`` is rebuilt from (Mooncake's
        load_parallelism_full_reconstruction_sources): by the manifest, else the legacy ``_tp_<r>`` keys,
        else the parallelism keys of every TP rank."""
        r = self._t_manifest_recon(key, spec, ctx)
        if r is not None:
            return r
        ti = _tp_index(spec)
        if ti is None:
            log.error("kvpool.mooncake %s: full reconstruction requires a TP axis", ctx)
            return None
        req = spec[ti]
        canon = _canonical(spec)
        if _single_tp(canon):
            first = self._t_load(ctx, key if req.size <= 1 else _tp_key(key, 0))
            if first is None:
                log.error("kvpool.mooncake %s: no shard matched requested layout for TP rank 0", ctx)
                return None
            tp = first.meta.tp_axis()
            if first.meta.layout_kind != _SHARD or tp is None:
                log.error("kvpool.mooncake %s: missing TP axis metadata", ctx)
                return None
            sd, count = tp[4], tp[3]
            if req.split_dim is not None and req.split_dim != sd:
                log.error("kvpool.mooncake %s: split_dim mismatch", ctx)
                return None
            g = first.meta.global_shape
            if not 0 <= sd < len(g) or g[sd] % req.size or g[sd] % count:
                log.error("kvpool.mooncake %s: only uniform sharding is supported", ctx)
                return None
            sources = self._t_sources([key if count <= 1 else _tp_key(key, i) for i in range(count)], ctx)
            if sources is None:
                return None
            for i, src in enumerate(sources):
                a = src.meta.tp_axis()
                if src.meta.layout_kind != _SHARD or a is None or (a[2], a[3], a[4]) != (i, count, sd):
                    log.error("kvpool.mooncake %s: shard metadata mismatch for TP rank %d", ctx, i)
                    return None
            return _Recon(sources, g, sd, first.meta.dtype)
        keys = [_parallel_key(key, _with_tp(canon, i, req.size)) for i in range(req.size)]
        sources = self._t_sources(keys, ctx)
        if sources is None:
            return None
        for i, src in enumerate(sources):
            stored = _tp_compatible(_with_tp(canon, i), src.meta, ctx)
            if stored is None or not _equal_by_kind(canon, stored):
                log.error("kvpool.mooncake %s: shard metadata mismatch for TP rank %d", ctx, i)
                return None
        tp0 = sources[0].meta.tp_axis()
        if tp0 is None:
            log.error("kvpool.mooncake %s: missing TP axis metadata", ctx)
            return None
        sd = tp0[4]
        if req.split_dim is not None and req.split_dim != sd:
            log.error("kvpool.mooncake %s: split_dim mismatch", ctx)
            return None
        g = sources[0].meta.global_shape
        if not 0 <= sd < len(g) or g[sd] % req.size:
            log.error("kvpool.mooncake %s: only uniform sharding is supported", ctx)
            return None
        return _Recon(sources, g, sd, sources[0].meta.dtype)

    @staticmethod
    def _t_full(r: _Recon, ctx: str) -> Optional[bytearray]:
        return _assemble(r, _Meta(r.dtype, r.global_shape, r.global_shape), 0, r.global_shape[r.split_dim], ctx)

    @staticmethod
    def _t_shard(r: _Recon, spec: _Spec, ctx: str) -> Optional[bytearray]:
        ti = _tp_index(spec)
        if ti is None:
            log.error("kvpool.mooncake %s: shard reconstruction requires a TP axis", ctx)
            return None
        tp = spec[ti]
        start, extent = _shard_range(r.global_shape[r.split_dim], tp.rank, tp.size)
        local = list(r.global_shape)
        local[r.split_dim] = extent
        target = _shard_meta(r.dtype, r.global_shape, local, spec, 0)
        if target is None:
            log.error("kvpool.mooncake %s: failed to build target shard metadata", ctx)
            return None
        return _assemble(r, target, start, extent, ctx)

    def _t_resolve_shard(self, key: str, spec: _Spec, ctx: str) -> Optional[_Src]:
        """The stored object that is exactly the requested shard: under its parallelism key, or (one TP axis)
        under the matching writer-partition key."""
        src = self._t_load(ctx, _parallel_key(key, spec))
        if src is not None and _matches(spec, src.meta):
            return src
        if _single_tp(spec):
            a = spec[0]
            src = self._t_load(ctx, _writer_key(key, a.rank, a.size, a.split_dim or 0))
            stored = None if src is None else _spec_of(src.meta)
            if src is not None and stored is not None and _single_tp(stored) and _matches(spec, src.meta):
                return src
        return None

    def _t_target_object(self, key: str, target: Any, ctx: str,
                         into: bool) -> tuple[bool, Optional[Any]]:
        """(handled, object bytes or None) for a read target. ``handled`` False means "read ``key`` as stored"
        (get_tensor / the plain object). The ``into`` forms skip Mooncake's last legacy fallback."""
        parsed = _parse_target(target, ctx)
        if parsed is None:
            return True, None
        mode, spec = parsed
        if mode == "as_stored" and spec is None:
            return False, None
        if mode == "full" and spec is None:
            if self._require(ctx) is None:
                return True, None
            r = self._t_writer_recon(key, ctx)
            return (False, None) if r is None else (True, self._t_full(r, ctx))
        spec = _validate(spec, ctx)
        if spec is None:
            return True, None
        if mode == "shard":
            src = self._t_resolve_shard(key, spec, ctx)
            if src is not None:
                return True, src.data
            if _tp_index(spec) is not None:
                r = self._t_par_recon(key, spec, ctx)
                obj = None if r is None else self._t_shard(r, spec, ctx)
                if obj is not None or into:
                    return True, obj
            if not into and _single_tp(spec):  # Mooncake's last resort: the legacy key, unchecked
                a = spec[0]
                got = self._t_fetch(ctx, [key if a.size <= 1 else _tp_key(key, a.rank)])
                return True, got[0] if got else None
            log.error("kvpool.mooncake %s: parallelism metadata mismatch for key %r", ctx, key[:80])
            return True, None
        if mode == "full":
            if _tp_index(spec) is None:
                log.error("kvpool.mooncake %s: full reconstruction requires a TP axis", ctx)
                return True, None
            r = self._t_par_recon(key, spec, ctx)
            return True, None if r is None else self._t_full(r, ctx)
        log.error("kvpool.mooncake %s: unsupported ReadTarget mode", ctx)
        return True, None

    def get_tensor_with_parallelism(self, key: str, target: Any = None) -> Any:
        """A tensor read through a ReadTarget: None or "as_stored" is ``get_tensor``; "full" without a layout
        rebuilds a writer-partitioned tensor (else ``get_tensor``); "shard" returns the shard the target's
        TensorParallelism names (stored, or cut from the full tensor); "full" with a layout rebuilds the full
        tensor from its TP shards. None when it cannot be read."""
        k = _str_arg(key, "key")
        ctx = "get_tensor_with_parallelism"
        handled, obj = self._t_target_object(k, target, ctx, False)
        if not handled:
            return self.get_tensor(k)
        if obj is None:
            return None
        torch = _torch(ctx)
        return None if torch is None else _tensor_of(torch, bytearray(obj), len(obj), ctx)

    def batch_get_tensor_with_parallelism(self, keys: Sequence[str],
                                          targets: Any = None) -> list[Any]:
        """``get_tensor_with_parallelism`` per key (``targets`` a list, or None for ``batch_get_tensor``): a
        tensor or None per key; None each when ``targets`` is not a list of the keys' length."""
        ks = _keys_arg(keys)
        if targets is None:
            return self.batch_get_tensor(ks)
        if not isinstance(targets, list) or len(targets) != len(ks):
            log.error("kvpool.mooncake batch_get_tensor_with_parallelism: %s", "targets must be a list or None"
                      if not isinstance(targets, list) else "keys and targets must have the same length")
            return [None] * len(ks)
        return [self.get_tensor_with_parallelism(k, t) for k, t in zip(ks, targets)]

    def _t_region_ok(self, ptr: int, size: int, ctx: str) -> bool:
        """Mooncake writes these reads only into memory it manages: a ``register_buffer`` range."""
        with self._lock:
            region = next(((b, n) for b, n in self._registered.items() if b <= ptr < b + n), None)
        if region is None:
            log.error("kvpool.mooncake %s: buffer is not Store-managed writable memory (register_buffer it first)",
                      ctx)
            return False
        if ptr - region[0] + size > region[1]:
            log.error("kvpool.mooncake %s: buffer range exceeds writable region", ctx)
            return False
        return True

    def _t_par_into(self, key: str, ptr: int, size: int, target: Any, ctx: str) -> Any:
        handled, obj = self._t_target_object(key, target, ctx, True)
        if not handled:
            src = self._t_load(ctx, key)
            obj = None if src is None else src.data
        if obj is None or not self._t_region_ok(ptr, size, ctx):
            return None
        if len(obj) > size:
            log.error("kvpool.mooncake %s: buffer too small for key %r (%d bytes, the tensor needs %d)", ctx, key[:80],
                      size, len(obj))
            return None
        memoryview(_user_memory(ptr, len(obj))).cast("B")[:] = obj
        return self._t_into_tensor(ptr, len(obj), ctx)

    def get_tensor_with_parallelism_into(self, key: str, buffer_ptr: int, size: int,
                                         target: Any = None) -> Any:
        """``get_tensor_with_parallelism`` into ``size`` bytes at ``buffer_ptr``, which must lie in a
        ``register_buffer`` range (as Mooncake requires): the tensor object is written there and a tensor over
        that memory returned, or None."""
        return self._t_par_into(_str_arg(key, "key"), _uint(buffer_ptr, "buffer_ptr"), _uint(size, "size"), target,
                                "get_tensor_with_parallelism_into")

    def batch_get_tensor_with_parallelism_into(self, keys: Sequence[str],
                                               buffer_ptrs: Sequence[int], sizes: Sequence[int],
                                               targets: Any = None) -> list[Any]:
        """``get_tensor_with_parallelism_into`` per key: a tensor or None per key."""
        ks = _keys_arg(keys)
        ptrs, ns = _uint_list(buffer_ptrs, "buffer_ptrs"), _uint_list(sizes, "sizes")
        ctx = "batch_get_tensor_with_parallelism_into"
        if not len(ks) == len(ptrs) == len(ns):
            log.error("kvpool.mooncake %s: keys, buffer_ptrs, and sizes must have the same length", ctx)
            return [None] * len(ks)
        if targets is not None and (not isinstance(targets, list) or len(targets) != len(ks)):
            log.error("kvpool.mooncake %s: %s", ctx, "targets must be a list or None"
                      if not isinstance(targets, list) else "keys and targets must have the same length")
            return [None] * len(ks)
        return [self._t_par_into(k, p, n, None if targets is None else targets[i], ctx)
                for i, (k, p, n) in enumerate(zip(ks, ptrs, ns))]

    # ------------------------------------------------------------------------------ safetensors

    def save_tensor_to_safetensor(self, key: str, file_name: Any = None) -> int:
        """Writes the tensor under ``key`` to a safetensors file (one tensor named ``key``) at ``file_name``, or
        at ``key`` itself (a path relative to the working directory) when None: 0, -1100 if the key holds no
        tensor, -600 if the file cannot be written."""
        k = _str_arg(key, "key")
        op = "save_tensor_to_safetensor"
        if self._require(op) is None:
            return _INVALID
        t = self.get_tensor(k)
        if t is None:
            log.error("kvpool.mooncake %s: failed to fetch tensor for key %r", op, k[:80])
            return _FILE_NOT_FOUND
        path = k if file_name is None else _cast_str(file_name)
        torch = _torch(op)
        if torch is None:
            return _INVALID
        host = _host_tensor(torch, t, k, op)
        if host is None:
            return _INVALID
        data = ctypes.string_at(host.ptr, host.nbytes) if host.nbytes else b""
        blob = _safetensors_bytes(k, host.code, host.shape, data)
        tmp = os.path.join(os.path.dirname(os.path.abspath(path)), f".tmp{uuid.uuid4().hex[:8]}")
        try:
            with open(tmp, "xb") as f:  # written beside the target, then renamed over it (as safetensors does)
                f.write(blob)
            os.replace(tmp, path)
        except OSError as e:
            log.error("kvpool.mooncake %s: failed to save tensor to safetensor file %s: %s", op, path, e)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return _INVALID
        return _OK

    def load_tensor_from_safetensor(self, key: Any = None, file_name: Any = REQUIRED) -> Any:
        """``load_tensor_from_safetensor(key=None, file_name)``: reads a safetensors file and ``put_tensor``s
        one of its tensors under ``key`` (``file_name`` when None); the tensor named ``key`` if the file has
        one, else its first tensor (a warning). Returns the tensor, or None (file unreadable or empty, a dtype
        Mooncake does not store, the put failed, before setup)."""
        if file_name is REQUIRED:
            raise TypeError("load_tensor_from_safetensor() missing its file_name argument (a str)")
        file_name = _str_arg(file_name, "file_name")
        op = "load_tensor_from_safetensor"
        if self._require(op) is None:
            return None
        tensors = _read_safetensors(file_name, op)
        if tensors is None:
            return None
        if not tensors:
            log.error("kvpool.mooncake %s: no tensors found in safetensor file: %s", op, file_name)
            return None
        target = file_name if key is None else _cast_str(key)
        chosen = next((t for t in tensors if key is not None and t[0] == target), None)
        if chosen is None:
            chosen = tensors[0]
            if key is not None:
                log.warning("kvpool.mooncake %s: key %r not found in safetensor file; using first entry", op,
                            target[:80])
        torch = _torch(op)
        if torch is None:
            return None
        _, code, shape, data = chosen
        obj = bytearray(_Meta(code, shape, shape, data_bytes=len(data)).pack()) + data
        tensor = _tensor_of(torch, obj, len(obj), op)
        if tensor is None:
            return None
        rc = self.put_tensor(target, tensor)
        if rc != _OK:
            log.error("kvpool.mooncake %s: failed to store tensor for key %r, rc=%d", op, target[:80], rc)
            return None
        return tensor

