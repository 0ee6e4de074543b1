"""PoolConnector moving KV layer by layer (``granularity="layer"``) on a real pool, over shared memory
and over TCP: a load delivers layer 0 while later layers are still held back, a load that fails in a
later layer is reported and voids the step's saves of its request, and a reset between a step's first
and last saved layer leaves nothing of it. Ordering is forced with gates (events), never with sleeps.
(The contract scenarios run layer by layer too: test_connector_contract.py; Java and whole-block
engines reading what this mode writes: test_cross_engine.py.)"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import pytest

import kvpool
from kvpool.connector import BlockHasher, ConnectorRequest, KeyFormat, PagedKvCache, PoolConnector, ScheduledRequest
from kvpool.connector import layers

np = pytest.importorskip("numpy")

BS, LAYERS, HEADS, DIM = 16, 4, 2, 8
WAIT = 60  # seconds a gate or a thread may take before the test fails



class Recorder:
    """A put in parts that records what it is asked: the items of each ``write_many`` (by range offset),
    and whether it was finished or abandoned; ``wrote`` is set after each write."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.writes: list[tuple[int, list[int]]] = []
        self.wrote = threading.Semaphore(0)
        self.finished = self.abandoned = False

    def write_many(self, items: Sequence[int], offsets: Sequence[int], srcs: Sequence[Any]) -> list[bool]:
        out = self.real.write_many(items, offsets, srcs)
        self.writes.append((offsets[0], list(items)))
        self.wrote.release()
        return out

    def finish(self) -> Any:
        self.finished = True
        return self.real.finish()

    def abandon(self) -> None:
        self.abandoned = True
        self.real.abandon()


class Gated:
    """A client whose ranged reads after the first wait at a gate (each signals ``held`` first), and whose
    puts in parts are recorded."""

    def __init__(self, real: kvpool.Client) -> None:
        self.real = real
        self.reads = 0
        self.held = threading.Semaphore(0)
        self.release = threading.Event()
        self.puts: list[Recorder] = []
        self.begun = threading.Semaphore(0)  # released at each begin_put

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def get_ranges_into(self, located: Any, offsets: Sequence[int], buffers: Sequence[Any]) -> list[int]:
        self.reads += 1
        if self.reads > 1:
            self.held.release()
            assert self.release.wait(WAIT), "test gate never opened"
        return self.real.get_ranges_into(located, offsets, buffers)

    def begin_put(self, keys: Sequence[str], value_lengths: Sequence[int], **kw: Any) -> Recorder:
        r = Recorder(self.real.begin_put(keys, value_lengths, **kw))
        self.puts.append(r)
        self.begun.release()
        return r

    def first_layer_written(self) -> bool:
        """Waits until the save thread began a put in parts and wrote its first layer."""
        return self.begun.acquire(timeout=WAIT) and self.puts[0].wrote.acquire(timeout=WAIT)


def make(client: Any, granularity: str = "layer", backend: str = "numpy",
         layer_read_bytes: int = 0) -> tuple[PoolConnector, PagedKvCache]:
    # one layer a read by default (these tests follow single layers); runs of layers have their own test
    pc = PoolConnector(client, BlockHasher(BS, "0"), KeyFormat("py-layers", "v1", "f32"), granularity=granularity,
                       layer_read_bytes=layer_read_bytes)
    return pc, PagedKvCache(16, LAYERS, BS, HEADS, DIM, backend=backend)


def compute(kv: PagedKvCache, blocks: Sequence[int], seed: int) -> None:
    """The forward pass: random KV in every layer of ``blocks``."""
    rnd = np.random.default_rng(seed)
    for b in blocks:
        kv.data[b] = rnd.standard_normal(kv.data[b].shape, dtype=np.float32)


def prefill(pc: PoolConnector, kv: PagedKvCache, r: ConnectorRequest, blocks: list[int], seed: int = 1) -> None:
    """A request computed from scratch and saved (every layer, then waited for)."""
    assert pc.get_num_new_matched_tokens(r, 0).tokens == 0
    pc.update_state_after_alloc(r, blocks, 0)
    pc.start_load_kv(pc.build_connector_meta([ScheduledRequest(r, blocks, 0, r.num_tokens)]), kv)
    compute(kv, blocks, seed)
    for layer in range(kv.num_layers):
        pc.save_kv_layer(layer, kv)
    pc.wait_for_save()


def in_thread(call: Any, *args: Any) -> list[Any]:
    """Runs ``call(*args)`` on a thread and fails unless it returns within WAIT seconds; its result."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(call(*args)), daemon=True)
    t.start()
    t.join(WAIT)
    assert not t.is_alive(), f"{getattr(call, '__name__', call)} did not return"
    return out


def gated_load(either: kvpool.Client, layer_read_bytes: int = 0) \
        -> tuple[Gated, PoolConnector, PagedKvCache, PagedKvCache]:
    """Blocks 0-3 saved whole, then a layer-by-layer load of them into blocks 8-11 (filled with NaN) through a
    store whose ranged reads after the first wait at its gate: the gated store, connector, cache and the source."""
    saver, src = make(either, "block")
    a = ConnectorRequest("a", list(range(64)))
    prefill(saver, src, a, [0, 1, 2, 3])
    saver.close()
    gated = Gated(either)
    pc, kv = make(gated, layer_read_bytes=layer_read_bytes)
    kv.data.fill(np.nan)
    b = ConnectorRequest("b", list(range(64)) + [1])
    assert pc.get_num_new_matched_tokens(b, 0).tokens == 64
    table = [8, 9, 10, 11, 12]
    pc.update_state_after_alloc(b, table, 64)
    pc.start_load_kv(pc.build_connector_meta([ScheduledRequest(b, table, 64, 65)]), kv)
    return gated, pc, kv, src


def test_layer_zero_is_in_while_a_gate_holds_the_later_layers(either: kvpool.Client) -> None:
    gated, pc, kv, src = gated_load(either)
    in_thread(pc.wait_for_layer_load, 0)  # returns with layer 1 held at the gate
    assert gated.held.acquire(timeout=WAIT)  # the load is at layer 1's read: nothing of it has moved
    assert np.array_equal(kv.data[8:12, 0], src.data[0:4, 0])
    assert np.isnan(kv.data[8:12, 1:]).all()
    gated.release.set()
    pc.wait_for_layer_load(LAYERS - 1)
    assert np.array_equal(kv.data[8:12], src.data[0:4])
    assert pc.block_ids_with_load_errors() == set()
    assert gated.reads == LAYERS  # one ranged read a layer, all blocks in each
    assert pc.stats().loaded_blocks == 4 and pc.stats().loaded_bytes == 4 * kv.block_bytes
    pc.close()


def test_small_layers_are_read_several_at_a_time_and_come_in_by_the_run(either: kvpool.Client) -> None:
    """Layers of 2 KiB a block and ``layer_read_bytes`` 4 KiB: two layers a ranged read. Layers 0 and 1 are in
    while the gate holds the second read; the other two are not; in the end every byte is right."""
    gated, pc, kv, src = gated_load(either, layer_read_bytes=4096)
    assert kv.layer_bytes == 2048 and layers.layers_a_read(kv, 4096) == 2
    in_thread(pc.wait_for_layer_load, 1)  # the first run: layers 0 and 1
    assert gated.held.acquire(timeout=WAIT)  # the load is at the second run's read
    assert np.array_equal(kv.data[8:12, :2], src.data[0:4, :2])
    assert np.isnan(kv.data[8:12, 2:]).all()
    gated.release.set()
    pc.wait_for_layer_load(LAYERS - 1)
    assert np.array_equal(kv.data[8:12], src.data[0:4])
    assert pc.block_ids_with_load_errors() == set()
    assert gated.reads == LAYERS // 2
    pc.close()


def test_a_read_brings_enough_layers_for_its_least_range() -> None:
    kv = PagedKvCache(2, 32, 16, 8, 128, dtype="float16")  # Llama-3-8B: 64 KiB a layer of a block
    assert kv.layer_bytes == 64 << 10
    assert layers.layers_a_read(kv) == 4  # the default, 256 KiB
    assert layers.layers_a_read(kv, 0) == 1 and layers.layers_a_read(kv, 1) == 1
    assert layers.layers_a_read(kv, (64 << 10) + 1) == 2
    assert layers.layers_a_read(kv, 1 << 30) == 32  # never more than the model's layers
    with pytest.raises(ValueError, match="layer_read_bytes"):
        PoolConnector(object(), BlockHasher(BS, "0"), KeyFormat("m", "v1", "f32"), layer_read_bytes=-1)


def test_a_load_failing_in_a_later_layer_is_reported_and_voids_the_steps_saves_of_its_request(
        either: kvpool.Client) -> None:
    """b loads a's three blocks and computes its fourth; its second block vanishes after layer 0 was
    read. The failure is reported, b's fourth block (computed over it) is not stored although its first
    layers were already written, and c's block, computed in the same step, is."""
    saver, src = make(either, "block")
    a = ConnectorRequest("a", list(range(48)))
    prefill(saver, src, a, [0, 1, 2])
    saver.close()
    gated = Gated(either)
    pc, kv = make(gated)
    b = ConnectorRequest("b", list(range(64)) + [5])
    c = ConnectorRequest("c", [7] * 16)
    assert pc.get_num_new_matched_tokens(b, 0).tokens == 48
    pc.update_state_after_alloc(b, [8, 9, 10, 11, 12], 48)
    pc.update_state_after_alloc(c, [13], 0)
    meta = pc.build_connector_meta([ScheduledRequest(b, [8, 9, 10, 11, 12], 48, 65), ScheduledRequest(c, [13], 0, 16)])
    assert [(s.request_id, s.block_id) for s in meta.saves] == [("b", 11), ("c", 13)]
    pc.start_load_kv(meta, kv)
    pc.wait_for_layer_load(0)
    compute(kv, [11, 12, 13], seed=2)
    pc.save_kv_layer(0, kv)
    assert gated.held.acquire(timeout=WAIT)  # layer 1's read waits at the gate
    assert gated.first_layer_written()
    assert gated.puts[0].writes == [(0, [0, 1])]  # layer 0 of both saves is written
    assert either.remove(pc.keys_for(b)[1])  # evicted after its layer 0 was read
    gated.release.set()
    for layer in range(1, LAYERS):
        pc.wait_for_layer_load(layer)
        pc.save_kv_layer(layer, kv)
    assert pc.block_ids_with_load_errors() == {9}
    pc.wait_for_save()
    rec = gated.puts[0]
    assert rec.finished and rec.writes[-1] == ((LAYERS - 1) * kv.layer_bytes, [1])  # b's save stopped
    assert not either.exists(pc.keys_for(b)[3])  # its first layers were written: nothing of it is visible
    assert either.get(pc.keys_for(c)[0]) == kv.block(13).tobytes()
    s = pc.stats()
    assert s.failed_loads == 1 and s.loaded_blocks == 2 and s.saved_blocks == 1 and s.dropped_saves == 1
    pc.close()


def test_a_reset_between_the_first_and_the_last_layers_save_leaves_nothing(either: kvpool.Client) -> None:
    gated = Gated(either)
    pc, kv = make(gated)
    a = ConnectorRequest("a", list(range(48)))
    pc.update_state_after_alloc(a, [0, 1, 2], 0)
    pc.start_load_kv(pc.build_connector_meta([ScheduledRequest(a, [0, 1, 2], 0, 48)]), kv)
    compute(kv, [0, 1, 2], seed=3)
    pc.save_kv_layer(0, kv)
    assert gated.first_layer_written()
    result = in_thread(pc.reset_cache)  # the saves in parts hold no fence while they wait for layers
    assert result[0].success
    for layer in range(1, LAYERS):
        pc.save_kv_layer(layer, kv)
    pc.wait_for_save()
    rec = gated.puts[0]
    assert rec.abandoned and not rec.finished  # the finish saw the generation moved
    keys = pc.keys_for(a)
    assert either.prefix_match(keys) == 0 and not any(either.exists(k) for k in keys)
    s = pc.stats()
    assert s.saved_blocks == 0 and s.dropped_saves == 3 and s.resets == 1
    # the reservations went back: the same keys store anew
    assert either.put_batch(keys, [kv.block(b) for b in (0, 1, 2)]) == [kvpool.PutStatus.OK] * 3
    pc.close()


def test_layers_saved_from_a_torch_cache_read_back_whole_and_layer_by_layer(either: kvpool.Client) -> None:
    torch = pytest.importorskip("torch")
    pc, kv = make(either, backend="torch")
    a = ConnectorRequest("a", list(range(40)))
    pc.update_state_after_alloc(a, [3, 4, 5], 0)
    pc.start_load_kv(pc.build_connector_meta([ScheduledRequest(a, [3, 4, 5], 0, 40)]), kv)
    kv.data[3:6] = torch.randn(3, LAYERS, 2, BS, HEADS, DIM)
    for layer in range(LAYERS):
        pc.save_kv_layer(layer, kv)
    pc.wait_for_save()
    keys = pc.keys_for(a)
    assert [either.get(k) for k in keys] == [kv.data[b].numpy().tobytes() for b in (3, 4)]
    back, into = make(either, backend="torch")
    r = ConnectorRequest("r", list(range(40)))
    assert back.get_num_new_matched_tokens(r, 0).tokens == 32
    back.update_state_after_alloc(r, [9, 10, 11], 32)
    back.start_load_kv(back.build_connector_meta([ScheduledRequest(r, [9, 10, 11], 32, 40)]), into)
    for layer in range(LAYERS):
        back.wait_for_layer_load(layer)
    assert back.block_ids_with_load_errors() == set()
    assert torch.equal(into.data[9:11], kv.data[3:5])
    pc.close()
    back.close()


def test_granularity_is_checked() -> None:
    with pytest.raises(ValueError, match="granularity must be 'block' or 'layer', got 'layers'"):
        PoolConnector(object(), BlockHasher(BS, "0"), KeyFormat("m", "v1", "f32"), granularity="layers")
