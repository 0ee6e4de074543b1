"""Connections and connection pools: one request at a time per connection (docs/protocol.md 1.2).

A ``Connection`` writes one request frame (header, body, then payload straight from the caller's
memory) with one ``sendmsg`` and reads the reply header and body with one ``recv_into`` into a buffer of its
own; a NODE_READ reply's payload is then read with ``read_payload_into`` straight into the caller's memory
(``recv_into``; the part that came with the header is copied from the buffer), never through ``bytes``.
Fork checks compare with ``pid()``, kept by a fork hook, not a ``getpid`` system call per request.

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
import struct
import threading
import time
from collections import deque
from typing import Callable, Sequence

from . import protocol as p
from .auth import NONE as NO_SECRETS
from .auth import Secrets, authenticate
from .errors import KvPoolError, MasterUnreachable
from .tls import explain


_pid = os.getpid()

#: How long a connection polls its socket for a reply before it blocks, by default (seconds): as the Java
#: client's ``BusyPoll.DEFAULT``. On a machine whose idle CPUs sleep, a blocked reader's CPU must be woken when
#: the reply comes: about 30 us on the VMs this was measured on. A connection whose replies take longer polls
#: ever less often: after a poll that ran out, one wait in 8, then 16, 32 and at most 64, until one finds its reply.
DEFAULT_BUSY_POLL = 100e-6
#: The largest budget accepted (seconds).
MAX_BUSY_POLL = 1e-3
_FIRST_RETRY = 8
_LAST_RETRY = 64
#: A ``sched_yield`` longer than this (ns) ran another thread: the CPU is busy and a poll stops there.
_YIELDED_AWAY_NS = 10_000


def check_busy_poll(busy_poll: float) -> float:
    """``busy_poll`` if it is a budget a connection accepts (0, off, to ``MAX_BUSY_POLL``); else a ValueError."""
    if not 0 <= busy_poll <= MAX_BUSY_POLL:
        raise ValueError(f"busy_poll must be 0 (off) to {MAX_BUSY_POLL} s, got {busy_poll}")
    return float(busy_poll)


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def pid() -> int:
    """This process's id, without a system call (kept by a fork hook): what fork checks compare with."""
    return _pid


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


#: Bytes of a connection's receive buffer: a reply's header and body, and the start of its payload, arrive
#: with one ``recv_into`` when they fit.
RECV_BUFFER = 64 << 10
#: iovecs per ``sendmsg`` (Linux's IOV_MAX is 1024).
_IOV_MAX = 1024
_TIMEVAL = struct.Struct("ll")


class Connection:
    """One TCP connection to a master or a node.

    ``call`` sends a request and reads its reply. ``send`` sends one without waiting and ``receive`` takes the
    oldest reply not taken yet: servers answer a connection's requests one at a time, in the order they came
    (docs/protocol.md, section 1.2), so many can be in flight (pipelining). The caller bounds how many it leaves
    unanswered: a server stops reading while the reply it writes finds the socket full.

    System calls per exchange (plain TCP): one ``sendmsg`` for the whole request frame (header, body and the
    payload straight from the caller's memory), and one ``recv_into`` into a buffer of the connection's own for
    the reply's header and body, which also takes the start of a payload (``read_payload_into`` drains it first).
    The socket is blocking, with the kernel's SO_RCVTIMEO / SO_SNDTIMEO as the per-call timeout (set only when
    it changes): a socket in Python's timeout mode polls before every send and receive. A kernel timeout is
    raised as ``TimeoutError``. TLS connections keep Python's timeout mode (an SSL socket has no ``sendmsg``).
    """

    def __init__(self, host: str, port: int, connect_timeout: float,
                 max_body: int = p.DEFAULT_MAX_BODY_BYTES, max_payload: int = p.DEFAULT_MAX_PAYLOAD_BYTES,
                 tls: ssl.SSLContext | None = None, busy_poll: float = 0.0) -> None:
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
        else:
            sock.settimeout(None)  # blocking; timeouts are the kernel's (``_set_timeout``)
        self.sock: socket.socket = sock
        self._plain = tls is None
        self._timeout = -1.0
        self.max_body = max_body
        self.max_payload = max_payload
        self.next_id = 1
        self.broken = False
        self.pending_payload = 0  # reply payload bytes not read yet
        self.master_run = -1  # to a master: the client's master run its HELLO met (MasterChannel._hello)
        self.pid = pid()
        self._buf = bytearray(RECV_BUFFER)
        self._view = memoryview(self._buf)
        self._have = 0  # bytes received past the current reply's body (its payload, then later replies), from ``_at``
        self._at = 0
        self._unanswered: deque[tuple[int, int, bool]] = deque()  # sent, not answered: (request id, opcode, payload?)
        # a reply is polled for up to this long before the blocking read (plain TCP only; 0: never)
        self._poll_ns = int(check_busy_poll(busy_poll) * 1e9) if self._plain else 0
        self._retry_every = 0  # after polls that ran out: one wait in this many polls (0: every one)
        self._skipped = 0
        self.polls_hit = 0
        self.polls_missed = 0

    def _set_timeout(self, timeout: float) -> None:
        if timeout == self._timeout:
            return
        if self._plain:
            t = max(timeout, 0.001)
            tv = _TIMEVAL.pack(int(t), int((t - int(t)) * 1e6))
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
        else:
            self.sock.settimeout(timeout)
        self._timeout = timeout

    def call(self, opcode: int, body: bytes, timeout: float, payload: Sequence[memoryview] = ()) -> tuple[bytes, int]:
        """Sends one request and reads the reply's header and body: returns (body, payload length).

        The reply payload, if any, must then be read with ``read_payload_into`` before the next call.
        """
        if self._unanswered:
            raise KvPoolError(f"{self.address}: {len(self._unanswered)} pipelined requests are unanswered: "
                              "receive their replies before a call")
        self.send(opcode, body, timeout, payload)
        return self.receive(timeout)

    def send(self, opcode: int, body: bytes, timeout: float, payload: Sequence[memoryview] = ()) -> None:
        """Sends one request without waiting for its reply; ``receive`` takes the replies in order. Returns once
        the frame is on the socket: the caller's buffers may be reused."""
        if self.pending_payload:
            raise KvPoolError(f"{self.address}: {self.pending_payload} reply payload bytes still unread")
        rid = self.next_id
        self.next_id += 1
        total = 0
        for v in payload:
            total += v.nbytes
        self._unanswered.append((rid, opcode, total > 0))
        try:
            self._set_timeout(timeout)
            self._send(p.encode_header(opcode, rid, len(body), total), body, payload, total)
        except ssl.SSLError as e:
            self.close()
            raise ConnectionError(explain(e, self.address)) from e
        except OSError:
            self.close()
            raise

    @property
    def unanswered(self) -> int:
        """Requests sent with ``send`` whose replies were not received yet."""
        return len(self._unanswered)

    def peer_closed(self) -> bool:
        """Whether the peer closed the connection or sent something unasked, checked without waiting (the Java
        ``FrameConnection.peerClosed``): a server answers only requests, so with none outstanding, any byte to
        read or the end of the stream means the connection is over (it is then marked broken). A same-machine
        writer asks this of the connection holding its lease range after stamping objects there and before its
        COMMIT (docs/protocol.md, section 4.28)."""
        if self.broken:
            return True
        if self._unanswered or self._have:
            return False
        try:
            if self._plain:
                got = self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            else:
                before = self.sock.gettimeout()
                self.sock.setblocking(False)
                try:
                    got = self.sock.recv(1)
                finally:
                    self.sock.settimeout(before)
        except (BlockingIOError, ssl.SSLWantReadError):
            return False
        except OSError:
            got = b""
        del got
        self.broken = True
        return True

    def receive(self, timeout: float) -> tuple[bytes, int]:
        """The reply to the oldest request not answered yet: (body, payload length), as ``call`` returns it. An
        error status answers that request alone; after BAD_REQUEST to a request without payload the connection
        goes on with the next reply."""
        if not self._unanswered:
            raise KvPoolError(f"{self.address}: no request is waiting for its reply")
        if self.pending_payload:
            raise KvPoolError(f"{self.address}: {self.pending_payload} reply payload bytes still unread")
        rid, opcode, sent_payload = self._unanswered.popleft()
        try:
            self._set_timeout(timeout)
            h, reply = self._receive(timeout)
            if not h.flags & p.FLAG_REPLY:
                raise p.ProtocolError("received a request frame where a reply was expected")
            if h.request_id not in (rid, 0):
                raise p.ProtocolError(f"reply carries request id {h.request_id}, expected {rid}")
        except ssl.SSLError as e:
            self.close()
            raise ConnectionError(explain(e, self.address)) from e
        except (OSError, p.ProtocolError):
            self.close()
            raise
        if h.status != p.FrameStatus.OK:
            msg = p.decode_error(reply)
            if h.status == p.FrameStatus.BAD_REQUEST and not sent_payload and not h.payload_length:
                raise ValueError(f"{self.address} refused {p.Opcode(opcode).name}: {msg}")
            self.close()
            try:
                name = p.FrameStatus(h.status).name
            except ValueError:
                name = f"status {h.status}"
            raise KvPoolError(f"{self.address} answered {p.Opcode(opcode).name} with {name}: {msg}")
        self.pending_payload = h.payload_length
        return reply, h.payload_length

    def _send(self, head: bytes, body: bytes, payload: Sequence[memoryview], total: int) -> None:
        if not self._plain:
            if total < 1 << 16:
                self.sock.sendall(b"".join((head, body, *payload)))
            else:
                self.sock.sendall(head + body)
                for v in payload:
                    self.sock.sendall(v)
            return
        parts: list[bytes | memoryview] = [head, body, *payload] if body else [head, *payload]
        left = len(head) + len(body) + total
        sendmsg = self.sock.sendmsg
        try:
            while True:
                n = sendmsg(parts[:_IOV_MAX])
                left -= n
                if not left:
                    return
                while n:  # drop what went, keep the rest of a part sent in part
                    k = len(parts[0]) if isinstance(parts[0], bytes) else parts[0].nbytes
                    if n >= k:
                        n -= k
                        parts.pop(0)
                    else:
                        parts[0] = memoryview(parts[0])[n:]
                        n = 0
        except BlockingIOError:
            raise TimeoutError(f"{self.address}: sending timed out after {self._timeout:.1f}s") from None

    def _receive(self, timeout: float) -> tuple[p.Header, bytes]:
        """Reads the reply's header and body; bytes that came with them (its payload, pipelined replies after it)
        stay in the buffer."""
        view = self._view
        got = self._have
        if got:  # the start of this reply came with the last one (pipelined): to the front
            view[:got] = view[self._at:self._at + got]
        if got < p.HEADER_BYTES and self._poll_ns:
            got = self._poll(got)
        got = self._fill(got, p.HEADER_BYTES)
        h = p.decode_header(view[:p.HEADER_BYTES])
        if h.body_length > self.max_body or h.payload_length > self.max_payload:
            raise p.ProtocolError(f"reply of {h.body_length} body and {h.payload_length} payload bytes "
                                  "exceeds this client's limits")
        end = p.HEADER_BYTES + h.body_length
        if end <= len(view):
            if got < end:
                got = self._fill(got, end)
            reply = bytes(view[p.HEADER_BYTES:end])
        else:  # a body larger than the buffer: what came with the header, then the rest straight into it
            big = bytearray(h.body_length)
            have = got - p.HEADER_BYTES
            big[:have] = view[p.HEADER_BYTES:got]
            self._recv_exact(memoryview(big)[have:])
            reply, got, end = bytes(big), 0, 0
        self._at, self._have = end, got - end
        if self._have > h.payload_length and not self._unanswered:
            raise p.ProtocolError(f"{self.address} sent {self._have - h.payload_length} bytes after its reply")
        return h, reply

    def _poll(self, got: int) -> int:
        """Polls the socket for the reply for up to the busy-poll budget (``MSG_DONTWAIT``, yielding the CPU
        between tries, and stopping once a yield ran another thread), when this wait is one to poll; the count of
        bytes the buffer holds then. The Java client's ``BusyPoll`` does the same."""
        if self._retry_every:
            self._skipped += 1
            if self._skipped < self._retry_every:
                return got
        self._skipped = 0
        recv_into = self.sock.recv_into
        view = self._view[got:]
        end = time.perf_counter_ns() + self._poll_ns
        while True:
            try:
                k = recv_into(view, 0, socket.MSG_DONTWAIT)
            except BlockingIOError:
                now = time.perf_counter_ns()
                if now < end:
                    os.sched_yield()
                    if time.perf_counter_ns() - now <= _YIELDED_AWAY_NS:
                        continue
                    # the yield ran another thread: the CPU is busy and polling would only take from it; not a
                    # miss (the peer may well be quick), so the next wait polls as this one did
                    return got
                self._retry_every = min(_LAST_RETRY, 2 * self._retry_every) if self._retry_every else _FIRST_RETRY
                self.polls_missed += 1
                return got
            if k == 0:
                raise ConnectionError(f"{self.address} closed the connection")
            self._retry_every = 0
            self.polls_hit += 1
            return got + k

    def _fill(self, got: int, need: int) -> int:
        """Receives into the buffer from ``got`` until it holds at least ``need`` bytes; the count it holds."""
        view = self._view
        recv_into = self.sock.recv_into
        try:
            while got < need:
                k = recv_into(view[got:])
                if k == 0:
                    raise ConnectionError(f"{self.address} closed the connection")
                got += k
        except BlockingIOError:
            raise TimeoutError(f"{self.address}: no reply within {self._timeout:.1f}s") from None
        return got

    def read_payload_into(self, dst: memoryview) -> None:
        """Reads the next ``len(dst)`` reply payload bytes straight into ``dst``."""
        n = dst.nbytes
        if n > self.pending_payload:
            self.close()
            raise p.ProtocolError(f"{self.address}: asked for {n} payload bytes, {self.pending_payload} left")
        try:
            k = min(n, self._have)
            if k:
                dst[:k] = self._view[self._at:self._at + k]
                self._at += k
                self._have -= k
            if k < n:
                self._recv_exact(dst[k:])
        except OSError:
            self.close()
            raise
        self.pending_payload -= n

    def _recv_exact(self, buf: memoryview) -> None:
        view = buf.cast("B") if buf.format != "B" else buf
        got = 0
        n = view.nbytes
        recv_into = self.sock.recv_into
        try:
            while got < n:
                k = recv_into(view[got:], n - got)
                if k == 0:
                    raise ConnectionError(f"{self.address} closed the connection")
                got += k
        except BlockingIOError:
            raise TimeoutError(f"{self.address}: no reply within {self._timeout:.1f}s") from None

    def close(self) -> None:
        """Closes the connection. In the process that opened it, shuts the socket down first: a copy of it that
        a forked child still holds must not keep the peer's side open (a node keeps a write lease's range set
        aside until the connection that set it aside ends), and a thread blocked reading it wakes up. A forked
        child only closes its own copy, which leaves the parent's connection alone."""
        self.broken = True
        if self.pid == pid():
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
                 secrets: Secrets = NO_SECRETS, tls: ssl.SSLContext | None = None, busy_poll: float = 0.0) -> None:
        self.secrets = secrets
        self.busy_poll = check_busy_poll(busy_poll)
        self.tls = tls
        self.host = host
        self.port = port
        self.address = f"{host}:{port}"
        self.max = max(1, max_connections)
        self.connect_timeout = connect_timeout
        self.on_connect = on_connect
        self.master = master
        self._lock = threading.Condition(threading.Lock())
        self._idle: list[Connection] = []
        self._open = 0
        self._waiting = 0  # borrowers waiting for a connection: only then is there anyone to notify
        self._pid = pid()
        self._closed = False

    def _check_fork(self) -> None:
        if self._pid != pid():
            # a forked child: the parent's sockets are shared copies; close ours (the parent keeps its own)
            for c in self._idle:
                c.close()
            self._idle = []
            self._open = 0
            self._pid = pid()

    def borrow(self, timeout: float) -> Connection:
        deadline = 0.0
        with self._lock:
            self._check_fork()
            while True:
                if self._closed:
                    raise KvPoolError(f"connection pool to {self.address} is closed")
                if self._idle:
                    return self._idle.pop()
                if not deadline:
                    deadline = time.monotonic() + timeout
                if self._open < self.max:
                    self._open += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise KvPoolError(f"no free connection to {self.address} within {timeout:.1f}s "
                                      f"({self.max} in use)")
                self._waiting += 1
                try:
                    self._lock.wait(left)
                finally:
                    self._waiting -= 1
        return self._connect(deadline)

    def try_borrow(self, timeout: float) -> Connection | None:
        """An idle connection, or a new one while fewer than the most are open; None, without waiting, when every
        connection is lent. A caller that already holds a connection of this pool and wants another must not wait
        for it: two such callers would each wait for the other's. Raises as ``borrow`` does when a new connection
        cannot be opened."""
        with self._lock:
            self._check_fork()
            if self._closed:
                raise KvPoolError(f"connection pool to {self.address} is closed")
            if self._idle:
                return self._idle.pop()
            if self._open >= self.max:
                return None
            self._open += 1
        return self._connect(time.monotonic() + timeout)

    def _connect(self, deadline: float) -> Connection:
        """Opens a connection in a slot already counted in ``_open`` (given back if it fails)."""
        try:
            c = Connection(self.host, self.port, min(self.connect_timeout, max(0.001, deadline - time.monotonic())),
                           tls=self.tls, busy_poll=self.busy_poll)
            if self.secrets.present:
                authenticate(c, self.secrets, max(self.connect_timeout, deadline - time.monotonic()))
            if self.on_connect is not None:
                self.on_connect(c)
            return c
        except BaseException as e:
            with self._lock:
                self._open -= 1
                if self._waiting:
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
            if c.broken or c.pending_payload or c.unanswered or self._closed:  # never lend a reply still due
                c.close()
                self._open -= 1
            else:
                self._idle.append(c)
            if self._waiting:
                self._lock.notify()

    def drop_idle(self) -> None:
        """Closes the idle connections: one turned out dead (its server restarted), so they may all be; the next
        borrow opens a fresh one."""
        with self._lock:
            self._check_fork()
            for c in self._idle:
                c.close()
            self._open -= len(self._idle)
            self._idle = []
            if self._waiting:
                self._lock.notify_all()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._pid == pid():
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
