"""The column codecs of Mooncake's structured object store (``structured_object_store.py`` uses them): how a
``non_tensor_batch`` field, a column of Python values one per row, becomes named buffers and back.

A column is stored as a few members, each an array or a byte string, under the names Mooncake uses, so
that either implementation reads what the other wrote:

* ``ndarray`` (numeric scalars): ``data`` (the values, one dtype) and ``nulls`` (bool per row);
* ``typed_ragged`` (numeric sequences or arrays): ``data`` (every row's values, flattened and joined),
  ``offsets`` (int64, rows + 1: where each row starts in ``data``, in elements), ``shapes`` (int64, a row
  per row, as wide as the most dimensions), ``ndims`` (int16) and ``nulls``;
* ``utf8_ragged`` (str), ``bytes_ragged`` (bytes-like), ``json_ragged`` (JSON text of each value) and
  ``msgpack_ragged`` (MessagePack of each value): ``data`` (every row's bytes joined), ``offsets`` (int64,
  rows + 1, in bytes) and ``nulls``.

The codec and its parameters (dtype, row format) travel in the field's description in the DataProto
handle. Mooncake also has codecs for columns of tensors, images and nested structures holding those
(``ragged_tensor``, ``ragged_tensor_dict``, ``media_bytes``, ``media_list_ragged``,
``structured_recursive``); kvpool does not implement them and says so (ValueError) when a column needs one.

MessagePack is written and read here with the standard library: the types Mooncake's writer takes with
``strict_types`` (None, bool, int, float, str, bytes, list, dict), and on reading those plus float32.
numpy is imported only when a codec runs.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

__all__ = ["MISSING", "infer_structure"]


def _np() -> Any:
    import numpy  # an optional dependency of kvpool: needed only when a column is encoded or decoded
    return numpy


# ------------------------------------------------------------------------------------- MessagePack

def msgpack_pack(value: Any, out: Optional[bytearray] = None) -> bytearray:
    """MessagePack of ``value`` (bin type for bytes, exact types only: a tuple or a subclass of a
    supported type raises TypeError, as msgpack's ``strict_types``; an int beyond 64 bits raises
    OverflowError)."""
    buf = bytearray() if out is None else out
    _pack(value, buf, 0)
    return buf


def _pack(v: Any, b: bytearray, depth: int) -> None:
    if depth > 512:
        raise ValueError("recursion limit exceeded")
    t = type(v)
    if v is None:
        b.append(0xC0)
    elif t is bool:
        b.append(0xC3 if v else 0xC2)
    elif t is int:
        if 0 <= v < 0x80:
            b.append(v)
        elif -32 <= v < 0:
            b.append(v & 0xFF)
        elif 0 <= v <= 0xFF:
            b += b"\xcc" + struct.pack(">B", v)
        elif 0 <= v <= 0xFFFF:
            b += b"\xcd" + struct.pack(">H", v)
        elif 0 <= v <= 0xFFFFFFFF:
            b += b"\xce" + struct.pack(">I", v)
        elif 0 <= v <= 0xFFFFFFFFFFFFFFFF:
            b += b"\xcf" + struct.pack(">Q", v)
        elif -0x80 <= v < 0:
            b += b"\xd0" + struct.pack(">b", v)
        elif -0x8000 <= v < 0:
            b += b"\xd1" + struct.pack(">h", v)
        elif -0x80000000 <= v < 0:
            b += b"\xd2" + struct.pack(">i", v)
        elif -0x8000000000000000 <= v < 0:
            b += b"\xd3" + struct.pack(">q", v)
        else:
            raise OverflowError("Integer value out of range")
    elif t is float:
        b += b"\xcb" + struct.pack(">d", v)
    elif t is str:
        raw = v.encode("utf-8")
        n = len(raw)
        if n < 32:
            b.append(0xA0 | n)
        elif n <= 0xFF:
            b += b"\xd9" + struct.pack(">B", n)
        elif n <= 0xFFFF:
            b += b"\xda" + struct.pack(">H", n)
        else:
            b += b"\xdb" + struct.pack(">I", n)
        b += raw
    elif t in (bytes, bytearray, memoryview):
        raw = bytes(v)
        n = len(raw)
        if n <= 0xFF:
            b += b"\xc4" + struct.pack(">B", n)
        elif n <= 0xFFFF:
            b += b"\xc5" + struct.pack(">H", n)
        else:
            b += b"\xc6" + struct.pack(">I", n)
        b += raw
    elif t is list:
        n = len(v)
        if n < 16:
            b.append(0x90 | n)
        elif n <= 0xFFFF:
            b += b"\xdc" + struct.pack(">H", n)
        else:
            b += b"\xdd" + struct.pack(">I", n)
        for item in v:
            _pack(item, b, depth + 1)
    elif t is dict:
        n = len(v)
        if n < 16:
            b.append(0x80 | n)
        elif n <= 0xFFFF:
            b += b"\xde" + struct.pack(">H", n)
        else:
            b += b"\xdf" + struct.pack(">I", n)
        for k, item in v.items():
            _pack(k, b, depth + 1)
            _pack(item, b, depth + 1)
    else:
        raise TypeError(f"can not serialize {t.__name__!r} object")


def msgpack_unpack_all(data: bytes) -> list[Any]:
    """Every MessagePack value in ``data``, in order (str for str, bytes for bin; map keys must be str or
    bytes). ValueError for bytes that are not MessagePack of those types."""
    out: list[Any] = []
    pos = 0
    while pos < len(data):
        value, pos = _unpack(data, pos, 0)
        out.append(value)
    return out


def _take(data: bytes, pos: int, n: int) -> tuple[bytes, int]:
    end = pos + n
    if end > len(data):
        raise ValueError("msgpack data is truncated")
    return data[pos:end], end


def _unpack(d: bytes, pos: int, depth: int) -> tuple[Any, int]:
    if depth > 512:
        raise ValueError("msgpack data nests too deep")
    if pos >= len(d):
        raise ValueError("msgpack data is truncated")
    c = d[pos]
    pos += 1
    if c < 0x80:
        return c, pos
    if c >= 0xE0:
        return c - 0x100, pos
    if 0xA0 <= c <= 0xBF:
        raw, pos = _take(d, pos, c & 0x1F)
        return raw.decode("utf-8"), pos
    if 0x90 <= c <= 0x9F:
        return _unpack_array(d, pos, c & 0x0F, depth)
    if 0x80 <= c <= 0x8F:
        return _unpack_map(d, pos, c & 0x0F, depth)
    if c == 0xC0:
        return None, pos
    if c in (0xC2, 0xC3):
        return c == 0xC3, pos
    fixed = {0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q", 0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q",
             0xCA: ">f", 0xCB: ">d"}
    if c in fixed:
        fmt = fixed[c]
        raw, pos = _take(d, pos, struct.calcsize(fmt))
        return struct.unpack(fmt, raw)[0], pos
    lengths = {0xD9: ">B", 0xDA: ">H", 0xDB: ">I", 0xC4: ">B", 0xC5: ">H", 0xC6: ">I", 0xDC: ">H", 0xDD: ">I",
               0xDE: ">H", 0xDF: ">I"}
    if c in lengths:
        fmt = lengths[c]
        raw, pos = _take(d, pos, struct.calcsize(fmt))
        n = struct.unpack(fmt, raw)[0]
        if c in (0xD9, 0xDA, 0xDB):
            raw, pos = _take(d, pos, n)
            return raw.decode("utf-8"), pos
        if c in (0xC4, 0xC5, 0xC6):
            raw, pos = _take(d, pos, n)
            return bytes(raw), pos
        if c in (0xDC, 0xDD):
            return _unpack_array(d, pos, n, depth)
        return _unpack_map(d, pos, n, depth)
    raise ValueError(f"msgpack type 0x{c:02x} (an extension type) is not supported")


def _unpack_array(d: bytes, pos: int, n: int, depth: int) -> tuple[list[Any], int]:
    items = []
    for _ in range(n):
        item, pos = _unpack(d, pos, depth + 1)
        items.append(item)
    return items, pos


def _unpack_map(d: bytes, pos: int, n: int, depth: int) -> tuple[dict[Any, Any], int]:
    out: dict[Any, Any] = {}
    for _ in range(n):
        k, pos = _unpack(d, pos, depth + 1)
        if type(k) not in (str, bytes):
            raise ValueError(f"{type(k).__name__} is not allowed for map key")
        v, pos = _unpack(d, pos, depth + 1)
        out[k] = v
    return out, pos


# ---------------------------------------------------------------------------- the codec decision

@dataclass
class CodecChoice:
    """Which codec a column takes (``accepted`` False: none fits), why, and the codec's parameters."""
    accepted: bool
    codec: str
    reason: str
    normalized_type: str
    metadata: dict[str, Any] = field(default_factory=dict)


class _Missing:
    """A dict key a row does not have (not the same as the value None)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<MISSING>"


MISSING = _Missing()


@dataclass
class _InferredLeaf:
    path: str
    values: list[Any]
    decision: CodecChoice


@dataclass
class _InferredNode:
    path: str
    node_type: str
    children: list[Any]
    lengths: Optional[list[int]] = None
    row_mask: Optional[list[bool]] = None


_MAX_KEYS, _MAX_LIST, _MAX_DEPTH = 64, 8, 32

#: Codecs kvpool writes and reads; Mooncake's others are refused with this reason.
SUPPORTED = frozenset({"ndarray", "typed_ragged", "utf8_ragged", "bytes_ragged", "json_ragged", "msgpack_ragged"})
_UNSUPPORTED_WHY = ("kvpool.mooncake.structured_object_store does not implement Mooncake's {codec!r} codec "
                    "(columns of tensors, images, or dicts and lists that hold arrays, tensors or bytes); "
                    "store such values in batch fields, or as msgpack/JSON-able values")


def unsupported(codec: str) -> ValueError:
    return ValueError(_UNSUPPORTED_WHY.format(codec=codec))


def _present(values: Sequence[Any]) -> list[Any]:
    return [v for v in values if v is not None and not isinstance(v, _Missing)]


def _is_torch_tensor(v: Any) -> bool:
    cls = type(v)
    return cls.__module__.startswith("torch") and "Tensor" in cls.__name__


def _is_bytes_like(v: Any) -> bool:
    return isinstance(v, (bytes, bytearray, memoryview))


def _is_image(v: Any) -> bool:
    return (getattr(type(v), "__module__", "") or "").startswith("PIL.") and hasattr(v, "save")


def _is_media_list(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and all(_is_image(i) or _is_bytes_like(i) for i in v)


def choose_codec(values: Sequence[Any]) -> CodecChoice:
    """The codec Mooncake infers for a column from its values (None and MISSING rows aside)."""
    np = _np()
    rows = _present(values)
    if not rows:
        return CodecChoice(False, "msgpack_ragged", "all rows are null", "msgpack")
    if all(_is_torch_tensor(v) for v in rows):
        dtypes = sorted({str(v.dtype) for v in rows})
        if len(dtypes) != 1:
            return CodecChoice(False, "ragged_tensor", f"mixed tensor dtype: {dtypes}", "torch.Tensor")
        return CodecChoice(True, "ragged_tensor", "all non-null rows are Tensor", "torch.Tensor",
                           {"dtype": dtypes[0]})
    if all(_is_media_list(v) for v in rows):
        return CodecChoice(True, "media_list_ragged", "all rows are media lists", "media list")
    if all(isinstance(v, np.ndarray) for v in rows):
        if all(np.issubdtype(v.dtype, np.number) for v in rows):
            return CodecChoice(True, "typed_ragged", "all rows are numeric ndarray", "numeric sequence",
                               {"recursive_source": "ndarray"})
        return CodecChoice(False, "msgpack_ragged", "object ndarray rows", "python object")
    if all(isinstance(v, (list, tuple)) for v in rows):
        try:
            common = np.result_type(*[np.asarray(v).dtype for v in rows])
        except (TypeError, ValueError, OverflowError):
            common = None
        if common is not None and np.issubdtype(common, np.number):
            return CodecChoice(True, "typed_ragged", "all rows are numeric sequences", "numeric sequence",
                               {"dtype": str(common)})
    if all(isinstance(v, (bool, int, float, np.number)) for v in rows):
        return CodecChoice(True, "ndarray", "all rows are numeric scalar", "numeric scalar",
                           {"dtype": str(np.result_type(*rows))})
    if all(_is_bytes_like(v) for v in rows):
        return CodecChoice(True, "bytes_ragged", "all rows are bytes-like", "bytes-like")
    if all(_is_image(v) for v in rows):
        return CodecChoice(True, "media_bytes", "all rows are media", "media")
    if all(isinstance(v, str) for v in rows):
        return CodecChoice(True, "utf8_ragged", "all rows are str", "str")
    if all(isinstance(v, (dict, list, tuple)) for v in rows):
        return CodecChoice(True, "msgpack_ragged", "all rows are msgpack-like", "msgpack")
    return CodecChoice(False, "msgpack_ragged", "no codec matched", "python object")


def _escape(key: str) -> str:
    return key.replace("\\", "\\\\").replace(".", "\\.").replace("[", "\\[")


def infer_structure(path: str, values: list[Any], leaves: list[_InferredLeaf], nodes: list[_InferredNode], *,
                    _depth: int = 0) -> None:
    """Splits a column into interior nodes (dict and short-list levels, found in every row that is not
    None) and leaves (the columns under them, each with its codec), appending to ``leaves`` and ``nodes``.
    A row without a key of its dict level holds ``MISSING`` in that key's column (a None row holds None);
    each node records which rows had a container (``row_mask``), a list node also each row's length."""
    if _depth > _MAX_DEPTH:
        raise ValueError(f"infer_structure exceeded max depth {_MAX_DEPTH} at {path!r}")
    rows = _present(values)
    if rows and all(isinstance(v, dict) for v in rows):
        keys = {k for v in rows for k in v}
        if all(isinstance(k, str) for k in keys) and len(keys) <= _MAX_KEYS:
            names = sorted(keys)
            nodes.append(_InferredNode(path, "dict", list(names), row_mask=[isinstance(v, dict) for v in values]))
            for k in names:
                column = [v.get(k, MISSING) if isinstance(v, dict) else None for v in values]
                infer_structure(f"{path}.{_escape(k)}", column, leaves, nodes, _depth=_depth + 1)
            return
    if rows and all(isinstance(v, (list, tuple)) for v in rows):
        longest = max(len(v) for v in rows)
        if longest <= _MAX_LIST and all(i is None or isinstance(i, (dict, list, tuple)) for v in rows for i in v):
            is_list = [isinstance(v, (list, tuple)) for v in values]
            nodes.append(_InferredNode(path, "list", list(range(longest)),
                                       [len(v) if ok else 0 for v, ok in zip(values, is_list)], row_mask=is_list))
            for i in range(longest):
                column = [(v[i] if i < len(v) else MISSING) if ok else None for v, ok in zip(values, is_list)]
                infer_structure(f"{path}[{i}]", column, leaves, nodes, _depth=_depth + 1)
            return
    leaves.append(_InferredLeaf(path, values, choose_codec(values)))


def needs_nested_codec(values: list[Any], path: str) -> bool:
    """True when Mooncake would store this column with its nested (``structured_recursive``) codec: it
    splits into dict or list levels and a leaf under them holds tensors, images, bytes or arrays."""
    np = _np()
    leaves: list[_InferredLeaf] = []
    nodes: list[_InferredNode] = []
    infer_structure(path, values, leaves, nodes)
    if not nodes:
        return False
    for leaf in leaves:
        c = leaf.decision.codec
        if c in ("ragged_tensor", "bytes_ragged", "media_bytes", "media_list_ragged"):
            return True
        if c == "typed_ragged" and any(isinstance(v, np.ndarray) for v in _present(leaf.values)):
            return True
    return False


# ------------------------------------------------------------------------------------- encoding

@dataclass
class Encoded:
    """A column encoded: its codec, row count, members (name -> an ndarray, or bytes for ``data`` of the
    byte codecs) and parameters."""
    codec: str
    rows: int
    payload: dict[str, Any]
    metadata: dict[str, Any]


def _byte_rows(parts: Sequence[Optional[bytes]]) -> tuple[dict[str, Any], dict[str, Any]]:
    np = _np()
    offsets = [0]
    for p in parts:
        offsets.append(offsets[-1] + (0 if p is None else len(p)))
    data = b"".join(p for p in parts if p)
    return ({"data": data, "offsets": np.asarray(offsets, dtype=np.int64),
             "nulls": np.asarray([p is None for p in parts], dtype=np.bool_)}, {})


def _numeric_scalars(values: Sequence[Any], dtype: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    np = _np()
    dt = np.dtype(dtype)
    fill = False if dt == np.dtype(np.bool_) else 0
    data = np.asarray([fill if v is None else v for v in values], dtype=dt)
    nulls = np.asarray([v is None for v in values], dtype=np.bool_)
    return {"data": data, "nulls": nulls}, {"dtype": str(data.dtype), "shape": list(data.shape)}


def _typed_rows(values: Sequence[Any], dtype_hint: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    np = _np()
    if dtype_hint is None:
        arrays = [np.asarray(v) for v in values if v is not None]
        dt = np.result_type(*arrays) if arrays else np.dtype("int64")
    else:
        dt = np.dtype(dtype_hint)
    if dt.hasobject:
        raise ValueError("typed_ragged codec requires non-object dtype")
    rows = []
    for v in values:
        if v is None:
            rows.append(np.asarray([], dtype=dt))
        else:
            a = np.asarray(v, dtype=dt)
            rows.append(a if a.flags.c_contiguous else np.array(a, order="C"))  # (keeps 0-d rows 0-d)
    widest = max((a.ndim for a in rows), default=0)
    n = len(rows)
    offsets = np.zeros(n + 1, dtype=np.int64)
    shapes = np.zeros((n, max(widest, 1)), dtype=np.int64)
    ndims = np.zeros(n, dtype=np.int16)
    for i, a in enumerate(rows):
        offsets[i + 1] = offsets[i] + a.size
        ndims[i] = a.ndim
        if a.ndim:
            shapes[i, :a.ndim] = a.shape
    data = np.concatenate([a.reshape(-1) for a in rows]) if rows else np.empty(0, dtype=dt)
    data = data.astype(dt, copy=False)
    is_array = [v is not None and isinstance(v, np.ndarray) for v in values]
    if all(v is None or a for v, a in zip(values, is_array)):
        row_format = "ndarray"
    elif any(is_array):
        row_format = "mixed"
    else:
        row_format = "list"
    params: dict[str, Any] = {"dtype": str(dt), "max_ndim": int(widest), "shape_policy": "ragged",
                              "row_format": row_format, "ndarray_rows": is_array if row_format == "mixed" else None}
    if row_format == "ndarray" and any(is_array):
        params["physical_layout"] = "contiguous_flat"  # Mooncake's mark for columns of arrays (same bytes)
    return ({"data": data, "offsets": offsets, "shapes": shapes, "ndims": ndims,
             "nulls": np.asarray([v is None for v in values], dtype=np.bool_)}, params)


def _json_text(v: Any) -> bytes:
    return json.dumps(v, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _plain(v: Any) -> Any:
    """Arrays as lists and numpy scalars as Python numbers, all the way down (what the msgpack and JSON
    fallbacks store)."""
    np = _np()
    if isinstance(v, np.ndarray):
        return _plain(v.tolist()) if v.dtype == object else v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, dict):
        return {k: _plain(i) for k, i in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(i) for i in v]
    return v


def encode_with(codec: str, values: Sequence[Any], metadata: Optional[dict[str, Any]] = None) -> Encoded:
    """The column in ``codec`` (a FieldSchema's, or the one inferred); ``metadata`` carries its
    parameters (``dtype``). ValueError or TypeError when the values do not fit the codec."""
    np = _np()
    md = dict(metadata or {})
    if codec == "typed_ragged":
        payload, params = _typed_rows(values, md.get("dtype"))
    elif codec == "ndarray":
        if md.get("dtype") is None:
            raise ValueError("ndarray codec needs a dtype")
        payload, params = _numeric_scalars(values, md["dtype"])
    elif codec == "bytes_ragged" or (codec == "media_bytes" and all(v is None or _is_bytes_like(v) for v in values)):
        payload, params = _byte_rows([None if v is None else bytes(v) for v in values])
    elif codec == "utf8_ragged":
        payload, params = _byte_rows([None if v is None else v.encode("utf-8") for v in values])
    elif codec == "json_ragged":
        payload, params = _byte_rows([None if v is None else _json_text(v) for v in values])
    elif codec == "msgpack_ragged":
        payload, params = _byte_rows([None if v is None else bytes(msgpack_pack(v)) for v in values])
    elif codec in ("ragged_tensor", "ragged_tensor_dict", "media_bytes", "media_list_ragged",
                   "structured_recursive"):
        raise unsupported(codec)
    else:
        raise ValueError(f"unsupported schema codec: {codec!r}")
    return Encoded(codec, len(values), payload, params)


def encode_inferred(path: str, values: list[Any]) -> Encoded:
    """A ``non_tensor_batch`` object column in the codec Mooncake infers for it."""
    if needs_nested_codec(values, path):
        raise unsupported("structured_recursive")
    choice = choose_codec(values)
    if not choice.accepted:
        raise ValueError(f"unsupported structured non-tensor field: {choice.reason}")
    if choice.codec not in SUPPORTED:
        raise unsupported(choice.codec)
    enc = encode_with(choice.codec, values, {"dtype": choice.metadata["dtype"]} if choice.codec == "ndarray" else None)
    enc.metadata.update({"schema_source": "inferred_from_runtime_values", "decision_reason": choice.reason,
                         "normalized_type": choice.normalized_type, **choice.metadata})
    return enc


_FALLBACK_ERRORS = (TypeError, ValueError, OverflowError, RuntimeError, RecursionError)


def encode_auto(path: str, values: list[Any]) -> Encoded:
    """A column with no codec of its own (a FieldSchema ``ndarray`` without a dtype): the inferred codec
    if the values fit it, else ``msgpack_ragged``, else ``json_ragged`` (for these two, arrays and numpy
    scalars become plain lists and numbers). A column Mooncake would store with its nested codec is
    refused, as that codec is."""
    if needs_nested_codec(values, path):
        raise unsupported("structured_recursive")
    choice = choose_codec(values)
    tried = []
    for codec in dict.fromkeys([choice.codec, "msgpack_ragged", "json_ragged"]):
        vals = [_plain(v) for v in values] if codec in ("msgpack_ragged", "json_ragged") else values
        try:
            return encode_with(codec, vals, {"dtype": choice.metadata.get("dtype")} if codec == choice.codec else None)
        except _FALLBACK_ERRORS as e:
            tried.append(f"{codec}: {e}")
    raise ValueError(f"unable to infer a safe codec for structured non-tensor field {path!r}; tried {tried}")


# ------------------------------------------------------------------------------------- decoding

def _as_array(raw: Any, dtype: Any) -> Any:
    np = _np()
    if isinstance(raw, np.ndarray):
        return raw if raw.dtype == np.dtype(dtype) else np.frombuffer(raw.tobytes(), dtype=dtype)
    if _is_torch_tensor(raw):
        return raw.numpy()
    return np.frombuffer(bytes(raw), dtype=dtype)


def _byte_values(payload: dict[str, Any], rows: int) -> list[Optional[bytes]]:
    data = bytes(payload["data"]) if not isinstance(payload["data"], bytes) else payload["data"]
    offsets, nulls = payload["offsets"], payload["nulls"]
    out: list[Optional[bytes]] = []
    for r in range(rows):
        out.append(None if bool(nulls[r]) else data[int(offsets[r]):int(offsets[r + 1])])
    return out


def decode(codec: str, payload: dict[str, Any], rows: int, metadata: Optional[dict[str, Any]] = None) -> list[Any]:
    """The column's values (a list, one per row) from its members."""
    np = _np()
    md = metadata or {}
    if codec == "ndarray":
        data, nulls = payload["data"], payload["nulls"]
        if not bool(np.asarray(nulls).any()):
            return list(data.tolist())
        values = data.astype(object)
        values[np.asarray(nulls, dtype=bool)] = None
        return list(values.tolist())
    if codec == "typed_ragged":
        dt = np.dtype(md.get("dtype", "int64"))
        data = _as_array(payload["data"], dt)
        offsets, shapes, ndims, nulls = payload["offsets"], payload["shapes"], payload["ndims"], payload["nulls"]
        row_format = md.get("row_format")
        as_array = md.get("ndarray_rows") or []
        out: list[Any] = []
        for r in range(rows):
            if bool(nulls[r]):
                out.append(None)
                continue
            nd = int(ndims[r])
            a = data[int(offsets[r]):int(offsets[r + 1])].reshape(tuple(int(x) for x in shapes[r, :nd].tolist()))
            keep = row_format == "ndarray" or (row_format == "mixed" and bool(as_array[r]))
            out.append(a if keep else a.tolist())
        return out
    if codec == "bytes_ragged":
        return list(_byte_values(payload, rows))
    if codec == "utf8_ragged":
        return [None if v is None else v.decode("utf-8") for v in _byte_values(payload, rows)]
    if codec == "json_ragged":
        return [None if v is None else json.loads(v) for v in _byte_values(payload, rows)]
    if codec == "msgpack_ragged":
        data = payload["data"]
        nulls, offsets = payload["nulls"], payload["offsets"]
        if len(offsets) != rows + 1:
            raise ValueError(f"msgpack_ragged offsets length {len(offsets)} does not match rows {rows}")
        if len(nulls) != rows:
            raise ValueError(f"msgpack_ragged nulls length {len(nulls)} does not match rows {rows}")
        present = iter(msgpack_unpack_all(bytes(data)))
        try:
            return [None if bool(nulls[r]) else next(present) for r in range(rows)]
        except StopIteration:
            raise ValueError("msgpack_ragged holds fewer values than rows") from None
    if codec in ("ragged_tensor", "ragged_tensor_dict", "media_bytes", "media_list_ragged", "structured_recursive"):
        raise unsupported(codec)
    raise ValueError(f"unknown structured non-tensor codec: {codec}")

