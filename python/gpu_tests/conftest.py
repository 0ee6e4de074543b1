"""The device tests of ``scripts/gpu-check.sh``: on CUDA tensors (``KVPOOL_GPU_DEVICE=cuda``, the default) or,
for a dry run on a machine without a GPU, on the CPU edge (``KVPOOL_GPU_DEVICE=cpu``). The pool is the one the
script started (``KVPOOL_MASTER``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's kvpool

import kvpool  # noqa: E402

torch = pytest.importorskip("torch")


@pytest.fixture(scope="session")
def device() -> str:
    d = os.environ.get("KVPOOL_GPU_DEVICE", "cuda")
    if d == "cuda" and not torch.cuda.is_available():
        pytest.fail("KVPOOL_GPU_DEVICE=cuda but torch sees no CUDA device (set KVPOOL_GPU_DEVICE=cpu for a dry run)")
    return d


@pytest.fixture
def edge(device: str) -> Any:
    from kvpool.device import CpuEdge, CudaEdge
    return CudaEdge() if device == "cuda" else CpuEdge()


@pytest.fixture(scope="session")
def master() -> str:
    m = os.environ.get("KVPOOL_MASTER")
    if not m:
        pytest.fail("KVPOOL_MASTER is not set (scripts/gpu-check.sh starts a pool and sets it)")
    return m


@pytest.fixture(params=[True, False], ids=["shm", "tcp"])
def client(master: str, request: pytest.FixtureRequest) -> Iterator[kvpool.Client]:
    c = kvpool.Client(master, shared_memory=request.param)
    c.remove_all(force=True)
    try:
        yield c
    finally:
        c.close()
