"""One vLLM engine without a model, for the KvPoolConnector scheduler and worker tests: vLLM's real v1
``Scheduler`` (which builds the scheduler-side connector from ``kv_transfer_config`` itself), the
worker-side connector made by vLLM's ``KVConnectorFactory``, and KV caches laid out by vLLM's own
``allocate_kv_cache`` in the layout vLLM resolves for its CPU attention backend. A step runs the
worker calls in the order vLLM's model runner makes them (``gpu_model_runner`` and
``KVConnectorModelRunnerMixin``: bind the metadata, ``handle_preemptions``, ``start_load_kv`` before
the forward pass when the step has synchronous loads and after it otherwise, per layer
``wait_for_layer_load``, the layer's K and V of every scheduled request, then ``save_kv_layer``, ``wait_for_save``, ``get_transfer_results``,
``get_block_ids_with_load_errors``, clear the metadata) and hands the ``KVConnectorOutput`` back to
``Scheduler.update_from_output``.

The forward pass is the one stand-in: instead of a model, each layer writes every computed token's
K and V with vLLM's CPU kernel ``cpu_attn_reshape_and_cache`` (the op the CPU backend's
``do_kv_cache_update`` calls), the values a function of the token, its position, the layer and
K/V (:func:`kv_value`). So a block's bytes say which tokens it holds, and a test can check that every
computed position of every request holds exactly the K and V its tokens give, whether the engine
computed them or loaded them from the pool.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from vllm import _custom_ops as ops
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.forward_context import get_forward_context, set_forward_context
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request
from vllm.v1.worker.utils import allocate_kv_cache

import tiny_llama
from vllm_objects import EOS_TOKEN_ID, create_kv_cache_config, create_model_runner_output, create_scheduler, layer_names

H, D = tiny_llama.KV_HEADS, tiny_llama.HEAD_DIM


def kv_value(token: int, pos: int, layer: int, kv: int) -> torch.Tensor:
    """The K (kv=0) or V (kv=1) vector, all heads, of ``token`` at position ``pos`` in ``layer``."""
    base = float(token) * 1000.0 + float(pos) + layer * 0.25 + kv * 0.125
    return torch.full((H, D), base, dtype=torch.float32) + torch.arange(D, dtype=torch.float32) / 1024.0


class Engine:
    """See the module docstring. ``stop_token``: requests run ``max_tokens`` steps; sampled tokens
    are ``7`` (never EOS)."""

    def __init__(self, vllm_config: Any, num_blocks: int = 64) -> None:
        self.config = vllm_config
        self.block_size = int(vllm_config.cache_config.block_size)
        self.kv_cache_config = create_kv_cache_config(vllm_config, num_blocks)
        self.layout = vllm_config.cache_config.get_resolved_kv_cache_layout()
        self.scheduler = create_scheduler(vllm_config, kv_cache_config=self.kv_cache_config)
        self.connector = self.scheduler.connector  # the scheduler-side connector vLLM built
        self.worker = KVConnectorFactory.create_connector(vllm_config, KVConnectorRole.WORKER, self.kv_cache_config)
        self.caches = allocate_kv_cache(self.kv_cache_config, torch.device("cpu"), self.layout, [self.block_size])
        self.layers = layer_names()
        self.worker.register_kv_caches(self.caches)
        self.isa = _get_attn_isa(torch.float32, self.block_size, D)
        self.requests: dict[str, Request] = {}
        self.outputs: dict[str, Any] = {}
        self.metas: list[Any] = []  # every step's connector metadata
        self.kv_outputs: list[KVConnectorOutput] = []
        self.written: dict[str, set[int]] = {}  # positions each request's forward passes computed
        self.tables: dict[str, list[int]] = {}  # each request's block table when it last ran

    # ------------------------------------------------------------------------------ driving

    def add(self, request: Request) -> Request:
        self.requests[request.request_id] = request
        self.scheduler.add_request(request)
        return request

    def schedule(self) -> SchedulerOutput:
        out = self.scheduler.schedule()
        self.metas.append(out.kv_connector_metadata)
        return out

    def execute(self, so: SchedulerOutput, before_load: Optional[Any] = None, after_layer: Optional[Any] = None) -> Any:
        """The worker's part of step ``so``, then ``update_from_output``. ``before_load()`` runs after the
        metadata is bound and before any load starts (a test's chance to break something);
        ``after_layer(i)`` after layer i's ``save_kv_layer``."""
        w = self.worker
        w.bind_connector_metadata(so.kv_connector_metadata)
        w.handle_preemptions(so.kv_connector_metadata)
        if before_load is not None:
            before_load()
        with set_forward_context(None, self.config):
            if so.has_sync_kv_loads:
                w.start_load_kv(get_forward_context())
            self._forward(so, after_layer)
            if not so.has_sync_kv_loads:
                w.start_load_kv(get_forward_context())
        w.wait_for_save()
        results = w.get_transfer_results(so.finished_req_ids)
        kv_out = KVConnectorOutput(finished_sending=results.finished_sending or None,
                                   finished_recving=results.finished_recving or None,
                                   invalid_block_ids=w.get_block_ids_with_load_errors())
        w.clear_connector_metadata()
        self.kv_outputs.append(kv_out)
        reqs = [self.requests[r] for r in so.num_scheduled_tokens]
        mro = create_model_runner_output(reqs, kv_connector_output=kv_out)
        # a request still in its prefill samples nothing (the model runner discards partial-prefill samples)
        mro.sampled_token_ids = [[] if r.num_computed_tokens < r.num_tokens else [7] for r in reqs]
        outs = self.scheduler.update_from_output(so, mro)
        for eco in outs.values():
            for o in eco.outputs:
                if o.finish_reason is not None:
                    self.outputs[o.request_id] = o
        return outs

    def step(self, before_load: Optional[Any] = None, after_layer: Optional[Any] = None) -> SchedulerOutput:
        so = self.schedule()
        self.execute(so, before_load, after_layer)
        return so

    def run(self, max_steps: int = 200) -> int:
        """Steps until no request is left (and every held block is released); returns the steps."""
        for n in range(max_steps):
            if not self.scheduler.has_requests() and not self.scheduler.finished_req_ids:
                return n
            self.step()
        raise AssertionError(f"requests left after {max_steps} steps: {list(self.scheduler.requests)}")

    # ------------------------------------------------------------------------------ the stand-in forward

    def block_table(self, request_id: str) -> list[int]:
        """The request's blocks now, or when it last ran (a finished request's blocks are freed but keep
        their bytes until reused)."""
        if request_id in self.scheduler.requests:
            table = list(self.scheduler.kv_cache_manager.get_block_ids(request_id)[0])
            if table:
                self.tables[request_id] = table
        return self.tables[request_id]

    def _forward(self, so: SchedulerOutput, after_layer: Optional[Any] = None) -> None:
        """Layer by layer, as vLLM's attention layers run: ``wait_for_layer_load``, every scheduled
        request's K and V of that layer, ``save_kv_layer``."""
        starts = {nr.req_id: nr.num_computed_tokens for nr in so.scheduled_new_reqs}
        cached = so.scheduled_cached_reqs
        starts.update(zip(cached.req_ids, cached.num_computed_tokens))
        work = []
        for rid, n in so.num_scheduled_tokens.items():
            req = self.requests[rid]
            table = self.block_table(rid)
            positions = list(range(starts[rid], starts[rid] + n))
            slots = torch.tensor([table[p // self.block_size] * self.block_size + p % self.block_size
                                  for p in positions], dtype=torch.int64)
            work.append((req.all_token_ids, positions, slots))
            self.written.setdefault(rid, set()).update(positions)
        for li, name in enumerate(self.layers):
            self.worker.wait_for_layer_load(name)
            cache = self.caches[name]
            nb, nh, bs, _ = cache.size()
            key_cache, value_cache = cache.view((nb, nh, bs * 2, -1)).chunk(2, dim=2)
            for tokens, positions, slots in work:
                key = torch.stack([kv_value(tokens[p], p, li, 0) for p in positions])
                value = torch.stack([kv_value(tokens[p], p, li, 1) for p in positions])
                ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, self.isa)
            self.worker.save_kv_layer(name, cache, None)
            if after_layer is not None:
                after_layer(li)

    # ------------------------------------------------------------------------------ checks

    def kv_at(self, block: int, offset: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, V) of one slot (``[H, D]`` each) where vLLM's CPU ``vec`` kernel keeps them: a block's head
        is a K half and a V half (the backend's ``chunk(2, dim=2)``), K stored ``[D][N]`` (transposed),
        V ``[N][D]``, as ``cpu_attn_reshape_and_cache`` writes them (checked by the first test)."""
        cache = self.caches[self.layers[layer]]
        nb, nh, bs, _ = cache.size()
        key_cache, value_cache = cache.view((nb, nh, bs * 2, -1)).chunk(2, dim=2)
        key_t = key_cache.reshape(nb, nh, -1).unflatten(2, (-1, bs))  # (blocks, heads, D, N)
        return key_t[block, :, :, offset], value_cache[block, :, offset]

    def wrong_positions(self, request: Request, upto: int) -> list[int]:
        """Positions below ``upto`` whose K or V in the request's blocks is not what its tokens give."""
        table = self.block_table(request.request_id)
        bad = []
        for p in range(upto):
            block, off = table[p // self.block_size], p % self.block_size
            for li in range(len(self.layers)):
                k, v = self.kv_at(block, off, li)
                tok = request.all_token_ids[p]
                if not (torch.equal(k, kv_value(tok, p, li, 0)) and torch.equal(v, kv_value(tok, p, li, 1))):
                    bad.append(p)
                    break
        return bad

    def canonical_block(self, block: int) -> torch.Tensor:
        """Block ``block`` in the pool's reference layout ``(layers, 2, tokens, heads, dim)``, read through
        the CPU kernel's K/V views."""
        out = torch.empty((len(self.layers), 2, self.block_size, H, D))
        for li in range(len(self.layers)):
            for off in range(self.block_size):
                k, v = self.kv_at(block, off, li)
                out[li, 0, off], out[li, 1, off] = k, v
        return out

    def free_blocks(self) -> int:
        return self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    def shutdown(self) -> None:
        self.worker.shutdown()
        self.connector.shutdown()


__all__ = ["Engine", "kv_value", "EOS_TOKEN_ID"]
