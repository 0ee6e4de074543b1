"""Tensor objects are byte-identical between the real Mooncake and kvpool.mooncake, and each reads the other's.

For a table of tensors (every dtype both can hold, 0-d to 8-d, non-contiguous, empty) and for the
tensor-parallel and parallelism layouts, the same call on ``mooncake_store`` (the wheel against a real
Mooncake) and on ``kvpool_store`` (kvpool's drop-in against a kvpool pool) must leave the same keys
holding the same bytes (``get(key)``); and bytes copied from one system to the other with ``put`` must
read back through the other system's ``get_tensor`` (and parallelism reads) as the same tensor.

The wheel looks dtypes up by name in torch, including ``torch.uint16`` and ``torch.float8_*``; a torch
without them (torch < 2.3) makes the wheel refuse every dtype after int16 in its table. The
``torch_names`` fixture gives such a torch placeholder attributes that equal nothing, so the wheel's
lookup runs to the end (kvpool does not need them). The wheel also builds float16/bfloat16 tensors
through ``torch.from_numpy`` of uint16 data, which an old torch rejects: there the wheel's read of
those dtypes is None and only the bytes are compared.
"""

from __future__ import annotations

import uuid
from typing import Any, Callable, Optional

import numpy as np
import pytest

import torch

import kvpool.mooncake as kmc
import mooncake.store as ms


class _NoSuchDtype:
    """A stand-in for a dtype this torch lacks: equal to nothing but itself."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<missing torch.{self.name}>"


@pytest.fixture(autouse=True)
def torch_names(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2"):
        if not hasattr(torch, name):
            monkeypatch.setattr(torch, name, _NoSuchDtype(name), raising=False)


def _wheel_builds_16bit() -> bool:
    try:
        torch.from_numpy(np.zeros(1, np.uint16))
        return True
    except TypeError:
        return False


WHEEL_16BIT = _wheel_builds_16bit()


def _cases() -> dict[str, Callable[[], Any]]:
    g = torch.Generator().manual_seed(7)
    base = lambda: torch.rand(3, 4, generator=g) * 200 - 100  # noqa: E731
    out: dict[str, Callable[[], Any]] = {}
    for dt in ("float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool", "float16", "bfloat16"):
        out[dt] = (lambda d=getattr(torch, dt): base().to(d))
    out["0-d"] = lambda: torch.tensor(3.25)
    out["1-d"] = lambda: torch.arange(7, dtype=torch.float32)
    out["4-d"] = lambda: torch.arange(120, dtype=torch.int32).reshape(2, 3, 4, 5)
    out["8-d"] = lambda: torch.arange(16, dtype=torch.float32).reshape(1, 2, 1, 2, 1, 2, 1, 2)
    out["transposed"] = lambda: torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    out["sliced"] = lambda: torch.arange(20, dtype=torch.float64).reshape(4, 5)[:, 1:4]
    out["empty"] = lambda: torch.zeros(3, 0, 2)
    out["bf16 4-d"] = lambda: torch.arange(48, dtype=torch.float32).reshape(2, 2, 3, 4).to(torch.bfloat16)
    return out


CASES = _cases()


@pytest.fixture
def prefix() -> str:
    return f"tb-{uuid.uuid4().hex[:10]}-"


def _expected(t: Any) -> Any:
    """What get_tensor returns for ``t`` in both systems: a contiguous copy, 0-d as shape (1,)."""
    c = t.contiguous()
    return c.reshape(1) if c.dim() == 0 else c


def _same(a: Any, b: Any) -> bool:
    return a is not None and b is not None and a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and \
        bool(torch.equal(a, b))


def _read(fn: Callable[[], Any], tries: int = 4) -> Any:
    """A read that may miss spuriously: Mooncake's 100 ms leases of the peer cluster can expire while a
    slow machine is still copying (the binding then logs LEASE_EXPIRED and answers empty). Retried; an
    empty answer after that is taken as the answer."""
    got = fn()
    for _ in range(tries - 1):
        if got is not None and not (isinstance(got, bytes) and not got):
            break
        got = fn()
    return got


def _wheel_reads(dtype: Any) -> bool:
    return WHEEL_16BIT or dtype not in (torch.float16, torch.bfloat16)


# ------------------------------------------------------------------------------------- whole tensors

@pytest.mark.parametrize("case", list(CASES))
def test_put_tensor_bytes_are_identical(case: str, mooncake_store: Any, kvpool_store: Any, prefix: str) -> None:
    t = CASES[case]()
    key = prefix + "t"
    assert mooncake_store.put_tensor(key, t) == 0
    assert kvpool_store.put_tensor(key, t) == 0
    real, ours = _read(lambda: mooncake_store.get(key)), kvpool_store.get(key)
    assert len(real) == 304 + t.numel() * t.element_size()
    assert ours == real


@pytest.mark.parametrize("case", list(CASES))
def test_each_reads_the_others_object(case: str, mooncake_store: Any, kvpool_store: Any, prefix: str) -> None:
    t = CASES[case]()
    want = _expected(t)
    assert mooncake_store.put_tensor(prefix + "real", t) == 0
    assert kvpool_store.put_tensor(prefix + "ours", t) == 0
    # the real store's bytes, read by kvpool
    assert kvpool_store.put(prefix + "from-real", _read(lambda: mooncake_store.get(prefix + "real"))) == 0
    assert _same(kvpool_store.get_tensor(prefix + "from-real"), want)
    # kvpool's bytes, read by the real store
    assert mooncake_store.put(prefix + "from-ours", kvpool_store.get(prefix + "ours")) == 0
    got = _read(lambda: mooncake_store.get_tensor(prefix + "from-ours"))
    if _wheel_reads(t.dtype):
        assert _same(got, want)
    else:
        assert got is None  # this torch cannot hold the wheel's uint16 staging array
    # and each reads its own the same way
    assert _same(kvpool_store.get_tensor(prefix + "ours"), want)


def test_put_tensor_from_stores_the_buffer_verbatim(mooncake_store: Any, kvpool_store: Any, prefix: str) -> None:
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    assert mooncake_store.put_tensor(prefix + "src", t) == 0
    obj = np.frombuffer(_read(lambda: mooncake_store.get(prefix + "src")), dtype=np.uint8).copy()
    for store in (mooncake_store, kvpool_store):
        assert store.put_tensor_from(prefix + "from", obj.ctypes.data, obj.size) == 0
        assert store.put_tensor_from(prefix + "short", obj.ctypes.data, obj.size - 4) == -600
    assert kvpool_store.get(prefix + "from") == _read(lambda: mooncake_store.get(prefix + "from")) == obj.tobytes()


# --------------------------------------------------------------------------------- tensor parallel

TP_LAYOUTS = [(0, 2), (1, 3), (1, 4), (0, 4)]


@pytest.mark.parametrize("split_dim,tp_size", TP_LAYOUTS)
def test_tp_shard_keys_and_bytes(split_dim: int, tp_size: int, mooncake_store: Any, kvpool_store: Any,
                                 prefix: str) -> None:
    t = torch.arange(4 * 12, dtype=torch.float32).reshape(4, 12)
    key = prefix + "w"
    assert mooncake_store.put_tensor_with_tp(key, t, 0, tp_size, split_dim) == 0
    assert kvpool_store.put_tensor_with_tp(key, t, 0, tp_size, split_dim) == 0
    for store in (mooncake_store, kvpool_store):
        assert store.is_exist(key) == 0 and store.is_exist(f"{key}_tp_{tp_size}") == 0
    for r in range(tp_size):
        real = _read(lambda: mooncake_store.get(f"{key}_tp_{r}"))
        assert real and kvpool_store.get(f"{key}_tp_{r}") == real
        want = t.chunk(tp_size, split_dim)[r].contiguous()
        assert _same(kvpool_store.get_tensor_with_tp(key, r, tp_size, split_dim), want)
        # the real store's shard bytes read by kvpool's TP read, and the reverse
        assert kvpool_store.put(f"{prefix}x_tp_{r}", real) == 0
        assert mooncake_store.put(f"{prefix}y_tp_{r}", kvpool_store.get(f"{key}_tp_{r}")) == 0
        assert _same(kvpool_store.get_tensor_with_tp(prefix + "x", r, tp_size), want)
        assert _same(_read(lambda: mooncake_store.get_tensor_with_tp(prefix + "y", r, tp_size)), want)


def test_tp_from_buffer_and_batch_match(mooncake_store: Any, kvpool_store: Any, prefix: str) -> None:
    t = torch.arange(36, dtype=torch.int64).reshape(6, 6)
    assert mooncake_store.put_tensor(prefix + "src", t) == 0
    obj = np.frombuffer(_read(lambda: mooncake_store.get(prefix + "src")), dtype=np.uint8).copy()
    for store in (mooncake_store, kvpool_store):
        assert store.put_tensor_with_tp_from(prefix + "f", obj.ctypes.data, obj.size, 0, 3, 1) == 0
        assert store.batch_put_tensor_with_tp([prefix + "b1", prefix + "b2"], [t, t[:4]], 0, 2, 0) == [0, 0]
    for k in [f"{prefix}f_tp_{r}" for r in range(3)] + [f"{prefix}b{i}_tp_{r}" for i in (1, 2) for r in range(2)]:
        real = _read(lambda: mooncake_store.get(k))
        assert real and kvpool_store.get(k) == real, k


# ---------------------------------------------------------------------------------- parallelism

def _axis(mod: Any, kind: str, rank: int, size: int, split_dim: Optional[int] = None,
          expert_id: Optional[int] = None, stage_id: Optional[int] = None) -> Any:
    a = mod.ParallelAxis()
    a.kind, a.rank, a.size = kind, rank, size
    a.split_dim, a.expert_id, a.stage_id = split_dim, expert_id, stage_id
    return a


def _par(mod: Any, *axes: tuple) -> Any:
    p = mod.TensorParallelism()
    p.axes = [_axis(mod, *a) for a in axes]
    return p


def _target(mod: Any, mode: str, *axes: tuple) -> Any:
    r = mod.ReadTarget()
    r.mode = mode
    if axes:
        r.parallelism = _par(mod, *axes)
    return r


class _Writer:
    def __init__(self, rank: int, size: int, split_dim: int) -> None:
        self.rank, self.size, self.split_dim = rank, size, split_dim


FULL = torch.arange(4 * 6, dtype=torch.float32).reshape(4, 6)

#: (name, writes as (tensor or "full", parallelism axes or None, writer or None), keys the writes leave)
LAYOUTS: list[tuple[str, list[tuple[Any, Optional[list[tuple]], Optional[_Writer]]], list[str]]] = [
    ("writer", [("full", None, _Writer(r, 2, 1)) for r in range(2)],
     ["__writer_0of2_sd1", "__writer_1of2_sd1", "__writer_manifest"]),
    ("tp-only", [(FULL[:, 3 * r:3 * r + 3].contiguous(), [("tp", r, 2, 1)], None) for r in range(2)],
     ["_tp_0", "_tp_1", "__parallelism_manifest"]),
    ("dp+tp", [("full", [("dp", 1, 2), ("tp", r, 2, 0)], None) for r in range(2)],
     ["__dp_1of2__tp_0of2_sd0", "__dp_1of2__tp_1of2_sd0", "__parallelism_manifest"]),
    ("pp+ep+tp", [("full", [("pp", 0, 2, None, None, 3), ("ep", 1, 4, None, 9), ("tp", r, 2, 1)], None)
                  for r in range(2)],
     ["__tp_0of2_sd1__ep_1of4_eid9__pp_0of2_sid3", "__tp_1of2_sd1__ep_1of4_eid9__pp_0of2_sid3",
      "__parallelism_manifest"]),
    ("dp", [("full", [("dp", 1, 2)], None)], ["__dp_1of2"]),
    ("pp+dp", [("full", [("pp", 1, 2, None, None, 5), ("DP", 0, 2)], None)], ["__dp_0of2__pp_1of2_sid5"]),
]


def _write(store: Any, mod: Any, key: str, writes: list) -> None:
    for tensor, axes, writer in writes:
        t = FULL if isinstance(tensor, str) else tensor
        par = None if axes is None else _par(mod, *axes)
        assert store.put_tensor_with_parallelism(key, t, parallelism=par, writer_partition=writer) == 0


@pytest.mark.parametrize("name", [n for n, _, _ in LAYOUTS])
def test_parallelism_keys_and_bytes(name: str, mooncake_store: Any, kvpool_store: Any, prefix: str) -> None:
    _, writes, suffixes = next(x for x in LAYOUTS if x[0] == name)
    key = prefix + "p"
    _write(mooncake_store, ms, key, writes)
    _write(kvpool_store, kmc, key, writes)
    for store in (mooncake_store, kvpool_store):
        assert store.is_exist(key) == 0
    for s in suffixes:
        real = _read(lambda: mooncake_store.get(key + s))
        assert real, f"the real store wrote no {key + s}"
        assert kvpool_store.get(key + s) == real, s


@pytest.mark.parametrize("name,axes", [
    ("tp", [("tp", 1, 2, 1)]),
    ("dp+tp", [("dp", 0, 2), ("tp", 1, 2, 1)]),
    ("dp", [("dp", 1, 2)]),
])
def test_parallelism_from_buffer_keys_and_bytes(name: str, axes: list, mooncake_store: Any, kvpool_store: Any,
                                                prefix: str) -> None:
    assert mooncake_store.put_tensor(prefix + "src", FULL) == 0
    obj = np.frombuffer(_read(lambda: mooncake_store.get(prefix + "src")), dtype=np.uint8).copy()
    key = prefix + "f"
    for store, mod in ((mooncake_store, ms), (kvpool_store, kmc)):
        assert store.put_tensor_with_parallelism_from(key, obj.ctypes.data, obj.size, _par(mod, *axes)) == 0
        assert store.put_tensor_with_parallelism_from(key + "w", obj.ctypes.data, obj.size,
                                                      writer_partition=_Writer(1, 3, 1)) == 0
    suffixes = {"tp": ["_tp_0", "_tp_1"], "dp+tp": ["__dp_0of2__tp_0of2_sd1", "__dp_0of2__tp_1of2_sd1"],
                "dp": ["__dp_1of2"]}[name]
    for k in [key + s for s in suffixes] + [key + "w__writer_1of3_sd1", key + "w__writer_manifest"]:
        real = _read(lambda: mooncake_store.get(k))
        assert real and kvpool_store.get(k) == real, k
    for store in (mooncake_store, kvpool_store):
        assert store.is_exist(key + "__parallelism_manifest") == 0


#: (layout, read target axes per module, mode): the reads compared across the two systems.
READS = [
    ("writer", "full", []),
    ("writer", "shard", [("tp", 1, 2, 1)]),
    ("tp-only", "full", [("tp", 0, 2, 1)]),
    ("tp-only", "shard", [("tp", 1, 2, 1)]),
    ("tp-only", "shard", [("tp", 2, 3, 1)]),
    ("dp+tp", "full", [("dp", 1, 2), ("tp", 0, 2, 0)]),
    ("dp+tp", "shard", [("tp", 1, 4, 0), ("dp", 1, 2)]),
    ("pp+ep+tp", "full", [("tp", 0, 2, 1), ("ep", 1, 4, None, 9), ("pp", 0, 2, None, None, 3)]),
    ("dp", "shard", [("dp", 1, 2)]),
    ("dp", "shard", [("dp", 0, 2)]),
    ("dp", "full", [("dp", 1, 2)]),
    ("dp", "as_stored", []),
]


def _copy_objects(src: Any, dst: Any, src_key: str, dst_key: str, suffixes: list[str]) -> None:
    for s in suffixes:
        data = _read(lambda: src.get(src_key + s))
        assert data, src_key + s
        assert dst.put(dst_key + s, data) == 0


@pytest.mark.parametrize("layout,mode,axes", READS, ids=[f"{a}-{b}-{len(c)}ax-{i}" for i, (a, b, c) in enumerate(READS)])
def test_parallelism_reads_agree_across_systems(layout: str, mode: str, axes: list, mooncake_store: Any,
                                                kvpool_store: Any, prefix: str) -> None:
    _, writes, suffixes = next(x for x in LAYOUTS if x[0] == layout)
    _write(mooncake_store, ms, prefix + "real", writes)
    _write(kvpool_store, kmc, prefix + "ours", writes)
    # each system also holds the other's objects, copied byte for byte
    _copy_objects(mooncake_store, kvpool_store, prefix + "real", prefix + "real", suffixes)
    _copy_objects(kvpool_store, mooncake_store, prefix + "ours", prefix + "ours", suffixes)
    results = {}
    for store, mod, side in ((mooncake_store, ms, "real"), (kvpool_store, kmc, "ours")):
        for origin in ("real", "ours"):
            results[side, origin] = _read(lambda: store.get_tensor_with_parallelism(prefix + origin,
                                                                                   _target(mod, mode, *axes)))
    ref = results["real", "real"]
    for k, v in results.items():
        if ref is None:
            assert v is None, k
        else:
            assert _same(v, ref), k


def test_parallelism_into_needs_registered_memory_in_both(mooncake_store: Any, kvpool_store: Any,
                                                          prefix: str) -> None:
    buf = np.zeros(4096, dtype=np.uint8)
    target = {"real": _target(ms, "full", ("tp", 0, 2, 1)), "ours": _target(kmc, "full", ("tp", 0, 2, 1))}
    layout = next(x for x in LAYOUTS if x[0] == "tp-only")
    outs = {}
    for store, mod, side in ((mooncake_store, ms, "real"), (kvpool_store, kmc, "ours")):
        _write(store, mod, prefix + "w", layout[1])
        assert store.get_tensor_with_parallelism_into(prefix + "w", buf.ctypes.data, buf.size, target[side]) is None
        assert store.register_buffer(buf.ctypes.data, buf.size) == 0
        try:
            t = store.get_tensor_with_parallelism_into(prefix + "w", buf.ctypes.data, buf.size, target[side])
            assert _same(t, FULL)
            assert t.data_ptr() == buf.ctypes.data + 304
            outs[side] = buf[:304 + FULL.numel() * 4].tobytes()
        finally:
            assert store.unregister_buffer(buf.ctypes.data) == 0
    assert outs["ours"] == outs["real"]


def test_request_objects_behave_alike() -> None:
    for mod in (ms, kmc):
        a = mod.ParallelAxis()
        assert (a.kind, a.rank, a.size, a.split_dim, a.expert_id, a.stage_id) == ("", 0, 1, None, None, None)
        for field, value in (("rank", "1"), ("rank", 1.5), ("rank", 1 << 31), ("kind", 5), ("split_dim", "x")):
            with pytest.raises(TypeError):
                setattr(a, field, value)
        a.rank, a.split_dim = -1, -1
        assert (a.rank, a.split_dim) == (-1, -1)
        p = mod.TensorParallelism()
        p.axes = [a]
        p.axes.append(mod.ParallelAxis())  # a copy: the stored list is unchanged
        a.rank = 5
        assert len(p.axes) == 1 and p.axes[0].rank == -1
        r = mod.ReadTarget()
        assert (r.mode, r.parallelism) == ("as_stored", None)
        r.mode = "FULL"
        assert r.mode == "full"
        with pytest.raises(RuntimeError):
            r.mode = "sideways"
        with pytest.raises(TypeError):
            r.parallelism = 5



def _error_calls(store: Any, mod: Any, p: str, buf: Any) -> dict[str, Any]:
    """Calls that fail, and what each answers (a code, None, or a list of them)."""
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    assert store.put(p + "raw", b"x" * 400) == 0
    assert store.put_tensor(p + "t", t) == 0
    ptr = buf.ctypes.data
    out: dict[str, Any] = {
        "get_tensor missing": store.get_tensor(p + "missing"),
        "get_tensor not a tensor": store.get_tensor(p + "raw"),
        "batch_get_tensor": store.batch_get_tensor([p + "missing", p + "raw"]),
        "put_tensor list": store.put_tensor(p + "a", [1, 2]),
        "put_tensor ndarray": store.put_tensor(p + "b", np.zeros(3, np.float32)),
        "put_tensor complex": store.put_tensor(p + "c", torch.zeros(2, dtype=torch.complex64)),
        "put_tensor 9-d": store.put_tensor(p + "d", torch.zeros([1] * 9)),
        "put_tensor Parameter": store.put_tensor(p + "e", torch.nn.Parameter(torch.zeros(2))),
        "batch_put_tensor mixed": store.batch_put_tensor([p + "f", p + "g"], [t, "no"]),
        "batch_put_tensor mismatch": store.batch_put_tensor([p + "h", p + "i"], [t]),
        "tp split_dim out of range": store.put_tensor_with_tp(p + "j", t, 0, 2, 2),
        "tp split_dim negative": store.put_tensor_with_tp(p + "k", t, 0, 2, -1),
        "tp not divisible": store.put_tensor_with_tp(p + "l", t, 0, 4, 1),
        "tp 0-d": store.put_tensor_with_tp(p + "m", torch.tensor(1.0), 0, 2, 0),
        "batch tp one bad": store.batch_put_tensor_with_tp([p + "n", p + "o"], [t, torch.zeros(3, 3)], 0, 2, 0),
        "batch tp not tensor-like": store.batch_put_tensor_with_tp([p + "q", p + "r"], [t, [1]], 0, 2, 0),
        "get_tensor_with_tp rank >= size": store.get_tensor_with_tp(p + "t", 5, 2),
        "get_tensor_into small": store.get_tensor_into(p + "t", ptr, 300),
        "get_tensor_into one short": store.get_tensor_into(p + "t", ptr, 399),
        "get_tensor_into missing": store.get_tensor_into(p + "missing", ptr, 1024),
        "get_tensor_into not a tensor": store.get_tensor_into(p + "raw", ptr, 1024),
        "batch_get_tensor_into null": store.batch_get_tensor_into([p + "t"], [0], [400]),
        "batch_get_tensor_into mismatch": store.batch_get_tensor_into([p + "t"], [ptr, ptr], [400]),
        "put_tensor_from short": store.put_tensor_from(p + "s", ptr, 100),
        "put_tensor_from null": store.put_tensor_from(p + "s", 0, 400),
        "put_tensor_with_tp_from not a tensor": store.put_tensor_with_tp_from(p + "u", ptr, 400, 0, 2, 0),
        "get_tensor_into_cuda": store.get_tensor_into_cuda(p + "t", t),
        "batch_get_tensor_into_cuda": store.batch_get_tensor_into_cuda([p + "t", p + "x"], [t, t]),
        "save missing": store.save_tensor_to_safetensor(p + "missing", "/nonexistent/x.safetensors"),
        "par tp without split_dim": store.put_tensor_with_parallelism(p + "v", t, _par(mod, ("tp", 0, 2))),
        "par rank >= size": store.put_tensor_with_parallelism(p + "v", t, _par(mod, ("tp", 2, 2, 0))),
        "par empty": store.put_tensor_with_parallelism(p + "v", t, _par(mod)),
        "par duplicate kind": store.put_tensor_with_parallelism(p + "v", t, _par(mod, ("dp", 0, 2), ("DP", 1, 2))),
        "par dp with split_dim": store.put_tensor_with_parallelism(p + "v", t, _par(mod, ("dp", 0, 2, 0))),
        "par ep without expert": store.put_tensor_with_parallelism(p + "v", t, _par(mod, ("ep", 0, 2))),
        "par unknown kind": store.put_tensor_with_parallelism(p + "v", t, _par(mod, ("zz", 0, 2))),
        "par and writer": store.put_tensor_with_parallelism(p + "v", t, _par(mod, ("dp", 0, 2)),
                                                            writer_partition=_Writer(0, 2, 0)),
        "writer rank >= size": store.put_tensor_with_parallelism(p + "v", t, writer_partition=_Writer(2, 2, 0)),
        "writer not divisible": store.put_tensor_with_parallelism(p + "v", t, writer_partition=_Writer(0, 4, 1)),
        "batch par both": store.batch_put_tensor_with_parallelism([p + "w"], [t], [None], writer_partitions=[None]),
        "batch par short list": store.batch_put_tensor_with_parallelism([p + "w"], [t], []),
        "read shard of a missing key": store.get_tensor_with_parallelism(p + "missing",
                                                                         _target(mod, "shard", ("tp", 0, 2, 0))),
        "read full without TP axis": store.get_tensor_with_parallelism(p + "t", _target(mod, "full", ("dp", 0, 2))),
        "read as_stored with layout": store.get_tensor_with_parallelism(p + "t",
                                                                        _target(mod, "as_stored", ("dp", 0, 2))),
        "batch read targets mismatch": store.batch_get_tensor_with_parallelism([p + "t"], [None, None]),
    }
    return out


def test_error_answers_agree(mooncake_store: Any, kvpool_store: Any, prefix: str) -> None:
    buf = np.zeros(1024, dtype=np.uint8)
    real = _error_calls(mooncake_store, ms, prefix + "r-", buf)
    ours = _error_calls(kvpool_store, kmc, prefix + "o-", buf)
    assert {k: v for k, v in ours.items()} == real
