"""The bytes of Mooncake's tensor objects: the ``TensorMetadata`` layout, dtype codes and the PyTorch
conversions, the shard manifests, shard ranges and gathering, and the safetensors codec.

A tensor object is Mooncake's ``TensorMetadata`` (304 bytes) followed by the tensor's bytes in C order,
so an object kvpool stores reads in Mooncake and the reverse. Every integer is little-endian::

     0  magic u32 = 0x4D4F4F4E ("NOOM" on the wire) | version u16 = 1 | header size u16 = 304
     8  dtype i32 (table below) | ndim i32 (0..8)
    16  layout kind u32 (0 FULL, 1 SHARD) | reserved flags u32 = 0
    24  data offset u64 = 304
    32  data bytes u64 = numel(local shape) * element size
    40  global shape i64[8]: dims 0..ndim-1, then -1
   104  local shape i64[8]: dims 0..ndim-1, then -1 (a FULL object: the global shape)
   168  axis count u32 (0..4) | reserved u32 = 0
   176  axes[4], 32 bytes each, unused ones all zero:
          +0  kind i32 (0 DP, 1 TP, 2 EP, 3 PP) | +4 index in the request i32
          +8  shard rank i32 | +12 shard count i32
         +16  split dim i32 (-1: none) | +20 expert id (EP) or stage id (PP), else 0 i32
         +24  the local extent of the split dim i64 (0 without a split dim)
   304  data

dtype codes: 0 float32, 1 float64, 2 int8, 3 uint8, 4 int16, 5 uint16, 6 int32, 7 uint32, 8 int64,
9 uint64, 10 bool, 11 float16, 12 bfloat16, 13 float8_e4m3fn, 14 float8_e5m2. A 0-d tensor has ndim 0,
no dims and one element (and reads back, as in Mooncake, with shape ``(1,)``).

A manifest (96 bytes) records how a tensor was split (its keys: parallelism.py)::

     0  magic u32 = 0x574D414E ("NAMW") | version u16 = 1 | header size u16 = 96
     8  dtype i32 | ndim i32 | split dim i32 | shard count i32 | reserved i32 = 0 | 4 zero bytes
    32  global shape i64[8]: dims, then -1
"""

from __future__ import annotations

import ctypes
import json
import struct
from typing import Any, NamedTuple, Optional, Sequence, cast

from .args import _buffer_address
from .codes import log

__all__: list[str] = []

# ------------------------------------------------------------------------------------------ layout

META_SIZE = 304
MANIFEST_SIZE = 96
_MAGIC = 0x4D4F4F4E
_MANIFEST_MAGIC = 0x574D414E
_VERSION = 1
_MAX_DIMS = 8
_MAX_AXES = 4
_FULL, _SHARD = 0, 1
_DP, _TP, _EP, _PP = 0, 1, 2, 3

_META = struct.Struct("<IHHiiIIQQ8q8qII" + "6iq" * _MAX_AXES)
_MANIFEST = struct.Struct("<IHHiiiii4x8q")
assert _META.size == META_SIZE and _MANIFEST.size == MANIFEST_SIZE

#: (torch attribute, element size, safetensors name) by Mooncake dtype code.
_DTYPES: tuple[tuple[str, int, str], ...] = (
    ("float32", 4, "F32"), ("float64", 8, "F64"), ("int8", 1, "I8"), ("uint8", 1, "U8"),
    ("int16", 2, "I16"), ("uint16", 2, "U16"), ("int32", 4, "I32"), ("uint32", 4, "U32"),
    ("int64", 8, "I64"), ("uint64", 8, "U64"), ("bool", 1, "BOOL"), ("float16", 2, "F16"),
    ("bfloat16", 2, "BF16"), ("float8_e4m3fn", 1, "F8_E4M3"), ("float8_e5m2", 1, "F8_E5M2"))
_ST_CODES = {st: code for code, (_, _, st) in enumerate(_DTYPES)}

Axis7 = tuple[int, int, int, int, int, int, int]


def _prod(dims: Sequence[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


class _Meta:
    """A TensorMetadata: the header and layout fields (shapes hold ``ndim`` dims)."""

    __slots__ = ("dtype", "layout_kind", "data_offset", "data_bytes", "global_shape", "local_shape", "axes")

    def __init__(self, dtype: int, global_shape: Sequence[int], local_shape: Sequence[int],
                 layout_kind: int = _FULL, axes: Sequence[Axis7] = (), data_bytes: int = 0,
                 data_offset: int = META_SIZE) -> None:
        self.dtype = dtype
        self.layout_kind = layout_kind
        self.data_offset = data_offset
        self.data_bytes = data_bytes
        self.global_shape = list(global_shape)
        self.local_shape = list(local_shape)
        self.axes = list(axes)[:_MAX_AXES]

    @property
    def ndim(self) -> int:
        return len(self.global_shape)

    def pack(self) -> bytes:
        pad = [-1] * (_MAX_DIMS - self.ndim)
        axes: list[int] = []
        for a in self.axes:
            axes += a
        axes += [0] * (7 * (_MAX_AXES - len(self.axes)))
        return _META.pack(_MAGIC, _VERSION, META_SIZE, self.dtype, self.ndim, self.layout_kind, 0,
                          self.data_offset, self.data_bytes, *self.global_shape, *pad, *self.local_shape, *pad,
                          len(self.axes), 0, *axes)

    @staticmethod
    def parse(head: Any, total: int) -> Optional["_Meta"]:
        """The metadata at the start of an object of ``total`` bytes, or None if Mooncake would reject it
        (ValidateTensorMetadata: magic, version, sizes, dtype, shapes, axes, data bytes)."""
        if total < META_SIZE or len(head) < META_SIZE:
            return None
        f = _META.unpack_from(head, 0)
        magic, version, hsize, dtype, ndim, kind, _flags, off, nbytes = f[:9]
        gs, ls = f[9:17], f[17:25]
        count = f[25]
        if magic != _MAGIC or version != _VERSION or hsize != META_SIZE or not 0 <= dtype < len(_DTYPES):
            return None
        if not 0 <= ndim <= _MAX_DIMS or count > _MAX_AXES or kind > _SHARD:
            return None
        if off < META_SIZE or off > total or nbytes != total - off:
            return None
        if any(d < 0 for d in gs[:ndim] + ls[:ndim]) or any(d != -1 for d in gs[ndim:] + ls[ndim:]):
            return None
        if nbytes != _prod(ls[:ndim]) * _DTYPES[dtype][1]:
            return None
        axes = [cast(Axis7, tuple(f[27 + 7 * i:34 + 7 * i])) for i in range(count)]
        for a in axes:
            if not _DP <= a[0] <= 4 or a[3] <= 0 or not 0 <= a[2] < a[3] or not -1 <= a[4] < ndim:
                return None
        return _Meta(dtype, gs[:ndim], ls[:ndim], kind, axes, nbytes, off)

    def tp_axis(self) -> Optional[Axis7]:
        return next((a for a in self.axes if a[0] == _TP), None)


def _manifest(global_shape: Sequence[int], dtype: int, split_dim: int, count: int) -> bytes:
    pad = [-1] * (_MAX_DIMS - len(global_shape))
    return _MANIFEST.pack(_MANIFEST_MAGIC, _VERSION, MANIFEST_SIZE, dtype, len(global_shape), split_dim, count, 0,
                          *global_shape, *pad)


class _Manifest(NamedTuple):
    dtype: int
    split_dim: int
    shards: int
    global_shape: list[int]


def _parse_manifest(data: Optional[bytes]) -> Optional[_Manifest]:
    if data is None or len(data) < MANIFEST_SIZE:
        return None
    f = _MANIFEST.unpack_from(data, 0)
    magic, version, hsize, dtype, ndim, sd, count = f[:7]
    if magic != _MANIFEST_MAGIC or version != _VERSION or hsize != MANIFEST_SIZE or not 0 <= ndim <= _MAX_DIMS:
        return None
    if count <= 0 or not 0 <= sd < ndim:
        return None
    shape = list(f[8:8 + ndim])
    if any(d < 0 for d in shape):
        return None
    return _Manifest(dtype, sd, count, shape)


def _shard_range(dim: int, rank: int, count: int) -> tuple[int, int]:
    """(start, extent) of shard ``rank`` of ``count`` along a dimension of ``dim`` elements."""
    if dim < 0 or count <= 0 or not 0 <= rank < count:
        return 0, 0
    start = dim * rank // count
    return start, dim * (rank + 1) // count - start


def _uniform_ok(shape: Sequence[int], split_dim: int, count: int, ctx: str) -> bool:
    if not 0 <= split_dim < len(shape) or count <= 0:
        log.error("kvpool.mooncake %s: invalid shard parameters (split_dim %d of a %d-d tensor, %d shards)", ctx,
                  split_dim, len(shape), count)
        return False
    if shape[split_dim] < 0 or shape[split_dim] % count:
        log.error("kvpool.mooncake %s: only uniform sharding is supported (dim %d has %d elements, %d shards)",
                  ctx, split_dim, shape[split_dim], count)
        return False
    return True


def _gather_shard(src: Any, data_offset: int, shape: Sequence[int], elem: int, split_dim: int, rank: int,
                  count: int) -> bytes:
    """Shard ``rank`` of ``count`` along ``split_dim`` of the C-order data at ``src[data_offset:]``."""
    start, extent = _shard_range(shape[split_dim], rank, count)
    before = _prod(shape[:split_dim])
    after = _prod(shape[split_dim + 1:]) * elem
    row = extent * after
    if not row:
        return b""
    mv = memoryview(src).cast("B")
    if before == 1:
        o = data_offset + start * after
        return bytes(mv[o:o + row])
    stride = shape[split_dim] * after
    return b"".join(mv[data_offset + i * stride + start * after:data_offset + i * stride + start * after + row]
                    for i in range(before))


# ------------------------------------------------------------------------------------------- torch

def _dtype_code(torch: Any, dtype: Any) -> int:
    for code, (name, _, _) in enumerate(_DTYPES):
        d = getattr(torch, name, None)
        if d is not None and dtype == d:
            return code
    return -1


def _torch_dtype(torch: Any, code: int, ctx: str) -> Any:
    name = _DTYPES[code][0]
    d = getattr(torch, name, None)
    if d is None:
        log.error("kvpool.mooncake %s: dtype %s is not available in this PyTorch (%s)", ctx, name,
                  getattr(torch, "__version__", "?"))
    return d


class _Host(NamedTuple):
    """A tensor as contiguous host bytes: the tensor kept alive, its dtype code, shape and data."""
    tensor: Any
    code: int
    shape: list[int]
    nbytes: int
    ptr: int


def _host_tensor(torch: Any, obj: Any, key: str, ctx: str) -> Optional[_Host]:
    """A PyTorch tensor's bytes as Mooncake takes them (``contiguous()``; device tensors copied to host), or
    None after logging: not a tensor (the class name has no "Tensor", as Mooncake checks), an unsupported
    dtype, more than 8 dims."""
    name = getattr(getattr(obj, "__class__", None), "__name__", "")
    if "Tensor" not in str(name):
        log.error("kvpool.mooncake %s: input for %r is not a PyTorch tensor", ctx, key[:80])
        return None
    try:
        t = obj.detach().contiguous()
        if getattr(getattr(t, "device", None), "type", "cpu") != "cpu":
            t = t.to("cpu").contiguous()  # kvpool moves host bytes: a device tensor is copied out first
        code = _dtype_code(torch, t.dtype)
        if code < 0:
            log.error("kvpool.mooncake %s: unsupported tensor dtype %s for %r", ctx, t.dtype, key[:80])
            return None
        shape = [int(d) for d in t.shape]
        if len(shape) > _MAX_DIMS:
            log.error("kvpool.mooncake %s: tensor for %r has more than %d dimensions: %d", ctx, key[:80], _MAX_DIMS,
                      len(shape))
            return None
        nbytes = int(t.numel()) * int(t.element_size())
        ptr = int(t.data_ptr())
    except Exception as e:  # noqa: BLE001 - Mooncake logs and fails the put
        log.error("kvpool.mooncake %s: error extracting tensor info for %r: %s", ctx, key[:80], e)
        return None
    if ptr == 0 and nbytes:
        log.error("kvpool.mooncake %s: tensor for %r has no data", ctx, key[:80])
        return None
    return _Host(t, code, shape, nbytes, ptr)


def _object(meta: _Meta, ptr: int, nbytes: int) -> bytearray:
    """``[meta][nbytes at ptr]`` as one buffer."""
    meta.data_bytes = nbytes
    buf = bytearray(META_SIZE + nbytes)
    buf[:META_SIZE] = meta.pack()
    if nbytes:
        ctypes.memmove(_buffer_address(buf) + META_SIZE, ptr, nbytes)
    return buf


def _valid(obj: Optional[bytearray]) -> Optional[bytearray]:
    """The object if its metadata is valid (Mooncake's PyTensorInfo::valid), else None."""
    if obj is None or _Meta.parse(obj, len(obj)) is None:
        return None
    return obj


def _tensor_of(torch: Any, buf: Any, total: int, ctx: str) -> Any:
    """A tensor over the object bytes in ``buf`` (sharing them), as Mooncake's buffer_to_tensor: shape the
    local shape (``(1,)`` for 0-d), None after logging if the bytes are not a tensor object."""
    if total < META_SIZE:
        log.error("kvpool.mooncake %s: invalid data format: insufficient data for metadata", ctx)
        return None
    mv = memoryview(buf).cast("B")
    meta = _Meta.parse(mv, total)
    if meta is None:
        log.error("kvpool.mooncake %s: invalid tensor metadata", ctx)
        return None
    dt = _torch_dtype(torch, meta.dtype, ctx)
    if dt is None:
        return None
    try:
        if meta.data_bytes == 0:
            return torch.empty(tuple(meta.local_shape), dtype=dt)
        t = torch.frombuffer(mv[meta.data_offset:meta.data_offset + meta.data_bytes], dtype=dt)
        return t.reshape(tuple(meta.local_shape)) if meta.ndim else t
    except Exception as e:  # noqa: BLE001
        log.error("kvpool.mooncake %s: failed to convert buffer to tensor: %s", ctx, e)
        return None


def _user_memory(ptr: int, size: int) -> Any:
    return (ctypes.c_char * size).from_address(ptr)


# ------------------------------------------------------------------------------------ safetensors

def _safetensors_bytes(name: str, dtype: int, shape: Sequence[int], data: bytes) -> bytes:
    """One tensor in the safetensors format: u64 LE header length, the JSON header (padded with spaces to
    a multiple of 8, as the safetensors library writes it), the data."""
    header = json.dumps({name: {"dtype": _DTYPES[dtype][2], "shape": list(shape), "data_offsets": [0, len(data)]}},
                        separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data


def _read_safetensors(path: str, ctx: str) -> Optional[list[tuple[str, int, list[int], memoryview]]]:
    """The tensors of a safetensors file in data order (name, dtype code, shape, bytes), None (logged) if the
    file cannot be read or is not a valid safetensors file of dtypes Mooncake knows."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        log.error("kvpool.mooncake %s: failed to load tensor from safetensor file: %s", ctx, e)
        return None
    try:
        if len(raw) < 8:
            raise ValueError("header too small")
        n = struct.unpack_from("<Q", raw, 0)[0]
        if n > len(raw) - 8:
            raise ValueError("invalid header length")
        header = json.loads(raw[8:8 + n].decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
        data = memoryview(raw)[8 + n:]
        out = []
        for name, info in header.items():
            if name == "__metadata__":
                continue
            st, shape, (start, end) = info["dtype"], [int(d) for d in info["shape"]], info["data_offsets"]
            code = _ST_CODES.get(st)
            if code is None:
                raise ValueError(f"tensor {name!r} has dtype {st}, which Mooncake does not store")
            if not 0 <= start <= end <= len(data) or end - start != _prod(shape) * _DTYPES[code][1] or \
                    any(d < 0 for d in shape):
                raise ValueError(f"tensor {name!r} has invalid offsets or shape")
            out.append((str(name), code, shape, data[start:end]))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        log.error("kvpool.mooncake %s: failed to load tensor from safetensor file %s: %s", ctx, path, e)
        return None
    offsets = {name: info["data_offsets"][0] for name, info in header.items() if name != "__metadata__"}
    out.sort(key=lambda t: offsets[t[0]])
    return out


