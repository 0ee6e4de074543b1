"""Ports for servers that the tests and benchmarks start a moment later (a pool, etcd, a Mooncake master).

The Python twin of Java's ``io.kvpool.config.Ports``:

* below the kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``, 32768 when unreadable),
  because a port the kernel picked (bind to 0) can be taken by any outgoing connection before the server
  binds it, or binds it again after a restart;
* never the same port twice in one process, even before the first is bound: a fixture asks for several
  ports before it starts anything, and a random pick stays bindable until its server binds it, so two
  random picks could be one port. A process walks the range from a random start instead.
"""

from __future__ import annotations

import itertools
import random
import socket
import threading

_LOWEST = 20000
_ATTEMPTS = 200
_first = random.Random().randrange(1 << 30)
_looked = itertools.count()
_lock = threading.Lock()


def ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            start = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
    return start if start > 2000 else 32768


def bindable(port: int) -> bool:
    """Whether ``port`` can be bound now on every address and on loopback."""
    for host in ("", "127.0.0.1"):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def reservable_port() -> int:
    """A port bindable now, below the ephemeral range, that this process has not handed out before."""
    below = ephemeral_start()
    lowest = min(_LOWEST, below - 1000)
    for _ in range(_ATTEMPTS):
        with _lock:
            port = lowest + (_first + next(_looked)) % (below - lowest)
        if bindable(port):
            return port
    raise RuntimeError(f"no bindable port in [{lowest}, {below}) after {_ATTEMPTS} tries")


def reservable_ports(n: int) -> list[int]:
    """``n`` distinct ports, each as :func:`reservable_port`."""
    return [reservable_port() for _ in range(n)]
