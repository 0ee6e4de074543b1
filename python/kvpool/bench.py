"""The Python half of ``kvpool bench --only python``: the Python client, numpy and redis-py, measured.

Run by the Java benchmark (``kvpool-bench``'s ``PythonBench``) as a server that takes one phase at a
time on stdin and answers with its measurement on stdout, so each Python figure is taken right after
the Java client's figure for the same shape, against the same pool and the same Redis::

    python3 -m kvpool.bench --serve --master HOST:PORT --redis HOST:PORT

It also runs by hand, printing one JSON summary per phase (and, with ``--profile DIR``, a cProfile
of every client's measured window, with the top functions on stderr)::

    PYTHONPATH=python python3 -m kvpool.bench --master 127.0.0.1:PORT --redis 127.0.0.1:PORT \\
        --phase get-shm,get-tcp,put-shm,put-tcp,exists --clients 1,2 --warmup 0.5 --duration 2

Phases (values of 1 MiB, batches of 64, as ``KvpoolTarget.getBatched``/``putBatched`` on the Java side):

* ``get-shm`` / ``get-tcp``: ``get_into_batch`` of 64 keys into 64 distinct 1 MiB numpy rows, over the
  same-machine path or over TCP (``Client(shared_memory=False)``); each client first stores 128 keys
  of its own and reads a random window of 64 consecutive ones per call.
* ``put-shm`` / ``put-tcp``: ``put_batch`` of 64 fresh keys, the same 1 MiB numpy array as every value.
* ``numpy``: the ceiling of a same-machine get: 64 ``np.copyto`` per call from random 4 KiB-aligned
  offsets of a 1 GiB committed region into the same 64 rows (the Java ``MemcpyTarget.getBatched``).
* ``redis-get`` / ``redis-put``: redis-py, pipelined GET of 64 of 128 stored keys / SET of 64 fresh
  keys, the same 1 MiB values (redis-py returns a new ``bytes`` per GET: it has no read-into).
* ``exists`` / ``redis-exists``: ``batch_exists`` of 1024 stored keys / redis-py pipelined EXISTS of
  the same keys.
* Single small operations, one call at a time (4 KiB values; latency per call is what counts):
  ``small-put-shm`` / ``small-put-tcp``: ``put_from`` of fresh keys; ``small-get-shm`` / ``small-get-tcp``:
  ``get_into`` of a random one of 1,000 stored keys into one buffer; ``small-exists-shm`` /
  ``small-exists-tcp``: ``exists`` of one of those keys; ``redis-small-set`` / ``-get`` / ``-exists``:
  redis-py's SET of fresh keys, GET and EXISTS of one of 1,000 stored keys, not pipelined.

Clients are **processes** (multiprocessing, spawn), each with its own ``Client`` (and Redis
connection): no GIL between them, as engines' workers run. The processes stay up between phases, but
each phase opens new ``Client`` objects (connections and segment mappings), as the Java side opens a
new ``KvPoolClient`` per measurement, so no phase inherits another's page-table entries.
Each client warms up for ``warmup`` seconds, then all start together and run for ``duration``; an
operation in progress at the end finishes and counts. Latency is per call (per batch).

Protocol (serve mode): one JSON object a line each way. Request ``{"phase", "clients", "warmup",
"duration", "run", "keys"?}``, answer ``{"ok": true, "phase", "clients", "ops", "bytes", "wall_ns",
"lat_ns": [...], "mode": "processes"}`` or ``{"ok": false, "error": "..."}``; ``{"quit": true}``
ends it. Progress and logs go to stderr only.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import sys
import time
import traceback
from typing import Any, Callable

VALUE = 1 << 20
BATCH = 64
WORKING_SET = 128  # keys each client stores for a get phase (Java: 128 MiB of 1 MiB values)
REGION = 1 << 30   # the numpy baseline's source region
ALIGN = 4096
EXISTS_KEYS = 1024

SMALL = 4096  # single small operations: the value size
SMALL_KEYS = 1000  # keys each client stores for small gets and exists

KVPOOL_PHASES = ("get-shm", "get-tcp", "put-shm", "put-tcp", "exists")
REDIS_PHASES = ("redis-get", "redis-put", "redis-exists")
SMALL_PHASES = tuple(f"small-{op}-{path}" for op in ("put", "get", "exists") for path in ("shm", "tcp")) + \
    ("redis-small-set", "redis-small-get", "redis-small-exists")
PHASES = KVPOOL_PHASES + ("numpy",) + REDIS_PHASES + SMALL_PHASES


def lookup_keys(n: int = EXISTS_KEYS) -> list[str]:
    """81-byte keys like the Java lookup's (a model prefix and 64 hex digits), for runs by hand."""
    rnd = random.Random(81)
    return ["llama3-8b@v7/tp0/" + "%064x" % rnd.getrandbits(256) for _ in range(n)]


# ------------------------------------------------------------------------------------- clients


class _Worker:
    """One benchmark client, living in its own process."""

    def __init__(self, wid: int, master: str, redis_addr: str | None) -> None:
        import numpy as np

        self.np = np
        self.wid = wid
        self.master = master
        self.redis_addr = redis_addr
        self._kv: dict[bool, Any] = {}
        self._redis: Any = None
        self._redis_fast: Any = None
        self._region: Any = None
        rng = np.random.default_rng(wid + 1)
        self.value = rng.integers(0, 256, VALUE, dtype=np.uint8)  # what an engine's KV block is: an array
        self.value_bytes = self.value.tobytes()
        self.small = rng.integers(0, 256, SMALL, dtype=np.uint8).tobytes()
        self.small_buf = bytearray(SMALL)
        self.dst = np.empty((BATCH, VALUE), np.uint8)
        self.dst.fill(wid)  # touch every page now, not during a measurement
        self.rows = list(self.dst)  # 64 distinct destinations, like the Java side's 64 segments
        self.op: Callable[[int], int] | None = None
        self.it = 0

    def kv(self, shm: bool) -> Any:
        c = self._kv.get(shm)
        if c is None:
            import kvpool

            c = self._kv[shm] = kvpool.Client(self.master, shared_memory=shm)
        return c

    def redis(self, fastest: bool = False) -> Any:
        """The redis-py client; ``fastest``: one with redis-py's defaults (no socket timeout, which here made
        single SETs and EXISTS more than twice as slow), for the single small operations."""
        r = self._redis_fast if fastest else self._redis
        if r is None:
            import redis

            host, _, port = (self.redis_addr or "").rpartition(":")
            if not host:
                raise ValueError("a redis phase needs --redis HOST:PORT")
            if fastest:
                r = self._redis_fast = redis.Redis(host=host, port=int(port))
            else:
                r = self._redis = redis.Redis(host=host, port=int(port), socket_timeout=60)
        return r

    def region(self) -> Any:
        if self._region is None:
            self._region = self.np.full(REGION, 0x5A, self.np.uint8)  # committed: every page touched
        return self._region

    # each builder does the phase's setup and returns the operation: one call, the payload bytes it moved

    def build(self, phase: str, run: int, keys: list[str] | None) -> Callable[[int], int]:
        rnd = random.Random(run * 1_000_003 + self.wid)
        if phase.startswith("small-") or phase.startswith("redis-small-"):
            return self.build_small(phase, run, rnd)
        if phase in ("get-shm", "get-tcp"):
            shm = phase == "get-shm"
            c = self.kv(shm)
            ks = [f"python-{phase[4:]}/getb/{run}/{self.wid}/{k}" for k in range(WORKING_SET)]
            for lo in range(0, WORKING_SET, BATCH):
                st = c.put_batch(ks[lo:lo + BATCH], [self.value] * BATCH)
                if any(s.name != "OK" for s in st):
                    raise RuntimeError(f"storing the working set: {st}")
            rows = self.rows

            def get(i: int) -> int:
                s = rnd.randrange(WORKING_SET - BATCH + 1)
                got = c.get_into_batch(ks[s:s + BATCH], rows)
                if got.count(VALUE) != BATCH:
                    raise RuntimeError(f"a batched get returned {got}")
                return VALUE * BATCH
            return get
        if phase in ("put-shm", "put-tcp"):
            c = self.kv(phase == "put-shm")
            values = [self.value] * BATCH
            name = f"python-{phase[4:]}"
            wid = self.wid

            def put(i: int) -> int:
                ks = [f"{name}/putb/{run}/{wid}/{i}/{b}" for b in range(BATCH)]
                st = c.put_batch(ks, values)
                for s in st:
                    if s.name != "OK":
                        raise RuntimeError(f"a batched put returned {s}")
                return VALUE * BATCH
            return put
        if phase == "numpy":
            region, rows, copyto = self.region(), self.rows, self.np.copyto
            slots = (REGION - VALUE) // ALIGN + 1

            def copy(i: int) -> int:
                for d in rows:
                    o = rnd.randrange(slots) * ALIGN
                    copyto(d, region[o:o + VALUE])
                return VALUE * BATCH
            return copy
        if phase == "exists":
            assert keys
            c, ek = self.kv(True), keys

            def exists(i: int) -> int:
                if not all(c.batch_exists(ek)):
                    raise RuntimeError("a stored key was reported missing")
                return 0
            return exists
        if phase == "redis-get":
            r = self.redis()
            ks = [f"redis-py/getb/{run}/{self.wid}/{k}" for k in range(WORKING_SET)]
            for lo in range(0, WORKING_SET, BATCH):
                pipe = r.pipeline(transaction=False)
                for k in ks[lo:lo + BATCH]:
                    pipe.set(k, self.value_bytes)
                if not all(pipe.execute()):
                    raise RuntimeError("storing the Redis working set failed")

            def rget(i: int) -> int:
                s = rnd.randrange(WORKING_SET - BATCH + 1)
                pipe = r.pipeline(transaction=False)
                for k in ks[s:s + BATCH]:
                    pipe.get(k)
                got = pipe.execute()
                for v in got:
                    if v is None or len(v) != VALUE:
                        raise RuntimeError("a Redis GET missed")
                return VALUE * BATCH
            return rget
        if phase == "redis-put":
            r, v, wid = self.redis(), self.value_bytes, self.wid

            def rput(i: int) -> int:
                pipe = r.pipeline(transaction=False)
                for b in range(BATCH):
                    pipe.set(f"redis-py/putb/{run}/{wid}/{i}/{b}", v)
                if not all(pipe.execute()):
                    raise RuntimeError("a Redis SET failed")
                return VALUE * BATCH
            return rput
        if phase == "redis-exists":
            assert keys
            r, rk = self.redis(), keys

            def rexists(i: int) -> int:
                pipe = r.pipeline(transaction=False)
                for k in rk:
                    pipe.exists(k)
                if not all(pipe.execute()):
                    raise RuntimeError("Redis EXISTS reported a stored key missing")
                return 0
            return rexists
        raise ValueError(f"unknown phase {phase!r}; phases are {', '.join(PHASES)}")

    def build_small(self, phase: str, run: int, rnd: random.Random) -> Callable[[int], int]:
        """A single small operation a call (see the module notes): kvpool over either path, or redis-py."""
        v, buf, name = self.small, self.small_buf, f"{phase}/{run}/{self.wid}"
        stored = [f"{name}/{k}" for k in range(SMALL_KEYS)]
        if phase.startswith("redis-"):
            r = self.redis(fastest=True)
            if phase != "redis-small-set":
                pipe = r.pipeline(transaction=False)
                for k in stored:
                    pipe.set(k, v)
                pipe.execute()

            def rset(i: int) -> int:
                if not r.set(f"{name}/{i}", v):
                    raise RuntimeError("a Redis SET failed")
                return SMALL

            def rget(i: int) -> int:
                got = r.get(stored[rnd.randrange(SMALL_KEYS)])
                if got is None or len(got) != SMALL:
                    raise RuntimeError("a Redis GET missed")
                return SMALL

            def rexists(i: int) -> int:
                if r.exists(stored[rnd.randrange(SMALL_KEYS)]) != 1:
                    raise RuntimeError("Redis EXISTS reported a stored key missing")
                return 0
            return {"redis-small-set": rset, "redis-small-get": rget, "redis-small-exists": rexists}[phase]
        _, op, path = phase.split("-")
        c = self.kv(path == "shm")
        if op != "put":
            st = c.put_batch(stored, [v] * SMALL_KEYS)
            if any(s.name != "OK" for s in st):
                raise RuntimeError(f"storing the small keys: {set(st)}")

        def put(i: int) -> int:
            st = c.put_from(f"{name}/{i}", v)
            if st.name != "OK":
                raise RuntimeError(f"a small put returned {st}")
            return SMALL

        def get(i: int) -> int:
            if c.get_into(stored[rnd.randrange(SMALL_KEYS)], buf) != SMALL:
                raise RuntimeError("a small get missed")
            return SMALL

        def exists(i: int) -> int:
            if not c.exists(stored[rnd.randrange(SMALL_KEYS)]):
                raise RuntimeError("a stored key was reported missing")
            return 0
        return {"put": put, "get": get, "exists": exists}[op]

    def prepare(self, phase: str, run: int, warmup: float, keys: list[str] | None) -> None:
        self.close_clients()
        self.op = op = self.build(phase, run, keys)
        end = time.monotonic() + warmup
        while time.monotonic() < end:
            op(self.it)
            self.it += 1

    def measure(self, duration: float, profile: str | None) -> dict[str, Any]:
        op = self.op
        assert op is not None
        lat: list[int] = []
        nbytes = 0
        it = self.it
        clock = time.monotonic_ns  # CLOCK_MONOTONIC: comparable across processes
        prof = None
        if profile:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        start = clock()
        end = start + int(duration * 1e9)
        while True:
            t0 = clock()
            if t0 >= end:
                break
            nbytes += op(it)
            it += 1
            lat.append(clock() - t0)
        finish = clock()
        if prof is not None and profile:
            prof.disable()
            prof.dump_stats(profile)
        self.it = it
        self.op = None
        self.close_clients()
        return {"start": start, "end": finish, "ops": len(lat), "bytes": nbytes, "lat": lat}

    def close_clients(self) -> None:
        """A phase's kvpool clients end with it: each phase connects afresh, as the Java side does."""
        for c in self._kv.values():
            c.close()
        self._kv.clear()

    def close(self) -> None:
        self.close_clients()
        for r in (self._redis, self._redis_fast):
            if r is not None:
                r.close()


def _load(path: str) -> Any:
    """``"module:name"`` -> the object, imported in this process."""
    import importlib

    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _worker_main(conn: Any, wid: int, master: str, redis_addr: str | None, worker: str = "kvpool.bench:_Worker",
                 options: dict[str, Any] | None = None) -> None:
    """A client process: builds and warms up a phase on "prepare", measures it on "go". ``worker`` names the
    worker class (``module:Class``, a ``_Worker`` or a subclass of it), built with ``options`` as keywords."""
    os.dup2(2, 1)  # stdout belongs to the driver's protocol
    w = None
    try:
        w = _load(worker)(wid, master, redis_addr, **(options or {}))
        while True:
            try:
                msg = conn.recv()
            except EOFError:
                return  # the driver is gone
            if msg is None:
                return
            try:
                if msg["cmd"] == "prepare":
                    w.prepare(msg["phase"], msg["run"], msg["warmup"], msg.get("keys"))
                    conn.send(("ok", None))
                else:
                    conn.send(("ok", w.measure(msg["duration"], msg.get("profile"))))
            except BaseException:
                conn.send(("error", f"client {wid}: {traceback.format_exc()}"))
    finally:
        if w is not None:
            w.close()


# -------------------------------------------------------------------------------------- driver


class Driver:
    """Runs phases on 1..N client processes against one pool (and one Redis).

    Subclasses measure other workloads with the same processes, warm-up, barrier and timing: they name
    their worker class (``worker``, ``module:Class``; ``options`` are its keyword arguments), their phases
    (``phases``) and how a phase leaves its stores empty (``clear``).
    """

    phases: tuple[str, ...] = PHASES

    def __init__(self, master: str, redis_addr: str | None, worker: str = "kvpool.bench:_Worker",
                 options: dict[str, Any] | None = None) -> None:
        self.master = master
        self.redis_addr = redis_addr
        self.worker = worker
        self.options = options or {}
        self.ctx = mp.get_context("spawn")
        self.workers: list[tuple[Any, Any]] = []  # (process, connection)
        self._admin: Any = None
        self._radmin: Any = None
        self.run_no = 0

    def admin(self) -> Any:
        if self._admin is None:
            import kvpool

            self._admin = kvpool.Client(self.master)
        return self._admin

    def radmin(self) -> Any:
        if self._radmin is None:
            import redis

            host, _, port = (self.redis_addr or "").rpartition(":")
            if not host:
                raise ValueError("a redis phase needs --redis HOST:PORT")
            self._radmin = redis.Redis(host=host, port=int(port), socket_timeout=60)
        return self._radmin

    def _ensure(self, n: int) -> None:
        from kvpool import bench  # the worker function by its importable name, whatever __main__ is

        while len(self.workers) < n:
            parent, child = self.ctx.Pipe()
            p = self.ctx.Process(target=bench._worker_main, args=(child, len(self.workers), self.master,
                                                                   self.redis_addr, self.worker, self.options),
                                 daemon=True)
            p.start()
            child.close()
            self.workers.append((p, parent))

    def _ask(self, ws: list[tuple[Any, Any]], msgs: list[dict[str, Any]]) -> list[Any]:
        for (_, conn), m in zip(ws, msgs):
            conn.send(m)
        out, errors = [], []
        for p, conn in ws:
            try:
                status, value = conn.recv()
            except EOFError:
                status, value = "error", f"client process {p.pid} died (exit {p.exitcode})"
            if status != "ok":
                errors.append(value)
            out.append(value)
        if errors:
            raise RuntimeError("\n".join(errors))
        return out

    def clear(self, phase: str) -> None:
        """Leaves the store empty, so no phase inherits another's objects (or their eviction)."""
        if phase.startswith("redis"):
            self.radmin().flushall()
        elif phase != "numpy":
            self.admin().remove_all(force=True)

    def run(self, phase: str, clients: int, warmup: float, duration: float, keys: list[str] | None = None,
            profile: str | None = None) -> dict[str, Any]:
        if phase not in self.phases:
            raise ValueError(f"unknown phase {phase!r}; phases are {', '.join(self.phases)}")
        if clients < 1:
            raise ValueError(f"clients must be at least 1, got {clients}")
        self.run_no += 1
        self.clear(phase)
        if phase in ("exists", "redis-exists"):
            keys = keys or lookup_keys()
            self._store_lookup_keys(phase, keys)
        self._ensure(clients)
        ws = self.workers[:clients]
        try:
            self._ask(ws, [{"cmd": "prepare", "phase": phase, "run": self.run_no, "warmup": warmup, "keys": keys}
                           for _ in ws])
            res = self._ask(ws, [{"cmd": "go", "duration": duration,
                                  "profile": f"{profile}/{phase}-c{clients}-w{i}.prof" if profile else None}
                                 for i in range(len(ws))])
        finally:
            self.clear(phase)
        lat = [x for r in res for x in r["lat"]]
        return {"ok": True, "phase": phase, "clients": clients, "mode": "processes",
                "ops": sum(r["ops"] for r in res), "bytes": sum(r["bytes"] for r in res),
                "wall_ns": max(r["end"] for r in res) - min(r["start"] for r in res), "lat_ns": lat}

    def _store_lookup_keys(self, phase: str, keys: list[str]) -> None:
        if phase == "exists":
            st = self.admin().put_batch(keys, [bytes(64)] * len(keys))
            if any(s.name not in ("OK", "ALREADY_EXISTS") for s in st):
                raise RuntimeError(f"storing the lookup keys: {st}")
        else:
            pipe = self.radmin().pipeline(transaction=False)
            for k in keys:
                pipe.set(k, b"x")
            pipe.execute()

    def close(self) -> None:
        for p, conn in self.workers:
            try:
                conn.send(None)
            except OSError:
                pass
        for p, _ in self.workers:
            p.join(10)
            if p.is_alive():
                p.terminate()
        if self._admin is not None:
            self._admin.close()
        if self._radmin is not None:
            self._radmin.close()


def summary(r: dict[str, Any]) -> dict[str, Any]:
    """GB/s, ops/s and latency percentiles of a result (percentiles as the Java ``Measurement``)."""
    lat = sorted(r["lat_ns"])

    def pct(p: float) -> float:
        if not lat:
            return 0.0
        import math

        return lat[min(len(lat) - 1, max(0, math.ceil(p * len(lat)) - 1))] / 1e3

    wall = r["wall_ns"]
    return {"phase": r["phase"], "clients": r["clients"], "mode": r["mode"], "ops": r["ops"],
            "gb_per_s": round(r["bytes"] / wall, 3) if wall else 0, "ops_per_s": round(r["ops"] * 1e9 / wall, 1)
            if wall else 0, "p50_us": round(pct(0.5), 1), "p99_us": round(pct(0.99), 1)}


def versions() -> str:
    """What the Python side runs with, for the results' environment."""
    import numpy
    import redis

    from . import crc

    return (f"{sys.version.split()[0]}, numpy {numpy.__version__}, redis-py {redis.__version__}, "
            f"crc32c {getattr(crc, 'BACKEND', '?')}")


def _serve(d: Driver, hello: Callable[[], dict[str, Any]] = lambda: {"python": versions()}) -> int:
    """Serve mode: a ready line (``{"ok": true, "ready": true, **hello()}``), then one answer per request."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else printed goes to stderr
    sys.stdout = sys.stderr
    out.write(json.dumps({"ok": True, "ready": True, **hello()}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            if req.get("quit"):
                break
            print(f"kvpool.bench: {req['phase']} x{req['clients']}", file=sys.stderr, flush=True)
            res = d.run(req["phase"], int(req["clients"]), float(req["warmup"]), float(req["duration"]),
                        req.get("keys"))
        except Exception as e:  # noqa: BLE001 - reported to the Java side, which fails the section
            res = {"ok": False, "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
        out.write(json.dumps(res, separators=(",", ":")) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m kvpool.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--master", required=True, help="the pool's master, host:port")
    ap.add_argument("--redis", help="a Redis for the redis-py baseline, host:port (it is flushed!)")
    ap.add_argument("--serve", action="store_true", help="take phases as JSON lines on stdin (the Java bench)")
    ap.add_argument("--phase", default="numpy,get-shm,get-tcp,put-shm,put-tcp,exists",
                    help=f"comma-separated phases: {', '.join(PHASES)}")
    ap.add_argument("--clients", default="1,2", help="comma-separated client (process) counts")
    ap.add_argument("--warmup", type=float, default=0.5, help="seconds of untimed calls per client first")
    ap.add_argument("--duration", type=float, default=2.0, help="seconds measured")
    ap.add_argument("--profile", metavar="DIR", help="cProfile every client's measured window into DIR")
    a = ap.parse_args(argv)
    d = Driver(a.master, a.redis)
    try:
        if a.serve:
            return _serve(d)
        if a.profile:
            os.makedirs(a.profile, exist_ok=True)
        for clients in [int(c) for c in a.clients.split(",")]:
            for phase in a.phase.split(","):
                r = d.run(phase, clients, a.warmup, a.duration, profile=a.profile)
                print(json.dumps(summary(r)), flush=True)
                if a.profile:
                    import pstats

                    print(f"--- {phase} x{clients}, client 0: top functions by own time", file=sys.stderr)
                    pstats.Stats(f"{a.profile}/{phase}-c{clients}-w0.prof", stream=sys.stderr) \
                        .sort_stats("tottime").print_stats(15)
        return 0
    finally:
        d.close()


if __name__ == "__main__":
    sys.exit(main())
