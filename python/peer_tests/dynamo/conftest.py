"""Fixtures of the Dynamo peer tests: a kvpool pool (master and node by PID) that publishes KV events, and Dynamo's
standalone KV indexer (dynamo_indexer.py) registered to the pool's PUB and replay sockets as one worker, as it
would register a vLLM engine; ``dynamo`` (dynamo_pool.py) is one test's view of both, on an empty pool.

Run with the interpreter of the dynamo peer's venv (``scripts/peers.sh install dynamo``; ai-dynamo-runtime 1.6.1).
The parent conftest gives ``kvpool_pools`` and turns skips into failures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

try:
    from dynamo.llm import run_kv_indexer  # noqa: F401
except ImportError as e:  # the wrong interpreter: say which one to use
    raise ImportError(f"the Dynamo peer tests need ai-dynamo-runtime ({e}); run them with the interpreter "
                      "`scripts/peers.sh python dynamo` prints (./kvpool test-peers dynamo installs it)") from e

import kvpool  # noqa: E402
from kvpool_pools import Pool, free_port  # noqa: E402

from dynamo_indexer import DynamoIndexer, until  # noqa: E402
from dynamo_pool import BLOCK, MODEL, WORKER, Dynamo  # noqa: E402


class EventsPool:
    """A pool with KV events on and an SSD tier (an 8 MiB segment, so that 256 KiB values spill). Only a put that
    finds no room evicts (high watermark 1.0: no timer round moves blocks to the SSD after the last put), so that
    the pool's media stay put while a test compares them with Dynamo's tiers."""

    def __init__(self, disk: Path) -> None:
        self.pub = f"tcp://127.0.0.1:{free_port()}"
        self.replay = f"tcp://127.0.0.1:{free_port()}"
        self.pool = Pool(segment_size="8MiB", extra=[
            "--kv-events-endpoint", self.pub, "--kv-events-replay-endpoint", self.replay,
            "--kv-events-topic", f"kv@kvpool@{MODEL}",
            "--disk-dir", str(disk), "--disk-size", "128MiB", "--promote-after", "0",
            "--eviction-high-watermark", "1.0"])
        self.master = self.pool.master


@pytest.fixture(scope="session")
def events_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EventsPool]:
    p = EventsPool(tmp_path_factory.mktemp("dynamo-kv-events-disk"))
    try:
        yield p
    finally:
        p.pool.stop()


@pytest.fixture(scope="session")
def indexer(events_pool: EventsPool, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DynamoIndexer]:
    """Dynamo's indexer with the pool registered as worker ``WORKER`` (its PUB and its replay ROUTER)."""
    ix = DynamoIndexer(tmp_path_factory.mktemp("dynamo-indexer") / "indexer.log")
    try:
        ix.register(WORKER, events_pool.pub, events_pool.replay, MODEL, BLOCK)
        until("the indexer lists the pool's listener as active",
              lambda: [w["listeners"]["0"]["status"] for w in ix.workers() if w["instance_id"] == WORKER]
              == ["active"], lambda: f"{ix.workers()} {ix.tail()}")
        yield ix
    finally:
        ix.stop()


@pytest.fixture
def dynamo(events_pool: EventsPool, indexer: DynamoIndexer) -> Iterator[Dynamo]:
    """An empty pool, and an indexer that has heard everything before (ZMQ's slow joiner: the first probe waits
    until the indexer's subscription is through) and knows no block."""
    with kvpool.Client(events_pool.master) as c:
        c.remove_all(force=True)
        d = Dynamo(c, indexer)
        d.settle()
        assert d.tiers() == {}, "Dynamo knows no block of an empty pool"
        yield d
