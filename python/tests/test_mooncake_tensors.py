"""kvpool.mooncake's tensor methods against a real kvpool pool, with real torch CPU tensors.

The golden objects below were captured from the pinned wheel (mooncake-transfer-engine-non-cuda
0.3.13.post1) against a real Mooncake; python/peer_tests/test_mooncake_tensor_bytes.py compares the two
systems live. Every answer asserted here (codes, None, keys, shapes) is the wheel's.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import pytest
import torch

import kvpool
from kvpool import mooncake as mc
from kvpool.mooncake import MooncakeDistributedStore, ParallelAxis, ReadTarget, ReplicateConfig, TensorParallelism

import conftest

INVALID, NOT_FOUND, FILE_NOT_FOUND = -600, -704, -1100

# put_tensor(torch.arange(6, dtype=torch.float32).reshape(2, 3)) in the wheel: the whole object
FULL_2x3_F32 = (
    "4e4f4f4d01003001000000000200000000000000000000003001000000000000180000000000000002000000000000000300000000"
    "000000" + "ff" * 48 + "02000000000000000300000000000000" + "ff" * 48 + "00" * 136 +
    "000000000000803f0000004000004040000080400000a040")
# put_tensor(torch.tensor(1.5, dtype=torch.bfloat16)): a 0-d object (ndim 0, no dims, one element)
ZERO_D_BF16 = ("4e4f4f4d010030010c00000000000000000000000000000030010000000000000200000000000000" + "ff" * 128 +
               "00" * 136 + "c03f")
# put_tensor_with_tp(arange(24).reshape(4, 6), tp_size=2, split_dim=1): the header of <key>_tp_1
TP1_OF_2_SD1_HEAD = (
    "4e4f4f4d01003001000000000200000001000000000000003001000000000000300000000000000004000000000000000600000000"
    "000000" + "ff" * 48 + "04000000000000000300000000000000" + "ff" * 48 +
    "0100000000000000" "0100000000000000010000000200000001000000000000000300000000000000" + "00" * 96)
# writer_partition rank 1 of 2, split dim 1, of a (4, 6) float32 tensor: <key>__writer_manifest
WRITER_MANIFEST = ("4e414d57010060000000000002000000010000000200000000000000000000000400000000000000060000000000"
                   "0000" + "ff" * 48)
# parallelism [pp 0/2 stage 1, ep 1/2 expert 5, tp 1/2 split 0, dp 1/2] of a (4, 6) float32 tensor: the shard
# header (axes in the request's order) and <key>__parallelism_manifest
PP_EP_TP_DP_HEAD = (
    "4e4f4f4d01003001000000000200000001000000000000003001000000000000300000000000000004000000000000000600000000"
    "000000" + "ff" * 48 + "02000000000000000600000000000000" + "ff" * 48 +
    "0400000000000000"
    "03000000000000000000000002000000ffffffff010000000000000000000000"
    "02000000010000000100000002000000ffffffff050000000000000000000000"
    "01000000020000000100000002000000000000000000000002000000" "00000000"
    "00000000030000000100000002000000ffffffff000000000000000000000000")
PAR_MANIFEST = ("4e414d57010060000000000002000000000000000200000000000000000000000400000000000000060000000000"
                "0000" + "ff" * 48)

T46 = torch.arange(24, dtype=torch.float32).reshape(4, 6)


def same(a: Any, b: Any) -> bool:
    return a is not None and b is not None and a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and \
        bool(torch.equal(a, b))


def obj_of(store: MooncakeDistributedStore, key: str) -> np.ndarray:
    return np.frombuffer(store.get(key), dtype=np.uint8).copy()


def axis(kind: str, rank: int, size: int, split_dim: Optional[int] = None, expert_id: Optional[int] = None,
         stage_id: Optional[int] = None) -> ParallelAxis:
    a = ParallelAxis()
    a.kind, a.rank, a.size = kind, rank, size
    a.split_dim, a.expert_id, a.stage_id = split_dim, expert_id, stage_id
    return a


def par(*axes: ParallelAxis) -> TensorParallelism:
    p = TensorParallelism()
    p.axes = list(axes)
    return p


def target(mode: str, *axes: ParallelAxis) -> ReadTarget:
    r = ReadTarget()
    r.mode = mode
    if axes:
        r.parallelism = par(*axes)
    return r


class Writer:
    def __init__(self, rank: int, size: int, split_dim: int) -> None:
        self.rank, self.size, self.split_dim = rank, size, split_dim


# ------------------------------------------------------------------------------------- the bytes

def test_objects_are_mooncakes_bytes(store: MooncakeDistributedStore) -> None:
    assert store.put_tensor("a", torch.arange(6, dtype=torch.float32).reshape(2, 3)) == 0
    assert store.get("a").hex() == FULL_2x3_F32
    assert len(store.get("a")) == 304 + 24
    assert store.put_tensor("z", torch.tensor(1.5, dtype=torch.bfloat16)) == 0
    assert store.get("z").hex() == ZERO_D_BF16
    assert store.put_tensor_with_tp("w", T46, 0, 2, 1) == 0
    assert store.get("w_tp_1")[:304].hex() == TP1_OF_2_SD1_HEAD
    assert store.put_tensor_with_parallelism("m", T46, writer_partition=Writer(1, 2, 1)) == 0
    assert store.get("m__writer_manifest").hex() == WRITER_MANIFEST
    p = par(axis("pp", 0, 2, stage_id=1), axis("ep", 1, 2, expert_id=5), axis("tp", 1, 2, 0), axis("dp", 1, 2))
    assert store.put_tensor_with_parallelism("q", T46, p) == 0
    assert store.get("q__dp_1of2__tp_1of2_sd0__ep_1of2_eid5__pp_0of2_sid1")[:304].hex() == PP_EP_TP_DP_HEAD
    assert store.get("q__parallelism_manifest").hex() == PAR_MANIFEST


DTYPES = {"float32": 0, "float64": 1, "int8": 2, "uint8": 3, "int16": 4, "int32": 6, "int64": 8, "bool": 10,
          "float16": 11, "bfloat16": 12}


@pytest.mark.parametrize("name", list(DTYPES))
def test_every_dtype_round_trips_with_mooncakes_code(store: MooncakeDistributedStore, name: str) -> None:
    dt = getattr(torch, name)
    t = (torch.arange(12, dtype=torch.float32).reshape(3, 4) - 5).to(dt)
    assert store.put_tensor("t", t) == 0
    obj = store.get("t")
    assert struct.unpack_from("<iiI", obj, 8) == (DTYPES[name], 2, 0)  # dtype, ndim, FULL
    assert struct.unpack_from("<QQ", obj, 24) == (304, 12 * t.element_size())
    assert obj[304:] == t.numpy().tobytes() if dt not in (torch.bfloat16,) else obj[304:] == \
        t.view(torch.int16).numpy().tobytes()
    assert same(store.get_tensor("t"), t)


@pytest.mark.parametrize("shape", [(), (5,), (2, 3, 4, 5), (1, 2, 1, 2, 1, 2, 1, 2), (0,), (3, 0, 2)])
def test_shapes(store: MooncakeDistributedStore, shape: tuple) -> None:
    n = int(np.prod(shape)) if shape else 1
    t = torch.arange(n, dtype=torch.float32).reshape(shape)
    assert store.put_tensor("s", t) == 0
    obj = store.get("s")
    ndim, = struct.unpack_from("<i", obj, 12)
    dims = struct.unpack_from("<8q", obj, 40)
    assert ndim == len(shape) and dims == tuple(shape) + (-1,) * (8 - len(shape))
    assert struct.unpack_from("<8q", obj, 104) == dims
    got = store.get_tensor("s")
    assert same(got, t.reshape(1) if not shape else t)  # a 0-d tensor reads back as shape (1,), as in Mooncake


def test_non_contiguous_inputs_store_c_order_bytes(store: MooncakeDistributedStore) -> None:
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    for key, t in (("t", base.t()), ("s", base[:, 1:3]), ("e", base[::2])):
        assert not t.is_contiguous()
        assert store.put_tensor(key, t) == 0
        assert store.get(key)[304:] == t.contiguous().numpy().tobytes()
        assert same(store.get_tensor(key), t.contiguous())
    grad = torch.ones(3, requires_grad=True)
    assert store.put_tensor("g", grad) == 0
    assert same(store.get_tensor("g"), torch.ones(3))


def test_refusals_and_misses(store: MooncakeDistributedStore) -> None:
    assert store.get_tensor("missing") is None
    assert store.put("raw", b"x" * 400) == 0
    assert store.get_tensor("raw") is None  # not a tensor object
    assert store.put("short", b"x" * 10) == 0
    assert store.get_tensor("short") is None
    for value in ([1, 2], 3, None, "abc", np.zeros(4, np.float32), torch.nn.Parameter(torch.zeros(2)),
                  torch.zeros(2, dtype=torch.complex64), torch.zeros([1] * 9)):
        assert store.put_tensor("bad", value) == INVALID
    assert store.is_exist("bad") == 0
    with pytest.raises(TypeError):
        store.put_tensor(5, torch.zeros(1))  # type: ignore[arg-type]


def test_put_keeps_an_existing_object_and_upsert_replaces_it(store: MooncakeDistributedStore) -> None:
    assert store.put_tensor("k", T46) == 0
    assert store.put_tensor("k", torch.zeros(1)) == 0
    assert same(store.get_tensor("k"), T46)
    assert store.upsert_tensor("k", torch.zeros(1)) == 0
    assert same(store.get_tensor("k"), torch.zeros(1))
    assert store.upsert_pub_tensor("k", torch.ones(2), ReplicateConfig()) == 0
    assert same(store.get_tensor("k"), torch.ones(2))


def test_batches_and_pub(store: MooncakeDistributedStore) -> None:
    ts = [T46, torch.ones(3, dtype=torch.int64)]
    assert store.batch_put_tensor(["a", "b", "c"], ts + [[1]]) == [0, 0, INVALID]
    got = store.batch_get_tensor(["a", "b", "c"])
    assert same(got[0], ts[0]) and same(got[1], ts[1]) and got[2] is None
    assert store.batch_put_tensor([], []) == [] and store.batch_get_tensor([]) == []
    assert store.batch_put_tensor(["x"], []) == [INVALID]
    with pytest.raises(TypeError):
        store.batch_put_tensor(["x"], (T46,))  # type: ignore[arg-type]  # a list, as pybind11 wants
    assert store.batch_upsert_tensor(["a", "d"], [torch.zeros(1), T46]) == [0, 0]
    assert same(store.get_tensor("a"), torch.zeros(1))
    cfg = ReplicateConfig()
    cfg.replica_num = 2
    cfg.preferred_segments = ["only-one"]
    assert store.pub_tensor("p", T46, cfg) == INVALID
    assert store.pub_tensor_with_tp("p", T46, cfg, 0, 2, 0) == INVALID
    assert store.batch_pub_tensor(["p"], [T46], cfg) == [INVALID]
    assert store.batch_upsert_pub_tensor(["p"], [T46], cfg) == [INVALID]
    groups = ReplicateConfig()
    groups.group_ids = ["g1", "g2"]
    assert store.pub_tensor("p", T46, groups) == INVALID  # one group per key, as Mooncake checks
    assert store.batch_pub_tensor(["p1", "p2"], [T46, T46], groups) == [0, 0]
    assert store.pub_tensor("p3", T46, ReplicateConfig()) == 0
    assert store.batch_upsert_pub_tensor(["p3"], [torch.ones(1)], ReplicateConfig()) == [0]
    assert same(store.get_tensor("p3"), torch.ones(1))


# ------------------------------------------------------------------------------ buffers by address

def test_get_tensor_into_returns_a_view_of_the_buffer(store: MooncakeDistributedStore) -> None:
    buf = np.zeros(1024, dtype=np.uint8)
    ptr = buf.ctypes.data
    assert store.put_tensor("a", T46) == 0
    t = store.get_tensor_into("a", ptr, buf.size)
    assert same(t, T46) and t.data_ptr() == ptr + 304
    buf[304:308] = np.frombuffer(np.float32(42).tobytes(), dtype=np.uint8)
    assert float(t[0, 0]) == 42.0
    assert store.get_tensor_into("a", ptr, 399) is None  # one byte short
    assert store.get_tensor_into("missing", ptr, 1024) is None
    assert store.put("raw", b"y" * 400) == 0
    assert store.get_tensor_into("raw", ptr, 1024) is None
    assert store.get_tensor_into("a", 0, 1024) is None
    with pytest.raises(TypeError):
        store.get_tensor_into("a", -1, 10)
    got = store.batch_get_tensor_into(["a", "missing", "raw"], [ptr, ptr + 400, ptr + 600], [400, 200, 400])
    assert same(got[0], T46) and got[1:] == [None, None]
    assert store.batch_get_tensor_into(["a"], [0], [400]) == [INVALID]
    assert store.batch_get_tensor_into(["a"], [ptr, ptr], [400]) == [INVALID]
    assert store.batch_get_tensor_into([], [], []) == []


def test_put_tensor_from_stores_the_buffer_as_it_is(store: MooncakeDistributedStore) -> None:
    assert store.put_tensor("src", T46) == 0
    obj = obj_of(store, "src")
    ptr = obj.ctypes.data
    assert store.put_tensor_from("f", ptr, obj.size) == 0
    assert store.get("f") == obj.tobytes()
    assert store.put_tensor_from("f2", ptr, obj.size - 4) == INVALID  # data bytes disagree with the size
    assert store.put_tensor_from("f3", ptr, 200) == INVALID
    assert store.put_tensor_from("f4", 0, 400) == INVALID
    raw = np.full(400, 7, np.uint8)
    assert store.put_tensor_from("f5", raw.ctypes.data, 400) == INVALID
    assert store.batch_put_tensor_from(["g1", "g2"], [ptr, ptr], [obj.size, obj.size]) == [0, 0]
    # one invalid buffer fails the whole batch
    assert store.batch_put_tensor_from(["g3", "g4"], [ptr, raw.ctypes.data], [obj.size, 400]) == [INVALID] * 2
    assert store.is_exist("g3") == 0
    assert store.batch_put_tensor_from([], [], []) == []
    assert store.batch_put_tensor_from(["g5"], [], []) == [INVALID]
    assert store.put_tensor("u", torch.zeros(1)) == 0
    assert store.upsert_tensor_from("u", ptr, obj.size) == 0 and store.get("u") == obj.tobytes()
    assert store.batch_upsert_tensor_from(["u", "v"], [ptr, ptr], [obj.size, obj.size]) == [0, 0]


def test_cuda_forms_answer_minus_600_with_a_reason(store: MooncakeDistributedStore,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    assert store.put_tensor("a", T46) == 0
    with caplog.at_level(logging.ERROR, logger="kvpool.mooncake"):
        assert store.get_tensor_into_cuda("a", torch.zeros(4, 6)) == INVALID
        assert store.batch_get_tensor_into_cuda(["a", "b"], [T46, T46]) == [INVALID, INVALID]
        assert store.batch_get_tensor_into_cuda(["a", "b"], [T46]) == [INVALID, INVALID]
    assert "host memory only" in caplog.text
    with pytest.raises(TypeError):
        store.batch_get_tensor_into_cuda(["a"], (T46,))  # type: ignore[arg-type]


# --------------------------------------------------------------------------------- tensor parallel

def test_tp_shards_and_reads(store: MooncakeDistributedStore) -> None:
    assert store.put_tensor_with_tp("w", T46, tp_rank=1, tp_size=3, split_dim=1) == 0  # every shard is written
    assert store.is_exist("w") == 0 and store.is_exist("w_tp_3") == 0
    for r, chunk in enumerate(T46.chunk(3, 1)):
        obj = store.get(f"w_tp_{r}")
        assert struct.unpack_from("<I", obj, 16)[0] == 1  # SHARD
        assert struct.unpack_from("<6iq", obj, 176) == (1, 0, r, 3, 1, 0, 2)
        assert obj[304:] == chunk.contiguous().numpy().tobytes()
        assert same(store.get_tensor_with_tp("w", r, 3, 1), chunk.contiguous())
    assert store.get_tensor_with_tp("w", 5, 3) is None
    assert store.get_tensor_with_tp("w", 0, 1) is None  # tp_size 1 reads "w" itself
    got = store.batch_get_tensor_with_tp(["w", "nothing"], 2, 3)
    assert same(got[0], T46[:, 4:].contiguous()) and got[1] is None
    buf = np.zeros(2048, dtype=np.uint8)
    t = store.get_tensor_with_tp_into("w", buf.ctypes.data, 1024, 1, 3, 1)
    assert same(t, T46[:, 2:4].contiguous()) and t.data_ptr() == buf.ctypes.data + 304
    got = store.batch_get_tensor_with_tp_into(["w", "nothing"], [buf.ctypes.data, buf.ctypes.data + 1024],
                                              [1024, 1024], 0, 3)
    assert same(got[0], T46[:, :2].contiguous()) and got[1] is None


def test_tp_argument_cases(store: MooncakeDistributedStore) -> None:
    assert store.put_tensor_with_tp("a", T46, 0, 0, 0) == 0  # tp_size <= 1: a plain put_tensor
    assert same(store.get_tensor("a"), T46) and store.is_exist("a_tp_0") == 0
    assert store.put_tensor_with_tp("b", T46, 7, 2, 0) == 0  # the rank does not matter for a put
    assert store.is_exist("b_tp_0") == 1 and store.is_exist("b_tp_1") == 1
    assert store.put_tensor_with_tp("c", T46, 0, 2, 2) == INVALID  # split_dim out of range
    assert store.put_tensor_with_tp("c", T46, 0, 2, -1) == INVALID
    assert store.put_tensor_with_tp("c", T46, 0, 4, 1) == INVALID  # 6 does not divide by 4
    assert store.put_tensor_with_tp("c", torch.tensor(1.0), 0, 2, 0) == INVALID
    assert store.put_tensor_with_tp("c", [1, 2], 0, 2, 0) == INVALID
    assert store.put_tensor_with_tp("c", torch.zeros(2, 2, dtype=torch.complex64), 0, 2, 0) == INVALID
    for bad in ("1", 1.5, 1 << 31):
        with pytest.raises(TypeError):
            store.put_tensor_with_tp("c", T46, bad, 2, 0)  # type: ignore[arg-type]
    assert store.put_tensor_with_tp("b", torch.zeros(4, 6), 0, 2, 0) == 0  # existing shards are kept
    assert same(store.get_tensor_with_tp("b", 0, 2), T46[:2])
    assert store.batch_put_tensor_with_tp(["d", "e"], [T46, torch.zeros(3, 3)], 0, 2, 0) == [0, INVALID]
    # an element that is not tensor-like fails the whole batch and writes nothing, as in Mooncake
    assert store.batch_put_tensor_with_tp(["f", "g"], [T46, [1]], 0, 2, 0) == [INVALID, INVALID]
    assert store.is_exist("f_tp_0") == 0
    assert store.batch_put_tensor_with_tp(["h", "i"], [T46], 0, 2, 0) == [INVALID, INVALID]
    assert store.batch_put_tensor_with_tp([], [], 0, 2, 0) == []
    assert store.batch_put_tensor_with_tp(["j"], [T46], 0, 1, 0) == [0] and store.is_exist("j") == 1
    assert store.pub_tensor_with_tp("k", T46, ReplicateConfig(), 0, 2, 0) == 0 and store.is_exist("k_tp_1") == 1
    assert store.batch_pub_tensor_with_tp(["l"], [T46], ReplicateConfig(), 0, 2, 1) == [0]


def test_tp_from_a_buffer_equals_tp_from_a_tensor(store: MooncakeDistributedStore) -> None:
    t = torch.arange(36, dtype=torch.int16).reshape(6, 6)
    assert store.put_tensor("src", t) == 0
    obj = obj_of(store, "src")
    assert store.put_tensor_with_tp("t", t, 0, 3, 0) == 0
    assert store.put_tensor_with_tp_from("f", obj.ctypes.data, obj.size, 0, 3, 0) == 0
    for r in range(3):
        assert store.get(f"f_tp_{r}") == store.get(f"t_tp_{r}")
    raw = np.full(400, 1, np.uint8)
    assert store.put_tensor_with_tp_from("x", raw.ctypes.data, 400, 0, 2, 0) == INVALID
    assert store.put_tensor_with_tp_from("x", obj.ctypes.data, obj.size, 0, 4, 1) == INVALID
    assert store.put_tensor_with_tp_from("x", obj.ctypes.data, 100, 0, 2, 1) == INVALID
    assert store.put_tensor_with_tp_from("one", obj.ctypes.data, obj.size, 0, 1, 0) == 0
    assert store.get("one") == obj.tobytes()
    assert store.batch_put_tensor_with_tp_from(["b1", "b2"], [obj.ctypes.data, raw.ctypes.data],
                                               [obj.size, 400], 0, 2, 1) == [0, INVALID]
    assert store.get("b1_tp_1") == store.get("t_tp_1") or store.is_exist("b1_tp_1") == 1


# ---------------------------------------------------------------------------------- parallelism

def test_request_objects() -> None:
    a = ParallelAxis()
    assert (a.kind, a.rank, a.size, a.split_dim, a.expert_id, a.stage_id) == ("", 0, 1, None, None, None)
    for field, value in (("kind", 5), ("rank", "1"), ("rank", 1.5), ("rank", 1 << 31), ("size", None),
                         ("split_dim", "a")):
        with pytest.raises(TypeError):
            setattr(a, field, value)
    a.rank, a.size, a.split_dim, a.kind = -1, -1, -1, "xx"  # any value of the right type is stored
    assert (a.rank, a.size, a.split_dim, a.kind) == (-1, -1, -1, "xx")
    p = TensorParallelism()
    assert p.axes == []
    p.axes = (a,)
    p.axes.append(ParallelAxis())  # reading gives a new list (of the live axes), as in pybind11
    a.rank = 3
    assert len(p.axes) == 1 and p.axes[0].rank == -1
    with pytest.raises(TypeError):
        p.axes = [5]  # type: ignore[list-item]
    r = ReadTarget()
    assert (r.mode, r.parallelism) == ("as_stored", None)
    for mode, canon in (("shard", "shard"), ("FULL", "full"), ("As_Stored", "as_stored")):
        r.mode = mode
        assert r.mode == canon
    with pytest.raises(RuntimeError):
        r.mode = "bogus"
    with pytest.raises(TypeError):
        r.mode = 3  # type: ignore[assignment]
    r.parallelism = p
    assert r.parallelism is not None and r.parallelism.axes[0].rank == -1
    with pytest.raises(TypeError):
        r.parallelism = 5  # type: ignore[assignment]
    assert {"ParallelAxis", "TensorParallelism", "ReadTarget"} <= set(mc.__all__)


def test_axes_and_parallelism_are_live_as_in_the_wheel() -> None:
    """The wheel binds ``TensorParallelism.axes`` (a std::vector) and ``ReadTarget.parallelism`` (a
    std::optional) with pybind11's def_readwrite. Observed on mooncake-transfer-engine-non-cuda 0.3.13.post1:
    reading ``axes`` gives a new list whose elements are the stored axes themselves, so editing an element
    sticks while list edits do not; assigning copies; an assignment that fits the vector's capacity
    overwrites the stored axes in place, so an axis read before shows the new values;
    ``rt.parallelism`` is the stored TensorParallelism itself, and assigning it copies."""
    src = [axis("pp", 0, 2), axis("tp", 0, 4, split_dim=1)]
    p = TensorParallelism()
    p.axes = src
    assert p.axes is not p.axes and p.axes[0] is p.axes[0] and p.axes[0] is not src[0]
    src[0].stage_id = 9  # assignment copied
    assert p.axes[0].stage_id is None
    p.axes[0].stage_id = 3  # an element edit sticks (Mooncake's upsert test does this)
    assert p.axes[0].stage_id == 3
    h = p.axes[1]
    h.rank = 2
    assert p.axes[1].rank == 2 and p.axes[1] is h
    lst = p.axes  # list edits touch the list read, not the layout
    lst[0] = axis("dp", 1, 2)
    lst.append(axis("dp", 0, 2))
    lst.clear()
    p.axes.pop()
    p.axes.reverse()
    assert [(a.kind, a.stage_id) for a in p.axes] == [("pp", 3), ("tp", None)]
    for a in p.axes:  # editing every axis in a loop sticks
        a.size = 8
    assert [a.size for a in p.axes] == [8, 8]
    p.axes = [axis("ep", 0, 2, expert_id=5), axis("dp", 1, 3)]  # same length: overwritten in place
    assert p.axes[1] is h and (h.kind, h.rank, h.size, h.split_dim) == ("dp", 1, 3, None)
    h.rank = 0
    assert p.axes[1].rank == 0
    p.axes = [axis("tp", 1, 2, split_dim=0)]  # shorter, then longer again within the capacity of two
    assert len(p.axes) == 1
    p.axes = [axis("dp", 0, 2), axis("pp", 1, 2, stage_id=4)]
    assert p.axes[1] is h and (h.kind, h.stage_id) == ("pp", 4)
    p.axes += [axis("ep", 0, 2, expert_id=1)]  # reads, extends, assigns: sticks
    assert [a.kind for a in p.axes] == ["dp", "pp", "ep"]
    p.axes = (axis("dp", 0, 2),)  # any sequence of ParallelAxis
    assert len(p.axes) == 1
    for bad in ([1], "ab", None, [None], {axis("dp", 0, 2)}, iter([axis("dp", 0, 2)])):
        with pytest.raises(TypeError):
            p.axes = bad  # type: ignore[assignment]

    r = ReadTarget()
    q = par(axis("tp", 0, 2, split_dim=0))
    r.parallelism = q
    held = r.parallelism
    assert held is not None and held is r.parallelism and held is not q
    q.axes[0].rank = 1  # assignment copied
    assert held.axes[0].rank == 0
    r.parallelism.axes[0].rank = 1  # live through the target
    assert held.axes[0].rank == 1
    r.parallelism.axes.append(axis("dp", 0, 2))
    assert len(r.parallelism.axes) == 1
    r.parallelism.axes = r.parallelism.axes + [axis("dp", 0, 2)]
    assert len(held.axes) == 2
    held.axes = [axis("pp", 0, 2, stage_id=1)]
    assert [(a.kind, a.stage_id) for a in r.parallelism.axes] == [("pp", 1)]
    r.parallelism = par(axis("ep", 0, 2, expert_id=1))  # assigning again overwrites the stored one
    assert r.parallelism is held and [(a.kind, a.expert_id) for a in held.axes] == [("ep", 1)]
    r.parallelism = None
    assert r.parallelism is None
    r.parallelism = q
    assert r.parallelism is held and held.axes[0].rank == 1
    for bad2 in ([axis("dp", 0, 2)], 1, "x"):
        with pytest.raises(TypeError):
            r.parallelism = bad2  # type: ignore[assignment]


def test_edited_axes_reach_the_store(store: MooncakeDistributedStore) -> None:
    """Mooncake's own upsert test sets a PP axis's stage through ``p.axes[0].stage_id = 3`` and edits the TP
    rank of a parallelism read back from the request; both must reach the put (before: "PP axis requires
    stage_id", -600)."""
    t = torch.arange(8, dtype=torch.float32).view(4, 2)
    pp_tp = par(axis("pp", 0, 2), axis("tp", 1, 2, split_dim=0))
    pp_tp.axes[0].stage_id = 3
    assert store.put_tensor_with_parallelism("live", t, pp_tp) == 0
    assert store.upsert_tensor_with_parallelism("live", t + 1, pp_tp) == 0
    r = target("shard")
    r.parallelism = pp_tp
    r.parallelism.axes[1].rank = 0
    assert r.parallelism.axes[1].rank == 0
    pp_tp.axes[1].rank = 0
    assert store.put_tensor_with_parallelism("live", t, pp_tp) == 0
    r.parallelism.axes[1].rank = 1
    assert same(store.get_tensor_with_parallelism("live", r), (t + 1)[2:])


def test_writer_partitions_and_full_read(store: MooncakeDistributedStore) -> None:
    for r in range(3):
        assert store.put_tensor_with_parallelism("w", T46, writer_partition=Writer(r, 3, 1)) == 0
    assert store.is_exist("w") == 0
    assert [store.is_exist(f"w__writer_{r}of3_sd1") for r in range(3)] == [1, 1, 1]
    assert store.is_exist("w__writer_manifest") == 1
    assert same(store.get_tensor_with_parallelism("w", target("full")), T46)
    assert same(store.get_tensor_with_parallelism("w", target("shard", axis("tp", 2, 3, 1))), T46[:, 4:].contiguous())
    assert store.get_tensor_with_parallelism("w") is None  # as stored: there is no object "w"
    assert store.put_tensor_with_parallelism("half", T46, writer_partition=Writer(0, 2, 0)) == 0
    assert store.get_tensor_with_parallelism("half", target("full")) is None  # shard 1 is missing
    assert store.put_tensor("plain", T46) == 0
    assert same(store.get_tensor_with_parallelism("plain", target("full")), T46)  # no manifest: as stored
    for bad in (Writer(2, 2, 0), Writer(0, 2, 3), Writer(0, 4, 1)):
        assert store.put_tensor_with_parallelism("x", T46, writer_partition=bad) == INVALID
    assert store.put_tensor_with_parallelism("x", T46, par(axis("dp", 0, 2)), writer_partition=Writer(0, 2, 0)) \
        == INVALID
    with pytest.raises(RuntimeError):  # pybind11's cast of a None split_dim
        store.put_tensor_with_parallelism("x", T46, writer_partition=axis("tp", 0, 2))


def test_tp_layout_shards_reslice_and_full(store: MooncakeDistributedStore) -> None:
    for r in range(2):  # each rank writes its own shard; the full shape is inferred
        assert store.put_tensor_with_parallelism("p", T46[:, 3 * r:3 * r + 3].contiguous(),
                                                 par(axis("tp", r, 2, 1))) == 0
    obj = store.get("p_tp_1")
    assert struct.unpack_from("<2q", obj, 40) == (4, 6) and struct.unpack_from("<2q", obj, 104) == (4, 3)
    man = store.get("p__parallelism_manifest")
    assert len(man) == 96 and struct.unpack_from("<iiii", man, 8) == (0, 2, 1, 2)
    assert same(store.get_tensor_with_parallelism("p", target("full", axis("tp", 0, 2, 1))), T46)
    assert same(store.get_tensor_with_parallelism("p", target("shard", axis("tp", 1, 2, 1))), T46[:, 3:].contiguous())
    assert same(store.get_tensor_with_parallelism("p", target("shard", axis("tp", 2, 3, 1))), T46[:, 4:].contiguous())
    assert store.get_tensor_with_parallelism("p", target("shard", axis("tp", 3, 4, 1))) is None  # 6 % 4
    assert store.get_tensor_with_parallelism("p", target("full", axis("tp", 0, 2, 0))) is None  # split_dim differs


def test_multi_axis_and_generic_layouts(store: MooncakeDistributedStore) -> None:
    for r in range(2):
        assert store.put_tensor_with_parallelism("m", T46, par(axis("dp", 0, 2), axis("tp", r, 2, 0))) == 0
    assert store.is_exist("m__dp_0of2__tp_1of2_sd0") == 1
    assert same(store.get_tensor_with_parallelism("m", target("full", axis("tp", 0, 2, 0), axis("dp", 0, 2))), T46)
    assert same(store.get_tensor_with_parallelism("m", target("shard", axis("tp", 1, 4, 0), axis("dp", 0, 2))),
                T46[1:2])
    assert store.get_tensor_with_parallelism("m", target("full", axis("dp", 1, 2), axis("tp", 0, 2, 0))) is None
    assert store.put_tensor_with_parallelism("g", T46, par(axis("pp", 1, 2, stage_id=3), axis("dp", 0, 2))) == 0
    assert store.is_exist("g__dp_0of2__pp_1of2_sid3") == 1
    assert same(store.get_tensor_with_parallelism("g", target("shard", axis("dp", 0, 2), axis("pp", 1, 2, stage_id=3))),
                T46)
    assert store.get_tensor_with_parallelism("g", target("shard", axis("dp", 1, 2), axis("pp", 1, 2, stage_id=3))) \
        is None
    assert store.get_tensor_with_parallelism("g", target("full", axis("dp", 0, 2))) is None  # needs a TP axis
    for bad in (par(axis("tp", 0, 2)), par(axis("tp", 2, 2, 0)), par(), par(axis("dp", 0, 2, 0)),
                par(axis("ep", 0, 2)), par(axis("dp", 0, 2), axis("DP", 1, 2)), par(axis("zz", 0, 2)),
                par(*[axis("dp", 0, 1)] * 5)):
        assert store.put_tensor_with_parallelism("x", T46, bad) == INVALID
    assert store.put_tensor_with_parallelism("n", [1, 2], par(axis("tp", 0, 2, 0))) == INVALID
    cfg = ReplicateConfig()
    cfg.replica_num, cfg.preferred_segments = 2, ["one"]
    assert store.put_tensor_with_parallelism("x", T46, config=cfg) == INVALID  # the direct route checks it


def test_parallelism_from_buffers_and_batches(store: MooncakeDistributedStore) -> None:
    assert store.put_tensor("src", T46) == 0
    obj = obj_of(store, "src")
    ptr, n = obj.ctypes.data, obj.size
    assert store.put_tensor_with_parallelism_from("d", ptr, n) == 0 and store.get("d") == obj.tobytes()
    # a TP layout from a full buffer writes every rank's shard, without a manifest
    assert store.put_tensor_with_parallelism_from("t", ptr, n, par(axis("tp", 1, 2, 1))) == 0
    assert store.is_exist("t_tp_0") == 1 and store.is_exist("t__parallelism_manifest") == 0
    assert store.put_tensor_with_tp("ref", T46, 0, 2, 1) == 0
    assert store.get("t_tp_0") == store.get("ref_tp_0") and store.get("t_tp_1") == store.get("ref_tp_1")
    assert store.put_tensor_with_parallelism_from("w", ptr, n, writer_partition=Writer(1, 2, 1)) == 0
    assert store.put_tensor_with_parallelism("wt", T46, writer_partition=Writer(1, 2, 1)) == 0
    assert store.get("w__writer_1of2_sd1") == store.get("wt__writer_1of2_sd1")
    assert store.get("w__writer_manifest") == store.get("wt__writer_manifest")
    assert store.put_tensor_with_parallelism_from("g", ptr, n, par(axis("dp", 1, 2))) == 0
    assert store.put_tensor_with_parallelism("gt", T46, par(axis("dp", 1, 2))) == 0
    assert store.get("g__dp_1of2") == store.get("gt__dp_1of2")
    assert store.put_tensor_with_parallelism_from("x", ptr, 100) == INVALID
    assert store.put_tensor_with_parallelism_from("x", 0, n) == INVALID
    assert store.batch_put_tensor_with_parallelism(["b1", "b2"], [T46, T46], [par(axis("tp", 0, 2, 1)), None]) \
        == [0, 0]
    assert store.is_exist("b1_tp_0") == 1 and store.is_exist("b2") == 1
    assert store.batch_put_tensor_with_parallelism(["b3"], [T46], writer_partitions=[Writer(1, 2, 1)]) == [0]
    assert store.batch_put_tensor_with_parallelism(["b4"], [T46], [None], writer_partitions=[None]) == [INVALID]
    assert store.batch_put_tensor_with_parallelism(["b5", "b6"], [T46]) == [INVALID, INVALID]
    assert store.batch_put_tensor_with_parallelism(["b5"], [T46], []) == [INVALID]
    assert store.batch_put_tensor_with_parallelism(["b7", "b8"], [T46, [1]]) == [0, INVALID]
    assert store.batch_put_tensor_with_parallelism([], []) == []
    assert store.batch_put_tensor_with_parallelism_from(["c1", "c2"], [ptr, ptr], [n, n],
                                                        [par(axis("tp", 0, 2, 1)), None]) == [0, 0]
    assert store.batch_put_tensor_with_parallelism_from(["c3", "c4"], [ptr, ptr], [n, 100]) == [INVALID, INVALID]
    groups = ReplicateConfig()
    groups.group_ids = ["only-one"]
    assert store.batch_put_tensor_with_parallelism(["g1", "g2"], [T46, T46], config=groups) == [INVALID, INVALID]
    # upserts replace
    assert store.put_tensor_with_parallelism("u", T46, par(axis("tp", 0, 2, 1))) == 0
    assert store.put_tensor_with_parallelism("u", torch.ones(4, 6), par(axis("tp", 0, 2, 1))) == 0  # kept
    assert same(store.get_tensor("u_tp_0"), T46)
    assert store.upsert_tensor_with_parallelism("u", torch.ones(4, 6), par(axis("tp", 0, 2, 1))) == 0
    assert same(store.get_tensor("u_tp_0"), torch.ones(4, 6))
    assert store.upsert_tensor_with_parallelism_from("u2", ptr, n, par(axis("tp", 1, 2, 1))) == 0
    assert store.batch_upsert_tensor_with_parallelism(["u3"], [T46], [par(axis("dp", 1, 2))]) == [0]
    assert store.batch_upsert_tensor_with_parallelism_from(["u4"], [ptr], [n], writer_partitions=[Writer(0, 2, 1)]) \
        == [0]
    assert store.is_exist("u4__writer_0of2_sd1") == 1


def test_parallelism_reads_into_registered_memory(store: MooncakeDistributedStore) -> None:
    for r in range(2):
        assert store.put_tensor_with_parallelism("p", T46[:, 3 * r:3 * r + 3].contiguous(),
                                                 par(axis("tp", r, 2, 1))) == 0
    assert store.put_tensor("plain", T46) == 0
    buf = np.zeros(4096, dtype=np.uint8)
    ptr = buf.ctypes.data
    full = target("full", axis("tp", 0, 2, 1))
    assert store.get_tensor_with_parallelism_into("plain", ptr, 4096) is None  # not registered: as Mooncake
    assert store.register_buffer(ptr, 4096) == 0
    t = store.get_tensor_with_parallelism_into("p", ptr, 4096, full)
    assert same(t, T46) and t.data_ptr() == ptr + 304
    assert struct.unpack_from("<I", buf, 16)[0] == 0  # a FULL object was materialised
    t = store.get_tensor_with_parallelism_into("plain", ptr + 100, 1000)
    assert same(t, T46) and t.data_ptr() == ptr + 404
    assert store.get_tensor_with_parallelism_into("plain", ptr, 399) is None
    assert store.get_tensor_with_parallelism_into("plain", ptr + 4000, 400) is None  # past the region
    assert store.get_tensor_with_parallelism_into("missing", ptr, 4096) is None
    # the into form has no legacy fallback: a split_dim that differs reads nothing
    assert store.get_tensor_with_parallelism_into("p", ptr, 4096, target("shard", axis("tp", 1, 2, 0))) is None
    assert same(store.get_tensor_with_parallelism("p", target("shard", axis("tp", 1, 2, 0))), T46[:, 3:].contiguous())
    got = store.batch_get_tensor_with_parallelism_into(["plain", "p", "missing"], [ptr, ptr + 1024, ptr + 2048],
                                                       [1024, 1024, 1024], [None, full, None])
    assert same(got[0], T46) and same(got[1], T46) and got[2] is None
    assert store.batch_get_tensor_with_parallelism_into(["plain", "p"], [ptr], [1024]) == [None, None]
    assert store.batch_get_tensor_with_parallelism_into(["plain"], [ptr], [1024], (None,)) == [None]
    assert store.unregister_buffer(ptr) == 0
    got = store.batch_get_tensor_with_parallelism(["plain", "p", "missing"], [None, full, None])
    assert same(got[0], T46) and same(got[1], T46) and got[2] is None
    assert store.batch_get_tensor_with_parallelism(["plain", "x"], [None]) == [None, None]
    assert store.batch_get_tensor_with_parallelism(["plain"], (None,)) == [None]


# ------------------------------------------------------------------------------------ safetensors

def test_safetensors_export_and_import(store: MooncakeDistributedStore, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert store.put_tensor("a", T46) == 0
    assert store.save_tensor_to_safetensor("a") == 0  # the key is the file name
    raw = (tmp_path / "a").read_bytes()
    n = struct.unpack_from("<Q", raw)[0]
    # what the safetensors library writes: compact JSON padded with spaces to a multiple of 8
    assert raw[8:8 + n] == b'{"a":{"dtype":"F32","shape":[4,6],"data_offsets":[0,96]}}       '
    assert raw[8 + n:] == T46.numpy().tobytes()
    assert store.save_tensor_to_safetensor("a", str(tmp_path / "out.safetensors")) == 0
    assert (tmp_path / "out.safetensors").read_bytes() == raw
    assert store.save_tensor_to_safetensor("missing") == FILE_NOT_FOUND
    assert store.put("raw", b"x" * 400) == 0
    assert store.save_tensor_to_safetensor("raw", "r.st") == FILE_NOT_FOUND
    assert store.save_tensor_to_safetensor("a", "/nonexistent/dir/x.st") == INVALID
    with pytest.raises(RuntimeError):
        store.save_tensor_to_safetensor("a", 5)
    assert store.put_tensor("b", torch.ones(2, 2, dtype=torch.bool)) == 0
    assert store.save_tensor_to_safetensor("b", "b.st") == 0
    raw = (tmp_path / "b.st").read_bytes()
    assert b'"dtype":"BOOL"' in raw and raw.endswith(b"\x01\x01\x01\x01")

    loaded = store.load_tensor_from_safetensor(file_name="out.safetensors")
    assert same(loaded, T46) and same(store.get_tensor("out.safetensors"), T46)  # stored under the file name
    assert same(store.load_tensor_from_safetensor("newkey", "out.safetensors"), T46)  # first entry, a warning
    assert same(store.get_tensor("newkey"), T46)
    assert store.load_tensor_from_safetensor("k", "no-such-file") is None
    header = json.dumps({"__metadata__": {"x": "y"},
                         "y": {"dtype": "I8", "shape": [3], "data_offsets": [4, 7]},
                         "x": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    (tmp_path / "two.st").write_bytes(struct.pack("<Q", len(header)) + header + b"\x80\x3f\x00\x40\x01\x02\x03")
    assert same(store.load_tensor_from_safetensor("y", "two.st"), torch.tensor([1, 2, 3], dtype=torch.int8))
    assert same(store.load_tensor_from_safetensor("q", "two.st"), torch.tensor([1.0, 2.0], dtype=torch.bfloat16))
    empty = b"{}      "
    (tmp_path / "empty.st").write_bytes(struct.pack("<Q", len(empty)) + empty)
    assert store.load_tensor_from_safetensor("e", "empty.st") is None
    (tmp_path / "garbage.st").write_bytes(b"garbage")
    assert store.load_tensor_from_safetensor("g", "garbage.st") is None
    header = json.dumps({"c": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}).encode()
    (tmp_path / "c.st").write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    assert store.load_tensor_from_safetensor("c", "c.st") is None
    with pytest.raises(TypeError):
        store.load_tensor_from_safetensor("k")  # file_name is required
    assert os.listdir(tmp_path) and not any(p.startswith(".tmp") for p in os.listdir(tmp_path))


# -------------------------------------------------------------------------- setup and missing torch

def test_before_setup() -> None:
    s = MooncakeDistributedStore()
    t = torch.ones(2, 2)
    assert s.get_tensor("a") is None and s.batch_get_tensor(["a", "b"]) == [None, None]
    assert s.put_tensor("a", t) == INVALID and s.batch_put_tensor(["a"], [t]) == [INVALID]
    assert s.get_tensor_into("a", 1234, 10) is None and s.batch_get_tensor_into(["a"], [1], [1]) == [INVALID]
    assert s.put_tensor_from("a", 1234, 400) == INVALID
    assert s.get_tensor_with_tp("a", 0, 2) is None and s.batch_get_tensor_with_tp(["a"], 0, 2) == [None]
    assert s.get_tensor_with_tp_into("a", 1, 1, 0, 2) is None
    assert s.batch_get_tensor_with_tp_into(["a"], [1], [1], 0, 2) == [None]
    assert s.put_tensor_with_tp("a", t, 0, 2, 0) == INVALID and s.batch_put_tensor_with_tp(["a"], [t], 0, 2, 0) \
        == [INVALID]
    assert s.put_tensor_with_tp_from("a", 1, 1, 0, 2, 0) == INVALID
    assert s.batch_put_tensor_with_tp_from(["a"], [1], [1], 0, 2, 0) == [INVALID]
    assert s.get_tensor_with_parallelism("a") is None
    assert s.get_tensor_with_parallelism("a", target("full")) is None
    assert s.put_tensor_with_parallelism("a", t) == INVALID
    assert s.put_tensor_with_parallelism("a", t, par(axis("tp", 0, 2, 0))) == INVALID
    assert s.put_tensor_with_parallelism("a", t, writer_partition=Writer(0, 2, 0)) == INVALID
    assert s.get_tensor_with_parallelism_into("a", 1, 1) is None
    assert s.save_tensor_to_safetensor("a") == INVALID and s.load_tensor_from_safetensor("a", "b") is None
    assert s.get_tensor_into_cuda("a", t) == INVALID and s.batch_get_tensor_into_cuda(["a"], [t]) == [INVALID]
    assert s.pub_tensor("a", t) == INVALID and s.batch_pub_tensor(["a"], [t]) == [INVALID]
    assert s.upsert_tensor("a", t) == INVALID and s.batch_upsert_tensor_from(["a"], [1], [1]) == [INVALID]


def test_without_torch_reads_are_none_and_writes_refused(store: MooncakeDistributedStore,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    assert store.put_tensor("a", T46) == 0
    real_import = mc.tensors.importlib.import_module

    def no_torch(name: str, *a: Any) -> Any:
        if name == "torch":
            raise ImportError("No module named 'torch'")
        return real_import(name, *a)

    monkeypatch.setattr(mc.tensors.importlib, "import_module", no_torch)
    with caplog.at_level(logging.ERROR, logger="kvpool.mooncake"):
        assert store.get_tensor("a") is None
        assert store.batch_get_tensor(["a"]) == [None]
        assert store.put_tensor("b", T46) == INVALID
        assert store.put_tensor_with_tp("c", T46, 0, 2, 0) == INVALID
    assert "PyTorch is not installed" in caplog.text
    assert store.get("a")  # the bytes are still there; only the tensor calls need torch


def test_duck_typed_requests(store: MooncakeDistributedStore) -> None:
    from types import SimpleNamespace as NS

    tp = NS(kind="tp", rank=0, size=2, split_dim=1, expert_id=None, stage_id=None)
    assert store.put_tensor_with_parallelism("d", T46[:, :3].contiguous(), NS(axes=[tp])) == 0  # as the wheel
    assert store.is_exist("d_tp_0") == 1
    got = store.get_tensor_with_parallelism("d", NS(mode="shard", parallelism=NS(axes=[tp])))
    assert same(got, T46[:, :3].contiguous())
    assert store.put_tensor_with_parallelism("d", T46, NS()) == INVALID  # no axes
    assert store.get_tensor_with_parallelism("d", NS(mode="sideways", parallelism=None)) is None
    assert store.get_tensor_with_parallelism("d", 5) is None  # no mode/parallelism: logged, None
    with pytest.raises(RuntimeError):  # pybind11 cannot cast the rank
        store.put_tensor_with_parallelism("d", T46, NS(axes=[NS(kind="dp", rank="0", size=2, split_dim=None,
                                                                 expert_id=None, stage_id=None)]))
    axes = (NS(kind="dp", rank=1, size=2, split_dim=None, expert_id=None, stage_id=None),)
    assert store.put_tensor_with_parallelism("e", T46, NS(axes=axes)) == 0  # any iterable of axes
    assert store.is_exist("e__dp_1of2") == 1
