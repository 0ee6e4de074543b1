"""One vLLM engine (``vllm.LLM`` on CPU) in a process of its own, for the inference tests: greedy
generation of the given prompts, with or without kvpool as the KV connector, then optionally
``reset_prefix_cache(reset_connector=True)``. Prints one JSON line (prefixed ``RESULT ``): the
generated token ids, the time to the first token of each prompt (a ``max_tokens=1`` generation,
timed), the connector's counters on both sides, and how the worker's connector moves KV
(``granularity``: ``block`` or ``layer``).

The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the scheduler-side
connector is reachable (``llm.llm_engine.engine_core.engine_core.scheduler.connector``) next to the
worker-side one (``get_kv_transfer_group()``).

Usage: ``python run_llm.py '<json spec>'`` with keys ``model``, ``prompts``, ``max_tokens``,
``kv_extra`` (null: no connector), ``reset`` (bool), and optionally:

* ``llm``: keyword arguments of ``vllm.LLM`` over the defaults below (``max_model_len``, ``block_size``,
  ``dtype``, ``max_num_seqs``, ``max_num_batched_tokens``, ...);
* ``warmup``: prompts generated (one token each) before the timed ones; the connector's counters
  after them are in the result as ``worker_after_warmup`` / ``scheduler_after_warmup``;
* ``force_avx2`` (bool): run vLLM's AVX2 kernels on a machine with AVX-512. vLLM's CPU platform picks
  its kernel library when it imports it (``CpuPlatform.import_kernels``: ``vllm._C`` for AVX-512 with
  BF16, ``vllm._C_AVX512``, or ``vllm._C_AVX2`` when ``torch.cpu._is_avx512_supported()`` is false),
  and other places ask the same ``torch.cpu._is_avx512*`` / ``_is_amx*`` probes; they all answer
  false here, before vLLM is imported. ``ATEN_CPU_CAPABILITY=avx2`` keeps torch's own kernels at
  AVX2 and ``ONEDNN_MAX_CPU_ISA=AVX2`` oneDNN's (the GEMMs). Only this process is patched: the engine
  core must run in it (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as here).

The result always names the vLLM kernel libraries mapped into the process (``kernel_libs``, from
``/proc/self/maps``) and torch's CPU capability (``cpu_capability``).
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


def force_avx2() -> None:
    """Makes this process look like an AVX2-only CPU to torch, oneDNN and vLLM (before they load)."""
    assert "vllm" not in sys.modules, "force_avx2 must run before vLLM is imported"
    os.environ["ATEN_CPU_CAPABILITY"] = "avx2"
    os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    import torch
    for name in dir(torch.cpu):
        if name.startswith(("_is_avx512", "_is_amx", "_is_vnni")):
            setattr(torch.cpu, name, lambda: False)


def kernel_libs() -> list[str]:
    """The file names of vLLM's kernel libraries (``vllm/_C*.so``) mapped into this process."""
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if "/vllm/_C" in path and path.endswith(".so"):
                libs.add(os.path.basename(path))
    return sorted(libs)


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec.get("force_avx2"):
        force_avx2()
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    kw = {}
    if spec.get("kv_extra") is not None:
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="KvPoolConnector", kv_connector_module_path="kvpool.vllm", kv_role="kv_both",
            kv_load_failure_policy="recompute", kv_connector_extra_config=spec["kv_extra"])
    args = dict(enforce_eager=True, max_model_len=512, block_size=32, dtype="float32", max_num_seqs=4, seed=0)
    args.update(spec.get("llm") or {})
    llm = LLM(model=spec["model"], **args, **kw)
    greedy = SamplingParams(max_tokens=int(spec.get("max_tokens", 8)), temperature=0.0, ignore_eos=True)
    first = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    result: dict = {}
    if spec.get("warmup"):
        for p in spec["warmup"]:
            llm.generate([p], first, use_tqdm=False)
        if "kv_transfer_config" in kw:
            result["worker_after_warmup"], result["scheduler_after_warmup"] = connector_stats(llm)
    ttft = []
    tokens = []
    for p in spec["prompts"]:
        t0 = time.perf_counter()
        llm.generate([p], first, use_tqdm=False)  # the prefill and one token: time to first token
        ttft.append(time.perf_counter() - t0)
        out = llm.generate([p], greedy, use_tqdm=False)  # the engine's own prefix cache serves this prefill
        tokens.append(list(out[0].outputs[0].token_ids))
    result.update(tokens=tokens, ttft=ttft)
    if "kv_transfer_config" in kw:
        from vllm.distributed.kv_transfer import get_kv_transfer_group
        worker = get_kv_transfer_group()
        sched = llm.llm_engine.engine_core.engine_core.scheduler.connector
        result["worker"], result["scheduler"] = connector_stats(llm)
        result["connector_classes"] = [type(worker).__module__ + "." + type(worker).__name__,
                                       type(sched).__module__ + "." + type(sched).__name__]
        result["granularity"] = worker.connector.granularity
    if spec.get("reset"):
        result["reset"] = bool(llm.reset_prefix_cache(reset_connector=True))
        result["scheduler_after_reset"] = dataclasses.asdict(
            llm.llm_engine.engine_core.engine_core.scheduler.connector.stats())
    import torch
    result["kernel_libs"] = kernel_libs()
    result["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    print("RESULT " + json.dumps(result), flush=True)


def connector_stats(llm: object) -> tuple[dict, dict]:
    """The worker-side and scheduler-side connectors' counters (after the worker's saves are stored)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group
    worker = get_kv_transfer_group()
    sched = llm.llm_engine.engine_core.engine_core.scheduler.connector  # type: ignore[attr-defined]
    worker.wait_for_save() if hasattr(worker, "wait_for_save") else None
    pool_connector = getattr(worker, "connector", None)  # kvpool's PoolConnector: also background saves
    pool_connector.wait_for_save() if hasattr(pool_connector, "wait_for_save") else None
    return dataclasses.asdict(worker.stats()), dataclasses.asdict(sched.stats())


if __name__ == "__main__":
    main()
