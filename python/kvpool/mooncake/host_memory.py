"""Mooncake's process-level memory helpers: the host-memory allocator (``MooncakeHostMemAllocator``), the
allocator hook addresses (``get_alloc_func_addr`` / ``get_free_func_addr``) and NUMA binding
(``bind_to_numa_node``), each with the wheel's signatures, answers and errors."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import platform
import threading
from typing import Any, Callable, Optional

from .args import I32, _int_arg, _uint, parse_byte_size
from .codes import _warn_once, log

__all__: list[str] = ["MooncakeHostMemAllocator", "get_alloc_func_addr", "get_free_func_addr", "bind_to_numa_node"]


# ------------------------------------------------------------------------- host memory allocator

_shm_lock = threading.Lock()
_shm_maps: dict[int, mmap.mmap] = {}
_shm_hugepage: Optional[bool] = None
_SHM_NAME = "mooncake_shm"
_SZ_2MB = 2 << 20
_SZ_1GB = 1 << 30


def _hugepage_flags() -> tuple[int, int]:
    """(memfd flags, page size) for MC_STORE_USE_HUGEPAGE / MC_STORE_HUGEPAGE_SIZE, or (0, 0)."""
    global _shm_hugepage
    with _shm_lock:
        if _shm_hugepage is None:  # read once per process, as Mooncake's allocator singleton does
            _shm_hugepage = os.environ.get("MC_STORE_USE_HUGEPAGE") is not None
        enabled = _shm_hugepage
    if not enabled:
        return 0, 0
    size = _SZ_2MB
    text = os.environ.get("MC_STORE_HUGEPAGE_SIZE")
    if text is not None:
        parsed = parse_byte_size(text)
        if parsed in (_SZ_2MB, _SZ_1GB):
            size = parsed
        else:
            log.warning("kvpool.mooncake: invalid MC_STORE_HUGEPAGE_SIZE=%r; supported: 2MB, 1GB; using 2MB", text)
    huge = getattr(os, "MFD_HUGE_1GB" if size == _SZ_1GB else "MFD_HUGE_2MB", 0)
    return getattr(os, "MFD_HUGETLB", 0) | huge, size


def _shm_alloc(n: int) -> int:
    """Maps ``n`` bytes of a new memfd named ``mooncake_shm`` (rounded up to whole hugepages with
    MC_STORE_USE_HUGEPAGE) and returns its address; RuntimeError with Mooncake's message when it cannot. The
    one allocator of the process, as Mooncake's shared-memory helper is: the host allocator and the dummy
    client's memory pool (``alloc_from_mem_pool``) both take from it, and ``MooncakeHostMemAllocator.free``
    frees what either took."""
    flags, page = _hugepage_flags()
    if page:
        n = -(-n // page) * page
    try:
        fd = os.memfd_create(_SHM_NAME, os.MFD_CLOEXEC | flags)
    except (OSError, AttributeError) as e:
        hint = " (Check /proc/sys/vm/nr_hugepages?)" if page else ""
        raise RuntimeError(f"Failed to create anonymous shared memory{hint}: "
                           f"{getattr(e, 'strerror', None) or e}") from None
    try:
        try:
            os.ftruncate(fd, n)
        except OSError as e:
            raise RuntimeError(f"Failed to set shared memory size: {e.strerror}") from None
        if n == 0:
            raise RuntimeError(f"Failed to map shared memory: {os.strerror(errno.EINVAL)}")
        try:
            mm = mmap.mmap(fd, n, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                           prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            raise RuntimeError(f"Failed to map shared memory: {e.strerror}") from None
        except (ValueError, OverflowError) as e:
            raise RuntimeError(f"Failed to map shared memory: {e}") from None
    finally:
        os.close(fd)  # the mapping keeps the memory; kvpool hands the descriptor to no other process
    probe = ctypes.c_char.from_buffer(mm)
    addr = ctypes.addressof(probe)
    del probe
    with _shm_lock:
        _shm_maps[addr] = mm
    return addr


def _shm_segment(addr: int) -> Optional[tuple[int, int]]:
    """(address, size) of the allocation that holds ``addr``, or None if the allocator made none there."""
    with _shm_lock:
        for base, mm in _shm_maps.items():
            if base <= addr < base + len(mm):
                return base, len(mm)
    return None


def _shm_page() -> int:
    """The hugepage size allocations are rounded up to, or 0 without hugepages."""
    return _hugepage_flags()[1]


class MooncakeHostMemAllocator:
    """Mooncake's host-memory allocator: ``alloc(size)`` maps ``size`` bytes of anonymous shared memory (a
    memfd named ``mooncake_shm``, populated; hugepages with MC_STORE_USE_HUGEPAGE) and returns its address;
    ``free(address)`` unmaps it. Allocations belong to the process, not to the instance."""

    def __init__(self) -> None:
        """Takes no arguments, as the binding's."""

    def alloc(self, size: int) -> int:
        """The address of ``size`` new bytes (zeroed, readable and writable); RuntimeError when the memory
        cannot be had (including ``size`` 0), as Mooncake raises."""
        return _shm_alloc(_uint(size, "size"))

    def free(self, ptr: int) -> int:
        """0 once the memory at ``ptr`` (an address ``alloc`` returned) is unmapped; -1, logged, for any
        other address (including one already freed)."""
        addr = _uint(ptr, "ptr")
        with _shm_lock:
            mm = _shm_maps.pop(addr, None)
        if mm is None:
            log.error("kvpool.mooncake MooncakeHostMemAllocator.free: 0x%x is not an address alloc() returned", addr)
            return -1
        size = len(mm)
        try:
            mm.close()
        except BufferError:  # pragma: no cover - nothing exports it
            log.error("kvpool.mooncake MooncakeHostMemAllocator.free: 0x%x is still exported", addr)
            with _shm_lock:
                _shm_maps[addr] = mm
            return -1
        log.debug("kvpool.mooncake: freed shared memory at 0x%x, size %d", addr, size)
        return 0


# ------------------------------------------------------------------------ NVMe-oF allocator hooks

_ALLOC_HOOK = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t)
_FREE_HOOK = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _no_alloc(size: int) -> Optional[int]:
    return None


def _no_free(ptr: Optional[int]) -> None:
    return None


_hooks: dict[str, Any] = {}  # the C thunks; kept for the life of the process, since C holds their addresses


def _hook_address(name: str, make: Callable[[], Any]) -> int:
    _warn_once("nof-hooks", "kvpool.mooncake: get_alloc_func_addr/get_free_func_addr: kvpool has no NVMe-oF "
               "(SPDK) hugepage DMA allocator; the functions returned allocate nothing (alloc returns NULL, free "
               "does nothing), as in Mooncake builds without USE_NOF")
    with _shm_lock:
        hook = _hooks.get(name)
        if hook is None:
            hook = _hooks[name] = make()
    address = ctypes.cast(hook, ctypes.c_void_p).value
    assert address is not None
    return address


def get_alloc_func_addr() -> int:
    """The address of a C function ``void *alloc(size_t size)`` (Mooncake's NVMe-oF hugepage allocator
    hook). kvpool has no such allocator: the function returns NULL, as in Mooncake builds without NVMe-oF."""
    return _hook_address("alloc", lambda: _ALLOC_HOOK(_no_alloc))


def get_free_func_addr() -> int:
    """The address of a C function ``void free(void *ptr)`` pairing ``get_alloc_func_addr``; it does nothing."""
    return _hook_address("free", lambda: _FREE_HOOK(_no_free))


# ---------------------------------------------------------------------------------------- NUMA

#: Where the kernel lists NUMA nodes (a test may point it elsewhere).
_NODE_ROOT = "/sys/devices/system/node"

#: The CPUs this process could run on when the module was loaded (libnuma's "all CPUs", which node -1 restores).
try:
    _ALL_CPUS: frozenset[int] = frozenset(os.sched_getaffinity(0))
except (AttributeError, OSError):  # pragma: no cover - not Linux
    _ALL_CPUS = frozenset()

#: set_mempolicy(2) by machine (the generic syscall table, and x86-64's).
_SET_MEMPOLICY = {"x86_64": 238, "amd64": 238, "aarch64": 237, "arm64": 237, "riscv64": 237, "loongarch64": 237}
_MPOL_PREFERRED = 1
_NODEMASK_BITS = 1024


def _numa_nodes() -> Optional[list[int]]:
    try:
        names = os.listdir(_NODE_ROOT)
    except OSError:
        return None
    nodes = sorted(int(n[4:]) for n in names if n.startswith("node") and n[4:].isdigit())
    return nodes or None


def _parse_cpulist(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _node_cpus(node: int) -> Optional[set[int]]:
    if node < 0:
        return None
    try:
        with open(os.path.join(_NODE_ROOT, f"node{node}", "cpulist")) as f:
            return _parse_cpulist(f.read())
    except (OSError, ValueError):
        return None


def _prefer_node(node: int) -> Optional[str]:
    """Prefers ``node`` (local allocation when negative) for this thread's future allocations; None, or why not."""
    nr = _SET_MEMPOLICY.get(platform.machine().lower())
    if nr is None:
        return f"set_mempolicy is not known on {platform.machine()}"
    if node >= _NODEMASK_BITS:
        return f"node {node} is beyond the {_NODEMASK_BITS} nodes a mask holds"
    words = _NODEMASK_BITS // (8 * ctypes.sizeof(ctypes.c_ulong))
    mask = (ctypes.c_ulong * words)()
    if node >= 0:
        bits = 8 * ctypes.sizeof(ctypes.c_ulong)
        mask[node // bits] |= 1 << (node % bits)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
    except (OSError, AttributeError) as e:
        return f"no syscall(): {e}"
    syscall.restype = ctypes.c_long
    rc = syscall(ctypes.c_long(nr), ctypes.c_int(_MPOL_PREFERRED), mask, ctypes.c_ulong(_NODEMASK_BITS + 1))
    if rc != 0:
        return f"set_mempolicy: {os.strerror(ctypes.get_errno())}"
    return None


def bind_to_numa_node(node: int) -> None:
    """Runs the calling thread on ``node``'s CPUs and prefers ``node`` for its memory (libnuma's
    numa_run_on_node and numa_set_preferred); -1 means every CPU and local allocation. None: as in Mooncake,
    a node that does not exist, or a system without NUMA, is logged as a warning, not raised."""
    n = _int_arg(node, "node", I32)
    nodes = _numa_nodes()
    if nodes is None:
        log.warning("kvpool.mooncake bind_to_numa_node: NUMA is not available on this system; binding skipped")
        return
    max_node = nodes[-1]
    if n < 0 or n > max_node:
        log.warning("kvpool.mooncake bind_to_numa_node: invalid NUMA node %d; valid range: 0-%d", n, max_node)
    cpus = set(_ALL_CPUS) if n == -1 else _node_cpus(n)
    try:
        if not cpus:
            raise OSError(errno.EINVAL, "the node has no CPUs" if cpus is not None else "no CPU list for the node")
        os.sched_setaffinity(0, cpus)
    except (OSError, AttributeError) as e:
        log.warning("kvpool.mooncake bind_to_numa_node: cannot run on node %d: %s", n, e)
    why = _prefer_node(n)
    if why is not None:
        log.warning("kvpool.mooncake bind_to_numa_node: cannot prefer node %d for memory: %s", n, why)
