"""Mooncake's structured object store: the wheel's pure-Python module ``mooncake.structured_object_store``,
written for kvpool (``kvpool.mooncake.install()`` registers it under that name). It keeps DataProto-like
batches (``batch`` tensors and arrays, ``non_tensor_batch`` columns of Python values, ``meta_info``) and
other named buffers in a store as several objects plus a manifest, and hands back a small reference that
another process can read any fields or rows through.

It works over any store with Mooncake's Python API (``put``, ``get``, ``remove``, ``is_exist``,
``batch_remove``, ``put_from``): kvpool's ``MooncakeDistributedStore``, or Mooncake's own. What it writes
is what the wheel's module writes, so either reads the other's objects and handles:

* a bundle is ``<key_prefix>/<partition>/<uuid>/manifest`` (JSON: version 1, layout "bundle", the object
  id, and a payload description per buffer), ``.../meta`` (JSON metadata, with each member's encoding
  under ``__mooncake_structured_fields__``) and ``.../buffer/<name>`` per member; a payload larger than the
  chunk size (64 MiB by default) is split into ``.../chunk/<i>`` objects;
* members are raw bytes, numpy arrays (their bytes, dtype and shape in the metadata) or torch tensors
  (Mooncake's tensor object: its 304-byte ``TensorMetadata`` then the data, as ``put_tensor`` stores it;
  a 0-d tensor as ``torch.save`` bytes);
* a DataProto stage is one bundle (members ``batch.<field>``, ``non_tensor_batch.<field>[.<part>]``), and
  the handle (``export_dataproto_ref``) is the same JSON.

Differences from the wheel, each for a reason:

* ``non_tensor_batch`` columns use the codecs ``structured_codecs`` describes; Mooncake's codecs for
  columns of tensors, images and nested structures holding them are not implemented (ValueError naming
  the codec, on writing such a column or reading one Mooncake wrote).
* Reads fetch whole members (ranges and rows are cut out here) where the wheel reads byte ranges, and
  puts are made one object after another (``max_inflight_put`` and ``put_mode`` are checked, not used).
* No BufferPool: results are ordinary numpy arrays and tensors (the wheel may hand back arrays over its
  pool's memory, which ``release_result`` releases; here it has nothing to release). A bytes member reads
  back as a uint8 array where the wheel would use a pool (a set-up store with ranged reads, or a
  ``buffer_pool`` given), else as bytes, as the wheel's does.

numpy is imported when a call needs it, torch when a tensor is stored or read.
"""

from __future__ import annotations

import copy
import ctypes
import io
import json
import sys
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Literal, Mapping, Optional, Protocol, Sequence, Union

from . import structured_codecs as _codecs
from .structured_codecs import MISSING, infer_structure
from .tensor_layout import META_SIZE, _DTYPES, _Meta, _host_tensor, _object, _torch_dtype

__all__ = [
    "AUTO_PARALLEL_MIN_BYTES", "AUTO_PARALLEL_MIN_CHUNKS", "BundleStore", "BundleTransferPolicy",
    "DATAPROTO_REF_HANDLE_TYPE", "DATAPROTO_REF_HANDLE_VERSION", "DEFAULT_BUNDLE_CHUNK_BYTES", "DataProtoRefLike",
    "FieldSchema", "MISSING", "MISSING_OBJECT_ERROR", "MooncakeBundleTransfer", "MooncakeDataProtoRef",
    "RemoteBundleRef", "STORAGE_GROUP_ID", "STRUCTURED_FIELD_SPECS_KEY", "StructuredFieldLocation",
    "StructuredMemberSlice", "StructuredObjectPayload", "StructuredObjectReadSpec", "StructuredObjectResult",
    "export_dataproto_ref", "export_ref", "import_dataproto_ref", "import_ref", "infer_structure",
    "is_dataproto_ref_handle", "raw_destination", "tensor_object_buffer",
]

DEFAULT_BUNDLE_CHUNK_BYTES = 64 * 1024 ** 2
AUTO_PARALLEL_MIN_BYTES = DEFAULT_BUNDLE_CHUNK_BYTES
AUTO_PARALLEL_MIN_CHUNKS = 8
MISSING_OBJECT_ERROR = -704  # what a removal of an object already gone answers
STRUCTURED_FIELD_SPECS_KEY = "__mooncake_structured_fields__"
DATAPROTO_REF_HANDLE_TYPE = "mooncake_dataproto_ref"
DATAPROTO_REF_HANDLE_VERSION = 1
STORAGE_GROUP_ID = "storage_group_id"  # an optional field of version-1 handles
_WRAPPED = "__mooncake_wrapped_object__"


def _np() -> Any:
    import numpy  # optional: needed when arrays are stored or read
    return numpy


def _torch() -> Any:
    import torch  # optional: needed when tensors are stored or read
    return torch


def _is_tensor(v: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(v, torch.Tensor)


# ------------------------------------------------------------------------------------ public types

class BundleStore(Protocol):
    """What this module needs of a store (Mooncake's API; ``batch_remove`` and ``put_from`` are used when
    there)."""

    def put(self, key: str, value: Any, config: Any = None) -> int: ...

    def get(self, key: str) -> bytes: ...

    def remove(self, key: str, force: bool = False) -> int: ...

    def is_exist(self, key: str) -> int: ...


@dataclass(frozen=True)
class BundleTransferPolicy:
    """How payloads are written: ``copy_mode`` "zero_copy" requires tensors given as
    ``tensor_object_buffer`` (and refuses other payloads), "copy" and "auto" copy. ``max_inflight_put`` (at
    least 1) and ``put_mode`` ("auto", "batch", "parallel") are checked; kvpool writes one object after
    another."""

    max_inflight_put: int = 1
    put_mode: Literal["auto", "batch", "parallel"] = "auto"
    copy_mode: Literal["auto", "zero_copy", "copy"] = "auto"


@dataclass(frozen=True)
class FieldSchema:
    """A hint for one DataProto field: ``codec`` for a ``non_tensor_batch`` column ("auto", "ndarray" with
    ``metadata["dtype"]``, "typed_ragged", "utf8_ragged", "bytes_ragged", "json_ragged", "msgpack_ragged"),
    whether rows may be None, and ``metadata["section"]`` to pin the field to "batch",
    "non_tensor_batch" or "meta_info"."""

    codec: str
    nullable: bool = True
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class RemoteBundleRef:
    """A stored bundle: its manifest's key, and the manifest when known (empty: read it from the store)."""

    manifest_key: str
    manifest: dict[str, Any]


@dataclass(frozen=True, init=False)
class StructuredObjectPayload:
    """A structured object to store: JSON-able ``metadata`` and named ``buffers`` (required)."""

    metadata: Mapping[str, Any]
    buffers: Mapping[str, Any]

    def __init__(self, metadata: Optional[Mapping[str, Any]] = None,
                 buffers: Optional[Mapping[str, Any]] = None) -> None:
        if buffers is None:
            raise TypeError("StructuredObjectPayload requires buffers")
        object.__setattr__(self, "metadata", {} if metadata is None else metadata)
        object.__setattr__(self, "buffers", buffers)


@dataclass
class StructuredObjectResult:
    """A structured object read back: its metadata and the members read, by name."""

    metadata: dict[str, Any]
    objects: dict[str, Any]


@dataclass(frozen=True)
class StructuredFieldLocation:
    """Where a DataProto field is: the stage's bundle, the member in it, and the section."""

    stage: str
    member: str
    section: Literal["batch", "non_tensor_batch"]


@dataclass
class MooncakeDataProtoRef:
    """A DataProto in the store: its stages' bundles, where each field is, ``meta_info`` and the row count
    (no data)."""

    batch_size: int
    stage_refs: dict[str, RemoteBundleRef]
    field_index: dict[str, StructuredFieldLocation]
    meta_info: dict[str, Any]
    namespace: str = "default"
    partition: str = "default"
    global_indexes: Optional[list[int]] = None
    encoded_non_tensor: dict[str, Any] = field(default_factory=dict)
    _storage_group_id: Optional[str] = field(default=None, repr=False)


@dataclass(frozen=True)
class StructuredMemberSlice:
    """Rows ``start:end:step`` of a member (``axis`` 0 only)."""

    axis: int
    start: int
    end: int
    step: int = 1


@dataclass(frozen=True)
class StructuredObjectReadSpec:
    """What to read of a structured object: which members (None: all) and slices of some."""

    ref: Union[RemoteBundleRef, Mapping[str, Any]]
    member_names: Optional[tuple[str, ...]] = None
    member_slices: tuple[tuple[str, StructuredMemberSlice], ...] = ()

    def select_members(self, names: Optional[Sequence[str]]) -> "StructuredObjectReadSpec":
        """This spec reading only ``names`` (None: every member)."""
        return StructuredObjectReadSpec(self.ref, None if names is None else tuple(names), self.member_slices)

    def slice_member(self, name: str, axis: int, start: int, end: int, step: int = 1) -> "StructuredObjectReadSpec":
        """This spec reading rows ``start:end:step`` of member ``name``."""
        slices = dict(self.member_slices)
        slices[name] = StructuredMemberSlice(axis=axis, start=start, end=end, step=step)
        return StructuredObjectReadSpec(self.ref, self.member_names, tuple(slices.items()))

    def member_slice(self, name: str) -> Optional[StructuredMemberSlice]:
        """The slice set for ``name``, if any."""
        return dict(self.member_slices).get(name)


DataProtoRefLike = Union[MooncakeDataProtoRef, Mapping[str, Any]]


@dataclass(frozen=True)
class _ObjectBuffer:
    """A Mooncake tensor object (metadata then data) at ``ptr``: a member to store as it is, or a place to
    read one into."""
    ptr: int
    size: int
    owner: Any
    batch_size: Optional[int] = None

    def __len__(self) -> int:
        if self.batch_size is None:
            raise TypeError("tensor object buffer requires batch_size for DataProto use")
        return self.batch_size


@dataclass(frozen=True)
class _RawDestination:
    """Memory at ``ptr`` to read a member's bytes into."""
    ptr: int
    size: int
    owner: Any
    pre_registered: bool = False


def tensor_object_buffer(ptr: int, size: int, owner: Any = None, batch_size: Optional[int] = None) -> _ObjectBuffer:
    """A Mooncake tensor object of ``size`` bytes at ``ptr`` (kept alive by ``owner``): stored as it is, or
    read into (``batch_size`` is its row count, for DataProto fields)."""
    return _ObjectBuffer(int(ptr), int(size), owner, batch_size)


def raw_destination(ptr: int, size: int, owner: Any = None, *, pre_registered: bool = False) -> _RawDestination:
    """``size`` bytes at ``ptr`` (kept alive by ``owner``) for a read to fill."""
    return _RawDestination(int(ptr), int(size), owner, pre_registered)


# -------------------------------------------------------------------------------------- handles

def is_dataproto_ref_handle(value: Any) -> bool:
    """Whether ``value`` is an exported DataProto handle (a mapping of the handle type)."""
    return isinstance(value, Mapping) and value.get("type") == DATAPROTO_REF_HANDLE_TYPE


def _json_safe(value: Any) -> Any:
    np = sys.modules.get("numpy")
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if np is not None and isinstance(value, np.generic):
        return value.item()
    if np is not None and isinstance(value, np.ndarray):
        return _json_safe(value.tolist())
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    raise TypeError(f"DataProto ref handles support only JSON-safe values, got {type(value).__name__}")


def export_dataproto_ref(ref: MooncakeDataProtoRef) -> dict[str, Any]:
    """The handle as JSON-safe data for another process: manifest keys, field locations, meta_info, the
    column codecs (no data, no manifests)."""
    if not isinstance(ref, MooncakeDataProtoRef):
        raise TypeError(f"expected MooncakeDataProtoRef, got {type(ref).__name__}")
    handle: dict[str, Any] = {
        "type": DATAPROTO_REF_HANDLE_TYPE,
        "version": DATAPROTO_REF_HANDLE_VERSION,
        "kind": "bundle_stages",
        "batch_size": int(ref.batch_size),
        "namespace": ref.namespace,
        "partition": ref.partition,
        "global_indexes": _json_safe(ref.global_indexes),
        "stage_refs": {stage: {"manifest_key": r.manifest_key} for stage, r in ref.stage_refs.items()},
        "field_index": {name: {"stage": loc.stage, "member": loc.member, "section": loc.section}
                        for name, loc in ref.field_index.items()},
        "meta_info": _json_safe(ref.meta_info),
        "encoded_non_tensor": _json_safe(ref.encoded_non_tensor),
    }
    if ref._storage_group_id is not None:
        handle[STORAGE_GROUP_ID] = ref._storage_group_id
    json.dumps(handle, ensure_ascii=False)  # fails here, not in the receiver, if something is not JSON
    return handle


def _mapping(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"DataProto ref handle {name} must be a mapping")
    return value


def _nonempty_str(v: Any) -> bool:
    return isinstance(v, str) and bool(v)


def import_dataproto_ref(handle: Mapping[str, Any]) -> MooncakeDataProtoRef:
    """A ref from an exported handle (versions 1 and 2); ValueError for anything else."""
    if not is_dataproto_ref_handle(handle):
        raise ValueError("not a Mooncake DataProto ref handle")
    version = int(handle.get("version", -1))
    if version not in (DATAPROTO_REF_HANDLE_VERSION, 2):
        raise ValueError(f"unsupported DataProto ref handle version: {handle.get('version')!r}")
    if handle.get("kind") != "bundle_stages":
        raise ValueError(f"unsupported DataProto ref handle kind: {handle.get('kind')!r}")
    stage_refs: dict[str, RemoteBundleRef] = {}
    for stage, raw in _mapping(handle.get("stage_refs"), "stage_refs").items():
        key = _mapping(raw, f"stage_refs[{stage!r}]").get("manifest_key")
        if not _nonempty_str(stage) or not _nonempty_str(key):
            raise ValueError("DataProto ref handle stage refs must contain non-empty string names and "
                             "manifest_key values")
        stage_refs[stage] = RemoteBundleRef(manifest_key=str(key), manifest={})
    field_index: dict[str, StructuredFieldLocation] = {}
    for name, raw in _mapping(handle.get("field_index"), "field_index").items():
        loc = _mapping(raw, f"field_index[{name!r}]")
        section = loc.get("section")
        if section not in ("batch", "non_tensor_batch"):
            raise ValueError(f"invalid DataProto field section: {section!r}")
        where, member = loc.get("stage"), loc.get("member")
        if not (_nonempty_str(name) and _nonempty_str(where) and _nonempty_str(member)):
            raise ValueError("DataProto ref handle field locations must be non-empty strings")
        if where not in stage_refs:
            raise ValueError(f"DataProto ref handle field {name!r} references unknown stage {where!r}")
        field_index[name] = StructuredFieldLocation(stage=str(where), member=str(member), section=section)
    group = handle.get(STORAGE_GROUP_ID)
    if (version == 2 and group is None) or (group is not None and not _nonempty_str(group)):
        raise ValueError("DataProto ref handle has invalid storage_group_id")
    indexes = handle.get("global_indexes")
    if indexes is not None:
        if not isinstance(indexes, list):
            raise ValueError("DataProto ref handle global_indexes must be a list or null")
        if any(isinstance(i, bool) or not isinstance(i, int) for i in indexes):
            raise ValueError("DataProto ref handle global_indexes must contain integers")
        indexes = list(indexes)
    return MooncakeDataProtoRef(
        batch_size=int(handle["batch_size"]), stage_refs=stage_refs, field_index=field_index,
        meta_info=dict(_mapping(handle.get("meta_info", {}), "meta_info")),
        namespace=str(handle.get("namespace", "default")), partition=str(handle.get("partition", "default")),
        global_indexes=indexes,
        encoded_non_tensor=dict(_mapping(handle.get("encoded_non_tensor", {}), "encoded_non_tensor")),
        _storage_group_id=group)


export_ref = export_dataproto_ref
import_ref = import_dataproto_ref


def _resolve_ref(ref: DataProtoRefLike) -> MooncakeDataProtoRef:
    if isinstance(ref, MooncakeDataProtoRef):
        return ref
    if is_dataproto_ref_handle(ref):
        return import_dataproto_ref(ref)
    raise TypeError(f"expected MooncakeDataProtoRef or DataProto handle, got {type(ref).__name__}")


# ----------------------------------------------------------------------------- checks and configs

def _segment(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or "/" in value or any(ord(c) < 32 for c in value):
        raise ValueError(f"invalid bundle {what}: {value!r}")
    return value


def _chunk_bytes(n: int) -> int:
    if n <= 0:
        raise ValueError("chunk_bytes must be positive")
    return n


def _policy(policy: Optional[BundleTransferPolicy], max_inflight_put: Optional[int] = None) -> BundleTransferPolicy:
    p = policy or BundleTransferPolicy()
    if max_inflight_put is not None:
        p = BundleTransferPolicy(max_inflight_put, p.put_mode, p.copy_mode)
    if p.max_inflight_put < 1:
        raise ValueError("max_inflight_put must be positive")
    if p.put_mode not in ("auto", "batch", "parallel"):
        raise ValueError(f"unsupported put_mode: {p.put_mode}")
    if p.copy_mode not in ("auto", "zero_copy", "copy"):
        raise ValueError(f"unsupported copy_mode: {p.copy_mode}")
    return p


_CONFIG_FIELDS = ("data_type", "group_ids", "nof_replica_num", "prefer_alloc_in_same_node", "preferred_nof_segments",
                  "preferred_segment", "preferred_segments", "replica_num", "with_hard_pin", "with_soft_pin")


def _copy_config(config: Any) -> Any:
    try:
        return copy.copy(config)
    except TypeError:
        pass
    try:
        out = type(config)()
    except Exception as e:  # noqa: BLE001
        raise TypeError("structured object store config must be copyable or default-constructible") from e
    for name in _CONFIG_FIELDS:
        if not hasattr(config, name):
            continue
        try:
            value = getattr(config, name)
        except Exception:  # noqa: BLE001 - a field that cannot be read is left at its default
            continue
        if isinstance(value, (list, tuple)):
            value = type(value)(value)
        try:
            setattr(out, name, value)
        except Exception as e:  # noqa: BLE001
            raise TypeError(f"structured object store config field {name!r} is not writable") from e
    return out


def _one_key_config(config: Any) -> Any:
    """The config for one object: its single group id as a list of one (an empty list: none)."""
    if config is None:
        return None
    ids = getattr(config, "group_ids", None)
    if ids is None:
        return config
    listed = [ids] if isinstance(ids, str) else list(ids)
    if not listed:
        out = _copy_config(config)
        out.group_ids = None
        return out
    if len(listed) != 1:
        raise ValueError("structured object store config.group_ids must contain exactly one logical group id; "
                         "it is expanded across internal Mooncake keys")
    if not isinstance(ids, str):
        return config
    out = _copy_config(config)
    out.group_ids = listed
    return out


def _config_class(store: Any) -> Any:
    """The ReplicateConfig of the store's own module (kvpool's or Mooncake's)."""
    for name in (type(store).__module__, "mooncake.store", "kvpool.mooncake"):
        cls = getattr(sys.modules.get(name), "ReplicateConfig", None)
        if cls is not None:
            return cls
    return SimpleNamespace


def _with_group(store: Any, config: Any, group: str) -> Any:
    ids = getattr(_one_key_config(config), "group_ids", None)
    if ids and ids[0] and ids[0] != group:
        raise ValueError("config.group_ids conflicts with the DataProto storage group")
    out = _config_class(store)() if config is None else _copy_config(config)
    out.group_ids = [group]
    return out


def _new_group(config: Any) -> Optional[str]:
    ids = getattr(config, "group_ids", None)
    if ids is None:
        group = None
    elif isinstance(ids, str):
        group = ids
    else:
        try:
            listed = list(ids)
        except TypeError as e:
            raise ValueError("structured object store config.group_ids must contain strings") from e
        if len(listed) > 1:
            raise ValueError("structured object store config.group_ids must contain exactly one logical group id; "
                             "it is expanded across internal Mooncake keys")
        group = listed[0] if listed else None
    if group is None:
        return f"structured-{uuid.uuid4().hex}"
    if not isinstance(group, str):
        raise ValueError("structured object store config.group_ids must contain strings")
    return group or None


def _check(status: Any, op: str, key: str) -> None:
    if status not in (None, 0):
        raise RuntimeError(f"{op} failed for {key}: {status}")


def _write(fn: Any, *args: Any, config: Any = None) -> Any:
    return fn(*args) if config is None else fn(*args, config=config)


def _remove_keys(store: Any, keys: Sequence[str], strict: bool) -> None:
    """Removes ``keys`` (a key already gone is fine); with ``strict``, RuntimeError if any stays."""
    pending = list(dict.fromkeys(keys))
    batch_remove = getattr(store, "batch_remove", None)
    if callable(batch_remove) and pending:
        try:
            try:
                results = batch_remove(pending, True)
            except TypeError:
                results = batch_remove(pending)
            if len(results) != len(pending):
                raise RuntimeError(f"batch_remove returned {len(results)} results for {len(pending)} keys")
            pending = [k for k, rc in zip(pending, results) if rc not in (None, 0, MISSING_OBJECT_ERROR)]
            if not pending:
                return
        except Exception:
            if strict:
                raise
    failed = []
    for key in pending:
        try:
            rc = store.remove(key, True)
        except KeyError:
            continue
        except Exception:
            if strict:
                raise
            continue
        if rc not in (None, 0, MISSING_OBJECT_ERROR):
            failed.append((key, rc))
    if failed and strict:
        raise RuntimeError(f"failed to remove {len(failed)} Mooncake keys: {failed[:3]}")


def _json_bytes(value: Mapping[str, Any], what: str) -> bytes:
    try:
        return json.dumps(value, separators=(",", ":")).encode("utf-8")
    except TypeError as e:
        raise TypeError(f"{what} must be JSON-serializable") from e


def _json_dict(data: bytes, what: str) -> dict[str, Any]:
    value = json.loads(bytes(data).decode("utf-8"))
    if not isinstance(value, dict):
        raise ValueError(f"{what} must decode to a dict")
    return value


def _bytes_view(value: Any, name: str) -> memoryview:
    try:
        view = memoryview(value)
    except TypeError as e:
        raise TypeError(f"{name} must be bytes-like, got {type(value).__name__}") from e
    if not view.contiguous:
        view = memoryview(view.tobytes())
    return view.cast("B")


def _specs(metadata: Mapping[str, Any]) -> dict[str, Any]:
    specs = metadata.get(STRUCTURED_FIELD_SPECS_KEY, {})
    if not isinstance(specs, dict):
        raise ValueError("structured field specs must be a dict")
    return specs


def _rows_of(sl: StructuredMemberSlice, total: int) -> tuple[int, int, int]:
    if sl.step <= 0:
        raise ValueError("structured ndarray slicing step must be positive")
    return slice(sl.start, sl.end, sl.step).indices(total)


def _count(start: int, end: int, step: int) -> int:
    return 0 if start >= end else 1 + (end - 1 - start) // step


# -------------------------------------------------------------------------------- tensor objects

def _tensor_object(tensor: Any) -> bytes:
    """Mooncake's tensor object of a torch tensor (as ``put_tensor`` stores it); TypeError or ValueError
    for what Mooncake cannot store."""
    torch = _torch()
    host = _host_tensor(torch, tensor, "", "structured_object_store")
    if host is None:
        raise ValueError(f"cannot store tensor of dtype {getattr(tensor, 'dtype', '?')} and "
                         f"{getattr(tensor, 'ndim', '?')} dimensions as a Mooncake tensor object")
    return bytes(_object(_Meta(host.code, host.shape, host.shape), host.ptr, host.nbytes))


def _parse_object(data: Any) -> _Meta:
    meta = _Meta.parse(memoryview(data).cast("B"), len(data))
    if meta is None:
        raise ValueError("invalid serialized Mooncake tensor payload")
    return meta


def _tensor_from(meta: _Meta, data: Any, shape: Sequence[int]) -> Any:
    """A tensor (owning a copy) of ``shape`` over the element bytes ``data``."""
    torch = _torch()
    dt = _torch_dtype(torch, meta.dtype, "structured_object_store")
    if dt is None:
        raise ValueError(f"dtype {_DTYPES[meta.dtype][0]} is not available in this PyTorch")
    raw = bytearray(data)
    if not raw:
        return torch.empty(tuple(shape), dtype=dt)
    return torch.frombuffer(raw, dtype=dt).reshape(tuple(shape))


def _tensor_of_object(data: Any) -> Any:
    meta = _parse_object(data)
    return _tensor_from(meta, memoryview(data)[meta.data_offset:meta.data_offset + meta.data_bytes],
                        meta.local_shape if meta.ndim else [1])


def _object_bytes(meta: _Meta, shape: Sequence[int], data: bytes) -> bytes:
    head = _Meta(meta.dtype, shape, shape, data_bytes=len(data))
    return head.pack() + data


# ------------------------------------------------------------------------------------ the transfer

class MooncakeBundleTransfer:
    """Stores structured objects and DataProto-like batches in a Mooncake-API store, and reads them back."""

    def __init__(self, store: BundleStore, key_prefix: str = "bundle",
                 default_chunk_bytes: int = DEFAULT_BUNDLE_CHUNK_BYTES, buffer_pool: Any = None) -> None:
        """``key_prefix`` starts every key written (no control characters; surrounding slashes dropped);
        payloads are split into objects of ``default_chunk_bytes``. ``buffer_pool`` is accepted and not
        used (kvpool reads need no pool)."""
        prefix = key_prefix.strip("/")
        if not prefix or any(ord(c) < 32 for c in prefix):
            raise ValueError("key_prefix must be a non-empty key prefix")
        self.store = store
        self.key_prefix = prefix
        self.default_chunk_bytes = _chunk_bytes(default_chunk_bytes)
        self._buffer_pool = buffer_pool

    # ------------------------------------------------------------------------------ bundles

    def put_bundle(self, meta: Union[bytes, bytearray, memoryview], buffers: Mapping[str, Any],
                   partition: str = "default", chunk_bytes: Optional[int] = None,
                   policy: Optional[BundleTransferPolicy] = None, max_inflight_put: Optional[int] = None,
                   config: Any = None) -> RemoteBundleRef:
        """Stores ``meta`` (bytes) and each named buffer (bytes-like, or a ``tensor_object_buffer``) as one
        bundle; its reference. On a failure what was written is removed and the error raised."""
        _segment(partition, "partition")
        meta_view = _bytes_view(meta, "meta")
        size = _chunk_bytes(self.default_chunk_bytes if chunk_bytes is None else chunk_bytes)
        p = _policy(policy, max_inflight_put)
        object_id = f"{partition}/{uuid.uuid4().hex}"
        base = f"{self.key_prefix}/{object_id}"
        written: list[str] = []
        specs: dict[str, Any] = {}
        try:
            meta_spec = self._put_payload(f"{base}/meta", meta_view, size, "copy", config, written)
            for name, value in buffers.items():
                _segment(name, "buffer name")
                specs[name] = self._put_member(f"{base}/buffer/{name}", value, size, p, config, written)
            manifest = {"version": 1, "layout": "bundle", "object_id": object_id, "meta": meta_spec, "buffers": specs}
            key = f"{base}/manifest"
            _check(_write(self.store.put, key, _json_bytes(manifest, "bundle manifest"),
                          config=_one_key_config(config)), "put", key)
            written.append(key)
        except Exception:
            _remove_keys(self.store, written, strict=False)
            raise
        return RemoteBundleRef(manifest_key=key, manifest=manifest)

    def _put_member(self, key: str, value: Any, size: int, p: BundleTransferPolicy, config: Any,
                    written: list[str]) -> dict[str, Any]:
        if isinstance(value, _ObjectBuffer):
            self._put_object_buffer(key, value, config)
            written.append(key)
            return {"key": key, "bytes": value.size, "chunks": [{"key": key, "bytes": value.size}]}
        if isinstance(value, _TensorValue):
            return self._put_tensor(key, value.tensor, p, config, written)
        return self._put_payload(key, _bytes_view(value, key.rsplit("/", 1)[-1]), size, p.copy_mode, config, written)

    def _put_object_buffer(self, key: str, value: _ObjectBuffer, config: Any) -> None:
        cfg = _one_key_config(config)
        put_tensor_from = getattr(self.store, "put_tensor_from", None)
        if cfg is None and callable(put_tensor_from):
            _check(put_tensor_from(key, value.ptr, value.size), "put_from", key)
            return
        put_from = getattr(self.store, "put_from", None)
        if not callable(put_from):
            raise RuntimeError("put_from is unavailable")
        _check(_write(put_from, key, value.ptr, value.size, config=cfg), "put_from", key)

    def _put_tensor(self, key: str, tensor: Any, p: BundleTransferPolicy, config: Any,
                    written: list[str]) -> dict[str, Any]:
        if p.copy_mode == "zero_copy":
            raise ValueError("zero-copy structured tensor fields require a BufferPool tensor-object buffer")
        if tensor.dim() == 0:  # Mooncake's tensor object reads a 0-d tensor back as (1,): torch.save keeps it
            buf = io.BytesIO()
            _torch().save(tensor, buf)
            raw = buf.getvalue()
            spec = self._put_payload(key, memoryview(raw), len(raw) or 1, "copy", config, written)
            spec["format"] = "torch_save"
            return spec
        if p.copy_mode != "copy":  # the store's own tensor put, as the wheel prefers (the same object)
            put = getattr(self.store, "put_tensor" if config is None else "pub_tensor", None)
            if callable(put):
                n = META_SIZE + int(tensor.numel()) * int(tensor.element_size())
                _check(_write(put, key, tensor, config=_one_key_config(config)), "put_tensor", key)
                written.append(key)
                return {"key": key, "kind": "tensor", "bytes": n, "dtype": str(tensor.dtype),
                        "shape": [int(d) for d in tensor.shape], "chunks": [{"key": key, "bytes": n}],
                        "metadata_bytes": META_SIZE}
        obj = _tensor_object(tensor)  # the same object's bytes, put as a payload
        spec = self._put_payload(key, memoryview(obj), len(obj), "copy", config, written)
        spec["metadata_bytes"] = META_SIZE
        return spec

    def _put_payload(self, key: str, view: memoryview, size: int, copy_mode: str, config: Any,
                     written: list[str]) -> dict[str, Any]:
        if copy_mode == "zero_copy":
            raise RuntimeError("zero-copy put requires tensor-object buffers")
        if len(view) == 0:
            return {"key": key, "bytes": 0, "chunks": []}
        parts = [view[i:i + size] for i in range(0, len(view), size)]
        keys = [key] if len(parts) == 1 else [f"{key}/chunk/{i}" for i in range(len(parts))]
        cfg = _one_key_config(config)
        for k, part in zip(keys, parts):
            _check(_write(self.store.put, k, part, config=cfg), "put", k)
            written.append(k)
        return {"key": key, "bytes": len(view), "chunks": [{"key": k, "bytes": len(p)} for k, p in zip(keys, parts)]}

    def remove_bundle(self, ref: Union[RemoteBundleRef, Mapping[str, Any]]) -> None:
        """Removes every object of a bundle (nothing if its manifest is already gone)."""
        key = ref.manifest_key if isinstance(ref, RemoteBundleRef) else ref.get("manifest_key")
        embedded = ref.manifest if isinstance(ref, RemoteBundleRef) else ref.get("manifest")
        is_exist = getattr(self.store, "is_exist", None)
        if not embedded and isinstance(key, str) and callable(is_exist):
            status = is_exist(key)
            if status == 0:
                return
            if status != 1:
                raise RuntimeError(f"is_exist failed for {key}: {status}")
        try:
            manifest = self._manifest(ref)
        except Exception:
            if isinstance(key, str) and callable(is_exist) and is_exist(key) == 0:
                return
            raise
        keys = [c["key"] for spec in [manifest["meta"], *manifest["buffers"].values()] for c in spec["chunks"]]
        keys.extend(manifest.get("cleanup_keys", []))
        _remove_keys(self.store, keys, strict=True)
        _remove_keys(self.store, [self._manifest_key(ref, manifest)], strict=True)

    def _manifest_key(self, ref: Union[RemoteBundleRef, Mapping[str, Any]], manifest: Mapping[str, Any]) -> str:
        expected = f"{self.key_prefix}/{manifest['object_id']}/manifest"
        key = ref.manifest_key if isinstance(ref, RemoteBundleRef) else ref.get("manifest_key")
        if key is None:
            return expected
        if key != expected:
            raise ValueError("bundle manifest_key does not match manifest object_id")
        return str(key)

    def _object_id(self, key: str) -> Optional[str]:
        head = f"{self.key_prefix}/"
        if not key.startswith(head):
            return None
        rest = key[len(head):]
        for end in ("/manifest", "/meta"):
            if rest.endswith(end):
                return rest[:-len(end)]
        for mark in ("/meta/", "/buffer/"):
            i = rest.find(mark)
            if i > 0:
                return rest[:i]
        return None

    def _manifest(self, ref: Union[RemoteBundleRef, Mapping[str, Any]]) -> dict[str, Any]:
        """The bundle's manifest (from the ref, else read), checked."""
        manifest: Any
        if isinstance(ref, RemoteBundleRef):
            manifest = ref.manifest or _json_dict(self.store.get(ref.manifest_key), "bundle manifest")
        else:
            manifest = ref.get("manifest")
            if manifest is None:
                key = ref.get("manifest_key")
                if not isinstance(key, str):
                    raise ValueError("bundle ref must include manifest_key")
                manifest = _json_dict(self.store.get(key), "bundle manifest")
        self._check_manifest(manifest)
        return dict(manifest)

    def _check_manifest(self, m: Mapping[str, Any]) -> None:
        if m.get("version") != 1 or m.get("layout") != "bundle":
            raise ValueError("invalid bundle manifest")
        oid = m.get("object_id")
        if not isinstance(oid, str):
            raise ValueError("bundle manifest object_id must be a string")
        ids = m.get("buffer_object_ids", [oid])
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ValueError("bundle manifest buffer_object_ids must be a list of strings")
        bases = [f"{self.key_prefix}/{i}" for i in ids]
        self._check_payload(m.get("meta"), [f"{self.key_prefix}/{oid}"])
        cleanup = m.get("cleanup_keys", [])
        if not isinstance(cleanup, list) or not all(
                isinstance(k, str) and any(k == f"{b}/manifest" or k.startswith(f"{b}/") for b in bases)
                for k in cleanup):
            raise ValueError("bundle manifest cleanup_keys are outside the bundle namespace")
        buffers = m.get("buffers")
        if not isinstance(buffers, dict):
            raise ValueError("bundle manifest buffers must be a dict")
        for name, spec in buffers.items():
            _segment(name, "buffer name")
            self._check_payload(spec, bases)

    @staticmethod
    def _check_payload(spec: Any, bases: Sequence[str]) -> None:
        if not isinstance(spec, dict):
            raise ValueError("bundle payload spec must be a dict")
        key = spec.get("key")
        if not isinstance(key, str) or not any(key.startswith(f"{b}/") for b in bases):
            raise ValueError("bundle payload key is outside the bundle namespace")
        total = int(spec.get("bytes", -1))
        if total < 0:
            raise ValueError("bundle payload bytes must be non-negative")
        chunks = spec.get("chunks")
        if not isinstance(chunks, list) or (total and not chunks):
            raise ValueError("bundle payload chunks are invalid")
        seen: set[str] = set()
        summed = 0
        for c in chunks:
            if not isinstance(c, dict):
                raise ValueError("bundle chunk must be a dict")
            ck, n = c.get("key"), int(c.get("bytes", -1))
            if not isinstance(ck, str) or (ck != key and not ck.startswith(f"{key}/")):
                raise ValueError("bundle chunk key is outside the payload namespace")
            if ck in seen:
                raise ValueError("bundle chunk keys must be unique")
            if n < 0:
                raise ValueError("bundle chunk bytes must be non-negative")
            seen.add(ck)
            summed += n
        if summed != total:
            raise ValueError(f"bundle payload chunks total {summed} bytes, expected {total}")

    def _read(self, spec: Mapping[str, Any]) -> bytes:
        """A payload's bytes (every chunk, each checked for its length)."""
        out = []
        for c in spec["chunks"]:
            data = self.store.get(c["key"])
            if len(data) != int(c["bytes"]):
                raise RuntimeError(f"get failed for {c['key']}: expected {int(c['bytes'])} bytes, got {len(data)}")
            out.append(bytes(data))
        return b"".join(out)

    def _read_object(self, spec: Mapping[str, Any]) -> bytes:
        """A tensor member's whole object (a ``kind: tensor`` one by its key, whatever its recorded size)."""
        if spec.get("kind") == "tensor":
            data = self.store.get(spec["key"])
            if not data:
                raise RuntimeError(f"get failed for {spec['key']}: the object is missing")
            return bytes(data)
        return self._read(spec)

    # ---------------------------------------------------------------------------- structured objects

    def put_structured_object(self, payload: StructuredObjectPayload, partition: str = "default",
                              chunk_bytes: Optional[int] = None, policy: Optional[BundleTransferPolicy] = None,
                              max_inflight_put: Optional[int] = None, config: Any = None) -> RemoteBundleRef:
        """Stores JSON metadata and named members (numpy arrays, torch tensors, bytes-like values,
        ``tensor_object_buffer``\\ s), each member's encoding recorded in the metadata."""
        if not isinstance(payload.metadata, Mapping):
            raise TypeError("structured metadata must be a mapping")
        metadata = dict(payload.metadata)
        if STRUCTURED_FIELD_SPECS_KEY in metadata:
            raise ValueError(f"structured metadata key {STRUCTURED_FIELD_SPECS_KEY!r} is reserved")
        if not isinstance(metadata.get("layout", "structured"), str):
            raise ValueError("structured metadata layout must be a string")
        metadata.setdefault("layout", "structured")
        specs: dict[str, Any] = {}
        members: dict[str, Any] = {}
        for name, value in payload.buffers.items():
            _segment(name, "buffer name")
            specs[name], members[name] = _encode_member(value)
        if specs:
            metadata[STRUCTURED_FIELD_SPECS_KEY] = specs
        return self.put_bundle(_json_bytes(metadata, "structured metadata"), members, partition=partition,
                               chunk_bytes=chunk_bytes, policy=_policy(policy, max_inflight_put), config=config)

    def put_object(self, obj: Any, partition: str = "default", chunk_bytes: Optional[int] = None,
                   policy: Optional[BundleTransferPolicy] = None, max_inflight_put: Optional[int] = None,
                   config: Any = None) -> RemoteBundleRef:
        """Stores a mapping of members, or one tensor, array or bytes-like value."""
        if isinstance(obj, Mapping):
            payload = StructuredObjectPayload(metadata={}, buffers=obj)
        else:
            payload = StructuredObjectPayload(metadata={_WRAPPED: True}, buffers={"value": obj})
        return self.put_structured_object(payload, partition=partition, chunk_bytes=chunk_bytes, policy=policy,
                                          max_inflight_put=max_inflight_put, config=config)

    def get_object(self, ref: Union[RemoteBundleRef, Mapping[str, Any]]) -> Any:
        """What ``put_object`` stored: the value, or the mapping of members."""
        result = self.materialize(self.read_spec(ref))
        return result.objects["value"] if result.metadata.get(_WRAPPED) else result.objects

    def read_spec(self, ref: Union[RemoteBundleRef, Mapping[str, Any]]) -> StructuredObjectReadSpec:
        """A spec reading every member of the object ``ref`` names (narrow it with ``select_members`` and
        ``slice_member``)."""
        return StructuredObjectReadSpec(ref=ref)

    def materialize(self, spec: StructuredObjectReadSpec) -> StructuredObjectResult:
        """Reads what ``spec`` selects."""
        return self.materialize_into(spec, None)

    def materialize_into(self, spec: StructuredObjectReadSpec,
                         destinations: Optional[Mapping[str, Any]]) -> StructuredObjectResult:
        """Reads what ``spec`` selects, a member into its destination where one is given (a numpy array or
        ``raw_destination`` for arrays; ``tensor_object_buffer`` or ``raw_destination`` for tensors)."""
        if spec.member_names is not None and not spec.member_names:
            raise ValueError("structured read spec selected no members")
        manifest = self._manifest(spec.ref)
        metadata = _json_dict(self._read(manifest["meta"]), "structured metadata")
        buffers = manifest["buffers"]
        names = list(buffers) if spec.member_names is None else list(spec.member_names)
        missing = [n for n in names if n not in buffers]
        if missing:
            raise KeyError(f"unknown bundle buffers: {missing}")
        specs = _specs(metadata)
        slices = dict(spec.member_slices)
        dest = destinations or {}
        objects = {n: self._member(n, buffers[n], specs.get(n, {"encoding": "bytes"}), slices.get(n), None,
                                   dest.get(n)) for n in names}
        return StructuredObjectResult(metadata=dict(metadata), objects=objects)

    @staticmethod
    def release_result(result: Any) -> None:
        """Releases pool-backed buffers in a result (values carrying ``_mooncake_pool_owner``); kvpool's
        reads make none, so this only matters for values that came from elsewhere."""
        np = sys.modules.get("numpy")
        done: set[int] = set()
        seen: set[int] = set()

        def visit(value: Any) -> None:
            owner = getattr(value, "_mooncake_pool_owner", None)
            if owner is not None:
                if id(owner) not in done:
                    done.add(id(owner))
                    owner.release()
                return
            items: Any = None
            if isinstance(value, Mapping):
                items = value.values()
            elif hasattr(value, "batch") and hasattr(value, "non_tensor_batch"):
                items = (value.batch, value.non_tensor_batch, getattr(value, "meta_info", None))
            elif isinstance(value, (list, tuple)):
                items = value
            elif np is not None and isinstance(value, np.ndarray) and value.dtype == object:
                items = value.flat
            if items is not None and id(value) not in seen:
                seen.add(id(value))
                for item in items:
                    visit(item)

        visit(result)

    # ---------------------------------------------------------------------------- reading members

    def _pooled_reads(self) -> bool:
        """Whether the wheel would read a bytes member into its BufferPool, and so hand back a uint8 array:
        it has a pool (given, or made for a set-up store) and the store has ranged reads."""
        if not callable(getattr(self.store, "get_into_ranges", None)):
            return False
        if self._buffer_pool is not None:
            return True
        capsule = getattr(self.store, "_get_pyclient_capsule", None)
        try:
            return callable(capsule) and capsule() is not None
        except Exception:  # noqa: BLE001 - a store that cannot say has no pool
            return False

    def _member(self, name: str, spec: Mapping[str, Any], fspec: Mapping[str, Any],
                sl: Optional[StructuredMemberSlice], rows: Optional[Sequence[int]], dest: Any) -> Any:
        """One member, whole, sliced (``sl``) or by row indices (``rows``), into ``dest`` when given."""
        encoding = fspec.get("encoding", "bytes")
        if encoding == "bytes":
            if rows is not None:
                raise ValueError(f"structured member {name} does not support indexed rows")
            if sl is not None:
                raise ValueError(f"structured bytes member {name} does not support slicing")
            if dest is not None:
                raise ValueError(f"structured bytes member {name} does not support materialize_into")
            data = self._read(spec)
            if not data or not self._pooled_reads():
                return data
            np = _np()
            return np.frombuffer(bytearray(data), dtype=np.uint8)
        if encoding == "ndarray":
            return self._ndarray_member(name, spec, fspec, sl, rows, dest)
        if encoding == "torch_tensor":
            return self._tensor_member(name, spec, fspec, sl, rows, dest)
        raise ValueError(f"unsupported structured field encoding: {encoding}")

    def _ndarray_member(self, name: str, spec: Mapping[str, Any], fspec: Mapping[str, Any],
                        sl: Optional[StructuredMemberSlice], rows: Optional[Sequence[int]], dest: Any) -> Any:
        np = _np()
        dtype, shape = fspec.get("dtype"), fspec.get("shape")
        if not isinstance(dtype, str) or not isinstance(shape, list):
            raise ValueError(f"structured ndarray field {name} is missing dtype or shape")
        dt = np.dtype(dtype)
        full = tuple(int(d) for d in shape)
        if sl is not None or rows is not None:
            if sl is not None and sl.axis != 0:
                raise ValueError("structured ndarray slicing currently supports axis=0 only")
            if not full:
                raise ValueError("structured ndarray slicing requires at least one dimension"
                                 if rows is None else "structured ndarray indexed read requires at least one dimension")
        data = self._read(spec)
        whole = np.frombuffer(bytearray(data), dtype=dt).reshape(full) if data else np.zeros(full, dtype=dt)
        if rows is not None:
            picked = whole[list(rows)] if rows else whole[:0]
        elif sl is not None:
            start, end, step = _rows_of(sl, full[0])
            picked = whole[start:end:step]
        else:
            picked = whole
        target = _ndarray_target(name, dest, dt, tuple(picked.shape))
        if target is None:
            return np.ascontiguousarray(picked) if picked is not whole else whole
        target[...] = picked
        return target

    def _tensor_member(self, name: str, spec: Mapping[str, Any], fspec: Mapping[str, Any],
                       sl: Optional[StructuredMemberSlice], rows: Optional[Sequence[int]], dest: Any) -> Any:
        if fspec.get("nested"):
            raise _codecs.unsupported("nested tensor")
        if spec.get("format") == "torch_save":
            if dest is not None:
                raise ValueError(f"structured torch_save tensor member {name} does not support destinations")
            value = _torch().load(io.BytesIO(self._read(spec)), weights_only=True)
            if rows is not None:
                return value[list(rows)]
            if sl is not None:
                if sl.axis != 0:
                    raise ValueError("structured tensor slicing currently supports axis=0 only")
                start, end, step = _rows_of(sl, len(value))
                return value[start:end:step]
            return value
        if dest is not None and not isinstance(dest, (_ObjectBuffer, _RawDestination)):
            raise ValueError(f"structured tensor member {name} only supports tensor_object_buffer or "
                             "raw_destination destinations")
        whole_read = sl is None and rows is None
        if whole_read and spec.get("kind") == "tensor":  # what the store's tensor put wrote: its tensor get
            get = getattr(self.store, "get_tensor" if dest is None else "get_tensor_into", None)
            if callable(get):
                return get(spec["key"]) if dest is None else get(spec["key"], dest.ptr, dest.size)
        obj = self._read_object(spec)
        meta = _parse_object(obj)
        if whole_read:
            if dest is None:
                return _tensor_of_object(obj)
            _fits(dest, len(obj), "tensor")
            ctypes.memmove(dest.ptr, obj, len(obj))
            if spec.get("kind") == "tensor":  # as the store's get_tensor_into: a tensor over the buffer
                return _tensor_from_memory(dest.ptr, len(obj))
            return dest
        shape = meta.local_shape
        if not shape:
            raise ValueError("structured tensor slicing requires at least one dimension" if rows is None
                             else "structured tensor indexed read requires at least one dimension")
        width = _DTYPES[meta.dtype][1]
        for d in shape[1:]:
            width *= d
        body = memoryview(obj)[meta.data_offset:meta.data_offset + meta.data_bytes]
        if rows is None:
            assert sl is not None
            if sl.axis != 0:
                raise ValueError("structured tensor slicing currently supports axis=0 only")
            start, end, step = _rows_of(sl, shape[0])
            if step != 1:
                raise ValueError("structured tensor slicing currently requires step=1")
            picked = list(range(start, end))
        else:
            picked = list(rows)
        data = b"".join(bytes(body[r * width:(r + 1) * width]) for r in picked)
        out_shape = [len(picked), *shape[1:]]
        if dest is None:
            return _tensor_from(meta, data, out_shape)
        whole = _object_bytes(meta, out_shape, data)
        _fits(dest, len(whole), "tensor")
        ctypes.memmove(dest.ptr, whole, len(whole))
        return dest

    # ------------------------------------------------------------------------------- DataProto

    def put(self, data: Any, *, type: Literal["dataproto", "dict"] = "dataproto", namespace: str = "default",
            partition: str = "default", stage: str = "default", chunk_bytes: Optional[int] = None,
            policy: Optional[BundleTransferPolicy] = None, config: Any = None,
            field_schemas: Optional[Mapping[str, FieldSchema]] = None) -> MooncakeDataProtoRef:
        """Stores a DataProto-like object (``type="dataproto"``) or a flat dict (``type="dict"``: row-aligned
        tensors and arrays go to ``batch``, other row-aligned sequences to ``non_tensor_batch``, the rest to
        ``meta_info``) as one stage; its ref."""
        if type == "dataproto":
            stage_data = data
        elif type == "dict":
            stage_data = _flat_to_envelope(data, field_schemas)
        else:
            raise ValueError(f"unsupported Mooncake payload type: {type!r}")
        return self._put_stage(None, stage_data, namespace=namespace, partition=partition, stage=stage,
                               chunk_bytes=chunk_bytes, policy=policy, overwrite=False, config=config,
                               field_schemas=field_schemas)

    def get(self, ref: DataProtoRefLike, *, type: Literal["dataproto", "dict"] = "dataproto",
            fields: Optional[Sequence[str]] = None, batch_fields: Optional[Sequence[str]] = None,
            non_tensor_fields: Optional[Sequence[str]] = None, meta_info_keys: Optional[Sequence[str]] = None,
            data_cls: Optional[Any] = None, destinations: Optional[Mapping[str, Any]] = None,
            rows: Union[slice, StructuredMemberSlice, Sequence[int], None] = None) -> Any:
        """Reads what ``put`` stored: a DataProto-like result (``type="dataproto"``) or a flat dict."""
        if type not in ("dataproto", "dict"):
            raise ValueError(f"unsupported Mooncake payload type: {type!r}")
        flat = type == "dict"
        result = self._get(ref, fields=fields, batch_fields=batch_fields, non_tensor_fields=non_tensor_fields,
                           meta_info_keys=meta_info_keys, data_cls=dict if flat else data_cls,
                           destinations=destinations, rows=rows, flat=flat)
        return _envelope_to_flat(result) if flat else result

    def put_dataproto(self, data: Any, *, namespace: str = "default", partition: str = "default",
                      stage: str = "default", chunk_bytes: Optional[int] = None,
                      policy: Optional[BundleTransferPolicy] = None,
                      field_schemas: Optional[Mapping[str, FieldSchema]] = None, config: Any = None) -> MooncakeDataProtoRef:
        """Stores a DataProto-like object (``batch``, ``non_tensor_batch``, ``meta_info``; or a dict with
        those keys, or a dict of batch fields) as the stage ``stage``; its ref."""
        return self.put(data, type="dataproto", namespace=namespace, partition=partition, stage=stage,
                        chunk_bytes=chunk_bytes, policy=policy, field_schemas=field_schemas, config=config)

    def append_dataproto_fields(self, ref: DataProtoRefLike, data: Any, *, stage: str, overwrite: bool = False,
                                chunk_bytes: Optional[int] = None, policy: Optional[BundleTransferPolicy] = None,
                                field_schemas: Optional[Mapping[str, FieldSchema]] = None,
                                config: Any = None) -> MooncakeDataProtoRef:
        """Adds fields (same row count) under ``stage``: a new ref (the old stays readable until cleaned up).
        A field that exists is refused unless ``overwrite`` replaces the whole stage."""
        r = _resolve_ref(ref)
        return self._put_stage(r, data, namespace=r.namespace, partition=r.partition, stage=stage,
                               chunk_bytes=chunk_bytes, policy=policy, overwrite=overwrite,
                               field_schemas=field_schemas, config=config)

    def dataproto_manifest_view(self, ref: DataProtoRefLike) -> dict[str, Any]:
        """Each field's section, stage, member and encoding, read from the stages' manifests."""
        r = _resolve_ref(ref)
        manifests = {s: self._manifest(sr) for s, sr in r.stage_refs.items()}
        metas = {s: _json_dict(self._read(m["meta"]), "structured metadata") for s, m in manifests.items()}
        fields: dict[str, dict[str, Any]] = {}
        for name, loc in r.field_index.items():
            specs = _specs(metas[loc.stage])
            mspec = dict(specs.get(loc.member, {"encoding": "bytes"}))
            enc = r.encoded_non_tensor.get(name)
            if enc is not None:
                mspec = {"encoding": "structured_non_tensor", "codec": enc["codec"], "metadata": enc.get("metadata"),
                         "payload_members": dict(enc["payload_members"]),
                         "payload_specs": {p: dict(specs.get(m, {"encoding": "bytes"}))
                                           for p, m in enc["payload_members"].items()}}
            fields[name] = {"section": loc.section, "stage": loc.stage, "member": loc.member, "spec": mspec}
        return {
            "namespace": r.namespace, "partition": r.partition, "batch_size": r.batch_size,
            "batch_fields": {n: i for n, i in fields.items() if i["section"] == "batch"},
            "non_tensor_fields": {n: i for n, i in fields.items() if i["section"] == "non_tensor_batch"},
            "meta_info_keys": list(r.meta_info),
            "stages": {s: {"manifest_key": sr.manifest_key, "dataproto": metas[s].get("dataproto", {})}
                       for s, sr in r.stage_refs.items()},
        }

    def get_dataproto(self, ref: DataProtoRefLike, *, fields: Optional[Sequence[str]] = None,
                      batch_fields: Optional[Sequence[str]] = None, non_tensor_fields: Optional[Sequence[str]] = None,
                      meta_info_keys: Optional[Sequence[str]] = None, data_cls: Optional[Any] = None,
                      destinations: Optional[Mapping[str, Any]] = None,
                      rows: Union[slice, StructuredMemberSlice, Sequence[int], None] = None) -> Any:
        """Reads fields (all by default; ``fields`` mixes sections, or ``batch_fields`` /
        ``non_tensor_fields``), ``meta_info`` (or only ``meta_info_keys``), the same rows of each (``rows``:
        a slice, a StructuredMemberSlice, or row indices), into ``destinations`` where given. A dict of
        ``batch``, ``non_tensor_batch``, ``meta_info``, or ``data_cls`` built from them
        (``data_cls.from_dict(batch, non_tensor_batch, meta_info=...)`` if it has one)."""
        return self._get(ref, fields=fields, batch_fields=batch_fields, non_tensor_fields=non_tensor_fields,
                         meta_info_keys=meta_info_keys, data_cls=data_cls, destinations=destinations, rows=rows)

    def cleanup_dataproto(self, ref: DataProtoRefLike) -> None:
        """Removes every stage of the DataProto (a ref or an exported handle)."""
        r = _resolve_ref(ref)
        seen: set[str] = set()
        for sr in r.stage_refs.values():
            if sr.manifest_key not in seen:
                seen.add(sr.manifest_key)
                self.remove_bundle(sr)

    def cleanup_dataproto_append(self, previous: DataProtoRefLike, appended: DataProtoRefLike) -> None:
        """Removes what ``append_dataproto_fields`` wrote for ``appended`` and ``previous`` does not use
        (an append that will not be published)."""
        prev, new = _resolve_ref(previous), _resolve_ref(appended)
        for stage, sr in new.stage_refs.items():
            old = prev.stage_refs.get(stage)
            if old is None:
                self.remove_bundle(sr)
                continue
            if sr.manifest_key == old.manifest_key:
                continue
            is_exist = getattr(self.store, "is_exist", None)
            if callable(is_exist) and is_exist(sr.manifest_key) == 0:
                continue
            manifest = self._manifest(sr)
            kept = {loc.member for loc in prev.field_index.values() if loc.stage == stage}
            for name, enc in prev.encoded_non_tensor.items():
                if prev.field_index[name].stage == stage:
                    kept.update(enc["payload_members"].values())
            added = [spec for name, spec in manifest["buffers"].items() if name not in kept]
            added_ids = {self._object_id(spec["key"]) for spec in added}
            keys = [c["key"] for c in manifest["meta"]["chunks"]]
            keys += [c["key"] for spec in added for c in spec["chunks"]]
            keys += [k for k in manifest.get("cleanup_keys", []) if self._object_id(k) in added_ids]
            _remove_keys(self.store, keys, strict=True)
            _remove_keys(self.store, [sr.manifest_key], strict=True)

    def _put_stage(self, ref: Optional[MooncakeDataProtoRef], data: Any, *, namespace: str, partition: str,
                   stage: str, chunk_bytes: Optional[int], policy: Optional[BundleTransferPolicy], overwrite: bool,
                   field_schemas: Optional[Mapping[str, FieldSchema]] = None, config: Any = None) -> MooncakeDataProtoRef:
        batch, non_tensor, meta_info = _split(data)
        _check_schema_sections(batch, non_tensor, meta_info, field_schemas)
        size = _batch_size(batch, non_tensor)
        if ref is not None and size != ref.batch_size:
            raise ValueError(f"DataProto append batch size {size} does not match ref batch size {ref.batch_size}")
        both = sorted(set(batch) & set(non_tensor))
        if both:
            raise ValueError(f"DataProto batch and non_tensor_batch fields overlap: {both}")
        members: dict[str, Any] = {}
        updates: dict[str, StructuredFieldLocation] = {}
        for name, value in batch.items():
            members[f"batch.{name}"] = value
            updates[name] = StructuredFieldLocation(stage, f"batch.{name}", "batch")
        encoded_updates: dict[str, Any] = {}
        for name, value in non_tensor.items():
            member = f"non_tensor_batch.{name}"
            enc = _encode_column(name, value, _schema_for(field_schemas, name, "non_tensor_batch"))
            updates[name] = StructuredFieldLocation(stage, member, "non_tensor_batch")
            if enc is None:
                members[member] = value
                continue
            parts: dict[str, str] = {}
            for part, part_value in enc.payload.items():
                members[f"{member}.{part}"] = part_value
                parts[part] = f"{member}.{part}"
            encoded_updates[name] = {"codec": enc.codec, "rows": enc.rows, "metadata": enc.metadata,
                                     "payload_members": parts}
        if not members:
            if ref is not None:
                return MooncakeDataProtoRef(ref.batch_size, dict(ref.stage_refs), dict(ref.field_index),
                                            {**ref.meta_info, **meta_info}, ref.namespace, ref.partition,
                                            ref.global_indexes, dict(ref.encoded_non_tensor), ref._storage_group_id)
            return MooncakeDataProtoRef(size, {}, {}, dict(meta_info), namespace, partition,
                                        encoded_non_tensor={}, _storage_group_id=_new_group(config))
        dup = sorted(set(ref.field_index) & set(updates)) if ref is not None else []
        if dup and not overwrite:
            raise ValueError(f"DataProto fields already exist: {dup}")
        if ref is not None and overwrite:
            dangling = [n for n, loc in ref.field_index.items() if loc.stage == stage and n not in updates]
            if dangling:
                raise ValueError(f"DataProto overwrite for stage {stage!r} must include existing fields: "
                                 f"{sorted(dangling)}")
        group = _new_group(config) if ref is None else ref._storage_group_id
        cfg = config if group is None else _with_group(self.store, config, group)
        payload = StructuredObjectPayload(
            metadata={"layout": "dataproto_stage", "dataproto": {"version": 1, "namespace": namespace,
                                                                 "partition": partition, "stage": stage,
                                                                 "batch_size": size}},
            buffers=members)
        existing = ref.stage_refs.get(stage) if ref is not None else None
        if existing is not None and not overwrite:
            stage_ref = self._append_to_stage(existing, payload, partition=partition, chunk_bytes=chunk_bytes,
                                              policy=policy, config=cfg)
        else:
            stage_ref = self.put_structured_object(payload, partition=partition, chunk_bytes=chunk_bytes,
                                                   policy=policy, config=cfg)
            if existing is not None and overwrite and existing.manifest_key != stage_ref.manifest_key:
                self.remove_bundle(existing)
        if ref is None:
            return MooncakeDataProtoRef(size, {stage: stage_ref}, dict(updates), dict(meta_info), namespace, partition,
                                        None, dict(encoded_updates), group)
        encoded = dict(ref.encoded_non_tensor)
        for name in updates:
            encoded.pop(name, None)
        encoded.update(encoded_updates)
        return MooncakeDataProtoRef(size, {**ref.stage_refs, stage: stage_ref}, {**ref.field_index, **updates},
                                    {**ref.meta_info, **meta_info}, namespace, partition, ref.global_indexes,
                                    encoded, group)

    def _append_to_stage(self, old_ref: RemoteBundleRef, payload: StructuredObjectPayload, *, partition: str,
                         chunk_bytes: Optional[int], policy: Optional[BundleTransferPolicy],
                         config: Any = None) -> RemoteBundleRef:
        """Writes the new members as a bundle, then a manifest of the old and new members together (the
        old objects stay until the merged bundle is removed)."""
        new_ref = self.put_structured_object(payload, partition=partition, chunk_bytes=chunk_bytes, policy=policy,
                                             config=config)
        try:
            old, new = self._manifest(old_ref), self._manifest(new_ref)
            old_meta = _json_dict(self._read(old["meta"]), "structured metadata")
            new_meta = _json_dict(self._read(new["meta"]), "structured metadata")
            if old_meta.get("dataproto") != new_meta.get("dataproto"):
                raise ValueError("DataProto stage metadata mismatch during manifest merge")
            old_specs, new_specs = dict(_specs(old_meta)), dict(_specs(new_meta))
            clash = sorted(set(old_specs) & set(new_specs))
            if clash:
                raise ValueError(f"structured members already exist: {clash}")
            merged_meta = dict(old_meta)
            if old_specs or new_specs:
                merged_meta[STRUCTURED_FIELD_SPECS_KEY] = {**old_specs, **new_specs}
            buffers = dict(old["buffers"])
            clash = sorted(set(buffers) & set(new["buffers"]))
            if clash:
                raise ValueError(f"structured members already exist: {clash}")
            buffers.update(new["buffers"])
            cleanup = [*old.get("cleanup_keys", []), self._manifest_key(old_ref, old),
                       *[c["key"] for c in old["meta"]["chunks"]], self._manifest_key(new_ref, new),
                       *[c["key"] for c in new["meta"]["chunks"]]]
            merged = self._put_merged_manifest(_json_bytes(merged_meta, "structured metadata"), buffers,
                                               partition=partition, chunk_bytes=chunk_bytes, cleanup_keys=cleanup,
                                               config=config)
        except Exception:
            self.remove_bundle(new_ref)
            raise
        _remove_keys(self.store, [self._manifest_key(new_ref, new), *[c["key"] for c in new["meta"]["chunks"]]],
                     strict=False)
        return merged

    def _put_merged_manifest(self, meta: bytes, buffers: Mapping[str, Any], *, partition: str,
                             chunk_bytes: Optional[int], cleanup_keys: Sequence[str], config: Any) -> RemoteBundleRef:
        _segment(partition, "partition")
        size = _chunk_bytes(self.default_chunk_bytes if chunk_bytes is None else chunk_bytes)
        object_id = f"{partition}/{uuid.uuid4().hex}"
        base = f"{self.key_prefix}/{object_id}"
        written: list[str] = []
        try:
            meta_spec = self._put_payload(f"{base}/meta", memoryview(meta), size, "copy", config, written)
            cleanup = list(dict.fromkeys(cleanup_keys))
            ids = {self._object_id(str(spec["key"])) for spec in buffers.values()}
            ids.update(self._object_id(k) for k in cleanup)
            manifest: dict[str, Any] = {"version": 1, "layout": "bundle", "object_id": object_id, "meta": meta_spec,
                                        "buffers": dict(buffers), "buffer_object_ids": sorted(i for i in ids if i)}
            if cleanup:
                manifest["cleanup_keys"] = cleanup
            self._check_manifest(manifest)
            key = f"{base}/manifest"
            _check(_write(self.store.put, key, _json_bytes(manifest, "bundle manifest"),
                          config=_one_key_config(config)), "put", key)
            written.append(key)
        except Exception:
            _remove_keys(self.store, written, strict=False)
            raise
        return RemoteBundleRef(manifest_key=key, manifest=manifest)

    def _get(self, ref: DataProtoRefLike, *, fields: Optional[Sequence[str]], batch_fields: Optional[Sequence[str]],
             non_tensor_fields: Optional[Sequence[str]], meta_info_keys: Optional[Sequence[str]], data_cls: Any,
             destinations: Optional[Mapping[str, Any]], rows: Any, flat: bool = False) -> Any:
        r = _resolve_ref(ref)
        sl, picked, out_rows = _row_selection(rows, r.batch_size)
        batch_names, non_tensor_names = _selected(r, fields, batch_fields, non_tensor_fields)
        dest = destinations or {}
        batch: dict[str, Any] = {}
        non_tensor: dict[str, Any] = {}
        stage_cache: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}

        def stage_of(stage: str) -> tuple[dict[str, Any], dict[str, Any]]:
            if stage not in stage_cache:
                m = self._manifest(r.stage_refs[stage])
                stage_cache[stage] = (m, _specs(_json_dict(self._read(m["meta"]), "structured metadata")))
            return stage_cache[stage]

        def read(stage: str, member: str, d: Any = None, plain_rows: bool = True) -> Any:
            m, specs = stage_of(stage)
            if member not in m["buffers"]:
                raise KeyError(f"unknown bundle buffers: {[member]}")
            return self._member(member, m["buffers"][member], specs.get(member, {"encoding": "bytes"}),
                                sl if plain_rows else None, picked if plain_rows else None, d)

        for section, names in (("batch", batch_names), ("non_tensor_batch", non_tensor_names)):
            for name in names:
                loc = r.field_index[name]
                enc = r.encoded_non_tensor.get(name) if loc.section == "non_tensor_batch" else None
                target = batch if loc.section == "batch" else non_tensor
                if enc is None:
                    target[name] = read(loc.stage, loc.member, dest.get(name))
                    continue
                if sl is not None and sl.step != 1:
                    raise ValueError("DataProto structured non-tensor slicing currently requires step=1")
                payload = {p: read(loc.stage, m, plain_rows=False) for p, m in enc["payload_members"].items()}
                values = _codecs.decode(enc["codec"], payload, r.batch_size, enc.get("metadata") or {})
                if picked is not None:
                    values = [values[i] for i in picked]
                elif sl is not None:
                    start, end, step = _rows_of(sl, r.batch_size)
                    values = values[start:end:step]
                target[name] = values if flat else _object_array(values)
        meta_info = dict(r.meta_info) if meta_info_keys is None else \
            {k: r.meta_info[k] for k in meta_info_keys if k in r.meta_info}
        return _build_result(batch, non_tensor, meta_info, data_cls)


class _TensorValue:
    """A torch tensor member (stored as Mooncake's tensor object)."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor


def _encode_member(value: Any) -> tuple[dict[str, Any], Any]:
    """(the member's encoding, what to store) for a structured object member."""
    if isinstance(value, _ObjectBuffer):
        return {"encoding": "torch_tensor"}, value
    if _is_tensor(value):
        if getattr(value, "is_nested", False):
            raise _codecs.unsupported("nested tensor")
        return ({"encoding": "torch_tensor", "dtype": str(value.dtype), "shape": [int(d) for d in value.shape],
                 "element_size": int(value.element_size())}, _TensorValue(value))
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)
        return {"encoding": "ndarray", "dtype": a.dtype.str, "shape": [int(d) for d in a.shape]}, \
            a.view(np.uint8).reshape(-1)
    return {"encoding": "bytes"}, value


def _ndarray_target(name: str, dest: Any, dt: Any, shape: tuple[int, ...]) -> Any:
    """The array to read into (None: a new one), checked as the wheel checks it."""
    np = _np()
    if dest is None:
        return None
    if isinstance(dest, _RawDestination):
        n = dt.itemsize
        for d in shape:
            n *= d
        if dest.size < n:
            raise ValueError(f"raw destination has {dest.size} bytes, expected at least {n}")
        return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(dest.ptr)).view(dt).reshape(shape)
    if not isinstance(dest, np.ndarray):
        raise TypeError(f"structured ndarray field {name} destination must be a numpy.ndarray or raw_destination")
    if dest.dtype != dt:
        raise ValueError(f"structured ndarray field {name} destination dtype mismatch: expected {dt.str}, "
                         f"got {dest.dtype.str}")
    if tuple(dest.shape) != shape:
        raise ValueError(f"structured ndarray field {name} destination shape mismatch: expected {shape}, "
                         f"got {tuple(dest.shape)}")
    if not dest.flags["C_CONTIGUOUS"]:
        raise ValueError(f"structured ndarray field {name} destination must be C-contiguous")
    if not dest.flags["WRITEABLE"]:
        raise ValueError(f"structured ndarray field {name} destination must be writeable")
    return dest


def _fits(dest: Any, n: int, what: str) -> None:
    if dest.size < n:
        raise ValueError(f"{what} destination has {dest.size} bytes, expected at least {n}")


def _tensor_from_memory(ptr: int, total: int) -> Any:
    from .tensor_layout import _tensor_of, _user_memory
    return _tensor_of(_torch(), _user_memory(ptr, total), total, "structured_object_store")


def _object_array(values: list[Any]) -> Any:
    np = _np()
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


# ------------------------------------------------------------------------------ DataProto helpers

def _as_dict(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    items = getattr(value, "items", None)
    if callable(items):
        return dict(items())
    raise TypeError(f"expected mapping-like value, got {type(value).__name__}")


def _is_envelope(data: Mapping[str, Any]) -> bool:
    return bool(data) and set(data) <= {"batch", "non_tensor_batch", "meta_info"} and all(
        v is None or isinstance(v, Mapping) or callable(getattr(v, "items", None)) for v in data.values())


def _split(data: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    if isinstance(data, Mapping):
        if _is_envelope(data):
            return _as_dict(data.get("batch")), _as_dict(data.get("non_tensor_batch")), _as_dict(data.get("meta_info"))
        return dict(data), {}, {}
    return (_as_dict(getattr(data, "batch", None)), _as_dict(getattr(data, "non_tensor_batch", None)),
            _as_dict(getattr(data, "meta_info", None)))


def _batch_size(batch: Mapping[str, Any], non_tensor: Mapping[str, Any]) -> int:
    sizes = {len(v) for part in (batch, non_tensor) for v in part.values()}
    if not sizes:
        return 0
    if len(sizes) != 1:
        raise ValueError(f"DataProto fields have inconsistent batch sizes: {sorted(sizes)}")
    return sizes.pop()


_SECTIONS = ("batch", "non_tensor_batch", "meta_info")


def _schema_section(name: str, schema: FieldSchema) -> Optional[str]:
    section = schema.metadata.get("section")
    if section is None:
        return None
    if section not in _SECTIONS:
        raise ValueError(f"FieldSchema for {name!r} metadata['section'] must be one of {sorted(_SECTIONS)}")
    return str(section)


def _schema_for(schemas: Optional[Mapping[str, FieldSchema]], name: str, section: str) -> Optional[FieldSchema]:
    schema = (schemas or {}).get(name)
    if schema is None:
        return None
    declared = _schema_section(name, schema)
    return schema if declared is None or declared == section else None


def _schema_dtype(schema: FieldSchema) -> Any:
    name = schema.metadata.get("dtype")
    if name is None:
        return None
    np = _np()
    try:
        dt = np.dtype(name)
    except (TypeError, ValueError) as e:
        raise ValueError(f"invalid FieldSchema metadata['dtype']: {name!r}") from e
    if dt.kind not in "biufc":
        raise ValueError(f"FieldSchema metadata['dtype'] must be numeric or bool, got {dt}")
    return dt


def _check_schema_sections(batch: Mapping[str, Any], non_tensor: Mapping[str, Any], meta_info: Mapping[str, Any],
                           schemas: Optional[Mapping[str, FieldSchema]]) -> None:
    if not schemas:
        return
    actual: dict[str, set[str]] = {}
    for section, part in zip(_SECTIONS, (batch, non_tensor, meta_info)):
        for name in part:
            actual.setdefault(name, set()).add(section)
    for name, schema in schemas.items():
        declared = _schema_section(name, schema)
        found = actual.get(name)
        if declared is None or not found or declared in found:
            continue
        raise ValueError(f"FieldSchema for {name!r} declares section {declared!r}, but data contains it in "
                         f"{', '.join(repr(s) for s in sorted(found))}")


def _encode_column(name: str, value: Any, schema: Optional[FieldSchema]) -> Optional[_codecs.Encoded]:
    """A non_tensor_batch column encoded: by its FieldSchema's codec, else (an array of objects) by the codec
    inferred from its values; None for a column stored as it is (an array of numbers)."""
    path = f"non_tensor_batch.{name}"
    enc = None
    if schema is not None:
        try:
            column = _schema_column(name, value)
            if not schema.nullable and any(v is None for v in column):
                raise ValueError(f"FieldSchema for {path!r} is not nullable")
            if schema.codec != "auto":
                enc = _encode_by_schema(path, list(column), schema)
        except (TypeError, ValueError, RuntimeError, AttributeError) as e:
            raise type(e)(f"failed to encode non_tensor_batch field {name!r} with FieldSchema codec "
                          f"{schema.codec!r}: {e}") from e
    np = sys.modules.get("numpy")
    if enc is None and np is not None and isinstance(value, np.ndarray) and value.dtype == object:
        enc = _codecs.encode_inferred(path, list(value))
    return enc


def _encode_by_schema(path: str, values: list[Any], schema: FieldSchema) -> _codecs.Encoded:
    codec = schema.codec
    if codec == "ndarray":
        dt = _schema_dtype(schema)
        return _codecs.encode_auto(path, values) if dt is None else _codecs.encode_with("ndarray", values, {"dtype": dt})
    if codec == "typed_ragged":
        return _codecs.encode_with(codec, values, {"dtype": _schema_dtype(schema)})
    if codec == "msgpack_ragged":
        try:
            return _codecs.encode_with(codec, values)
        except TypeError as e:
            raise ValueError(f"unsupported structured non-tensor field {path}: msgpack codec cannot encode value") \
                from e
    return _codecs.encode_with(codec, values)


def _schema_column(name: str, value: Any) -> Any:
    np = _np()
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray)):
        out = np.empty(len(value), dtype=object)
        out[:] = list(value)
        return out
    raise TypeError(f"non_tensor_batch field {name!r} with FieldSchema must be an ndarray or non-string sequence")


def _selected(r: MooncakeDataProtoRef, fields: Optional[Sequence[str]], batch_fields: Optional[Sequence[str]],
              non_tensor_fields: Optional[Sequence[str]]) -> tuple[list[str], list[str]]:
    if fields is not None and (batch_fields is not None or non_tensor_fields is not None):
        raise ValueError("fields cannot be combined with batch_fields or non_tensor_fields")
    if fields is not None:
        names = list(fields)
        _known(r, names)
        return ([n for n in names if r.field_index[n].section == "batch"],
                [n for n in names if r.field_index[n].section == "non_tensor_batch"])
    if batch_fields is None and non_tensor_fields is None:
        b = [n for n, loc in r.field_index.items() if loc.section == "batch"]
        nt = [n for n, loc in r.field_index.items() if loc.section == "non_tensor_batch"]
    else:
        b = [] if batch_fields is None else list(batch_fields)
        nt = [] if non_tensor_fields is None else list(non_tensor_fields)
    _known(r, [*b, *nt])
    return b, nt


def _known(r: MooncakeDataProtoRef, names: Sequence[str]) -> None:
    missing = [n for n in names if n not in r.field_index]
    if missing:
        raise KeyError(f"unknown DataProto fields: {missing}")


def _row_selection(rows: Any, total: int) -> tuple[Optional[StructuredMemberSlice], Optional[list[int]], int]:
    """(a slice, or row indices, and the row count read) for ``rows``."""
    if rows is None:
        return None, None, total
    if isinstance(rows, StructuredMemberSlice):
        if rows.axis != 0:
            raise ValueError("DataProto row slicing currently supports axis=0 only")
        return rows, None, _count(*_rows_of(rows, total))
    if isinstance(rows, slice):
        start, end, step = rows.indices(total)
        if step <= 0:
            raise ValueError("DataProto row slicing step must be positive")
        return StructuredMemberSlice(0, start, end, step), None, _count(start, end, step)
    if isinstance(rows, Sequence) and not isinstance(rows, (str, bytes, bytearray)):
        np = sys.modules.get("numpy")
        out = []
        for i in rows:
            if isinstance(i, bool) or not (isinstance(i, int) or (np is not None and isinstance(i, np.integer))):
                raise TypeError("DataProto row indices must be integers")
            j = int(i) + (total if int(i) < 0 else 0)
            if not 0 <= j < total:
                raise IndexError(f"DataProto row index {i} out of range for {total} rows")
            out.append(j)
        return None, out, len(out)
    raise TypeError("DataProto rows must be a slice, StructuredMemberSlice, or row index sequence")


def _build_result(batch: dict[str, Any], non_tensor: dict[str, Any], meta_info: dict[str, Any], data_cls: Any) -> Any:
    if data_cls is None or data_cls is dict:
        return {"batch": batch, "non_tensor_batch": non_tensor, "meta_info": meta_info}
    from_dict = getattr(data_cls, "from_dict", None)
    try:
        if callable(from_dict):
            return from_dict(batch, non_tensor, meta_info=meta_info)
        return data_cls(batch=batch, non_tensor_batch=non_tensor, meta_info=meta_info)
    except TypeError as e:
        raise TypeError(f"{getattr(data_cls, '__name__', data_cls)!r} cannot be constructed from batch, "
                        "non_tensor_batch, and meta_info") from e


def _envelope_to_flat(data: Mapping[str, Any]) -> dict[str, Any]:
    meta, batch, non_tensor = (_as_dict(data.get(k)) for k in ("meta_info", "batch", "non_tensor_batch"))
    clash = (set(meta) & set(batch)) | (set(meta) & set(non_tensor)) | (set(batch) & set(non_tensor))
    if clash:
        raise ValueError(f"Duplicate keys found across DataProto sections: {sorted(clash)}")
    np = sys.modules.get("numpy")
    out = dict(meta)
    out.update(batch)
    for name, value in non_tensor.items():
        is_objects = np is not None and isinstance(value, np.ndarray) and value.dtype == object
        out[name] = value.tolist() if is_objects else value
    return out


def _is_sequence(v: Any) -> bool:
    return isinstance(v, Sequence) and not isinstance(v, (str, bytes, bytearray))


def _dense_rows(v: Any, n: int) -> bool:
    if n == 0:
        return False
    if _is_tensor(v):
        return bool(tuple(v.shape[:1]) == (n,))
    np = sys.modules.get("numpy")
    return np is not None and isinstance(v, np.ndarray) and v.dtype != object and v.shape[:1] == (n,)


def _flat_to_envelope(data: Mapping[str, Any], schemas: Optional[Mapping[str, FieldSchema]]) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise TypeError("flat dict payload must be a mapping")
    schemas = schemas or {}
    sized = set()
    for name, schema in schemas.items():
        if name in data and _schema_section(name, schema) in ("batch", "non_tensor_batch"):
            try:
                sized.add(len(data[name]))
            except TypeError as e:
                raise ValueError(f"flat dict row-aligned field {name!r} must be sized") from e
    if len(sized) > 1:
        raise ValueError(f"flat dict fields have inconsistent batch sizes: {sorted(sized)}")
    schema_rows = sized.pop() if sized else 0
    n = schema_rows
    if n == 0:
        meta_named = {k for k, s in schemas.items() if k in data and _schema_section(k, s) == "meta_info"}
        n = _auto_rows(data, meta_named)
    batch: dict[str, Any] = {}
    non_tensor: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    for key, value in data.items():
        found = schemas.get(key)
        section = None if found is None else _schema_section(key, found)
        if section is None:
            if _dense_rows(value, n):
                batch[key] = value
            elif schema_rows == 0 and _is_sequence(value) and len(value) == n:
                non_tensor[key] = _flat_column(key, value, n, found)
            else:
                meta[key] = value
        elif section == "batch":
            batch[key] = value
        elif section == "non_tensor_batch":
            non_tensor[key] = _flat_column(key, value, n, found)
        else:
            meta[key] = value
    return {"batch": batch, "non_tensor_batch": non_tensor, "meta_info": meta}


def _auto_rows(data: Mapping[str, Any], exclude: set[str]) -> int:
    np = sys.modules.get("numpy")
    dense = {len(v) for k, v in data.items() if k not in exclude and (
        (_is_tensor(v) and v.ndim > 0) or (np is not None and isinstance(v, np.ndarray) and v.dtype != object
                                           and v.ndim > 0))}
    if len(dense) > 1:
        raise ValueError(f"flat dict dense fields have ambiguous batch sizes: {sorted(dense)}")
    if dense:
        return dense.pop()
    sizes = {len(v) for k, v in data.items() if k not in exclude and (
        (np is not None and isinstance(v, np.ndarray) and v.ndim > 0) or _is_sequence(v))}
    if not sizes:
        return 0
    if len(sizes) != 1:
        raise ValueError(f"flat dict fields have ambiguous batch sizes: {sorted(sizes)}; pass FieldSchema "
                         "metadata['section'] for list-valued metadata fields")
    return sizes.pop()


def _flat_column(name: str, value: Any, n: int, schema: Optional[FieldSchema]) -> Any:
    np = _np()
    if isinstance(value, np.ndarray):
        if len(value) != n:
            raise ValueError(f"flat dict non_tensor_batch field {name!r} has batch size {len(value)}, expected {n}")
        dt = _schema_dtype(schema) if schema is not None else None
        if schema is not None and schema.codec == "ndarray" and dt is not None and (
                value.dtype != object or all(v is not None for v in value)):
            return np.asarray(value, dtype=dt)
        return value
    if _is_sequence(value):
        if len(value) != n:
            raise ValueError(f"flat dict non_tensor_batch field {name!r} has batch size {len(value)}, expected {n}")
        out = np.empty(n, dtype=object)
        out[:] = list(value)
        return out
    raise TypeError(f"flat dict non_tensor_batch field {name!r} must be an ndarray or non-string sequence")

