"""Fixtures of the SGLang peer tests: SGLang's real HiCache storage classes (``HiCacheStorageConfig``,
``StorageBackendFactory``, the host memory pools of ``sglang.srt.mem_cache.pool_host`` built on CPU, see
sglang_objects.py) against a real kvpool pool.

Run with the interpreter of the sglang peer's venv (``scripts/peers.sh install sglang``: sglang 0.5.23
without its GPU stack, over the torch base). The parent conftest gives ``kvpool_pool`` (a running pool,
per session), puts the repository's ``python/`` on sys.path and turns skips into failures.

Fixtures:
    pool_client      a ``kvpool.Client`` on the session's pool, emptied first
    storage_config   ``storage_config(is_mla=..., tp_rank=..., tp_size=..., extra=..., ...)``: SGLang's
                     ``HiCacheStorageConfig`` with the dynamic-backend extra_config of ``KvPoolStore``
    make_store       ``make_store(host_pool, config)``: ``StorageBackendFactory.create_backend("dynamic",
                     ...)`` then ``register_mem_pool_host(host_pool)``, as SGLang's HiCacheController
                     attaches a storage backend; closed at teardown
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("SGLANG_DISABLE_REQUEST_LOGGING", "1")


try:
    import sglang  # noqa: F401
except ImportError as e:  # the wrong interpreter: say which one to use
    raise ImportError(f"the SGLang peer tests need SGLang ({e}); run them with the interpreter "
                      "`scripts/peers.sh python sglang` prints (./kvpool test-peers installs it)") from e

import kvpool  # noqa: E402
import sglang_objects  # noqa: E402,F401  (sglang's pools, imported once before the tests)
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402


MODEL = "test-org/tiny-model"


@pytest.fixture
def pool_client(kvpool_pool: Any) -> Iterator[kvpool.Client]:
    with kvpool.Client(kvpool_pool.master) as c:
        c.remove_all(force=True)
        yield c


@pytest.fixture
def storage_config(kvpool_pool: Any) -> Callable[..., Any]:
    def make(*, is_mla: bool = False, tp_rank: int = 0, tp_size: int = 1, page_first: bool = True,
             metrics: bool = False, model: str | None = MODEL, extra: dict[str, Any] | None = None,
             **more: Any) -> Any:
        extra_config = {"backend_name": "kvpool", "module_path": "kvpool.sglang", "class_name": "KvPoolStore",
                        "interface_v1": 1, "master": kvpool_pool.master, **(extra or {})}
        return HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                    attn_cp_size=1, is_mla_model=is_mla, enable_storage_metrics=metrics,
                                    is_page_first_layout=page_first, model_name=model,
                                    extra_config=extra_config, **more)
    return make


@pytest.fixture
def make_store() -> Iterator[Callable[[Any, Any], Any]]:
    made: list[Any] = []

    def make(host_pool: Any, config: Any) -> Any:
        store = StorageBackendFactory.create_backend("dynamic", config, host_pool)
        store.register_mem_pool_host(host_pool)
        store.on_host_pools_registered()
        made.append(store)
        return store

    yield make
    for s in made:
        s.close()
