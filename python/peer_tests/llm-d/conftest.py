"""Fixtures of the llm-d peer's suite (llmd_support.py says what runs): ``fleet``, once per session, two kvpool pools
with KV events on (``ssd`` with the SSD tier, ``mem`` without) and llm-d's indexer (llmd-harness, by PID)
subscribed to both; ``llmd``, the same on empty pools, checking after each test that llm-d parsed every message.

Run with the interpreter of the llm-d peer's venv, which ``scripts/peers.sh install llm-d`` builds with the
harness (``./kvpool test-peers llm-d`` does both).
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from llmd_support import MODEL, EventsPool, Fleet, Harness, until


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    ssd = mem = llmd = None
    try:
        ssd = EventsPool("ssd", tmp_path_factory.mktemp("llmd-ssd-disk"))
        mem = EventsPool("mem", None)
        llmd = Harness([ssd.pub, mem.pub], tmp_path_factory.mktemp("llmd-harness") / "llmd-harness.log")
        # ZMQ's slow joiner: probe each pool until llm-d's subscriber has heard a message under its topic
        for pool in (ssd, mem):
            with pool.client() as c:
                i = 0
                def heard() -> tuple[bool, Any]:
                    nonlocal i
                    c.put(f"probe/{i}", b"x" * 8)
                    c.remove(f"probe/{i}")
                    i += 1
                    s = llmd.stats()
                    return pool.pod in s["pods"], s
                until(f"llm-d's subscriber hears {pool.name}", heard)
        yield Fleet(ssd, mem, llmd)
    finally:
        for x in (llmd, ssd.pool if ssd else None, mem.pool if mem else None):
            if x is not None:
                x.stop()


@pytest.fixture
def llmd(fleet: Fleet) -> Iterator[Fleet]:
    """The fleet on empty pools; after the test, llm-d must have parsed every message."""
    for pool in (fleet.ssd, fleet.mem):
        with pool.client() as c:
            c.remove_all(force=True)
    yield fleet
    s = fleet.llmd.stats()
    assert s["parse_errors"] == 0, f"llm-d could not parse {s['parse_errors']} messages: {s['last_error']}"
    assert set(s["models"]) <= {MODEL}, s["models"]
