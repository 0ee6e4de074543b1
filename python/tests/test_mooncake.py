"""kvpool.mooncake: Mooncake Store's Python API over a real kvpool pool.

Conventions checked against Mooncake 3b5a5941 (store_py.cpp, real_client.cpp, client_service.cpp,
master_service.cpp, types.h) and replays of how SGLang HiCache, LMCache and vLLM's
MooncakeStoreConnector call it.
"""

from __future__ import annotations

import ctypes
import json
import logging
import mmap
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import kvpool
from kvpool import mooncake as mc
from kvpool.mooncake import MooncakeDistributedStore, ReplicateConfig

import conftest

INVALID, NOT_FOUND, NO_SPACE, TRANSFER, RPC, RPC_TIMEOUT = -600, -704, -200, -800, -900, -901


def addr(a: np.ndarray) -> int:
    return int(a.ctypes.data)


def rand(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mc.codes, "_warned", set())


# ----------------------------------------------------------------------------------- lifecycle

def test_before_setup_everything_is_a_code_not_a_crash() -> None:
    s = MooncakeDistributedStore()
    assert s.health_check() == 1
    assert s.get_hostname() == ""
    assert s.is_exist("k") == INVALID
    assert s.batch_is_exist(["a", "b"]) == [INVALID, INVALID]
    assert s.get("k") == b""
    assert s.get_batch(["a", "b"]) == [b""]  # Mooncake answers a single empty value when not initialised
    assert s.get_buffer("k") is None
    assert s.put("k", b"v") == INVALID
    assert s.put_batch(["k"], [b"v"]) == INVALID
    assert s.put_from("k", 1234, 10) == INVALID
    assert s.get_into("k", 1234, 10) == INVALID
    assert s.batch_get_into(["a"], [1234], [10]) == [INVALID]
    assert s.batch_put_from_multi_buffers(["a"], [[1234]], [[10]]) == [INVALID]
    assert s.batch_get_into_multi_buffers(["a"], [[1234]], [[10]]) == [INVALID]
    assert s.register_buffer(1234, 10) == INVALID
    assert s.get_size("k") == INVALID
    assert s.remove("k") == INVALID
    assert s.batch_remove(["k"]) == [INVALID]
    assert s.remove_all() == INVALID
    assert s.remove_by_regex("^k") == INVALID
    assert s.close() == 0


def test_setup_positional_health_hostname_close(pool: conftest.Pool) -> None:
    s = MooncakeDistributedStore()
    assert s.setup("node-7", "P2PHANDSHAKE", 4 << 30, 1 << 30, "tcp", "", pool.master) == 0
    assert s.health_check() == 0
    assert s.get_hostname() == pool.node  # the segment of the kvpool node on this host, as host:port
    assert s.close() == 0
    assert s.health_check() == 1
    assert s.is_exist("x") == INVALID
    assert s.close() == 0  # idempotent


def test_setup_sglang_call_shape(pool: conftest.Pool) -> None:
    """SGLang passes the transfer engine (None) positionally and optional keywords."""
    s = MooncakeDistributedStore()
    try:
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 1 << 30, 16 << 20, "tcp", "", pool.master, None,
                       enable_client_http_server=True, client_http_port=9301, enable_ssd_offload=False,
                       ssd_offload_path="") == 0
        with pytest.raises(TypeError, match="no_such_option"):
            s.setup("h", "P2PHANDSHAKE", 0, 0, "tcp", "", pool.master, no_such_option=1)
        with pytest.raises(TypeError):
            s.setup("h", "P2PHANDSHAKE")  # missing required arguments, as pybind11
    finally:
        s.close()


def test_setup_dict_forms(pool: conftest.Pool) -> None:
    s = MooncakeDistributedStore()
    try:
        base = {"local_hostname": "h", "metadata_server": "P2PHANDSHAKE", "master_server_addr": pool.master}
        assert s.setup(base) == 0
        assert s.setup(config=dict(base, global_segment_size="4gb", local_buffer_size="512 MB")) == 0
        alias = dict(base)
        alias["master_server_address"] = alias.pop("master_server_addr")
        assert s.setup(alias) == 0
        assert s.setup(dict(base, global_segment_size="4 zb")) == INVALID
        assert s.setup(dict(base, global_segment_size=100)) == INVALID  # nonzero below 1 KiB
        assert s.setup(dict(base, local_buffer_size="2tb")) == INVALID  # above 1 TiB
        assert s.setup({k: v for k, v in base.items() if k != "local_hostname"}) == INVALID
        assert s.setup({k: v for k, v in base.items() if k != "metadata_server"}) == INVALID
        assert s.setup(dict(base, tenant_id="team-a")) == INVALID  # kvpool has no tenants: refused, not mixed
        assert s.setup(dict(base, master_server_addr="etcd://10.0.0.1:2379")) == INVALID
        assert s.health_check() == 0  # the failed setups left the working connection alone
    finally:
        s.close()


def test_setup_unreachable_master_returns_mooncake_codes() -> None:
    port = conftest.free_port()
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1:12345", "P2PHANDSHAKE", 0, 0, "tcp", "", f"127.0.0.1:{port}") == INVALID
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", f"127.0.0.1:{port}") == -1
    assert s.health_check() == 1


def test_setup_warns_once_about_what_kvpool_ignores(pool: conftest.Pool, caplog: pytest.LogCaptureFixture,
                                                    fresh_warnings: None) -> None:
    s = MooncakeDistributedStore()
    try:
        with caplog.at_level(logging.WARNING, logger="kvpool.mooncake"):
            assert s.setup("h", "http://meta:8080/metadata", 4 << 30, 1 << 30, "rdma", "mlx5_0,mlx5_1",
                           pool.master) == 0
            assert s.setup("h", "http://meta:8080/metadata", 4 << 30, 1 << 30, "rdma", "mlx5_0", pool.master) == 0
        text = caplog.text
        assert "protocol 'rdma' ignored" in text and "TCP" in text
        assert "mlx5_0,mlx5_1" in text
        assert "global_segment_size" in text and "metadata_server" in text
        assert text.count("protocol 'rdma' ignored") == 1  # once per process
    finally:
        s.close()


def test_master_address_forms() -> None:
    assert mc._master_address("10.0.0.5") == "10.0.0.5:50051"
    assert mc._master_address(" 10.0.0.5:7000 ") == "10.0.0.5:7000"
    assert mc._master_address("[::1]") == "[::1]:50051"
    assert mc._master_address("[::1]:9") == "[::1]:9"
    for bad in ("", "etcd://a:2379", "a:1,b:2"):
        with pytest.raises(ValueError):
            mc._master_address(bad)


# ---------------------------------------------------------------------------------- byte API

def test_put_get_exist_size_upsert(store: MooncakeDistributedStore) -> None:
    v = bytes(rand(4096))
    assert store.put("k1", v) == 0
    assert store.is_exist("k1") == 1
    assert store.get("k1") == v
    assert store.get_size("k1") == 4096
    assert store.put("k1", b"other") == 0  # an existing key is success; the value is unchanged
    assert store.get("k1") == v
    assert store.upsert("k1", b"replaced") == 0
    assert store.get("k1") == b"replaced"
    assert store.upsert("new", bytearray(b"fresh")) == 0 and store.get("new") == b"fresh"
    assert store.get("missing") == b""
    assert store.is_exist("missing") == 0
    assert store.get_size("missing") == NOT_FOUND
    cfg = ReplicateConfig()
    cfg.replica_num = 1
    assert store.put("k2", memoryview(b"abc"), cfg) == 0 and store.get("k2") == b"abc"


def test_empty_values(store: MooncakeDistributedStore) -> None:
    assert store.put("e", b"") == INVALID  # Mooncake's master rejects a zero-length slice
    assert store.upsert("e", b"") == INVALID
    assert store.put_batch(["e"], [b""]) == INVALID
    assert store.put_parts("e", b"", b"") == 0  # put_parts of nothing: success, nothing stored
    assert store.put_from("e", 0, 0) == 0  # put_from of size 0: likewise
    assert store.is_exist("e") == 0


def test_bad_keys_are_codes(store: MooncakeDistributedStore) -> None:
    long_key = "k" * 513
    for key in ("", long_key):
        assert store.put(key, b"v") == INVALID
        assert store.get(key) == b""
        assert store.is_exist(key) == 0
        assert store.get_size(key) == NOT_FOUND
        assert store.remove(key) == NOT_FOUND
        buf = np.zeros(8, np.uint8)
        assert store.get_into(key, addr(buf), 8) == NOT_FOUND
    assert store.put("k" * 512, b"v") == 0 and store.get("k" * 512) == b"v"
    assert store.batch_is_exist(["", "k" * 512, long_key]) == [0, 1, 0]
    assert store.batch_put_from(["", "ok"], [addr(np.ones(4, np.uint8))] * 2, [4, 4])[0] == INVALID
    with pytest.raises(TypeError):
        store.put(123, b"v")  # type: ignore[arg-type]


def test_parts_batches_and_buffers(store: MooncakeDistributedStore) -> None:
    meta, kv = b"M" * 28, bytes(rand(1000))
    assert store.put_parts("p", meta, kv) == 0
    assert store.get("p") == meta + kv
    assert store.upsert_parts("p", b"a", bytearray(b"b"), memoryview(b"c")) == 0 and store.get("p") == b"abc"

    keys = [f"b{i}" for i in range(5)]
    vals = [bytes(rand(100 + i, i)) for i in range(5)]
    assert store.put_batch(keys, vals) == 0
    assert store.get_batch(keys + ["nope"]) == vals + [b""]
    assert store.get_batch([]) == [b""]  # Mooncake's quirk for no keys
    assert store.put_batch(keys, vals[:2]) == INVALID
    assert store.upsert_batch(keys[:2], [b"x", b"y"]) == 0 and store.get_batch(keys[:2]) == [b"x", b"y"]

    h = store.get_buffer("b3")
    assert isinstance(h, mc.BufferHandle) and bytes(h) == vals[3] and len(h) == h.size() == 103
    assert ctypes.string_at(h.ptr(), h.size()) == vals[3]
    assert memoryview(h)[:4] == vals[3][:4]
    assert store.get_buffer("nope") is None
    got = store.batch_get_buffer(["b4", "nope", "b0"])
    assert got[1] is None and bytes(got[0]) == vals[4] and bytes(got[2]) == b"x"


# ------------------------------------------------------------------------------ zero-copy API

def test_put_from_get_into(store: MooncakeDistributedStore) -> None:
    src = rand(10_000, 1)
    assert store.put_from("z", addr(src), src.nbytes) == 0
    dst = np.zeros(12_000, np.uint8)
    assert store.get_into("z", addr(dst), dst.nbytes) == 10_000
    assert np.array_equal(dst[:10_000], src)
    small = np.zeros(9_999, np.uint8)
    assert store.get_into("z", addr(small), small.nbytes) == INVALID  # Mooncake: buffer too small is INVALID_PARAMS
    assert store.get_into("nope", addr(dst), dst.nbytes) == NOT_FOUND
    assert store.put_from("z", addr(rand(10, 2)), 10) == 0  # exists: success, unchanged
    assert store.get_size("z") == 10_000
    assert store.upsert_from("z", addr(src), 5) == 0 and store.get("z") == bytes(src[:5])
    meta = np.frombuffer(b"HEAD", np.uint8).copy()
    assert store.put_from_with_metadata("wm", addr(src), addr(meta), 100, 4) == 0
    assert store.get("wm") == b"HEAD" + bytes(src[:100])
    with pytest.raises(TypeError):
        store.get_into("z", addr(dst), -1)


def test_batch_put_from_batch_get_into(store: MooncakeDistributedStore) -> None:
    n, size = 6, 4096
    src = rand(n * size, 3)
    keys = [f"bp{i}" for i in range(n)]
    ptrs = [addr(src) + i * size for i in range(n)]
    assert store.batch_put_from(keys, ptrs, [size] * n) == [0] * n
    assert store.batch_put_from(keys[:2], ptrs[:2], [size] * 2) == [0, 0]  # existing keys: success
    dst = np.zeros(n * size, np.uint8)
    dptrs = [addr(dst) + i * size for i in range(n)]
    assert store.batch_get_into(keys, dptrs, [size] * n) == [size] * n
    assert np.array_equal(dst, src)
    # per-key outcomes: a miss, a too-small buffer, a good read
    dst2 = np.zeros(3 * size, np.uint8)
    res = store.batch_get_into(["nope", keys[1], keys[2]], [addr(dst2), addr(dst2) + size, addr(dst2) + 2 * size],
                               [size, size - 1, size])
    assert res == [NOT_FOUND, INVALID, size]
    assert np.array_equal(dst2[2 * size:], src[2 * size:3 * size])
    # mismatched lengths: every key fails with INVALID_PARAMS
    assert store.batch_get_into(keys, dptrs[:2], [size] * n) == [INVALID] * n
    assert store.batch_put_from(keys, ptrs, [size]) == [INVALID] * n
    assert store.batch_put_from(["zero"], [addr(src)], [0]) == [INVALID]  # zero-length slice
    # upserts replace
    assert store.batch_upsert_from(keys[:2], [ptrs[5], ptrs[4]], [size, size]) == [0, 0]
    assert store.get(keys[0]) == bytes(src[5 * size:])


def test_registration_semantics(store: MooncakeDistributedStore) -> None:
    region = np.zeros(1 << 20, np.uint8)
    base = addr(region)
    assert store.register_buffer(base, region.nbytes) == 0
    assert store.register_buffer(base, region.nbytes) == INVALID  # overlap (the transfer engine refuses it)
    assert store.register_buffer(base + 4096, 4096) == INVALID
    assert store.register_buffer(0, 10) == INVALID
    assert store.register_buffer(base, 0) == INVALID
    assert store.unregister_buffer(base + 1) == INVALID
    assert store.unregister_buffer(base) == 0
    assert store.unregister_buffer(base) == INVALID
    # Mooncake over TCP needs no registration for put_from/get_into; neither does kvpool
    other = rand(256, 4)
    assert store.put_from("unreg", addr(other), 256) == 0
    out = np.zeros(256, np.uint8)
    assert store.get_into("unreg", addr(out), 256) == 256 and np.array_equal(out, other)


def test_unmapped_or_device_like_memory_is_refused_not_a_crash(store: MooncakeDistributedStore) -> None:
    """A GPU pointer is reserved but not readable from the CPU (PROT_NONE); it must not crash the process."""
    size = 1 << 16
    none = conftest.mmap_raw(size, 0)  # PROT_NONE
    ro = conftest.mmap_raw(size, mmap.PROT_READ)
    try:
        assert store.register_buffer(none, size) == INVALID
        assert store.put_from("dev", none, 100) == INVALID
        assert store.get_into("dev", none, 100) == INVALID
        assert store.batch_put_from(["dev", "ok"], [none, addr(rand(8))], [100, 8]) == [INVALID, 0]
        assert store.put("x", b"12345678") == 0
        assert store.batch_get_into(["x", "x"], [none, ro], [8, 8]) == [INVALID, INVALID]  # read-only: not writable
        assert store.put_from("ro", ro, 64) == 0  # readable is enough for a put
        assert store.get("ro") == bytes(64)
        assert store.batch_put_from_multi_buffers(["dev2"], [[ro, none]], [[8, 8]]) == [INVALID]
        assert store.batch_get_into_multi_buffers(["x"], [[none]], [[8]]) == [INVALID]
        assert store.put_from("garbage", 8, 16) == INVALID  # the zero page is never mapped
    finally:
        conftest.munmap_raw(none, size)
        conftest.munmap_raw(ro, size)


@pytest.fixture(params=["procmap_query", "populate_probe", "maps"])
def judged_by(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each way the host-memory check can judge a range, forced in turn: PROCMAP_QUERY (Linux 6.11), the
    populate probe of older kernels (5.14), and a fresh read of /proc/self/maps (the rest, and large ranges)."""
    hm = mc.args._host_memory
    here = mc.args._SURELY_MAPPED_ADDRESS
    if request.param == "procmap_query":
        if hm._query(here, here + 1, True, None) is None:
            pytest.skip("this kernel does not answer PROCMAP_QUERY (Linux 6.11 and later do)")
        monkeypatch.setattr(hm, "_probe", lambda *a: pytest.fail("probed although PROCMAP_QUERY answers"))
        monkeypatch.setattr(hm, "_read_maps", lambda *a: pytest.fail("read the maps although PROCMAP_QUERY answers"))
        return request.param
    monkeypatch.setattr(hm, "_query", lambda *a: None)
    if request.param == "populate_probe":
        if not hm._probe(here, here + 1, True):
            pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14 and later have)")
    else:
        monkeypatch.setattr(hm, "_probe", lambda *a: False)
    return request.param


def test_memory_remapped_after_a_check_is_judged_as_mapped_now(store: MooncakeDistributedStore,
                                                                judged_by: str) -> None:
    """An address checked while it was readable and writable memory, then unmapped and mapped again with other
    permissions (a freed buffer's address reused: what made the test above fail once in a full run), is judged
    by the mapping there at the time of the call, never by what an earlier check saw. Each verdict is asked of
    ``register_buffer`` first, which touches no memory, so a wrong one fails here rather than crashing."""
    size, page = 1 << 16, mmap.PAGESIZE
    rw = mmap.PROT_READ | mmap.PROT_WRITE
    p = conftest.mmap_raw(size, rw)
    try:
        ctypes.memset(p, 7, size)
        # the checks see [p, +size) readable and writable
        assert store.register_buffer(p, size) == 0 and store.unregister_buffer(p) == 0
        assert store.put_from("rm", p, 100) == 0
        assert store.get_into("rm", p + 100, 100) == 100
        # unmapped, then no access at the same address
        conftest.munmap_raw(p, size)
        assert conftest.mmap_raw(size, 0, at=p) == p
        assert store.register_buffer(p, size) == INVALID
        assert store.put_from("rm2", p, 100) == INVALID
        assert store.get_into("rm", p, 100) == INVALID
        assert store.batch_put_from_multi_buffers(["rm2"], [[p + size - 8]], [[8]]) == [INVALID]
        # readable and writable again, then read-only at the same address: puts may read it, gets may not write it
        conftest.mmap_raw(size, rw, at=p)
        assert store.register_buffer(p, size) == 0 and store.unregister_buffer(p) == 0
        assert store.get_into("rm", p, 100) == 100
        conftest.munmap_raw(p, size)
        assert conftest.mmap_raw(size, mmap.PROT_READ, at=p) == p
        assert store.register_buffer(p, size) == INVALID
        assert store.get_into("rm", p, 100) == INVALID
        assert store.batch_get_into(["rm"], [p + page], [100]) == [INVALID]
        assert store.put_from("rm3", p, 100) == 0 and store.get("rm3") == bytes(100)
        # one page in the middle of a writable range replaced (MAP_FIXED over it, no munmap) by no access
        conftest.mmap_raw(size, rw, at=p)
        assert store.register_buffer(p, size) == 0 and store.unregister_buffer(p) == 0
        assert store.put_from("rm4", p, size) == 0
        conftest.mmap_raw(page, 0, at=p + 4 * page)
        assert store.register_buffer(p, size) == INVALID
        assert store.put_from("rm4", p, size) == INVALID
        assert store.get_into("rm4", p, size) == INVALID
        assert store.put_from("rm5", p, 4 * page) == 0  # the pages before it are still fine
        # in one batch, what the check learnt of one key's buffer approves no other key's
        three = [p, p + 4 * page, p + 5 * page]
        assert store.batch_put_from(["rm6", "rm7", "rm8"], three, [page] * 3) == [0, INVALID, 0]
        assert store.batch_get_into(["rm6", "rm6", "rm6"], [p + 8, p + 4 * page + 8, p + 5 * page + 8],
                                    [page] * 3) == [page, INVALID, page]
        two = [[p, p + 3 * page], [p + 6 * page, p + 4 * page]]  # the second key's second piece: no access
        assert store.batch_put_from_multi_buffers(["rm9", "rm10"], two, [[8, 8]] * 2) == [0, INVALID]
        assert store.batch_get_into_multi_buffers(["rm6", "rm6"], two, [[page // 2] * 2] * 2) == [page, INVALID]
    finally:
        conftest.munmap_raw(p, size)


def test_host_memory_check_in_a_forked_child_judges_the_childs_memory() -> None:
    """A child of fork() asks about its own mappings, not its parent's (an open /proc/self/maps keeps
    describing the process that opened it)."""
    hm = mc.args._host_memory
    size = 1 << 16
    p = conftest.mmap_raw(size, mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        assert hm.check(p, size, True)

        def child() -> bool:
            conftest.mmap_raw(size, 0, at=p)  # in the child's memory only
            return not hm.check(p, size, False) and not hm.check(p, 1, False)

        assert conftest.in_forked_child(child)
        assert hm.check(p, size, True)  # the parent's memory is as it was
    finally:
        conftest.munmap_raw(p, size)


def test_multi_buffers_gather_scatter(store: MooncakeDistributedStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mc.transfer, "STAGING_BATCH_BYTES", 3000)  # several staging windows
    k_cache, v_cache = rand(8 * 1024, 5), rand(8 * 1024, 6)
    keys = [f"mb{i}" for i in range(8)]
    ptrs = [[addr(k_cache) + i * 1024, addr(v_cache) + i * 1024] for i in range(8)]
    sizes = [[1024, 1024]] * 8
    assert store.batch_put_from_multi_buffers(keys, ptrs, sizes) == [0] * 8
    assert store.get(keys[3]) == bytes(k_cache[3072:4096]) + bytes(v_cache[3072:4096])
    k2, v2 = np.zeros_like(k_cache), np.zeros_like(v_cache)
    ptrs2 = [[addr(k2) + i * 1024, addr(v2) + i * 1024] for i in range(8)]
    assert store.batch_get_into_multi_buffers(keys, ptrs2, sizes) == [2048] * 8
    assert np.array_equal(k2, k_cache) and np.array_equal(v2, v_cache)
    # buffers together smaller than the value: INVALID_PARAMS for that key only
    assert store.batch_get_into_multi_buffers([keys[0], "nope", keys[1]], [ptrs2[0], ptrs2[0], ptrs2[1]],
                                              [[1024, 1023], [1024, 1024], [1024, 1024]]) == [INVALID, NOT_FOUND, 2048]
    # larger buffers: the value fills them in order, the length is returned
    big = np.full(4096, 7, np.uint8)
    assert store.batch_get_into_multi_buffers([keys[2]], [[addr(big), addr(big) + 3000]], [[3000, 1096]]) == [2048]
    assert bytes(big[:2048]) == bytes(k_cache[2048:3072]) + bytes(v_cache[2048:3072]) and big[2048] == 7
    # a key whose buffer and size lists differ in length fails the whole batch, as Mooncake
    assert store.batch_put_from_multi_buffers(["m1", "m2"], [[addr(big)], [addr(big)]], [[8], [8, 8]]) == [INVALID] * 2
    assert store.batch_get_into_multi_buffers(keys[:2], ptrs2[:2], sizes[:1]) == [INVALID] * 2
    assert store.batch_upsert_from_multi_buffers([keys[0]], [[addr(v_cache), addr(k_cache)]], [[10, 10]]) == [0]
    assert store.get(keys[0]) == bytes(v_cache[:10]) + bytes(k_cache[:10])


# ----------------------------------------------------------------------------------- removal

def test_remove_family(store: MooncakeDistributedStore) -> None:
    for k in ("a1", "a2", "b1"):
        assert store.put(k, b"v") == 0
    assert store.remove("a1") == 0
    assert store.remove("a1") == NOT_FOUND
    assert store.remove("a2", force=True) == 0
    assert store.batch_remove(["b1", "zz", ""]) == [0, NOT_FOUND, NOT_FOUND]
    for i in range(7):
        assert store.put(f"r{i}", b"v") == 0
    assert store.remove_all() == 7
    assert store.remove_all(force=True) == 0


def test_remove_by_regex_prefix_only(store: MooncakeDistributedStore, caplog: pytest.LogCaptureFixture) -> None:
    keys = ["abc1", "abc2", "xabc", "a.b", "axb", "abcd", "zzz"]
    for k in keys:
        assert store.put(k, b"v") == 0
    with caplog.at_level(logging.ERROR, logger="kvpool.mooncake"):
        for bad in ("abc", "abc.*", "[ab]", "^a|^b", "^abc\\d", "^ab+", "^abc.*$", "bc$", "^(abc)"):
            assert store.remove_by_regex(bad) == INVALID, bad
    assert "cannot list keys" in caplog.text
    assert store.batch_is_exist(keys) == [1] * len(keys)  # nothing removed by a refused pattern
    assert store.remove_by_regex("^a\\.b") == 1  # escaped metacharacter: the literal "a.b", not "axb"
    assert store.is_exist("axb") == 1
    assert store.remove_by_regex("^abcd$") == 1  # one key
    assert store.remove_by_regex("^abc.*") == 2
    assert store.batch_is_exist(keys) == [0, 0, 1, 0, 1, 0, 1]
    assert store.remove_by_regex("^" + "q" * 600) == 0
    assert store.remove_by_regex(".*", force=True) == 3  # matches every key, as regex_search does


@pytest.mark.parametrize("pattern,plan", [
    ("^abc", ("prefix", "abc")), ("^abc.*", ("prefix", "abc")), ("^abc.*?", ("prefix", "abc")),
    ("^abc$", ("exact", "abc")), ("^a\\.b\\*c", ("prefix", "a.b*c")), ("^model@tp_rank:0@", ("prefix", "model@tp_rank:0@")),
    ("", ("all", "")), ("^", ("all", "")), (".*", ("all", "")), ("^.*", ("all", "")),
    ("abc", None), ("abc.*", None), (".*abc", None), ("^abc.*$", None), ("^abc\\d", None), ("^a[bc]", None),
    ("^a|b", None), ("^ab?", None), ("^ab{2}", None), ("^$", None), ("^abc\\", None), ("^abc.+", None),
])
def test_regex_removal_plan(pattern: str, plan: Any) -> None:
    assert mc.regex_removal_plan(pattern) == plan


# ----------------------------------------------------------------------------- replicate config

def test_replicate_config(store: MooncakeDistributedStore, client: kvpool.Client) -> None:
    assert hasattr(ReplicateConfig, "group_ids")  # SGLang probes the class for group semantics
    cfg = ReplicateConfig()
    assert (cfg.replica_num, cfg.preferred_segment, cfg.with_hard_pin, cfg.group_ids) == (1, "", False, None)
    assert "replica_num: 1" in str(cfg)
    cfg.preferred_segment = client.status().segments[0].name
    assert store.put("pref", b"v", cfg) == 0
    cfg.preferred_segment = "10.9.9.9:1"  # unknown: a preference, not a requirement (as Mooncake)
    assert store.put("pref2", b"v", cfg) == 0
    cfg.group_ids = ["g1", "g2"]
    cfg.with_hard_pin = True
    assert store.batch_put_from(["g1", "g2"], [addr(rand(8))] * 2, [8, 8], cfg) == [0, 0]
    zero = ReplicateConfig(replica_num=0)
    assert store.put("r0", b"v", zero) == INVALID
    same = ReplicateConfig(prefer_alloc_in_same_node=True)
    assert store.put("same", b"v", same) == INVALID
    assert store.batch_put_from(["s1"], [addr(rand(8))], [8], same) == [INVALID]
    with pytest.raises(TypeError):
        ReplicateConfig(no_such_field=1)


@pytest.mark.parametrize("fields,kwargs", [
    ({}, {"replicas": 1}),
    ({"replica_num": 2}, {"replicas": 2}),
    ({"with_hard_pin": True}, {"replicas": 1, "pin_seconds": kvpool.PIN_FOREVER}),
    ({"with_hard_pin": True, "with_soft_pin": True}, {"replicas": 1, "pin_seconds": kvpool.PIN_FOREVER}),
    ({"with_soft_pin": True}, {"replicas": 1, "pin_seconds": 1800}),  # Mooncake's default soft pin TTL
    ({"soft_pin_action": mc.SoftPinAction.ENABLE}, {"replicas": 1, "pin_seconds": 1800}),
    ({"soft_pin_action": mc.SoftPinAction.ENABLE, "soft_pin_ttl_ms": 1}, {"replicas": 1, "pin_seconds": 1}),
    ({"with_soft_pin": True, "soft_pin_ttl_ms": 90_001}, {"replicas": 1, "pin_seconds": 91}),
    ({"soft_pin_action": mc.SoftPinAction.DISABLE}, {"replicas": 1}),
    ({"soft_pin_action": mc.SoftPinAction.PRESERVE, "replica_num": 3}, {"replicas": 3}),
])
def test_replicate_config_maps_onto_copies_and_pins(fields: dict[str, Any], kwargs: dict[str, Any]) -> None:
    from kvpool.mooncake.transfer import _replication
    assert _replication(ReplicateConfig(**fields), "put") == (0, kwargs)


@pytest.mark.parametrize("fields", [
    {"soft_pin_ttl_ms": 5000},  # a TTL without a soft pin (Mooncake: invalid params)
    {"soft_pin_action": mc.SoftPinAction.DISABLE, "soft_pin_ttl_ms": 5000},
    {"with_soft_pin": True, "soft_pin_ttl_ms": 0},
])
def test_replicate_config_pins_that_are_refused(fields: dict[str, Any]) -> None:
    from kvpool.mooncake.transfer import _replication
    assert _replication(ReplicateConfig(**fields), "put") == (INVALID, {})


@pytest.mark.parametrize("field, value", [
    ("soft_pin_ttl_ms", -1), ("soft_pin_ttl_ms", "10s"), ("soft_pin_ttl_ms", 2.5), ("replica_num", -1),
    ("replica_num", 1 << 64), ("replica_num", "3"), ("replica_num", None), ("nof_replica_num", -1),
    ("with_hard_pin", "yes"), ("with_hard_pin", []), ("preferred_segment", None), ("preferred_segment", 7),
    ("preferred_segments", "ab"), ("preferred_segments", [1]), ("preferred_segments", None),
    ("group_ids", "g"), ("data_type", 1), ("soft_pin_action", 1), ("soft_pin_action", None),
])
def test_replicate_config_refuses_wrong_types_at_assignment(field: str, value: Any) -> None:
    """The binding's fields are typed: a wrong value raises TypeError when assigned (checked on the wheel),
    and the field keeps what it had."""
    rc = ReplicateConfig()
    before = getattr(rc, field)
    with pytest.raises(TypeError, match=field):
        setattr(rc, field, value)
    assert getattr(rc, field) == before


def test_replicate_config_converts_as_the_binding_does() -> None:
    rc = ReplicateConfig()
    rc.replica_num = True
    rc.with_hard_pin = None
    rc.preferred_segment = b"h:1"
    rc.preferred_segments = ("a", b"b")
    rc.soft_pin_ttl_ms = np.uint16(7)
    assert (rc.replica_num, rc.with_hard_pin, rc.preferred_segment, rc.preferred_segments, rc.soft_pin_ttl_ms) == \
        (1, False, "h:1", ["a", "b"], 7)
    rc.preferred_segments.append("c")  # a copy, as the binding hands out
    assert rc.preferred_segments == ["a", "b"]
    with pytest.raises(AttributeError):
        rc.no_such_field = 1  # type: ignore[attr-defined]
    assert str(ReplicateConfig()) == (
        "ReplicateConfig: { replica_num: 1, nof_replica_num: 0, dfs_replica_num: 0, soft_pin_action: PRESERVE, "
        "soft_pin_ttl_ms: default, with_hard_pin: 0, preferred_segments: [], preferred_nof_segments: [], "
        "prefer_alloc_in_same_node: 0, data_type: UNKNOWN }")


# ----------------------------------------------------------------------------- master failures

def test_health_check_and_codes_with_master_stopped() -> None:
    p = conftest.start_pool(segment_size="64MiB")
    s = MooncakeDistributedStore()
    try:
        assert s.health_check() == 1
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", p.master) == 0
        assert s.health_check() == 0
        assert s.put("k", b"v") == 0
        p.stop()
        assert s.health_check() == 2
        assert s.is_exist("k") == RPC
        assert s.batch_is_exist(["k", "j"]) == [RPC, RPC]
        assert s.get("k") == b""
        assert s.get_size("k") == RPC
        assert s.put("k2", b"v") == RPC
        buf = np.zeros(8, np.uint8)
        assert s.get_into("k", addr(buf), 8) == RPC
        assert s.batch_put_from(["a", "b"], [addr(buf)] * 2, [8, 8]) == [RPC] * 2
        assert s.remove("k") == RPC
        assert s.remove_all(force=True) == RPC
        assert s.close() == 0
        assert s.health_check() == 1
    finally:
        s.close()
        p.stop()


# ------------------------------------------------------------------------ code mapping (fake)

class FakeClient:
    """Answers every put with a chosen PutStatus, or raises a chosen exception."""

    max_value_bytes = 1 << 20

    def __init__(self, status: Any = None, exc: BaseException | None = None) -> None:
        self.status, self.exc, self.calls = status, exc, []

    def _answer(self, n: int) -> list[Any]:
        if self.exc is not None:
            raise self.exc
        return [self.status] * n

    def put(self, key: str, value: Any, **kw: Any) -> Any:
        self.calls.append(("put", key, kw))
        return self._answer(1)[0]

    upsert = put

    def put_batch(self, keys: Any, values: Any, **kw: Any) -> list[Any]:
        self.calls.append(("put_batch", list(keys), kw))
        return self._answer(len(keys))

    upsert_batch = put_batch

    def exists(self, key: str) -> bool:
        self._answer(1)
        return True

    def get_into_batch(self, keys: Any, bufs: Any, **kw: Any) -> list[int]:
        self._answer(len(keys))
        return [-1] * len(keys)

    def ping(self) -> int:
        self._answer(1)
        return 1

    def close(self) -> None:
        pass


def test_the_store_hands_copies_and_pins_to_the_client() -> None:
    fake = FakeClient(kvpool.PutStatus.OK)
    s = _fake_store(fake)
    assert s.put("a", b"v", ReplicateConfig(replica_num=2, with_soft_pin=True, soft_pin_ttl_ms=2500)) == 0
    assert s.batch_put_from(["b", "c"], [addr(rand(8))] * 2, [8, 8], ReplicateConfig(with_hard_pin=True)) == [0, 0]
    assert s.upsert("d", b"v") == 0
    assert [kw for _, _, kw in fake.calls] == [{"replicas": 2, "pin_seconds": 3},
                                               {"replicas": 1, "pin_seconds": kvpool.PIN_FOREVER}, {"replicas": 1}]


def _fake_store(fake: FakeClient) -> MooncakeDistributedStore:
    s = MooncakeDistributedStore(client_factory=lambda master: fake)
    assert s.setup("h", "P2PHANDSHAKE", 0, 0, "tcp", "", "10.1.2.3") == 0
    return s


@pytest.mark.parametrize("name,put_code,upsert_code", [
    ("OK", 0, 0), ("ALREADY_EXISTS", 0, -705), ("POOL_FULL", NO_SPACE, NO_SPACE), ("NO_SEGMENT", NO_SPACE, NO_SPACE),
    ("FENCED", TRANSFER, TRANSFER), ("FAILED", TRANSFER, TRANSFER),
])
def test_put_status_mapping(name: str, put_code: int, upsert_code: int) -> None:
    s = _fake_store(FakeClient(getattr(kvpool.PutStatus, name)))
    src = rand(16)
    assert s.put("k", b"v") == put_code
    assert s.upsert("k", b"v") == upsert_code
    assert s.batch_put_from(["a", "b"], [addr(src)] * 2, [8, 8]) == [put_code] * 2
    assert s.batch_upsert_from(["a", "b"], [addr(src)] * 2, [8, 8]) == [upsert_code] * 2


@pytest.mark.parametrize("exc,data_code,probe_code", [
    (kvpool.MasterUnreachable("master at x: refused"), RPC, RPC),
    (kvpool.MasterTimeout("master at x: PUT_START timed out after 10.0s"), RPC_TIMEOUT, RPC_TIMEOUT),
    (kvpool.KvPoolError("node went away"), TRANSFER, RPC),
    (ValueError("too large"), INVALID, INVALID),
    (RuntimeError("bug"), -1, -1),
])
def test_exception_mapping(exc: BaseException, data_code: int, probe_code: int) -> None:
    fake = FakeClient(kvpool.PutStatus.OK)
    s = _fake_store(fake)
    fake.exc = exc
    assert s.put("k", b"v") == data_code
    assert s.batch_put_from(["a"], [addr(rand(8))], [8]) == [data_code]
    assert s.get_into("k", addr(np.zeros(8, np.uint8)), 8) == data_code
    assert s.is_exist("k") == probe_code
    assert s.health_check() == 2


def test_config_passed_to_client() -> None:
    fake = FakeClient(kvpool.PutStatus.OK)
    s = _fake_store(fake)
    cfg = ReplicateConfig(replica_num=3, preferred_segments=["10.0.0.1:7100", "10.0.0.2:7100"])
    assert s.put("k", b"v", cfg) == 0
    assert fake.calls[-1] == ("put", "k", {"replicas": 3, "preferred_segment": "10.0.0.1:7100"})
    assert s.put("k", b"v") == 0
    assert fake.calls[-1] == ("put", "k", {"replicas": 1})  # Mooncake's default is one replica


def test_value_over_the_masters_limit_is_invalid_params() -> None:
    s = _fake_store(FakeClient(kvpool.PutStatus.OK))
    big = np.zeros((1 << 20) + 1, np.uint8)
    assert s.put_from("k", addr(big), big.nbytes) == INVALID
    assert s.batch_put_from(["a", "b"], [addr(big)] * 2, [big.nbytes, 8]) == [INVALID, 0]


# ------------------------------------------------------------------------------------- config

def test_parse_byte_size_like_setup_dict() -> None:
    assert mc.parse_byte_size("4gb") == 4 << 30
    assert mc.parse_byte_size(" 1.5 GB ") == 3 << 29
    assert mc.parse_byte_size("512m") == 512 << 20
    assert mc.parse_byte_size("1024") == 1024
    assert mc.parse_byte_size(1 << 30) == 1 << 30
    assert mc.parse_byte_size("2TB") == 2 << 40
    for bad in ("", "gb", "-1", "4 zb", "4e"):
        assert mc.parse_byte_size(bad) is None, bad


def test_mooncake_config_file_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "mooncake.json"
    path.write_text(json.dumps({"local_hostname": "n1", "metadata_server": "P2PHANDSHAKE",
                                "global_segment_size": "4gb", "local_buffer_size": "512mb", "protocol": "RDMA",
                                "device_name": "mlx5_0", "master_server_address": "10.0.0.9",
                                "transfer_timeout": 2}))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(path))
    cfg = mc.load_config()
    assert (cfg.global_segment_size, cfg.local_buffer_size, cfg.protocol) == (4 << 30, 512 << 20, "rdma")
    assert cfg.kvpool_master == "10.0.0.9:50051"
    assert cfg.setup_args() == ("n1", "P2PHANDSHAKE", 4 << 30, 512 << 20, "rdma", "mlx5_0", "10.0.0.9")
    assert cfg.extra == {"transfer_timeout": 2}
    monkeypatch.delenv("MOONCAKE_CONFIG_PATH")
    with pytest.raises(ValueError, match="MOONCAKE_MASTER"):
        mc.MooncakeConfig.load_from_env()
    monkeypatch.setenv("MOONCAKE_MASTER", "127.0.0.1:7000")
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "1gb")
    monkeypatch.setenv("MOONCAKE_TENANT_ID", "t")
    cfg = mc.MooncakeConfig.load_from_env()
    assert (cfg.local_hostname, cfg.metadata_server, cfg.global_segment_size) == ("localhost", "P2PHANDSHAKE", 1 << 30)
    assert cfg.kvpool_master == "127.0.0.1:7000"
    assert cfg.setup_kwargs() == {"tenant_id": "t"}
    path.write_text(json.dumps({"local_hostname": "n1", "metadata_server": "x"}))
    with pytest.raises(ValueError, match="master_server_address"):
        mc.MooncakeConfig.from_file(str(path))


def test_config_from_env_drives_setup(pool: conftest.Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOONCAKE_CONFIG_PATH", raising=False)
    monkeypatch.setenv("MOONCAKE_MASTER", pool.master)
    cfg = mc.MooncakeConfig.load_from_env()
    s = MooncakeDistributedStore()
    try:
        assert s.setup(*cfg.setup_args(), **cfg.setup_kwargs()) == 0 and s.health_check() == 0
    finally:
        s.close()


def test_get_hostname_is_host_and_port(pool: conftest.Pool) -> None:
    """Mooncake returns ``host:port``: as given when the hostname names a port, else a port it bound. kvpool
    names the local node's segment (what preferred_segment and transport_endpoint compare with), or binds a
    port of its own when no node of the pool is on this host."""
    s = MooncakeDistributedStore()
    try:
        assert s.setup("10.9.8.7:4242", "P2PHANDSHAKE", 0, 0, "tcp", "", pool.master) == 0
        assert s.get_hostname() == "10.9.8.7:4242"
    finally:
        s.close()

    class NoLocalSegment:
        """A client whose segment table names only another host's node."""

        def __init__(self, master: str) -> None:
            self.inner = kvpool.Client(master)

        def status(self) -> Any:
            st = self.inner.status()
            return type("Stats", (), {"segments": [type("Seg", (), {"active": True, "host": "192.0.2.1",
                                                                     "name": "192.0.2.1:7"})()
                                                   for _ in st.segments]})()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    s = MooncakeDistributedStore(client_factory=NoLocalSegment)
    try:
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", pool.master) == 0
        host, port = s.get_hostname().rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        with socket.socket() as probe:  # the port stays bound while the store is set up
            with pytest.raises(OSError):
                probe.bind(("", int(port)))
    finally:
        assert s.close() == 0
    assert s.get_hostname() == ""
    with socket.socket() as probe:  # close() gives it back
        probe.bind(("", int(port)))


def test_setup_dummy_is_a_client_without_memory(pool: conftest.Pool) -> None:
    """Mooncake's dummy client owns no memory and reaches the pool through a server: every kvpool client."""
    s = MooncakeDistributedStore()
    try:
        assert s.setup_dummy(1 << 30, 16 << 20, pool.master) == 0
        assert s.health_check() == 0 and s.get_hostname() == ""  # Mooncake's dummy client has no hostname
        assert s.put("dummy/k", b"v") == 0 and s.get("dummy/k") == b"v"
        assert s.remove("dummy/k") == 0
    finally:
        s.close()
    s = MooncakeDistributedStore()
    assert s.setup_dummy(0, 0, f"127.0.0.1:{conftest.free_port()}") == -1  # nothing listening: Mooncake's -1
    assert s.health_check() == 1
    with pytest.raises(TypeError):
        s.setup_dummy(-1, 0, pool.master)


def test_install_gives_the_stand_in_package_a_file(pool: conftest.Pool) -> None:
    """Programs look at mooncake.__file__ (to find the package's directory); the stand-in has one, and
    mooncake.mooncake_config is kvpool's MooncakeConfig module."""
    code = (
        "import sys, os; sys.path.insert(0, sys.argv[1]); import kvpool.mooncake as m; m.install(force=True);"
        "import mooncake, mooncake.store; assert os.path.isfile(mooncake.__file__), mooncake.__file__;"
        "assert os.path.isdir(os.path.dirname(mooncake.__file__));"
        "from mooncake.mooncake_config import MooncakeConfig; assert MooncakeConfig is m.MooncakeConfig;"
        "from mooncake.buffer_pool import BufferPool; assert BufferPool is m.BufferPool;"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code, str(Path(kvpool.__file__).parents[1])],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_install_makes_mooncake_store_importable(pool: conftest.Pool) -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[2]); import kvpool.mooncake as m; m.install();"
        "from mooncake.store import MooncakeDistributedStore, ReplicateConfig;"
        "import mooncake.store; assert mooncake.store is m;"
        "s = MooncakeDistributedStore();"
        "assert s.setup('h', 'P2PHANDSHAKE', 0, 0, 'tcp', '', sys.argv[1]) == 0;"
        "assert s.health_check() == 0; s.close(); print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code, pool.master, str(Path(kvpool.__file__).parents[1])],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# ----------------------------------------------------------------------------- caller replays

def test_replay_sglang_hicache(store: MooncakeDistributedStore) -> None:
    """MooncakeStore.warmup, register_mem_pool_host, batch_set_v1 / batch_get_v1, clear."""
    warmup_key = "sglang_mooncake_store_warmup_key" + "0" * 32
    warmup_value = bytes(4 * 1024)
    assert store.put(warmup_key, warmup_value) == 0
    assert store.is_exist(warmup_key) == 1
    assert store.get(warmup_key) == warmup_value

    page_bytes, pages = 2048, 4
    host_pool = rand(2 * pages * page_bytes, 9)  # MHA: a K and a V page per page hash
    assert store.register_buffer(addr(host_pool), host_pool.nbytes) == 0
    key_strs, ptrs, sizes = [], [], []
    for i in range(pages):
        for j, kv in enumerate("kv"):
            key_strs.append(f"hash{i}_0_{kv}")
            ptrs.append(addr(host_pool) + (2 * i + j) * page_bytes)
            sizes.append(page_bytes)
    exist = store.batch_is_exist(key_strs)
    missing = [i for i, e in enumerate(exist) if e != 1]
    assert len(missing) == len(key_strs)
    put = store.batch_put_from([key_strs[i] for i in missing], [ptrs[i] for i in missing],
                               [sizes[i] for i in missing])
    assert all(r == 0 for r in put)
    assert store.batch_is_exist(key_strs) == [1] * len(key_strs)  # batch_exists counts the prefix

    dest = np.zeros_like(host_pool)
    got = store.batch_get_into(key_strs, [addr(dest) + (p - addr(host_pool)) for p in ptrs], sizes)
    assert all(r > 0 for r in got)
    assert np.array_equal(dest, host_pool)
    assert store.remove_all() >= len(key_strs)  # clear()
    assert store.unregister_buffer(addr(host_pool)) == 0


def test_replay_lmcache(store: MooncakeDistributedStore) -> None:
    """MooncakestoreConnector: register the pinned buffer, put_parts/batch_get_buffer (save_chunk_meta)
    and put_from/batch_get_into (zero-copy), exists, unregister, close."""
    pinned = np.zeros(1 << 20, np.uint8)
    assert store.register_buffer(addr(pinned), pinned.size) == 0
    cfg = ReplicateConfig()
    cfg.replica_num = 1
    cfg.preferred_segment = store.get_hostname()  # prefer_local_alloc: the local node's segment

    metadata, kv = b"\x01" * 28, bytes(rand(4096, 11))
    assert store.put_parts("lmcache@chunk0", metadata, kv) == 0
    buffers = store.batch_get_buffer(["lmcache@chunk0", "lmcache@absent"])
    assert buffers[1] is None
    view = memoryview(buffers[0])  # type: ignore[arg-type]
    assert bytes(view[:28]) == metadata and bytes(view[28:]) == kv

    chunk = rand(8192, 12)
    pinned[:8192] = chunk
    assert store.put_from("lmcache@chunk1", addr(pinned), 8192, cfg) == 0
    assert store.is_exist("lmcache@chunk1") == 1
    out_ptr = addr(pinned) + (1 << 19)
    reads = store.batch_get_into(["lmcache@chunk1", "lmcache@absent"], [out_ptr, out_ptr + 8192], [8192, 8192])
    assert reads[0] == 8192 and reads[1] <= 0  # <= 0 is a miss for LMCache
    assert np.array_equal(pinned[1 << 19:(1 << 19) + 8192], chunk)
    assert store.unregister_buffer(addr(pinned)) == 0
    assert store.close() == 0


def test_replay_vllm_mooncake_store_connector(pool: conftest.Pool, client: kvpool.Client) -> None:
    """MooncakeStoreWorker with host-memory KV caches (FlashAttn K/V-first layout: two segments per block)."""
    store = MooncakeDistributedStore()
    try:
        assert store.setup("127.0.0.1", "P2PHANDSHAKE", 4 << 30, 4 << 30, "tcp", "", pool.master) == 0
        rc = ReplicateConfig()
        rc.preferred_segment = client.status().segments[0].name  # kv_connector_extra_config preferred_segment
        num_blocks, block_len = 16, 4096
        cache = rand(2 * num_blocks * block_len, 13)  # (2, num_blocks, ...) K then V
        assert store.register_buffer(addr(cache), cache.nbytes) == 0
        k_base, v_base = addr(cache), addr(cache) + num_blocks * block_len

        def key(block_hash: int) -> str:
            return f"model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{block_hash:064x}"

        # save: dedupe with batch_is_exist, then gather K and V of each block into one object
        blocks = list(range(10))
        keys = [key(0xABC000 + b) for b in blocks]
        assert store.batch_put_from_multi_buffers(keys[:3], [[k_base + b * block_len, v_base + b * block_len]
                                                             for b in blocks[:3]], [[block_len] * 2] * 3, rc) == [0] * 3
        exists = store.batch_is_exist(keys)
        missing = [i for i, e in enumerate(exists) if e != 1]
        assert missing == list(range(3, 10))
        res = store.batch_put_from_multi_buffers([keys[i] for i in missing],
                                                 [[k_base + blocks[i] * block_len, v_base + blocks[i] * block_len]
                                                  for i in missing], [[block_len] * 2] * len(missing), rc)
        assert [i for i, v in enumerate(res) if v < 0] == []

        # load into other blocks of a second cache: no failures, identical bytes
        dst = np.zeros_like(cache)
        assert store.register_buffer(addr(dst), dst.nbytes) == 0
        dk, dv = addr(dst), addr(dst) + num_blocks * block_len
        targets = [15 - b for b in blocks]
        res = store.batch_get_into_multi_buffers(keys, [[dk + t * block_len, dv + t * block_len] for t in targets],
                                                 [[block_len] * 2] * len(keys))
        assert [i for i, v in enumerate(res) if v < 0] == [] and res == [2 * block_len] * len(keys)
        for b, t in zip(blocks, targets):
            assert np.array_equal(dst[t * block_len:(t + 1) * block_len], cache[b * block_len:(b + 1) * block_len])
            assert np.array_equal(dst[(num_blocks + t) * block_len:(num_blocks + t + 1) * block_len],
                                  cache[(num_blocks + b) * block_len:(num_blocks + b + 1) * block_len])
        # a load of absent keys marks those blocks as load errors
        res = store.batch_get_into_multi_buffers([key(1)], [[dk, dv]], [[block_len] * 2])
        assert res == [NOT_FOUND]
        # reset_cache: remove_all(force=True) over the lookup channel
        assert store.remove_all(force=True) == len(keys)
        assert store.batch_is_exist(keys) == [0] * len(keys)
    finally:
        store.close()


def test_threads_share_one_store(store: MooncakeDistributedStore) -> None:
    """vLLM drives one store from a sending thread, several receiving threads and a lookup thread."""
    errors: list[str] = []
    data = rand(64 * 1024, 14)

    def worker(t: int) -> None:
        keys = [f"t{t}-{i}" for i in range(16)]
        ptrs = [addr(data) + i * 4096 for i in range(16)]
        if store.batch_put_from(keys, ptrs, [4096] * 16) != [0] * 16:
            errors.append(f"put {t}")
        out = np.zeros(16 * 4096, np.uint8)
        if store.batch_get_into(keys, [addr(out) + i * 4096 for i in range(16)], [4096] * 16) != [4096] * 16:
            errors.append(f"get {t}")
        elif not np.array_equal(out, data):
            errors.append(f"bytes {t}")
        if store.batch_is_exist(keys) != [1] * 16:
            errors.append(f"exist {t}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
