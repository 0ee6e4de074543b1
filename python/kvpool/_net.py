"""Connections and connection pools: one request at a time per connection (docs/protocol.md 1.2).

A ``Connection`` writes one request frame (header, body, then payload straight from the caller's
memory) and reads the reply header and body; a NODE_READ reply's payload is then read with
``read_payload_into`` straight into the caller's memory (``recv_into``), never through ``bytes``.

Error replies become exceptions: ``BAD_REQUEST`` a ValueError carrying the server's message (the
request was invalid; the connection stays usable when nothing was left unread), every other status a
``KvPoolError``. A connection that saw any error other than a clean BAD_REQUEST is discarded.

A connection given an ``ssl.SSLContext`` (``kvpool.tls``) runs TLS below the frames: the handshake
happens at connect, within the connect timeout, before authentication; a failed one is an OSError
whose message says why (``kvpool.tls.explain``).

A ``ConnectionPool`` lends connections to threads under a lock. It remembers the process id that
opened them: after ``fork()`` the child never touches the parent's sockets (it forgets them and
opens its own), because two processes interleaving frames on one socket would corrupt both.
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
import time
from typing import Callable, Sequence

from . import protocol as p
from .auth import NONE as NO_SECRETS
from .auth import Secrets, authenticate
from .errors import KvPoolError, MasterUnreachable
from .tls import explain


def parse_host_port(s: str, what: str = "address") -> tuple[str, int]:
    """Splits ``host:port`` (``[v6]:port`` too); ValueError naming ``what`` otherwise."""
    if not isinstance(s, str) or ":" not in s:
        raise ValueError(f"{what} must be host:port, got {s!r}")
    host, _, port = s.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        n = int(port)
    except ValueError:
        raise ValueError(f"{what} must be host:port with a numeric port, got {s!r}") from None
    if not host or not 0 < n < 65536:
        raise ValueError(f"{what} must be host:port with a port in 1..65535, got {s!r}")
    return host, n


class Connection:
    """One TCP connection to a master or a node, carrying one exchange at a time."""

    def __init__(self, host: str, port: int, connect_timeout: float,
                 max_body: int = p.DEFAULT_MAX_BODY_BYTES, max_payload: int = p.DEFAULT_MAX_PAYLOAD_BYTES,
                 tls: ssl.SSLContext | None = None) -> None:
        self.address = f"{host}:{port}"
        sock = socket.create_connection((host, port), timeout=connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            try:
                sock = tls.wrap_socket(sock, server_hostname=host)
            except ssl.SSLError as e:
                sock.close()
                raise ConnectionError(explain(e, self.address)) from e
            except OSError:
                sock.close()
                raise
        self.sock: socket.socket = sock
        self.max_body = max_body
        self.max_payload = max_payload
        self.next_id = 1
        self.broken = False
        self.pending_payload = 0  # reply payload bytes not read yet
        self.master_run = -1  # to a master: the client's master run its HELLO met (Client._hello)
        self.pid = os.getpid()
        self._hdr = bytearray(p.HEADER_BYTES)

    def call(self, opcode: int, body: bytes, timeout: float, payload: Sequence[memoryview] = ()) -> tuple[bytes, int]:
        """Sends one request and reads the reply's header and body: returns (body, payload length).

        The reply payload, if any, must then be read with ``read_payload_into`` before the next call.
        """
        if self.pending_payload:
            raise KvPoolError(f"{self.address}: {self.pending_payload} reply payload bytes still unread")
        rid = self.next_id
        self.next_id += 1
        total = 0
        for v in payload:
            total += v.nbytes
        self.sock.settimeout(timeout)
        try:
            head = p.encode_header(opcode, rid, len(body), total)
            if total and total < 1 << 16:
                self.sock.sendall(b"".join((head, body, *payload)))
            else:
                self.sock.sendall(head + body)
                for v in payload:
                    self.sock.sendall(v)
            self._recv_exact(self._hdr)
            h = p.decode_header(self._hdr)
            if not h.flags & p.FLAG_REPLY:
                raise p.ProtocolError("received a request frame where a reply was expected")
            if h.request_id not in (rid, 0):
                raise p.ProtocolError(f"reply carries request id {h.request_id}, expected {rid}")
            if h.body_length > self.max_body or h.payload_length > self.max_payload:
                raise p.ProtocolError(f"reply of {h.body_length} body and {h.payload_length} payload bytes "
                                      "exceeds this client's limits")
            reply = bytearray(h.body_length)
            if h.body_length:
                self._recv_exact(reply)
        except ssl.SSLError as e:
            self.close()
            raise ConnectionError(explain(e, self.address)) from e
        except (OSError, p.ProtocolError):
            self.close()
            raise
        if h.status != p.FrameStatus.OK:
            msg = p.decode_error(reply)
            if h.status == p.FrameStatus.BAD_REQUEST and not total and not h.payload_length:
                raise ValueError(f"{self.address} refused {p.Opcode(opcode).name}: {msg}")
            self.close()
            try:
                name = p.FrameStatus(h.status).name
            except ValueError:
                name = f"status {h.status}"
            raise KvPoolError(f"{self.address} answered {p.Opcode(opcode).name} with {name}: {msg}")
        self.pending_payload = h.payload_length
        return bytes(reply), h.payload_length

    def read_payload_into(self, dst: memoryview) -> None:
        """Reads the next ``len(dst)`` reply payload bytes straight into ``dst``."""
        n = dst.nbytes
        if n > self.pending_payload:
            self.close()
            raise p.ProtocolError(f"{self.address}: asked for {n} payload bytes, {self.pending_payload} left")
        try:
            self._recv_exact(dst)
        except OSError:
            self.close()
            raise
        self.pending_payload -= n

    def _recv_exact(self, buf: bytearray | memoryview) -> None:
        view = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf
        got = 0
        n = view.nbytes
        recv_into = self.sock.recv_into
        while got < n:
            k = recv_into(view[got:], n - got)
            if k == 0:
                raise ConnectionError(f"{self.address} closed the connection")
            got += k

    def close(self) -> None:
        """Closes the connection. In the process that opened it, shuts the socket down first: a copy of it that
        a forked child still holds must not keep the peer's side open (a node keeps a write lease's range set
        aside until the connection that set it aside ends), and a thread blocked reading it wakes up. A forked
        child only closes its own copy, which leaves the parent's connection alone."""
        self.broken = True
        if self.pid == os.getpid():
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            self.sock.close()
        except OSError:
            pass


class ConnectionPool:
    """Up to ``max_connections`` connections to one peer, lent to one thread at a time.

    A new connection runs TLS with ``tls`` when given, authenticates with ``secrets`` when there are any
    (docs/security.md), then
    ``on_connect`` runs on it before it is lent (the master's HELLO). Fork-safe: a pool used in a
    process other than the one that filled it starts empty.
    """

    def __init__(self, host: str, port: int, *, max_connections: int, connect_timeout: float,
                 on_connect: Callable[[Connection], None] | None = None, master: bool = False,
                 secrets: Secrets = NO_SECRETS, tls: ssl.SSLContext | None = None) -> None:
        self.secrets = secrets
        self.tls = tls
        self.host = host
        self.port = port
        self.address = f"{host}:{port}"
        self.max = max(1, max_connections)
        self.connect_timeout = connect_timeout
        self.on_connect = on_connect
        self.master = master
        self._lock = threading.Condition()
        self._idle: list[Connection] = []
        self._open = 0
        self._pid = os.getpid()
        self._closed = False

    def _check_fork(self) -> None:
        if self._pid != os.getpid():
            # a forked child: the parent's sockets are shared copies; close ours (the parent keeps its own)
            for c in self._idle:
                c.close()
            self._idle = []
            self._open = 0
            self._pid = os.getpid()

    def borrow(self, timeout: float) -> Connection:
        deadline = time.monotonic() + timeout
        with self._lock:
            self._check_fork()
            while True:
                if self._closed:
                    raise KvPoolError(f"connection pool to {self.address} is closed")
                if self._idle:
                    return self._idle.pop()
                if self._open < self.max:
                    self._open += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise KvPoolError(f"no free connection to {self.address} within {timeout:.1f}s "
                                      f"({self.max} in use)")
                self._lock.wait(left)
        try:
            c = Connection(self.host, self.port, min(self.connect_timeout, max(0.001, deadline - time.monotonic())),
                           tls=self.tls)
            if self.secrets.present:
                authenticate(c, self.secrets, max(self.connect_timeout, deadline - time.monotonic()))
            if self.on_connect is not None:
                self.on_connect(c)
            return c
        except BaseException as e:
            with self._lock:
                self._open -= 1
                self._lock.notify()
            if isinstance(e, OSError):
                cls = MasterUnreachable if self.master else KvPoolError
                raise cls(f"cannot connect to {'master' if self.master else 'node'} at {self.address}: {e}") from e
            raise

    def release(self, c: Connection) -> None:
        with self._lock:
            self._check_fork()
            if c.pid != self._pid:
                c.close()  # opened before a fork: never lend it in this process
                return
            if c.broken or c.pending_payload or self._closed:
                c.close()
                self._open -= 1
            else:
                self._idle.append(c)
            self._lock.notify()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._pid == os.getpid():
                for c in self._idle:
                    c.close()
            self._idle = []
            self._open = 0
            self._lock.notify_all()


def connect(host: str, port: int, connect_timeout: float, secrets: Secrets, tls: ssl.SSLContext | None) -> Connection:
    """A connection outside any pool (a write lease's to its node, the read lease's long poll), authenticated
    when there are secrets; closed again if that fails."""
    c = Connection(host, port, connect_timeout, tls=tls)
    try:
        if secrets.present:
            authenticate(c, secrets, connect_timeout)
    except BaseException:
        c.close()
        raise
    return c


def frame_end(lengths: Sequence[int], start: int, max_payload: int) -> int:
    """End (exclusive) of the node frame starting at ``start``: at most 4096 items and ``max_payload``
    bytes, but always at least one item (a single larger value goes alone)."""
    end = start
    total = 0
    while end < len(lengths) and end - start < p.MAX_ITEMS_PER_NODE_FRAME:
        if end > start and total + lengths[end] > max_payload:
            break
        total += lengths[end]
        end += 1
    return end
