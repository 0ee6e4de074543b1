"""Pipelining (docs/protocol.md, section 1.2): requests sent before any reply is read are answered one each, in
order, by the Java servers; a BAD_REQUEST answers its request alone. And puts in parts, whose part writes are
pipelined, stay byte-exact when the Java client reads them."""

from __future__ import annotations

import os

import pytest

import kvpool
from conftest import Pool
from kvpool import PutStatus
from kvpool import protocol as p
from kvpool._net import Connection
from kvpool.errors import KvPoolError
from kvpool.protocol import Opcode


def _exists_body(key: bytes) -> bytes:
    return p.encode_keys([key])


def test_requests_pipelined_to_the_java_master_are_answered_in_order(pool: Pool) -> None:
    host, port = pool.master.rsplit(":", 1)
    c = Connection(host, int(port), 5.0)
    try:
        with kvpool.Client(pool.master) as k:
            assert k.put("pipe/present", b"x" * 100) == PutStatus.OK
        n = 300
        for i in range(n):
            key = b"k" * 600 if i == 150 else (b"pipe/present" if i % 3 == 0 else f"pipe/absent/{i}".encode())
            c.send(Opcode.BATCH_EXIST_KEY, _exists_body(key), 5.0)
        assert c.unanswered == n
        for i in range(n):
            if i == 150:
                with pytest.raises(ValueError, match="refused BATCH_EXIST_KEY"):
                    c.receive(5.0)
                assert not c.broken
                continue
            body, payload = c.receive(5.0)
            assert payload == 0
            assert p.decode_flags(body, "exists") == [i % 3 == 0], i
        assert c.unanswered == 0
        body, _ = c.call(Opcode.BATCH_EXIST_KEY, _exists_body(b"pipe/present"), 5.0)
        assert p.decode_flags(body, "exists") == [True]
    finally:
        c.close()


def test_a_call_with_replies_unanswered_and_a_receive_with_none_are_refused(pool: Pool) -> None:
    host, port = pool.master.rsplit(":", 1)
    c = Connection(host, int(port), 5.0)
    try:
        with pytest.raises(KvPoolError, match="no request is waiting"):
            c.receive(5.0)
        c.send(Opcode.BATCH_EXIST_KEY, _exists_body(b"pipe/x"), 5.0)
        with pytest.raises(KvPoolError, match="1 pipelined requests are unanswered"):
            c.call(Opcode.BATCH_EXIST_KEY, _exists_body(b"pipe/y"), 5.0)
        c.receive(5.0)
        c.call(Opcode.BATCH_EXIST_KEY, _exists_body(b"pipe/y"), 5.0)
    finally:
        c.close()


def test_many_pipelined_part_writes_land_byte_exact(pool: Pool) -> None:
    """More part writes than the pipelining window, over TCP: every layer lands where it belongs."""
    from kvpool import parts as parts_module
    layers, layer = parts_module.PIPELINED_WRITES * 2 + 3, 512
    keys = [f"pipe/parts/{i}" for i in range(4)]
    values = [os.urandom(layers * layer) for _ in keys]
    with kvpool.Client(pool.master, shared_memory=False) as c:
        with c.begin_put(keys, [len(v) for v in values]) as put:
            for l in range(layers):
                assert put.write_many(range(len(keys)), [l * layer] * len(keys),
                                      [memoryview(v)[l * layer:(l + 1) * layer] for v in values]) == [True] * 4
            assert put.finish() == [PutStatus.OK] * 4
        for k, v in zip(keys, values):
            assert c.get(k) == v


def test_part_writes_in_flight_stay_within_the_window(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """No more part writes, and no more parts, unanswered than the bounds: the answers not read yet must fit
    in the socket's buffers, or the node would stall writing one while this side still writes parts."""
    from kvpool import parts as parts_module
    monkeypatch.setattr(parts_module, "PIPELINED_WRITES", 5)
    monkeypatch.setattr(parts_module, "PIPELINED_PARTS", 10)
    seen: list[int] = []
    real_send = Connection.send

    def send(self: Connection, opcode: int, *a: object, **kw: object) -> None:
        if opcode == Opcode.NODE_PART_WRITE:
            seen.append(self.unanswered)
        real_send(self, opcode, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Connection, "send", send)
    layers, layer = 20, 256
    keys = [f"pipe/window/{i}" for i in range(4)]
    values = [os.urandom(layers * layer) for _ in keys]
    with kvpool.Client(pool.master, shared_memory=False) as c:
        with c.begin_put(keys, [len(v) for v in values]) as put:
            for l in range(layers):
                put.write_many(range(len(keys)), [l * layer] * len(keys),
                               [memoryview(v)[l * layer:(l + 1) * layer] for v in values])
            assert put.finish() == [PutStatus.OK] * 4
        for k, v in zip(keys, values):
            assert c.get(k) == v
    assert len(seen) == layers
    # 4 parts a frame, at most 10 parts in flight: a frame is sent with at most 1 other unanswered (8 parts
    # then in flight), and pipelining did happen (not each answer taken before the next send)
    assert max(seen) == 1 and min(seen) == 0
