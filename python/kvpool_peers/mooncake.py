"""The real Mooncake, started and stopped by PID: the wheel's ``mooncake_master`` and one
``mooncake_client`` (Mooncake's standalone store process, which contributes the memory) on loopback.

Used by the peer suite (python/peer_tests/conftest.py) and by ``kvpool bench --only mooncake``; run it with
the mooncake peer's interpreter (``scripts/peers.sh python mooncake``). Each process runs in its own
session and is stopped with its group (TERM, then KILL after 10 s); glog output goes to files under a
temp dir of the cluster's own (``KVPOOL_PEER_KEEP_LOGS=1`` keeps them; a failed start keeps them and
shows their last lines). A cluster is ready when a store set up against its master, contributing no
memory itself, can put and read back a probe key: only then has the store process mounted its segment.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import mooncake
import mooncake.store

from kvpool_peers.ports import reservable_ports

# The wheel the peer is pinned to (peers/mooncake/requirements.txt).
MOONCAKE_DIST = "mooncake-transfer-engine-non-cuda"
MOONCAKE_VERSION = "0.3.13.post1"

MIB = 1 << 20


def mooncake_binary(name: str) -> Path:
    """The wheel's native program ``name``: in the package directory (the venv's bin/ has Python
    wrappers that exec it), falling back to the venv's bin/."""
    for p in (Path(mooncake.__file__).resolve().parent / name, Path(sys.executable).parent / name):
        if p.is_file():
            if not os.access(p, os.X_OK):
                p.chmod(p.stat().st_mode | 0o111)
            return p
    raise RuntimeError(f"{name} not found in {Path(mooncake.__file__).parent} nor {Path(sys.executable).parent}")


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return f"(no log at {path})"


class MooncakeCluster:
    """A running Mooncake: ``mooncake_master`` and one ``mooncake_client`` store process."""

    def __init__(self, *, global_segment_size: str = "1GB", lease_ttl_ms: Optional[int] = 100,
                 master_args: list[str] | None = None, client_args: list[str] | None = None,
                 timeout: float = 60.0) -> None:
        """``lease_ttl_ms``: the master's ``--default_kv_lease_ttl`` (None: Mooncake's own default, 10 s)."""
        self.lease_ttl_ms = 10_000 if lease_ttl_ms is None else lease_ttl_ms
        self.log_dir = Path(tempfile.mkdtemp(prefix="mooncake-pytest-"))
        self.rpc_port, self.metrics_port, self.http_port, self.client_port = reservable_ports(4)
        self.master = f"127.0.0.1:{self.rpc_port}"
        self.store_address = f"127.0.0.1:{self.client_port}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            self._spawn("master", [
                str(mooncake_binary("mooncake_master")), f"--rpc_port={self.rpc_port}", "--rpc_address=127.0.0.1",
                f"--metrics_port={self.metrics_port}", "--metrics_host=127.0.0.1",
                f"--http_metadata_server_port={self.http_port}", "--http_metadata_server_host=127.0.0.1",
                *([f"--default_kv_lease_ttl={lease_ttl_ms}"] if lease_ttl_ms is not None else []),
                *(master_args or [])])
            deadline = time.monotonic() + timeout
            self._wait_listening(self.rpc_port, "master", deadline)
            self._spawn("client", [
                str(mooncake_binary("mooncake_client")), f"--master_server_address={self.master}",
                f"--global_segment_size={global_segment_size}", "--protocol=tcp",
                "--metadata_server=P2PHANDSHAKE", "--host=127.0.0.1", f"--port={self.client_port}",
                *(client_args or [])])
            self._wait_store(deadline, timeout)
        except BaseException:
            self.stop(keep_logs=True)
            raise

    def log(self, name: str) -> Path:
        """The log file of ``name`` ("master" or "client"): its stdout and stderr, glog included."""
        return self.log_dir / f"{name}.log"

    def _spawn(self, name: str, cmd: list[str]) -> None:
        env = dict(os.environ, GLOG_logtostderr="1")  # glog into our log file, none in /tmp
        with open(self.log(name), "wb") as out:
            self.procs[name] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                                cwd=self.log_dir, env=env, start_new_session=True)

    def _fail(self, why: str) -> RuntimeError:
        tails = "".join(f"\n--- last lines of {self.log(n)} ---\n{_tail(self.log(n))}" for n in self.procs)
        return RuntimeError(f"Mooncake (master {self.master}, store {self.store_address}): {why}{tails}")

    def _check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise self._fail(f"mooncake_{name} exited with {p.returncode} while starting")

    def _wait_listening(self, port: int, name: str, deadline: float) -> None:
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise self._fail(f"mooncake_{name} did not listen on port {port} in time")

    def _wait_store(self, deadline: float, timeout: float) -> None:
        """Until a store set up against the master (contributing no memory itself) puts and reads back
        a probe key, which needs the mooncake_client's segment mounted."""
        key = f"kvpool-peer-probe-{uuid.uuid4().hex}"
        value = b"probe"
        last = "no attempt"
        store = mooncake.store.MooncakeDistributedStore()
        try:
            rc = store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 * MIB, "tcp", "", self.master)
            if rc != 0:
                raise self._fail(f"a probe store's setup against the master returned {rc}")
            while time.monotonic() < deadline:
                self._check_alive()
                rc = store.put(key, value)
                if rc == 0:
                    got = store.get(key)
                    if got == value:
                        time.sleep(self.lease_ttl_ms / 1000 + 0.05)
                        store.remove(key, True)
                        return
                    last = f"put returned 0 but get returned {got!r}"
                else:
                    last = f"put returned {rc}"
                time.sleep(0.1)
            raise self._fail(f"no put and get of a probe key within {timeout}s (last: {last})")
        finally:
            store.close()

    def stop(self, keep_logs: bool = False) -> None:
        """Stops the store process, then the master (TERM to each process group, KILL after 10s)."""
        for name in ("client", "master"):
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            except ProcessLookupError:
                p.wait()
        if not keep_logs and not os.environ.get("KVPOOL_PEER_KEEP_LOGS"):
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> MooncakeCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_mooncake_cluster(**options: Any) -> MooncakeCluster:
    """Starts a Mooncake of your own (stop it, or use it as a context manager). Options:
    global_segment_size ("1GB"), lease_ttl_ms (100), master_args, client_args (more flags), timeout (60s)."""
    return MooncakeCluster(**options)
