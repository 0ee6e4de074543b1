"""Test fixtures: real kvpool pools (the Java master and node) started by the tests themselves.

``start_pool(**flags)`` runs ``java -jar kvpool-cli/target/kvpool.jar serve`` on free loopback ports
with a /dev/shm segment, waits until its segment is ACTIVE, and stops it by PID. The jar is built by
the README's test command before the Python suite runs (``./kvpool build`` builds it by hand).
"""

from __future__ import annotations

import atexit
import ctypes
import mmap
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

# the vLLM connector's default reset fence files go to a directory of this run, not /dev/shm
if "KVPOOL_FENCE_DIR" not in os.environ:
    os.environ["KVPOOL_FENCE_DIR"] = tempfile.mkdtemp(prefix="kvpool-fences-")
    atexit.register(shutil.rmtree, os.environ["KVPOOL_FENCE_DIR"], True)

import kvpool  # noqa: E402
from kvpool._net import Connection  # noqa: E402
from kvpool.protocol import Opcode  # noqa: E402
from kvpool_peers.ports import reservable_port  # noqa: E402

JAR = REPO / "kvpool-cli" / "target" / "kvpool.jar"


def find_java() -> Path:
    """A JDK 25 java: $JAVA_HOME, then Temurin 25 where this project's machines have it."""
    for home in (os.environ.get("JAVA_HOME"), "/usr/lib/jvm/temurin-25-jdk-amd64"):
        if home and (Path(home) / "bin" / "java").exists():
            out = subprocess.run([str(Path(home) / "bin" / "java"), "-version"], capture_output=True, text=True)
            if 'version "2' in out.stderr and not 'version "21' in out.stderr:
                return Path(home) / "bin" / "java"
    raise RuntimeError("no JDK 25 found: set JAVA_HOME")


def wait_until(cond: Callable[[], object], what: str, timeout: float = 30.0, interval: float = 0.01) -> None:
    """Polls ``cond`` every ``interval`` seconds until it holds; fails naming ``what`` after ``timeout``
    seconds. What tests wait with instead of sleeping for a time they hope is enough."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(interval)


def tiers_settled(c: kvpool.Client, n: int) -> bool:
    """Nothing moves any more in a pool with an SSD tier: all ``n`` objects are listed (none is on its way to the
    SSD tier, which unlists it) and every segment's memory is under the default eviction watermark (90%), so the
    master's timer starts no eviction round. A bare "every object listed" is not enough: the timer's round after
    the last put spills a few more, and an object in that flight is a miss. Assumes reads that promote nothing
    (``--promote-after 0``) or no reads while waiting."""
    st = c.status()
    return st.keys == n and all(s.used < 0.9 * s.capacity for s in st.segments)


def in_forked_child(fn: Callable[[], bool]) -> bool:
    """Runs ``fn`` in a forked child; True if it returned True there (without raising)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if fn() else 2
        finally:
            os.write(w, bytes([code]))
            os._exit(0)
    os.close(w)
    status = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    return status == b"\x00"


class LayerWrites:
    """Notes the range offset of each write a ``PoolConnector``'s puts in parts make, in order (layer by
    layer: ``layer * layer_bytes``), by wrapping its client. ``after_layer(i)``, called by an engine after
    layer i's ``save_kv_layer``, waits until layer i was written and notes the writes so far."""

    def __init__(self, connector: Any) -> None:
        self.written: list[int] = []
        self.seen: list[list[int]] = []
        written, real = self.written, connector.client

        class Parts:
            def __init__(self, parts: Any) -> None:
                self.parts = parts

            def write_many(self, items: Any, offsets: Any, srcs: Any) -> Any:
                written.append(offsets[0])
                return self.parts.write_many(items, offsets, srcs)

            def __getattr__(self, name: str) -> Any:
                return getattr(self.parts, name)

        class Client:
            def begin_put(self, *args: Any, **kw: Any) -> Parts:
                return Parts(real.begin_put(*args, **kw))

            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

        connector.client = Client()

    def after_layer(self, i: int) -> None:
        wait_until(lambda: len(self.written) > i, f"layer {i} to be written")
        self.seen.append(list(self.written))

    def each_before_the_next(self, layer_bytes: int, layers: int) -> bool:
        """Whether, after each layer, exactly the layers so far had been written, in order."""
        return self.seen == [[j * layer_bytes for j in range(i + 1)] for i in range(layers)]


def opcodes_of(fn: Callable[[], object], monkeypatch: pytest.MonkeyPatch) -> list[Opcode]:
    """The requests this thread sends while ``fn`` runs (the read lease's poller is another thread), without
    the keep-alive PING and the segment table's refresh."""
    sent: list[Opcode] = []
    me = threading.get_ident()
    real = Connection.call

    def spy(self: Connection, opcode: int, *a: Any, **kw: Any) -> Any:
        if threading.get_ident() == me and opcode not in (Opcode.PING, Opcode.CLUSTER_STATS):
            sent.append(Opcode(opcode))
        return real(self, opcode, *a, **kw)

    with monkeypatch.context() as m:
        m.setattr(Connection, "call", spy)
        fn()
    return sent


def free_port() -> int:
    """A port bindable now, below the kernel's ephemeral range, never handed out twice by this process
    (``kvpool_peers.ports``)."""
    return reservable_port()


def remove_segment_files(pid: int) -> None:
    """Removes the /dev/shm segment file of a node process killed with SIGKILL that will not be restarted
    (a node leaves it for its restart to adopt; a test run must not leave gigabytes behind)."""
    for f in Path("/dev/shm").glob(f"kvpool-*-{pid}.seg"):
        f.unlink(missing_ok=True)
        # and the node's registration beside it, which nothing else would ever delete
        f.with_name(f.name + ".registration").unlink(missing_ok=True)


class Pool:
    """A running embedded pool (master and one node in one JVM)."""

    def __init__(self, *, segment_size: str = "512MiB", extra: list[str] | None = None,
                 secrets: kvpool.Secrets | None = None, tls: ssl.SSLContext | None = None,
                 http_port: int = -1) -> None:
        self.secrets = secrets if secrets is not None else kvpool.Secrets()
        self.tls = tls  # what the readiness check connects with (a pool started with --tls-*)
        if not JAR.exists():
            raise RuntimeError(f"{JAR} is missing: run ./kvpool build first")
        self.java = find_java()
        self.jar = JAR
        self.repo = REPO
        self.port = free_port()
        self.node_port = free_port()
        self.master = f"127.0.0.1:{self.port}"
        self.node = f"127.0.0.1:{self.node_port}"
        self.dir = Path(tempfile.mkdtemp(prefix="kvpool-pytest-"))
        self.log = self.dir / "serve.log"
        cmd = [str(self.java), "--enable-native-access=ALL-UNNAMED", "-Xmx512m", "-jar", str(JAR), "serve",
               "--port", str(self.port), "--node-port", str(self.node_port), "--http-port", str(http_port),
               "--segment-size", segment_size, "--no-prefault", *(extra or [])]
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvpool serve exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            # serve says it serves once a put went through it (and its probe object is gone again)
            if b"kvpool serving: " in self.log.read_bytes():
                try:
                    with kvpool.Client(self.master, timeout=5, connect_timeout=1, secrets=self.secrets,
                                       tls=self.tls) as c:
                        if any(s.active for s in c.status().segments):
                            return
                except kvpool.KvPoolError as e:
                    last = e
            time.sleep(0.1)
        tail = self.log.read_text(errors="replace")[-2000:]  # before stop() removes the directory
        self.stop()
        raise RuntimeError(f"pool at {self.master} not ready in {timeout}s ({last}): {tail}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                remove_segment_files(self.proc.pid)
        shutil.rmtree(self.dir, ignore_errors=True)

    def kvpool_cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Runs a `kvpool` CLI command (the Java client) against this pool."""
        out = subprocess.run([str(self.java), "--enable-native-access=ALL-UNNAMED", "-jar", str(JAR), *args],
                             capture_output=True, text=True, timeout=120)
        if check and out.returncode != 0:
            raise RuntimeError(f"kvpool {' '.join(args)} exited {out.returncode}: {out.stdout}{out.stderr}")
        return out

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Cluster:
    """A master and ``nodes`` storage nodes, each its own process, on loopback."""

    def __init__(self, nodes: int = 2, *, segment_size: str = "128MiB", node_ttl: str = "2s") -> None:
        self.java = find_java()
        self.port = free_port()
        self.master = f"127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix="kvpool-pytest-cluster-"))
        self.node_ttl = node_ttl
        self.master_proc = self._spawn("master", ["master", "--host", "127.0.0.1", "--port", str(self.port),
                                                  "--http-port", "-1", "--node-ttl", node_ttl])
        self.segment_size = segment_size
        self.node_ports: list[int] = []
        self.node_procs: list[subprocess.Popen[bytes]] = []
        for i in range(nodes):
            port = free_port()
            self.node_ports.append(port)
            self.node_procs.append(self._spawn_node(f"node{i}", port))
        self.wait_active(nodes)

    def _spawn_node(self, name: str, port: int) -> subprocess.Popen[bytes]:
        return self._spawn(name, ["node", "--master", self.master, "--host", "127.0.0.1", "--advertise-host",
                                  "127.0.0.1", "--port", str(port), "--segment-size", self.segment_size,
                                  "--no-prefault", "--heartbeat-interval", "200ms"])

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen([str(self.java), "--enable-native-access=ALL-UNNAMED", "-Xmx256m", "-jar", str(JAR),
                                 *args], stdout=open(self.dir / f"{name}.log", "wb"), stderr=subprocess.STDOUT,
                                start_new_session=True)

    def wait_active(self, n: int, timeout: float = 60.0) -> None:
        """Waits until exactly ``n`` segments are ACTIVE (a node that died is dropped after the TTL)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with kvpool.Client(self.master, timeout=5, connect_timeout=1) as c:
                    if sum(s.active for s in c.status().segments) == n and len(c.status().segments) == n:
                        return
            except kvpool.KvPoolError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"cluster at {self.master} did not reach {n} active segments in {timeout}s")

    def kill_node(self, i: int) -> None:
        """SIGKILL, and its segment file removed: the node is not coming back for it."""
        os.killpg(self.node_procs[i].pid, signal.SIGKILL)
        self.node_procs[i].wait()
        remove_segment_files(self.node_procs[i].pid)

    def restart_node(self, i: int) -> None:
        """SIGKILL, then a new node process on the same port: it adopts the segment file the killed one left
        (renaming it to its own pid) and registers again, under a new segment id."""
        os.killpg(self.node_procs[i].pid, signal.SIGKILL)
        self.node_procs[i].wait()
        self.node_procs[i] = self._spawn_node(f"node{i}-again", self.node_ports[i])

    def restart_master(self) -> None:
        """Stops the master (SIGTERM) and starts a new one on its port: the nodes register with it again."""
        os.killpg(self.master_proc.pid, signal.SIGTERM)
        self.master_proc.wait(20)
        self.master_proc = self._spawn("master-again", ["master", "--host", "127.0.0.1", "--port", str(self.port),
                                                        "--http-port", "-1", "--node-ttl", self.node_ttl])

    def stop(self) -> None:
        for p in [*self.node_procs, self.master_proc]:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in [*self.node_procs, self.master_proc]:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                remove_segment_files(p.pid)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:  # the processes' own account of a failed test, before stop() removes it
            for log in sorted(self.dir.glob("*.log")):
                print(f"--- {log.name} (last 4000 characters)\n{log.read_text(errors='replace')[-4000:]}")
        self.stop()


def start_pool(**kw: object) -> Pool:
    """Starts a pool of your own (stop it, or use it as a context manager)."""
    return Pool(**kw)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def pool() -> Iterator[Pool]:
    p = Pool()
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture
def client(pool: Pool) -> Iterator[kvpool.Client]:
    c = kvpool.Client(pool.master)
    c.remove_all(force=True)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(params=[True, False], ids=["shm", "tcp"])
def either(pool: Pool, request: pytest.FixtureRequest) -> Iterator[kvpool.Client]:
    """A client on the same-machine path, then one forced onto TCP (the session's pool, emptied first)."""
    c = kvpool.Client(pool.master, shared_memory=request.param)
    c.remove_all(force=True)
    try:
        yield c
    finally:
        c.close()


def setup_mooncake_store(master: str) -> Any:
    """A ``kvpool.mooncake.MooncakeDistributedStore`` set up against ``master`` (close it)."""
    from kvpool.mooncake import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", master) == 0
    return s


@pytest.fixture
def store(pool: Pool, client: kvpool.Client) -> Iterator[Any]:
    """A Mooncake-API store on the session's pool (emptied first, by the ``client`` fixture), closed after."""
    s = setup_mooncake_store(pool.master)
    try:
        yield s
    finally:
        s.close()


def mmap_raw(size: int, prot: int, at: int = 0) -> int:
    """The address of ``size`` fresh bytes mapped with protection ``prot`` (0: no access), outside Python's
    allocator, to hand a store memory it must refuse; ``munmap_raw`` unmaps it. With ``at``, the mapping is
    placed exactly there (MAP_FIXED), replacing whatever was mapped at those pages."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (0x10 if at else 0)  # MAP_FIXED is 0x10 on Linux
    p = libc.mmap(at or None, size, prot, flags, -1, 0)
    assert p not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
    assert not at or p == at
    return int(p)


def munmap_raw(p: int, size: int) -> None:
    libc = ctypes.CDLL(None)
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.munmap(p, size)
