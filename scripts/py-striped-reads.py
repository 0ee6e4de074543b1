#!/usr/bin/env python3
"""Python reads over TCP on one connection against reads striped over several (``kvpool.tcp_reads``), in the
same run: docs/benchmarks.md, "Large Python reads over TCP striped; two ideas that did not pay on two
cores".

Starts ``./kvpool serve`` on free ports (stopped by PID at the end), stores 16 values of each SIZE with a client
that moves every byte over TCP, then measures ``get_into`` of one value and ``get_into_batch`` of all 16, with
``copy_lanes`` 1 (one connection) and the default (striped where ``kvpool.tcp_reads`` stripes), in pairs of rounds
(each pair's order the other way round from the last), in PROCESSES processes at once (forked, a client each).
Prints objects per second for each (all processes together) and the striped rate over the unstriped one of the same
pair, and checks every value read. Values under ``tcp_reads.STRIPE_MIN_ITEM_BYTES`` are read on one connection in
both modes: their pairs show the run's noise.

    python3 scripts/py-striped-reads.py [--sizes 1MiB,4MiB] [--seconds 1.5] [--pairs 2] [--processes 1]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

import kvpool  # noqa: E402
from kvpool import lanes, tcp_reads  # noqa: E402

KEYS = 16


def size_arg(s: str) -> int:
    for u, m in (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30)):
        if s.endswith(u):
            return int(s[: -len(u)]) * m
    return int(s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1MiB,4MiB", help="value sizes, comma-separated (bytes, or KiB/MiB)")
    ap.add_argument("--seconds", type=float, default=1.5, help="length of one round")
    ap.add_argument("--pairs", type=int, default=2, help="rounds of each mode, alternating")
    ap.add_argument("--processes", type=int, default=1, help="processes reading at once")
    args = ap.parse_args()
    try:
        sizes = [size_arg(s) for s in args.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes must be sizes such as 1MiB,4MiB, got {args.sizes!r}")
    if any(n <= 0 for n in sizes) or args.seconds <= 0 or args.pairs <= 0 or args.processes <= 0:
        ap.error("sizes, --seconds, --pairs and --processes must be positive")
    segment = max(1 << 30, 4 * KEYS * max(sizes))
    port, node_port = free_port(), free_port()
    log = open(f"/tmp/py-striped-reads-{os.getpid()}.log", "w")
    server = subprocess.Popen([str(ROOT / "kvpool"), "serve", f"--port={port}", f"--node-port={node_port}",
                               f"--segment-size={segment}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        master = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                with kvpool.Client(master, shared_memory=False, timeout=5, connect_timeout=1) as probe:
                    if probe.put("py-striped-reads/ready", b"x") == kvpool.PutStatus.OK:
                        break
            except (OSError, kvpool.KvPoolError):
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"kvpool serve did not start (log: {log.name})")
            time.sleep(0.5)
        with kvpool.Client(master, shared_memory=False) as c:
            striped_lanes = lanes.default_lanes()
            print(f"kvpool serve on {master}; striped reads use copy_lanes={striped_lanes}; "
                  f"{args.seconds:g} s a round")
            if striped_lanes < 2:
                print("one core: nothing is striped, both modes are the same")
            for n in sizes:
                keys = [f"py-striped-reads/{n}/{i}" for i in range(KEYS)]
                values = [os.urandom(n) for _ in keys]
                if c.put_batch(keys, values) != [kvpool.PutStatus.OK] * KEYS:
                    raise SystemExit(f"could not store {KEYS} values of {n} bytes")
                def rate(op: str, mode: int) -> float:
                    """Objects per second of ``op`` in ``mode`` lanes, all processes together."""
                    pipes = []
                    for _ in range(args.processes):
                        r, w = os.pipe()
                        child = os.fork()
                        if child == 0:  # a client of its own; exits without running the parent's cleanup
                            code = 1
                            try:
                                os.close(r)
                                with kvpool.Client(master, shared_memory=False) as mine:
                                    mine.copy_lanes = mode
                                    os.write(w, str(measure(mine, op)).encode())
                                code = 0
                            finally:
                                os._exit(code)
                        os.close(w)
                        pipes.append((child, r))
                    total = 0.0
                    for child, r in pipes:
                        with os.fdopen(r) as f:
                            out = f.read()
                        _, status = os.waitpid(child, 0)
                        if status != 0 or not out:
                            raise SystemExit(f"a reading process failed ({status})")
                        total += float(out)
                    return total

                def measure(mine: kvpool.Client, op: str) -> float:
                    one = bytearray(n)
                    bufs = [bytearray(n) for _ in keys]

                    def get(i: int) -> int:
                        if mine.get_into(keys[i % KEYS], one) != n:
                            raise SystemExit("a get missed")
                        return 1

                    def batch(_: int) -> int:
                        if mine.get_into_batch(keys, bufs) != [n] * KEYS:
                            raise SystemExit("a batch missed")
                        return KEYS

                    fn = get if op == "get" else batch
                    for i in range(20):
                        fn(i)
                    t = time.perf_counter()
                    i = objects = 0
                    while time.perf_counter() - t < args.seconds:
                        objects += fn(i)
                        i += 1
                    if bytes(one) not in values and op == "get" or op != "get" and [bytes(b) for b in bufs] != values:
                        raise SystemExit("a value read differs from the value stored")
                    return objects / (time.perf_counter() - t)

                note = "" if n >= tcp_reads.STRIPE_MIN_ITEM_BYTES else " (not striped in either mode)"
                for op in ("get", "batch"):
                    name = "get" if op == "get" else f"batch x{KEYS}"
                    for pair in range(args.pairs):
                        # the order alternates: a pair's second round ran faster in A/A pairs (1 MiB, two processes)
                        if pair % 2 == 0:
                            a, b = rate(op, 1), rate(op, striped_lanes)
                        else:
                            b, a = rate(op, striped_lanes), rate(op, 1)
                        print(f"{n >> 10} KiB {name}, {args.processes} process(es), pair {pair + 1}{note}: one "
                              f"connection {a:,.0f}/s, striped {b:,.0f}/s: {b / a:.2f}x")
                c.remove_batch(keys)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
