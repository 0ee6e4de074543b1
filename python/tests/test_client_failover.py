"""The Python client given etcd://: it finds the elected Java master, and when the leader is killed
with SIGKILL it moves to the next one by itself. Real processes throughout: etcd (scripts/etcd.sh),
two Java masters elected through it, one node. Every wait is for a condition, with a deadline."""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import kvpool
from conftest import JAR, find_java, free_port, wait_until
from test_etcd import Etcd, etcd  # noqa: F401  (etcd: the module-scoped fixture that runs a real etcd)


def value_of(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest() * 64  # 2 KiB that depend on the key


class ElectedCluster:
    def __init__(self, etcd: Etcd, dir: Path) -> None:
        self.java = find_java()
        self.dir = dir
        self.url = etcd.url(f"py-{os.getpid()}-{int(time.time() * 1000) % 100000}")
        self.masters: dict[str, subprocess.Popen[bytes]] = {}
        self.procs: list[subprocess.Popen[bytes]] = []
        for ident in ("m1", "m2"):
            self.masters[ident] = self._spawn(ident, ["master", "--host", "127.0.0.1", "--port", str(free_port()),
                                                      "--http-port", "-1", "--etcd", self.url, "--id", ident])
            if ident == "m1":
                self.leader_id(ready=True)  # m1 leads: m2 starts after it won
        self._spawn("node", ["node", "--master", self.url, "--host", "127.0.0.1", "--port", str(free_port()),
                             "--segment-size", "64MiB", "--shm-dir", "none", "--heartbeat-interval", "200ms"])

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        p = subprocess.Popen([str(self.java), "--enable-native-access=ALL-UNNAMED", "-Xmx256m", "-jar", str(JAR), *args],
                             stdout=open(self.dir / f"{name}.log", "wb"), stderr=subprocess.STDOUT,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def leader_id(self, *, ready: bool, other_than: str | None = None, timeout: float = 60.0) -> str:
        watch = kvpool.etcd.LeaderWatch(self.url, timeout=2.0)
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                leader = watch.current()
                if leader is not None and (leader.ready or not ready) and leader.id != other_than:
                    return leader.id
                time.sleep(0.05)
        finally:
            watch.close()
        raise AssertionError(f"no {'ready ' if ready else ''}leader other than {other_than} in {self.url}")

    def nodes_listed(self) -> int:
        """How many registered nodes the leader has published in etcd (what a next leader waits for)."""
        target = kvpool.etcd.parse_etcd_url(self.url)
        return len(kvpool.etcd.EtcdGateway(target, timeout=2.0).range_prefix(f"/kvpool/{target.cluster}/nodes/"))

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_the_client_follows_the_leader_across_a_failover(etcd: Etcd, tmp_path: Path) -> None:
    assert JAR.exists(), f"{JAR} is not built: ./kvpool build (./kvpool test builds it before this suite)"
    cluster = ElectedCluster(etcd, tmp_path)
    try:
        with kvpool.Client(cluster.url, timeout=30) as c:
            wait_until(lambda: any(s.active for s in c.status().segments), "the node's segment to be active", 60)
            keys = [f"py/{i}" for i in range(300)]
            assert c.put_batch(keys, [value_of(k) for k in keys]) == [kvpool.PutStatus.OK] * len(keys)
            # the next leader takes over the nodes the leader listed in etcd: wait until it has
            wait_until(lambda: cluster.nodes_listed() == 1, "the leader to list its node in etcd", 60, interval=0.05)
            first = cluster.leader_id(ready=True)
            os.killpg(cluster.masters[first].pid, signal.SIGKILL)
            cluster.masters[first].wait()
            # the next call waits for the new leader and goes on there
            for k in keys:
                assert c.get(k) == value_of(k), k
            assert c.put("py/after", value_of("py/after")) == kvpool.PutStatus.OK
            assert cluster.leader_id(ready=True) != first
            assert c.get("py/after") == value_of("py/after")
    finally:
        cluster.stop()


def test_a_bad_etcd_address_is_named() -> None:
    with pytest.raises(ValueError, match="etcd"):
        kvpool.Client("etcd://")
    with pytest.raises(kvpool.MasterUnreachable, match="no master"):
        kvpool.Client(f"etcd://127.0.0.1:{free_port()}/nobody", timeout=1, connect_timeout=0.5)
