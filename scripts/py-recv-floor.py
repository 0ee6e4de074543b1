#!/usr/bin/env python3
"""What one Python process can receive over loopback TCP, with nothing of kvpool in it: the ceiling of a Python
client's large gets over TCP on this machine (docs/benchmarks.md, "Large Python reads over TCP striped; two ideas
that did not pay on two cores").

A server process (this script with ``--serve``, started and stopped by PID here) answers each 16-byte request
(the length wanted) with an 8-byte header and that many bytes from one buffer it reuses. The client asks for
values of SIZE bytes and reads each with ``recv_into`` straight into one buffer of its own, either on one
connection (one stream) or cut in two halves on two connections (two streams): either both requests sent first and
the two replies then read one after the other by the same thread (as ``kvpool.tcp_reads`` does), or the second
half handed to another thread that reads it while this one reads the first. Rounds of the three modes alternate;
each prints its values per second and its rate over the one-stream rate of the same round.

    python3 scripts/py-recv-floor.py [--size 1MiB] [--seconds 2] [--pairs 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

_REQUEST = struct.Struct("<QQ")
_HEADER = struct.Struct("<Q")


def size_arg(s: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if s.endswith(u):
            return int(s[: -len(u)]) * m
    return int(s)


def serve(port_file: str, max_size: int) -> None:
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen()
    payload = memoryview(bytearray(os.urandom(max_size)))
    with open(port_file + ".tmp", "w") as f:
        f.write(str(ls.getsockname()[1]))
    os.replace(port_file + ".tmp", port_file)

    def answer(c: socket.socket) -> None:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        req = bytearray(_REQUEST.size)
        view = memoryview(req)
        while True:
            got = 0
            while got < len(req):
                k = c.recv_into(view[got:])
                if k == 0:
                    return
                got += k
            n, _ = _REQUEST.unpack(req)
            if n > max_size:
                raise SystemExit(f"asked for {n} bytes; this server holds {max_size}")
            c.sendmsg([_HEADER.pack(n), payload[:n]])

    while True:
        c, _ = ls.accept()
        threading.Thread(target=answer, args=(c,), daemon=True).start()


def fetch(s: socket.socket, dst: memoryview) -> None:
    s.sendall(_REQUEST.pack(dst.nbytes, 0))
    take(s, dst)


def take(s: socket.socket, dst: memoryview) -> None:
    """Reads one reply, asked for already, into ``dst``."""
    n = dst.nbytes
    head = bytearray(_HEADER.size)
    got = 0
    while got < len(head):
        k = s.recv_into(memoryview(head)[got:])
        if k == 0:
            raise ConnectionError("the server closed the connection")
        got += k
    if _HEADER.unpack(head)[0] != n:
        raise ValueError("the server answered another length")
    got = 0
    while got < n:
        k = s.recv_into(dst[got:], n - got)
        if k == 0:
            raise ConnectionError("the server closed the connection")
        got += k


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=size_arg, default=1 << 20, help="value size (bytes, or with KiB/MiB/GiB)")
    ap.add_argument("--seconds", type=float, default=2.0, help="length of one round")
    ap.add_argument("--pairs", type=int, default=3, help="rounds of the three modes, one after the other")
    ap.add_argument("--serve", metavar="PORT_FILE", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.size <= 0 or args.seconds <= 0 or args.pairs <= 0:
        ap.error("--size, --seconds and --pairs must be positive")
    if args.serve:
        serve(args.serve, args.size)
        return 0
    port_file = f"/tmp/py-recv-floor-{os.getpid()}.port"
    server = subprocess.Popen([sys.executable, __file__, "--serve", port_file, "--size", str(args.size)])
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(port_file):
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server did not start")
            time.sleep(0.05)
        with open(port_file) as f:
            port = int(f.read())
        socks = []
        for _ in range(2):
            s = socket.create_connection(("127.0.0.1", port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            socks.append(s)
        n = args.size
        half = n // 2
        view = memoryview(bytearray(n))
        pool = ThreadPoolExecutor(1)

        def one() -> None:
            fetch(socks[0], view)

        def two_threads() -> None:
            f = pool.submit(fetch, socks[1], view[half:])
            fetch(socks[0], view[:half])
            f.result()

        def two_in_turn() -> None:
            socks[0].sendall(_REQUEST.pack(half, 0))
            socks[1].sendall(_REQUEST.pack(n - half, 0))
            take(socks[0], view[:half])
            take(socks[1], view[half:])

        def rate(fn) -> float:
            for _ in range(100):
                fn()
            t = time.perf_counter()
            k = 0
            while time.perf_counter() - t < args.seconds:
                fn()
                k += 1
            return k / (time.perf_counter() - t)

        print(f"values of {n} bytes over loopback, {args.seconds:g} s a round")
        for i in range(args.pairs):
            a, b, c = rate(one), rate(two_in_turn), rate(two_threads)
            print(f"round {i + 1}: one stream {a:,.0f}/s ({a * n / 1e9:.2f} GB/s); two, read in turn by one thread "
                  f"{b:,.0f}/s ({b / a:.2f}x); two, on two threads {c:,.0f}/s ({c / a:.2f}x)")
        for s in socks:
            s.close()
        pool.shutdown()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(10)
        try:
            os.remove(port_file)
        except FileNotFoundError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
