"""kvpool.etcd: the etcd URL, the leader value, and following the leader key of a real etcd.

The etcd is the one ``scripts/etcd.sh`` runs (Debian's etcd-server, 3.4), on free loopback ports with
its data under tmp_path; the tests are skipped only when the script says etcd cannot be installed
here (its exit status 3): an etcd that is present but fails (crashes, never answers) fails them, and a
port someone took before etcd bound it (exit status 4) is answered with other ports. The tests play
the masters' part with plain gateway calls made here (``urllib``, not the module under test): lease
grant, the create-if-absent txn on the leader key, a put that marks the leader ready, delete, lease
revoke. Nothing waits for a fixed time: each expected change is polled for with a generous deadline.
"""

from __future__ import annotations

import base64
import json
import logging
import shutil
import socket
import subprocess
import threading
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from conftest import REPO, free_port, wait_until
from kvpool import KvPoolError
from kvpool.etcd import (EtcdCompacted, EtcdGateway, EtcdTarget, EtcdUnavailable, LeaderInfo, LeaderWatch,
                         list_masters, parse_etcd_url)

SCRIPT = REPO / "scripts" / "etcd.sh"
WAIT = 15.0  # the deadline for any expected change


def eventually(check: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Polls ``check`` until it holds; fails naming ``what`` after ``timeout`` seconds."""
    wait_until(check, what, timeout, interval=0.05)


# ---------------------------------------------------------------------------------------------------
# Without etcd


@pytest.mark.parametrize("url, endpoints, cluster", [
    ("etcd://127.0.0.1:2379", ("127.0.0.1:2379",), "default"),
    ("etcd://127.0.0.1:2379/", ("127.0.0.1:2379",), "default"),
    ("etcd://127.0.0.1:2379,10.0.0.2:2379/prod-1.a_b", ("127.0.0.1:2379", "10.0.0.2:2379"), "prod-1.a_b"),
    ("etcd://h:1/" + "c" * 64, ("h:1",), "c" * 64),
    ("  ETCD://etcd-0.svc:2379,[::1]:22379/c  ", ("etcd-0.svc:2379", "[::1]:22379"), "c"),
])
def test_parse_etcd_url(url: str, endpoints: tuple[str, ...], cluster: str) -> None:
    t = parse_etcd_url(url)
    assert t == EtcdTarget(endpoints, cluster)
    assert t.leader_key == f"/kvpool/{cluster}/leader"
    assert t.masters_prefix == f"/kvpool/{cluster}/masters/"
    assert parse_etcd_url(str(t)) == t


@pytest.mark.parametrize("url, words", [
    ("", "must look like etcd://"),
    ("127.0.0.1:2379", "must look like etcd://"),
    ("http://127.0.0.1:2379", "must look like etcd://"),
    ("etcd://", "names no endpoints"),
    ("etcd:///prod", "names no endpoints"),
    ("etcd://127.0.0.1", "bad etcd endpoint '127.0.0.1'"),
    ("etcd://127.0.0.1:http", "numeric port"),
    ("etcd://127.0.0.1:0", "1..65535"),
    ("etcd://127.0.0.1:65536", "1..65535"),
    ("etcd://a:1,,b:2", "empty endpoint"),
    ("etcd://a:1,", "empty endpoint"),
    ("etcd://::1:2379", "bad etcd endpoint"),
    ("etcd://user@a:1", "bad etcd endpoint 'user@a:1'"),
    ("etcd://a:1/bad name", "bad cluster name 'bad name'"),
    ("etcd://a:1/a/b", "bad cluster name 'a/b'"),
    ("etcd://a:1/c?x=1", "bad cluster name"),
    ("etcd://a:1/" + "c" * 65, "at most 64"),
])
def test_parse_etcd_url_refuses_malformed_urls(url: str, words: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_etcd_url(url)
    assert words in str(e.value)


def value(ident: str = "m1", address: str = "127.0.0.1:5000", *, term: Any = 0, ready: Any = False,
          http: Any = "127.0.0.1:5001") -> bytes:
    return json.dumps({"id": ident, "address": address, "http": http, "term": term, "ready": ready}).encode()


def test_leader_value_parses() -> None:
    assert LeaderInfo.parse(value(term=7, ready=True)) == LeaderInfo("m1", "127.0.0.1:5000", "127.0.0.1:5001", 7, True)
    # term 0 was written before the master knew its revision: the key's create_revision is the term
    assert LeaderInfo.parse(value(), create_revision=12).term == 12
    assert LeaderInfo.parse(value(term=12, ready=True), create_revision=12).term == 12
    # no http port, and fields this version does not know, are fine
    doc = {"id": "m2", "address": "[::1]:7", "term": 3, "ready": False, "future": [1]}
    assert LeaderInfo.parse(json.dumps(doc)) == LeaderInfo("m2", "[::1]:7", "", 3, False)


@pytest.mark.parametrize("raw, words", [
    (b"not json", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (json.dumps({"id": "m", "address": "h:1"}).encode(), "lacks term, ready"),
    (value(term="3"), "term must be a non-negative integer, got '3'"),
    (value(term=True), "term must be a non-negative integer, got True"),
    (value(term=-1), "term must be a non-negative integer"),
    (value(term=1.5), "term must be a non-negative integer"),
    (value(ready="yes"), "ready must be true or false, got 'yes'"),
    (value(ident=""), "id must be a non-empty string"),
    (value(address="nowhere"), "leader address must be host:port"),
    (value(address="h:99999"), "leader address must be host:port with a port in 1..65535"),
    (value(http=5), "http must be a host:port string or empty"),
    (value(http="h:x"), "leader http address must be host:port with a numeric port"),
])
def test_malformed_leader_values_are_refused(raw: bytes, words: str) -> None:
    with pytest.raises(ValueError) as e:
        LeaderInfo.parse(raw)
    assert words in str(e.value)


def test_the_term_is_the_create_revision() -> None:
    # whatever the value says, as the Java side reads it
    assert LeaderInfo.parse(value(term=5, ready=True), create_revision=9).term == 9


def test_unreachable_etcd_is_named() -> None:
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    with pytest.raises(EtcdUnavailable) as e:
        EtcdGateway(dead, timeout=2).range("/x")
    assert isinstance(e.value, KvPoolError)
    assert all(d in str(e.value) for d in dead) and "/v3/kv/range" in str(e.value)
    with pytest.raises(EtcdUnavailable, match=dead[0]):
        EtcdGateway(dead, timeout=2).watch("/x", 1)
    with pytest.raises(TimeoutError) as t:
        LeaderWatch(f"etcd://{dead[0]}/c1", timeout=1).wait_ready(0.5)
    assert "/kvpool/c1/leader" in str(t.value) and dead[0] in str(t.value) and "last error" in str(t.value)
    with pytest.raises(ValueError, match="no etcd endpoints"):
        EtcdGateway([])


# ---------------------------------------------------------------------------------------------------
# A real etcd, and the masters' part played with plain gateway calls


PORT_ATTEMPTS = 5  # starts on new ports when the script finds one taken (its exit status 4)


class Etcd:
    """An etcd run by scripts/etcd.sh on free loopback ports, its data under ``dir``. ``ports`` hands out
    the ports to try (free ones unless a test says otherwise); a restart keeps the first start's."""

    def __init__(self, dir: Path, ports: Callable[[], int] = free_port) -> None:
        self.dir = dir
        clashes: list[str] = []
        for _ in range(PORT_ATTEMPTS):
            self.port, self.peer_port = ports(), ports()
            self.endpoint = f"127.0.0.1:{self.port}"
            shutil.rmtree(dir / "data", ignore_errors=True)  # a member made on other ports keeps their peer URL
            out = self.start(port_clash_ok=True)
            if out is None:
                return
            clashes.append(out)
        raise AssertionError(f"etcd did not start: its ports were taken {PORT_ATTEMPTS} times in a row: {clashes}")

    def _script(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=600)

    def start(self, *, port_clash_ok: bool = False) -> str | None:
        """Starts (or restarts) etcd; None once it runs, or with ``port_clash_ok`` the script's complaint
        about a port in use. Skips only when etcd cannot be installed here; fails on anything else."""
        out = self._script("start", str(self.dir), str(self.port), str(self.peer_port))
        if out.returncode == 3:
            pytest.skip(f"etcd cannot be installed here: {out.stderr.strip()}")
        if out.returncode == 4 and port_clash_ok:
            return out.stderr.strip().splitlines()[-1]
        assert out.returncode == 0, f"scripts/etcd.sh start failed ({out.returncode}): {out.stdout}{out.stderr}"
        assert out.stdout.strip() == f"http://{self.endpoint}"
        return None

    def stop(self) -> None:
        out = self._script("stop", str(self.dir))
        assert out.returncode == 0, out.stderr

    def status(self) -> str:
        return self._script("status", str(self.dir)).stdout.strip()

    def url(self, cluster: str) -> str:
        return f"etcd://{self.endpoint}/{cluster}"

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(f"http://{self.endpoint}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            answer: dict[str, Any] = json.load(resp)
        return answer


def b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


class Master:
    """One master's writes to etcd, as the Java master makes them."""

    def __init__(self, etcd: Etcd, cluster: str, ident: str, *, ttl: int = 60) -> None:
        self.etcd, self.ident = etcd, ident
        self.key = f"/kvpool/{cluster}/leader"
        self.registry = f"/kvpool/{cluster}/masters/{ident}"
        self.address = f"127.0.0.1:{free_port()}"
        self.lease = etcd.post("/v3/lease/grant", {"TTL": ttl})["ID"]  # an int64: a JSON string
        assert isinstance(self.lease, str)
        self.term = 0

    def value(self, ready: bool) -> str:
        return b64(json.dumps({"id": self.ident, "address": self.address, "http": "", "term": self.term,
                               "ready": ready}))

    def campaign(self) -> bool:
        """The create-if-absent txn under the lease (not ready, term 0); then the term is rewritten in."""
        answer = self.etcd.post("/v3/kv/txn", {
            "compare": [{"key": b64(self.key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": [{"request_put": {"key": b64(self.key), "value": self.value(False), "lease": self.lease}}],
            "failure": [{"request_range": {"key": b64(self.key)}}],
        })
        if not answer.get("succeeded"):  # false is left out of the JSON
            return False
        self.term = int(answer["header"]["revision"])  # the put's revision is the key's create_revision
        return True

    def put(self, ready: bool) -> None:
        self.etcd.post("/v3/kv/put", {"key": b64(self.key), "value": self.value(ready), "lease": self.lease})

    def register(self, role: str) -> None:
        doc = {"id": self.ident, "address": self.address, "http": "", "role": role}
        self.etcd.post("/v3/kv/put", {"key": b64(self.registry), "value": b64(json.dumps(doc)), "lease": self.lease})

    def resign(self) -> None:
        self.etcd.post("/v3/kv/deleterange", {"key": b64(self.key)})

    def revoke(self) -> None:
        self.etcd.post("/v3/lease/revoke", {"ID": self.lease})


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Etcd]:
    e = Etcd(tmp_path_factory.mktemp("etcd"))
    try:
        yield e
    finally:
        e.stop()


@pytest.fixture
def cluster() -> str:
    """A cluster name of the test's own, so tests sharing the etcd see none of each other's keys."""
    return f"t-{uuid.uuid4().hex[:12]}"


class Recorder:
    """Collects what a LeaderWatch's on_change callbacks report."""

    def __init__(self) -> None:
        self.seen: list[LeaderInfo | None] = []
        self.lock = threading.Lock()

    def __call__(self, leader: LeaderInfo | None) -> None:
        with self.lock:
            self.seen.append(leader)

    def history(self) -> list[tuple[str, int, bool] | None]:
        with self.lock:
            return [None if x is None else (x.id, x.term, x.ready) for x in self.seen]


def elect(etcd: Etcd, cluster: str, ident: str, w: LeaderWatch) -> Master:
    """A master wins the leader key and turns ready; returns once the started watch ``w`` has it."""
    m = Master(etcd, cluster, ident)
    assert m.campaign()
    m.put(ready=True)
    eventually(lambda: w.latest() == LeaderInfo(ident, m.address, "", m.term, True), f"leader {ident}, ready")
    return m


def test_the_script_reports_its_etcd(etcd: Etcd, tmp_path: Path) -> None:
    assert etcd.status().startswith("running (PID ") and etcd.endpoint in etcd.status()
    idle = subprocess.run(["bash", str(SCRIPT), "status", str(tmp_path)], capture_output=True, text=True)
    assert idle.stdout.strip() == "not running"
    # a second etcd on ports in use is refused, naming the port
    busy = subprocess.run(["bash", str(SCRIPT), "start", str(tmp_path), str(etcd.port), str(free_port())],
                          capture_output=True, text=True, timeout=120)
    assert busy.returncode == 4 and f"port {etcd.port}" in busy.stderr
    # stopping what is not running is fine
    assert subprocess.run(["bash", str(SCRIPT), "stop", str(tmp_path)]).returncode == 0


def test_a_port_taken_before_etcd_binds_it_is_answered_with_other_ports(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # bound, not listening: nothing answers there, and etcd's own bind fails
        handed = [free_port(), taken.getsockname()[1]]
        own = Etcd(tmp_path / "etcd", ports=lambda: handed.pop(0) if handed else free_port())
        try:
            assert not handed and own.peer_port != taken.getsockname()[1]
            assert "address already in use" in (tmp_path / "etcd" / "etcd.log").read_text()  # the first attempt's
            assert own.post("/v3/maintenance/status", {})["version"]
        finally:
            own.stop()


def test_an_etcd_that_crashes_at_start_fails_naming_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Present but failing is a failure with etcd's log, never a skip (pytest.skip raises no AssertionError)."""
    monkeypatch.setenv("ETCD_EXTRA_ARGS", "--no-such-flag-pytest")
    crash = "(?s)flag provided but not defined: -no-such-flag-pytest.*exited during startup"  # the log tail, the reason
    with pytest.raises(AssertionError, match=crash):
        Etcd(tmp_path / "etcd")


def test_gateway_reads_and_watches(etcd: Etcd, cluster: str) -> None:
    gw = EtcdGateway([f"127.0.0.1:{free_port()}", etcd.endpoint], timeout=5)  # the first one is dead
    key = f"/kvpool/{cluster}/k"
    assert gw.range(key) is None
    kv0, rev0 = gw.read(key)
    assert kv0 is None and rev0 > 0
    etcd.post("/v3/kv/put", {"key": b64(key), "value": b64(b"\x00v1")})
    kv = gw.range(key)
    assert kv is not None and kv.value == b"\x00v1" and kv.key == key.encode()
    assert kv.create_revision == kv.mod_revision == kv.revision > rev0 and kv.version == 1 and kv.lease == 0
    with gw.watch(key, kv.mod_revision, idle_timeout=WAIT) as w:
        assert w.revision >= kv.mod_revision and w.endpoint == etcd.endpoint
        etcd.post("/v3/kv/put", {"key": b64(key), "value": b64("v2")})
        etcd.post("/v3/kv/deleterange", {"key": b64(key)})
        events = []
        for ev in w:
            events.append(ev)
            if len(events) == 3:
                break
    assert [(e.type, e.kv.value, e.kv.version) for e in events] == [("PUT", b"\x00v1", 1), ("PUT", b"v2", 2),
                                                                     ("DELETE", b"", 0)]
    assert events[1].kv.create_revision == kv.create_revision and events[2].kv.mod_revision > events[1].kv.mod_revision
    # a prefix range holds the keys below the prefix, not a sibling that merely starts alike
    for k in ("p/a", "p/b", "p0", "p"):
        etcd.post("/v3/kv/put", {"key": b64(f"/kvpool/{cluster}/{k}"), "value": b64(k)})
    assert [x.value for x in gw.range_prefix(f"/kvpool/{cluster}/p/")] == [b"p/a", b"p/b"]


def test_list_masters_reads_the_registry(etcd: Etcd, cluster: str) -> None:
    assert list_masters(etcd.url(cluster)) == []
    a, b = Master(etcd, cluster, "m-a"), Master(etcd, cluster, "m-b")
    b.register("standby")
    a.register("leader")
    etcd.post("/v3/kv/put", {"key": b64(f"/kvpool/{cluster}/masters/m-c"), "value": b64("{broken")})
    etcd.post("/v3/kv/put", {"key": b64(f"/kvpool/{cluster}/mastersX"), "value": b64("{}")})
    got = list_masters(parse_etcd_url(etcd.url(cluster)))
    assert [m["id"] for m in got] == ["m-a", "m-b", "m-c"]
    assert got[0] == {"id": "m-a", "address": a.address, "http": "", "role": "leader"}
    assert got[1]["role"] == "standby" and "not JSON" in got[2]["error"]
    b.revoke()  # a standby that dies leaves the registry with its lease
    assert [m["id"] for m in list_masters(etcd.url(cluster))] == ["m-a", "m-c"]


def test_wait_ready_skips_a_leader_that_is_not_ready(etcd: Etcd, cluster: str) -> None:
    w = LeaderWatch(etcd.url(cluster), timeout=5)
    assert w.current() is None
    with pytest.raises(TimeoutError) as e:
        w.wait_ready(0.5)
    assert f"/kvpool/{cluster}/leader" in str(e.value) and etcd.endpoint in str(e.value) and "no leader" in str(e.value)
    m = Master(etcd, cluster, "m1")
    assert m.campaign()
    assert not Master(etcd, cluster, "m2").campaign()  # the key exists: a second candidate loses
    m.put(ready=False)  # the term written in, still not ready
    cur = w.current()
    assert cur == LeaderInfo("m1", m.address, "", m.term, False)
    with pytest.raises(TimeoutError, match="not ready"):
        w.wait_ready(0.5)  # there is a leader, but it is not ready: no answer
    got: list[LeaderInfo | BaseException] = []
    waiter = threading.Thread(target=lambda: got.append(_call(lambda: w.wait_ready(WAIT))))
    waiter.start()
    m.put(ready=True)
    waiter.join(WAIT + 10)
    assert got == [LeaderInfo("m1", m.address, "", m.term, True)]


def _call(f: Callable[[], LeaderInfo]) -> LeaderInfo | BaseException:
    try:
        return f()
    except BaseException as e:  # noqa: BLE001 - handed to the test thread
        return e


def test_a_started_watch_follows_a_leader_change(etcd: Etcd, cluster: str) -> None:
    rec = Recorder()
    with LeaderWatch(etcd.url(cluster), timeout=5) as w:
        w.on_change(rec)
        w.start()
        eventually(lambda: w.revision > 0, "the watch's first read")
        assert w.latest() is None
        a = elect(etcd, cluster, "a", w)
        assert w.wait_ready(WAIT).id == "a"
        a.resign()
        eventually(lambda: w.latest() is None, "leader a gone")
        b = elect(etcd, cluster, "b", w)
        assert b.term > a.term
    assert f"kvpool-etcd-leader-{cluster}" not in [t.name for t in threading.enumerate()]  # close() ended it
    # every change came through the watch, in order, each once
    assert rec.history() == [("a", a.term, False), ("a", a.term, True), None, ("b", b.term, False),
                             ("b", b.term, True)]


def test_a_lease_expiry_removes_the_leader(etcd: Etcd, cluster: str) -> None:
    with LeaderWatch(etcd.url(cluster), timeout=5) as w:
        w.start()
        m = Master(etcd, cluster, "short", ttl=2)  # and no keep-alive
        assert m.campaign()
        m.put(ready=True)
        eventually(lambda: w.latest() is not None, "the leader")
        eventually(lambda: w.latest() is None, "the leader's lease expiring")
        assert w.current() is None


def test_the_watch_survives_an_etcd_restart(tmp_path: Path, cluster: str) -> None:
    own = Etcd(tmp_path / "etcd")
    rec = Recorder()
    try:
        with LeaderWatch(own.url(cluster), timeout=2) as w:
            w.on_change(rec)
            w.start()
            a = elect(own, cluster, "a", w)
            own.stop()
            assert own.status() == "not running"
            own.start()  # the same data and ports: the same revisions and leases
            a.resign()
            b = elect(own, cluster, "b", w)  # seen after the restart
        assert rec.history()[-3:] == [None, ("b", b.term, False), ("b", b.term, True)]
    finally:
        own.stop()


def test_a_new_etcd_behind_the_seen_revision_is_read_anew(tmp_path: Path, cluster: str) -> None:
    """An etcd started afresh (its data lost) is at a revision below the one the watch saw: watching on
    from that revision would miss every change until the store caught up, so the key is read anew."""
    own = Etcd(tmp_path / "etcd")
    try:
        with LeaderWatch(own.url(cluster), timeout=2) as w:
            w.start()
            for i in range(5):  # the old store moves well past where the new one will be
                own.post("/v3/kv/put", {"key": b64(f"/kvpool/{cluster}/other"), "value": b64(str(i))})
            a = elect(own, cluster, "a", w)
            own.stop()
            shutil.rmtree(own.dir / "data")
            own.start()
            b = elect(own, cluster, "b", w)  # the new etcd's leader, at a lower revision
            assert b.term < a.term
    finally:
        own.stop()


def test_a_compacted_revision_is_read_anew(etcd: Etcd, cluster: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kvpool.etcd")
    gw = EtcdGateway([etcd.endpoint])
    with LeaderWatch(etcd.url(cluster), timeout=5, idle_timeout=0.3) as w:  # reopens its stream often
        w.start()
        a = elect(etcd, cluster, "a", w)
        seen = w.revision
        for i in range(3):  # other keys move the store past what the watch has seen
            etcd.post("/v3/kv/put", {"key": b64(f"/kvpool/{cluster}/other"), "value": b64(str(i))})
        now = int(etcd.post("/v3/kv/range", {"key": b64("/")})["header"]["revision"])
        etcd.post("/v3/kv/compaction", {"revision": str(now)})
        with pytest.raises(EtcdCompacted) as e:
            for _ in gw.watch(f"/kvpool/{cluster}/leader", seen + 1):
                pass
        assert e.value.compact_revision == now
        eventually(lambda: "compacted" in caplog.text, "the watch meeting the compaction")
        a.resign()
        eventually(lambda: w.latest() is None, "leader a gone after the compaction")
