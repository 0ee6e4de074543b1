"""KV events from the pool, read the way a router reads vLLM's: a kvpool pool (master and node by PID) with
events on, puts and removals through kvpool's Python client under connector keys made from vLLM's own block
hashes, and every payload that arrives (pyzmq SUB) or is replayed (the ROUTER socket) decoded with vLLM's own
``KVEventBatch`` decoder (msgspec, ``vllm.distributed.kv_events``). The hashes a router is told must be the
ones vLLM itself would send for those blocks (``maybe_convert_block_hash``), in medium CPU for memory and
STORAGE for the SSD tier.

Waits poll with generous deadlines; nothing depends on how long anything takes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterator

import msgspec
import pytest
import zmq
from vllm.distributed.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch,
                                        ZmqEventPublisher)
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

import kvpool
from kvpool.connector.keys import KeyFormat
from kvpool_pools import Pool, free_port

TOPIC = "kv@kvpool@tiny-llama"
DEADLINE = 60.0
VALUE = 256 << 10  # 64 of them overflow the 8 MiB segment into the SSD tier
KEYS = KeyFormat("tiny-llama", "v1", "bf16")


class EventsPool:
    """A pool with KV events on: its master, its PUB and replay endpoints."""

    def __init__(self, disk: Path) -> None:
        self.pub = f"tcp://127.0.0.1:{free_port()}"
        self.replay = f"tcp://127.0.0.1:{free_port()}"
        self.pool = Pool(segment_size="8MiB", extra=[
            "--kv-events-endpoint", self.pub, "--kv-events-replay-endpoint", self.replay, "--kv-events-topic", TOPIC,
            "--disk-dir", str(disk), "--disk-size", "128MiB", "--promote-after", "0"])
        self.master = self.pool.master


@pytest.fixture(scope="module")
def events_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EventsPool]:
    p = EventsPool(tmp_path_factory.mktemp("kv-events-disk"))
    try:
        yield p
    finally:
        p.pool.stop()


class Router:
    """A pyzmq subscriber that decodes every batch with vLLM's decoder and keeps a router's view: hash -> media."""

    def __init__(self, ctx: zmq.Context, endpoint: str) -> None:
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
        self.sub.connect(endpoint)
        self.decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self.seqs: list[int] = []
        self.heard: list[Any] = []
        self.view: dict[int, set[str]] = {}

    def pump(self, wait_ms: int = 100) -> bool:
        """Takes in every message that arrived (waiting up to ``wait_ms`` for the first); True if any did."""
        any_ = False
        while self.sub.poll(wait_ms if not any_ else 0):
            topic, seq, payload = self.sub.recv_multipart()
            assert topic == TOPIC.encode()
            s = int.from_bytes(seq, "big")
            if self.seqs:
                assert s == self.seqs[-1] + 1, f"sequence {s} after {self.seqs[-1]}"
            self.seqs.append(s)
            for e in decode(self.decoder, payload):
                self.heard.append(e)
                apply(self.view, e)
            any_ = True
        return any_

    def until(self, what: str, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + DEADLINE
        while not done():
            assert time.monotonic() < deadline, f"timed out waiting until {what}"
            self.pump()


def decode(decoder: msgspec.msgpack.Decoder, payload: bytes) -> list[Any]:
    """vLLM's decoding of one payload, checked the way a router depends on it."""
    batch = decoder.decode(payload)
    assert isinstance(batch, KVEventBatch)
    assert batch.data_parallel_rank is None
    for e in batch.events:
        assert isinstance(e, (BlockStored, BlockRemoved, AllBlocksCleared)), e
        if isinstance(e, BlockStored) and e.block_size == 0:  # a block no connector described
            assert e.parent_block_hash is None and e.token_ids == [] and e.lora_id is None
            assert e.lora_name is None and e.extra_keys is None
        elif isinstance(e, BlockStored):  # described (BLOCK_INFO): a block's tokens each, as vLLM sends them
            assert len(e.token_ids) == e.block_size * len(e.block_hashes), e
        if not isinstance(e, AllBlocksCleared):
            assert e.medium in ("CPU", "STORAGE"), e
            assert all(isinstance(h, int) and 0 <= h < 2 ** 64 for h in e.block_hashes), e
    return list(batch.events)


def apply(view: dict[int, set[str]], e: Any) -> None:
    if isinstance(e, BlockStored):
        for h in e.block_hashes:
            view.setdefault(h, set()).add(e.medium)
    elif isinstance(e, BlockRemoved):
        for h in e.block_hashes:
            view.get(h, set()).discard(e.medium)
            if not view.get(h, True):
                del view[h]
    else:
        view.clear()


@pytest.fixture
def router(events_pool: EventsPool) -> Iterator[Router]:
    """A subscriber that already hears the master (ZMQ's slow joiner: probes until one arrives), on an empty pool."""
    ctx = zmq.Context()
    r = Router(ctx, events_pool.pub)
    with kvpool.Client(events_pool.master) as c:
        c.remove_all(force=True)
        deadline = time.monotonic() + DEADLINE
        i = 0
        while not r.pump():
            assert time.monotonic() < deadline, "the subscriber never heard the master"
            c.put(f"probe/{i}", b"x" * 8)
            c.remove(f"probe/{i}")
            i += 1
    try:
        yield r
    finally:
        ctx.destroy(linger=0)


def blocks(make_request: Any, n: int, first_token: int) -> list[tuple[str, int]]:
    """``n`` full blocks of a prompt, as (pool key, the hash vLLM's own events would carry)."""
    req = make_request(list(range(first_token, first_token + 16 * n)), block_size=16)
    hashes = list(req.block_hashes)
    assert len(hashes) == n
    return [(KEYS.key(h), maybe_convert_block_hash(h)) for h in hashes]


def test_puts_removals_and_resets_reach_a_router_through_vllms_decoder(events_pool: EventsPool, router: Router,
                                                                      make_request: Any) -> None:
    stored = blocks(make_request, 4, 1000)
    with kvpool.Client(events_pool.master) as c:
        for key, _ in stored:
            c.put(key, b"v" * 4096)
        router.until("BlockStored of every block", lambda: all(router.view.get(h) == {"CPU"} for _, h in stored))
        for key, _ in stored[:2]:
            assert c.remove(key)
        router.until("BlockRemoved of the removed blocks", lambda: all(h not in router.view for _, h in stored[:2]))
        assert all(router.view.get(h) == {"CPU"} for _, h in stored[2:])

        c.remove_all(force=True)
        router.until("AllBlocksCleared (remove_all with force)",
                     lambda: bool(router.heard) and isinstance(router.heard[-1], AllBlocksCleared))
        assert router.view == {}
        c.put(stored[0][0], b"v" * 4096)
        router.until("the block stored again", lambda: stored[0][1] in router.view)
        c.remove_all()
        router.until("AllBlocksCleared (remove_all without force)",
                     lambda: isinstance(router.heard[-1], AllBlocksCleared))
        assert router.view == {}


def test_replay_returns_the_batches_and_vllms_end_marker(events_pool: EventsPool, router: Router,
                                                         make_request: Any) -> None:
    stored = blocks(make_request, 3, 2000)
    with kvpool.Client(events_pool.master) as c:
        for key, _ in stored:
            c.put(key, b"v" * 4096)
        router.until("the stores", lambda: all(h in router.view for _, h in stored))
    ctx = zmq.Context()
    try:
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(events_pool.replay)
        start = router.seqs[0]
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        replayed: list[tuple[int, bytes]] = []
        while True:
            assert dealer.poll(int(DEADLINE * 1000)), "a replay reply"
            empty, topic, seq, payload = dealer.recv_multipart()
            assert empty == b""
            if seq == ZmqEventPublisher.END_SEQ:
                assert topic == b"" and payload == b"", "vLLM's end marker"
                break
            assert topic == TOPIC.encode()
            replayed.append((int.from_bytes(seq, "big"), payload))
        assert [s for s, _ in replayed][:len(router.seqs)] == router.seqs
        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        events = [e for s, p in replayed if s <= router.seqs[-1] for e in decode(decoder, p)]
        assert events == router.heard, "the replay says what the subscriber heard"
    finally:
        ctx.destroy(linger=0)


def test_a_spill_is_removed_from_cpu_and_stored_to_storage(events_pool: EventsPool, router: Router,
                                                           make_request: Any) -> None:
    stored = blocks(make_request, 64, 5000)
    with kvpool.Client(events_pool.master) as c:
        for key, _ in stored:
            c.put(key, b"s" * VALUE)
        router.until("every block is listed again, some on SSD",
                     lambda: all(h in router.view for _, h in stored)
                     and any("STORAGE" in router.view[h] for _, h in stored))
        for key, h in stored:
            if "STORAGE" not in router.view[h]:
                continue
            left = [i for i, e in enumerate(router.heard)
                    if isinstance(e, BlockRemoved) and e.medium == "CPU" and h in e.block_hashes]
            landed = [i for i, e in enumerate(router.heard)
                      if isinstance(e, BlockStored) and e.medium == "STORAGE" and h in e.block_hashes]
            assert left and landed and left[0] < landed[0], f"{key}: removed from CPU, then stored to STORAGE"
            assert c.exists(key)


def test_described_blocks_carry_what_vllm_would_send(events_pool: EventsPool, router: Router,
                                                    make_request: Any) -> None:
    """Blocks described before their puts (BLOCK_INFO): vLLM's decoder reads one BlockStored per chain with the
    tokens, the block size, the parent's hash as vLLM's own events give it, the LoRA and the salt in extra_keys;
    the blocks put in reverse order still go out parent first."""
    tokens = list(range(3000, 3000 + 16 * 3))
    stored = blocks(make_request, 3, 3000)
    infos = [kvpool.BlockInfo(key, tokens[16 * i:16 * (i + 1)], 16,
                              parent_block_hash=stored[i - 1][1] if i else None, lora_id=7, lora_name="adapter",
                              cache_salt="salt" if i == 0 else None) for i, (key, _) in enumerate(stored)]
    assert [kvpool.router_block_hash(k) for k, _ in stored] == [h for _, h in stored]
    with kvpool.Client(events_pool.master) as c:
        assert c.describe_blocks(infos) == 3
        for key, _ in reversed(stored):
            c.put(key, b"v" * 4096)
        router.until("the chain stored", lambda: all(h in router.view for _, h in stored))
    told = [e for e in router.heard if isinstance(e, BlockStored) and set(e.block_hashes) & {h for _, h in stored}]
    assert [h for e in told for h in e.block_hashes] == [h for _, h in stored], "parents first"
    assert [t for e in told for t in e.token_ids] == tokens
    first = told[0]
    assert first.parent_block_hash is None and first.block_size == 16 and first.lora_id == 7
    assert first.lora_name == "adapter" and first.medium == "CPU"
    assert first.extra_keys is not None and tuple(first.extra_keys[0]) == ("adapter", "salt")

