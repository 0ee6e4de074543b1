"""Which file a segment id reaches on the same-machine path: the one its current table entry names."""

from __future__ import annotations

from pathlib import Path

from kvpool.protocol import SegmentStats, value_offset
from kvpool.shm import SharedSegments

SIZE = 1 << 16


def _segment_file(directory: Path, name: str, mark: bytes) -> Path:
    f = directory / name
    f.write_bytes(mark + bytes(SIZE - 1))
    return f


def _entry(sid: int, name: str, f: Path) -> SegmentStats:
    return SegmentStats(id=sid, name=name, host="127.0.0.1", port=7000 + sid, capacity=SIZE, used=0, objects=0,
                        active=True, heartbeat_age_ms=0, shm_path=str(f))


def test_an_id_that_names_another_node_after_a_master_change_reaches_that_nodes_file(tmp_path: Path) -> None:
    # a new master numbers segments in the order their nodes register again: id 2, node A's a moment
    # ago, is node B's now, and both stay in the table (issue 25: mappings were kept by id, and copies
    # for "segment 2" kept going into A's file)
    a = _segment_file(tmp_path, "kvpool-127.0.0.1_7001-100.seg", b"A")
    b = _segment_file(tmp_path, "kvpool-127.0.0.1_7002-200.seg", b"B")
    shared = SharedSegments(True)
    try:
        old_two = shared.mapping(_entry(2, "node-a", a))
        old_three = shared.mapping(_entry(3, "node-b", b))
        assert old_two is not None and old_three is not None
        assert old_two.mm[0:1] == b"A" and old_three.mm[0:1] == b"B"

        two = shared.mapping(_entry(2, "node-b", b))
        assert two is not None and two.mm[0:1] == b"B", "segment 2 is node B's now"
        two.write_value(0, 0, memoryview(b"b"))
        three = shared.mapping(_entry(3, "node-a", a))
        assert three is not None and three.mm[0:1] == b"A"
    finally:
        shared.close()
    at = value_offset(0)
    assert b.read_bytes()[at:at + 1] == b"b", "the write through segment 2 landed in node B's file"
    assert a.read_bytes()[at:at + 1] == b"\0", "node A's bytes stay as they were"


def test_retain_lets_go_of_files_no_longer_in_the_table(tmp_path: Path) -> None:
    a = _segment_file(tmp_path, "kvpool-127.0.0.1_7001-100.seg", b"A")
    shared = SharedSegments(True)
    try:
        first = shared.mapping(_entry(1, "node-a", a))
        shared.retain(set())
        again = shared.mapping(_entry(4, "node-a", a))
        assert first is not None and again is not None and again is not first
    finally:
        shared.close()
