"""Ranged reads and puts in parts (protocol version 11) from Python, against real pools: byte-exact layers over
shared memory and TCP, from memory and the SSD tier; objects removed or replaced after ``locate`` are misses;
ranges outside a value are errors naming them; parts in any order, a missing part, a forced remove_all and an
abandoned put; and both directions between the Java and the Python client."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import threading
from pathlib import Path

import pytest

import kvpool
from conftest import Cluster, Pool, start_pool, tiers_settled, wait_until
from kvpool import MISS, PutStatus
from kvpool.crc import crc32c, crc32c_combine
from kvpool.protocol import TIER_DISK

LAYERS = 8
LAYER = 8 << 10



def blocks(prefix: str, n: int, size: int = LAYERS * LAYER) -> tuple[list[str], list[bytes]]:
    keys = [f"{prefix}{i}" for i in range(n)]
    return keys, [os.urandom(size) for _ in keys]


def read_layerwise(c: kvpool.Client, at: kvpool.Located, layer: int = LAYER) -> list[bytearray]:
    """Every block read layer by layer, one get_ranges_into per layer, as a layerwise load reads them."""
    out = [bytearray(LAYERS * layer) for _ in range(len(at))]
    for l in range(LAYERS):
        views = [memoryview(b)[l * layer:(l + 1) * layer] for b in out]
        got = c.get_ranges_into(at, [l * layer] * len(at), views)
        for i, n in enumerate(got):
            assert n == (MISS if at.value_length(i) == MISS else layer), (l, at.keys[i])
    return out


def wrong(got: list[bytearray], want: list[bytes]) -> list[int]:
    """The indices where ``got`` differs from ``want`` (a short failure message where a list comparison would
    print every byte of every value)."""
    assert len(got) == len(want)
    return [i for i, (g, w) in enumerate(zip(got, want)) if bytes(g) != w]


def test_crc32c_combine_matches_the_whole() -> None:
    r = random.Random(1)
    for _ in range(100):
        b = os.urandom(r.randrange(3000))
        cut = r.randrange(len(b) + 1)
        assert crc32c_combine(crc32c(b[:cut]), crc32c(b[cut:]), len(b) - cut) == crc32c(b)
    with pytest.raises(ValueError, match="-1"):
        crc32c_combine(0, 0, -1)


def test_layers_read_one_by_one_are_the_whole_value(either: kvpool.Client) -> None:
    c = either
    keys, values = blocks("rng/", 12)
    assert c.put_batch(keys, values) == [PutStatus.OK] * 12
    at = c.locate([*keys, "rng/absent"])
    assert at.value_length(12) == MISS and at.value_length(0) == LAYERS * LAYER
    before = dict(c.counters)
    got = read_layerwise(c, at)
    assert [bytes(b) for b in got[:12]] == values
    path = "bytes_read_shm" if c._ch.segments.shm.enabled else "bytes_read_tcp"
    assert c.counters[path] - before[path] == 12 * LAYERS * LAYER
    r = random.Random(2)
    for _ in range(30):
        i, off = r.randrange(12), r.randrange(LAYERS * LAYER + 1)
        n = r.randrange(LAYERS * LAYER - off + 1)
        buf = bytearray(n)
        assert c.get_range_into(keys[i], off, buf) == n and bytes(buf) == values[i][off:off + n]


def test_an_object_replaced_or_removed_after_locate_is_a_miss(either: kvpool.Client, pool: Pool) -> None:
    c = either
    keys, values = blocks("gone/", 4)
    assert c.put_batch(keys, values) == [PutStatus.OK] * 4
    at = c.locate(keys)
    with kvpool.Client(pool.master) as other:
        assert other.upsert(keys[0], os.urandom(LAYERS * LAYER)) is PutStatus.OK
        assert other.remove(keys[1])
        bufs = [bytearray(LAYER) for _ in keys]
        assert c.get_ranges_into(at, [LAYER] * 4, bufs) == [MISS, MISS, LAYER, LAYER]
        assert at.value_lengths[:2] == [MISS, MISS]
        assert [bytes(b) for b in bufs[2:]] == [v[LAYER:2 * LAYER] for v in values[2:]]
        other.remove_all(force=True)
        assert c.get_ranges_into(at, [0] * 4, bufs) == [MISS] * 4


def test_a_range_outside_the_value_is_an_error_naming_it(client: kvpool.Client) -> None:
    assert client.put("oob/a", bytes(1000)) is PutStatus.OK
    at = client.locate(["oob/a"])
    with pytest.raises(ValueError, match=r"range \[991, 991 \+ 10\) of key 'oob/a' is outside its value of 1000"):
        client.get_ranges_into(at, [991], [bytearray(10)])
    with pytest.raises(ValueError, match=r"range \[-1, "):
        client.get_range_into("oob/a", -1, bytearray(1))
    with pytest.raises(ValueError, match="1 located objects but 2 range offsets"):
        client.get_ranges_into(at, [0, 0], [bytearray(1)])


def test_ranges_of_objects_in_the_ssd_tier() -> None:
    disk = Path(tempfile.mkdtemp(prefix="kvpool-pytest-disk-"))
    try:
        with start_pool(segment_size="8MiB", extra=["--disk-dir", str(disk), "--disk-size", "128MiB",
                                                    "--promote-after", "0"]) as p, kvpool.Client(p.master) as c:
            layer = 32 << 10
            keys, values = blocks("ssd/", 64, LAYERS * layer)  # 64 x 256 KiB into 8 MiB: most spill
            early = None
            for n, (k, v) in enumerate(zip(keys, values)):
                assert c.put(k, v) is PutStatus.OK
                if n == 15:
                    early = c.locate(keys[:16])  # located in memory, most read after they moved to disk
            assert early is not None
            # nothing moves once every object is listed and memory is under the watermark (a bare "all listed"
            # let the master's timer spill a few more afterwards: a miss for each, once on a slow machine)
            wait_until(lambda: tiers_settled(c, len(keys)), "every object listed, memory under the watermark")
            moved = [i for i, loc in enumerate(c.replica_locations(keys[:16])) if loc and loc[2][0][1] == TIER_DISK]
            assert moved, "no object reached the SSD tier"
            # the versions located in memory are found again by one lookup and read from the disk tier
            offsets = [(i % LAYERS) * layer for i in range(16)]
            bufs = [bytearray(layer) for _ in range(16)]
            assert c.get_ranges_into(early, offsets, bufs) == [layer] * 16
            assert wrong(bufs, [values[i][offsets[i]:offsets[i] + layer] for i in range(16)]) == []
            at = c.locate(keys)
            assert [k for i, k in enumerate(keys) if at.value_length(i) == MISS] == []
            assert wrong(read_layerwise(c, at, layer), values) == []
    finally:
        shutil.rmtree(disk, ignore_errors=True)


def write_layers(parts: kvpool.PutInParts, values: list[bytes], layers: list[int], first: int = 0) -> None:
    for l in layers:
        n = len(values)
        parts.write_many([first + i for i in range(n)], [l * LAYER] * n,
                         [memoryview(v)[l * LAYER:(l + 1) * LAYER] for v in values])


def test_parts_in_any_order_from_threads_finish_byte_exact(either: kvpool.Client, pool: Pool) -> None:
    c = either
    keys, values = blocks("parts/", 10)
    with c.begin_put(keys, [len(v) for v in values]) as parts:
        assert len(parts) == 10 and parts.status(0) is None
        order = list(range(LAYERS))
        random.Random(3).shuffle(order)
        write_layers(parts, values, order[:4])
        rest = [(i, l) for i in range(10) for l in order[4:]]
        random.Random(4).shuffle(rest)

        def writer(chunk: list[tuple[int, int]]) -> None:
            for i, l in chunk:
                assert parts.write(i, l * LAYER, memoryview(values[i])[l * LAYER:(l + 1) * LAYER])
        threads = [threading.Thread(target=writer, args=(rest[t::4],)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert c.get(keys[0]) is None, "nothing is visible before the finish"
        assert parts.finish() == [PutStatus.OK] * 10
    assert c.get_batch(keys) == values
    with kvpool.Client(pool.master, shared_memory=not c._ch.segments.shm.enabled) as other:
        assert other.get_batch(keys) == values


def test_a_missing_part_fails_its_object_and_leaves_nothing(either: kvpool.Client) -> None:
    c = either
    keys, values = blocks("missing/", 3)
    assert c.put(keys[2], values[2]) is PutStatus.OK
    with c.begin_put(keys, [len(v) for v in values]) as parts:
        assert parts.status(2) is PutStatus.ALREADY_EXISTS
        assert not parts.write(2, 0, values[2][:LAYER])
        write_layers(parts, [values[0]], list(range(LAYERS)))
        write_layers(parts, [values[1]], [l for l in range(LAYERS) if l != 5], first=1)
        assert parts.write(1, 5 * LAYER, values[1][5 * LAYER:6 * LAYER - 1])  # one byte short
        with pytest.raises(ValueError, match=rf"key 'missing/1' overlaps the range \[{4 * LAYER}, {5 * LAYER}\)"):
            parts.write(1, 5 * LAYER - 8, bytes(16))
        with pytest.raises(ValueError, match=rf"outside its value of {LAYERS * LAYER} bytes"):
            parts.write(0, LAYERS * LAYER - 1, bytes(2))
        assert parts.finish() == [PutStatus.OK, PutStatus.FAILED, PutStatus.ALREADY_EXISTS]
        with pytest.raises(RuntimeError, match="finished"):
            parts.write(0, 0, b"x")
    assert c.get(keys[0]) == values[0] and c.get(keys[1]) is None and not c.exists(keys[1])
    assert c.put(keys[1], values[1]) is PutStatus.OK


def test_a_forced_remove_all_between_begin_and_finish_fences(either: kvpool.Client, pool: Pool) -> None:
    c = either
    keys, values = blocks("fenced/", 4)
    with c.begin_put(keys, [len(v) for v in values]) as parts, kvpool.Client(pool.master) as admin:
        write_layers(parts, values, [0, 1, 2, 3])
        admin.remove_all(force=True)
        write_layers(parts, values, [4, 5, 6, 7])
        assert parts.finish() == [PutStatus.FENCED] * 4
        assert admin.get_batch(keys) == [None] * 4
    with c.begin_put(keys, [len(v) for v in values]) as parts:
        write_layers(parts, values, list(range(LAYERS)))
        assert parts.finish() == [PutStatus.OK] * 4
    assert c.get_batch(keys) == values


def test_a_new_master_between_begin_and_finish_fences() -> None:
    with Cluster(nodes=1) as cl, kvpool.Client(cl.master, timeout=10, connect_timeout=1) as c:
        keys, values = blocks("newmaster/", 4)
        parts = c.begin_put(keys, [len(v) for v in values])
        write_layers(parts, values, [0, 1, 2, 3])
        cl.restart_master()

        def back() -> bool:
            try:
                with kvpool.Client(cl.master, timeout=5, connect_timeout=1) as probe:
                    return any(s.active for s in probe.status().segments)
            except kvpool.KvPoolError:
                return False
        wait_until(back, "the node registered with the new master", timeout=60, interval=0.1)
        write_layers(parts, values, [4, 5, 6, 7])
        assert PutStatus.OK not in parts.finish()
        assert c.get_batch(keys) == [None] * 4 and c.batch_exists(keys) == [False] * 4


def test_an_abandoned_put_leaves_nothing(either: kvpool.Client) -> None:
    c = either
    keys, values = blocks("abandoned/", 3)
    parts = c.begin_put(keys, [len(v) for v in values])
    write_layers(parts, values, list(range(LAYERS)))
    parts.abandon()
    parts.abandon()
    with pytest.raises(RuntimeError, match="abandoned"):
        parts.finish()
    assert c.get_batch(keys) == [None] * 3
    assert c.put_batch(keys, values) == [PutStatus.OK] * 3


def test_java_writes_in_parts_and_python_reads_ranges_and_the_reverse(either: kvpool.Client, pool: Pool,
                                                                      tmp_path: Path) -> None:
    c = either
    java_tcp = [] if c._ch.segments.shm.enabled else ["--no-shm"]
    data = os.urandom(LAYERS * LAYER + 13)
    f = tmp_path / "v.bin"
    f.write_bytes(data)
    pool.kvpool_cli("put", "--master", pool.master, *java_tcp, "--file", str(f), "--parts", str(LAYERS), "java/parts")
    at = c.locate(["java/parts"])
    for l in range(LAYERS):
        buf = bytearray(LAYER)
        assert c.get_ranges_into(at, [l * LAYER], [buf]) == [LAYER] and bytes(buf) == data[l * LAYER:(l + 1) * LAYER]
    data2 = os.urandom(LAYERS * LAYER)
    with c.begin_put(["py/parts"], [len(data2)]) as parts:
        for l in reversed(range(LAYERS)):
            parts.write(0, l * LAYER, memoryview(data2)[l * LAYER:(l + 1) * LAYER])
        assert parts.finish() == [PutStatus.OK]
    out = tmp_path / "out.bin"
    for l in (0, 3, LAYERS - 1):
        pool.kvpool_cli("get", "--master", pool.master, *java_tcp, "--out", str(out), "--range",
                        f"{l * LAYER}:{LAYER}", "py/parts")
        assert out.read_bytes() == data2[l * LAYER:(l + 1) * LAYER]
    bad = pool.kvpool_cli("get", "--master", pool.master, "--range", f"{LAYERS * LAYER - 1}:2", "py/parts", check=False)
    assert bad.returncode != 0 and "outside its value" in bad.stderr + bad.stdout
