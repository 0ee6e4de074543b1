"""Real inference with vLLM's CPU build and kvpool as its KV connector: a tiny Llama with random
weights made by the test (tiny_llama.py), served by ``vllm.LLM`` in processes of their own
(run_llm.py), one after another, sharing one kvpool pool.

* a first engine fills the pool; a second engine's prefill of the same prompts loads from it;
* greedy tokens are identical with and without the pool;
* time to first token with and without a pool hit is measured and printed (a benchmark, not asserted);
* a weight update (``reset_prefix_cache(reset_connector=True)``, then new weights under a new
  ``weights_version``) leaves no pre-update KV readable: the pool is empty and the new engine loads
  nothing;
* engines moving KV layer by layer (``layerwise: true``) save and load it inside vLLM's forward pass,
  and share it with engines moving whole blocks, both ways, with the same greedy tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import kvpool
import tiny_llama
from kvpool_peers import bench_vllm

PROMPTS = [tiny_llama.words(200, start=0), tiny_llama.words(150, start=300)]
# full blocks of the prompts (+1: the BOS token); neither length ends on a block boundary, so every full
# block lies before the prompt's last token (which vLLM always computes) and can come from the pool
BLOCKS = sum((len(p.split()) + 1) // 32 for p in PROMPTS)


def run_engine(spec: dict[str, Any]) -> dict[str, Any]:
    return bench_vllm.run_engine(spec, timeout=300)


@pytest.fixture(scope="module")
def new_weights_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama.build(tmp_path_factory.mktemp("tiny-llama-v2") / "model", seed=1)


def test_two_engines_share_prefill_through_the_pool_and_a_weight_update_fences_it(
        tiny_llama_dir: Path, new_weights_dir: Path, kvpool_extra: dict, kvpool_pool: Any) -> None:
    model = str(tiny_llama_dir)
    extra = dict(kvpool_extra, wait_for_save=True)
    extra.pop("fence_path")  # engines in different processes share the default fence file
    base = run_engine({"model": model, "prompts": PROMPTS, "kv_extra": None})
    first = run_engine({"model": model, "prompts": PROMPTS, "kv_extra": extra})
    assert first["connector_classes"] == ["kvpool.vllm.KvPoolConnector"] * 2
    assert first["worker"]["loaded_blocks"] == 0 and first["worker"]["saved_blocks"] >= BLOCKS
    second = run_engine({"model": model, "prompts": PROMPTS, "kv_extra": extra, "reset": True})
    # the second engine's prefills came from the pool, and it generated what an engine without the pool does
    assert second["worker"]["loaded_blocks"] == BLOCKS and second["worker"]["failed_loads"] == 0
    assert second["scheduler"]["matched_tokens"] == BLOCKS * 32
    assert base["tokens"] == first["tokens"] == second["tokens"]
    print(f"\nTTFT (s) per prompt ({[len(p.split()) + 1 for p in PROMPTS]} tokens): without the pool "
          f"{['%.4f' % t for t in base['ttft']]}, first engine (saving) {['%.4f' % t for t in first['ttft']]}, "
          f"second engine (pool hit) {['%.4f' % t for t in second['ttft']]}")
    # the weight update: the second engine reset its connector, which emptied the pool
    assert second["reset"] is True and second["scheduler_after_reset"]["resets"] == 1
    with kvpool.Client(kvpool_pool.master) as c:
        assert c.remove_all(force=True) == 0  # nothing was left to remove
    # an engine with the new weights under a new weights_version reads nothing of the old KV
    base2 = run_engine({"model": str(new_weights_dir), "prompts": PROMPTS, "kv_extra": None})
    after = run_engine({"model": str(new_weights_dir), "prompts": PROMPTS,
                        "kv_extra": dict(extra, weights_version="v2")})
    assert after["worker"]["loaded_blocks"] == 0 and after["scheduler"]["matched_tokens"] == 0
    assert after["tokens"] == base2["tokens"] != base["tokens"]


def test_layerwise_engines_save_and_load_inside_the_forward_pass_and_share_with_whole_block_engines(
        tiny_llama_dir: Path, kvpool_extra: dict, kvpool_pool: Any) -> None:
    model = str(tiny_llama_dir)
    whole = dict(kvpool_extra, wait_for_save=True)
    whole.pop("fence_path")  # engines in different processes share the default fence file
    layers = dict(whole, layerwise=True)
    base = run_engine({"model": model, "prompts": PROMPTS, "kv_extra": None})
    # a layerwise engine saves every layer as vLLM computes it; a whole-block engine loads those blocks
    saved = run_engine({"model": model, "prompts": PROMPTS, "kv_extra": layers})
    assert saved["granularity"] == "layer"
    assert saved["worker"]["loaded_blocks"] == 0 and saved["worker"]["saved_blocks"] >= BLOCKS
    assert saved["worker"]["dropped_saves"] == 0
    read = run_engine({"model": model, "prompts": PROMPTS, "kv_extra": whole})
    assert read["granularity"] == "block"
    assert read["worker"]["loaded_blocks"] == BLOCKS and read["worker"]["failed_loads"] == 0
    # and the other way: whole blocks saved, loaded layer by layer
    with kvpool.Client(kvpool_pool.master) as c:
        assert c.remove_all(force=True) >= BLOCKS
    saved_whole = run_engine({"model": model, "prompts": PROMPTS, "kv_extra": whole})
    assert saved_whole["worker"]["saved_blocks"] >= BLOCKS
    read_layers = run_engine({"model": model, "prompts": PROMPTS, "kv_extra": layers})
    assert read_layers["worker"]["loaded_blocks"] == BLOCKS and read_layers["worker"]["failed_loads"] == 0
    assert read_layers["scheduler"]["matched_tokens"] == BLOCKS * 32
    assert base["tokens"] == saved["tokens"] == read["tokens"] == saved_whole["tokens"] == read_layers["tokens"]
