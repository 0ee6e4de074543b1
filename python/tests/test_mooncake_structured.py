"""``mooncake.structured_object_store`` as ``kvpool.mooncake.install()`` provides it (kvpool's
``kvpool.mooncake.structured_object_store``), against a real kvpool pool: DataProto stages written, added to,
read whole, by field and by rows, handles passed as JSON, objects, destinations, FieldSchema codecs, clean-up.

What each call answers was compared with the wheel's own module over a real Mooncake
(python/peer_tests/mooncake/test_mooncake_structured_object_store.py runs both, and each reads the other's
objects); the MessagePack vectors below are msgpack 1.2.4's (``packb(v, use_bin_type=True,
strict_types=True)``).
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from typing import Any, Iterator

import numpy as np
import pytest
import torch

import kvpool.mooncake as mc
from kvpool.mooncake import structured_codecs as codecs
from kvpool.mooncake import structured_object_store as sos

import conftest


@pytest.fixture
def transfer(store: Any) -> Iterator[sos.MooncakeBundleTransfer]:
    yield sos.MooncakeBundleTransfer(store, key_prefix="t")


def data() -> dict[str, Any]:
    return {
        "batch": {"input_ids": torch.arange(12, dtype=torch.int64).reshape(4, 3),
                  "logp": torch.linspace(0, 1, 4),
                  "mask": np.arange(12, dtype=np.int32).reshape(4, 3)},
        "non_tensor_batch": {
            "uid": np.array(["a", "béta", "", None], dtype=object),
            "ids": np.array([[1, 2], [3], [4, 5, 6], []], dtype=object),
            "score": np.array([0.5, None, 2.0, 3.5], dtype=object),
            "info": np.array([{"x": 1, "tags": ["a"]}, {"x": 2}, None, {"y": "z"}], dtype=object),
            "blob": np.array([b"\x00\x01", b"", None, b"xyz"], dtype=object),
            "rows": np.array([np.arange(3, dtype=np.float32), np.arange(2, dtype=np.float32), None,
                              np.zeros(0, dtype=np.float32)], dtype=object),
            "shaped": np.array([np.asarray(7, dtype=np.float32), None, np.arange(4, dtype=np.float32).reshape(2, 2),
                                np.arange(3, dtype=np.float32)], dtype=object),
            "plain": np.array([1.0, 2.0, 3.0, 4.0]),
        },
        "meta_info": {"step": 7},
    }


def same(a: Any, b: Any) -> bool:
    """Deep equality of results: tensors and arrays by dtype, shape and values."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and \
            a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype == object:
            return all(same(x, y) for x, y in zip(a.tolist(), b.tolist()))
        return bool(np.array_equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def objects(*values: Any) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


# --------------------------------------------------------------------------------------- install

def test_install_provides_mooncake_structured_object_store() -> None:
    """In a fresh process without Mooncake's wheel: install(), then the wheel's import works and is kvpool's
    module, with the wheel's public names."""
    code = ("import kvpool.mooncake, sys; kvpool.mooncake.install()\n"
            "import mooncake.structured_object_store as s\n"
            "from mooncake.structured_object_store import MooncakeBundleTransfer, export_dataproto_ref, "
            "import_dataproto_ref, tensor_object_buffer, raw_destination, BundleTransferPolicy, FieldSchema\n"
            "import mooncake\n"
            "assert s.__name__ == 'kvpool.mooncake.structured_object_store', s.__name__\n"
            "assert mooncake.structured_object_store is s and 'numpy' not in sys.modules\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=conftest.REPO / "python")
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# ------------------------------------------------------------------------------------- the main path

def test_a_dataproto_round_trip_by_handle(transfer: sos.MooncakeBundleTransfer, store: Any) -> None:
    d = data()
    ref = transfer.put_dataproto(d, namespace="ns", partition="p1", stage="rollout")
    handle = json.loads(json.dumps(sos.export_dataproto_ref(ref)))  # what another process receives
    assert handle["type"] == "mooncake_dataproto_ref" and handle["batch_size"] == 4
    assert handle["stage_refs"]["rollout"]["manifest_key"].startswith("t/p1/")
    assert handle["storage_group_id"].startswith("structured-")
    assert {n: e["codec"] for n, e in handle["encoded_non_tensor"].items()} == {
        "uid": "utf8_ragged", "ids": "typed_ragged", "score": "ndarray", "info": "msgpack_ragged",
        "blob": "bytes_ragged", "rows": "typed_ragged", "shaped": "typed_ragged"}
    got = transfer.get_dataproto(handle)
    assert same(got["batch"], d["batch"])
    expected_nt = dict(d["non_tensor_batch"])
    expected_nt["ids"] = objects([1.0, 2.0], [3.0], [4.0, 5.0, 6.0], [])  # one dtype for the column: float64
    expected_nt["blob"] = objects(b"\x00\x01", b"", None, b"xyz")
    assert same(got["non_tensor_batch"], expected_nt)  # "shaped": a 0-d row stays 0-d, a 2-d row 2-d
    assert got["meta_info"] == {"step": 7}
    ref2 = sos.import_dataproto_ref(handle)
    assert ref2.stage_refs["rollout"].manifest_key == ref.stage_refs["rollout"].manifest_key
    transfer.cleanup_dataproto(handle)
    assert store.remove_all(True) == 0  # every object of the stage went


def test_fields_rows_and_destinations(transfer: sos.MooncakeBundleTransfer) -> None:
    d = data()
    ref = transfer.put_dataproto(d, stage="rollout")
    some = transfer.get_dataproto(ref, fields=["uid", "input_ids"], meta_info_keys=["step", "nope"])
    assert list(some["batch"]) == ["input_ids"] and list(some["non_tensor_batch"]) == ["uid"]
    assert some["meta_info"] == {"step": 7}
    part = transfer.get_dataproto(ref, rows=slice(1, 3))
    assert same(part["batch"]["input_ids"], d["batch"]["input_ids"][1:3])
    assert same(part["batch"]["mask"], d["batch"]["mask"][1:3])
    assert same(part["non_tensor_batch"]["uid"], objects("béta", ""))
    assert same(part["non_tensor_batch"]["info"], objects({"x": 2}, None))
    picked = transfer.get_dataproto(ref, rows=[3, 0, -4])
    assert same(picked["batch"]["logp"], d["batch"]["logp"][[3, 0, 0]])
    assert same(picked["non_tensor_batch"]["score"], objects(3.5, 0.5, 0.5))
    assert same(picked["non_tensor_batch"]["plain"], np.array([4.0, 1.0, 1.0]))
    stepped = transfer.get_dataproto(ref, fields=["mask"], rows=sos.StructuredMemberSlice(0, 0, 4, 2))
    assert same(stepped["batch"]["mask"], d["batch"]["mask"][::2])
    with pytest.raises(ValueError, match="step=1"):
        transfer.get_dataproto(ref, fields=["input_ids"], rows=slice(0, 4, 2))
    with pytest.raises(ValueError, match="step=1"):
        transfer.get_dataproto(ref, fields=["uid"], rows=slice(0, 4, 2))
    with pytest.raises(IndexError):
        transfer.get_dataproto(ref, rows=[4])
    with pytest.raises(KeyError):
        transfer.get_dataproto(ref, fields=["nope"])
    with pytest.raises(ValueError):
        transfer.get_dataproto(ref, fields=["uid"], batch_fields=["mask"])
    dst = np.zeros((4, 3), dtype=np.int32)
    into = transfer.get_dataproto(ref, batch_fields=["mask"], destinations={"mask": dst})
    assert into["batch"]["mask"] is dst and same(dst, d["batch"]["mask"])
    with pytest.raises(ValueError, match="dtype mismatch"):
        transfer.get_dataproto(ref, batch_fields=["mask"], destinations={"mask": np.zeros((4, 3), dtype=np.int64)})
    raw = ctypes.create_string_buffer(48)
    r = transfer.get_dataproto(ref, batch_fields=["mask"], rows=[1],
                               destinations={"mask": sos.raw_destination(ctypes.addressof(raw), 48, raw)})
    assert same(r["batch"]["mask"], d["batch"]["mask"][1:2]) and raw.raw[:12] == d["batch"]["mask"][1].tobytes()

    class DataProto:
        def __init__(self, batch: Any, non_tensor_batch: Any, meta_info: Any) -> None:
            self.batch, self.non_tensor_batch, self.meta_info = batch, non_tensor_batch, meta_info

    built = transfer.get_dataproto(ref, fields=["uid"], data_cls=DataProto)
    assert isinstance(built, DataProto) and same(built.non_tensor_batch["uid"], d["non_tensor_batch"]["uid"])
    transfer.cleanup_dataproto(ref)


def test_appending_stages_and_fields(transfer: sos.MooncakeBundleTransfer, store: Any) -> None:
    d = data()
    ref = transfer.put_dataproto(d, stage="rollout")
    ref2 = transfer.append_dataproto_fields(ref, {"batch": {"old_logp": torch.zeros(4)},
                                                  "non_tensor_batch": {"note": objects("a", None, "c", "d")},
                                                  "meta_info": {"lr": 0.1}}, stage="old_log_prob")
    assert set(ref2.stage_refs) == {"rollout", "old_log_prob"} and ref2.meta_info == {"step": 7, "lr": 0.1}
    ref3 = transfer.append_dataproto_fields(ref2, {"batch": {"adv": torch.ones(4)}}, stage="rollout")
    assert ref3.stage_refs["rollout"].manifest_key != ref.stage_refs["rollout"].manifest_key
    got = transfer.get_dataproto(ref3, fields=["adv", "input_ids", "note"])
    assert same(got["batch"]["adv"], torch.ones(4)) and same(got["batch"]["input_ids"], d["batch"]["input_ids"])
    assert same(got["non_tensor_batch"]["note"], objects("a", None, "c", "d"))
    assert same(transfer.get_dataproto(ref, fields=["input_ids"])["batch"]["input_ids"], d["batch"]["input_ids"])
    with pytest.raises(ValueError, match="already exist"):
        transfer.append_dataproto_fields(ref3, {"batch": {"adv": torch.ones(4)}}, stage="x")
    with pytest.raises(ValueError, match="batch size"):
        transfer.append_dataproto_fields(ref3, {"batch": {"z": torch.ones(3)}}, stage="x")
    with pytest.raises(ValueError, match="must include existing fields"):
        transfer.append_dataproto_fields(ref3, {"batch": {"adv": torch.ones(4)}}, stage="rollout", overwrite=True)
    view = transfer.dataproto_manifest_view(ref3)
    assert view["batch_fields"]["adv"]["spec"] == {"encoding": "torch_tensor", "dtype": "torch.float32",
                                                   "shape": [4], "element_size": 4}
    assert view["non_tensor_fields"]["note"]["spec"]["codec"] == "utf8_ragged"
    assert view["stages"]["rollout"]["dataproto"]["batch_size"] == 4
    unpublished = transfer.append_dataproto_fields(ref3, {"batch": {"more": torch.ones(4)}}, stage="rollout")
    transfer.cleanup_dataproto_append(ref3, unpublished)
    assert store.is_exist(unpublished.stage_refs["rollout"].manifest_key) == 0
    assert same(transfer.get_dataproto(ref3, fields=["adv"])["batch"]["adv"], torch.ones(4))
    transfer.cleanup_dataproto(ref3)
    transfer.cleanup_dataproto(ref2)
    assert store.remove_all(True) == 0


def test_flat_dicts_objects_and_policies(transfer: sos.MooncakeBundleTransfer, store: Any) -> None:
    flat = transfer.put({"input": np.arange(8).reshape(4, 2), "text": ["a", "b", "c", "d"], "lr": 0.5,
                         "pair": [1, 2]}, type="dict")
    back = transfer.get(flat, type="dict")
    assert same(back, {"lr": 0.5, "pair": [1, 2], "input": np.arange(8).reshape(4, 2), "text": ["a", "b", "c", "d"]})
    assert same(transfer.get(flat, type="dict", rows=[3]), {"lr": 0.5, "pair": [1, 2], "input": np.array([[6, 7]]),
                                                            "text": ["d"]})
    transfer.cleanup_dataproto(flat)
    for value, expected in ((torch.tensor(1.5), torch.tensor(1.5)), (torch.arange(6).reshape(2, 3), None),
                            (b"raw", np.frombuffer(b"raw", dtype=np.uint8)), (np.arange(5, dtype=np.int16), None),
                            ({"e": b"", "t": torch.ones(2)}, {"e": b"", "t": torch.ones(2)})):
        obj = transfer.put_object(value)
        assert same(transfer.get_object(obj), value if expected is None else expected)
        transfer.remove_bundle(obj)
    with pytest.raises(TypeError):
        transfer.put_object("text")
    big = np.arange(1000, dtype=np.int64)
    chunked = sos.MooncakeBundleTransfer(store, key_prefix="small", default_chunk_bytes=3000)
    obj = chunked.put_object(big)
    assert [c["bytes"] for c in obj.manifest["buffers"]["value"]["chunks"]] == [3000, 3000, 2000]
    assert same(chunked.get_object({"manifest_key": obj.manifest_key}), big)
    chunked.remove_bundle(obj)
    chunked.remove_bundle(obj)  # gone already: nothing to do
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    buf = (ctypes.c_char * 400)()
    holder = store.put_tensor("holder", t)
    assert holder == 0 and store.get_into("holder", ctypes.addressof(buf), 400) == 304 + 24
    obj = transfer.put_object(sos.tensor_object_buffer(ctypes.addressof(buf), 328, buf),
                              policy=sos.BundleTransferPolicy(copy_mode="zero_copy"))
    assert same(transfer.get_object(obj), t)
    out = (ctypes.c_char * 400)()
    res = transfer.materialize_into(transfer.read_spec(obj), {"value": sos.tensor_object_buffer(
        ctypes.addressof(out), 400, out)})
    assert bytes(out)[:328] == bytes(buf)[:328] and res.objects["value"].size == 400
    with pytest.raises(ValueError, match="zero-copy"):
        transfer.put_object(t, policy=sos.BundleTransferPolicy(copy_mode="zero_copy"))
    with pytest.raises(RuntimeError, match="zero-copy"):
        transfer.put_object(b"x", policy=sos.BundleTransferPolicy(copy_mode="zero_copy"))
    with pytest.raises(ValueError):
        transfer.put_object(b"x", max_inflight_put=0)
    with pytest.raises(ValueError):
        transfer.put_object(b"x", partition="a/b")
    with pytest.raises(TypeError):
        sos.StructuredObjectPayload(metadata={})
    transfer.remove_bundle(obj)
    store.remove("holder")
    assert store.remove_all(True) == 0


def test_field_schemas_and_codecs_kvpool_lacks(transfer: sos.MooncakeBundleTransfer) -> None:
    schemas = {"score": sos.FieldSchema("ndarray", metadata={"dtype": "float32"}),
               "tags": sos.FieldSchema("json_ragged"),
               "strict": sos.FieldSchema("utf8_ragged", nullable=False),
               "meta": sos.FieldSchema("auto", metadata={"section": "meta_info"})}
    ref = transfer.put_dataproto({"non_tensor_batch": {"score": objects(1, 2), "tags": objects(["a"], {"b": 1}),
                                                       "strict": objects("x", "y")}, "meta_info": {"meta": 1}},
                                 field_schemas=schemas)
    assert ref.encoded_non_tensor["score"]["metadata"] == {"dtype": "float32", "shape": [2]}
    got = transfer.get_dataproto(ref)["non_tensor_batch"]
    assert same(got["score"], objects(1.0, 2.0)) and same(got["tags"], objects(["a"], {"b": 1}))
    with pytest.raises(ValueError, match="not nullable"):
        transfer.put_dataproto({"non_tensor_batch": {"strict": objects("x", None)}}, field_schemas=schemas)
    with pytest.raises(ValueError, match="declares section"):
        transfer.put_dataproto({"batch": {"meta": np.zeros(2)}}, field_schemas=schemas)
    for column in (objects(torch.ones(2), torch.ones(3)), objects({"a": np.zeros(2)}, {"a": np.ones(1)})):
        with pytest.raises(ValueError, match="does not implement Mooncake's"):
            transfer.put_dataproto({"non_tensor_batch": {"c": column}})
    with pytest.raises(ValueError, match="all rows are null"):
        transfer.put_dataproto({"non_tensor_batch": {"c": objects(None, None)}})
    with pytest.raises(TypeError):  # tuples are not msgpack lists (strict types), as in the wheel
        transfer.put_dataproto({"non_tensor_batch": {"c": objects((1, "a"), (2, "b"))}})
    transfer.cleanup_dataproto(ref)


# -------------------------------------------------------------------------------------- MessagePack

MSGPACK = [
    (None, "c0"), (True, "c3"), (False, "c2"), (0, "00"), (127, "7f"), (128, "cc80"), (255, "ccff"),
    (256, "cd0100"), (65535, "cdffff"), (65536, "ce00010000"), (2 ** 32, "cf0000000100000000"),
    (2 ** 64 - 1, "cfffffffffffffffff"), (-1, "ff"), (-32, "e0"), (-33, "d0df"), (-128, "d080"), (-129, "d1ff7f"),
    (-2 ** 15 - 1, "d2ffff7fff"), (-2 ** 31 - 1, "d3ffffffff7fffffff"), (-2 ** 63, "d38000000000000000"),
    (1.5, "cb3ff8000000000000"), ("", "a0"), ("a", "a161"), ("x" * 31, "bf" + "78" * 31), ("x" * 32, "d920" + "78" * 32),
    ("é" * 200, "da0190" + "c3a9" * 200), (b"", "c400"), (b"ab", "c4026162"), (b"x" * 300, "c5012c" + "78" * 300),
    ([], "90"), ([1, [2]], "92019102"), (list(range(16)), "dc0010" + "".join(f"{i:02x}" for i in range(16))),
    ({}, "80"), ({"a": 1, "b": [None, b"z"]}, "82a16101a16292c0c4017a"),
    ({str(i): i for i in range(16)}, "de0010" + "".join(f"a{len(str(i))}{str(i).encode().hex()}{i:02x}" if i < 10
                                                         else f"a2{str(i).encode().hex()}{i:02x}" for i in range(16))),
]


def test_messagepack_is_msgpacks() -> None:
    for value, hexed in MSGPACK:
        assert codecs.msgpack_pack(value).hex() == hexed, value
        assert codecs.msgpack_unpack_all(bytes.fromhex(hexed)) == [value]
    assert codecs.msgpack_unpack_all(bytes.fromhex("ca3fc00000" + "c0")) == [1.5, None]  # float32 reads
    for bad, error in (((1, 2), TypeError), (2 ** 64, OverflowError), (-2 ** 63 - 1, OverflowError),
                       (np.float64(1.0), TypeError), (np.int64(1), TypeError)):
        with pytest.raises(error):
            codecs.msgpack_pack(bad)
    for broken in ("92", "d9", "81c0c0", "d401ff"):
        with pytest.raises(ValueError):
            codecs.msgpack_unpack_all(bytes.fromhex(broken))


def test_infer_structure_splits_dicts_and_short_lists() -> None:
    leaves: list[Any] = []
    nodes: list[Any] = []
    sos.infer_structure("f", [{"a": 1, "b": [{"c": "x"}]}, None, {"a": 2}], leaves, nodes)
    assert [(n.path, n.node_type, n.children, n.row_mask) for n in nodes] == [
        ("f", "dict", ["a", "b"], [True, False, True]), ("f.b", "list", [0], [True, False, False]),
        ("f.b[0]", "dict", ["c"], [True, False, False])]
    assert [(leaf.path, leaf.decision.codec) for leaf in leaves] == [("f.a", "ndarray"), ("f.b[0].c", "utf8_ragged")]
    assert leaves[1].values == ["x", None, None] and nodes[1].lengths == [1, 0, 0]
    assert leaves[0].values[1] is None and repr(sos.MISSING) == "<MISSING>"
    leaves, nodes = [], []
    sos.infer_structure("g", [{"a": 1}, {"b": 2}], leaves, nodes)
    assert leaves[0].values == [1, sos.MISSING]
