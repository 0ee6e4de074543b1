"""Device addresses in the Mooncake pointer calls (``register_buffer``, ``put_from``, ``batch_put_from``,
``get_into``, ``batch_get_into`` and the multi-buffer forms), as Mooncake's TCP transport takes them: a piece in
device memory is staged through host memory of the device edge that owns it (pinned on a GPU), so the rest of
``kvpool.mooncake`` only ever sees host addresses.

Whether an address is device memory comes from ``kvpool.device.pointers`` (the CUDA runtime's pointer
attributes; a CPU edge's memory in CI). That needs torch, so a process that has not imported torch has host
memory only, and this module imports nothing beyond the standard library until then.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

from .args import Pieces

__all__ = ["device_range", "stage_writes", "stage_reads"]


def device_range(ptr: int, n: int) -> Optional[tuple[Any, Any]]:
    """``(edge, device tensor)`` for a device range, None for host memory (or a process without torch)."""
    if n <= 0 or "torch" not in sys.modules:
        return None
    from ..device.pointers import device_memory
    return device_memory(ptr, n)


def stage_writes(items: list[Optional[Pieces]]) -> tuple[list[Optional[Pieces]], list[Any]]:
    """The items' pieces with every device piece replaced by a host copy (made before this returns), and the
    host buffers to keep alive until the write is over."""
    keep: list[Any] = []
    edges: list[Any] = []
    out: list[Optional[Pieces]] = []
    for pieces in items:
        if pieces is None:
            out.append(None)
            continue
        staged: Pieces = []
        for ptr, n in pieces:
            dm = device_range(ptr, n)
            if dm is None:
                staged.append((ptr, n))
                continue
            edge, dev = dm
            host = edge.host(n)
            edge.copy(host, dev)
            keep.append(host)
            if edge not in edges:
                edges.append(edge)
            staged.append((host.data_ptr(), n))
        out.append(staged)
    for e in edges:
        e.done().wait()
    return out, keep


def stage_reads(items: list[Pieces]) -> tuple[list[Pieces], Callable[[list[int]], None]]:
    """The items' pieces with every device piece replaced by host memory, and the function to call with the
    read's results: it copies what each read wrote (its first ``result`` bytes) to the device pieces, and
    returns once they are there."""
    plan: list[tuple[int, int, Any, Any, Any]] = []  # item, offset in the value, edge, host, device
    out: list[Pieces] = []
    for i, pieces in enumerate(items):
        staged: Pieces = []
        offset = 0
        for ptr, n in pieces:
            dm = device_range(ptr, n)
            if dm is None:
                staged.append((ptr, n))
            else:
                edge, dev = dm
                host = edge.host(n)
                plan.append((i, offset, edge, host, dev))
                staged.append((host.data_ptr(), n))
            offset += n
        out.append(staged)

    def finish(results: list[int]) -> None:
        edges: list[Any] = []
        for i, offset, edge, host, dev in plan:
            m = min(max(int(results[i]) - offset, 0), int(dev.numel()))
            if m <= 0:
                continue
            edge.copy(dev[:m], host[:m])
            if edge not in edges:
                edges.append(edge)
        for e in edges:
            e.done().wait()
    return out, finish
