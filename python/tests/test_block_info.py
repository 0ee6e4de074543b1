"""BLOCK_INFO from the Python client against the Java master: what a connector says of its blocks (tokens, block
size, parent hash, LoRA, salt) is kept for the KV events when the master publishes them, and not otherwise; bad
infos are refused before anything is sent. The bytes are checked against Java's in test_protocol.py, and what the
events then carry against vLLM's decoder in the peer suite (python/peer_tests/vllm/test_kv_events.py)."""

from __future__ import annotations

import hashlib
import urllib.request

import pytest

import kvpool
from conftest import Pool, free_port
from kvpool import BlockInfo, router_block_hash
from kvpool.connector.keys import KeyFormat

KEYS = KeyFormat("tiny-llama", "v1", "bf16")


def _chain(n: int) -> list[BlockInfo]:
    """``n`` blocks of a prompt, each its parent's child, under connector keys."""
    out: list[BlockInfo] = []
    parent: int | None = None
    for i in range(n):
        key = KEYS.key(hashlib.sha256(f"block {i}".encode()).digest())
        out.append(BlockInfo(key, list(range(16 * i, 16 * i + 16)), 16, parent_block_hash=parent))
        parent = router_block_hash(key)
    return out


def _metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in the master's metrics")


def test_the_master_keeps_infos_only_with_events_on() -> None:
    http = free_port()
    with Pool(segment_size="16MiB", http_port=http, extra=[
            "--kv-events-endpoint", f"tcp://127.0.0.1:{free_port()}"]) as pool:
        with kvpool.Client(pool.master) as c:
            infos = _chain(40)
            assert c.describe_blocks(infos) == 40
            assert c.describe_blocks(infos[:5]) == 5  # again: replaced, not added
            assert _metric(http, "master_kv_events_block_infos") == 40
            assert _metric(http, "master_kv_events_block_info_bytes") >= 40 * 16 * 4
            assert c.describe_blocks([]) == 0
    with Pool(segment_size="16MiB") as off, kvpool.Client(off.master) as c:
        assert c.describe_blocks(_chain(3)) == 0


def test_a_small_info_memory_lets_the_oldest_go() -> None:
    http = free_port()
    with Pool(segment_size="16MiB", http_port=http, extra=[
            "--kv-events-endpoint", f"tcp://127.0.0.1:{free_port()}", "--kv-events-info-bytes", "4KiB"]) as pool:
        with kvpool.Client(pool.master) as c:
            kept = c.describe_blocks(_chain(100))
            assert 0 < kept < 100
            assert _metric(http, "master_kv_events_block_infos_let_go_total") >= 100 - kept


def test_router_block_hash_is_the_events_hash() -> None:
    h = bytes(range(32))
    assert router_block_hash(KEYS.key(h)) == int.from_bytes(h, "big") & (2**64 - 1)
    assert router_block_hash("blk/0") == 980530018798458897  # the Java EventBatchCodecTest's value
    assert router_block_hash("x/" + "g" * 64) == int.from_bytes(hashlib.sha256(b"x/" + b"g" * 64).digest()[-8:], "big")


@pytest.mark.parametrize("bad, what", [
    (dict(block_size=0), "block size"),
    (dict(token_ids=[-1]), "token ids"),
    (dict(parent_block_hash=1 << 64), "parent block hash"),
    (dict(cache_salt="s" * 1025), "cache salt"),
])
def test_bad_infos_are_refused_before_sending(bad: dict[str, object], what: str) -> None:
    fields: dict[str, object] = dict(key="k", token_ids=[1], block_size=16)
    fields.update(bad)
    with pytest.raises(ValueError, match=what):
        BlockInfo(**fields)  # type: ignore[arg-type]


def test_the_connector_describes_what_it_saves_ahead_of_the_puts() -> None:
    """A connector with ``planner.describe`` puts each saved block's tokens and parent hash in the step's work and
    sends them on its save thread before the puts: the master then keeps one info per saved block."""
    np = pytest.importorskip("numpy")
    from kvpool.connector import BlockHasher, ConnectorRequest, PagedKvCache, PoolConnector, ScheduledRequest
    bs = 16
    http = free_port()
    with Pool(segment_size="64MiB", http_port=http, extra=[
            "--kv-events-endpoint", f"tcp://127.0.0.1:{free_port()}"]) as pool, kvpool.Client(pool.master) as c:
        kv = PagedKvCache(8, 2, bs, 2, 8)
        kv.data[:] = np.random.default_rng(5).standard_normal(kv.data.shape, dtype=np.float32)
        with PoolConnector(c, BlockHasher(bs, "0"), KEYS) as pc:
            pc.planner.describe = True
            tokens = list(range(1000, 1000 + 3 * bs + 5))
            r = ConnectorRequest("d", tokens, cache_salt="tenant-a")
            pc.update_state_after_alloc(r, [1, 2, 3, 4], 0)
            meta = pc.build_connector_meta([ScheduledRequest(r, [1, 2, 3, 4], 0, len(tokens))])
            keys = [s.key for s in meta.saves]
            assert [i.key for i in meta.infos] == keys and len(keys) == 3
            assert [list(i.token_ids) for i in meta.infos] == [tokens[b * bs:(b + 1) * bs] for b in range(3)]
            assert [i.parent_block_hash for i in meta.infos] == [None, router_block_hash(keys[0]),
                                                                 router_block_hash(keys[1])]
            assert [i.cache_salt for i in meta.infos] == ["tenant-a", None, None]
            pc.start_load_kv(meta, kv)
            for layer in range(2):
                pc.save_kv_layer(layer, kv)
            pc.wait_for_save()
            assert pc.saved_blocks == 3
        assert _metric(http, "master_kv_events_block_infos") == 3
        assert c.exists(keys[2])
