"""One sequence of calls, run against the real Mooncake and against kvpool: the same return codes, the same bytes.

The real side is the pinned wheel's ``mooncake.store`` set up against its own ``mooncake_master`` and a
``mooncake_client`` store process (python/peer_tests/mooncake/conftest.py); the kvpool side is ``kvpool.mooncake``
against a kvpool pool. Both start empty. Every step is one call (or a call and a read-back of the buffer it
filled), and its outcome is the value returned, the bytes read, or the type of the exception raised.

Where kvpool deliberately answers differently, the step is in ``KNOWN_DIFFERENCES`` with the reason (the
same list is in docs/python.md). A known difference that stops differing fails the test too, so the list
is always exactly what differs.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import mooncake.store as real_module  # the pinned wheel

import kvpool.mooncake as kv_module

#: step label -> why kvpool answers differently (docs/python.md, "Differences from the real Mooncake").
KNOWN_DIFFERENCES: dict[str, str] = {
    "put 4096-byte key": "kvpool keys are 1 to 512 UTF-8 bytes (its wire protocol's limit); Mooncake takes longer "
                         "ones. kvpool refuses a longer key with -600",
    "is_exist 4096-byte key": "a key over 512 bytes cannot be stored in kvpool, so it is never present",
}


@dataclass
class Outcome:
    value: Any = None
    raised: Optional[str] = None

    def __str__(self) -> str:
        if self.raised:
            return f"raises {self.raised}"
        text = repr(self.value)
        return text if len(text) < 200 else text[:200] + f"... ({len(text)} chars)"


@dataclass
class Buffers:
    """Host buffers the zero-copy calls read from and write into, the same contents on both sides."""

    arrays: list[np.ndarray] = field(default_factory=list)

    def src(self, size: int, seed: int) -> tuple[int, np.ndarray]:
        a = np.random.default_rng(seed).integers(0, 256, max(size, 1), dtype=np.uint8)
        self.arrays.append(a)
        return int(a.ctypes.data), a

    def dst(self, size: int) -> tuple[int, np.ndarray]:
        a = np.full(max(size, 1), 0xEE, dtype=np.uint8)
        self.arrays.append(a)
        return int(a.ctypes.data), a


def value(n: int, seed: int) -> bytes:
    return bytes(np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8))


def _norm(result: Any) -> Any:
    """Comparable form of a result: buffer handles as bytes, tuples as lists."""
    if result is None or isinstance(result, (int, str, bytes, bool, float)):
        return result
    if isinstance(result, (list, tuple)):
        return [_norm(r) for r in result]
    if hasattr(result, "ptr") and hasattr(result, "size"):
        return bytes(memoryview(result)) if result.size() else b""  # BufferHandle
    if isinstance(result, dict):
        return {k: _norm(v) for k, v in result.items()}
    return repr(type(result).__name__)


Step = tuple[str, Callable[[Any, Any, Buffers], Any]]


def _into(s: Any, m: Any, b: Buffers, key: str, size: int) -> Any:
    ptr, a = b.dst(size)
    n = s.get_into(key, ptr, size)
    return n, bytes(a[:max(n, 0)]) if n > 0 else b""


def _batch_into(s: Any, keys: list[str], sizes: list[int], b: Buffers) -> Any:
    bufs = [b.dst(n) for n in sizes]
    got = s.batch_get_into(keys, [p for p, _ in bufs], sizes)
    return got, [bytes(a[:n]) if n > 0 else b"" for n, (_, a) in zip(got, bufs)]


def _multi_into(s: Any, keys: list[str], splits: list[list[int]], b: Buffers) -> Any:
    bufs = [[b.dst(n) for n in parts] for parts in splits]
    got = s.batch_get_into_multi_buffers(keys, [[p for p, _ in row] for row in bufs], splits)
    return got, [b"".join(bytes(a[:n]) for (_, a), n in zip(row, parts)) for row, parts in zip(bufs, splits)]


def _multi_put(s: Any, keys: list[str], splits: list[list[int]], seed: int, b: Buffers, upsert: bool = False) -> Any:
    ptrs, sizes = [], []
    for i, parts in enumerate(splits):
        row = [b.src(n, seed + 10 * i + j) for j, n in enumerate(parts)]
        ptrs.append([p for p, _ in row])
        sizes.append(parts)
    return s.batch_put_from_multi_buffers(keys, ptrs, sizes)


def _registered_dst(s: Any, b: Buffers, size: int) -> tuple[int, np.ndarray]:
    """A destination buffer registered with the store (Mooncake's ranged reads require registration)."""
    ptr, a = b.dst(size)
    assert s.register_buffer(ptr, a.nbytes) == 0
    return ptr, a


def _ranges(s: Any, m: Any, b: Buffers) -> Any:
    """get_into_ranges: two buffers, each filled from ranges of stored objects (and one missing key)."""
    d0, a0 = _registered_dst(s, b, 4096)
    d1, a1 = _registered_dst(s, b, 4096)
    got = s.get_into_ranges([d0, d1], [["rg/a", "rg/b"], ["rg/b", "rg/missing"]],
                            [[[0, 100], [200]], [[0], [10]]], [[[0, 50], [1000]], [[4000], [0]]],
                            [[[100, 50], [300]], [[96], [5]]])
    out = got, bytes(a0[:500]), bytes(a1[:200])
    s.unregister_buffer(d0)
    s.unregister_buffer(d1)
    return out


def _put_session(s: Any, m: Any, b: Buffers) -> Any:
    started = s.batch_put_session_start(["ps/a", "ps/b"], [3000, 100])
    src0, src1 = b.src(3000, 60)[0], b.src(100, 61)[0]
    ranged = s.batch_put_from_multi_buffer_ranges(["ps/a", "ps/b"], [[src0, src0 + 1000], [src1]],
                                                  [[1000, 2000], [100]], [[0, 1000], [0]])
    before = s.batch_is_exist(["ps/a", "ps/b"])
    ended = s.batch_put_session_end(["ps/a", "ps/b"])
    return started, ranged, before, ended, s.get("ps/a"), s.get("ps/b")


def _get_session(s: Any, m: Any, b: Buffers) -> Any:
    started = s.batch_get_session_start(["ps/a", "ps/missing"])
    d, a = _registered_dst(s, b, 3000)
    ranged = s.batch_get_into_multi_buffer_ranges(["ps/a"], [[d, d + 100]], [[100, 200]], [[2900, 0]])
    ended = s.batch_get_session_end(["ps/a", "ps/missing"])
    s.unregister_buffer(d)
    return started, ranged, ended, bytes(a[:300])


def _tensor(s: Any, m: Any, b: Buffers) -> Any:
    import torch
    t = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    put = s.put_tensor("tn/a", t)
    got = s.get_tensor("tn/a")
    return put, s.get("tn/a"), got.tolist() if got is not None else None, s.get_tensor("tn/missing")


def _replica_desc(s: Any, m: Any, b: Buffers) -> Any:
    """Shape of the descriptors: which keys have them, how many, memory or disk, sizes, status; endpoints
    name different processes on the two systems, so only their form is compared."""
    descs = s.batch_get_replica_desc(["sz/7", "pb/0", "rd/missing"])
    out = {}
    for key, ds in sorted(descs.items()):
        out[key] = [(d.is_memory_replica(), d.get_memory_descriptor().buffer_descriptor.size, int(d.status),
                     bool(re.fullmatch(r"[\w.\-]+:\d+", d.get_memory_descriptor().buffer_descriptor.transport_endpoint)))
                    for d in ds]
    return out


def _config(m: Any, **fields: Any) -> Any:
    c = m.ReplicateConfig()
    for k, v in fields.items():
        setattr(c, k, v)
    return c


SIZES = [1, 7, 4096, 65536 + 3, 1 << 20, (4 << 20) + 1]

STEPS: list[Step] = [
    # --- put, get, existing keys, sizes
    *[(f"put {n} bytes", lambda s, m, b, n=n: s.put(f"sz/{n}", value(n, n))) for n in SIZES],
    *[(f"get {n} bytes", lambda s, m, b, n=n: s.get(f"sz/{n}")) for n in SIZES],
    *[(f"get_size {n}", lambda s, m, b, n=n: s.get_size(f"sz/{n}")) for n in SIZES],
    ("is_exist present", lambda s, m, b: s.is_exist("sz/1")),
    ("is_exist missing", lambda s, m, b: s.is_exist("nope")),
    ("get missing", lambda s, m, b: s.get("nope")),
    ("get_size missing", lambda s, m, b: s.get_size("nope")),
    ("put existing key", lambda s, m, b: s.put("sz/7", b"other value")),
    ("get after put of existing key", lambda s, m, b: s.get("sz/7")),
    ("upsert existing key", lambda s, m, b: s.upsert("sz/7", b"replaced")),
    ("get after upsert", lambda s, m, b: s.get("sz/7")),
    ("upsert new key", lambda s, m, b: s.upsert("up/new", value(100, 1))),
    ("upsert larger value", lambda s, m, b: s.upsert("up/new", value(5000, 2))),
    ("get after upsert larger", lambda s, m, b: s.get("up/new")),
    ("put empty value", lambda s, m, b: s.put("empty", b"")),
    ("is_exist after empty put", lambda s, m, b: s.is_exist("empty")),
    ("put bytearray", lambda s, m, b: s.put("ba", bytearray(b"abc"))),
    ("put memoryview", lambda s, m, b: s.put("mv", memoryview(b"abcdef")[1:4])),
    ("get memoryview value", lambda s, m, b: s.get("mv")),
    # --- parts
    ("put_parts", lambda s, m, b: s.put_parts("parts/1", b"head", value(3000, 3), b"tail")),
    ("get put_parts", lambda s, m, b: s.get("parts/1")),
    ("put_parts existing", lambda s, m, b: s.put_parts("parts/1", b"x")),
    ("upsert_parts", lambda s, m, b: s.upsert_parts("parts/1", b"new", b"parts")),
    ("get upsert_parts", lambda s, m, b: s.get("parts/1")),
    ("put_parts no parts", lambda s, m, b: s.put_parts("parts/none")),
    ("is_exist after no parts", lambda s, m, b: s.is_exist("parts/none")),
    # --- byte batches
    ("put_batch new", lambda s, m, b: s.put_batch([f"pb/{i}" for i in range(5)], [value(100 + i, i) for i in range(5)])),
    ("put_batch with existing", lambda s, m, b: s.put_batch(["pb/0", "pb/new"], [b"zz", b"new"])),
    ("get_batch", lambda s, m, b: s.get_batch(["pb/0", "pb/new", "pb/missing", "pb/4"])),
    ("get_batch empty list", lambda s, m, b: s.get_batch([])),
    ("put_batch length mismatch", lambda s, m, b: s.put_batch(["pb/x", "pb/y"], [b"1"])),
    ("upsert_batch", lambda s, m, b: s.upsert_batch(["pb/0", "pb/upnew"], [b"u0", b"u1"])),
    ("get_batch after upsert_batch", lambda s, m, b: s.get_batch(["pb/0", "pb/upnew"])),
    ("get_buffer", lambda s, m, b: s.get_buffer("pb/1")),
    ("get_buffer missing", lambda s, m, b: s.get_buffer("pb/missing")),
    ("batch_get_buffer", lambda s, m, b: s.batch_get_buffer(["pb/2", "pb/missing", "pb/3"])),
    # --- zero copy, one key
    ("put_from", lambda s, m, b: s.put_from("zc/1", b.src(8192, 5)[0], 8192)),
    ("get_into exact", lambda s, m, b: _into(s, m, b, "zc/1", 8192)),
    ("get_into larger buffer", lambda s, m, b: _into(s, m, b, "zc/1", 10000)),
    ("get_into buffer too small", lambda s, m, b: _into(s, m, b, "zc/1", 100)),
    ("get_into missing", lambda s, m, b: _into(s, m, b, "zc/missing", 100)),
    ("put_from existing", lambda s, m, b: s.put_from("zc/1", b.src(10, 6)[0], 10)),
    ("upsert_from", lambda s, m, b: s.upsert_from("zc/1", b.src(300, 7)[0], 300)),
    ("get_into after upsert_from", lambda s, m, b: _into(s, m, b, "zc/1", 8192)),
    ("put_from size 0", lambda s, m, b: s.put_from("zc/zero", b.src(1, 8)[0], 0)),
    ("is_exist after size 0", lambda s, m, b: s.is_exist("zc/zero")),
    ("put_from_with_metadata", lambda s, m, b: s.put_from_with_metadata("zc/meta", b.src(500, 9)[0],
                                                                         b.src(20, 10)[0], 500, 20)),
    ("get put_from_with_metadata", lambda s, m, b: s.get("zc/meta")),
    # --- zero copy, batches
    ("batch_put_from", lambda s, m, b: s.batch_put_from([f"bz/{i}" for i in range(4)],
                                                        [b.src(1000 * (i + 1), 20 + i)[0] for i in range(4)],
                                                        [1000 * (i + 1) for i in range(4)])),
    ("batch_put_from with existing", lambda s, m, b: s.batch_put_from(["bz/0", "bz/9"], [b.src(5, 30)[0], b.src(6, 31)[0]],
                                                                      [5, 6])),
    ("batch_get_into mixed", lambda s, m, b: _batch_into(s, ["bz/0", "bz/missing", "bz/3", "bz/9"], [1000, 64, 4000, 6], b)),
    ("batch_get_into small buffer", lambda s, m, b: _batch_into(s, ["bz/1", "bz/2"], [2000, 10], b)),
    ("batch_put_from length mismatch", lambda s, m, b: s.batch_put_from(["bz/a", "bz/b"], [b.src(5, 32)[0]], [5, 5])),
    ("batch_get_into length mismatch", lambda s, m, b: s.batch_get_into(["bz/0", "bz/1"], [b.dst(5)[0]], [5])),
    ("batch_upsert_from", lambda s, m, b: s.batch_upsert_from(["bz/0", "bz/new"], [b.src(50, 33)[0], b.src(60, 34)[0]],
                                                              [50, 60])),
    ("batch_get_into after upsert", lambda s, m, b: _batch_into(s, ["bz/0", "bz/new"], [50, 60], b)),
    ("batch_put_from empty", lambda s, m, b: s.batch_put_from([], [], [])),
    ("batch_get_into empty", lambda s, m, b: s.batch_get_into([], [], [])),
    ("batch_put_from_multi_buffers", lambda s, m, b: _multi_put(s, ["mb/0", "mb/1"], [[100, 200, 300], [4096]], 40, b)),
    ("batch_get_into_multi_buffers", lambda s, m, b: _multi_into(s, ["mb/0", "mb/1"], [[300, 300], [1000, 3096]], b)),
    ("batch_get_into_multi_buffers too small", lambda s, m, b: _multi_into(s, ["mb/0"], [[100, 100]], b)),
    ("batch_get_into_multi_buffers missing", lambda s, m, b: _multi_into(s, ["mb/missing", "mb/1"], [[10], [4096]], b)),
    ("batch_put_from_multi_buffers existing", lambda s, m, b: _multi_put(s, ["mb/0"], [[5]], 50, b)),
    # --- existence
    ("batch_is_exist", lambda s, m, b: s.batch_is_exist(["sz/1", "nope", "pb/0", "zc/zero", "mb/1"])),
    ("batch_is_exist empty", lambda s, m, b: s.batch_is_exist([])),
    # --- replication settings
    ("put replica_num 0", lambda s, m, b: s.put("rc/0", b"x", _config(m, replica_num=0))),
    ("put replica_num 2 (one store)", lambda s, m, b: s.put("rc/2", b"x", _config(m, replica_num=2))),
    ("get replica_num 2", lambda s, m, b: s.get("rc/2")),
    ("put hard pin", lambda s, m, b: s.put("rc/pin", b"p", _config(m, with_hard_pin=True))),
    ("put soft pin", lambda s, m, b: s.put("rc/soft", b"p", _config(m, soft_pin_action=m.SoftPinAction.ENABLE,
                                                                      soft_pin_ttl_ms=60000))),
    ("put ttl without soft pin", lambda s, m, b: s.put("rc/ttl", b"p", _config(m, soft_pin_ttl_ms=60000))),
    ("put prefer_alloc_in_same_node", lambda s, m, b: s.put("rc/same", b"p", _config(m, prefer_alloc_in_same_node=True))),
    ("put preferred segment unknown", lambda s, m, b: s.put("rc/pref", b"p", _config(m, preferred_segment="192.0.2.1:1"))),
    ("put preferred segment get_hostname", lambda s, m, b: s.put("rc/local", b"p",
                                                                 _config(m, preferred_segment=s.get_hostname()))),
    # --- keys
    ("put empty key", lambda s, m, b: s.put("", b"x")),
    ("get empty key", lambda s, m, b: s.get("")),
    ("put unicode key", lambda s, m, b: s.put("ключ/☃", b"snow")),
    ("get unicode key", lambda s, m, b: s.get("ключ/☃")),
    ("put 512-byte key", lambda s, m, b: s.put("k" * 512, b"x")),
    ("get 512-byte key", lambda s, m, b: s.get("k" * 512)),
    # --- wrong argument types (pybind11 TypeError)
    ("put int key", lambda s, m, b: s.put(123, b"x")),
    ("put str value", lambda s, m, b: s.put("t/str", "text")),
    ("get_into str address", lambda s, m, b: s.get_into("zc/1", "0x1", 10)),
    ("get_into negative size", lambda s, m, b: s.get_into("zc/1", b.dst(10)[0], -1)),
    ("batch_is_exist str", lambda s, m, b: s.batch_is_exist("abc")),
    ("put config wrong type", lambda s, m, b: s.put("t/cfg", b"x", 5)),
    ("remove int key", lambda s, m, b: s.remove(5)),
    # --- ranges, sessions, tensors, replica descriptors
    ("put objects for ranges", lambda s, m, b: s.put_batch(["rg/a", "rg/b"], [value(300, 70), value(5000, 71)])),
    ("get_into_ranges", _ranges),
    ("put session", _put_session),
    ("get session", _get_session),
    ("ranged put without a session", lambda s, m, b: s.batch_put_from_multi_buffer_ranges(
        ["ps/none"], [[b.src(10, 62)[0]]], [[10]], [[0]])),
    ("put session end without start", lambda s, m, b: s.batch_put_session_end(["ps/none"])),
    ("put session on an existing key", lambda s, m, b: s.batch_put_session_start(["ps/a"], [10])),
    ("put_tensor and get_tensor", _tensor),
    ("put_tensor_with_tp shards", lambda s, m, b: (
        s.put_tensor_with_tp("tn/tp", __import__("torch").arange(8, dtype=__import__("torch").int16).reshape(2, 4),
                             tp_rank=0, tp_size=2, split_dim=1),
        s.batch_is_exist(["tn/tp", "tn/tp_tp_0", "tn/tp_tp_1"]), s.get("tn/tp_tp_1"))),
    ("batch_get_replica_desc", _replica_desc),
    ("get_replica_desc missing", lambda s, m, b: s.get_replica_desc("rd/missing")),
    ("get_offload_rpc_read_count", lambda s, m, b: s.get_offload_rpc_read_count()),
    ("unmount_local_disk_segment", lambda s, m, b: s.unmount_local_disk_segment()),
    ("batch_replica_clear", lambda s, m, b: sorted(s.batch_replica_clear(["rg/a", "rg/missing"]))),
    ("is_exist after replica clear", lambda s, m, b: s.batch_is_exist(["rg/a", "rg/b"])),
    # --- removal
    ("remove present", lambda s, m, b: s.remove("sz/1")),
    ("remove missing", lambda s, m, b: s.remove("sz/1")),
    ("is_exist after remove", lambda s, m, b: s.is_exist("sz/1")),
    ("batch_remove mixed", lambda s, m, b: s.batch_remove(["pb/1", "pb/missing", "pb/2"])),
    ("batch_remove empty", lambda s, m, b: s.batch_remove([])),
    ("remove_by_regex prefix", lambda s, m, b: s.remove_by_regex("^bz/")),
    ("is_exist after regex", lambda s, m, b: s.batch_is_exist(["bz/0", "bz/new", "sz/7"])),
    ("remove_by_regex no match", lambda s, m, b: s.remove_by_regex("^nothing-here/")),
    ("remove_all", lambda s, m, b: s.remove_all(True)),
    ("is_exist after remove_all", lambda s, m, b: s.batch_is_exist(["sz/7", "pb/0", "mb/0", "up/new"])),
    ("get after remove_all", lambda s, m, b: s.get("sz/7")),
    ("remove_all empty pool", lambda s, m, b: s.remove_all(True)),
    # --- keys over kvpool's limit (after the last count of objects, which they would change)
    ("put 4096-byte key", lambda s, m, b: s.put("k" * 4096, b"x")),
    ("is_exist 4096-byte key", lambda s, m, b: s.is_exist("k" * 4096)),
    # --- lifecycle
    ("health_check", lambda s, m, b: s.health_check()),
    ("get_hostname is host:port", lambda s, m, b: bool(re.fullmatch(r"[\w.\-]+:\d+", s.get_hostname()))),
]

#: steps after which every read lease the real master granted must lapse before the next removal
_READS_BEFORE_REMOVAL = {"remove present", "batch_remove mixed", "remove_by_regex prefix", "remove_all",
                         "batch_replica_clear"}


def run(store: Any, module: Any, lease_ttl_ms: int) -> dict[str, Outcome]:
    out: dict[str, Outcome] = {}
    bufs = Buffers()
    for label, step in STEPS:
        if label in _READS_BEFORE_REMOVAL:
            time.sleep(lease_ttl_ms * 2 / 1000)  # Mooncake refuses to remove an object read within its lease
        try:
            out[label] = Outcome(_norm(step(store, module, bufs)))
        except Exception as e:  # noqa: BLE001 - the exception type is the outcome
            out[label] = Outcome(raised=type(e).__name__)
    return out


def test_the_same_calls_give_the_same_answers(mooncake_store: Any, kvpool_store: Any, mooncake_cluster: Any) -> None:
    labels = [label for label, _ in STEPS]
    assert len(set(labels)) == len(labels) and not any("`" in lb for lb in labels), "labels: unique, no backquotes"
    real = run(mooncake_store, real_module, mooncake_cluster.lease_ttl_ms)
    ours = run(kvpool_store, kv_module, mooncake_cluster.lease_ttl_ms)
    unexpected, stale = [], []
    for label, _ in STEPS:
        same = real[label] == ours[label]
        if not same and label not in KNOWN_DIFFERENCES:
            unexpected.append(f"{label}:\n      mooncake: {real[label]}\n      kvpool:   {ours[label]}")
        if same and label in KNOWN_DIFFERENCES:
            stale.append(f"{label}: both answer {real[label]}; remove it from KNOWN_DIFFERENCES and the docs")
    stale += [f"{label}: no such step" for label in KNOWN_DIFFERENCES if label not in real]
    assert not unexpected and not stale, (
        f"{len(unexpected)} unexpected difference(s):\n  " + "\n  ".join(unexpected)
        + ("\nstale known differences:\n  " + "\n  ".join(stale) if stale else ""))


def test_known_differences_are_documented() -> None:
    """Every known difference is in docs/python.md, by its step label."""
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[3] / "docs" / "python.md").read_text()
    missing = [label for label in KNOWN_DIFFERENCES if f"`{label}`" not in doc]
    assert not missing, f"docs/python.md does not list these differences: {missing}"
