#!/usr/bin/env python3
"""The SSD-tier node kill drill (issue 32): does a node with an SSD tier keep every object through a
SIGKILL and a restart?

    scripts/ssd-kill-drill.py [--runs N] [--objects 300] [--memory 64MiB] [--disk 1GiB] [--no-kill]

Each run starts a master and one node (``--segment-size`` MEMORY, ``--disk-dir``/``--disk-size`` DISK)
from this checkout's jar, puts OBJECTS objects of 1 MiB (most of them spill to the disk tier), reads
each once, waits a few seconds idle, kills the node with SIGKILL and starts it again on the same address
with the same disk directory (it adopts its segment file and re-reads its disk tier). Once the node is
registered anew (another segment id) the objects are read three times: at once, again (reads past the
promotion threshold move objects back to memory, which evicts others to disk), and after a few idle
seconds. A run keeps everything when every pass reads every object byte-exact. Reads past the threshold
promote objects while the pass goes on, and each promotion evicts (spills) one of the objects the pass
reads next: a spill must be readable on its way to disk (before 2026-11-29 it was a miss until the disk
had it, and runs with 8 MiB of memory missed one or two objects in half of them). Everything started is
stopped by PID; the logs stay in the run's temporary directory, which is printed.

Exit status 0 when every run kept every object, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

import kvpool  # noqa: E402

JAR = REPO / "kvpool-cli" / "target" / "kvpool.jar"
VALUE = 1 << 20


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    for j in ([Path(home) / "bin" / "java"] if home else []) + sorted(Path("/usr/lib/jvm").glob("*25*/bin/java")):
        if j.exists():
            return str(j)
    return "java"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def value(i: int) -> bytes:
    seed = hashlib.sha256(str(i).encode()).digest()
    return (seed * (VALUE // len(seed) + 1))[:VALUE]


def spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([java(), "--enable-native-access=ALL-UNNAMED", "-Xmx512m", "-jar", str(JAR), *args],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)


def registered(master: str, not_ids: set[int] | None = None, timeout: float = 120) -> set[int]:
    """Waits until one segment is active under a registration not in ``not_ids``; returns its id."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with kvpool.Client(master, timeout=5, connect_timeout=1) as c:
                segs = c.status().segments
                if len(segs) == 1 and segs[0].active and segs[0].id not in (not_ids or set()):
                    return {segs[0].id}
        except kvpool.KvPoolError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"no node registered with {master} within {timeout}s")


def read_all(master: str, n: int) -> list[str]:
    """The objects not read back byte-exact: ``"7"`` for a miss, ``"7 wrong"`` for other bytes."""
    out = []
    with kvpool.Client(master, timeout=60) as c:
        for i in range(n):
            got = c.get(f"d/{i}")
            if got != value(i):
                out.append(str(i) if got is None else f"{i} wrong")
    return out


def run(args: argparse.Namespace, number: int) -> bool:
    d = Path(tempfile.mkdtemp(prefix="kvpool-ssd-drill-"))
    mp, np_ = free_port(), free_port()
    master = f"127.0.0.1:{mp}"
    procs = [spawn(["master", "--host", "127.0.0.1", "--port", str(mp), "--http-port", "-1"], d / "master.log")]
    node_args = ["node", "--master", master, "--host", "127.0.0.1", "--advertise-host", "127.0.0.1", "--port",
                 str(np_), "--http-port", "-1", "--segment-size", args.memory, "--disk-dir", str(d / "disk"),
                 "--disk-size", args.disk]
    try:
        procs.append(spawn(node_args, d / "node.log"))
        first = registered(master)
        with kvpool.Client(master, timeout=60) as c:
            for i in range(args.objects):
                st = c.put(f"d/{i}", value(i))
                if st is not kvpool.PutStatus.OK:
                    raise RuntimeError(f"put d/{i}: {st}")
        passes = {"before": read_all(master, args.objects)}
        time.sleep(3)  # idle
        if not args.no_kill:
            os.killpg(procs[1].pid, signal.SIGKILL)
            procs[1].wait()
            procs[1] = spawn(node_args, d / "node-again.log")
            registered(master, first)
        passes["after restart"] = read_all(master, args.objects)
        passes["read again"] = read_all(master, args.objects)
        time.sleep(5)
        passes["settled"] = read_all(master, args.objects)
        kept = all(not missing for missing in passes.values())
        print(f"run {number}: " + ", ".join(f"{name} {args.objects - len(m)} of {args.objects}"
                                            + (f" (missing {m[:10]})" if m else "") for name, m in passes.items())
              + f"  (logs {d})", flush=True)
        return kept
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--objects", type=int, default=300)
    ap.add_argument("--memory", default="64MiB")
    ap.add_argument("--disk", default="1GiB")
    ap.add_argument("--no-kill", action="store_true", help="the same reads without the kill (a control)")
    args = ap.parse_args()
    if not JAR.exists():
        print(f"{JAR} is missing: run ./kvpool build first", file=sys.stderr)
        return 2
    kept = sum(run(args, i + 1) for i in range(args.runs))
    print(f"{kept} of {args.runs} runs kept every object", flush=True)
    return 0 if kept == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
