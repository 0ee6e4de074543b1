"""kvpool.mooncake: replica descriptors, replica clearing, segments, tasks, counters, the descriptor types
and the Engram store, against real kvpool pools (one embedded node; two separate nodes; a node with an
SSD tier). What each call should answer was checked on the wheel mooncake-transfer-engine-non-cuda
0.3.13.post1 against a real mooncake_master and mooncake_client."""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import pytest

import kvpool
from kvpool import mooncake as mc
from kvpool.mooncake import (EngramStore, EngramStoreConfig, MooncakeDistributedStore, ReplicaDescriptor,
                             ReplicateConfig)
from kvpool.protocol import TIER_DISK, TIER_MEMORY, value_offset

import conftest
from conftest import Cluster

INVALID, NOT_FOUND, NOT_SUPPORTED = -600, -704, -1012


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(nodes=2)
    try:
        yield c
    finally:
        c.stop()


def segment_bytes(client: kvpool.Client, name: str, offset: int, n: int) -> bytes:
    """n bytes at offset in the named segment's shared-memory file (the node's own memory)."""
    seg = next(s for s in client.status().segments if s.name == name)
    with open(seg.shm_path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        return bytes(m[offset:offset + n])


# ------------------------------------------------------------------------------------ the types

def test_module_constants_are_the_wheels_enum_members() -> None:
    expected = {
        "UNKNOWN": ("ObjectDataType", 0), "KVCACHE": ("ObjectDataType", 1), "TENSOR": ("ObjectDataType", 2),
        "WEIGHT": ("ObjectDataType", 3), "SAMPLE": ("ObjectDataType", 4), "ACTIVATION": ("ObjectDataType", 5),
        "GRADIENT": ("ObjectDataType", 6), "OPTIMIZER_STATE": ("ObjectDataType", 7),
        "METADATA": ("ObjectDataType", 8), "GENERAL": ("ObjectDataType", 9),
        "UNDEFINED": ("ReplicaStatus", 0), "INITIALIZED": ("ReplicaStatus", 1), "COMPLETE": ("ReplicaStatus", 3),
        "REMOVED": ("ReplicaStatus", 4),
        "PENDING": ("TaskStatus", 0), "PROCESSING": ("TaskStatus", 1), "FAILED": ("TaskStatus", 2),
        "SUCCESS": ("TaskStatus", 3), "REPLICA_COPY": ("TaskType", 0), "REPLICA_MOVE": ("TaskType", 1),
    }
    for name, (enum_name, value) in expected.items():
        member = getattr(mc, name)
        assert type(member) is getattr(mc, enum_name), name
        assert (member.name, int(member)) == (name, value)
        assert name in mc.__all__
    assert [(m.name, m.value) for m in mc.ReplicaStatus] == [
        ("UNDEFINED", 0), ("INITIALIZED", 1), ("PROCESSING", 2), ("COMPLETE", 3), ("REMOVED", 4), ("FAILED", 5)]
    assert {m.name: m.value for m in mc.TaskStatus} == {"PENDING": 0, "PROCESSING": 1, "SUCCESS": 3, "FAILED": 2}
    assert [(m.name, m.value) for m in mc.TaskType] == [("REPLICA_COPY", 0), ("REPLICA_MOVE", 1)]
    assert mc.ReplicaStatus(3) is mc.COMPLETE and repr(mc.COMPLETE) == "<ReplicaStatus.COMPLETE: 3>"
    for name in ("Descriptor", "MemoryDescriptor", "DiskDescriptor", "ReplicaDescriptor", "QueryTaskResponse",
                 "EngramStore", "EngramStoreConfig", "MooncakeDistributedNoFRegister"):
        assert name in mc.__all__ and hasattr(mc, name)


def test_descriptor_fields_repr_and_types() -> None:
    d = mc.Descriptor()
    assert (d.size, d.buffer_address, d.transport_endpoint) == (0, 0, "")
    assert repr(d) == "<Descriptor size=0 buffer_address=0 transport_endpoint=>"
    d.size, d.buffer_address, d.transport_endpoint = 5, 7, "h:1"
    assert repr(d) == str(d) == "<Descriptor size=5 buffer_address=7 transport_endpoint=h:1>"
    for field, bad in (("size", -1), ("size", "5"), ("buffer_address", 1.5), ("transport_endpoint", 3)):
        with pytest.raises(TypeError):
            setattr(d, field, bad)
    assert (d.size, d.buffer_address, d.transport_endpoint) == (5, 7, "h:1")


def test_descriptor_kinds_cannot_be_constructed_and_are_read_only_where_the_wheels_are() -> None:
    for cls in (mc.MemoryDescriptor, mc.DiskDescriptor, mc.ReplicaDescriptor):
        with pytest.raises(TypeError, match="No constructor defined"):
            cls()
    r = ReplicaDescriptor._memory_copy("127.0.0.1:1", 64, 11)
    with pytest.raises(AttributeError):
        r.status = mc.FAILED  # type: ignore[misc]
    md = r.get_memory_descriptor()
    assert md is r.get_memory_descriptor()  # a reference into the replica, as pybind's reference_internal
    md.buffer_descriptor.size = 99
    assert r.get_memory_descriptor().buffer_descriptor.size == 99
    with pytest.raises(TypeError):
        md.buffer_descriptor = "x"  # type: ignore[assignment]
    dd = mc.DiskDescriptor._of("/x", 3)
    dd.file_path, dd.object_size = "/y", 4
    assert (dd.file_path, dd.object_size) == ("/y", 4)
    with pytest.raises(TypeError):
        dd.object_size = -4


def test_query_task_response_defaults_repr_and_read_only_fields() -> None:
    q = mc.QueryTaskResponse()
    assert (q.id, q.type, q.status, q.created_at_ms_epoch, q.last_updated_at_ms_epoch, q.assigned_client,
            q.message) == ((0, 0), mc.REPLICA_COPY, mc.PENDING, 0, 0, (0, 0), "")
    assert repr(q) == ('QueryTaskResponse(id=0-0, type=0, status=0, created_at=0, last_updated_at=0, '
                       'assigned_client=0-0, message="")')
    for field in ("id", "type", "status", "created_at_ms_epoch", "last_updated_at_ms_epoch", "assigned_client",
                  "message"):
        with pytest.raises(AttributeError):
            setattr(q, field, getattr(q, field))


# --------------------------------------------------------------------------- replica descriptors

def test_client_replica_locations(pool: conftest.Pool, client: kvpool.Client) -> None:
    assert client.put("loc/a", b"x" * 1000) is kvpool.PutStatus.OK
    got = client.replica_locations(["loc/a", "loc/none"])
    assert got[1] is None
    length, generation, copies = got[0]  # type: ignore[misc]
    assert length == 1000 and generation > 0 and len(copies) == 1
    name, tier, offset = copies[0]
    assert (name, tier) == (pool.node, TIER_MEMORY) and offset % 64 == 0
    assert segment_bytes(client, name, offset + value_offset(len("loc/a")), 1000) == b"x" * 1000
    assert client.upsert("loc/a", b"y") is kvpool.PutStatus.OK
    assert client.replica_locations(["loc/a"])[0][1] != generation  # type: ignore[index]
    assert client.replica_locations([]) == []


def test_get_replica_desc_describes_where_the_value_is(pool: conftest.Pool, client: kvpool.Client,
                                                       store: MooncakeDistributedStore) -> None:
    value = os.urandom(5000)
    assert store.put("desc/k", value) == 0
    reps = store.get_replica_desc("desc/k")
    assert len(reps) == 1
    r = reps[0]
    assert isinstance(r, ReplicaDescriptor) and r.status is mc.COMPLETE
    assert (r.is_memory_replica(), r.is_disk_replica(), r.is_local_disk_replica()) == (True, False, False)
    d = r.get_memory_descriptor().buffer_descriptor
    assert (d.transport_endpoint, d.size) == (pool.node, 5000)
    # buffer_address is the value's byte offset in the node's segment: the value is there
    assert segment_bytes(client, d.transport_endpoint, d.buffer_address, d.size) == value
    with pytest.raises(RuntimeError, match="Expected DiskDescriptor"):
        r.get_disk_descriptor()


def test_get_replica_desc_of_a_missing_key_is_empty(store: MooncakeDistributedStore,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="kvpool.mooncake"):
        assert store.get_replica_desc("desc/none") == []
        assert store.get_replica_desc("") == []
    assert "not found" in caplog.text
    with pytest.raises(TypeError):
        store.get_replica_desc(5)  # type: ignore[arg-type]


def test_batch_get_replica_desc_leaves_missing_keys_out(pool: conftest.Pool, store: MooncakeDistributedStore) -> None:
    assert store.put_batch(["bd/a", "bd/b"], [b"1" * 10, b"2" * 20]) == 0
    got = store.batch_get_replica_desc(["bd/a", "bd/none", "bd/b", "bd/a"])
    assert set(got) == {"bd/a", "bd/b"}
    assert [r.get_memory_descriptor().buffer_descriptor.size for r in got["bd/a"]] == [10]
    assert [r.get_memory_descriptor().buffer_descriptor.transport_endpoint for r in got["bd/b"]] == [pool.node]
    assert store.batch_get_replica_desc([]) == {}
    with pytest.raises(TypeError):
        store.batch_get_replica_desc("bd/a")


def test_before_setup_the_admin_calls_answer_without_a_crash() -> None:
    s = MooncakeDistributedStore()
    assert s.get_replica_desc("k") == []
    assert s.batch_get_replica_desc(["k"]) == {}
    assert s.batch_replica_clear(["k"]) == []
    assert s.unmount_local_disk_segment() == INVALID
    assert s.get_offload_rpc_read_count() == 0
    assert s.alloc_from_mem_pool(10) == 0


def test_replicas_on_two_nodes_are_two_descriptors(cluster: Cluster) -> None:
    s = conftest.setup_mooncake_store(cluster.master)
    try:
        s.remove_all(True)
        cfg = ReplicateConfig()
        cfg.replica_num = 2
        assert s.put("two/k", b"v" * 300, cfg) == 0
        reps = s.get_replica_desc("two/k")
        nodes = {f"127.0.0.1:{p}" for p in cluster.node_ports}
        assert {r.get_memory_descriptor().buffer_descriptor.transport_endpoint for r in reps} == nodes
        assert all(r.get_memory_descriptor().buffer_descriptor.size == 300 for r in reps)
    finally:
        s.close()


# ------------------------------------------------------------------------------ replica clearing

def test_batch_replica_clear_removes_present_keys(store: MooncakeDistributedStore) -> None:
    keys = [f"clr/{i}" for i in range(5)]
    assert store.put_batch(keys, [b"v"] * 5) == 0
    assert store.put("clr/keep", b"k") == 0
    # no lease to wait for in kvpool: cleared at once; absent, empty and repeated keys are skipped
    cleared = store.batch_replica_clear([keys[3], "clr/none", "", *keys, keys[0]])
    assert cleared == [keys[3], keys[0], keys[1], keys[2], keys[4]]
    assert store.batch_is_exist(keys) == [0] * 5
    assert store.get("clr/keep") == b"k"
    assert store.batch_replica_clear([]) == []
    assert store.batch_replica_clear(["clr/none"]) == []
    with pytest.raises(TypeError):
        store.batch_replica_clear(["clr/keep"], 5)  # type: ignore[arg-type]


def test_batch_replica_clear_on_a_segment(pool: conftest.Pool, store: MooncakeDistributedStore) -> None:
    assert store.put_batch(["seg/a", "seg/b"], [b"a", b"b"]) == 0
    assert store.batch_replica_clear(["seg/a"], segment_name="nonexistent_host:99999") == []
    assert store.is_exist("seg/a") == 1
    assert store.batch_replica_clear(["seg/a", "seg/none"], segment_name=pool.node) == ["seg/a"]
    assert store.is_exist("seg/a") == 0 and store.is_exist("seg/b") == 1


def test_batch_replica_clear_cannot_drop_one_copy_of_two(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    s = conftest.setup_mooncake_store(cluster.master)
    try:
        s.remove_all(True)
        seg0, seg1 = (f"127.0.0.1:{p}" for p in cluster.node_ports)
        both = ReplicateConfig()
        both.replica_num = 2
        only0, only1 = ReplicateConfig(), ReplicateConfig()
        only0.preferred_segment, only1.preferred_segment = seg0, seg1
        assert s.put("rc/both", b"b" * 100, both) == 0
        assert s.put("rc/on0", b"0" * 100, only0) == 0
        assert s.put("rc/on1", b"1" * 100, only1) == 0
        where = {k: {r.get_memory_descriptor().buffer_descriptor.transport_endpoint for r in v}
                 for k, v in s.batch_get_replica_desc(["rc/both", "rc/on0", "rc/on1"]).items()}
        assert where == {"rc/both": {seg0, seg1}, "rc/on0": {seg0}, "rc/on1": {seg1}}
        with caplog.at_level(logging.WARNING, logger="kvpool.mooncake"):
            assert s.batch_replica_clear(["rc/both", "rc/on0", "rc/on1"], seg0) == ["rc/on0"]
        assert "cannot drop the copy on" in caplog.text and "rc/both" in caplog.text
        assert s.batch_is_exist(["rc/both", "rc/on0", "rc/on1"]) == [1, 0, 1]
        assert s.get("rc/both") == b"b" * 100
        # without a segment name, every copy goes
        assert s.batch_replica_clear(["rc/both", "rc/on1"]) == ["rc/both", "rc/on1"]
        assert s.batch_is_exist(["rc/both", "rc/on1"]) == [0, 0]
    finally:
        s.close()


def test_a_copy_on_the_ssd_tier_is_a_local_disk_replica() -> None:
    disk = Path(tempfile.mkdtemp(prefix="kvpool-pytest-disk-"))
    try:
        with conftest.start_pool(segment_size="8MiB", extra=["--disk-dir", str(disk), "--disk-size", "64MiB",
                                                             "--promote-after", "0"]) as p:
            s = conftest.setup_mooncake_store(p.master)
            try:
                check_a_disk_copy(p, s)
            finally:
                s.close()
    finally:
        shutil.rmtree(disk, ignore_errors=True)


def check_a_disk_copy(p: conftest.Pool, s: MooncakeDistributedStore) -> None:
    keys = [f"ssd/{i}" for i in range(40)]
    for k in keys:  # 40 x 512 KiB into 8 MiB of memory: the older ones spill to disk
        assert s.put(k, k.encode() * (512 * 1024 // len(k))) == 0
    deadline = time.monotonic() + 30
    on_disk: list[str] = []
    while time.monotonic() < deadline and not on_disk:
        with kvpool.Client(p.master) as c:
            locs = c.replica_locations(keys)
        on_disk = [k for k, loc in zip(keys, locs) if loc and any(t == TIER_DISK for _, t, _ in loc[2])]
        time.sleep(0.2)
    assert on_disk, "no object reached the SSD tier"
    reps = s.get_replica_desc(on_disk[0])
    disk_reps = [r for r in reps if r.is_local_disk_replica()]
    assert disk_reps and all(not r.is_memory_replica() and not r.is_disk_replica() for r in disk_reps)
    assert disk_reps[0].status is mc.COMPLETE
    with pytest.raises(RuntimeError, match="Expected MemoryDescriptor"):
        disk_reps[0].get_memory_descriptor()
    with pytest.raises(RuntimeError, match="Expected DiskDescriptor"):
        disk_reps[0].get_disk_descriptor()
    assert s.batch_replica_clear([on_disk[0]], p.node) == [on_disk[0]]  # the disk copy is on that node
    assert s.is_exist(on_disk[0]) == 0


# ----------------------------------------------------------------------- what kvpool does not do

def test_segments_are_not_mounted_by_clients(store: MooncakeDistributedStore,
                                             caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="kvpool.mooncake"):
        assert store.mount_segment("/dev/shm/x", 1 << 20) == {"ret": NOT_SUPPORTED, "segment_ids": []}
        assert store.allocate_and_mount_segment(1 << 20, protocol="tcp", location="") == {
            "ret": NOT_SUPPORTED, "segment_ids": [], "allocated_size": 0}
        assert store.unmount_segment(["1-2"], grace_period_seconds=3) == NOT_SUPPORTED
        assert store.unmount_and_free_segment([]) == NOT_SUPPORTED
    assert caplog.text.count("Run a kvpool node") == 4
    assert store.unmount_local_disk_segment(5) == 0  # a kvpool client has no local disk to drain
    for call in (lambda: store.mount_segment(b"\xff", 1), lambda: store.mount_segment("/x", -1),
                 lambda: store.allocate_and_mount_segment("1"), lambda: store.unmount_segment("id"),
                 lambda: store.unmount_and_free_segment(["id"], -1), lambda: store.unmount_local_disk_segment(1.5)):
        with pytest.raises(TypeError):
            call()


def test_tasks_are_not_supported(store: MooncakeDistributedStore, caplog: pytest.LogCaptureFixture) -> None:
    assert store.put("task/k", b"v") == 0
    with caplog.at_level(logging.ERROR, logger="kvpool.mooncake"):
        assert store.create_copy_task("task/k", ["127.0.0.1:1"]) == ((0, 0), NOT_SUPPORTED)
        assert store.create_move_task("task/k", "a:1", "b:2") == ((0, 0), NOT_SUPPORTED)
        assert store.query_task((1, 2)) == (None, NOT_SUPPORTED)
        assert store.query_task([3, 4]) == (None, NOT_SUPPORTED)
    assert caplog.text.count("not supported") == 4
    for call in (lambda: store.query_task("x"), lambda: store.query_task((1,)), lambda: store.query_task((1, -2)),
                 lambda: store.create_copy_task("k", "target"), lambda: store.create_move_task("k", "a", 3)):
        with pytest.raises(TypeError):
            call()


def test_counters_and_the_memory_pool(store: MooncakeDistributedStore, caplog: pytest.LogCaptureFixture,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mc.codes, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="kvpool.mooncake"):
        assert store.get_offload_rpc_read_count() == 0
        assert store.alloc_from_mem_pool(4096) == 0
        assert store.get_offload_rpc_read_count() == 0
    assert "disk_hits" in caplog.text and "only a store set up with setup_dummy has a memory pool" in caplog.text
    with pytest.raises(TypeError):
        store.alloc_from_mem_pool(-1)


def _mapping_of(addr: int) -> Optional[tuple[int, str]]:
    """(length, line) of the /proc/self/maps mapping that holds ``addr``, or None."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= addr < hi:
            return hi - lo, line
    return None


def test_the_dummy_clients_memory_pool(pool: conftest.Pool) -> None:
    """After setup_dummy, alloc_from_mem_pool maps shared memory as the wheel's dummy client does (checked on
    mooncake-transfer-engine-non-cuda 0.3.13.post1 against its mooncake_client): a memfd named mooncake_shm
    of the size asked, page-aligned, 0 when it cannot be had; register_buffer takes such memory only whole
    (its address and the size asked), again without complaint, and refuses a part of it with -1;
    unregister_buffer answers -1 for pool memory not registered; MooncakeHostMemAllocator().free frees it
    (the two share one allocator, as in the wheel), and close() does not."""
    s = MooncakeDistributedStore()
    host = mc.MooncakeHostMemAllocator()
    kept: list[int] = []
    try:
        assert s.setup_dummy(1 << 30, 16 << 20, pool.master) == 0
        for size, span in ((4096, 4096), (1, 4096), (100, 4096), (5000, 8192), (1 << 20, 1 << 20)):
            a = s.alloc_from_mem_pool(size)
            assert a != 0 and a % mmap.PAGESIZE == 0, size
            kept.append(a)
            found = _mapping_of(a)
            assert found is not None and found[0] == span and "memfd:mooncake_shm" in found[1], (size, found)
            ctypes.memset(a, 0x5A, size)  # writable, all of it
        assert s.alloc_from_mem_pool(0) == 0
        assert s.alloc_from_mem_pool(1 << 50) == 0
        with pytest.raises(TypeError):
            s.alloc_from_mem_pool(-1)
        a = s.alloc_from_mem_pool(5000)
        kept.append(a)
        assert s.register_buffer(a + 4096, 64) == -1  # a part: refused
        assert s.register_buffer(a, 4096) == -1
        assert s.register_buffer(a, 8192) == -1  # the mapping's pages, not the size asked
        assert s.register_buffer(a, 5000) == 0
        assert s.register_buffer(a, 5000) == 0  # again: fine, as the dummy client answers
        ctypes.memmove(a, b"hello dummy" * 10, 110)
        assert s.put_from("dummy/pool", a, 110) == 0 and s.get("dummy/pool") == b"hello dummy" * 10
        b = s.alloc_from_mem_pool(4096)
        assert s.register_buffer(b, 4096) == 0
        assert s.get_into("dummy/pool", b, 4096) == 110 and ctypes.string_at(b, 11) == b"hello dummy"
        assert s.unregister_buffer(a) == 0
        assert s.unregister_buffer(a) == -1  # not registered any more
        assert s.unregister_buffer(b + 10) == -1  # not the start of the memory
        assert s.register_buffer(a, 5000) == 0
        x = host.alloc(4096)  # the host allocator's memory is the dummy client's too
        kept.append(x)
        assert s.register_buffer(x, 4096) == 0
        assert host.free(b) == 0 and _mapping_of(b) is None  # freed by the host allocator
        assert s.remove("dummy/pool") == 0
    finally:
        s.close()
    assert all(_mapping_of(p) is not None for p in kept)  # close() frees none of it, as in the wheel
    assert all(host.free(p) == 0 for p in kept)


def test_nof_register_is_not_supported(caplog: pytest.LogCaptureFixture) -> None:
    r = mc.MooncakeDistributedNoFRegister()
    with caplog.at_level(logging.ERROR, logger="kvpool.mooncake"):
        assert r.real_register("nqn.x", 1, "10.0.0.1", 4420, 0, 1024, "127.0.0.1:50051") == NOT_SUPPORTED
        assert r.real_unregister_by_endpoint("nqn.x", 1, "10.0.0.1", 4420, "127.0.0.1:50051") == NOT_SUPPORTED
    assert [("no NVMe-oF tier" in r.getMessage()) for r in caplog.records] == [True, True]
    with pytest.raises(TypeError):
        r.real_register("nqn.x", -1, "10.0.0.1", 4420, 0, 1024, "m")
    with pytest.raises(TypeError):
        r.real_unregister_by_endpoint("nqn.x", 1, "10.0.0.1", 4420)  # type: ignore[call-arg]


# ----------------------------------------------------------------------------------------- Engram

def engram_config(sizes: list[int], dim: int) -> EngramStoreConfig:
    c = EngramStoreConfig()
    c.table_vocab_sizes = sizes
    c.embedding_dim = dim
    return c


def test_engram_config_defaults_types_and_checks() -> None:
    c = EngramStoreConfig()
    assert (c.table_vocab_sizes, c.embedding_dim) == ([1024], 64)
    c.table_vocab_sizes.append(5)  # a copy, as the binding's getter
    assert c.table_vocab_sizes == [1024]
    c.table_vocab_sizes = (3, 4)
    assert c.table_vocab_sizes == [3, 4]
    for bad in ("x", 1.5, [1.5]):
        with pytest.raises(TypeError):
            c.table_vocab_sizes = bad  # type: ignore[assignment]
    for bad_dim in ("x", 1.5, 2 ** 40):
        with pytest.raises(TypeError):
            c.embedding_dim = bad_dim  # type: ignore[assignment]
    e = EngramStore(3, engram_config([5, 7], 4))
    assert (e.get_store_keys(), e.get_num_heads(), e.get_embedding_dim(), e.get_table_vocab_sizes()) == (
        ["engram:l3:h0", "engram:l3:h1"], 2, 4, [5, 7])
    assert EngramStore(-2, EngramStoreConfig()).get_store_keys() == ["engram:l-2:h0"]
    for sizes, dim, msg in (([], 4, "must not be empty"), ([0], 4, "only positive"), ([-1], 4, "only positive"),
                            ([2], 0, "embedding_dim must be positive")):
        with pytest.raises(ValueError, match=msg):
            EngramStore(0, engram_config(sizes, dim))
    with pytest.raises(TypeError):
        EngramStore("0", c)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        EngramStore(2 ** 31, c)
    with pytest.raises(TypeError):
        EngramStore(0, "cfg")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="store parameter"):
        EngramStore(0, c, object())  # type: ignore[arg-type]


def test_engram_without_a_store_raises_as_the_binding() -> None:
    e = EngramStore(0, engram_config([4], 2))
    with pytest.raises(RuntimeError, match="EngramStore lookup failed"):
        e.lookup([[[1]]])
    with pytest.raises(RuntimeError, match="populate failed"):
        e.populate([np.zeros((4, 2), np.float32)])
    with pytest.raises(RuntimeError, match="rc=-600"):
        e.remove_from_store()


def test_engram_populate_and_lookup(store: MooncakeDistributedStore) -> None:
    e = EngramStore(1, engram_config([5, 7], 3), store)
    t0 = np.arange(15, dtype=np.float32).reshape(5, 3)
    t1 = (100 + np.arange(21, dtype=np.float64)).reshape(7, 3)  # converted to float32, as the binding does
    e.populate([t0, t1])
    # the wheel's layout: one float32 [N_h, D] table per head under engram:l{layer}:h{head}
    assert store.get("engram:l1:h0") == t0.tobytes()
    assert store.get("engram:l1:h1") == t1.astype(np.float32).tobytes()
    out = e.lookup([[[0, 6], [4, 0]]])
    assert out.dtype == np.float32 and out.shape == (1, 2, 2, 3)
    assert out.tolist() == [[[[0, 1, 2], [118, 119, 120]], [[12, 13, 14], [100, 101, 102]]]]
    ids = np.array([[[1, 2], [3, 4]], [[0, 0], [4, 6]]])
    want = np.stack([t0[ids[..., 0]], t1.astype(np.float32)[ids[..., 1]]], axis=2)
    assert np.array_equal(e.lookup(ids), want)
    assert np.array_equal(e.lookup(ids.astype(np.int32)), want)
    assert e.lookup(np.array([[[1.7, 2.2]]])).tolist() == [[[[3, 4, 5], [106, 107, 108]]]]  # cast to int64
    assert e.lookup((((1, 1),),)).tolist() == [[[[3, 4, 5], [103, 104, 105]]]]
    # a second EngramStore of the same layer reads the same tables
    assert np.array_equal(EngramStore(1, engram_config([5, 7], 3), store).lookup(ids), want)
    with pytest.raises(RuntimeError, match="populate failed"):
        e.populate([t0, t1])  # create-only
    with pytest.raises(TypeError):
        e.populate((t0, t1))  # type: ignore[arg-type]
    for bufs, msg in (([t0.tolist(), t1], "must be NumPy arrays"), ([t0, t0], "shape does not match"),
                      ([t0], "size must match num_heads"), ([t0, np.zeros(21, np.float32)], "must be 2D")):
        with pytest.raises(RuntimeError, match=msg):
            e.populate(bufs)
    assert e.remove_from_store() == 2
    assert e.remove_from_store(force=True) == 0
    with pytest.raises(RuntimeError, match="EngramStore lookup failed"):
        e.lookup(ids)


def test_engram_lookup_rejects_what_the_binding_rejects(store: MooncakeDistributedStore) -> None:
    e = EngramStore(2, engram_config([5, 7], 3), store)
    e.populate([np.ones((5, 3), np.float32), np.ones((7, 3), np.float32)])
    cases = [([[[5, 0]]], "lookup failed"), ([[[-1, 0]]], "lookup failed"), ([[[0, 7]]], "lookup failed"),
             (np.zeros((1, 1, 3), np.int64), "last dimension must match num_heads"),
             ([[[0, 0, 0]]], "lookup failed"), (np.zeros((1, 2), np.int64), r"shape \[B, L, H\]"),
             (np.zeros((0, 1, 2), np.int64), "lookup failed"), ([], "must not be empty"), ([[]], "must not be empty"),
             ([[[0, 0]], [[0, 0], [1, 1]]], "lookup failed"), ([[[0, 0], [1, 1]], [[0, 0]]], "lookup failed"),
             ("abc", "Unable to cast"), ([[[1.5, 0]]], "Unable to cast")]
    for row_ids, msg in cases:
        with pytest.raises(RuntimeError, match=msg):
            e.lookup(row_ids)
    e.remove_from_store()


def test_engram_tables_written_elsewhere_and_replaced_are_read_current(store: MooncakeDistributedStore) -> None:
    """A table written by any writer under the wheel's key is read; a replaced one is read again."""
    e = EngramStore(4, engram_config([3], 2), store)
    first = np.array([[1, 2], [3, 4], [5, 6]], np.float32)
    assert store.put("engram:l4:h0", first.tobytes()) == 0  # as the wheel's populate writes it
    assert e.lookup([[[2]]]).tolist() == [[[[5, 6]]]]
    assert store.upsert("engram:l4:h0", (first * 10).tobytes()) == 0
    assert e.lookup([[[2]]]).tolist() == [[[[50, 60]]]]
    assert store.upsert("engram:l4:h0", first[:1].tobytes()) == 0  # one row left: row 2 is out of the table
    with pytest.raises(RuntimeError, match="lookup failed"):
        e.lookup([[[2]]])
    assert e.lookup([[[0]]]).tolist() == [[[[1, 2]]]]
    other = EngramStore(4, engram_config([3], 2), store)
    assert other.remove_from_store() == 1
    with pytest.raises(RuntimeError, match="lookup failed"):
        e.lookup([[[0]]])
    other.populate([first + 1])
    assert e.lookup([[[1]]]).tolist() == [[[[4, 5]]]]
    assert e.remove_from_store() == 1
