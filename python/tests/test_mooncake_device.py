"""kvpool.mooncake takes device addresses (as Mooncake's TCP transport does) in ``register_buffer``,
``put_from``, ``batch_put_from``, ``get_into``, ``batch_get_into`` and the multi-buffer forms, staging device
pieces through host memory of the device edge that owns them. Here the device is the CPU edge's memory
(``CpuEdge.alloc``): the same code as on a GPU but the copy calls; the edge's byte count proves each device
piece went through the edge."""

from __future__ import annotations

import ctypes
from typing import Any, Iterator

import pytest

import kvpool

torch = pytest.importorskip("torch")

from kvpool.device import CpuEdge  # noqa: E402
from kvpool.device.pointers import forget_edge, use_edge  # noqa: E402


@pytest.fixture
def edge() -> Iterator[CpuEdge]:
    e = CpuEdge()
    use_edge(e)
    try:
        yield e
    finally:
        forget_edge(e)


def address(buf: bytearray) -> int:
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


def device_bytes(edge: CpuEdge, data: bytes) -> Any:
    t = edge.alloc(len(data))
    t.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    return t


def test_device_buffers_register_and_round_trip_through_the_edge(store: Any, client: kvpool.Client,
                                                                 edge: CpuEdge) -> None:
    a, b = bytes(range(256)) * 64, bytes(reversed(range(256))) * 32
    da, db = device_bytes(edge, a), device_bytes(edge, b)
    assert store.register_buffer(da.data_ptr(), da.numel()) == 0
    assert store.register_buffer(db.data_ptr(), db.numel()) == 0
    before = edge.bytes_copied
    assert store.batch_put_from(["dev/a", "dev/b"], [da.data_ptr(), db.data_ptr()], [len(a), len(b)]) == [0, 0]
    assert edge.bytes_copied - before == len(a) + len(b)  # device -> host staging
    assert client.get("dev/a") == a and client.get("dev/b") == b
    assert store.put_from("dev/c", db.data_ptr() + 16, 100) == 0
    assert client.get("dev/c") == b[16:116]

    out = edge.alloc(len(a))
    assert store.register_buffer(out.data_ptr(), out.numel()) == 0
    before = edge.bytes_copied
    assert store.batch_get_into(["dev/a"], [out.data_ptr()], [out.numel()]) == [len(a)]
    assert edge.bytes_copied - before == len(a)  # host staging -> device
    assert bytes(out.numpy()) == a
    # a miss writes nothing to the device
    out.zero_()
    assert store.get_into("dev/none", out.data_ptr(), out.numel()) < 0
    assert not out.any()


def test_multi_buffers_mix_device_and_host_pieces(store: Any, client: kvpool.Client, edge: CpuEdge) -> None:
    head, tail = b"H" * 1000, bytes(range(200)) * 10
    dev = device_bytes(edge, head)
    host = bytearray(tail)
    host_ptr = address(host)
    assert store.batch_put_from_multi_buffers(["mix"], [[dev.data_ptr(), host_ptr]], [[len(head), len(tail)]]) == [0]
    assert client.get("mix") == head + tail

    # read back scattered: the first 600 bytes to the device, the rest to host memory
    d_out = edge.alloc(600)
    h_out = bytearray(len(head) + len(tail) - 600)
    h_ptr = address(h_out)
    got = store.batch_get_into_multi_buffers(["mix"], [[d_out.data_ptr(), h_ptr]], [[600, len(h_out)]])
    assert got == [len(head) + len(tail)]
    assert bytes(d_out.numpy()) + bytes(h_out) == head + tail


def test_memory_that_is_neither_host_nor_device_is_refused(store: Any) -> None:
    # an address no edge owns and no host mapping covers (the top of the canonical lower half)
    assert store.register_buffer(0x7FFF_FFFF_0000, 4096) == -600
