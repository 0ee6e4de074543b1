"""Mooncake's parallel layouts: the public request classes ``ParallelAxis``, ``TensorParallelism`` and
``ReadTarget``, the parsing and validation of parallel specs (those classes, or any object with the same
attributes), the key of every shard, and the reconstruction of a full tensor or a shard from shards.

Keys: ``put_tensor_with_tp`` stores shard r of n under ``<key>_tp_<r>``; a ``writer_partition`` under
``<key>__writer_<r>of<n>_sd<d>`` with a manifest at ``<key>__writer_manifest``; a ``TensorParallelism``
with one TP axis under ``<key>_tp_<r>`` (manifest ``<key>__parallelism_manifest``), any other under
``<key>`` plus ``__<kind>_<rank>of<size>`` per axis in the order dp, tp, ep, pp, each followed by
``_sd<d>``, ``_eid<e>``, ``_sid<s>`` when set. The manifests (their bytes: tensor_layout.py) record the
global shape, dtype, split dim and shard count, from which a reader finds and checks every shard.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Sequence

from .args import I32, _int_arg, _str_arg
from .codes import log
from .tensor_layout import Axis7, META_SIZE, _DP, _DTYPES, _EP, _MAX_AXES, _Meta, _PP, _SHARD, _TP, _prod, _shard_range

__all__ = ["ParallelAxis", "TensorParallelism", "ReadTarget"]

# ----------------------------------------------------------------------------------- argument checks

def _i32(value: Any, what: str) -> int:
    """A C ``int`` argument as pybind11 converts it: TypeError for a non-integer or one out of range."""
    return _int_arg(value, what, I32)


def _opt_i32(value: Any, what: str) -> Optional[int]:
    return None if value is None else _i32(value, what)


def _cast_int(value: Any) -> int:
    """``py::cast<int>`` of an attribute: RuntimeError (pybind11's cast_error) when it fails."""
    try:
        return _i32(value, "value")
    except TypeError:
        raise RuntimeError(f"Unable to cast Python instance of type {type(value)} to C++ type 'int'") from None


def _cast_str(value: Any) -> str:
    try:
        return _str_arg(value, "value")
    except TypeError:
        raise RuntimeError(f"Unable to cast Python instance of type {type(value)} to C++ type 'std::string'") \
            from None


def _list_arg(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"{what} must be a list, got {type(value).__name__}")
    return value


# ------------------------------------------------------------------------- the request classes

def _checked(name: str, conv: Callable[[Any, str], Any]) -> property:
    """A property over the slot ``_<name>``; its setter stores ``conv(value, name)`` (TypeError for a value of
    the wrong type, as pybind11)."""
    slot = "_" + name

    def get(self: Any) -> Any:
        return getattr(self, slot)

    def put(self: Any, value: Any) -> None:
        setattr(self, slot, conv(value, name))

    return property(get, put)


class ParallelAxis:
    """One axis of a parallel layout (Mooncake's ``ParallelAxis``): ``kind`` ("tp", "dp", "ep" or "pp",
    any case), ``rank`` and ``size`` (C ints, defaults 0 and 1), and the optional C ints ``split_dim``
    (required for TP, refused for DP/EP/PP), ``expert_id`` (EP) and ``stage_id`` (PP). Assigning a value of
    the wrong type raises TypeError, as pybind11 does."""

    __slots__ = ("_kind", "_rank", "_size", "_split_dim", "_expert_id", "_stage_id")

    def __init__(self) -> None:
        self._kind = ""
        self._rank = 0
        self._size = 1
        self._split_dim: Optional[int] = None
        self._expert_id: Optional[int] = None
        self._stage_id: Optional[int] = None

    kind = _checked("kind", _str_arg)
    rank = _checked("rank", _i32)
    size = _checked("size", _i32)
    split_dim = _checked("split_dim", _opt_i32)
    expert_id = _checked("expert_id", _opt_i32)
    stage_id = _checked("stage_id", _opt_i32)

    def _copy(self) -> "ParallelAxis":
        a = ParallelAxis()
        a._take(self)
        return a

    def _take(self, other: "ParallelAxis") -> None:
        """Overwrites every field with ``other``'s (C++ copy assignment of the struct)."""
        self._kind, self._rank, self._size = other._kind, other._rank, other._size
        self._split_dim, self._expert_id, self._stage_id = other._split_dim, other._expert_id, other._stage_id

    def __repr__(self) -> str:
        return (f"ParallelAxis(kind={self._kind!r}, rank={self._rank}, size={self._size}, "
                f"split_dim={self._split_dim}, expert_id={self._expert_id}, stage_id={self._stage_id})")


def _axes_arg(value: Any) -> list[ParallelAxis]:
    """A sequence of ParallelAxis, as pybind11 converts one to a std::vector (a list or tuple, not a str, set
    or iterator); TypeError otherwise."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"axes must be a list of ParallelAxis, got {type(value).__name__}")
    if not all(isinstance(a, ParallelAxis) for a in value):
        raise TypeError("axes must be a list of ParallelAxis")
    return list(value)


class TensorParallelism:
    """A parallel layout (Mooncake's ``TensorParallelism``): ``axes``, a list of :class:`ParallelAxis`.

    It behaves as the wheel's pybind11 binding of a ``std::vector`` member does. Reading ``axes`` gives a new
    list each time whose elements are the stored axes themselves: ``p.axes[0].stage_id = 3`` sticks, while
    ``p.axes.append(a)`` changes only the list read. Assigning stores copies, into the axes already stored
    while they have room (the vector's capacity: the longest list assigned since it last grew), so an axis
    read earlier then shows the new values at its position; an assignment longer than that makes new axes and
    leaves the ones read earlier detached (in the wheel they would point at freed memory)."""

    __slots__ = ("_slots", "_size")

    def __init__(self) -> None:
        self._slots: list[ParallelAxis] = []  # the vector's storage: len() is its capacity
        self._size = 0

    @property
    def axes(self) -> list[ParallelAxis]:
        return self._slots[:self._size]

    @axes.setter
    def axes(self, value: Sequence[ParallelAxis]) -> None:
        self._assign(_axes_arg(value))

    def _assign(self, values: Sequence[ParallelAxis]) -> None:
        """Copy assignment of the vector: the values are copied first (they may be this layout's own axes),
        then written over the stored axes while they fit, else into new storage of exactly their length."""
        fresh = [a._copy() for a in values]
        if len(fresh) > len(self._slots):
            self._slots = fresh
        else:
            for slot, a in zip(self._slots, fresh):
                slot._take(a)
        self._size = len(fresh)

    def _copy(self) -> "TensorParallelism":
        """A copy (the copy constructor: storage of exactly the axes' number)."""
        p = TensorParallelism()
        p._assign(self.axes)
        return p

    def __repr__(self) -> str:
        return f"TensorParallelism(axes={self.axes!r})"


_MODES = ("as_stored", "shard", "full")


def _parse_mode(mode: str) -> Optional[str]:
    m = mode.upper()
    if m in ("AS_STORED", "SHARD", "FULL"):
        return m.lower()
    log.error("kvpool.mooncake: unsupported ReadTarget mode: %s", m)
    return None


class ReadTarget:
    """What a parallelism read returns (Mooncake's ``ReadTarget``): ``mode`` "as_stored" (default), "shard"
    or "full" (any case; another raises RuntimeError), and ``parallelism``, a :class:`TensorParallelism`
    or None. As the wheel's pybind11 binding of a ``std::optional`` member: reading ``parallelism`` gives the
    stored layout itself (``rt.parallelism.axes = [...]`` and ``rt.parallelism.axes[0].rank = 1`` stick), and
    assigning one copies it, over the stored layout when there is one."""

    __slots__ = ("_mode", "_parallelism", "_engaged")

    def __init__(self) -> None:
        self._mode = "as_stored"
        self._parallelism: Optional[TensorParallelism] = None  # the optional's storage, kept once made
        self._engaged = False

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"mode must be str, got {type(value).__name__}")
        parsed = _parse_mode(value)
        if parsed is None:
            raise RuntimeError("Unsupported ReadTarget mode")
        self._mode = parsed

    @property
    def parallelism(self) -> Optional[TensorParallelism]:
        return self._parallelism if self._engaged else None

    @parallelism.setter
    def parallelism(self, value: Optional[TensorParallelism]) -> None:
        if value is not None and not isinstance(value, TensorParallelism):
            raise TypeError(f"parallelism must be a TensorParallelism or None, got {type(value).__name__}")
        if value is None:
            self._engaged = False
        elif self._engaged and self._parallelism is not None:
            self._parallelism._assign(value.axes)  # copy assignment onto the stored layout
        else:
            if self._parallelism is None:
                self._parallelism = TensorParallelism()
            self._parallelism._slots = [a._copy() for a in value.axes]  # constructed in place: a fresh copy
            self._parallelism._size = len(self._parallelism._slots)
            self._engaged = True

    def __repr__(self) -> str:
        return f"ReadTarget(mode={self._mode!r}, parallelism={self.parallelism!r})"


# ------------------------------------------------------------------- parallel specs (duck-typed)

class _Axis(NamedTuple):
    kind: str
    rank: int
    size: int
    split_dim: Optional[int]
    expert_id: Optional[int]
    stage_id: Optional[int]


_Spec = list[_Axis]
_KIND_NAMES = {_DP: "dp", _TP: "tp", _EP: "ep", _PP: "pp"}


def _kind(kind: str) -> Optional[int]:
    code = {"TP": _TP, "DP": _DP, "EP": _EP, "PP": _PP}.get(kind.upper())
    if code is None:
        log.error("kvpool.mooncake: unsupported parallel axis kind: %s", kind)
    return code


def _parse_axis(obj: Any) -> Optional[_Axis]:
    if not all(hasattr(obj, a) for a in ("kind", "rank", "size")):
        log.error("kvpool.mooncake: ParallelAxis must provide kind, rank, and size")
        return None
    kind = _cast_str(obj.kind)
    if _kind(kind) is None:
        return None
    rank, size = _cast_int(obj.rank), _cast_int(obj.size)
    opt = [None if getattr(obj, f) is None else _cast_int(getattr(obj, f)) for f in ("split_dim", "expert_id",
                                                                                       "stage_id")]
    return _Axis(kind, rank, size, opt[0], opt[1], opt[2])


def _parse_parallelism(obj: Any) -> Optional[_Spec]:
    """The axes of a TensorParallelism-like object (anything with ``axes``), None (logged) if unusable."""
    if obj is None:
        return None
    if not hasattr(obj, "axes"):
        log.error("kvpool.mooncake: TensorParallelism must provide axes")
        return None
    axes = list(obj.axes)  # any iterable, as py::list() takes it (TypeError for one that is not)
    out: _Spec = []
    for a in axes:
        ax = _parse_axis(a)
        if ax is None:
            return None
        out.append(ax)
    return out


def _validate(spec: Optional[_Spec], ctx: str, allow_empty: bool = False) -> Optional[_Spec]:
    """Mooncake's validate_parallelism_spec: the spec, or None after logging why it is refused."""
    if spec is None:
        if not allow_empty:
            log.error("kvpool.mooncake %s: parallelism is required", ctx)
        return None
    if not spec:
        if allow_empty:
            return spec
        log.error("kvpool.mooncake %s: parallelism axes cannot be empty", ctx)
        return None
    if len(spec) > _MAX_AXES:
        log.error("kvpool.mooncake %s: axis count exceeds max supported axes", ctx)
        return None
    seen: set[int] = set()
    for a in spec:
        k = _kind(a.kind)
        if k is None:
            log.error("kvpool.mooncake %s: unsupported axis kind %s", ctx, a.kind)
            return None
        if a.size <= 0 or not 0 <= a.rank < a.size:
            log.error("kvpool.mooncake %s: invalid rank/size for axis %s", ctx, a.kind)
            return None
        if k in seen:
            log.error("kvpool.mooncake %s: duplicate axis kinds are not supported", ctx)
            return None
        seen.add(k)
        why = None
        if k == _TP and a.split_dim is None:
            why = "TP axis requires split_dim"
        elif k == _DP and a.split_dim is not None:
            why = "DP axis must not provide split_dim"
        elif k == _EP and a.expert_id is None:
            why = "EP axis requires expert_id"
        elif k == _EP and a.split_dim is not None:
            why = "EP axis must not provide split_dim in this phase"
        elif k == _PP and a.stage_id is None:
            why = "PP axis requires stage_id"
        elif k == _PP and a.split_dim is not None:
            why = "PP axis must not provide split_dim"
        if why:
            log.error("kvpool.mooncake %s: %s", ctx, why)
            return None
    return spec


def _canonical(spec: _Spec) -> _Spec:
    """The axes in Mooncake's key order: dp, tp, ep, pp."""
    def order(a: _Axis) -> tuple[int, str]:
        k = {"TP": _TP, "DP": _DP, "EP": _EP, "PP": _PP}.get(a.kind.upper())
        return (4 if k is None else k), a.kind
    return sorted(spec, key=order)


def _tp_index(spec: _Spec) -> Optional[int]:
    return next((i for i, a in enumerate(spec) if a.kind.upper() == "TP"), None)


def _single_tp(spec: _Spec) -> bool:
    """One TP axis and nothing else: stored under Mooncake's legacy ``<key>_tp_<rank>``."""
    return len(spec) == 1 and spec[0].kind.upper() == "TP"


def _tp_key(key: str, rank: int) -> str:
    return f"{key}_tp_{rank}"


def _writer_key(key: str, rank: int, size: int, split_dim: int) -> str:
    return f"{key}__writer_{rank}of{size}_sd{split_dim}"


def _axis_suffix(a: _Axis) -> str:
    k = _kind(a.kind)
    if k is None:
        return "invalid"
    s = f"{_KIND_NAMES[k]}_{a.rank}of{a.size}"
    if a.split_dim is not None:
        s += f"_sd{a.split_dim}"
    if a.expert_id is not None:
        s += f"_eid{a.expert_id}"
    if a.stage_id is not None:
        s += f"_sid{a.stage_id}"
    return s


def _parallel_key(key: str, spec: _Spec) -> str:
    if _single_tp(spec):
        return _tp_key(key, spec[0].rank)
    return key + "".join("__" + _axis_suffix(a) for a in _canonical(spec))


def _with_tp(spec: _Spec, rank: int, size: Optional[int] = None, split_dim: Optional[int] = None) -> _Spec:
    """The spec with its TP axis's rank (and size, split dim) replaced."""
    i = _tp_index(spec)
    out = list(spec)
    if i is not None:
        a = out[i]
        out[i] = a._replace(rank=rank, size=a.size if size is None else size,
                            split_dim=a.split_dim if split_dim is None else split_dim)
    return out


def _shard_meta(dtype: int, global_shape: Sequence[int], local_shape: Sequence[int], spec: _Spec,
                nbytes: int) -> Optional[_Meta]:
    """A SHARD TensorMetadata with the axes in the order given (Mooncake's
    build_shard_metadata_from_shapes), None if the axes do not fit the shapes."""
    if not spec or len(spec) > _MAX_AXES or len(global_shape) != len(local_shape):
        return None
    axes: list[Axis7] = []
    for i, a in enumerate(spec):
        k = _kind(a.kind)
        if k is None:
            return None
        extent = 0
        if a.split_dim is not None:
            if not 0 <= a.split_dim < len(local_shape):
                return None
            extent = local_shape[a.split_dim]
        extra = 0
        if k == _EP and a.expert_id is not None:
            extra = a.expert_id
        if k == _PP and a.stage_id is not None:
            extra = a.stage_id
        axes.append((k, i, a.rank, a.size, -1 if a.split_dim is None else a.split_dim, extra, extent))
    return _Meta(dtype, global_shape, local_shape, _SHARD, axes, nbytes)


def _spec_of(meta: _Meta) -> Optional[_Spec]:
    """The canonical parallel spec a SHARD object records (None for a FULL object)."""
    if meta.layout_kind != _SHARD:
        return None
    spec: _Spec = []
    for k, _i, rank, count, sd, extra, _e in meta.axes:
        spec.append(_Axis(_KIND_NAMES.get(k, "unknown"), rank, count, sd if sd >= 0 else None,
                          extra if k == _EP else None, extra if k == _PP else None))
    return _canonical(spec)


def _axes_equal(a: _Axis, b: _Axis) -> bool:
    ka, kb = _kind(a.kind), _kind(b.kind)
    return ka is not None and ka == kb and a[1:] == b[1:]


def _matches(spec: _Spec, meta: _Meta) -> bool:
    stored = _spec_of(meta)
    req = _canonical(spec)
    return stored is not None and len(stored) == len(req) and all(_axes_equal(x, y) for x, y in zip(req, stored))


def _tp_compatible(spec: _Spec, meta: _Meta, ctx: str) -> Optional[_Spec]:
    """The stored spec if it equals ``spec`` but for the TP axis's rank and size (Mooncake's
    resolve_tp_compatible_parallelism_from_metadata), else None (logged)."""
    stored = _spec_of(meta)
    if stored is None:
        log.error("kvpool.mooncake %s: missing shard parallelism metadata", ctx)
        return None
    if len(stored) != len(spec):
        log.error("kvpool.mooncake %s: axis count mismatch", ctx)
        return None
    ri, si = _tp_index(spec), _tp_index(stored)
    if ri is None or si is None or ri != si:
        log.error("kvpool.mooncake %s: %s", ctx, "reconstruction requires a TP axis" if ri is None or si is None
                  else "TP axis position mismatch")
        return None
    for i, (r, s) in enumerate(zip(spec, stored)):
        if i == ri:
            if _kind(r.kind) != _kind(s.kind) or (r.split_dim, r.expert_id, r.stage_id) != \
                    (s.split_dim, s.expert_id, s.stage_id):
                log.error("kvpool.mooncake %s: TP axis metadata mismatch", ctx)
                return None
        elif not _axes_equal(r, s):
            log.error("kvpool.mooncake %s: non-TP axis metadata mismatch", ctx)
            return None
    return stored


def _equal_by_kind(lhs: _Spec, rhs: _Spec) -> bool:
    """Same axes by kind, the TP axis's rank aside."""
    if len(lhs) != len(rhs):
        return False
    for a in lhs:
        k = _kind(a.kind)
        b = next((x for x in rhs if _kind(x.kind) == k), None)
        if k is None or b is None:
            return False
        if k == _TP:
            if (a.size, a.split_dim, a.expert_id, a.stage_id) != (b.size, b.split_dim, b.expert_id, b.stage_id):
                return False
        elif not _axes_equal(a, b):
            return False
    return True


class _Writer(NamedTuple):
    rank: int
    size: int
    split_dim: int


def _parse_writer(obj: Any, ctx: str) -> Optional[_Writer]:
    if not all(hasattr(obj, a) for a in ("rank", "size", "split_dim")):
        log.error("kvpool.mooncake %s: writer_partition must provide rank, size, and split_dim", ctx)
        return None
    w = _Writer(_cast_int(obj.rank), _cast_int(obj.size), _cast_int(obj.split_dim))
    if w.size <= 0 or not 0 <= w.rank < w.size or w.split_dim < 0:
        log.error("kvpool.mooncake %s: invalid writer partition", ctx)
        return None
    return w


def _parse_target(obj: Any, ctx: str) -> Optional[tuple[str, Optional[_Spec]]]:
    """(mode, spec or None) of a ReadTarget-like object (None means as_stored); None (logged) if unusable."""
    if obj is None:
        return "as_stored", None
    if not hasattr(obj, "mode") or not hasattr(obj, "parallelism"):
        log.error("kvpool.mooncake %s: ReadTarget must provide mode and parallelism", ctx)
        return None
    mode = _parse_mode(_cast_str(obj.mode))
    if mode is None:
        return None
    par = obj.parallelism
    if par is None:
        return mode, None
    spec = _parse_parallelism(par)
    if spec is None:
        return None
    return mode, spec


# --------------------------------------------------------------------------------- reconstruction

class _Src(NamedTuple):
    key: str
    meta: _Meta
    data: bytes


class _Recon(NamedTuple):
    sources: list[_Src]
    global_shape: list[int]
    split_dim: int
    dtype: int


def _source_range(src: _Src, global_shape: Sequence[int], sd: int, ctx: str) -> Optional[tuple[int, int]]:
    local = src.meta.local_shape
    if len(local) != len(global_shape):
        log.error("kvpool.mooncake %s: invalid shard shape for key %r", ctx, src.key)
        return None
    if any(d != sd and local[d] != global_shape[d] for d in range(len(local))):
        log.error("kvpool.mooncake %s: shard shape mismatch for key %r", ctx, src.key)
        return None
    tp = src.meta.tp_axis()
    if src.meta.layout_kind != _SHARD or tp is None:
        log.error("kvpool.mooncake %s: missing TP shard metadata for key %r", ctx, src.key)
        return None
    if tp[4] != sd or tp[3] <= 0 or not 0 <= tp[2] < tp[3]:
        log.error("kvpool.mooncake %s: invalid TP shard metadata for key %r", ctx, src.key)
        return None
    if global_shape[sd] % tp[3]:
        log.error("kvpool.mooncake %s: only uniform sharding is supported", ctx)
        return None
    start, extent = _shard_range(global_shape[sd], tp[2], tp[3])
    if local[sd] != extent:
        log.error("kvpool.mooncake %s: shard extent mismatch for key %r", ctx, src.key)
        return None
    return start, extent


def _assemble(r: _Recon, target: _Meta, t_start: int, t_extent: int, ctx: str) -> Optional[bytearray]:
    """The object ``[target][data]`` holding rows [t_start, t_start + t_extent) of the split dim, copied from
    the shards that cover them (Mooncake's build_reconstructed_tensor_into_plan_from_sources)."""
    g, sd = r.global_shape, r.split_dim
    if not r.sources:
        log.error("kvpool.mooncake %s: missing reconstruction shard sources", ctx)
        return None
    if not 0 <= sd < len(g):
        log.error("kvpool.mooncake %s: invalid split_dim", ctx)
        return None
    if t_start < 0 or t_extent < 0 or t_start + t_extent > g[sd]:
        log.error("kvpool.mooncake %s: invalid target shard range", ctx)
        return None
    elem = _DTYPES[r.sources[0].meta.dtype][1]
    shape = list(g)
    shape[sd] = t_extent
    nbytes = _prod(shape) * elem
    out = bytearray(META_SIZE + nbytes)
    target.data_bytes = nbytes
    out[:META_SIZE] = target.pack()
    before, after = _prod(g[:sd]), _prod(g[sd + 1:]) * elem
    covered = [False] * t_extent
    dst = memoryview(out)
    for src in r.sources:
        rng = _source_range(src, g, sd, ctx)
        if rng is None:
            return None
        s_start, s_extent = rng
        lo, hi = max(s_start, t_start), min(s_start + s_extent, t_start + t_extent)
        if hi <= lo:
            continue
        for i in range(lo - t_start, hi - t_start):
            covered[i] = True
        row = (hi - lo) * after
        data = memoryview(src.data)
        for i in range(before):
            d = META_SIZE + (i * t_extent + lo - t_start) * after
            s = src.meta.data_offset + (i * s_extent + lo - s_start) * after
            dst[d:d + row] = data[s:s + row]
    if not all(covered):
        log.error("kvpool.mooncake %s: shard extents do not cover reconstructed dimension", ctx)
        return None
    return out


