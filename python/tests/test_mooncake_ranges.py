"""kvpool.mooncake's ranged reads and writes and its put and get sessions, over a real kvpool pool.

The codes expected are what the real wheel (mooncake-transfer-engine-non-cuda 0.3.13.post1, a real
mooncake_master and mooncake_client) answered to the same calls; where kvpool differs on purpose the test
says so. Random layouts use a seed printed at the start of each test (set KVPOOL_TEST_SEED to replay one).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import random
import threading
from typing import Any, Iterator

import numpy as np
import pytest

import kvpool
from kvpool.mooncake import MooncakeDistributedStore, ReplicateConfig
from kvpool.mooncake import ranges, transfer

import conftest

OK, INVALID, NO_SPACE, INVALID_REPLICA, NOT_READY, NOT_FOUND, EXISTS = 0, -600, -200, -702, -703, -704, -705
SENTINEL = 0xEE


def addr(a: np.ndarray) -> int:
    return int(a.ctypes.data)


@pytest.fixture
def seed() -> int:
    s = int(os.environ.get("KVPOOL_TEST_SEED", random.SystemRandom().randrange(1 << 32)))
    print(f"seed={s} (KVPOOL_TEST_SEED={s} replays it)")
    return s


@pytest.fixture
def other(pool: conftest.Pool, store: MooncakeDistributedStore) -> Iterator[MooncakeDistributedStore]:
    """A second store object on the same pool (Mooncake: another client process)."""
    s = conftest.setup_mooncake_store(pool.master)
    try:
        yield s
    finally:
        s.close()


def put_objects(store: MooncakeDistributedStore, rng: np.random.Generator,
                sizes: dict[str, int]) -> dict[str, np.ndarray]:
    objs = {k: rng.integers(0, 256, n, dtype=np.uint8) for k, n in sizes.items()}
    for k, v in objs.items():
        assert store.put(k, v.tobytes()) == OK
    return objs


# ----------------------------------------------------------------------------------- before setup

def test_before_setup_every_call_is_a_code() -> None:
    s = MooncakeDistributedStore()
    # the wheel crashes (SIGSEGV) on get_into_ranges before setup; kvpool answers -600 in Mooncake's shape
    assert s.get_into_ranges([1], [["a", "b"]], [[[0, 1], [2]]], [[[0, 0], [0]]], [[[4, 4], [4]]]) == \
        [[[INVALID, INVALID], [INVALID]]]
    # the wheel answers [] to these before setup; kvpool a code per key, as its other batch calls
    assert s.batch_get_session_start(["a"]) == [INVALID]
    assert s.batch_get_into_multi_buffer_ranges(["a"], [[1]], [[1]], [[0]]) == [INVALID]
    assert s.batch_put_session_start(["a"], [4]) == [INVALID]
    assert s.batch_put_from_multi_buffer_ranges(["a"], [[1]], [[1]], [[0]]) == [INVALID]
    assert s.batch_put_session_end(["a"]) == [INVALID]
    assert s.batch_put_session_revoke(["a"]) == [INVALID]
    assert s.batch_get_session_end(["a"]) == -1  # as the wheel
    s._drop_sessions()  # nothing open: a no-op


# -------------------------------------------------------------------------------- get_into_ranges

def random_layout(rng: np.random.Generator, objs: dict[str, np.ndarray], missing: list[str]) -> dict[str, Any]:
    """Buffers, each gathering disjoint fragments of several objects (a key may appear twice under one
    buffer, fragments in random order), with gaps left untouched; and the expected results and bytes."""
    names = list(objs) + missing
    ptr_bufs, keys, dsts, srcs, sizes, want, expect = [], [], [], [], [], [], []
    for _ in range(int(rng.integers(1, 5))):
        cursor = int(rng.integers(0, 16))
        rows: list[tuple[str, list[int], list[int], list[int]]] = []
        for _ in range(int(rng.integers(1, 5))):
            k = names[int(rng.integers(0, len(names)))]
            n_obj = len(objs[k]) if k in objs else 100
            d, s, z = [], [], []
            for _ in range(int(rng.integers(0, 6))):
                size = int(rng.integers(0, min(n_obj, 700) + 1))
                src = int(rng.integers(0, n_obj - size + 1))
                cursor += int(rng.integers(0, 9))
                d.append(cursor)
                s.append(src)
                z.append(size)
                cursor += size
            order = rng.permutation(len(d))
            rows.append((k, [d[o] for o in order], [s[o] for o in order], [z[o] for o in order]))
        cap = cursor + int(rng.integers(0, 32))
        buf = np.full(max(cap, 1), SENTINEL, np.uint8)
        exp = buf.copy()
        res = []
        for k, d, s, z in rows:
            if k in objs:
                for dd, ss, zz in zip(d, s, z):
                    exp[dd:dd + zz] = objs[k][ss:ss + zz]
                res.append(list(z))
            else:
                res.append([NOT_FOUND] * len(d))
        ptr_bufs.append(buf)
        keys.append([r[0] for r in rows])
        dsts.append([r[1] for r in rows])
        srcs.append([r[2] for r in rows])
        sizes.append([r[3] for r in rows])
        want.append(res)
        expect.append(exp)
    return {"bufs": ptr_bufs, "keys": keys, "dsts": dsts, "srcs": srcs, "sizes": sizes, "want": want,
            "expect": expect}


@pytest.mark.parametrize("window", [None, 3000], ids=["one-window", "small-windows"])
def test_get_into_ranges_random_layouts_are_byte_exact(store: MooncakeDistributedStore, seed: int,
                                                       window: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if window is not None:
        monkeypatch.setattr(transfer, "STAGING_BATCH_BYTES", window)
    rng = np.random.default_rng(seed)
    sizes = {f"obj{i}": int(rng.integers(1, 5000)) for i in range(8)}
    sizes["big"] = 200_000
    objs = put_objects(store, rng, sizes)
    for rnd in range(40):
        lay = random_layout(rng, objs, ["missing-a", "missing-b"] if rnd % 3 == 0 else [])
        if rnd % 2:  # registered buffers bound their ranges; these layouts stay inside them
            for b in lay["bufs"]:
                assert store.register_buffer(addr(b), b.nbytes) == OK
        got = store.get_into_ranges([addr(b) for b in lay["bufs"]], lay["keys"], lay["dsts"], lay["srcs"],
                                    lay["sizes"])
        if rnd % 2:
            for b in lay["bufs"]:
                assert store.unregister_buffer(addr(b)) == OK
        assert got == lay["want"], f"seed={seed} round={rnd}"
        for b, e in zip(lay["bufs"], lay["expect"]):
            assert np.array_equal(b, e), f"seed={seed} round={rnd}"


def test_get_into_ranges_codes_as_the_wheel(store: MooncakeDistributedStore) -> None:
    data = np.arange(256, dtype=np.uint8)
    assert store.put("k1", data.tobytes()) == OK
    buf = np.zeros(64, np.uint8)
    b = addr(buf)
    r = store.get_into_ranges
    assert r([b], [["k1"]], [[[0, 10]]], [[[5, 100]]], [[[4, 3]]]) == [[[4, 3]]]
    assert list(buf[:4]) == [5, 6, 7, 8] and list(buf[10:13]) == [100, 101, 102]
    # a missing key: its code in every one of its ranges; the other key is served
    assert r([b], [["nope", "k1"]], [[[0, 10], [20]]], [[[5, 100], [0]]], [[[4, 3], [2]]]) == \
        [[[NOT_FOUND, NOT_FOUND], [2]]]
    # ranges outside the object: -600 for that range only; size 0 at the end is fine, past it is not
    assert r([b], [["k1"]], [[[0, 10]]], [[[250, 100]]], [[[8, 3]]]) == [[[INVALID, 3]]]
    assert r([b], [["k1"]], [[[0]]], [[[300]]], [[[0]]]) == [[[INVALID]]]
    assert r([b], [["k1"]], [[[0]]], [[[256]]], [[[0]]]) == [[[0]]]
    assert r([b], [["k1"]], [[[0]]], [[[0]]], [[[0]]]) == [[[0]]]
    # overlapping source ranges of one object
    buf[:] = 0
    assert r([b], [["k1"]], [[[0, 2]]], [[[10, 20]]], [[[4, 4]]]) == [[[4, 4]]]
    assert list(buf[:8]) == [10, 11, 20, 21, 22, 23, 0, 0]
    # a registered buffer bounds its ranges, also from an address inside it
    assert store.register_buffer(b, 64) == OK
    assert r([b], [["k1"]], [[[60, 0]]], [[[0, 0]]], [[[8, 4]]]) == [[[INVALID, 4]]]
    assert r([b + 32], [["k1"]], [[[0, 28]]], [[[0, 0]]], [[[4, 8]]]) == [[[4, INVALID]]]
    assert r([b], [["k1"]], [[[0]]], [[[0]]], [[[256]]]) == [[[INVALID]]]
    # shapes: Mooncake's answer is shaped by buffer_ptrs, all_keys and all_dst_offsets
    assert r([b, b], [["k1"]], [[[0, 1]]], [[[0]]], [[[4]]]) == [[[INVALID, INVALID]], [[INVALID]]]
    assert r([b], [["k1"], ["k1", "k1"]], [[[0, 1]], [[0], [1, 2, 3]]], [[[0]]], [[[4]]]) == [[[INVALID, INVALID]]]
    assert r([b], [["k1", "k1"]], [[[0, 1], [2]]], [[[0, 1]]], [[[4, 4], [4]]]) == [[[INVALID, INVALID], [INVALID]]]
    assert r([b], [["k1", "k1"]], [[[0, 1], [2]]], [[[0], [4]]], [[[4, 4], [4]]]) == [[[INVALID, INVALID], [4]]]
    assert r([0], [["k1"]], [[[0]]], [[[0]]], [[[4]]]) == [[[INVALID]]]
    assert r([], [], [], [], []) == []
    assert r([b], [[]], [[]], [[]], [[]]) == [[]]
    assert r([b], [["k1"]], [[[]]], [[[]]], [[[]]]) == [[[]]]
    assert r((b,), (("k1",),), (((0,),),), (((0,),),), (((4,),),)) == [[[4]]]  # any sequences, as pybind11
    assert store.unregister_buffer(b) == OK
    # wrong types raise TypeError, as pybind11 does
    for bad in (([-1], [["a"]], [[[0]]], [[[0]]], [[[4]]]), ([b], ["ab"], [[[0]]], [[[0]]], [[[4]]]),
                ([b], [["k1"]], [[[-1]]], [[[0]]], [[[4]]]), ([b], [["k1"]], [[0]], [[[0]]], [[[4]]]),
                (b, [["k1"]], [[[0]]], [[[0]]], [[[4]]]), (b"\x01", [["k1"]], [[[0]]], [[[0]]], [[[4]]]),
                ([b], [["k1"]], [[b"\x00"]], [[[0]]], [[[4]]])):
        with pytest.raises(TypeError):
            r(*bad)


def test_get_into_ranges_checks_host_memory(store: MooncakeDistributedStore) -> None:
    assert store.put("k", bytes(range(64))) == OK
    size = 1 << 16
    none = conftest.mmap_raw(size, 0)
    ro = conftest.mmap_raw(size, mmap.PROT_READ)
    ok = np.zeros(16, np.uint8)
    try:
        got = store.get_into_ranges([none, ro, addr(ok)], [["k"], ["k"], ["k"]], [[[0]], [[0]], [[0, 8]]],
                                    [[[0]], [[0]], [[0, 60]]], [[[8]], [[8]], [[8, 4]]])
        assert got == [[[INVALID]], [[INVALID]], [[8, 4]]]
        assert list(ok[:8]) == list(range(8)) and list(ok[8:12]) == [60, 61, 62, 63]
    finally:
        conftest.munmap_raw(none, size)
        conftest.munmap_raw(ro, size)


def test_get_into_ranges_locates_once_and_moves_only_the_ranges(store: MooncakeDistributedStore,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """One lookup per call, however many ranges and objects; only the ranges' bytes are read (ranged reads,
    protocol version 11), never whole objects."""
    for k in ("a", "b"):
        assert store.put(k, bytes(range(100)) * 1000) == OK
    client = store._client
    lookups: list[list[str]] = []
    real = client.locate
    monkeypatch.setattr(client, "locate", lambda keys: lookups.append(list(keys)) or real(keys))
    monkeypatch.setattr(client, "get_batch", lambda keys: pytest.fail("an object was read whole"))
    before = client.counters["bytes_read_shm"] + client.counters["bytes_read_tcp"]
    buf = np.zeros(64, np.uint8)
    got = store.get_into_ranges([addr(buf), addr(buf)], [["a", "b", "a", "gone"], ["b"]],
                                [[[0, 1], [2], [3], [30]], [[20]]], [[[0, 1], [2], [99_990], [0]], [[4]]],
                                [[[1, 1], [1], [10], [1]], [[1]]])
    assert got == [[[1, 1], [1], [10], [NOT_FOUND]], [[1]]]
    assert lookups == [["a", "b", "gone"]]
    assert client.counters["bytes_read_shm"] + client.counters["bytes_read_tcp"] - before == 14
    assert list(buf[:3]) == [0, 1, 2] and list(buf[3:13]) == list(range(90, 100)) and buf[20] == 4


# ---------------------------------------------------------------------------------- put sessions

def test_put_session_layerwise_is_byte_exact_and_invisible_until_end(store: MooncakeDistributedStore,
                                                                     other: MooncakeDistributedStore,
                                                                     seed: int) -> None:
    rng = np.random.default_rng(seed)
    layers, page = int(rng.integers(2, 9)), int(rng.integers(16, 2048))
    keys = [f"blk{i}" for i in range(int(rng.integers(1, 6)))]
    tail = int(rng.integers(0, 64))  # bytes no range writes: zeros in kvpool (whatever memory held, in Mooncake)
    size = layers * page + tail
    src = {k: rng.integers(0, 256, layers * page, dtype=np.uint8) for k in keys}
    assert store.batch_put_session_start(keys, [size] * len(keys)) == [OK] * len(keys)
    for layer in range(layers):
        # each layer of each key from one to three source buffers
        ptrs, sizes, offs = [], [], []
        for k in keys:
            cuts = sorted({0, page, *(int(c) for c in rng.integers(0, page, int(rng.integers(0, 3))))})
            ptrs.append([addr(src[k]) + layer * page + a for a, _ in zip(cuts, cuts[1:])])
            sizes.append([b - a for a, b in zip(cuts, cuts[1:])])
            offs.append([layer * page + a for a, _ in zip(cuts, cuts[1:])])
        assert store.batch_put_from_multi_buffer_ranges(keys, ptrs, sizes, offs) == [page] * len(keys), f"seed={seed}"
        # not readable before the end: from this store (Mooncake: -703) and from another (Mooncake: -703;
        # kvpool: the object is not in the pool yet, so -704 / absent)
        out = np.zeros(8, np.uint8)
        assert store.get_into_ranges([addr(out)], [keys[:1]], [[[0]]], [[[0]]], [[[8]]]) == [[[NOT_READY]]]
        assert store.batch_get_session_start(keys[:1]) == [NOT_READY]
        assert store.batch_is_exist(keys) == [0] * len(keys)
        assert other.batch_is_exist(keys) == [0] * len(keys)
        assert store.get(keys[0]) == b"" and other.get(keys[0]) == b""
        assert other.get_size(keys[0]) == NOT_FOUND
        assert other.batch_get_session_start(keys[:1]) == [NOT_FOUND]
    assert store.batch_put_session_end(keys) == [OK] * len(keys)
    for k in keys:
        got = np.frombuffer(other.get(k), np.uint8)
        assert got.size == size, f"seed={seed}"
        assert np.array_equal(got[:layers * page], src[k]) and not got[layers * page:].any(), f"seed={seed}"
    # and read back layerwise through a get session
    assert other.batch_get_session_start(keys) == [OK] * len(keys)
    dst = {k: np.zeros(layers * page, np.uint8) for k in keys}
    for layer in range(layers):
        assert other.batch_get_into_multi_buffer_ranges(keys, [[addr(dst[k]) + layer * page] for k in keys],
                                                        [[page]] * len(keys), [[layer * page]] * len(keys)) == \
            [page] * len(keys)
    assert other.batch_get_session_end(keys) == OK
    for k in keys:
        assert np.array_equal(dst[k], src[k]), f"seed={seed}"


def test_put_session_random_overlapping_ranges_later_wins(store: MooncakeDistributedStore, seed: int) -> None:
    """Ranges are copied in list order and calls in call order, so where they overlap the later one wins
    (the wheel gave the same for the overlapping case it was asked)."""
    rng = np.random.default_rng(seed)
    for rnd in range(20):
        keys = [f"r{rnd}-{i}" for i in range(int(rng.integers(1, 4)))]
        sizes = [int(rng.integers(1, 3000)) for _ in keys]
        expect = [np.zeros(n, np.uint8) for n in sizes]
        assert store.batch_put_session_start(keys, sizes) == [OK] * len(keys)
        keep = []
        for _ in range(int(rng.integers(1, 5))):
            ptrs, szs, offs, want = [], [], [], []
            for i, n in enumerate(sizes):
                p, z, o = [], [], []
                for _ in range(int(rng.integers(1, 5))):
                    m = int(rng.integers(0, n + 1))
                    off = int(rng.integers(0, n - m + 1))
                    chunk = rng.integers(0, 256, max(m, 1), dtype=np.uint8)
                    keep.append(chunk)
                    p.append(addr(chunk))
                    z.append(m)
                    o.append(off)
                    expect[i][off:off + m] = chunk[:m]
                ptrs.append(p)
                szs.append(z)
                offs.append(o)
                want.append(sum(z))
            assert store.batch_put_from_multi_buffer_ranges(keys, ptrs, szs, offs) == want, f"seed={seed}"
        assert store.batch_put_session_end(keys) == [OK] * len(keys)
        for k, e in zip(keys, expect):
            assert store.get(k) == e.tobytes(), f"seed={seed} round={rnd}"


def test_put_session_codes_as_the_wheel(store: MooncakeDistributedStore, monkeypatch: pytest.MonkeyPatch) -> None:
    src = np.arange(1024, dtype=np.uint32).view(np.uint8).copy()
    a = addr(src)
    k = ["a", "b"]
    assert store.batch_put_from_multi_buffer_ranges(k, [[a], [a]], [[16], [16]], [[0], [0]]) == [INVALID, INVALID]
    assert store.batch_put_session_end(k) == [INVALID, INVALID]
    assert store.batch_put_session_revoke(k) == [INVALID, INVALID]
    assert store.batch_put_session_start(k, [256, 128]) == [OK, OK]
    assert store.batch_put_session_start(k, [256, 128]) == [INVALID, INVALID]  # a session already open here
    # a range outside the object fails the whole key: none of its ranges is copied
    assert store.batch_put_from_multi_buffer_ranges(k, [[a, a], [a]], [[8, 8], [129]], [[0, 250], [0]]) == \
        [INVALID, INVALID]
    assert store.batch_put_from_multi_buffer_ranges(k, [[a, a + 100], [a]], [[100, 156], [128]], [[0, 100], [0]]) \
        == [256, 128]
    assert store.batch_put_from_multi_buffer_ranges(k, [[], [a]], [[], [0]], [[], [128]]) == [INVALID_REPLICA, 0]
    assert store.batch_put_from_multi_buffer_ranges(k, [[a], [a]], [[8, 8], [4]], [[0], [0]]) == [INVALID, 4]
    assert store.batch_put_from_multi_buffer_ranges(k, [[a]], [[8]], [[0]]) == [INVALID, INVALID]
    assert store.batch_put_session_end(k + k) == [OK, OK, OK, OK]  # a repeated key: the one session, ended once
    assert store.batch_put_session_end(k) == [INVALID, INVALID]
    assert store.batch_put_session_revoke(k) == [INVALID, INVALID]
    assert store.batch_put_from_multi_buffer_ranges(k, [[a]] * 2, [[8]] * 2, [[0]] * 2) == [INVALID, INVALID]
    assert store.get("a") == src[:256].tobytes() and store.get("b") == src[:128].tobytes()
    # a session on an object that exists
    assert store.batch_put_session_start(k, [256, 128]) == [EXISTS, EXISTS]
    assert store.batch_put_session_start(["d", "d"], [8, 8]) == [OK, EXISTS]
    assert store.batch_put_session_revoke(["d"]) == [OK]
    # sizes and arguments
    assert store.batch_put_session_start(["z"], [0]) == [INVALID]
    assert store.batch_put_session_start(["m1", "m2"], [8]) == [INVALID, INVALID]
    assert store.batch_put_session_start([""], [8]) == [INVALID]
    assert store.batch_put_session_start(["x" * 600], [8]) == [INVALID]  # Mooncake takes it; kvpool keys are <= 512 B
    assert store.batch_put_session_start([], []) == []
    assert store.batch_put_session_end([]) == [] and store.batch_put_session_revoke([]) == []
    assert store.batch_put_from_multi_buffer_ranges([], [], [], []) == []
    for cfg in (ReplicateConfig(replica_num=0), ReplicateConfig(group_ids=["a", "b"]),
                ReplicateConfig(nof_replica_num=2), ReplicateConfig(replica_num=2, nof_replica_num=1)):
        assert store.batch_put_session_start(["c"], [8], cfg) == [INVALID], str(cfg)
    # accepted, as by the wheel's session start (its puts refuse prefer_alloc_in_same_node); the flexible NoF
    # copy is accepted and, as everywhere in kvpool, NoF is ignored (the wheel's master, without NoF storage, -600)
    for cfg in (ReplicateConfig(prefer_alloc_in_same_node=True), ReplicateConfig(replica_num=1, nof_replica_num=1)):
        assert store.batch_put_session_start(["c"], [8], cfg) == [OK]
        assert store.batch_put_session_revoke(["c"]) == [OK]
    # the start's config is the end's put's: replicas and pins
    assert store.batch_put_session_start(["c2"], [8], ReplicateConfig(replica_num=2, with_hard_pin=True)) == [OK]
    assert store.batch_put_session_start(["c3", "c4"], [8, 8]) == [OK, OK]
    for key in ("c2", "c3", "c4"):
        assert store.batch_put_from_multi_buffer_ranges([key], [[a]], [[8]], [[0]]) == [8]
    seen: list[tuple[list[str], dict[str, Any]]] = []
    put, put_batch = store._client.put, store._client.put_batch
    monkeypatch.setattr(store._client, "put", lambda k, v, **kw: seen.append(([k], kw)) or put(k, v, **kw))
    monkeypatch.setattr(store._client, "put_batch", lambda ks, vs, **kw: seen.append((list(ks), kw)) or
                        put_batch(ks, vs, **kw))
    assert store.batch_put_session_end(["c2", "c3", "c4"]) == [OK, OK, OK]
    assert sorted(seen, key=str) == sorted([(["c2"], {"replicas": 2, "pin_seconds": kvpool.protocol.PIN_FOREVER}),
                                            (["c3", "c4"], {"replicas": 1})], key=str)
    assert all(store.get(key) == src[:8].tobytes() for key in ("c2", "c3", "c4"))
    for bad in ((["x"], [-1]), ("x", [1]), (["x"], 5)):
        with pytest.raises(TypeError):
            store.batch_put_session_start(*bad)
    with pytest.raises(TypeError):
        store.batch_put_from_multi_buffer_ranges(k, [a, a], [[1], [1]], [[0], [0]])
    with pytest.raises(TypeError):
        store.batch_put_from_multi_buffer_ranges(k, [[a], [a]], [b"\x01", [1]], [[0], [0]])
    with pytest.raises(TypeError):
        store.batch_put_session_end("ab")


def test_put_session_revoke_stores_nothing_and_frees_the_key(store: MooncakeDistributedStore) -> None:
    src = np.full(64, 7, np.uint8)
    assert store.batch_put_session_start(["r"], [64]) == [OK]
    assert store.batch_put_from_multi_buffer_ranges(["r"], [[addr(src)]], [[64]], [[0]]) == [64]
    assert store.batch_put_session_revoke(["r"]) == [OK]
    assert store.batch_put_session_revoke(["r"]) == [INVALID]
    assert store.batch_put_session_end(["r"]) == [INVALID]
    assert store.batch_put_from_multi_buffer_ranges(["r"], [[addr(src)]], [[64]], [[0]]) == [INVALID]
    assert store.is_exist("r") == 0
    assert store._range_sessions is not None and store._range_sessions.held == 0
    # the key can be put again, in a session or not
    assert store.batch_put_session_start(["r"], [8]) == [OK]
    assert store.batch_put_from_multi_buffer_ranges(["r"], [[addr(src)]], [[8]], [[0]]) == [8]
    assert store.batch_put_session_end(["r"]) == [OK]
    assert store.get("r") == bytes([7] * 8)


def test_put_session_checks_host_memory(store: MooncakeDistributedStore) -> None:
    size = 1 << 16
    none = conftest.mmap_raw(size, 0)
    ro = conftest.mmap_raw(size, mmap.PROT_READ)
    try:
        assert store.batch_put_session_start(["h"], [32]) == [OK]
        ok = np.full(8, 3, np.uint8)
        # one unreadable buffer fails the key and copies none of its ranges; read-only memory is enough for a put
        assert store.batch_put_from_multi_buffer_ranges(["h"], [[addr(ok), none]], [[8, 8]], [[0, 8]]) == [INVALID]
        assert store.batch_put_from_multi_buffer_ranges(["h"], [[ro, 8]], [[8, 8]], [[16, 24]]) == [INVALID]
        assert store.batch_put_from_multi_buffer_ranges(["h"], [[ro]], [[8]], [[16]]) == [8]
        assert store.batch_put_session_end(["h"]) == [OK]
        assert store.get("h") == bytes(32)
    finally:
        conftest.munmap_raw(none, size)
        conftest.munmap_raw(ro, size)


def test_put_session_against_other_writers(store: MooncakeDistributedStore, other: MooncakeDistributedStore) -> None:
    """kvpool cannot reserve a key for a session, so a second session elsewhere opens (Mooncake: -705 at its
    start), and whichever ends second gets -705 with its bytes discarded; a plain put meanwhile wins too."""
    one, two = np.full(16, 1, np.uint8), np.full(16, 2, np.uint8)
    assert store.batch_put_session_start(["s"], [16]) == [OK]
    assert other.batch_put_session_start(["s"], [16]) == [OK]
    assert store.batch_put_from_multi_buffer_ranges(["s"], [[addr(one)]], [[16]], [[0]]) == [16]
    assert other.batch_put_from_multi_buffer_ranges(["s"], [[addr(two)]], [[16]], [[0]]) == [16]
    assert store.batch_put_session_end(["s"]) == [OK]
    assert other.batch_put_session_end(["s"]) == [EXISTS]
    assert other.batch_put_session_revoke(["s"]) == [OK]  # a failed end keeps the session (sealed) until revoked
    assert store.get("s") == one.tobytes()
    assert store.batch_put_session_start(["t"], [16]) == [OK]
    assert other.put("t", b"someone else") == OK
    assert store.batch_put_session_end(["t"]) == [EXISTS]
    assert store.batch_put_from_multi_buffer_ranges(["t"], [[addr(one)]], [[16]], [[0]]) == [INVALID]  # sealed
    assert store.batch_put_session_end(["t"]) == [EXISTS]  # may be retried
    assert store.batch_put_session_revoke(["t"]) == [OK]
    assert store.get("t") == b"someone else"


def test_session_bytes_limit(store: MooncakeDistributedStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ranges, "SESSION_BYTES_LIMIT", 1000)
    assert store.put("g", bytes(300)) == OK
    assert store.batch_put_session_start(["a", "b", "c"], [400, 400, 400]) == [OK, OK, NO_SPACE]
    assert store.batch_get_session_start(["g"]) == [NO_SPACE]
    assert store.batch_put_session_revoke(["b"]) == [OK]
    assert store.batch_get_session_start(["g"]) == [OK]
    assert store.batch_put_session_start(["c"], [400]) == [NO_SPACE]
    assert store.batch_get_session_end(["g"]) == OK
    assert store.batch_put_session_start(["c"], [400]) == [OK]
    assert store._range_sessions is not None and store._range_sessions.held == 800


# ---------------------------------------------------------------------------------- get sessions

def test_get_session_codes_as_the_wheel(store: MooncakeDistributedStore, other: MooncakeDistributedStore) -> None:
    a_data, b_data = bytes(range(256)), bytes(range(128))
    assert store.put("a", a_data) == OK and store.put("b", b_data) == OK
    dst = np.zeros(4096, np.uint8)
    d = addr(dst)
    k = ["a", "b"]
    g = store.batch_get_into_multi_buffer_ranges
    assert store.batch_get_session_start(["none", "a"]) == [NOT_FOUND, OK]
    assert store.batch_get_session_start(k) == [OK, OK]  # again: replaced
    assert store.batch_get_session_start(["", "x" * 600]) == [NOT_FOUND, NOT_FOUND]
    assert store.batch_get_session_start([]) == []
    assert g(k, [[d, d + 10], [d + 100]], [[10, 20], [128]], [[0, 200], [0]]) == [30, 128]
    assert dst[:10].tobytes() == a_data[:10] and dst[10:30].tobytes() == a_data[200:220]
    assert dst[100:228].tobytes() == b_data
    assert g(k, [[d, d], [d]], [[10, 60], [129]], [[0, 200], [0]]) == [INVALID, INVALID]
    assert g(k, [[d], [d]], [[0], [0]], [[256], [129]]) == [0, INVALID]
    assert g(k, [[], []], [[], []], [[], []]) == [0, 0]
    assert g(k, [[d], [d]], [[1, 2], [1]], [[0], [0]]) == [INVALID, 1]
    assert g(k, [[d]], [[1]], [[0]]) == [INVALID, INVALID]
    assert g(["none"], [[d]], [[1]], [[0]]) == [INVALID]
    assert other.batch_get_into_multi_buffer_ranges(k, [[d], [d]], [[1], [1]], [[0], [0]]) == [INVALID, INVALID]
    assert g(["a", "a"], [[d], [d + 4]], [[4], [4]], [[0], [8]]) == [4, 4]
    assert g([], [], [], []) == []
    assert store.batch_get_session_end(k) == OK
    assert store.batch_get_session_end(["never"]) == OK
    assert store.batch_get_session_end([]) == OK
    assert g(k, [[d], [d]], [[4], [4]], [[0], [0]]) == [INVALID, INVALID]
    with pytest.raises(TypeError):
        store.batch_get_session_end("ab")
    with pytest.raises(TypeError):
        g(k, [d, d], [[1], [1]], [[0], [0]])


def test_get_session_serves_what_it_read_at_start(store: MooncakeDistributedStore,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """One read at start, none per ranged get; the bytes stay what they were at start (Mooncake's lease keeps
    the object from being removed meanwhile, -706; kvpool removes it and the session still serves it)."""
    assert store.put("k", bytes([1] * 64)) == OK
    assert store.batch_get_session_start(["k"]) == [OK]
    calls: list[str] = []
    for name in ("get_batch", "get", "get_into", "get_into_batch", "batch_size", "size", "batch_exists"):
        real = getattr(store._client, name)
        monkeypatch.setattr(store._client, name, lambda *a, _n=name, _r=real, **kw: calls.append(_n) or _r(*a, **kw))
    assert store.remove("k") == OK
    assert store.put("k", bytes([2] * 64)) == OK
    calls.clear()
    out = np.zeros(64, np.uint8)
    for i in range(8):
        assert store.batch_get_into_multi_buffer_ranges(["k"], [[addr(out) + 8 * i]], [[8]], [[8 * i]]) == [8]
    assert calls == [] and out.tobytes() == bytes([1] * 64)
    assert store.batch_get_session_start(["k"]) == [OK]  # a new start reads again
    assert store.batch_get_into_multi_buffer_ranges(["k"], [[addr(out)]], [[64]], [[0]]) == [64]
    assert out.tobytes() == bytes([2] * 64)
    # a start that fails drops the key's earlier session
    assert store.remove("k") == OK
    assert store.batch_get_session_start(["k"]) == [NOT_FOUND]
    assert store.batch_get_into_multi_buffer_ranges(["k"], [[addr(out)]], [[1]], [[0]]) == [INVALID]


def test_get_session_checks_host_memory(store: MooncakeDistributedStore) -> None:
    assert store.put("k", bytes(range(64))) == OK
    size = 1 << 16
    ro = conftest.mmap_raw(size, mmap.PROT_READ)
    ok = np.zeros(8, np.uint8)
    try:
        assert store.batch_get_session_start(["k"]) == [OK]
        assert store.batch_get_into_multi_buffer_ranges(["k", "k"], [[addr(ok), ro], [addr(ok)]], [[4, 4], [8]],
                                                        [[0, 4], [8]]) == [INVALID, 8]
        assert ok.tobytes() == bytes(range(8, 16))
        assert store.batch_get_into_multi_buffer_ranges(["k"], [[0]], [[8]], [[0]]) == [INVALID]
    finally:
        conftest.munmap_raw(ro, size)


# ------------------------------------------------------------------------------ threads and close

def test_two_sessions_on_different_keys_from_two_threads(store: MooncakeDistributedStore, seed: int) -> None:
    rng = np.random.default_rng(seed)
    layers, page = 16, 4096
    data = {t: rng.integers(0, 256, (4, layers * page), dtype=np.uint8) for t in range(2)}
    errors: list[str] = []
    barrier = threading.Barrier(2)

    def work(t: int) -> None:
        try:
            keys = [f"t{t}-{i}" for i in range(4)]
            src = data[t]
            for rnd in range(5):
                ks = [f"{k}-{rnd}" for k in keys]
                barrier.wait(30)
                if store.batch_put_session_start(ks, [layers * page] * 4) != [OK] * 4:
                    errors.append(f"thread {t}: start")
                for layer in range(layers):
                    got = store.batch_put_from_multi_buffer_ranges(
                        ks, [[addr(src[i]) + layer * page] for i in range(4)], [[page]] * 4, [[layer * page]] * 4)
                    if got != [page] * 4:
                        errors.append(f"thread {t}: put layer {layer}: {got}")
                if store.batch_put_session_end(ks) != [OK] * 4:
                    errors.append(f"thread {t}: end")
                if store.batch_get_session_start(ks) != [OK] * 4:
                    errors.append(f"thread {t}: get start")
                dst = np.zeros_like(src)
                for layer in reversed(range(layers)):
                    got = store.batch_get_into_multi_buffer_ranges(
                        ks, [[addr(dst[i]) + layer * page] for i in range(4)], [[page]] * 4, [[layer * page]] * 4)
                    if got != [page] * 4:
                        errors.append(f"thread {t}: get layer {layer}: {got}")
                if store.batch_get_session_end(ks) != OK:
                    errors.append(f"thread {t}: get end")
                if not np.array_equal(dst, src):
                    errors.append(f"thread {t} round {rnd}: bytes differ")
        except Exception as e:  # noqa: BLE001
            errors.append(f"thread {t}: {e!r}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, f"seed={seed}: {errors[:5]}"
    assert store._range_sessions is not None and store._range_sessions.held == 0
    assert not store._range_sessions.puts and not store._range_sessions.gets


def test_end_while_another_thread_writes_stores_exactly_the_completed_ranges(store: MooncakeDistributedStore) -> None:
    """End seals the session and waits for ranged puts in flight: a ranged put that returned its byte count
    is in the stored object, one that returned -600 is not."""
    layers, page = 200, 16 << 10
    srcs = [np.full(page, 1 + i % 255, np.uint8) for i in range(layers)]
    for attempt in range(3):
        key = f"race{attempt}"
        assert store.batch_put_session_start([key], [layers * page]) == [OK]
        results: dict[int, int] = {}
        started = threading.Event()

        def writer() -> None:
            for layer in range(layers):
                started.set()
                results[layer] = store.batch_put_from_multi_buffer_ranges(
                    [key], [[addr(srcs[layer])]], [[page]], [[layer * page]])[0]

        th = threading.Thread(target=writer)
        th.start()
        started.wait(10)
        assert store.batch_put_session_end([key]) == [OK]
        th.join(30)
        stored = np.frombuffer(store.get(key), np.uint8).reshape(layers, page)
        for layer, code in results.items():
            assert code in (page, INVALID)
            assert np.array_equal(stored[layer], srcs[layer]) if code == page else not stored[layer].any(), layer


def test_end_and_revoke_wait_for_a_ranged_put_in_flight(store: MooncakeDistributedStore,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy made slow on purpose (half, a pause, the rest): end must store the whole range, not half of it,
    and revoke must not return while the copy still writes into the staging it frees."""
    inside, real = threading.Event(), ranges._memmove

    def slow(dst: int, src: int, n: int) -> None:
        half = n // 2
        real(dst, src, half)
        inside.set()
        threading.Event().wait(0.3)
        real(dst + half, src + half, n - half)

    src = np.full(1 << 16, 9, np.uint8)
    for finish in ("end", "revoke"):
        key = f"slow-{finish}"
        assert store.batch_put_session_start([key], [src.nbytes]) == [OK]
        monkeypatch.setattr(ranges, "_memmove", slow)
        inside.clear()
        got: list[int] = []
        th = threading.Thread(target=lambda: got.extend(store.batch_put_from_multi_buffer_ranges(
            [key], [[addr(src)]], [[src.nbytes]], [[0]])))
        th.start()
        assert inside.wait(10)
        if finish == "end":
            assert store.batch_put_session_end([key]) == [OK]
        else:
            assert store.batch_put_session_revoke([key]) == [OK]
        assert not th.is_alive(), f"{finish} returned before the ranged put in flight finished"
        th.join(10)
        monkeypatch.setattr(ranges, "_memmove", real)
        assert got == [src.nbytes]
        assert store.get(key) == (src.tobytes() if finish == "end" else b"")


def test_drop_sessions_discards_everything(store: MooncakeDistributedStore) -> None:
    assert store.put("g", bytes(64)) == OK
    src = np.ones(16, np.uint8)
    assert store.batch_put_session_start(["p"], [16]) == [OK]
    assert store.batch_get_session_start(["g"]) == [OK]
    store._drop_sessions()
    assert store.batch_put_from_multi_buffer_ranges(["p"], [[addr(src)]], [[16]], [[0]]) == [INVALID]
    assert store.batch_put_session_end(["p"]) == [INVALID]
    assert store.batch_get_into_multi_buffer_ranges(["g"], [[addr(src)]], [[16]], [[0]]) == [INVALID]
    assert store.is_exist("p") == 0
    assert store._range_sessions is not None and store._range_sessions.held == 0


def test_close_drops_the_sessions(pool: conftest.Pool, client: kvpool.Client) -> None:
    """``close()`` must not leave staged objects behind (it calls ``_drop_sessions``)."""
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", pool.master) == 0
    assert s.put("g", bytes(64)) == OK
    assert s.batch_put_session_start(["p"], [16]) == [OK]
    assert s.batch_get_session_start(["g"]) == [OK]
    assert s.close() == 0
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", pool.master) == 0
    try:
        assert s.batch_put_session_end(["p"]) == [INVALID]
        assert s.batch_get_into_multi_buffer_ranges(["g"], [[addr(np.zeros(8, np.uint8))]], [[8]], [[0]]) == [INVALID]
        assert s._range_sessions is None or s._range_sessions.held == 0
    finally:
        s.close()
