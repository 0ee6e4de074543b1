"""kvpool.vllm.KvPoolConnector driven through the call sequence vLLM's scheduler and worker make
(vllm/v1/core/sched/scheduler.py and the KV connector model-runner mixin), with real torch CPU
tensors in vLLM's CPU-backend layout, a real pool, and small stand-ins for Request, KVCacheBlocks,
SchedulerOutput and the forward context carrying exactly the attributes the connector reads.
vLLM itself is not installed here."""

from __future__ import annotations

import math
import pickle
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Optional

import pytest

import kvpool
from conftest import LayerWrites
from kvpool import vllm as kvvllm
from kvpool.connector import BlockHasher, KeyFormat, PagedKvCache
from kvpool.vllm import KVConnectorRole, KvPoolConnector, KvPoolConnectorMetadata

torch = pytest.importorskip("torch")

BS, LAYERS, HEADS, DIM, NUM_BLOCKS = 16, 2, 2, 8, 32
NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]


# ------------------------------------------------------------------ stand-ins for vLLM's objects

@dataclass
class Request:
    """vllm.v1.request.Request: the attributes the connector reads."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    cache_salt: Optional[str] = None
    lora_request: Any = None
    mm_features: list = field(default_factory=list)
    prompt_embeds: Any = None

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


class KVCacheBlocks:
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def get_block_ids(self) -> tuple[list[int], ...]:
        return (list(self.ids),)


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    mm_features: list = field(default_factory=list)
    lora_request: Any = None


@dataclass
class CachedRequestData:
    req_ids: list[str] = field(default_factory=list)
    resumed_req_ids: set[str] = field(default_factory=set)
    new_token_ids: list[list[int]] = field(default_factory=list)
    all_token_ids: dict[str, list[int]] = field(default_factory=dict)
    new_block_ids: list[Optional[tuple[list[int], ...]]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    num_output_tokens: list[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    finished_req_ids: set[str] = field(default_factory=set)
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    kv_connector_metadata: Any = None

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())


def vllm_config(master: str, fence: str, **extra: Any) -> Any:
    tp_size = int(extra.pop("tp_size", 1))
    cfg = {"master": master, "hash_seed": "0", "fence_path": fence, "kv_layout": "HND", "wait_for_save": True,
           "model": "vllm-test", "weights_version": "v1"}
    cfg.update(extra)
    return SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector="KvPoolConnector", kv_role="kv_both",
                                           kv_connector_extra_config=cfg),
        cache_config=SimpleNamespace(block_size=BS, cache_dtype="auto"),
        model_config=SimpleNamespace(model="vllm-test", served_model_name=None, dtype=torch.float32),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp_size, pipeline_parallel_size=1))


def kv_value(layer: int, kv: int, pos: int, token: int, head: int, d: int) -> float:
    """What the 'model' computes for one KV element: a function of the prefix position and token."""
    return float(((layer * 2 + kv) * 1000 + pos) * 7 + token % 97) + head * 0.25 + d * 0.001


class MiniVllm:
    """vLLM's scheduler and one worker, reduced to the connector calls they make, in order."""

    def __init__(self, cfg: Any, cross_layer: bool = False) -> None:
        self.sched = KvPoolConnector(cfg, KVConnectorRole.SCHEDULER)
        self.worker = KvPoolConnector(cfg, KVConnectorRole.WORKER)
        if cross_layer:
            # what allocate_uniform_kv_caches makes for a FlashAttention-like NHD backend
            self.cross = torch.zeros(NUM_BLOCKS, LAYERS, 2, BS, HEADS, DIM)
            self.worker.register_cross_layers_kv_cache(self.cross, FlashLikeBackend)
            per_layer = self.cross.permute(1, 2, 0, 3, 4, 5)  # (L, 2, nb, bs, H, D)
            self.caches = {n: per_layer[i] for i, n in enumerate(NAMES)}
            self.layout = "NHD"
        else:
            # vLLM's CPU backend: one (2, num_blocks, num_kv_heads, block_size, head_size) tensor per layer
            self.caches = {n: torch.zeros(2, NUM_BLOCKS, HEADS, BS, DIM) for n in NAMES}
            self.worker.register_kv_caches(self.caches)
            self.layout = "HND"
        self.free = list(range(NUM_BLOCKS))
        self.tables: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}
        self.requests: dict[str, Request] = {}

    def close(self) -> None:
        self.worker.shutdown()
        self.sched.shutdown()

    # scheduler side -------------------------------------------------------------

    def admit(self, req: Request, local_blocks: int = 0) -> NewRequestData:
        """schedule(): a waiting request, local prefix-cache hits, the connector's, block allocation."""
        local = local_blocks * BS
        ext, load_async = self.sched.get_num_new_matched_tokens(req, local)
        assert load_async is False
        assert (local + ext) % BS == 0 and local + ext < req.num_tokens
        need = math.ceil(req.num_tokens / BS)
        table = [self.free.pop(0) for _ in range(need)]
        self.sched.update_state_after_alloc(req, KVCacheBlocks(table), ext)
        self.tables[req.request_id] = table
        self.computed[req.request_id] = local + ext
        self.requests[req.request_id] = req
        return NewRequestData(req.request_id, req.prompt_token_ids, (list(table),), local + ext)

    def step(self, new: list[NewRequestData], cached: list[str], finished: set[str] = frozenset(),
             reset_before_execute: bool = False, start_after_forward: bool = False,
             after_layer: Optional[Callable[[int], None]] = None) -> tuple[Optional[set], set]:
        """One engine step: the scheduler output and its connector metadata, then the worker's
        forward pass with the connector hooks, then the connector's outputs. ``start_after_forward``:
        ``start_load_kv`` after the forward pass, as vLLM does for a step without synchronous loads;
        ``after_layer(i)`` runs after layer i's ``save_kv_layer``."""
        nst: dict[str, int] = {}
        for nr in new:
            nst[nr.req_id] = self.requests[nr.req_id].num_tokens - nr.num_computed_tokens
        cr = CachedRequestData()
        for rid in cached:
            req = self.requests[rid]
            cr.req_ids.append(rid)
            cr.num_computed_tokens.append(self.computed[rid])
            need = math.ceil(req.num_tokens / BS)
            grow = [self.free.pop(0) for _ in range(need - len(self.tables[rid]))]
            self.tables[rid] += grow
            cr.new_block_ids.append((grow,) if grow else None)
            nst[rid] = req.num_tokens - self.computed[rid]
        so = SchedulerOutput(new, cr, nst, set(finished))
        md = self.sched.build_connector_meta(so)
        assert isinstance(md, KvPoolConnectorMetadata)
        so.kv_connector_metadata = pickle.loads(pickle.dumps(md))  # vLLM ships it to worker processes
        if reset_before_execute:
            assert self.sched.reset_cache() is True
        # worker: KVConnectorModelRunnerMixin._get_kv_connector_output around the forward pass
        w = self.worker
        w.bind_connector_metadata(so.kv_connector_metadata)
        forward_context = SimpleNamespace(attn_metadata={n: object() for n in NAMES}, no_compile_layers={})
        if not start_after_forward:
            w.start_load_kv(forward_context)
        for layer, name in enumerate(NAMES):
            w.wait_for_layer_load(name)
            self.compute(layer, name, nst)
            w.save_kv_layer(name, self.caches[name], object())
            if after_layer is not None:
                after_layer(layer)
        if start_after_forward:
            w.start_load_kv(forward_context)
        w.wait_for_save()
        sending, recving = w.get_finished(so.finished_req_ids)
        assert recving is None
        errors = w.get_block_ids_with_load_errors()
        w.clear_connector_metadata()
        for rid, n in nst.items():
            self.computed[rid] += n
        return sending, errors

    def compute(self, layer: int, name: str, nst: dict[str, int]) -> None:
        """The attention layer writing the step's new tokens' K and V into their slots."""
        cache = self.caches[name]
        for rid, n in nst.items():
            req, table = self.requests[rid], self.tables[rid]
            toks = req.all_token_ids
            for pos in range(self.computed[rid], self.computed[rid] + n):
                b, slot = table[pos // BS], pos % BS
                for kv in range(2):
                    for h in range(HEADS):
                        vals = torch.tensor([kv_value(layer, kv, pos, toks[pos], h, d) for d in range(DIM)])
                        if self.layout == "HND":
                            cache[kv, b, h, slot] = vals
                        else:
                            cache[kv, b, slot, h] = vals

    def finish(self, rid: str) -> bool:
        keep, params = self.sched.request_finished(self.requests[rid], self.tables[rid])
        assert params is None
        return keep

    def slot(self, rid: str, layer: int, kv: int, pos: int, h: int) -> Any:
        b, slot = self.tables[rid][pos // BS], pos % BS
        c = self.caches[NAMES[layer]]
        return c[kv, b, h, slot] if self.layout == "HND" else c[kv, b, slot, h]

    def assert_holds_computed_kv(self, rid: str, upto: int) -> None:
        toks = self.requests[rid].all_token_ids
        for layer in range(LAYERS):
            for kv in range(2):
                for pos in range(upto):
                    for h in range(HEADS):
                        want = torch.tensor([kv_value(layer, kv, pos, toks[pos], h, d) for d in range(DIM)])
                        assert torch.equal(self.slot(rid, layer, kv, pos, h), want), (rid, layer, kv, pos, h)


class FlashLikeBackend:
    """The two AttentionBackend methods vLLM's cross-layer allocation consults (FlashAttention, NHD)."""

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto") -> tuple[int, ...]:
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False) -> tuple[int, ...]:
        return (2, 0, 1, 3, 4, 5) if include_num_layers_dimension else (0, 1, 2, 3, 4)


@pytest.fixture(params=[False, True], ids=["whole-blocks", "layerwise"])
def engine(pool: Any, client: kvpool.Client, tmp_path: Any, request: pytest.FixtureRequest) -> Any:
    """Engines moving KV whole blocks or (``layerwise: true``) layer by layer: every test runs both ways."""
    engines: list[MiniVllm] = []

    def make(cross_layer: bool = False, **extra: Any) -> MiniVllm:
        extra.setdefault("layerwise", request.param)
        e = MiniVllm(vllm_config(pool.master, str(tmp_path / "fence"), **extra), cross_layer)
        engines.append(e)
        return e
    yield make
    for e in engines:
        e.close()


# ------------------------------------------------------------------ tests

def test_module_imports_without_vllm_and_has_the_base_class_methods() -> None:
    assert kvvllm.HAVE_VLLM is False  # vLLM cannot be installed here: the stand-in base is in use
    for name in ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta", "request_finished",
                 "update_connector_output", "take_events", "reset_cache", "register_kv_caches",
                 "register_cross_layers_kv_cache", "handle_preemptions", "start_load_kv", "wait_for_layer_load",
                 "save_kv_layer", "wait_for_save", "get_finished", "get_block_ids_with_load_errors", "shutdown",
                 "bind_connector_metadata", "clear_connector_metadata", "prefer_cross_layer_blocks",
                 "get_required_kvcache_layout", "get_kv_connector_stats"):
        assert hasattr(KvPoolConnector, name), name


@pytest.mark.parametrize("cross_layer", [False, True], ids=["cpu-per-layer-HND", "cross-layer-NHD"])
def test_prefill_decode_finish_then_a_hit_loads_the_same_kv(engine: Any, client: kvpool.Client,
                                                           cross_layer: bool) -> None:
    e = engine(cross_layer=cross_layer)
    if cross_layer:
        assert isinstance(e.worker.kv, PagedKvCache)  # zero-copy: a block is the pool's object as is
        assert e.worker.kv.block(3).data_ptr() == e.cross[3].data_ptr()
    prompt = [(i * 31) % 250 for i in range(40)]
    a = Request("a", list(prompt))
    sending, errors = e.step([e.admit(a)], [])
    assert errors == set() and sending is None
    keys = KeyFormat("vllm-test", "v1", "f32").keys(BlockHasher(BS, "0").hashes(prompt))
    assert client.prefix_match(keys) == 2
    # decode 8 tokens, one a step; the step that fills block 2 (token 47) saves it
    for t in range(8):
        a.output_token_ids.append(200 + t)
        e.step([], ["a"])
    assert e.sched.connector.keys.prefix == e.worker.connector.keys.prefix
    all_keys = KeyFormat("vllm-test", "v1", "f32").keys(BlockHasher(BS, "0").hashes(a.all_token_ids))
    assert client.prefix_match(all_keys) == 3
    assert e.finish("a") is True  # saves were planned: vLLM keeps the blocks
    sending, _ = e.step([], [], finished={"a"})
    assert sending == {"a"}  # saves done (wait_for_save: true): vLLM frees them now

    # b shares a's 48 tokens and goes on: 3 blocks load from the pool into fresh blocks
    b = Request("b", list(a.all_token_ids) + [7, 8, 9])
    nr = e.admit(b)
    assert nr.num_computed_tokens == 48
    _, errors = e.step([nr], [])
    assert errors == set()
    e.assert_holds_computed_kv("b", 51)  # loaded tokens equal what the model computed for a
    assert e.worker.stats().loaded_blocks == 3

    # a prompt that is all full blocks: vLLM computes its last token, so one block less is taken
    c = Request("c", list(a.all_token_ids))
    assert e.sched.get_num_new_matched_tokens(c, 0) == (32, False)
    assert e.sched.get_num_new_matched_tokens(c, 16) == (16, False)


def test_a_reset_between_scheduling_and_execution_voids_the_step(engine: Any, client: kvpool.Client) -> None:
    e = engine()
    a = Request("a", list(range(48)))
    e.step([e.admit(a)], [])
    b = Request("b", list(range(48)) + [1, 2])
    c = Request("c", [5] * 32)
    nb, nc = e.admit(b), e.admit(c)
    assert nb.num_computed_tokens == 48
    _, errors = e.step([nb, nc], [], reset_before_execute=True)
    assert errors == set(e.tables["b"][:3])  # vLLM recomputes them
    hasher, keys = BlockHasher(BS, "0"), KeyFormat("vllm-test", "v1", "f32")
    assert client.prefix_match(keys.keys(hasher.hashes(c.all_token_ids))) == 0  # c's saves were dropped
    assert client.prefix_match(keys.keys(hasher.hashes(a.all_token_ids))) == 0
    s = e.worker.stats()
    assert s.dropped_saves == 2 and s.failed_loads == 3
    assert e.sched.get_num_new_matched_tokens(Request("d", list(range(48)) + [3]), 0) == (0, False)


def test_layerwise_writes_each_layer_of_a_step_without_loads_during_its_forward_pass(
        pool: Any, client: kvpool.Client, tmp_path: Any) -> None:
    """vLLM starts a step without loads after its forward pass: the first layer hook starts it, so that
    layer i is in the pool's put before layer i + 1 is computed."""
    e = MiniVllm(vllm_config(pool.master, str(tmp_path / "fence"), layerwise=True))
    writes = LayerWrites(e.worker.connector)
    try:
        a = Request("a", list(range(40)))
        e.step([e.admit(a)], [], start_after_forward=True, after_layer=writes.after_layer)
        assert writes.each_before_the_next(e.worker.kv.layer_bytes, LAYERS)
        keys = KeyFormat("vllm-test", "v1", "f32").keys(BlockHasher(BS, "0").hashes(a.all_token_ids))
        assert client.prefix_match(keys) == 2 and e.worker.stats().saved_blocks == 2
    finally:
        e.close()


def test_background_saves_and_preemption(engine: Any, client: kvpool.Client) -> None:
    e = engine(wait_for_save=False)
    a = Request("a", list(range(64)))
    e.step([e.admit(a)], [])
    e.worker.handle_preemptions({"a"})  # before a's blocks are reused, its saves are done
    e.worker.handle_preemptions(SimpleNamespace(preempted_req_ids=set()))
    e.worker.handle_preemptions(None)
    assert client.prefix_match(e.worker.connector.keys.keys(BlockHasher(BS, "0").hashes(a.all_token_ids))) == 4
    assert e.finish("a") is True
    assert e.step([], [], finished={"a"})[0] == {"a"}


def test_cache_salt_lora_and_unsupported_requests(engine: Any, client: kvpool.Client) -> None:
    e = engine()
    hasher, keys = BlockHasher(BS, "0"), KeyFormat("vllm-test", "v1", "f32")
    s = Request("s", list(range(32)), cache_salt="salt-a", lora_request=SimpleNamespace(lora_name="adapter-a"))
    e.step([e.admit(s)], [])
    want = keys.keys(hasher.hashes(s.all_token_ids,
                                   extra_keys=lambda b: ["adapter-a", "salt-a"] if b == 0 else ["adapter-a"]))
    assert client.prefix_match(want) == 2
    assert client.prefix_match(keys.keys(hasher.hashes(s.all_token_ids))) == 0
    assert e.sched.get_num_new_matched_tokens(Request("u", list(range(32)) + [1]), 0) == (0, False)
    mm = Request("m", list(range(32)) + [1], cache_salt="salt-a", lora_request=SimpleNamespace(lora_name="adapter-a"),
                 mm_features=[object()])
    assert e.sched.get_num_new_matched_tokens(mm, 0) == (0, False)  # multimodal: never matched
    e.step([e.admit(mm)], [])
    assert e.worker.stats().saved_blocks == 2  # ... nor saved


def test_each_tensor_parallel_rank_uses_its_own_keys(pool: Any, client: kvpool.Client, tmp_path: Any) -> None:
    cfg = vllm_config(pool.master, str(tmp_path / "fence"), tp_size=2)
    sched = KvPoolConnector(cfg, KVConnectorRole.SCHEDULER)
    cfg.kv_transfer_config.kv_connector_extra_config["tp_rank"] = 1
    worker = KvPoolConnector(cfg, KVConnectorRole.WORKER)
    try:
        worker.register_kv_caches({n: torch.ones(2, NUM_BLOCKS, HEADS, BS, DIM) for n in NAMES})
        a = Request("a", list(range(32)))
        sched.get_num_new_matched_tokens(a, 0)
        sched.update_state_after_alloc(a, KVCacheBlocks([0, 1]), 0)
        md = sched.build_connector_meta(SchedulerOutput([NewRequestData("a", a.prompt_token_ids, ([0, 1],), 0)],
                                                        CachedRequestData(), {"a": 32}))
        worker.bind_connector_metadata(md)
        worker.start_load_kv(None)
        worker.wait_for_save()
        h = BlockHasher(BS, "0").hashes(a.all_token_ids)
        assert client.prefix_match(KeyFormat("vllm-test", "v1", "f32", tp_rank=1, tp_size=2).keys(h)) == 2
        assert client.prefix_match(KeyFormat("vllm-test", "v1", "f32", tp_rank=0, tp_size=2).keys(h)) == 0
    finally:
        worker.shutdown()
        sched.shutdown()


def test_configuration_errors_name_the_setting(pool: Any, tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    cfg = vllm_config(pool.master, str(tmp_path / "f"))
    del cfg.kv_transfer_config.kv_connector_extra_config["hash_seed"]
    with pytest.raises(ValueError, match="PYTHONHASHSEED"):
        KvPoolConnector(cfg, KVConnectorRole.SCHEDULER)
    cfg = vllm_config(pool.master, str(tmp_path / "f"), block_size=32)
    with pytest.raises(ValueError, match="block size"):
        KvPoolConnector(cfg, KVConnectorRole.SCHEDULER)
    cfg = vllm_config(pool.master, str(tmp_path / "f"), kv_dtype="bf16")
    w = KvPoolConnector(cfg, KVConnectorRole.WORKER)
    try:
        with pytest.raises(ValueError, match="kv_dtype"):
            w.register_kv_caches({n: torch.zeros(2, NUM_BLOCKS, HEADS, BS, DIM) for n in NAMES})
    finally:
        w.shutdown()
    with pytest.raises(ValueError, match="kv_transfer_config"):
        KvPoolConnector(SimpleNamespace(kv_transfer_config=None), KVConnectorRole.SCHEDULER)
