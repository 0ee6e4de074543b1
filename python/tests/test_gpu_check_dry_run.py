"""scripts/gpu-check.sh (the check a GPU machine runs) as a dry run on the device edge's CPU implementation, so
that the script, its device tests and its bench cannot rot between the sessions that have a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import find_java

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_check_runs_on_the_cpu_edge_and_prints_its_table() -> None:
    env = dict(os.environ, PYTHON=sys.executable, KVPOOL_JAVA=str(find_java()), KVPOOL_GPU_BENCH_BLOCKS="4",
               KVPOOL_GPU_BENCH_ROUNDS="1", KVPOOL_GPU_LAYERS_ROUNDS="1")
    out = subprocess.run([str(ROOT / "scripts" / "gpu-check.sh"), "--device", "cpu"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert "gpu-check: passed (cpu)" in text
    for row in ("device -> pinned host, one copy (baseline)", "kvpool save, shared memory", "kvpool load, TCP",
                "step time with a save of 4 blocks beside it", "shm, 16 new tokens", "tcp, 32 new tokens",
                "TTFT whole"):
        assert row in text, row
    assert " failed" not in text and " passed" in text
