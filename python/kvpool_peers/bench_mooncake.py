"""The Python half of ``kvpool bench --only mooncake``: one workload through the real ``mooncake.store`` and
through ``kvpool.mooncake``, in the same run, on the same machine.

The real side is the pinned wheel's binding against its own ``mooncake_master`` and a ``mooncake_client``
store process (Mooncake's standalone store, holding the memory) that this module starts and stops by
PID; the store in each benchmark process contributes no memory (``global_segment_size`` 0), as a kvpool
client contributes none. The kvpool side is ``kvpool.mooncake`` against a kvpool pool given by address,
measured twice: with its default same-machine path (``kvpool``) and with every byte over TCP
(``kvpool-tcp``), which is the transport the Mooncake side uses.

Phases are ``SYSTEM:OP:SIZE``: SYSTEM ``mooncake``, ``kvpool`` or ``kvpool-tcp``; OP ``put``
(``put_from`` of one value from a registered buffer, a fresh key each call), ``get`` (``get_into`` a
registered buffer, cycling over 16 stored keys), ``batch_put`` (``batch_put_from`` of 16 fresh keys),
``batch_get`` (``batch_get_into`` of the 16 stored keys into 16 registered slots); SIZE in bytes. Every
call is checked (a put must answer 0, a get the value's length), so a failure cannot pass as speed.

Clients are processes (multiprocessing, spawn), each its own store, through ``kvpool.bench``'s driver:
warm-up, a common start, ``duration`` seconds, the store emptied after every phase. By hand::

    PYTHONPATH=python .peers/mooncake/venv/bin/python -m kvpool_peers.bench_mooncake \\
        --kvpool-master 127.0.0.1:PORT --sizes 4096,65536 --ops put,get --clients 1,2 --duration 1

prints one JSON line per phase and the kvpool/Mooncake ratio of each row; with ``--profile DIR``, a
cProfile of each kvpool phase's first client, per call in all and waiting on sockets (the round trips),
and its top functions. ``--serve`` is the Java side's protocol (``kvpool.bench``'s, with a ready line naming the versions).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

from kvpool import bench as kb

SYSTEMS = ("mooncake", "kvpool", "kvpool-tcp")
OPS = ("put", "get", "batch_put", "batch_get")
SIZES = (4 << 10, 64 << 10, 1 << 20, 4 << 20)
BATCH = 16
#: the store process's memory and the kvpool pool's segment (the Java side starts that pool)
SEGMENT = "4GB"


def phase_name(system: str, op: str, size: int) -> str:
    return f"{system}:{op}:{size}"


def parse_phase(phase: str) -> tuple[str, str, int]:
    system, op, size = phase.split(":")
    if system not in SYSTEMS or op not in OPS or int(size) <= 0:
        raise ValueError(f"bad phase {phase!r}: SYSTEM:OP:SIZE with SYSTEM in {SYSTEMS}, OP in {OPS}")
    return system, op, int(size)


def open_store(system: str, kvpool_master: str, mooncake_master: str) -> Any:
    """A set-up store of the system: the real binding, or kvpool's with or without the same-machine path."""
    if system == "mooncake":
        import mooncake.store as ms

        s = ms.MooncakeDistributedStore()
        rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", mooncake_master)
    else:
        import kvpool
        import kvpool.mooncake as km

        shm = system == "kvpool"
        s = km.MooncakeDistributedStore(client_factory=lambda m: kvpool.Client(m, shared_memory=shm))
        rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", kvpool_master)
    if rc != 0:
        raise RuntimeError(f"{system}: setup answered {rc}")
    return s


class MooncakeWorker(kb._Worker):
    """A benchmark process with one store per phase and a registered buffer of 16 value slots."""

    def __init__(self, wid: int, master: str, redis_addr: str | None, mooncake_master: str = "") -> None:
        super().__init__(wid, master, redis_addr)
        self.mooncake_master = mooncake_master
        self._store: Any = None
        self._registered: Any = None

    def build(self, phase: str, run: int, keys: list[str] | None) -> Callable[[int], int]:
        system, op, size = parse_phase(phase)
        s = self._store = open_store(system, self.master, self.mooncake_master)
        np = self.np
        buf = self._registered = np.random.default_rng(run * 7 + self.wid).integers(0, 256, BATCH * size, np.uint8)
        base = int(buf.ctypes.data)
        rc = s.register_buffer(base, buf.nbytes)
        if rc != 0:
            raise RuntimeError(f"{system}: register_buffer answered {rc}")
        ptrs = [base + b * size for b in range(BATCH)]
        sizes = [size] * BATCH
        prefix = f"bench/{system}/{op}/{size}/{run}/{self.wid}"
        stored = [f"{prefix}/ws/{b}" for b in range(BATCH)]
        if op in ("get", "batch_get"):
            rcs = s.batch_put_from(stored, ptrs, sizes)
            if any(r != 0 for r in rcs):
                raise RuntimeError(f"{system}: storing the working set answered {rcs}")

        if op == "put":
            def put(i: int) -> int:
                r = s.put_from(f"{prefix}/{i}", ptrs[i % BATCH], size)
                if r != 0:
                    raise RuntimeError(f"{system}: put_from answered {r}")
                return size
            return put
        if op == "batch_put":
            def batch_put(i: int) -> int:
                rcs = s.batch_put_from([f"{prefix}/{i}/{b}" for b in range(BATCH)], ptrs, sizes)
                if any(r != 0 for r in rcs):
                    raise RuntimeError(f"{system}: batch_put_from answered {rcs}")
                return size * BATCH
            return batch_put
        if op == "get":
            def get(i: int) -> int:
                n = s.get_into(stored[i % BATCH], ptrs[(i + 1) % BATCH], size)
                if n != size:
                    raise RuntimeError(f"{system}: get_into answered {n}")
                return size
            return get

        def batch_get(i: int) -> int:
            got = s.batch_get_into(stored, ptrs, sizes)
            if any(n != size for n in got):
                raise RuntimeError(f"{system}: batch_get_into answered {got}")
            return size * BATCH
        return batch_get

    def close_clients(self) -> None:
        super().close_clients()
        if self._store is not None:
            if self._registered is not None:
                self._store.unregister_buffer(int(self._registered.ctypes.data))
            self._store.close()
        self._store = self._registered = None


class MooncakeDriver(kb.Driver):
    """``kvpool.bench``'s driver over the Mooncake-API phases, emptying the phase's system after each."""

    phases = tuple(phase_name(s, o, n) for s in SYSTEMS for o in OPS for n in SIZES)

    def __init__(self, kvpool_master: str, mooncake_master: str) -> None:
        super().__init__(kvpool_master, None, worker="kvpool_peers.bench_mooncake:MooncakeWorker",
                         options={"mooncake_master": mooncake_master})
        self.mooncake_master = mooncake_master
        self._admins: dict[str, Any] = {}

    def run(self, phase: str, clients: int, warmup: float, duration: float, keys: list[str] | None = None,
            profile: str | None = None) -> dict[str, Any]:
        parse_phase(phase)  # any size is allowed, not only SIZES
        if phase not in self.phases:
            self.phases = self.phases + (phase,)
        return super().run(phase, clients, warmup, duration, keys, profile)

    def clear(self, phase: str) -> None:
        system = parse_phase(phase)[0]
        admin = self._admins.get(system)
        if admin is None:
            admin = self._admins[system] = open_store(system, self.master, self.mooncake_master)
        n = admin.remove_all(True)
        if n < 0:
            raise RuntimeError(f"{system}: remove_all answered {n}")

    def close(self) -> None:
        super().close()
        for s in self._admins.values():
            s.close()


def versions() -> dict[str, Any]:
    from importlib import metadata

    return {"python": kb.versions(), "mooncake": metadata.version("mooncake-transfer-engine-non-cuda")}


def print_profile(path: str, calls: int) -> None:
    """Where one client's measured window went: per call, all of it and the part spent waiting on sockets
    (the round trips), then the top functions by own time (on stderr)."""
    import pstats

    st = pstats.Stats(path, stream=sys.stderr)
    waits = ("recv_into", "sendall", "recv", "send")
    wait = sum(v[2] for k, v in st.stats.items()  # type: ignore[attr-defined]
               if k[0] == "~" and any(f"'{w}' of '_socket.socket'" in k[2] for w in waits))
    total = st.total_tt  # type: ignore[attr-defined]
    n = max(calls, 1)
    print(f"# profile {path}: {total / n * 1e6:.0f} us a call, {wait / n * 1e6:.0f} us of it waiting on sockets",
          flush=True)
    st.sort_stats("tottime").print_stats(12)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvpool_peers.bench_mooncake", description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvpool-master", required=True, help="the kvpool pool's master, host:port")
    ap.add_argument("--serve", action="store_true", help="take phases as JSON lines on stdin (the Java bench)")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="comma-separated value sizes in bytes")
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated: {', '.join(OPS)}")
    ap.add_argument("--clients", default="1,2", help="comma-separated process counts")
    ap.add_argument("--warmup", type=float, default=0.3)
    ap.add_argument("--duration", type=float, default=1.0)
    ap.add_argument("--profile", metavar="DIR", help="cProfile every client's measured window into DIR")
    a = ap.parse_args(argv)
    from .mooncake import MooncakeCluster

    with MooncakeCluster(global_segment_size=SEGMENT, lease_ttl_ms=None) as cluster:
        print(f"kvpool_peers.bench_mooncake: Mooncake at {cluster.master} (logs in {cluster.log_dir})",
              file=sys.stderr, flush=True)
        d = MooncakeDriver(a.kvpool_master, cluster.master)
        try:
            if a.serve:
                return kb._serve(d, versions)
            for clients in (int(c) for c in a.clients.split(",")):
                for op in a.ops.split(","):
                    for size in (int(n) for n in a.sizes.split(",")):
                        row = {}
                        for system in SYSTEMS:
                            phase = phase_name(system, op, size)
                            r = kb.summary(d.run(phase, clients, a.warmup, a.duration, profile=a.profile))
                            row[system] = r
                            print(json.dumps(r), flush=True)
                            if a.profile and system != "mooncake":
                                print_profile(f"{a.profile}/{phase}-c{clients}-w0.prof", r["ops"])
                        base = row["mooncake"]["ops_per_s"] or float("nan")
                        print(f"# {op} {size} B x{clients}: kvpool {row['kvpool']['ops_per_s'] / base:.2f}x, "
                              f"kvpool-tcp {row['kvpool-tcp']['ops_per_s'] / base:.2f}x Mooncake"
                              + (" (kvpool profiled: not a measurement)" if a.profile else ""), flush=True)
            return 0
        finally:
            d.close()


if __name__ == "__main__":
    sys.exit(main())
