"""Device memory behind raw addresses, for APIs that take pointers (``kvpool.mooncake``): which edge owns an
address range, and its bytes as a tensor that edge copies.

The edges asked, in order: the :class:`~kvpool.device.edge.CpuEdge` objects :func:`use_edge` was given (their
:meth:`~kvpool.device.edge.CpuEdge.alloc` memory stands for device memory on machines without a GPU, in CI),
then CUDA: an address the CUDA runtime calls device or managed memory of device ``i`` belongs to a
:class:`~kvpool.device.edge.CudaEdge` of device ``i`` (one per device, made on first use).
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from .edge import CudaEdge, DeviceEdge

__all__ = ["use_edge", "forget_edge", "device_memory"]

_lock = threading.Lock()
_edges: list[DeviceEdge] = []
_cuda: dict[int, CudaEdge] = {}


def use_edge(edge: DeviceEdge) -> None:
    """Makes ``edge``'s device memory known to :func:`device_memory`."""
    with _lock:
        if edge not in _edges:
            _edges.append(edge)


def forget_edge(edge: DeviceEdge) -> None:
    with _lock:
        if edge in _edges:
            _edges.remove(edge)


def device_memory(address: int, nbytes: int) -> Optional[tuple[DeviceEdge, Any]]:
    """``(edge, uint8 tensor over the range)`` when ``[address, address + nbytes)`` is device memory, else None."""
    with _lock:
        edges = list(_edges)
    for e in edges:
        if e.owns(address, nbytes):
            return e, e.wrap(address, nbytes)
    import torch
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    from .cudart import device_of
    index = device_of(address)
    if index is None:
        return None
    with _lock:
        edge = _cuda.get(index)
        if edge is None:
            edge = _cuda[index] = CudaEdge(index)
    return edge, edge.wrap(address, nbytes)
