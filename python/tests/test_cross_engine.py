"""Java and Python engines share KV through the pool.

* The Java BlockHasher and KeyFormat (run from the jar) and the Python ones give the same hashes and
  keys for random tokens, seeds, salts and model names.
* The Java reference engine (`kvpool engine --model tiny`) saves a prompt's KV; the Python connector
  computes the same keys (prefix_match == the prompt's full blocks), loads the blocks into its paged
  cache byte-identical to what Java stored, and into vLLM-style per-layer CPU caches consistently.
* The Python connector saves those blocks back (after the pool was emptied); a fresh Java engine
  takes them as external hits and generates exactly the tokens it generated computing everything
  (and, as a control, different tokens when the same values are stored in the wrong layout).
"""

from __future__ import annotations

import json
import os
import queue
import random
import re
import signal
import subprocess
import threading
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

import kvpool
from kvpool.connector import (
    BlockHasher, ConnectorRequest, KeyFormat, PagedKvCache, PoolConnector, ScheduledRequest, extra_keys_for,
)

np = pytest.importorskip("numpy")

MODEL = "kvpool-ref-tiny"  # what `kvpool engine --model tiny` names its model in keys
LAYERS, KV_HEADS, HEAD_DIM, BS = 2, 2, 8, 16  # ModelConfig.tiny(): dim 32, 4 heads, 2 KV heads

JAVA_HASHER = r"""
import io.kvpool.connector.ConnectorRequest;
import io.kvpool.connector.hash.BlockHash;
import io.kvpool.connector.hash.BlockHasher;
import io.kvpool.connector.hash.KeyFormat;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.List;

/** Reads cases (JSON-free, tab-separated) from stdin; prints the root and every block key. */
public class JavaHashes {
    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] f = line.split("\t", -1);  // seed, block size, salt, model, weights, dtype, tokens
            BlockHasher h = new BlockHasher(Integer.parseInt(f[1]), f[0]);
            String salt = f[2].isEmpty() ? null : f[2];
            KeyFormat k = KeyFormat.of(f[3], f[4], f[5]);
            String[] ts = f[6].isEmpty() ? new String[0] : f[6].split(",");
            int[] tokens = new int[ts.length];
            for (int i = 0; i < ts.length; i++) tokens[i] = Integer.parseInt(ts[i]);
            List<BlockHash> hs = h.hashes(tokens, tokens.length, b -> ConnectorRequest.extraKeysFor(null, salt, b));
            StringBuilder out = new StringBuilder(h.root().hex());
            for (BlockHash b : hs) out.append(' ').append(k.keyString(b));
            System.out.println(out);
        }
    }
}
"""


def test_java_and_python_hash_and_key_alike(pool: Any, tmp_path: Path) -> None:
    src = tmp_path / "JavaHashes.java"
    src.write_text(JAVA_HASHER)
    rnd = random.Random(7)
    cases = []
    for i in range(40):
        seed = rnd.choice(["0", "42", "", "s\u00e9ed-\u4e2d", str(rnd.randrange(2**32))])
        bs = rnd.choice([1, 4, 16, 32])
        salt = rnd.choice(["", "salt-a", "\u00fcber salt"])
        model = rnd.choice([MODEL, "meta-llama/Llama-3.1-8B", "m\u00f6del with spaces"])
        weights = rnd.choice(["v1", "step-1200", "sha/256"])
        dtype = rnd.choice(["f32", "bf16"])
        tokens = [rnd.randrange(0, 2**31 - 1) if i % 5 == 0 else rnd.randrange(0, 300) for _ in range(rnd.randrange(0, 130))]
        cases.append((seed, bs, salt, model, weights, dtype, tokens))
    stdin = "".join("\t".join([s, str(b), salt, m, w, d, ",".join(map(str, t))]) + "\n"
                    for s, b, salt, m, w, d, t in cases)
    out = subprocess.run([str(pool.java), "-cp", str(pool.jar), str(src)], input=stdin, capture_output=True,
                         text=True, timeout=180, encoding="utf-8")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == len(cases)
    for (seed, bs, salt, model, weights, dtype, tokens), line in zip(cases, lines):
        h = BlockHasher(bs, seed)
        k = KeyFormat(model, weights, dtype)
        hashes = h.hashes(tokens, extra_keys=lambda b: extra_keys_for(None, salt or None, b))
        assert line.split(" ") == [h.root.hex()] + k.keys(hashes)


class JavaEngine:
    """`kvpool engine --model tiny --master ...` on a free port (``extra``: more flags, e.g.
    ``--kv-granularity layer``). stop() ends it with SIGTERM, whose shutdown hook closes the engine, which
    waits for the connector's saves: after stop() every save the engine made is in the pool."""

    def __init__(self, pool: Any, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [str(pool.java), "--enable-native-access=ALL-UNNAMED", "-jar", str(pool.jar), "engine",
             "--master", pool.master, "--model", "tiny", "--port", "0", "--kv-blocks", "64", "--hash-seed", "0",
             "--block-size", str(BS), "--weights-version", "v1", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        lines: "queue.Queue[str]" = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=lambda: [lines.put(l) for l in self.proc.stdout] + [lines.put("")],  # type: ignore[union-attr]
                         daemon=True).start()
        while True:
            line = lines.get(timeout=120)
            self.output.append(line)
            assert line, "kvpool engine exited: " + "".join(self.output)
            m = re.search(r"http://[\d.]+:(\d+)/v1/completions", line)
            if m:
                self.url = f"http://127.0.0.1:{m.group(1)}"
                break

    def complete(self, prompt: list[int], max_tokens: int, **kw: Any) -> dict:
        body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **kw}).encode()
        req = urllib.request.Request(self.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture
def java_engine(pool: Any) -> Iterator[Any]:
    started: list[JavaEngine] = []

    def start(*extra: str) -> JavaEngine:
        e = JavaEngine(pool, *extra)
        started.append(e)
        return e
    yield start
    for e in started:
        e.stop()


PROMPT = [256] + [(i * 37 + 11) % 256 for i in range(47)]  # BOS + 47 bytes: 48 tokens, 3 full blocks


def vllm_connectors(pool: Any, tmp_path: Path, **extra: Any) -> tuple[Any, Any]:
    """kvpool.vllm's scheduler and worker connectors for the Java engine's model (vLLM's CPU backend)."""
    from kvpool.vllm import KVConnectorRole, KvPoolConnector
    cfg = SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector_extra_config={
            "master": pool.master, "hash_seed": "0", "model": MODEL, "weights_version": "v1", "kv_layout": "HND",
            "fence_path": str(tmp_path / "fence"), "wait_for_save": True, **extra}),
        cache_config=SimpleNamespace(block_size=BS, cache_dtype="auto"),
        model_config=SimpleNamespace(model=MODEL, dtype="float32"),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1))
    return KvPoolConnector(cfg, KVConnectorRole.SCHEDULER), KvPoolConnector(cfg, KVConnectorRole.WORKER)


def save_prompt(pc: PoolConnector, kv: PagedKvCache, blocks: list[int]) -> None:
    """Empties the pool (the connector's reset), then has the connector save PROMPT's three full blocks
    from ``blocks`` of ``kv``, every layer saved in turn, and waits for the saves."""
    assert pc.reset_cache().success
    w = ConnectorRequest("py-save", PROMPT)
    pc.update_state_after_alloc(w, blocks, 0)
    pc.start_load_kv(pc.build_connector_meta([ScheduledRequest(w, blocks, 0, 48)]), kv)
    for layer in range(LAYERS):
        pc.save_kv_layer(layer, kv)
    pc.wait_for_save()


def plan_hit(sched: Any, table: list[int]) -> Any:
    """The scheduler's metadata of a step that takes PROMPT's 48 tokens from the pool into ``table``
    and computes one more."""
    req = SimpleNamespace(request_id="v", all_token_ids=PROMPT + [65], num_tokens=49, prompt_token_ids=PROMPT + [65],
                          cache_salt=None, lora_request=None, mm_features=[], prompt_embeds=None)
    assert sched.get_num_new_matched_tokens(req, 0) == (48, False)
    sched.update_state_after_alloc(req, table, 48)
    return sched.build_connector_meta(SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id="v", block_ids=(table,), num_computed_tokens=48)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], resumed_req_ids=set(), new_block_ids=[],
                                              num_computed_tokens=[]),
        num_scheduled_tokens={"v": 1}))


def test_java_saved_kv_loads_byte_identical_and_serves_java_again(pool: Any, client: kvpool.Client,
                                                                 java_engine: Any, tmp_path: Path) -> None:
    # 1. the Java engine computes the prompt and saves its 3 full blocks
    e1 = java_engine()
    first = e1.complete(PROMPT, 8)
    assert first["kvpool"]["external_hit_tokens"] == 0
    salted = e1.complete(PROMPT, 1, cache_salt="salt-a")
    e1.stop()

    # 2. Python computes the same keys: the pool has every full block under them
    hasher, keys = BlockHasher(BS, "0"), KeyFormat(MODEL, "v1", "f32")
    names = keys.keys(hasher.hashes(PROMPT))
    assert len(names) == 3 and client.prefix_match(names) == 3
    salted_names = keys.keys(hasher.hashes(PROMPT, extra_keys=lambda b: extra_keys_for(None, "salt-a", b)))
    assert client.prefix_match(salted_names) == 3 and set(salted_names).isdisjoint(names)
    stored = [client.get(k) for k in names]
    block_bytes = LAYERS * 2 * BS * KV_HEADS * HEAD_DIM * 4
    assert [len(b) for b in stored] == [block_bytes] * 3

    # 3. the Python connector loads them into its paged cache: the bytes Java stored, in Java's layout
    pc = PoolConnector(client, hasher, keys)
    kv = PagedKvCache(16, LAYERS, BS, KV_HEADS, HEAD_DIM)
    kv.data.fill(np.nan)
    r = ConnectorRequest("py", PROMPT + [65])
    m = pc.get_num_new_matched_tokens(r, 0)
    assert m.tokens == 48
    table = [9, 4, 12, 1]
    pc.update_state_after_alloc(r, table, m.tokens)
    meta = pc.build_connector_meta([ScheduledRequest(r, table, 48, 49)])
    pc.start_load_kv(meta, kv)
    pc.wait_for_layer_load(0)
    assert pc.block_ids_with_load_errors() == set()
    for i, b in enumerate(table[:3]):
        assert kv.block(b).tobytes() == stored[i]
    # the layout's meaning: layer l's K of token t, head h is at Java's KvBlocks offset
    raw = np.frombuffer(stored[1], dtype="<f4").reshape(LAYERS, 2, BS, KV_HEADS, HEAD_DIM)
    assert np.array_equal(kv.layer(1)[0, 4, 5], raw[1, 0, 5]) and np.array_equal(kv.layer_hnd(0)[1, 4, :, 7], raw[0, 1, 7])
    assert np.isfinite(kv.data[table[:3]]).all()

    # 4. the same blocks through the vLLM connector into CPU-backend per-layer caches
    torch = pytest.importorskip("torch")
    sched, worker = vllm_connectors(pool, tmp_path)
    try:
        layers = {f"model.layers.{i}.self_attn.attn": torch.zeros(2, 16, KV_HEADS, BS, HEAD_DIM) for i in range(LAYERS)}
        worker.register_kv_caches(layers)
        worker.bind_connector_metadata(plan_hit(sched, table))
        worker.start_load_kv(None)
        worker.wait_for_layer_load("model.layers.0.self_attn.attn")
        assert worker.get_block_ids_with_load_errors() == set()
        for li, t in enumerate(layers.values()):
            assert torch.equal(t[:, table[:3]], torch.from_numpy(np.ascontiguousarray(kv.layer_hnd(li)[:, table[:3]])))
    finally:
        worker.shutdown()
        sched.shutdown()

    # 5. the pool is emptied; Python saves the blocks from its cache under the same keys
    save_prompt(pc, kv, table[:3])
    assert pc.saved_blocks == 3 and client.prefix_match(names) == 3
    assert [client.get(k) for k in names] == stored
    pc.close()

    # 6. a fresh Java engine (empty local cache) takes Python's blocks and generates the same tokens
    e2 = java_engine()
    second = e2.complete(PROMPT, 8)
    e2.stop()
    assert second["kvpool"]["external_hit_tokens"] == 32  # the engine computes the last block itself
    assert second["kvpool"]["recomputed_tokens"] == 0
    assert second["choices"][0]["token_ids"] == first["choices"][0]["token_ids"]
    assert salted["kvpool"]["external_hit_tokens"] == 0

    # 7. control: the same values in vLLM's CPU (HND) order instead of the pool's (NHD) change the
    # output, so step 6 really depends on the layout being right (the engine is deterministic)
    assert client.remove_all(force=True) >= 3
    for k, s in zip(names, stored):
        hnd = np.frombuffer(s, dtype="<f4").reshape(LAYERS, 2, BS, KV_HEADS, HEAD_DIM).transpose(0, 1, 3, 2, 4)
        assert client.put(k, np.ascontiguousarray(hnd)) == kvpool.PutStatus.OK
    e3 = java_engine()
    third = e3.complete(PROMPT, 8)
    e3.stop()
    assert third["kvpool"]["external_hit_tokens"] == 32
    assert third["choices"][0]["token_ids"] != first["choices"][0]["token_ids"]


def java_saves_prompt(java_engine: Any, client: kvpool.Client) -> tuple[Any, BlockHasher, KeyFormat, list[str],
                                                                      list[bytes]]:
    """A Java engine computes PROMPT and saves its three full blocks: its completion, the hasher and key format
    Python spells the blocks' keys with, the keys, and the stored bytes."""
    e1 = java_engine()
    first = e1.complete(PROMPT, 8)
    e1.stop()
    hasher, keys = BlockHasher(BS, "0"), KeyFormat(MODEL, "v1", "f32")
    names = keys.keys(hasher.hashes(PROMPT))
    stored = [client.get(k) for k in names]
    assert len(stored) == 3 and all(stored)
    return first, hasher, keys, names, stored


def test_layer_by_layer_reads_and_writes_the_same_bytes_as_whole_blocks_across_languages(
        pool: Any, client: kvpool.Client, java_engine: Any, tmp_path: Path) -> None:
    """The Java engine saves whole blocks; the Python connector loads them layer by layer byte for byte
    (into its paged cache, and through kvpool.vllm's ``layerwise`` into per-layer caches); it saves them
    back layer by layer, and Java engines moving whole blocks and moving layers take them as hits and
    generate what they generated computing everything."""
    first, hasher, keys, names, stored = java_saves_prompt(java_engine, client)

    pc = PoolConnector(client, hasher, keys, granularity="layer")
    kv = PagedKvCache(16, LAYERS, BS, KV_HEADS, HEAD_DIM)
    kv.data.fill(np.nan)
    r = ConnectorRequest("py", PROMPT + [65])
    table = [9, 4, 12, 1]
    pc.update_state_after_alloc(r, table, pc.get_num_new_matched_tokens(r, 0).tokens)
    pc.start_load_kv(pc.build_connector_meta([ScheduledRequest(r, table, 48, 49)]), kv)
    for layer in range(LAYERS):
        pc.wait_for_layer_load(layer)
    assert pc.block_ids_with_load_errors() == set()
    assert [kv.block(b).tobytes() for b in table[:3]] == stored

    torch = pytest.importorskip("torch")
    sched, worker = vllm_connectors(pool, tmp_path, layerwise=True)
    try:
        assert worker.connector.granularity == "layer" and not worker.prefer_cross_layer_blocks
        # handed in another order than the model's: layer i of a block is still model layer i
        caches = {f"model.layers.{i}.self_attn.attn": torch.zeros(2, 16, KV_HEADS, BS, HEAD_DIM)
                  for i in reversed(range(LAYERS))}
        worker.register_kv_caches(caches)
        worker.bind_connector_metadata(plan_hit(sched, table))
        worker.start_load_kv(None)
        for li in range(LAYERS):
            name = f"model.layers.{li}.self_attn.attn"
            worker.wait_for_layer_load(name)
            assert torch.equal(caches[name][:, table[:3]],
                               torch.from_numpy(np.ascontiguousarray(kv.layer_hnd(li)[:, table[:3]])))
        worker.wait_for_save()
        assert worker.get_block_ids_with_load_errors() == set()
    finally:
        worker.shutdown()
        sched.shutdown()

    # the pool emptied, Python saves the blocks back layer by layer: the bytes Java stored
    save_prompt(pc, kv, table[:3])
    pc.close()
    assert pc.saved_blocks == 3 and [client.get(k) for k in names] == stored

    # Java engines, whole blocks and layer by layer, take them as hits and generate the same tokens
    for extra in ((), ("--kv-granularity", "layer")):
        e = java_engine(*extra)
        again = e.complete(PROMPT, 8)
        e.stop()
        assert again["kvpool"]["external_hit_tokens"] == 32 and again["kvpool"]["recomputed_tokens"] == 0, extra
        assert again["choices"][0]["token_ids"] == first["choices"][0]["token_ids"], extra


def gpu_layout_caches(torch: Any, order: tuple, blocks: int = 16) -> dict[str, Any]:
    """Per-layer ``[B, H, N, C]`` float32 views of one flat buffer in a vLLM 0.32 GPU ``KVCacheLayout`` (``order``:
    the logical axes ``[L, B, H, N, C]`` outermost first), C holding each cell's K then V, as FlashAttention
    reads them."""
    shape = (LAYERS, blocks, KV_HEADS, BS, 2 * HEAD_DIM)
    strides = [0] * 5
    step = 1
    for dim in reversed(order):
        strides[dim] = step
        step *= shape[dim]
    view = torch.as_strided(torch.full((step,), float("nan")), shape, strides)
    return {f"model.layers.{i}.self_attn.attn": view[i] for i in range(LAYERS)}


def attention_config(blocks: int = 16) -> Any:
    """A ``KVCacheConfig``-shaped object for the tiny model's one full-attention group (what vLLM hands a
    worker connector; the peer suite hands the real one)."""
    spec = SimpleNamespace(block_size=BS, num_kv_heads=KV_HEADS, head_size=HEAD_DIM, head_size_v=HEAD_DIM,
                           num_heads=KV_HEADS, num_states=BS, state_content_bytes=None,
                           state_content_size_bytes=2 * HEAD_DIM * 4)
    group = SimpleNamespace(layer_names=[f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)],
                            kv_cache_spec=spec, enable_kv_transfer=True)
    return SimpleNamespace(num_blocks=blocks, kv_cache_groups=[group], kv_cache_layout=None)


@pytest.mark.parametrize("order", [(1, 0, 3, 2, 4), (0, 1, 2, 3, 4)], ids=["BLNHC", "LBHNC"])
def test_a_gpu_layout_cache_takes_java_blocks_and_gives_java_them_back(pool: Any, client: kvpool.Client,
                                                                       java_engine: Any, tmp_path: Path,
                                                                       order: tuple) -> None:
    """kvpool.vllm over a GPU backend's cache layout (the device edge's CPU implementation) loads the blocks the
    Java engine saved, each K and V where FlashAttention reads them; saves them back byte for byte; and a fresh
    Java engine takes them as hits and generates what it generated computing everything."""
    torch = pytest.importorskip("torch")
    from kvpool.vllm import KVConnectorRole, KvPoolConnector
    first, hasher, keys, names, stored = java_saves_prompt(java_engine, client)

    sched, _ = vllm_connectors(pool, tmp_path)
    cfg = SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector_extra_config={
            "master": pool.master, "hash_seed": "0", "model": MODEL, "weights_version": "v1", "device_edge": "cpu",
            "fence_path": str(tmp_path / "fence"), "wait_for_save": True}),
        cache_config=SimpleNamespace(block_size=BS, cache_dtype="auto"),
        model_config=SimpleNamespace(model=MODEL, dtype="float32"),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1))
    worker = KvPoolConnector(cfg, KVConnectorRole.WORKER, attention_config())
    table = [9, 4, 12, 1]
    try:
        caches = gpu_layout_caches(torch, order)
        worker.register_kv_caches(caches)
        assert type(worker.kv).__name__ == "DeviceKv"
        worker.bind_connector_metadata(plan_hit(sched, table))
        worker.start_load_kv(None)
        worker.wait_for_layer_load("model.layers.0.self_attn.attn")
        worker.wait_for_save()
        assert worker.get_block_ids_with_load_errors() == set()
        for i, b in enumerate(table[:3]):
            raw = np.frombuffer(stored[i], dtype="<f4").reshape(LAYERS, 2, BS, KV_HEADS, HEAD_DIM)
            for li, t in enumerate(caches.values()):
                k, v = t[b].transpose(0, 1).split(HEAD_DIM, dim=-1)  # FlashAttention's split: (N, H, D) each
                assert np.array_equal(k.numpy(), raw[li, 0]) and np.array_equal(v.numpy(), raw[li, 1])

        # the pool emptied, the device cache saves the blocks back: the bytes Java stored
        assert client.remove_all(force=True) >= 3
        saved = worker.kv.save_sources(table[:3])
        assert [bytes(kvpool.buffers.as_memoryview(s)) for s in saved] == stored
        pc = PoolConnector(client, hasher, keys)
        save_prompt(pc, worker.kv, table[:3])
        pc.close()
        assert pc.saved_blocks == 3 and [client.get(k) for k in names] == stored
    finally:
        worker.shutdown()
        sched.shutdown()

    e2 = java_engine()
    again = e2.complete(PROMPT, 8)
    e2.stop()
    assert again["kvpool"]["external_hit_tokens"] == 32 and again["kvpool"]["recomputed_tokens"] == 0
    assert again["choices"][0]["token_ids"] == first["choices"][0]["token_ids"]
