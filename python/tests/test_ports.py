"""kvpool_peers.ports: the ports the tests and benchmarks start their servers on."""

from __future__ import annotations

import socket

from kvpool_peers import ports


def test_a_process_never_hands_out_one_port_twice_even_before_any_is_bound() -> None:
    seen: set[int] = set()
    for i in range(2000):
        p = ports.reservable_port()
        assert p not in seen, f"port {p} handed out twice after {i}"
        seen.add(p)


def test_a_port_is_below_the_ephemeral_range_and_bindable() -> None:
    below = ports.ephemeral_start()
    for p in ports.reservable_ports(20):
        assert min(20000, below - 1000) <= p < below
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_port_in_use_on_loopback_or_every_address_is_not_bindable() -> None:
    p = ports.reservable_port()
    for host in ("127.0.0.1", ""):
        with socket.socket() as taken:
            taken.bind((host, p))
            taken.listen()
            assert not ports.bindable(p)
    assert ports.bindable(p)
