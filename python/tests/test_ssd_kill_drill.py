"""The SSD-tier node kill drill (scripts/ssd-kill-drill.py, issue 32) at a size for the suite: a node with a
small memory segment and an SSD tier holds objects in both tiers, is killed with SIGKILL while idle and
started again on its address with its disk directory; every object reads back byte-exact at once, after a
second pass of reads (which promotes objects back to memory and evicts others to disk), and after it
settles. Before issue 32, objects near the end of a log file that a compaction had copied became
unreadable for good, and an object caught between the tiers could be dropped from both. Until 2026-11-29 a
spill was a miss until the disk had it: promotions during a pass evict the objects the pass reads next, and
with 8 MiB of memory half the runs missed one or two of them."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ssd-kill-drill.py"


def _drill():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("ssd_kill_drill", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ssd_kill_drill"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(sys.platform != "linux", reason="needs /dev/shm and SIGKILL semantics of Linux")
def test_a_node_with_an_ssd_tier_keeps_every_object_through_a_kill(capsys: pytest.CaptureFixture[str]) -> None:
    drill = _drill()
    args = argparse.Namespace(objects=96, memory="8MiB", disk="512MiB", no_kill=False)
    kept = drill.run(args, 1)
    out = capsys.readouterr().out
    assert kept, out
