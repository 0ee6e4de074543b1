"""vLLM's AVX2 kernels with kvpool as the KV connector, on any x86 machine.

vLLM's CPU build ships three kernel libraries and loads one when it imports its kernels
(``CpuPlatform.import_kernels``): ``vllm/_C`` (AVX-512 with BF16), ``vllm/_C_AVX512`` or
``vllm/_C_AVX2``. A machine with AVX-512 never runs the AVX2 one, the one CPUs without AVX-512 (many CI
runners) get. run_llm.py's ``force_avx2`` makes the engine process see a CPU without AVX-512 or AMX
(torch's probes answer false, ``ATEN_CPU_CAPABILITY=avx2``, ``ONEDNN_MAX_CPU_ISA=AVX2``) before vLLM is
imported, so vLLM itself picks ``_C_AVX2``; the process's ``/proc/self/maps`` shows which library is
mapped, and the test asserts it.

* a first AVX2 engine fills the pool; a second AVX2 engine (a new process) loads every full block of
  the same prompts from it, and both generate the same greedy tokens;
* an engine with this machine's own kernels loads the blocks the AVX2 engine stored (the pool's block
  layout does not depend on the ISA) and generates the same tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tiny_llama
from kvpool_peers import bench_vllm

PROMPTS = [tiny_llama.words(200, start=7), tiny_llama.words(100, start=400)]
# full blocks before each prompt's last token (+1: BOS), the ones a pool hit can serve
BLOCKS = sum((len(p.split()) + 1) // 32 for p in PROMPTS)


def run_engine(spec: dict[str, Any]) -> dict[str, Any]:
    return bench_vllm.run_engine(spec, timeout=300)


def test_avx2_engines_share_prefill_through_the_pool(tiny_llama_dir: Path, kvpool_extra: dict) -> None:
    spec = {"model": str(tiny_llama_dir), "prompts": PROMPTS, "kv_extra": kvpool_extra}
    first = run_engine(dict(spec, force_avx2=True))
    assert first["kernel_libs"] == ["_C_AVX2.abi3.so"] and first["cpu_capability"] == "AVX2"
    assert first["connector_classes"] == ["kvpool.vllm.KvPoolConnector"] * 2
    assert first["worker"]["loaded_blocks"] == 0 and first["worker"]["saved_blocks"] >= BLOCKS
    assert first["worker"]["dropped_saves"] == 0

    second = run_engine(dict(spec, force_avx2=True))
    assert second["kernel_libs"] == ["_C_AVX2.abi3.so"] and second["cpu_capability"] == "AVX2"
    assert second["scheduler"]["matched_tokens"] == BLOCKS * 32
    assert second["worker"]["loaded_blocks"] == BLOCKS and second["worker"]["failed_loads"] == 0
    assert second["tokens"] == first["tokens"]

    # this machine's own kernels (whatever they are) read what the AVX2 engine stored
    native = run_engine(spec)
    assert native["worker"]["loaded_blocks"] == BLOCKS and native["worker"]["failed_loads"] == 0
    assert native["tokens"] == first["tokens"]
    print(f"\nkernels: AVX2 engines {first['kernel_libs']}, native engine {native['kernel_libs']} "
          f"(torch {native['cpu_capability']}); {BLOCKS} blocks from the pool each")
