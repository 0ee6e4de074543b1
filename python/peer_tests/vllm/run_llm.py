"""One vLLM engine (``vllm.LLM`` on CPU) in a process of its own, for the inference tests: greedy
generation of the given prompts, with or without kvpool as the KV connector, then optionally
``reset_prefix_cache(reset_connector=True)``. Prints one JSON line (prefixed ``RESULT ``): the
generated token ids, the time to the first token of each prompt (a ``max_tokens=1`` generation,
timed), and the connector's counters on both sides.

The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the scheduler-side
connector is reachable (``llm.llm_engine.engine_core.engine_core.scheduler.connector``) next to the
worker-side one (``get_kv_transfer_group()``).

Usage: ``python run_llm.py '<json spec>'`` with keys ``model``, ``prompts``, ``max_tokens``,
``kv_extra`` (null: no connector), ``reset`` (bool).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")


def main() -> None:
    spec = json.loads(sys.argv[1])
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    kw = {}
    if spec.get("kv_extra") is not None:
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="KvPoolConnector", kv_connector_module_path="kvpool.vllm", kv_role="kv_both",
            kv_load_failure_policy="recompute", kv_connector_extra_config=spec["kv_extra"])
    llm = LLM(model=spec["model"], enforce_eager=True, max_model_len=512, block_size=32, dtype="float32",
              max_num_seqs=4, seed=0, **kw)
    greedy = SamplingParams(max_tokens=int(spec.get("max_tokens", 8)), temperature=0.0, ignore_eos=True)
    first = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    ttft = []
    tokens = []
    for p in spec["prompts"]:
        t0 = time.perf_counter()
        llm.generate([p], first, use_tqdm=False)  # the prefill and one token: time to first token
        ttft.append(time.perf_counter() - t0)
        out = llm.generate([p], greedy, use_tqdm=False)  # the engine's own prefix cache serves this prefill
        tokens.append(list(out[0].outputs[0].token_ids))
    result: dict = {"tokens": tokens, "ttft": ttft}
    if "kv_transfer_config" in kw:
        from vllm.distributed.kv_transfer import get_kv_transfer_group
        worker = get_kv_transfer_group()
        sched = llm.llm_engine.engine_core.engine_core.scheduler.connector
        worker.wait_for_save() if hasattr(worker, "wait_for_save") else None
        result["worker"] = dataclasses.asdict(worker.stats())
        result["scheduler"] = dataclasses.asdict(sched.stats())
        result["connector_classes"] = [type(worker).__module__ + "." + type(worker).__name__,
                                       type(sched).__module__ + "." + type(sched).__name__]
    if spec.get("reset"):
        result["reset"] = bool(llm.reset_prefix_cache(reset_connector=True))
        result["scheduler_after_reset"] = dataclasses.asdict(
            llm.llm_engine.engine_core.engine_core.scheduler.connector.stats())
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
