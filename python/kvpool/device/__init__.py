"""Device KV: engines' GPU caches to the pool and back (docs/engines.md, "GPU engines").

:mod:`kvpool.device.edge` is the one interface where bytes cross between device and host memory (a CPU
implementation, which CI runs, and a CUDA one); :mod:`kvpool.device.blocks` moves a KV cache group's blocks
between any ``KVCacheLayout`` and the pool's canonical block layout through an edge;
:mod:`kvpool.device.vllm_layout` reads the layout vLLM allocated from vLLM's own layout model.

This package imports ``torch``; the rest of ``kvpool`` never imports it, so import this package only where
the engine has torch.
"""

from .blocks import DeviceKv, PageFormat, StagedSave
from .edge import CpuEdge, CudaEdge, DeviceEdge, Event, edge_for

__all__ = ["DeviceKv", "PageFormat", "StagedSave", "CpuEdge", "CudaEdge", "DeviceEdge", "Event", "edge_for"]
