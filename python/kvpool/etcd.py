"""Finding the kvpool master through etcd: the leader key, the masters' registry, and following them.

With highly-available masters, clients and nodes are given etcd endpoints instead of a master
address: ``etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]`` (``parse_etcd_url``; the cluster name defaults
to ``default``). The layout in etcd, shared with the Java side:

* ``/kvpool/{cluster}/leader``: created by the winning master with a create-if-absent txn under its
  etcd lease, so it vanishes when the leader dies (lease expiry) or resigns (delete). Its value is
  JSON ``{"id", "address", "http", "term", "ready"}``; the term is the key's ``create_revision``
  (unique and rising across leaders), whatever the value says: the first value carries ``term: 0``,
  written before the master knew the revision. ``ready`` turns true, in a rewrite of the same key, once the new leader
  can serve (``LeaderInfo``).
* ``/kvpool/{cluster}/masters/{id}``: every master, leader or standby, under its lease
  (``list_masters``).

Everything goes through etcd's JSON gRPC gateway (HTTP/1.1 POSTs of JSON to ``/v3/...``; keys and
values are base64, int64 fields JSON strings, and fields with a zero value are left out), so this
module needs nothing beyond the standard library (``EtcdGateway``). A watch is one long POST to
``/v3/watch`` whose chunked response is a stream of JSON objects, one a line, each
``{"result": {...}}`` (the first one says ``"created": true``) or, when the gateway's stream breaks,
``{"error": {...}}``.

``LeaderWatch`` reads the leader (``current``), waits for a ready one (``wait_ready``), or follows
the key from a daemon thread (``start``, ``latest``, ``on_change``), resubscribing after a broken
stream or a restarted etcd from the last revision it saw, and reading the key anew when that
revision was compacted away.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Generator, Iterator, Literal, Sequence

from ._net import parse_host_port
from .errors import KvPoolError

log = logging.getLogger("kvpool.etcd")

DEFAULT_CLUSTER = "default"
#: How long a watch stream may stay silent before it is reopened (etcd sends nothing while the key is
#: unchanged, so a dead connection would otherwise go unnoticed).
DEFAULT_IDLE_TIMEOUT = 30.0
_BACKOFF_MIN = 0.1
_BACKOFF_MAX = 2.0
_CLUSTER_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
_ENDPOINT_RE = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9._-]+)):(?P<port>[0-9]{1,5})")
_URL_FORM = "etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]"
#: HTTP statuses the gateway answers for a member that cannot serve now (gRPC Unavailable,
#: DeadlineExceeded): the next endpoint is tried.
_RETRY_STATUSES = (502, 503, 504)


class EtcdError(KvPoolError):
    """etcd answered with an error, or with something that is not the gateway's JSON (the message says which)."""


class EtcdUnavailable(EtcdError):
    """No etcd endpoint could serve the request; the message names each endpoint tried and why it failed."""


class EtcdCompacted(EtcdError):
    """A watch asked for revisions that etcd has compacted away; ``compact_revision`` is the oldest one left."""

    def __init__(self, message: str, compact_revision: int) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


@dataclass(frozen=True)
class EtcdTarget:
    """Where the masters of one kvpool cluster are elected: etcd endpoints (``host:port``) and a cluster name."""

    endpoints: tuple[str, ...]
    cluster: str = DEFAULT_CLUSTER

    @property
    def leader_key(self) -> str:
        return f"/kvpool/{self.cluster}/leader"

    @property
    def masters_prefix(self) -> str:
        return f"/kvpool/{self.cluster}/masters/"

    def __str__(self) -> str:
        return f"etcd://{','.join(self.endpoints)}/{self.cluster}"


def parse_etcd_url(url: str) -> EtcdTarget:
    """``etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]`` as an ``EtcdTarget``; ValueError saying what is wrong.

    IPv6 hosts go in brackets (``[::1]:2379``); the cluster name is letters, digits, ``.``, ``_`` and
    ``-``, at most 64 of them (``default`` when left out), as on the Java side.
    """
    if not isinstance(url, str):
        raise ValueError(f"etcd URL must be a string like {_URL_FORM}, got {url!r}")
    scheme, sep, rest = url.strip().partition("://")
    if not sep or scheme.lower() != "etcd":
        raise ValueError(f"etcd URL must look like {_URL_FORM}, got {url!r}")
    hosts, _, cluster = rest.partition("/")
    cluster = cluster or DEFAULT_CLUSTER
    if not _CLUSTER_RE.fullmatch(cluster):
        raise ValueError(f"bad cluster name {cluster!r} in etcd URL {url!r}: at most 64 letters, digits, '.', "
                         f"'_' and '-'")
    if not hosts:
        raise ValueError(f"etcd URL {url!r} names no endpoints: it must look like {_URL_FORM}")
    endpoints: list[str] = []
    for part in hosts.split(","):
        if not part:
            raise ValueError(f"etcd URL {url!r} has an empty endpoint (a stray comma?)")
        m = _ENDPOINT_RE.fullmatch(part)
        if m is None:
            raise ValueError(f"bad etcd endpoint {part!r} in {url!r}: it must be host:port (IPv6 as [addr]:port) "
                             f"with a numeric port")
        if not 0 < int(m["port"]) < 65536:
            raise ValueError(f"bad etcd endpoint {part!r} in {url!r}: the port must be in 1..65535")
        endpoints.append(part)
    return EtcdTarget(tuple(endpoints), cluster)


def _as_target(target: EtcdTarget | str) -> EtcdTarget:
    return parse_etcd_url(target) if isinstance(target, str) else target


# ---------------------------------------------------------------------------------------------------
# The gateway client


@dataclass(frozen=True)
class KeyValue:
    """One key as etcd holds it. ``revision`` is the store revision of the response that carried it."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int
    revision: int


@dataclass(frozen=True)
class WatchEvent:
    """A change of a watched key. A DELETE's ``kv`` has only the key and its ``mod_revision``."""

    type: Literal["PUT", "DELETE"]
    kv: KeyValue


def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode("ascii")


def _int(v: Any, what: str) -> int:
    """An int64 field of the gateway's JSON: a decimal string (or a number); absent means 0."""
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise EtcdError(f"etcd sent {what} = {v!r}, not an integer")
    try:
        return int(v)
    except ValueError:
        raise EtcdError(f"etcd sent {what} = {v!r}, not an integer") from None


def _bytes(v: Any, what: str) -> bytes:
    if v is None:
        return b""
    try:
        return base64.b64decode(v, validate=True)
    except (TypeError, ValueError):
        raise EtcdError(f"etcd sent {what} = {v!r}, not base64") from None


def _header_revision(msg: dict[str, Any]) -> int:
    header = msg.get("header")
    return _int(header.get("revision"), "header.revision") if isinstance(header, dict) else 0


def _key_value(kv: Any, revision: int) -> KeyValue:
    if not isinstance(kv, dict):
        raise EtcdError(f"etcd sent a key-value that is not an object: {kv!r}")
    return KeyValue(key=_bytes(kv.get("key"), "kv.key"), value=_bytes(kv.get("value"), "kv.value"),
                    create_revision=_int(kv.get("create_revision"), "kv.create_revision"),
                    mod_revision=_int(kv.get("mod_revision"), "kv.mod_revision"),
                    version=_int(kv.get("version"), "kv.version"), lease=_int(kv.get("lease"), "kv.lease"),
                    revision=revision)


def _prefix_end(prefix: bytes) -> bytes:
    """The range_end that makes a range of every key starting with ``prefix``."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # every key


def _json_object(raw: bytes, who: str) -> dict[str, Any]:
    """A gateway answer or stream message, which must be a JSON object; EtcdError naming ``who`` sent it."""
    try:
        doc = json.loads(raw)
    except ValueError:
        raise EtcdError(f"{who} sent something not JSON: {raw[:200]!r}") from None
    if not isinstance(doc, dict):
        raise EtcdError(f"{who} sent {doc!r}, not a JSON object")
    return doc


def _error_text(raw: bytes) -> str:
    """etcd's own words from an error body (``{"error": ..., "message": ..., "code": ...}``), else the body."""
    try:
        body = json.loads(raw)
    except ValueError:
        return raw[:200].decode("utf-8", "replace").strip() or "(empty body)"
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):  # the form of an error inside a watch stream
            return f"{err.get('message')} (gRPC code {err.get('grpc_code')})"
        return f"{body.get('message') or err} (gRPC code {body.get('code')})"
    return repr(body)


class EtcdGateway:
    """A minimal client of etcd's JSON gateway: ranges and watches, plus ``post`` for any other call.

    Each request tries the endpoints in turn, starting with the last one that answered, moving on when
    one cannot be reached or answers that it cannot serve now (HTTP 502, 503, 504); when none can,
    ``EtcdUnavailable`` names every endpoint and why. Other error answers raise ``EtcdError`` at once.
    ``timeout`` bounds each connect and each wait for an answer, per endpoint (seconds).
    """

    def __init__(self, endpoints: Sequence[str] | EtcdTarget, timeout: float = 5.0) -> None:
        if isinstance(endpoints, EtcdTarget):
            endpoints = endpoints.endpoints
        if isinstance(endpoints, str):
            raise ValueError(f"endpoints must be a list of host:port, got the string {endpoints!r}")
        if not endpoints:
            raise ValueError("no etcd endpoints given")
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.endpoints = tuple(endpoints)
        self._addresses = [parse_host_port(e, "etcd endpoint") for e in self.endpoints]
        self.timeout = float(timeout)
        self._preferred = 0

    def _order(self) -> list[int]:
        first = self._preferred
        return [(first + i) % len(self.endpoints) for i in range(len(self.endpoints))]

    def _connect(self, i: int) -> http.client.HTTPConnection:
        host, port = self._addresses[i]
        return http.client.HTTPConnection(host, port, timeout=self.timeout)

    def _unavailable(self, what: str, failures: list[str]) -> EtcdUnavailable:
        return EtcdUnavailable(f"etcd could not serve {what}: tried {', '.join(self.endpoints)}: {'; '.join(failures)}")

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POSTs ``body`` as JSON to ``path`` (``/v3/kv/range``, ``/v3/lease/grant``, ...) and returns the answer."""
        data = json.dumps(body).encode()
        failures: list[str] = []
        for i in self._order():
            endpoint = self.endpoints[i]
            conn = self._connect(i)
            try:
                conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException) as e:
                failures.append(f"{endpoint}: {e or type(e).__name__}")
                continue
            finally:
                conn.close()
            if resp.status in _RETRY_STATUSES:
                failures.append(f"{endpoint}: HTTP {resp.status}: {_error_text(raw)}")
                continue
            if resp.status != 200:
                raise EtcdError(f"etcd at {endpoint} refused {path}: HTTP {resp.status}: {_error_text(raw)}")
            answer = _json_object(raw, f"etcd at {endpoint} answering {path}")
            self._preferred = i
            return answer
        raise self._unavailable(path, failures)

    def read(self, key: str | bytes) -> tuple[KeyValue | None, int]:
        """The key (None when absent) and the store revision it was read at."""
        answer = self.post("/v3/kv/range", {"key": _b64(key)})
        revision = _header_revision(answer)
        kvs = answer.get("kvs") or []
        return (_key_value(kvs[0], revision) if kvs else None), revision

    def range(self, key: str | bytes) -> KeyValue | None:
        """The key, or None when it is absent."""
        return self.read(key)[0]

    def range_prefix(self, prefix: str | bytes) -> list[KeyValue]:
        """Every key that starts with ``prefix``, in key order."""
        raw = prefix.encode() if isinstance(prefix, str) else prefix
        answer = self.post("/v3/kv/range", {"key": _b64(raw), "range_end": _b64(_prefix_end(raw))})
        revision = _header_revision(answer)
        return [_key_value(kv, revision) for kv in answer.get("kvs") or []]

    def watch(self, key: str | bytes, start_revision: int, *, prefix: bool = False,
              idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT) -> EtcdWatch:
        """Opens a watch of ``key`` (every key under it with ``prefix``) from ``start_revision`` on.

        Returns once etcd has confirmed the watch; iterate the result for ``WatchEvent``s and close it
        when done. ``idle_timeout`` (seconds, None for no limit) is how long the stream may stay silent
        before its iteration raises ``EtcdUnavailable``.
        """
        raw = key.encode() if isinstance(key, str) else key
        create: dict[str, Any] = {"key": _b64(raw), "start_revision": str(start_revision)}
        if prefix:
            create["range_end"] = _b64(_prefix_end(raw))
        data = json.dumps({"create_request": create}).encode()
        what = f"a watch of {raw.decode('utf-8', 'replace')}"
        failures: list[str] = []
        for i in self._order():
            endpoint = self.endpoints[i]
            conn = self._connect(i)
            try:
                conn.request("POST", "/v3/watch", body=data, headers={"Content-Type": "application/json"})
                sock = conn.sock
                resp = conn.getresponse()
                if resp.status != 200:
                    text = _error_text(resp.read())
                    if resp.status not in _RETRY_STATUSES:
                        conn.close()
                        raise EtcdError(f"etcd at {endpoint} refused {what}: HTTP {resp.status}: {text}")
                    failures.append(f"{endpoint}: HTTP {resp.status}: {text}")
                    conn.close()
                    continue
                stream = EtcdWatch(conn, sock, resp, endpoint, what, idle_timeout)
                stream._await_created()
            except EtcdUnavailable as e:
                conn.close()
                failures.append(f"{endpoint}: {e}")
                continue
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                failures.append(f"{endpoint}: {e or type(e).__name__}")
                continue
            except BaseException:
                conn.close()
                raise
            self._preferred = i
            return stream
        raise self._unavailable(what, failures)


class EtcdWatch:
    """One open watch stream (from ``EtcdGateway.watch``): iterate it for events, close it when done.

    The iteration ends when the stream ends or the watch is closed (from any thread); it raises
    ``EtcdCompacted`` when the start revision was compacted away, ``EtcdUnavailable`` when the
    connection breaks, the gateway reports a broken stream, or nothing came within the idle timeout,
    and ``EtcdError`` when etcd cancels the watch for another reason. ``revision`` is the latest store
    revision a message of the stream reported; ``endpoint`` is where it is open.
    """

    def __init__(self, conn: http.client.HTTPConnection, sock: socket.socket | None, resp: http.client.HTTPResponse,
                 endpoint: str, what: str, idle_timeout: float | None) -> None:
        self.endpoint = endpoint
        self.revision = 0
        self._conn = conn
        self._sock = sock
        self._resp = resp
        self._what = what
        self._idle_timeout = idle_timeout
        self._buf = bytearray()
        self._closed = False

    def _await_created(self) -> None:
        msg = self._next_message()
        if msg is None:
            raise EtcdUnavailable(f"{self.endpoint} ended the stream of {self._what} before confirming it")
        result = self._result(msg)
        if not result.get("created"):
            raise EtcdError(f"etcd at {self.endpoint} did not confirm {self._what}: {msg!r}")
        if self._sock is not None:
            self._sock.settimeout(self._idle_timeout)

    def _next_message(self) -> dict[str, Any] | None:
        """The next JSON object of the stream, or None when it ended or the watch was closed."""
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[:nl + 1]
                if line.strip():
                    return self._decode(line)
                continue
            try:
                chunk = self._resp.read1(65536)
            except Exception as e:  # noqa: BLE001 - after close() anything may come out of the torn-down reader
                if self._closed:
                    return None
                if isinstance(e, TimeoutError):
                    raise EtcdUnavailable(f"{self._what} on {self.endpoint} heard nothing for "
                                          f"{self._sock.gettimeout() if self._sock else '?'}s") from None
                if isinstance(e, (OSError, http.client.HTTPException)):
                    raise EtcdUnavailable(f"{self._what} on {self.endpoint} broke: {e or type(e).__name__}") from None
                raise
            if not chunk:
                if self._closed or not self._buf.strip():
                    return None
                line = bytes(self._buf)
                self._buf.clear()
                return self._decode(line)
            self._buf += chunk

    def _decode(self, line: bytes) -> dict[str, Any]:
        return _json_object(line, f"{self._what} on {self.endpoint}")

    def _result(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The ``result`` of a stream message; a gateway error (the stream broke) raises."""
        if "error" in msg:
            err = msg["error"]
            text = _error_text(json.dumps(msg).encode())
            if isinstance(err, dict) and (err.get("grpc_code") == 14 or err.get("http_code") in _RETRY_STATUSES):
                raise EtcdUnavailable(f"{self._what} on {self.endpoint} broke: {text}")
            raise EtcdError(f"{self._what} on {self.endpoint} failed: {text}")
        result = msg.get("result")
        if not isinstance(result, dict):
            raise EtcdError(f"{self._what} on {self.endpoint} sent {msg!r}, which has no result")
        self.revision = max(self.revision, _header_revision(result))
        return result

    def __iter__(self) -> Iterator[WatchEvent]:
        while True:
            msg = self._next_message()
            if msg is None:
                return
            result = self._result(msg)
            if result.get("canceled"):
                compact = _int(result.get("compact_revision"), "compact_revision")
                if compact:
                    raise EtcdCompacted(f"{self._what} on {self.endpoint} starts at a compacted revision; the "
                                        f"oldest left is {compact}", compact)
                raise EtcdError(f"etcd at {self.endpoint} canceled {self._what}: "
                                f"{result.get('cancel_reason') or 'no reason given'}")
            revision = _header_revision(result)
            for ev in result.get("events") or []:
                kind = ev.get("type") if isinstance(ev, dict) else None
                if kind not in (None, "PUT", "DELETE"):
                    raise EtcdError(f"{self._what} on {self.endpoint} sent an event of type {kind!r}")
                yield WatchEvent("DELETE" if kind == "DELETE" else "PUT", _key_value(ev.get("kv"), revision))

    def close(self) -> None:
        """Ends the stream; an iteration blocked in another thread returns."""
        self._closed = True
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._conn.close()

    def __enter__(self) -> EtcdWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------------
# The leader


@dataclass(frozen=True)
class LeaderInfo:
    """The elected master as its leader key says: ``address`` serves clients and nodes, ``http`` is its
    HTTP port (``""`` when it has none), ``term`` the key's create_revision, ``ready`` whether it serves."""

    id: str
    address: str
    http: str
    term: int
    ready: bool

    @classmethod
    def parse(cls, value: bytes | str, create_revision: int | None = None) -> LeaderInfo:
        """Reads a leader value; ValueError naming the field that is wrong.

        With the key's ``create_revision``, that is the term, whatever the value says (as on the
        Java side): the first value a master writes carries 0, before it knows its revision.
        """
        try:
            doc = json.loads(value)
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"leader value is not JSON ({e}): {value[:200]!r}") from None
        if not isinstance(doc, dict):
            raise ValueError(f"leader value must be a JSON object, got {doc!r}")
        missing = [f for f in ("id", "address", "term", "ready") if f not in doc]
        if missing:
            raise ValueError(f"leader value lacks {', '.join(missing)}: {doc!r}")
        ident, address, http_address, term, ready = (doc["id"], doc["address"], doc.get("http", ""), doc["term"],
                                                     doc["ready"])
        if not isinstance(ident, str) or not ident:
            raise ValueError(f"leader id must be a non-empty string, got {ident!r}")
        if not isinstance(address, str):
            raise ValueError(f"leader address must be a host:port string, got {address!r}")
        parse_host_port(address, "leader address")
        if http_address is None:
            http_address = ""
        if not isinstance(http_address, str):
            raise ValueError(f"leader http must be a host:port string or empty, got {http_address!r}")
        if http_address:
            parse_host_port(http_address, "leader http address")
        if isinstance(term, bool) or not isinstance(term, int) or term < 0:
            raise ValueError(f"leader term must be a non-negative integer, got {term!r}")
        if not isinstance(ready, bool):
            raise ValueError(f"leader ready must be true or false, got {ready!r}")
        if create_revision is not None:
            term = create_revision
        return cls(ident, address, http_address, term, ready)

    @classmethod
    def from_kv(cls, kv: KeyValue) -> LeaderInfo:
        return cls.parse(kv.value, kv.create_revision)


def _describe(leader: LeaderInfo | None) -> str:
    if leader is None:
        return "no leader"
    return f"leader {leader.id} at {leader.address} (term {leader.term}, {'ready' if leader.ready else 'not ready'})"


class LeaderWatch:
    """The elected master of one cluster, read or followed through etcd.

    ``current()`` reads the leader key once; ``wait_ready(timeout)`` returns the leader as soon as one
    is ready. ``start()`` follows the key from a daemon thread: ``latest()`` is then the newest leader
    (None while there is none or its value is malformed), and callbacks given to ``on_change`` are
    called from that thread with each new value. ``close()`` stops the thread.

    ``target`` is an ``EtcdTarget`` or an ``etcd://`` URL; ``timeout`` bounds each etcd request
    (seconds, per endpoint); ``idle_timeout`` is how long a silent watch stream is trusted before it
    is reopened.
    """

    def __init__(self, target: EtcdTarget | str, timeout: float = 5.0, *,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT) -> None:
        if not idle_timeout > 0:
            raise ValueError(f"idle_timeout must be positive, got {idle_timeout}")
        self.target = _as_target(target)
        self.gateway = EtcdGateway(self.target, timeout)
        self.key = self.target.leader_key
        self.idle_timeout = float(idle_timeout)
        self._cond = threading.Condition()
        self._latest: LeaderInfo | None = None
        self._revision = 0
        self._error: str | None = None
        self._callbacks: list[Callable[[LeaderInfo | None], None]] = []
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: EtcdWatch | None = None

    # -- reading once ---------------------------------------------------------------------------

    def current(self) -> LeaderInfo | None:
        """The leader now, ready or not (None when there is none); ValueError for a malformed value."""
        kv = self.gateway.range(self.key)
        if kv is None:
            return None
        try:
            return LeaderInfo.from_kv(kv)
        except ValueError as e:
            raise ValueError(f"malformed leader value at {self.key} in etcd {','.join(self.target.endpoints)}: "
                             f"{e}") from None

    def wait_ready(self, timeout: float) -> LeaderInfo:
        """The leader once one is ready; TimeoutError naming the key and the endpoints after ``timeout`` s.

        Etcd being unreachable for a while is waited out within the timeout, like a missing leader.
        """
        deadline = time.monotonic() + timeout
        if self._stopped.is_set():
            raise RuntimeError(f"this LeaderWatch of {self.key} is closed")
        if self._thread is not None:
            with self._cond:
                while not (self._latest is not None and self._latest.ready) and not self._stopped.is_set():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                leader = self._latest
            if leader is not None and leader.ready:
                return leader
            if self._stopped.is_set():
                raise RuntimeError(f"this LeaderWatch of {self.key} was closed while waiting for a ready leader")
        else:
            leader = None
            follow = self._follow(lambda: deadline - time.monotonic(), threading.Event())
            try:
                for leader, _ in follow:
                    if leader is not None and leader.ready:
                        return leader
            finally:
                follow.close()
        why = f"; last error: {self._error}" if self._error else ""
        raise TimeoutError(f"no ready kvpool master at {self.key} in etcd {','.join(self.target.endpoints)} after "
                           f"{timeout}s ({_describe(leader)} at the end{why})")

    def _leader_of(self, kv: KeyValue | None) -> LeaderInfo | None:
        """The leader of a key version; a malformed value counts as no leader (and is logged)."""
        if kv is None:
            return None
        try:
            return LeaderInfo.from_kv(kv)
        except ValueError as e:
            self._error = f"malformed leader value at {self.key} (revision {kv.mod_revision}): {e}"
            log.warning("%s", self._error)
            return None

    def _follow(self, remaining: Callable[[], float | None],
                stopped: threading.Event) -> Generator[tuple[LeaderInfo | None, int], None, None]:
        """Yields (leader, revision) after the first read and after every change of the key.

        Runs until ``stopped`` is set or ``remaining()`` (seconds left, None for no end) runs out.
        Failures are retried with a growing pause; the watch resumes after the last revision seen,
        or reads the key anew when that revision was compacted or the store is behind it.
        """
        revision = 0  # the revision of the key's history seen up to; 0: read the key first
        backoff = _BACKOFF_MIN
        while not stopped.is_set():
            left = remaining()
            if left is not None and left <= 0:
                return
            try:
                if revision == 0:
                    kv, revision = self.gateway.read(self.key)
                    yield self._leader_of(kv), revision
                idle = self.idle_timeout if left is None else max(min(left, self.idle_timeout), 0.001)
                watch = self.gateway.watch(self.key, revision + 1, idle_timeout=idle)
                with self._cond:
                    self._watch = watch
                try:
                    if stopped.is_set():
                        return
                    if watch.revision < revision:
                        log.warning("etcd at %s is at revision %d, behind the %d seen: reading %s anew",
                                    watch.endpoint, watch.revision, revision, self.key)
                        revision = 0
                        continue
                    backoff = _BACKOFF_MIN
                    self._error = None
                    for ev in watch:
                        revision = max(revision, ev.kv.mod_revision)
                        yield self._leader_of(ev.kv if ev.type == "PUT" else None), revision
                finally:
                    with self._cond:
                        self._watch = None
                    watch.close()
            except EtcdCompacted as e:
                log.info("%s: reading %s anew", e, self.key)
                revision = 0
            except EtcdError as e:
                left = remaining()
                if stopped.is_set() or (left is not None and left <= 0):
                    return  # (a watch's idle timeout is cut to the time left: running out is no error)
                self._error = str(e)
                log.debug("following %s: %s", self.key, e)
                stopped.wait(backoff if left is None else max(min(backoff, left), 0))
                backoff = min(backoff * 2, _BACKOFF_MAX)

    # -- following --------------------------------------------------------------------------------

    def start(self) -> LeaderWatch:
        """Starts following the key from a daemon thread (once); returns self."""
        with self._cond:
            if self._stopped.is_set():
                raise RuntimeError("this LeaderWatch is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"kvpool-etcd-leader-{self.target.cluster}",
                                                daemon=True)
                self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                for leader, revision in self._follow(lambda: None, self._stopped):
                    self._update(leader, revision)
            except Exception:  # noqa: BLE001 - the follower must outlive a bug in one round
                log.exception("following %s failed; starting over", self.key)
                self._stopped.wait(_BACKOFF_MAX)

    def _update(self, leader: LeaderInfo | None, revision: int) -> None:
        with self._cond:
            self._revision = revision
            changed = leader != self._latest
            self._latest = leader
            callbacks = list(self._callbacks) if changed else []
            self._cond.notify_all()
        for callback in callbacks:
            try:
                callback(leader)
            except Exception:  # noqa: BLE001 - one callback must not stop the others or the follower
                log.exception("leader change callback %r failed", callback)

    def latest(self) -> LeaderInfo | None:
        """The newest leader seen by the follower thread (None before ``start()`` or while there is none)."""
        with self._cond:
            return self._latest

    @property
    def revision(self) -> int:
        """The etcd revision the follower has seen up to (0 before its first read)."""
        with self._cond:
            return self._revision

    @property
    def last_error(self) -> str | None:
        """Why the last etcd request failed, if the latest one did; None once a watch is open again."""
        return self._error

    def on_change(self, callback: Callable[[LeaderInfo | None], None]) -> Callable[[], None]:
        """Calls ``callback(leader or None)`` from the follower thread whenever the leader value changes
        (a new leader, the same one turning ready, or none). Returns a function that removes it."""
        with self._cond:
            self._callbacks.append(callback)

        def remove() -> None:
            with self._cond:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)
        return remove

    def close(self) -> None:
        """Stops the follower thread (it ends its watch stream); ``wait_ready`` then raises RuntimeError."""
        self._stopped.set()
        with self._cond:
            watch = self._watch
            self._cond.notify_all()
        if watch is not None:
            watch.close()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.gateway.timeout * len(self.gateway.endpoints) + 5)

    def __enter__(self) -> LeaderWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def list_masters(target: EtcdTarget | str, timeout: float = 5.0) -> list[dict[str, Any]]:
    """Every registered master, leader or standby, as its registry value says (``id``, ``address``,
    ``http``, ``role``), in id order. A value that is not a JSON object is listed as ``{"id": ...,
    "error": ...}`` rather than hiding the others."""
    t = _as_target(target)
    masters: list[dict[str, Any]] = []
    for kv in EtcdGateway(t, timeout).range_prefix(t.masters_prefix):
        name = kv.key.decode("utf-8", "replace")[len(t.masters_prefix):]
        try:
            doc = json.loads(kv.value)
        except (ValueError, UnicodeDecodeError) as e:
            masters.append({"id": name, "error": f"value is not JSON ({e})"})
            continue
        if not isinstance(doc, dict):
            masters.append({"id": name, "error": f"value is not a JSON object: {doc!r}"})
            continue
        doc.setdefault("id", name)
        masters.append(doc)
    return masters
