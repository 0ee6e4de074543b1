"""kvpool.mooncake's process-level memory helpers: MooncakeHostMemAllocator, the allocator hook addresses and
bind_to_numa_node, checked against the wheel mooncake-transfer-engine-non-cuda 0.3.13.post1's answers."""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvpool import mooncake as mc
from kvpool.mooncake import (MooncakeDistributedStore, MooncakeHostMemAllocator, bind_to_numa_node,
                             get_alloc_func_addr, get_free_func_addr)
from kvpool.mooncake import host_memory as hm

JOIN = 30.0  # the most a test waits for a thread it has let go


def rand(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mc.codes, "_warned", set())


# ------------------------------------------------------------------------------ host allocator

def test_host_allocator_maps_shared_memory_usable_for_put_and_get(store: MooncakeDistributedStore) -> None:
    alloc = MooncakeHostMemAllocator()
    ptr = alloc.alloc(8192)
    assert isinstance(ptr, int) and ptr % 4096 == 0
    maps = Path("/proc/self/maps").read_text()
    assert any(line.startswith(f"{ptr:x}-") and "mooncake_shm" in line for line in maps.splitlines())
    assert ctypes.string_at(ptr, 16) == b"\0" * 16
    ctypes.memset(ptr, 0x5A, 8192)
    assert store.register_buffer(ptr, 8192) == 0
    assert store.put_from("bp-shm", ptr, 8192) == 0
    ctypes.memset(ptr, 0, 8192)
    assert store.get_into("bp-shm", ptr, 8192) == 8192
    assert ctypes.string_at(ptr, 8192) == b"\x5a" * 8192
    assert store.unregister_buffer(ptr) == 0
    assert MooncakeHostMemAllocator().free(ptr) == 0  # allocations belong to the process
    assert alloc.free(ptr) == -1
    maps = Path("/proc/self/maps").read_text()
    assert not any(line.startswith(f"{ptr:x}-") for line in maps.splitlines())


def test_host_allocator_errors() -> None:
    alloc = MooncakeHostMemAllocator()
    with pytest.raises(RuntimeError, match="Failed to map shared memory"):
        alloc.alloc(0)
    with pytest.raises(RuntimeError, match="Failed to"):
        alloc.alloc(1 << 50)
    with pytest.raises(TypeError):
        alloc.alloc(-1)
    with pytest.raises(TypeError):
        alloc.free(-1)
    ptr = alloc.alloc(1)
    assert alloc.free(ptr + 16) == -1
    assert alloc.free(0) == -1
    assert alloc.free(ptr) == 0


def test_host_allocator_hugepages_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hm, "_shm_hugepage", None)  # read again, once
    monkeypatch.setenv("MC_STORE_USE_HUGEPAGE", "1")
    monkeypatch.setenv("MC_STORE_HUGEPAGE_SIZE", "2MB")
    alloc = MooncakeHostMemAllocator()
    try:
        ptr = alloc.alloc(1)
    except RuntimeError as e:  # no hugepages reserved on this machine (as the wheel answers too)
        assert "Failed to" in str(e)
        return
    line = next(ln for ln in Path("/proc/self/maps").read_text().splitlines() if ln.startswith(f"{ptr:x}-"))
    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
    assert hi - lo == 2 << 20 and "mooncake_shm" in line  # rounded up to a whole hugepage
    assert alloc.free(ptr) == 0


def test_nof_allocator_hooks_allocate_nothing(caplog: pytest.LogCaptureFixture, fresh_warnings: None) -> None:
    with caplog.at_level(logging.WARNING, logger="kvpool.mooncake"):
        a, f = get_alloc_func_addr(), get_free_func_addr()
    assert "NVMe-oF" in caplog.text
    assert a and f and a != f and get_alloc_func_addr() == a
    alloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t)(a)
    free = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(f)
    assert alloc(4096) is None
    assert free(None) is None


# ------------------------------------------------------------------------------------------ NUMA

def run_bound(node: Any) -> tuple[Any, set[int]]:
    """Calls bind_to_numa_node in a fresh thread; (its result or exception, that thread's CPUs after)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(bind_to_numa_node(node))
        except BaseException as e:  # noqa: BLE001
            out.append(e)
        out.append(os.sched_getaffinity(0))

    t = threading.Thread(target=run)
    t.start()
    t.join(JOIN)
    return out[0], out[1]


def test_bind_to_numa_node_on_this_machine(caplog: pytest.LogCaptureFixture) -> None:
    nodes = hm._numa_nodes()
    if nodes is None:
        pytest.skip("no NUMA nodes listed on this machine")
    before = os.sched_getaffinity(0)
    result, cpus = run_bound(nodes[0])
    assert result is None
    assert cpus == hm._parse_cpulist(Path(f"/sys/devices/system/node/node{nodes[0]}/cpulist").read_text()) & before
    with caplog.at_level(logging.WARNING, logger="kvpool.mooncake"):
        result, cpus = run_bound(nodes[-1] + 1)
    assert result is None and cpus == before  # a missing node: logged, nothing changed, nothing raised
    assert "invalid NUMA node" in caplog.text
    assert os.sched_getaffinity(0) == before  # only the calling thread is bound
    for bad in ("0", 1 << 40, 1.0):
        result, _ = run_bound(bad)
        assert isinstance(result, TypeError)


def test_bind_to_numa_node_follows_the_node_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    for i, cpu in enumerate(cpus[:2]):
        (tmp_path / f"node{i}").mkdir()
        (tmp_path / f"node{i}" / "cpulist").write_text(f"{cpu}\n")
    monkeypatch.setattr(hm, "_NODE_ROOT", str(tmp_path))
    result, bound = run_bound(1)
    assert result is None and bound == {cpus[1]}

    def bound_then(node: int) -> set[int]:
        out: list[set[int]] = []

        def run() -> None:
            bind_to_numa_node(1)
            bind_to_numa_node(node)
            out.append(os.sched_getaffinity(0))

        t = threading.Thread(target=run)
        t.start()
        t.join(JOIN)
        return out[0]

    assert bound_then(-1) == set(hm._ALL_CPUS)  # -1: every CPU again (libnuma's numa_run_on_node(-1))
    monkeypatch.setattr(hm, "_NODE_ROOT", str(tmp_path / "absent"))
    with caplog.at_level(logging.WARNING, logger="kvpool.mooncake"):
        result, _ = run_bound(0)
    assert result is None and "NUMA is not available" in caplog.text
