"""Copy and checksum lanes of the same-machine path (``kvpool.lanes``), against real pools.

* Large puts from several threads at once, each spread over lanes, land byte-exact, read over shared memory and
  over TCP, and so do puts from a forked child (its own lane threads).
* A value whose copy into the segment differs from the bytes checksummed fails its put on a node that verifies
  writes, and the key stays absent: the lanes' checksums are the ones the node checks.
* A copy outside the mapping is refused before any byte moves; runs split the values as documented.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from pathlib import Path

import pytest

import kvpool
from conftest import Pool, in_forked_child, start_pool
from kvpool import PutStatus, lanes
from kvpool import protocol as p
from kvpool.crc import crc32c
from kvpool.shm import Mapping

MIB = 1 << 20


def values_for(prefix: str, n: int, size: int) -> dict[str, bytes]:
    return {f"{prefix}/{i}": os.urandom(size + i) for i in range(n)}


def test_runs_cover_every_value_in_order_about_evenly() -> None:
    assert lanes.parts([MIB] * 64, 2) == [(0, 32), (32, 64)]
    assert lanes.parts([MIB] * 64, 4) == [(0, 16), (16, 32), (32, 48), (48, 64)]
    assert lanes.parts([4096] * 100, 4) == [(0, 100)]  # below MIN_PARALLEL_BYTES: one run, the caller's
    assert lanes.parts([8 * MIB, 1, 1, 1], 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert lanes.parts([3 * MIB, 3 * MIB], 4) == [(0, 1), (1, 2)]
    # small items, many bytes in all (a layer of 256 blocks): the caller's thread alone, no lock passed around
    assert lanes.parts([64 << 10] * 256, 4) == [(0, 256)]
    assert lanes.parts([256 << 10] * 64, 4) == [(0, 16), (16, 32), (32, 48), (48, 64)]
    for sizes in ([MIB] * 7, [5 * MIB, MIB, MIB, 9 * MIB, 2], [MIB * 2] * 3):
        runs = lanes.parts(sizes, 3)
        assert [i for lo, hi in runs for i in range(lo, hi)] == list(range(len(sizes)))
        assert len(runs) <= 3 and all(hi > lo for lo, hi in runs)


def test_a_copy_outside_the_mapping_is_refused_before_any_byte_moves(tmp_path: Path) -> None:
    f = tmp_path / "segment"
    f.write_bytes(bytes(2 * MIB))
    fd = os.open(f, os.O_RDWR)
    try:
        m = Mapping(mmap.mmap(fd, 2 * MIB, mmap.MAP_SHARED), True, 2 * MIB)
    finally:
        os.close(fd)
    try:
        crcs: list[int | None] = [None, None]
        ok, bad = memoryview(os.urandom(MIB)), memoryview(os.urandom(MIB))
        with pytest.raises(ValueError, match="outside the 2097152-byte segment"):
            lanes.copy_in(m, [0, MIB + 1], [ok, bad], crcs, 2)
        assert bytes(m.view[:MIB]) == bytes(MIB) and crcs == [None, None]  # nothing moved
        lanes.copy_in(m, [0, MIB], [ok, bad], crcs, 2)
        assert bytes(m.view[:MIB]) == ok and bytes(m.view[MIB:]) == bad
        assert crcs == [crc32c(ok), crc32c(bad)]
    finally:
        m.close()


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "tcp"])
def test_large_puts_from_many_threads_land_byte_exact(pool: Pool, client: kvpool.Client, shm: bool) -> None:
    """Over shared memory each lane copies and checksums its share; over TCP each lane checksums its share and
    sends it on a connection of its own."""
    writer = client if shm else kvpool.Client(pool.master, shared_memory=False)
    writer.copy_lanes = 4  # spread over lanes even on a small machine
    groups = [values_for(f"t{t}", 12, MIB) for t in range(4)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(groups))

    def put(group: dict[str, bytes]) -> None:
        try:
            start.wait()
            assert writer.put_batch(list(group), list(group.values())) == [PutStatus.OK] * len(group)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=put, args=(g,)) for g in groups]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert writer.counters["bytes_written_shm" if shm else "bytes_written_tcp"] == \
        sum(len(v) for g in groups for v in g.values())
    with kvpool.Client(pool.master, shared_memory=False) as tcp:
        for g in groups:
            assert tcp.get_batch(list(g)) == list(g.values())
            assert client.get_batch(list(g)) == list(g.values())
    if not shm:
        writer.close()


def test_a_forked_child_puts_through_lanes_of_its_own(pool: Pool, client: kvpool.Client) -> None:
    writer = client
    writer.copy_lanes = 4
    mine = values_for("parent", 8, MIB)
    assert writer.put_batch(list(mine), list(mine.values())) == [PutStatus.OK] * 8  # the parent's lanes exist now
    theirs = values_for("child", 8, MIB)

    def child() -> bool:
        return writer.put_batch(list(theirs), list(theirs.values())) == [PutStatus.OK] * 8

    assert in_forked_child(child)
    with kvpool.Client(pool.master, shared_memory=False) as tcp:
        assert tcp.get_batch(list(theirs)) == list(theirs.values())
        assert tcp.get_batch(list(mine)) == list(mine.values())


def test_a_copy_that_differs_from_what_was_checksummed_fails_its_put(monkeypatch: pytest.MonkeyPatch) -> None:
    """The node verifies each value against the checksum the lanes computed from the caller's bytes: a copy that
    lands other bytes (here one byte flipped after the copy of one value) makes that put FAILED and absent, and
    the other values of the call land."""
    with start_pool(extra=["--verify-writes"]) as vpool, kvpool.Client(vpool.master) as c:
        c.copy_lanes = 4
        vals = values_for("v", 8, MIB)
        target = list(vals.values())[5]
        real = lanes._memmove

        def corrupting(dst: int, src: int, n: int) -> int:
            out = real(dst, src, n)
            if n == len(target) and ctypes.string_at(src, 16) == target[:16]:
                p = ctypes.cast(dst + n // 2, ctypes.POINTER(ctypes.c_ubyte))
                p[0] ^= 0xFF
            return out

        monkeypatch.setattr(lanes, "_memmove", corrupting)
        got = c.put_batch(list(vals), list(vals.values()))
        assert got == [PutStatus.OK] * 5 + [PutStatus.FAILED] + [PutStatus.OK] * 2
        monkeypatch.setattr(lanes, "_memmove", real)
        keys = list(vals)
        assert c.get_batch(keys) == [v if i != 5 else None for i, v in enumerate(vals.values())]
        assert c.put(keys[5], target) is PutStatus.OK and c.get(keys[5]) == target  # the key was left free


def test_reads_through_lanes_are_byte_exact_and_a_copy_the_object_changed_under_does_not_stand(
        pool: Pool, client: kvpool.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of same-machine reads spread over lanes lands byte-exact. If an object changes while a lane copies
    it (here: the copy comes out wrong and the region's header says dead before the check after the copy), that
    copy is not returned: the object is read over TCP, which yields it or a miss."""
    vals = values_for("r", 8, MIB)
    keys = list(vals)
    assert client.put_batch(keys, list(vals.values())) == [PutStatus.OK] * 8
    with kvpool.Client(pool.master, location_cache=0) as r:
        r.copy_lanes = 4
        bufs = [bytearray(len(v)) for v in vals.values()]
        assert r.get_into_batch(keys, bufs) == [len(v) for v in vals.values()]
        assert [bytes(b) for b in bufs] == list(vals.values()) and r.counters["bytes_read_shm"] == sum(map(len, bufs))
        target = vals[keys[3]]
        (_, _, [(name, _, offset)]), = r.replica_locations([keys[3]])
        mapping = r._ch.segments.shm.mapping(next(s for s in r.status().segments if s.name == name))
        assert mapping is not None
        real = lanes._memmove
        torn: list[int] = []

        def racing(dst: int, src: int, n: int) -> int:
            out = real(dst, src, n)
            if n == len(target) and ctypes.string_at(dst, 16) == target[:16]:
                ctypes.memset(dst, 0, n)  # the copy came out wrong...
                mapping.view[offset + 5] = p.OBJECT_STATE_DEAD  # ...because the node reused the region meanwhile
                torn.append(n)
            return out

        monkeypatch.setattr(lanes, "_memmove", racing)
        bufs = [bytearray(len(v)) for v in vals.values()]
        try:
            got = r.get_into_batch(keys, bufs)
        finally:
            mapping.view[offset + 5] = p.OBJECT_STATE_COMPLETE
        assert torn and r.counters["shm_read_retries"] == 1
        assert got[3] == kvpool.MISS or bytes(bufs[3]) == target  # never the bytes copied under the change
        assert [bytes(b) for i, b in enumerate(bufs) if i != 3] == [v for i, v in enumerate(vals.values()) if i != 3]
