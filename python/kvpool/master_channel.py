"""The client's one way to the master (the Java ``MasterChannel``): pooled connections, the HELLO on each, the
PING that keeps a busy client counted as active, and, with masters elected through etcd, moving to the leader
etcd names when the one talked to fails.

Master runs
-----------
Segment ids are per master run: a new master (a restart, a failover) numbers the segments in the order their
nodes register again. Every master connection remembers the run its HELLO met, so an answer naming segments is
valid in the run of the connection that carried it (``call_in_run``). A HELLO that meets a new master
incarnation starts a new run: the listeners given to ``on_new_run`` are told under the channel's lock (the
segment table is dropped there, atomically with the new run), those given to ``after_new_run`` after it (the
remembered locations). docs/architecture.md, "Master runs".

Nothing here knows the client above it: the reads, the writes and the leases use a channel, never the reverse.
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
import time
import uuid
from typing import Callable, TypeVar

from . import protocol as p
from ._net import Connection, ConnectionPool, parse_host_port
from .auth import Secrets
from .codec import signed64
from .errors import KvPoolError, MasterTimeout, MasterUnreachable
from .etcd import LeaderInfo, LeaderWatch, parse_etcd_url
from .protocol import Opcode

T = TypeVar("T")

#: A request after this long without a HELLO or PING is preceded by a PING on the same connection.
PING_INTERVAL = 4.0


class MasterChannel:
    """Exchanges with the master (or the elected leader) of one pool, from any thread.

    ``master`` is ``host:port`` or ``etcd://host:port[,host:port...][/cluster]``; the constructor finds the
    leader of the latter (``MasterUnreachable`` when none is ready within ``timeout``) but does not connect:
    the first call does.
    """

    def __init__(self, master: str, *, timeout: float, connect_timeout: float, max_connections: int,
                 secrets: Secrets, tls: ssl.SSLContext | None, busy_poll: float = 0.0) -> None:
        self.timeout = timeout
        #: How long a connection (to the master or a node) polls for a reply before it blocks (``kvpool._net``).
        self.busy_poll = busy_poll
        self.connect_timeout = connect_timeout
        self.max_connections = max_connections
        self.secrets = secrets
        self.tls = tls
        self._leaders: LeaderWatch | None = None
        self._leader: LeaderInfo | None = None
        if master.strip().lower().startswith("etcd://"):
            target = parse_etcd_url(master)
            #: The pool's address as given: ``host:port`` or the etcd URL.
            self.address = str(target)
            self._leaders = LeaderWatch(target, timeout=connect_timeout).start()
            try:
                self._leader = self._leaders.wait_ready(self.timeout)
            except (TimeoutError, KvPoolError) as e:
                self._leaders.close()
                raise MasterUnreachable(f"no master to talk to in {target}: {e}") from e
            host, port = parse_host_port(self._leader.address, "leader address in etcd")
        else:
            host, port = parse_host_port(master, "master")
            self.address = f"{host}:{port}"
        u = uuid.uuid4().int
        #: This client's id, as HELLO and PING tell the master.
        self.client_id = (signed64(u >> 64), signed64(u & ((1 << 64) - 1)))
        self._hostname = socket.gethostname()
        #: Guards the run, the incarnation and what the ``on_new_run`` listeners keep.
        self.lock = threading.Lock()
        self._incarnation: int | None = None
        self._heard = 0.0  # when the master last heard HELLO or PING from this client
        #: The largest value the master takes (its HELLO), at most the protocol's payload limit.
        self.max_value_bytes = p.DEFAULT_MAX_PAYLOAD_BYTES
        #: The pool's epoch, as the last HELLO, PING or answer carrying it said.
        self.epoch = 0
        #: Copies a put makes when it does not say (the master's ``--replicas``), from its HELLO.
        self.default_replicas = 1
        #: The master run this client is in (see the module notes).
        self.run = 0
        self._on_new_run: list[Callable[[], None]] = []
        self._after_new_run: list[Callable[[], None]] = []
        self._closed = False
        self._pool = self._master_pool(host, port)

    def on_new_run(self, listener: Callable[[], None]) -> None:
        """``listener`` runs under ``lock`` whenever a HELLO meets a new master run."""
        self._on_new_run.append(listener)

    def after_new_run(self, listener: Callable[[], None]) -> None:
        """``listener`` runs, outside ``lock``, after a HELLO met a new master run."""
        self._after_new_run.append(listener)

    @property
    def incarnation(self) -> int | None:
        """The incarnation of the master the last HELLO met (None before the first)."""
        return self._incarnation

    @property
    def heard(self) -> float:
        """When (``time.monotonic``) the master last heard a HELLO or PING from this client."""
        return self._heard

    @heard.setter
    def heard(self, at: float) -> None:
        self._heard = at

    def _master_pool(self, host: str, port: int) -> ConnectionPool:
        return ConnectionPool(host, port, max_connections=self.max_connections, connect_timeout=self.connect_timeout,
                              on_connect=self._hello, master=True, secrets=self.secrets, tls=self.tls,
                              busy_poll=self.busy_poll)

    def _hello(self, c: Connection) -> None:
        body, _ = c.call(Opcode.HELLO, p.encode_hello(self.client_id, self._hostname, os.getpid()), self.timeout)
        r = p.decode_hello_reply(body)
        new_run = False
        with self.lock:
            if self._incarnation is not None and self._incarnation != r.incarnation:
                # a new master run: what was learned of the old one means nothing now
                self.run += 1
                for listener in self._on_new_run:
                    listener()
                new_run = True
            self._incarnation = r.incarnation
            c.master_run = self.run
            self._heard = time.monotonic()
            self.max_value_bytes = min(r.max_value_bytes, p.DEFAULT_MAX_PAYLOAD_BYTES)
            self.epoch = r.epoch
            self.default_replicas = max(1, r.default_replicas)
        if new_run:
            for listener in self._after_new_run:
                listener()

    def _relocate(self, deadline: float) -> bool:
        """After the master failed at the connection level: moves to the leader etcd names now, waiting (up to
        ``deadline``) for a ready one other than the failed one. False without an election or when none came."""
        if self._leaders is None:
            return False
        failed = self._leader
        while not self._closed:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                leader = self._leaders.wait_ready(left)
            except (TimeoutError, KvPoolError):
                return False
            if failed is None or (leader.address, leader.term) != (failed.address, failed.term):
                with self.lock:
                    if self._leader is failed:
                        old = self._pool
                        host, port = parse_host_port(leader.address, "leader address in etcd")
                        self._pool = self._master_pool(host, port)
                        self._leader = leader
                        old.close()
                return True
            time.sleep(min(0.1, left))  # etcd still names the master that failed: its lease has not run out yet
        return False

    def call(self, opcode: Opcode, body: bytes, decode: Callable[[bytes], T]) -> T:
        """One master exchange; a pooled connection that turns out dead is replaced once, and with elected
        masters the call moves to the next leader until ``timeout``."""
        return self.call_in_run(opcode, body, decode)[0]

    def call_in_run(self, opcode: Opcode, body: bytes, decode: Callable[[bytes], T]) -> tuple[T, int]:
        """``call``, with the master run of the connection that answered (see the module notes)."""
        if self._closed:
            raise KvPoolError("client is closed")
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return self._call_once(opcode, body, decode)
            except MasterUnreachable:
                if not self._relocate(deadline):
                    raise
            except MasterTimeout:
                # a leader that stopped answering (frozen, cut off): go on only if etcd names another one now
                latest = self._leaders.latest() if self._leaders is not None else None
                current = self._leader
                if latest is None or current is None or not latest.ready \
                        or (latest.address, latest.term) == (current.address, current.term) \
                        or not self._relocate(time.monotonic() + self.timeout):
                    raise

    def _call_once(self, opcode: Opcode, body: bytes, decode: Callable[[bytes], T]) -> tuple[T, int]:
        for attempt in (0, 1):
            pool = self._pool
            c = pool.borrow(self.timeout)
            fresh = c.next_id <= 2  # HELLO was its only exchange
            try:
                if time.monotonic() - self._heard > PING_INTERVAL:
                    # keeps a busy client counted as active (the master's client TTL is 10 s)
                    self.epoch = p.decode_i64(c.call(Opcode.PING, p.encode_ping(self.client_id), self.timeout)[0],
                                              "PING reply")
                    self._heard = time.monotonic()
                reply, _ = c.call(opcode, body, self.timeout)
                return decode(reply), c.master_run
            except (ConnectionError, BrokenPipeError) as e:
                if attempt == 0 and not fresh:
                    # the master closed an idle connection (a restart): so it did the others; try a new one
                    pool.drop_idle()
                    continue
                raise MasterUnreachable(f"master at {self.address}: {opcode.name} failed: {e}") from e
            except TimeoutError as e:
                raise MasterTimeout(f"master at {self.address}: {opcode.name} timed out after {self.timeout:.1f}s") \
                    from e
            except OSError as e:
                raise MasterUnreachable(f"master at {self.address}: {opcode.name} failed: {e}") from e
            finally:
                pool.release(c)
        raise AssertionError("unreachable")

    def ping(self) -> int:
        """Checks the master is there; the pool's epoch."""
        self.epoch = self.call(Opcode.PING, p.encode_ping(self.client_id), lambda b: p.decode_i64(b, "PING reply"))
        return self.epoch

    def connections(self) -> ConnectionPool:
        """The pool of connections to the master talked to now."""
        return self._pool

    def close(self) -> None:
        self._closed = True
        if self._leaders is not None:
            self._leaders.close()
        self._pool.close()
