#!/usr/bin/env python3
"""A writer for the restart drill (``kvpool bench --only restarts``, RestartDrill.java): puts new objects
through the Python client until told to stop, and lists every put acknowledged OK, so the drill can check
afterwards that each one is still there, byte-exact.

    restart-writer.py --master ADDR --prefix P --out FILE --stop FILE [--shared-memory 0|1] [--size BYTES]
                      [--pace-ms MS] [--max-puts N]

Object i is ``P/i``, with one copy when i is even and two when it is odd; its value is SHA-256(key)
repeated to ``--size`` bytes (RestartDrill.value computes the same). Each acknowledged key is written to
``--out`` as one line at once (flushed), so a writer killed midway still leaves its list. When the file
``--stop`` appears the writer ends and prints one JSON line: puts, ok, failed (a status other than OK) and
errors (an exception), with the first few reasons.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import kvpool  # noqa: E402


def value(key: str, size: int) -> bytes:
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--master", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--stop", required=True)
    ap.add_argument("--shared-memory", type=int, choices=(0, 1), default=1)
    ap.add_argument("--size", type=int, default=16 << 10)
    ap.add_argument("--pace-ms", type=float, default=20.0)
    ap.add_argument("--max-puts", type=int, default=0, help="stop putting after this many (0: no limit)")
    a = ap.parse_args()
    puts = ok = failed = errors = 0
    reasons: Counter[str] = Counter()
    with open(a.out, "w", encoding="utf-8") as out, \
            kvpool.Client(a.master, shared_memory=bool(a.shared_memory), timeout=30, connect_timeout=3) as c:
        i = 0
        while not os.path.exists(a.stop):
            t0 = time.monotonic()
            if a.max_puts and i >= a.max_puts:
                time.sleep(a.pace_ms / 1000)  # its share of the pool is written: idle until stopped
                continue
            key = f"{a.prefix}/{i}"
            puts += 1
            try:
                st = c.put(key, value(key, a.size), replicas=1 if i % 2 == 0 else 2)
                if st is kvpool.PutStatus.OK:
                    ok += 1
                    out.write(key + "\n")
                    out.flush()
                else:
                    failed += 1
                    reasons[str(st)] += 1
            except kvpool.KvPoolError as e:
                errors += 1
                reasons[type(e).__name__ + ": " + str(e)[:120]] += 1
            i += 1
            left = a.pace_ms / 1000 - (time.monotonic() - t0)
            if left > 0:
                time.sleep(left)
    print(json.dumps({"puts": puts, "ok": ok, "failed": failed, "errors": errors,
                      "reasons": dict(reasons.most_common(5))}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
