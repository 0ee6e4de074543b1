"""vLLM's own MooncakeStoreConnector over a kvpool pool, driven the way vLLM drives it, in one process.

vLLM's ``MooncakeStoreConnector`` (``vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store``) does
``from mooncake.store import MooncakeDistributedStore, ReplicateConfig`` in its worker half;
``kvpool.mooncake.install()`` makes that import give kvpool's drop-in, and the Mooncake config file named
by ``MOONCAKE_CONFIG_PATH`` (read by ``vllm.distributed.mooncake_store.MooncakeStoreConfig``) points it at
the kvpool master. Nothing of the connector is replaced or patched.

:class:`MooncakeStoreEngine` builds one engine's two halves from vLLM's real classes, following the
engine core and the worker step by step (``EngineCore._initialize_kv_caches``, ``Worker.init_device`` /
``initialize_from_config``, ``KVConnectorModelRunnerMixin``):

* configuration: ``ModelConfig`` of a model directory holding only ``config.json`` (a tiny Llama: no
  weights, no tokenizer are read), ``CacheConfig``, ``SchedulerConfig``, ``KVTransferConfig``
  (``kv_connector="MooncakeStoreConnector"``), ``DeviceConfig("cpu")``;
* the worker's distributed state: ``init_worker_distributed_environment`` on gloo (world size 1), as
  vLLM's CPU worker does; ``vllm.v1.worker.cpu.shm`` imported first, as the CPU worker does, which
  gives ``torch.cuda.Event`` a host no-op (the connector records one in ``wait_for_save``);
* KV cache geometry: ``FullAttentionSpec`` per layer, the layout resolved by
  ``resolve_kv_cache_layout`` from what ``CPUAttentionBackend`` supports, ``get_kv_cache_configs``,
  ``generate_scheduler_kv_cache_config``, ``resolve_kv_cache_block_sizes``;
* the worker half: ``ensure_kv_transfer_initialized`` (the process's KV connector, role WORKER), KV
  tensors from ``allocate_kv_cache`` on the CPU, ``register_kv_caches``;
* the scheduler half: ``Scheduler`` (which makes its own connector, role SCHEDULER, and binds its
  block pool to it); requests are ``Request`` objects with the engine's block hasher.

:meth:`MooncakeStoreEngine.step` is one engine step: ``Scheduler.schedule()``, then the worker's
connector lifecycle through ``KVConnectorModelRunnerMixin._get_kv_connector_output`` inside
``set_forward_context`` with the "forward" in the middle, then ``Scheduler.update_from_output``. The
forward is the only stand-in: no model runs, it writes to every scheduled token's KV slot (every layer,
every head) bytes that are a function of the layer, the position and the token id, as attention would
write that token's K and V. The connector's transfers run on its own threads; :meth:`drain` waits for
them by joining the connector's own queues (no sleeps, no timeouts).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

#: The tiny model: 2 layers, 2 KV heads of size 32 (bf16), 16-token blocks.
LAYERS = 2
KV_HEADS = 2
HEAD_SIZE = 32
BLOCK_SIZE = 16
MODEL_NAME = "tiny-llama-mc"
SAMPLED_TOKEN = 7


def mooncake_config(master: str) -> dict[str, Any]:
    """The Mooncake config file a user writes to point vLLM's MooncakeStoreConnector at a kvpool master.

    ``master_server_address`` is the kvpool master (``host:port``). ``standalone-store`` with
    ``global_segment_size`` 0 says the engine contributes no memory to the pool, which is what a kvpool
    client is (capacity comes from kvpool nodes). ``metadata_server``, ``protocol``, ``device_name`` and
    ``local_buffer_size`` have no meaning for kvpool: they are accepted (vLLM requires
    ``local_buffer_size`` > 0) and kvpool.mooncake logs once that it ignores them.
    """
    return {
        "master_server_address": master,
        "metadata_server": "P2PHANDSHAKE",
        "protocol": "tcp",
        "device_name": "",
        "mode": "standalone-store",
        "global_segment_size": 0,
        "local_buffer_size": "16MB",
    }


def write_model_dir(path: Path) -> Path:
    """A model directory with only ``config.json``: a tiny Llama (no weights, no tokenizer are read)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512,
        "hidden_size": KV_HEADS * HEAD_SIZE, "intermediate_size": 4 * HEAD_SIZE,
        "num_hidden_layers": LAYERS, "num_attention_heads": KV_HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_SIZE, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
    }))
    return path


def token_kv(torch: Any, layer: int, pos: int, token: int, words: int) -> Any:
    """The "attention output" for one token in one layer: every head's K and V as 16-bit words, a function of
    (layer, position, token, head, word)."""
    base = (layer * 7919 + pos * 131 + token * 17) % 30000
    pattern = torch.arange(KV_HEADS * words, dtype=torch.int32).reshape(KV_HEADS, words)
    return ((pattern + base) % 32749).to(torch.int16)


def layer_name(i: int) -> str:
    return f"model.layers.{i}.self_attn.attn"


def pool_key(block_hash: bytes) -> str:
    """The key vLLM's connector stores one KV block under, for this engine (rank 0 of TP 1, PP 1, group 0):
    ``{model dir name}@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{block hash hex}``."""
    return f"{MODEL_NAME}@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{bytes(block_hash).hex()}"


@dataclass
class StepResult:
    scheduled: dict[str, int]          # request id -> tokens computed this step
    finished_sending: set[str]
    finished_recving: set[str]
    invalid_block_ids: set[int]
    completed_saves: dict[int, int]    # store job id -> ranks done (MooncakeStoreWorkerMetadata)
    operations: list[tuple[str, str, int, int, int]]  # the worker's store calls reported this step
    #   (KVConnectorOutput.kv_connector_stats): (operation, status, keys, bytes, failed keys)


def operations(steps: list[StepResult], name: str) -> list[tuple[str, int, int, int]]:
    """The ``name`` store operations ("lookup_exists", "save_exists", "save_put", "load_get") reported over
    ``steps``: (status, keys, bytes, failed keys) each."""
    return [op[1:] for s in steps for op in s.operations if op[0] == name]


class MooncakeStoreEngine:
    """One vLLM engine's scheduler and worker halves of MooncakeStoreConnector (see the module doc)."""

    def __init__(self, work: Path, *, num_blocks: int = 64, extra_config: Optional[dict[str, Any]] = None) -> None:
        import torch
        import vllm.v1.worker.cpu.shm  # noqa: F401 - the CPU worker's torch.cuda host stand-ins, imported as it does
        from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig,
                                 VllmConfig, set_current_vllm_config)
        from vllm.distributed.kv_transfer import ensure_kv_transfer_initialized, get_kv_transfer_group
        from vllm.platforms import current_platform
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.utils.network_utils import get_open_port
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
        from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
        from vllm.v1.core.kv_cache_utils import (generate_scheduler_kv_cache_config, get_kv_cache_configs,
                                                 get_request_block_hasher, init_none_hash,
                                                 resolve_cache_hit_alignment_tokens, resolve_kv_cache_block_sizes)
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec
        from vllm.v1.structured_output import StructuredOutputManager
        from vllm.v1.worker.gpu_worker import init_worker_distributed_environment
        from vllm.v1.worker.utils import allocate_kv_cache

        self.torch = torch
        model_dir = write_model_dir(work / MODEL_NAME)
        max_len = 512
        self.vllm_config = vc = VllmConfig(
            model_config=ModelConfig(model=str(model_dir), dtype="bfloat16", max_model_len=max_len,
                                     skip_tokenizer_init=True, seed=0),
            cache_config=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True,
                                     num_gpu_blocks_override=num_blocks),
            scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=max_len, max_model_len=max_len,
                                             is_encoder_decoder=False, async_scheduling=False),
            kv_transfer_config=KVTransferConfig(kv_connector="MooncakeStoreConnector", kv_role="kv_both",
                                                kv_connector_extra_config=dict(extra_config or {})),
            device_config=DeviceConfig("cpu"),
        )
        self._set_config = set_current_vllm_config
        with set_current_vllm_config(vc):
            # Worker.init_device (CPU worker): the distributed groups the connector asks its ranks from.
            init_worker_distributed_environment(vc, 0, f"tcp://127.0.0.1:{get_open_port()}", 0,
                                                current_platform.dist_backend)
            # EngineCore._initialize_kv_caches: specs, layout, per-worker and scheduler KV cache configs.
            specs = {layer_name(i): FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=KV_HEADS,
                                                      head_size=HEAD_SIZE, dtype=torch.bfloat16)
                     for i in range(LAYERS)}
            layouts = [x.name for x in get_supported_kv_cache_layouts([CPUAttentionBackend])]
            resolve_kv_cache_layout(vc, [layouts], list(specs.values()))
            kv_cache_config = get_kv_cache_configs(vc, [specs], [1 << 30])[0]
            kv_cache_config.kv_cache_layout = vc.cache_config.kv_cache_layout
            sched_kv_cache_config = generate_scheduler_kv_cache_config([kv_cache_config])
            vc.cache_config.num_gpu_blocks = sched_kv_cache_config.num_blocks
            block_size, hash_block_size = resolve_kv_cache_block_sizes(sched_kv_cache_config, vc)
            alignment = resolve_cache_hit_alignment_tokens(sched_kv_cache_config, vc, block_size, hash_block_size)
            for c in (kv_cache_config, sched_kv_cache_config):
                c.hash_block_size = hash_block_size
                c.cache_hit_alignment_tokens = alignment
            # Worker.initialize_from_config: the KV connector, then the KV cache tensors it registers.
            vc.cache_config.hash_block_size = hash_block_size
            vc.cache_config.cache_hit_alignment_tokens = alignment
            ensure_kv_transfer_initialized(vc, kv_cache_config)
            self.worker_connector = get_kv_transfer_group()
            self.kv_caches: dict[str, Any] = allocate_kv_cache(
                kv_cache_config, torch.device("cpu"), vc.cache_config.get_resolved_kv_cache_layout())
            self.worker_connector.register_kv_caches(self.kv_caches)
            # The engine core's scheduler, which makes the scheduler-side connector.
            self.scheduler = Scheduler(vllm_config=vc, kv_cache_config=sched_kv_cache_config,
                                       structured_output_manager=StructuredOutputManager(vc),
                                       block_size=block_size, hash_block_size=hash_block_size, log_stats=True)
        self.kv_cache_config = kv_cache_config
        self.block_size = block_size
        self.num_blocks = sched_kv_cache_config.num_blocks
        hash_fn = get_hash_fn_by_name(vc.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.block_hasher = get_request_block_hasher(hash_block_size, hash_fn)
        self.block_tables: dict[str, list[int]] = {}  # request id -> its block ids (group 0), seen at its forward

    # -------------------------------------------------------------------------------- pieces

    @property
    def scheduler_connector(self) -> Any:
        return self.scheduler.connector

    @property
    def mooncake_worker(self) -> Any:
        """The connector's MooncakeStoreWorker (its store is kvpool's MooncakeDistributedStore)."""
        return self.worker_connector.connector_worker

    def request(self, request_id: str, prompt: list[int], max_tokens: int = 1) -> Any:
        """A ``Request`` as the engine core makes one (``Request.from_engine_core_request``), with its hasher."""
        from vllm import SamplingParams
        from vllm.v1.request import Request
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        params.update_from_generation_config({}, 2)
        return Request(request_id=request_id, prompt_token_ids=list(prompt), sampling_params=params,
                       pooling_params=None, block_hasher=self.block_hasher)

    # -------------------------------------------------------------------------------- stepping

    def step(self, after_schedule: Optional[Callable[[Any], None]] = None) -> StepResult:
        """One engine step: schedule, the worker's connector lifecycle around the "forward", update.
        ``after_schedule(scheduler_output)`` runs between the scheduler and the worker (a test's hook)."""
        from vllm.forward_context import set_forward_context
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin
        with self._set_config(self.vllm_config):
            so = self.scheduler.schedule()
            if after_schedule is not None:
                after_schedule(so)
            with set_forward_context(None, self.vllm_config), \
                    KVConnectorModelRunnerMixin._get_kv_connector_output(so) as kv_out:
                self._forward(so.num_scheduled_tokens)
            req_ids = list(so.num_scheduled_tokens)
            sampled = [[SAMPLED_TOKEN] if self._prefill_done(r, so.num_scheduled_tokens[r]) else [] for r in req_ids]
            out = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                    sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                                    pooler_output=None, kv_connector_output=kv_out)
            meta = kv_out.kv_connector_worker_meta
            stats = kv_out.kv_connector_stats.data if kv_out.kv_connector_stats is not None else {}
            ops = [(name, str(r["status"]), int(r["num_keys"]), int(r["num_bytes"]), int(r["num_failed_keys"]))
                   for name, records in stats.items() for r in records]
            result = StepResult(dict(so.num_scheduled_tokens), set(kv_out.finished_sending or ()),
                                set(kv_out.finished_recving or ()), set(kv_out.invalid_block_ids or ()),
                                dict(getattr(meta, "completed_saves", None) or {}), ops)
            self.scheduler.update_from_output(so, out)
        return result

    def _prefill_done(self, req_id: str, n: int) -> bool:
        req = self.scheduler.requests[req_id]  # schedule() has already counted this step's tokens as computed
        return req.num_computed_tokens >= req.num_tokens

    def _forward(self, scheduled: dict[str, int]) -> None:
        for req_id, n in scheduled.items():
            req = self.scheduler.requests[req_id]
            blocks = list(self.scheduler.kv_cache_manager.get_block_ids(req_id)[0])
            self.block_tables[req_id] = blocks
            tokens = req.all_token_ids
            for pos in range(req.num_computed_tokens - n, req.num_computed_tokens):  # schedule() counted them
                for i in range(LAYERS):
                    view = self.kv_caches[layer_name(i)].view(self.torch.int16)  # [blocks, heads, slots, K+V words]
                    view[blocks[pos // self.block_size], :, pos % self.block_size, :] = \
                        token_kv(self.torch, i, pos, tokens[pos], view.shape[-1])

    def block_bytes(self, block: int) -> bytes:
        """The bytes of one KV block as vLLM's connector stores them: each layer's block, layer 0 first."""
        torch = self.torch
        return b"".join(bytes(self.kv_caches[layer_name(i)][block].contiguous().view(torch.uint8).numpy())
                        for i in range(LAYERS))

    def expected_block_bytes(self, tokens: list[int], index: int) -> bytes:
        """What :meth:`block_bytes` holds for block ``index`` of a prompt ``tokens`` after the forward."""
        torch = self.torch
        out = []
        for i in range(LAYERS):
            like = self.kv_caches[layer_name(i)].view(torch.int16)[0]
            block = torch.zeros_like(like)
            for slot in range(self.block_size):
                pos = index * self.block_size + slot
                block[:, slot, :] = token_kv(torch, i, pos, tokens[pos], like.shape[-1])
            out.append(bytes(block.view(torch.uint8).numpy()))
        return b"".join(out)

    def zero_kv(self) -> None:
        for t in self.kv_caches.values():
            t.zero_()

    def drain(self) -> None:
        """Waits for every transfer the worker half has queued: joins the connector's own send and receive
        queues (what its reset path does before ``remove_all``)."""
        w = self.mooncake_worker
        if w.kv_send_thread is not None:
            w.kv_send_thread.request_queue.join()
        w.recv_request_queue.join()

    def run(self, request: Any, *, max_steps: int = 8) -> list[StepResult]:
        """Adds ``request`` and steps until it has finished and every transfer has been reported: after
        each step, :meth:`drain`, so that the next step reports what the connector's threads finished."""
        self.scheduler.add_request(request)
        steps: list[StepResult] = []
        for _ in range(max_steps):
            steps.append(self.step())
            self.drain()
            if request.request_id not in self.scheduler.requests and not self.scheduler.has_requests() \
                    and not self.scheduler_connector.has_pending_push_work():
                return steps
        raise AssertionError(f"request {request.request_id} not done after {max_steps} steps: {steps}")

    def reset(self) -> None:
        """Back to an idle engine: requests a failed test left are aborted (``Scheduler.finish_requests``) and
        stepped out, vLLM's local prefix cache is reset and the KV memory zeroed. The pool is not touched."""
        from vllm.v1.request import RequestStatus
        left = list(self.scheduler.requests)
        if left:
            self.scheduler.finish_requests(left, RequestStatus.FINISHED_ABORTED)
        for _ in range(4):
            if not self.scheduler.has_requests() and not self.scheduler_connector.has_pending_push_work():
                break
            self.step()
            self.drain()
        if not self.scheduler.reset_prefix_cache():
            raise AssertionError(f"the engine still holds requests: {list(self.scheduler.requests)}")
        self.zero_kv()

    def close(self) -> None:
        from vllm.distributed.kv_transfer import ensure_kv_transfer_shutdown
        try:
            self.scheduler.shutdown()
        finally:
            ensure_kv_transfer_shutdown()


def new_workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="kvpool-vllm-mc-"))


def set_environment(work: Path, master: str) -> Path:
    """Writes the Mooncake config for ``master`` and sets what vLLM reads: ``MOONCAKE_CONFIG_PATH``, and
    ``VLLM_RPC_BASE_PATH`` (where the connector's scheduler-to-worker lookup socket lives) to ``work``."""
    path = work / "mooncake.json"
    path.write_text(json.dumps(mooncake_config(master), indent=1))
    os.environ["MOONCAKE_CONFIG_PATH"] = str(path)
    os.environ["VLLM_RPC_BASE_PATH"] = str(work)
    return path


# ------------------------------------------------------------------------------------ a real engine

def run_llm(spec: dict[str, Any]) -> dict[str, Any]:
    """``vllm.LLM`` on the CPU with MooncakeStoreConnector over kvpool (engine core in this process): for each
    prompt a greedy generation, its tokens and ``num_cached_tokens`` (tokens vLLM did not compute: its own
    prefix cache or the connector's hits); spec keys ``model``, ``prompts``, ``max_tokens``, ``repeat_after_
    local_reset`` (generate each prompt again after vLLM's own prefix cache is reset, so only the pool can
    serve it), ``reset`` (end with ``reset_prefix_cache(reset_connector=True)``). Each save is waited for
    (the connector's send queue joined) before the pool is counted."""
    import kvpool.mooncake
    if kvpool.mooncake.install() is not kvpool.mooncake:
        raise ImportError("mooncake.store is not kvpool.mooncake")
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    llm = LLM(model=spec["model"], enforce_eager=True, max_model_len=512, block_size=32, dtype="float32",
              max_num_seqs=4, seed=0,
              kv_transfer_config=KVTransferConfig(kv_connector="MooncakeStoreConnector", kv_role="kv_both"))
    greedy = SamplingParams(max_tokens=int(spec.get("max_tokens", 8)), temperature=0.0, ignore_eos=True)
    connector = get_kv_transfer_group()
    worker = connector.connector_worker

    core = llm.llm_engine.engine_core.engine_core  # in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)

    def generate(prompt: str) -> dict[str, Any]:
        out = llm.generate([prompt], greedy, use_tqdm=False)[0]
        worker.kv_send_thread.request_queue.join()
        # generate() returns when the request's output is complete; vLLM keeps its blocks until a later step
        # hears from the connector that the saves are done (delayed free). Step until then, so that a reset of
        # vLLM's prefix cache that follows never finds blocks still held (it refuses then).
        for _ in range(10_000):
            if not core.scheduler.has_requests():
                break
            core.step()
        else:
            raise AssertionError("the connector never reported the request's saves done")
        return {"tokens": list(out.outputs[0].token_ids), "cached": int(out.num_cached_tokens or 0),
                "prompt_tokens": len(out.prompt_token_ids or ())}

    result: dict[str, Any] = {"connector": type(connector).__module__ + "." + type(connector).__name__,
                              "store": type(worker.store).__module__ + "." + type(worker.store).__name__}
    result["runs"] = [generate(p) for p in spec["prompts"]]
    if spec.get("repeat_after_local_reset"):
        assert llm.reset_prefix_cache()
        result["again"] = [generate(p) for p in spec["prompts"]]
    if spec.get("reset"):
        result["reset"] = bool(llm.reset_prefix_cache(reset_connector=True))
    return result


if __name__ == "__main__":
    import sys
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    print("RESULT " + json.dumps(run_llm(json.loads(sys.argv[1]))), flush=True)
