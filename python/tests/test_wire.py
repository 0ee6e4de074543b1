"""The connection's system calls against a scripted peer (``kvpool._net.Connection``): one ``sendmsg`` per
request, one ``recv_into`` for a reply's header and body, the payload's first bytes drained from the buffer,
kernel timeouts raised as ``TimeoutError``, partial sends finished, bodies larger than the buffer."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Callable

import pytest

import kvpool
from kvpool import _net
from kvpool import protocol as p
from kvpool._net import Connection


def serve(script: Callable[[socket.socket], None]) -> tuple[socket.socket, threading.Thread]:
    """A listening socket whose first connection runs ``script``."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def run() -> None:
        conn, _ = srv.accept()
        with conn:
            script(conn)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return srv, t


def read_request(conn: socket.socket) -> tuple[p.Header, bytes, bytes]:
    def exact(n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = conn.recv(n - len(out))
            assert chunk, "the client closed"
            out += chunk
        return bytes(out)
    h = p.decode_header(exact(p.HEADER_BYTES))
    return h, exact(h.body_length), exact(h.payload_length)


def reply(conn: socket.socket, h: p.Header, body: bytes, payload: bytes = b"", pieces: int = 1) -> None:
    frame = p.encode_header(h.opcode, h.request_id, len(body), len(payload), flags=p.FLAG_REPLY) + body + payload
    step = -(-len(frame) // pieces)
    for i in range(0, len(frame), step):
        conn.sendall(frame[i:i + step])
        if pieces > 1:
            time.sleep(0.005)  # apart on the wire: the client must gather them, not wait for them (no test waits)


def test_a_reply_with_its_payload_in_one_segment_and_in_many() -> None:
    payload = os.urandom(300_000)
    seen: list[bytes] = []

    def script(conn: socket.socket) -> None:
        for pieces in (1, 7):
            h, body, _ = read_request(conn)
            seen.append(body)
            reply(conn, h, b"ok" * 10, payload, pieces)

    srv, t = serve(script)
    c = Connection("127.0.0.1", srv.getsockname()[1], 5)
    try:
        for _ in range(2):
            body, n = c.call(p.Opcode.NODE_READ, b"request body", 5)
            assert body == b"ok" * 10 and n == len(payload)
            dst = bytearray(n)
            c.read_payload_into(memoryview(dst)[:1000])  # what came with the header first
            c.read_payload_into(memoryview(dst)[1000:])
            assert dst == payload and c.pending_payload == 0
    finally:
        c.close()
        t.join(10)
        srv.close()
    assert seen == [b"request body"] * 2


def test_a_large_payload_sent_in_parts_arrives_byte_exact() -> None:
    """Eight values of 1 MiB to a peer that reads slowly: sendmsg sends part of the frame at a time."""
    values = [memoryview(os.urandom(1 << 20)) for _ in range(8)]
    got: list[bytes] = []

    def script(conn: socket.socket) -> None:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        h, body, payload = read_request(conn)
        got.append(body + payload)
        reply(conn, h, b"")

    srv, t = serve(script)
    c = Connection("127.0.0.1", srv.getsockname()[1], 5)
    try:
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
        assert c.call(p.Opcode.NODE_WRITE, b"head", 10, values) == (b"", 0)
    finally:
        c.close()
        t.join(10)
        srv.close()
    assert got == [b"head" + b"".join(bytes(v) for v in values)]


def test_a_body_larger_than_the_receive_buffer() -> None:
    big = os.urandom(_net.RECV_BUFFER * 3 + 17)

    def script(conn: socket.socket) -> None:
        h, _, _ = read_request(conn)
        reply(conn, h, big, b"tail", pieces=3)

    srv, t = serve(script)
    c = Connection("127.0.0.1", srv.getsockname()[1], 5)
    try:
        body, n = c.call(p.Opcode.CLUSTER_STATS, b"", 5)
        assert body == big and n == 4
        dst = bytearray(4)
        c.read_payload_into(memoryview(dst))
        assert dst == b"tail"
    finally:
        c.close()
        t.join(10)
        srv.close()


def test_a_peer_that_does_not_answer_times_out_and_a_client_says_which_master() -> None:
    """The kernel's receive timeout ends the wait, as a TimeoutError; the client turns it into MasterTimeout."""
    release = threading.Event()

    def script(conn: socket.socket) -> None:
        read_request(conn)
        release.wait(30)  # never answers

    srv, t = serve(script)
    c = Connection("127.0.0.1", srv.getsockname()[1], 5)
    start = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match="no reply within 0.3s"):
            c.call(p.Opcode.PING, b"x" * 16, 0.3)
        assert c.broken
    finally:
        release.set()
        c.close()
        t.join(10)
        srv.close()
    assert time.monotonic() - start < 5

    answered = threading.Event()

    def hello_then_silence(conn: socket.socket) -> None:
        h, _, _ = read_request(conn)  # HELLO
        reply(conn, h, hello_reply())
        answered.set()
        read_request(conn)  # CLUSTER_STATS: never answered
        release.wait(30)

    release.clear()
    srv, t = serve(hello_then_silence)
    try:
        with pytest.raises(kvpool.MasterTimeout, match=f"master at 127.0.0.1:{srv.getsockname()[1]}"):
            kvpool.Client(f"127.0.0.1:{srv.getsockname()[1]}", timeout=0.3)
        assert answered.is_set()
    finally:
        release.set()
        t.join(10)
        srv.close()


def hello_reply() -> bytes:
    """A HELLO reply body as the master writes it: incarnation, epoch, max key and value bytes, replicas, term."""
    return p.BodyWriter().i64(1).i64(0).i32(p.MAX_KEY_BYTES).i64(p.DEFAULT_MAX_PAYLOAD_BYTES).u8(1).i64(0).bytes()


def test_peer_closed_tells_a_live_connection_from_one_the_server_closed() -> None:
    """``Connection.peer_closed``, what a same-machine writer asks before its COMMIT (protocol 4.28): false on a
    live connection without taking anything from it, false with a reply due, true once the server closed."""
    answer, close = threading.Event(), threading.Event()

    def script(conn: socket.socket) -> None:
        for _ in range(2):
            h, body, _ = read_request(conn)
            reply(conn, h, body)
        h, body, _ = read_request(conn)
        answer.wait(30)
        reply(conn, h, body)
        close.wait(30)  # then the server closes the connection

    srv, t = serve(script)
    c = Connection("127.0.0.1", srv.getsockname()[1], 5)
    try:
        assert c.call(p.Opcode.PING, b"one", 5)[0] == b"one"
        assert not c.peer_closed()
        assert c.call(p.Opcode.PING, b"two", 5)[0] == b"two", "the check read nothing of the stream"
        c.send(p.Opcode.PING, b"three", 5)
        assert not c.peer_closed(), "a reply is due: not the check's to read"
        answer.set()
        assert c.receive(5)[0] == b"three"
        close.set()
        t.join(30)
        while not c.peer_closed():
            time.sleep(0.001)  # the FIN is on its way; the test's own timeout bounds the wait
        assert c.broken
    finally:
        c.close()
        srv.close()
