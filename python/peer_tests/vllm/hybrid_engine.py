"""A hybrid model's engine for the vLLM peer tests: vLLM's real ``Scheduler`` (with its hybrid allocator and the
kvpool connector declaring ``SupportsHMA``), the worker connector over caches vLLM's own ``get_kv_cache_configs``
places and ``allocate_kv_cache`` allocates in a GPU layout on CPU (the device edge's CPU implementation), and one
stand-in: the forward pass.

* An attention layer writes every computed token's K and V (a function of the token, its position and the layer)
  into its group's blocks, as FlashAttention's cache update would.
* A Mamba / linear-attention layer runs a recurrence: its state after position ``p`` is a function of the state
  before it, the token and ``p`` (:func:`next_state`). Where vLLM's ``align`` mode keeps states, the forward
  puts them: it starts from the state in the column before the chunk (the block a load or the previous chunk
  filled), writes the prefill checkpoint where vLLM's own ``compute_mamba_prefill_checkpoints`` (the rule the
  backends follow) says, and the chunk's last state into the chunk end's column. A state that was loaded wrong
  makes every later state wrong, so :meth:`HybridEngine.wrong_state` proves what the pool gave back.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import torch
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.forward_context import set_forward_context
from vllm.model_executor.layers.mamba.checkpoint import compute_mamba_prefill_checkpoints
from vllm.v1.core.kv_cache_utils import get_kv_cache_configs
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import MambaSpec
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.worker.utils import allocate_kv_cache

from vllm_objects import create_model_runner_output, create_request, create_scheduler

#: the state recurrence's modulus: products stay inside int64
_MOD = (1 << 31) - 1


def value(token: int, pos: int, layer: int, heads: int, dim: int) -> torch.Tensor:
    """K then V of every head of ``token`` at ``pos`` in ``layer``: ``[heads, 2 * dim]``."""
    base = float(token) * 1000.0 + float(pos) + layer * 0.25
    k = torch.full((heads, dim), base) + torch.arange(dim, dtype=torch.float32) / 1024.0
    return torch.cat([k, k + 0.125], dim=1)


def next_state(state: torch.Tensor, token: int, pos: int, layer: int) -> torch.Tensor:
    """The recurrence of the stand-in Mamba layer: int64 words, each mixing the state before with the token."""
    j = torch.arange(1, state.numel() + 1, dtype=torch.int64)
    return (state * 1103515245 + token * j + pos * 7 + layer) % _MOD


class HybridEngine:
    """vLLM's scheduler and the worker connector over a hybrid model's caches (see the module docstring).

    ``specs``: each layer's ``KVCacheSpec`` (the model's order), all of ``block_size`` tokens a block."""

    def __init__(self, make_vllm_config: Any, model_dir: Any, extra: dict, specs: dict[str, Any], block_size: int,
                 mamba_cache_mode: Optional[str] = None) -> None:
        vc = make_vllm_config(model_dir, extra={**extra, "device_edge": "cpu"}, block_size=block_size)
        vc.scheduler_config.disable_hybrid_kv_cache_manager = False
        vc.cache_config.kv_cache_layout = KVCacheLayout.LBNHC.name
        if mamba_cache_mode is not None:
            vc.cache_config.mamba_cache_mode = mamba_cache_mode
        page = max(s.page_size_bytes for s in specs.values())
        (cfg,) = get_kv_cache_configs(vc, [specs], [64 * page * len(specs)])
        cfg.kv_cache_layout = KVCacheLayout.LBNHC.name
        self.bs = block_size
        self.layers = list(specs)
        self.specs = specs
        self.group_of = {n: gi for gi, g in enumerate(cfg.kv_cache_groups) for n in g.layer_names}
        self.config, self.kv_cache_config = vc, cfg
        self.scheduler = create_scheduler(vc, kv_cache_config=cfg)
        self.worker = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, cfg)
        self.caches = allocate_kv_cache(cfg, torch.device("cpu"), KVCacheLayout.LBNHC,
                                        [block_size] * len(cfg.kv_cache_groups))
        self.worker.register_kv_caches(self.caches)
        self.requests: dict[str, Any] = {}
        self.computed: dict[str, set[int]] = {}  # positions each request's forward passes computed
        self.tables: dict[str, tuple] = {}

    def add(self, tokens: list[int], max_tokens: int = 2) -> Any:
        r = create_request(tokens, max_tokens=max_tokens, block_size=self.bs)
        self.requests[r.request_id] = r
        self.scheduler.add_request(r)
        return r

    def table(self, rid: str) -> tuple:
        if rid in self.scheduler.requests:
            t = tuple(list(g) for g in self.scheduler.kv_cache_manager.get_block_ids(rid))
            if any(t):
                self.tables[rid] = t
        return self.tables[rid]

    def step(self) -> SchedulerOutput:
        so = self.scheduler.schedule()
        w = self.worker
        w.bind_connector_metadata(so.kv_connector_metadata)
        w.handle_preemptions(so.kv_connector_metadata)
        with set_forward_context(None, self.config):
            if so.has_sync_kv_loads:
                w.start_load_kv(None)
            self._forward(so)
            if not so.has_sync_kv_loads:
                w.start_load_kv(None)
        w.wait_for_save()
        results = w.get_transfer_results(so.finished_req_ids)
        kv_out = KVConnectorOutput(finished_sending=results.finished_sending or None,
                                   finished_recving=results.finished_recving or None,
                                   failed_recving=results.failed_recving, invalid_block_ids=set())
        w.clear_connector_metadata()
        reqs = [self.requests[r] for r in so.num_scheduled_tokens]
        mro = create_model_runner_output(reqs, kv_connector_output=kv_out)
        mro.sampled_token_ids = [[] if r.num_computed_tokens < r.num_tokens else [7] for r in reqs]
        self.scheduler.update_from_output(so, mro)
        return so

    def run(self, timeout: float = 120.0) -> None:
        """Steps until no request is left. A step that schedules nothing (a request waiting for its loads)
        yields for a moment, as an idle engine loop would, instead of spinning."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.scheduler.has_requests() and not self.scheduler.finished_req_ids:
                return
            if self.step().total_num_scheduled_tokens == 0:
                time.sleep(0.005)
        raise AssertionError(f"requests left after {timeout} s: {list(self.scheduler.requests)}")

    def _forward(self, so: SchedulerOutput) -> None:
        starts = {nr.req_id: nr.num_computed_tokens for nr in so.scheduled_new_reqs}
        cached = so.scheduled_cached_reqs
        starts.update(zip(cached.req_ids, cached.num_computed_tokens))
        work = []
        for rid, n in so.num_scheduled_tokens.items():
            positions = range(starts[rid], starts[rid] + n)
            self.computed.setdefault(rid, set()).update(positions)
            work.append((self.requests[rid].all_token_ids, positions, self.table(rid)))
        for li, name in enumerate(self.layers):
            self.worker.wait_for_layer_load(name)
            cache = self.caches[name]  # [B, H, N, C]
            spec = self.specs[name]
            for tokens, positions, tables in work:
                table = tables[self.group_of[name]]
                if isinstance(spec, MambaSpec):
                    self._recur(cache, spec, table, tokens, positions, li)
                    continue
                for p in positions:
                    cache[table[p // self.bs], :, p % self.bs, :] = value(tokens[p], p, li, spec.num_kv_heads,
                                                                          spec.head_size)
            self.worker.save_kv_layer(name, cache, None)

    def _state(self, cache: Any, block: int) -> torch.Tensor:
        return cache[block].reshape(-1).view(torch.int64)

    def _recur(self, cache: Any, spec: Any, table: list[int], tokens: list[int], positions: range, li: int) -> None:
        """One Mamba layer over a chunk, keeping states where vLLM's align mode keeps them."""
        start, end, bs = positions.start, positions.stop, self.bs
        if start > 0:
            before = table[-(-start // bs) - 1]
            assert before != 0, f"no state before position {start}: column {-(-start // bs) - 1} is null"
            state = self._state(cache, before).clone()
        else:
            state = torch.zeros(spec.state_content_size_bytes // 8, dtype=torch.int64)
        (offset,), (col,) = compute_mamba_prefill_checkpoints(
            [end], [end - start], bs, bs, spec.prefill_checkpoint_alignment, False, bs)
        for p in positions:
            state = next_state(state, tokens[p], p, li)
            if col >= 0 and p + 1 == start + offset:
                self._state(cache, table[col]).copy_(state)
        self._state(cache, table[-(-end // bs) - 1]).copy_(state)

    def truth(self, tokens: list[int], upto: int, li: int, words: int) -> torch.Tensor:
        """The state of layer ``li`` after ``tokens[:upto]``, computed from nothing."""
        state = torch.zeros(words, dtype=torch.int64)
        for p in range(upto):
            state = next_state(state, tokens[p], p, li)
        return state

    def wrong_state(self, rid: str) -> list[str]:
        """The Mamba layers whose last state (after every position the request computed) is not what the
        request's tokens give from nothing."""
        tables, tokens, bad = self.table(rid), self.requests[rid].all_token_ids, []
        end = max(self.computed[rid]) + 1
        for li, name in enumerate(self.layers):
            spec = self.specs[name]
            if not isinstance(spec, MambaSpec):
                continue
            block = tables[self.group_of[name]][-(-end // self.bs) - 1]
            want = self.truth(tokens, end, li, spec.state_content_size_bytes // 8)
            if not torch.equal(self._state(self.caches[name], block), want):
                bad.append(name)
        return bad

    def wrong(self, rid: str, upto: int) -> list[tuple[str, int]]:
        """(attention layer, position) below ``upto`` whose K|V in a kept block is not what the tokens give."""
        tables, tokens, bad = self.table(rid), self.requests[rid].all_token_ids, []
        for li, name in enumerate(self.layers):
            spec = self.specs[name]
            if isinstance(spec, MambaSpec):
                continue
            table = tables[self.group_of[name]]
            for p in range(upto):
                block = table[p // self.bs]
                if block == 0:  # the null block: the window no longer sees it
                    continue
                if not torch.equal(self.caches[name][block, :, p % self.bs, :],
                                   value(tokens[p], p, li, spec.num_kv_heads, spec.head_size)):
                    bad.append((name, p))
        return bad

    def shutdown(self) -> None:
        self.worker.shutdown()
        self.scheduler.connector.shutdown()
