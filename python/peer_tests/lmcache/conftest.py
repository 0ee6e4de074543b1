"""Fixtures of the LMCache peer tests: LMCache's own storage stack (``LMCacheEngineConfig`` read from a
yaml file as a user writes it, ``LMCacheMetadata``, ``StorageManager`` with its ``LocalCPUBackend``
allocator and ``RemoteBackend``, ``CacheEngineKey``, ``MemoryObj``) on CPU, against the session's
real kvpool pool.

Run with the interpreter of the lmcache peer's venv (``scripts/peers.sh install lmcache``: lmcache
0.5.6 over the torch base, without its GPU packages). The parent conftest gives ``kvpool_pool``,
puts the repository's ``python/`` on sys.path and turns skips into failures.

``lmcache_support`` (imported first) runs ``kvpool.mooncake.install()`` before LMCache's Mooncake
connector imports ``mooncake.store`` (as a ``.pth`` file does for a user, docs/python.md), so that
connector runs over kvpool's drop-in, and holds the helpers: ``Chunks`` (random KV chunks in LMCache
memory objects), ``wait_stored`` (LMCache's puts are asynchronous), ``retrieve`` (LMCache's retrieve
path: ``batched_contains`` for the block mapping, then ``batched_get(keys, location=backend)``).

Fixtures:
    model_name         a model name of the test's own (its keys never meet another test's)
    make_config        ``make_config(yaml_text)``: an ``LMCacheEngineConfig`` from a yaml file (``from_file``)
    make_manager       ``make_manager(config, model)``: LMCache's ``StorageManager`` (closed after the test)
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest


from lmcache_support import EventManager, LMCacheEngineConfig, StorageManager, metadata  # noqa: E402

_ids = itertools.count()


@pytest.fixture
def model_name(request: pytest.FixtureRequest) -> str:
    """A model name of this test's own, so that tests sharing the session's pool never see each other's keys."""
    return f"kvpool-lmcache-{request.node.name}-{next(_ids)}"


@pytest.fixture
def make_config(tmp_path: Path) -> Callable[[str], Any]:
    """``make_config(yaml_text)``: LMCache's config read from a yaml file, as LMCACHE_CONFIG_FILE is."""
    def make(yaml_text: str) -> Any:
        path = tmp_path / f"lmcache-{next(_ids)}.yaml"
        path.write_text(yaml_text)
        return LMCacheEngineConfig.from_file(str(path))
    return make


@pytest.fixture
def make_manager() -> Iterator[Callable[..., Any]]:
    """``make_manager(config, model)``: LMCache's StorageManager for the small model, closed after the test."""
    made: list[Any] = []

    def make(config: Any, model: str) -> Any:
        sm = StorageManager(config, metadata(model), EventManager())
        made.append(sm)
        return sm

    yield make
    for sm in made:
        sm.close()
