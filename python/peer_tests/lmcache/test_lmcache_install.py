"""The LMCache peer's installation: the pinned versions, and LMCache's compiled extensions loading
against the torch base (torch 2.13.0, PyPI's CUDA build) on this machine without a GPU."""

from __future__ import annotations

import importlib
import importlib.metadata

import pytest

import kvpool.mooncake
import lmcache_support


def test_versions() -> None:
    assert importlib.metadata.version("lmcache") == lmcache_support.LMCACHE_VERSION
    import torch
    assert torch.__version__.startswith("2.13.0"), torch.__version__


@pytest.mark.parametrize("name", ["lmcache.cuda_ops", "lmcache.lmcache_native", "lmcache.lmcache_fs",
                                  "lmcache.lmcache_redis"])
def test_compiled_extension_loads(name: str) -> None:
    """The wheel's .so files are built against a torch ABI; each must load with the base's torch.
    (cuda_ops also links libcudart.so.13 and libtorch_cuda.so, which the base's CUDA build provides;
    its kernels need a GPU, see docs/engines.md.)"""
    m = importlib.import_module(name)
    assert m.__file__ is not None and m.__file__.endswith(".so")


def test_mooncake_store_is_kvpools() -> None:
    import mooncake.store
    assert mooncake.store is kvpool.mooncake
