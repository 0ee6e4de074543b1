#!/usr/bin/env python3
"""Python puts with and without write leases, in one run against one pool (docs/python.md, "Puts under write
leases").

One process, one call at a time. Every configuration gets its own ``kvpool.Client``, made and warmed up first;
then rounds run the configurations in a rotating order, so a machine that gets busier or quieter affects them
alike, and the figures are compared as ratios within the run:

* ``put_from`` of 4 KiB values, fresh keys: p50 and p99 per call, two-phase (``write_leases=False``) against
  leased, over TCP (``shared_memory=False``) and over the same-machine path; with ``--redis``, redis-py's SET of
  the same value to that server, measured in the same rounds;
* ``put_batch`` over the same-machine path of 256 values of 4 KiB and of 32 values of 1 MiB (fresh keys, the
  batch's keys removed after each call, outside the timing): objects and GB/s, two-phase against leased.

    ./kvpool serve --port 50051 --node-port 50052 --segment-size 1GiB &
    PYTHONPATH=python python3 scripts/py-put-latency.py --master 127.0.0.1:50051 [--redis 127.0.0.1:6379]

Prints one JSON object per figure, then the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any, Callable

import kvpool


def pct(xs: list[int], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] / 1000  # microseconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--master", required=True)
    ap.add_argument("--redis", default=None, help="host:port of a Redis to time redis-py's SET against")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--puts", type=int, default=200, help="single puts per configuration per round")
    ap.add_argument("--batches", type=int, default=3, help="batches per configuration per round")
    a = ap.parse_args()

    clients = {(shm, leases): kvpool.Client(a.master, shared_memory=shm, write_leases=leases)
               for shm in (False, True) for leases in (False, True)}
    names = {k: f"{'shm' if k[0] else 'tcp'}/{'leased' if k[1] else 'two-phase'}" for k in clients}
    clients[(True, True)].remove_all(force=True)
    small = os.urandom(4096)
    big = os.urandom(1 << 20)
    rds: Any = None
    if a.redis:
        import redis  # type: ignore[import-untyped]
        host, port = a.redis.rsplit(":", 1)
        rds = redis.Redis(host=host, port=int(port))
        rds.ping()
    run = os.getpid()

    def single(c: kvpool.Client, tag: str, n: int, out: list[int]) -> None:
        for i in range(n):
            k = f"lat/{run}/{tag}/{len(out)}/{i}"
            t = time.perf_counter_ns()
            st = c.put_from(k, small)
            out.append(time.perf_counter_ns() - t)
            assert st is kvpool.PutStatus.OK, st

    def redis_set(n: int, out: list[int]) -> None:
        for i in range(n):
            k = f"lat/{run}/redis/{len(out)}/{i}"
            t = time.perf_counter_ns()
            rds.set(k, small)
            out.append(time.perf_counter_ns() - t)

    lat: dict[str, list[int]] = {names[k]: [] for k in clients}
    if rds is not None:
        lat["redis-py SET"] = []
    for k, c in clients.items():  # warm-up: connections, mappings, the first lease
        single(c, "warm" + names[k], 50, [])
    jobs: list[tuple[str, Callable[[], None]]] = [
        (names[k], (lambda c=c, name=names[k]: single(c, name, a.puts, lat[name]))) for k, c in clients.items()]
    if rds is not None:
        jobs.append(("redis-py SET", lambda: redis_set(a.puts, lat["redis-py SET"])))
    for r in range(a.rounds):
        for j in range(len(jobs)):
            jobs[(j + r) % len(jobs)][1]()
    p50 = {n: pct(x, 0.5) for n, x in lat.items()}
    for n, x in lat.items():
        print(json.dumps({"figure": "put_from 4 KiB", "config": n, "calls": len(x), "p50_us": p50[n],
                          "p99_us": pct(x, 0.99), "mean_us": statistics.fmean(x) / 1000}))

    batch: dict[tuple[str, bool], list[float]] = {}
    for size, count in ((4096, 256), (1 << 20, 32)):
        value = small if size == 4096 else big
        for leases in (False, True):
            batch[(f"{count} x {size}", leases)] = []
        for r in range(a.rounds):
            for leases in ((False, True) if r % 2 == 0 else (True, False)):
                c = clients[(True, leases)]
                for b in range(a.batches):
                    keys = [f"batch/{run}/{size}/{leases}/{r}/{b}/{i}" for i in range(count)]
                    t = time.perf_counter_ns()
                    st = c.put_batch(keys, [value] * count)
                    batch[(f"{count} x {size}", leases)].append((time.perf_counter_ns() - t) / 1e9)
                    assert st == [kvpool.PutStatus.OK] * count, st
                    c.remove_batch(keys)
    for (shape, leases), secs in batch.items():
        count, size = (int(x) for x in shape.split(" x "))
        med = statistics.median(secs)
        print(json.dumps({"figure": "put_batch shm", "shape": shape, "config": "leased" if leases else "two-phase",
                          "calls": len(secs), "median_ms": med * 1000, "objects_per_s": count / med,
                          "gb_per_s": count * size / med / 1e9}))

    ratios = {"put_from 4 KiB p50, leased / two-phase, tcp": p50["tcp/leased"] / p50["tcp/two-phase"],
              "put_from 4 KiB p50, leased / two-phase, shm": p50["shm/leased"] / p50["shm/two-phase"],
              "put_from 4 KiB p50, leased shm / leased tcp": p50["shm/leased"] / p50["tcp/leased"]}
    if rds is not None:
        for n in ("tcp/leased", "shm/leased"):
            ratios[f"put_from 4 KiB p50, {n} / redis-py SET"] = p50[n] / p50["redis-py SET"]
    for shape in ("256 x 4096", f"32 x {1 << 20}"):
        ratios[f"put_batch shm {shape} time, leased / two-phase"] = \
            statistics.median(batch[(shape, True)]) / statistics.median(batch[(shape, False)])
    print(json.dumps({"ratios": ratios}, indent=1))
    for c in clients.values():
        c.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
