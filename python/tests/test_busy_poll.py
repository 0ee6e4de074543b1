"""The reply poll of ``kvpool._net.Connection`` (the Java client's ``BusyPoll``): bytes already there are
taken by a poll; a poll that runs out leaves the read to the blocking path, and after it only one wait in 8,
then 16, 32 and 64, polls; a poll whose yield ran another thread stops without backing off. Whether bytes are
there when a poll starts is made certain (``select`` first), and whether a yield ran another thread is set by the
test, so nothing here depends on how fast anything runs."""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator

import pytest

import kvpool._net
from kvpool import Client
from kvpool._net import MAX_BUSY_POLL, Connection, check_busy_poll


@pytest.fixture()
def pair() -> Iterator[tuple[Connection, socket.socket]]:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    c = Connection("127.0.0.1", port, 3.0, busy_poll=MAX_BUSY_POLL)
    server, _ = listener.accept()
    listener.close()
    yield c, server
    c.close()
    server.close()


def arrive(c: Connection, server: socket.socket, data: bytes) -> None:
    server.sendall(data)
    select.select([c.sock], [], [])


def test_a_poll_takes_bytes_that_are_there(pair: tuple[Connection, socket.socket]) -> None:
    c, server = pair
    arrive(c, server, b"12345")
    assert c._poll(0) == 5
    assert bytes(c._view[:5]) == b"12345"
    assert (c.polls_hit, c.polls_missed) == (1, 0)
    assert c.sock.gettimeout() is None  # still a blocking socket


def test_polls_that_run_out_poll_ever_less_often(pair: tuple[Connection, socket.socket],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    c, server = pair
    monkeypatch.setattr(kvpool._net, "_YIELDED_AWAY_NS", 1 << 62)  # no yield counts as running another thread
    c._poll_ns = 1_000  # nobody writes: every poll runs out
    polled_at = []
    wait = 0
    while len(polled_at) < 6:
        before = c.polls_missed
        assert c._poll(0) == 0
        if c.polls_missed > before:
            polled_at.append(wait)
        wait += 1
    assert polled_at == [0, 8, 24, 56, 120, 184]
    # a poll that finds its bytes makes every wait poll again
    arrive(c, server, b"ab")
    for _ in range(64):
        got = c._poll(0)
        if got:
            break
    assert got == 2 and c.polls_hit == 1
    arrive(c, server, b"c")
    assert c._poll(2) == 3


def test_a_poll_whose_yield_ran_another_thread_stops_and_is_no_miss(pair: tuple[Connection, socket.socket],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    c, server = pair
    monkeypatch.setattr(kvpool._net, "_YIELDED_AWAY_NS", -1)  # every yield counts as running another thread
    for _ in range(3):
        assert c._poll(0) == 0
    assert (c.polls_hit, c.polls_missed, c._retry_every) == (0, 0, 0)
    arrive(c, server, b"xyz")
    assert c._poll(0) == 3  # no back-off: the next wait polled at once


def test_the_end_of_the_stream_is_an_error(pair: tuple[Connection, socket.socket]) -> None:
    c, server = pair
    server.shutdown(socket.SHUT_WR)
    select.select([c.sock], [], [])
    with pytest.raises(ConnectionError, match="closed the connection"):
        c._poll(0)


def test_budgets_out_of_range_are_refused() -> None:
    assert check_busy_poll(0) == 0.0
    for bad in (-1e-6, 2e-3):
        with pytest.raises(ValueError, match="busy_poll must be 0 \\(off\\) to 0.001 s"):
            check_busy_poll(bad)
    with pytest.raises(ValueError, match="busy_poll"):
        Client("127.0.0.1:1", busy_poll=0.5)  # refused before any connection is tried
