"""The read lease the Python client holds while it puts under write leases or reads from remembered locations
(docs/architecture.md, "Read leases"; docs/protocol.md, sections 4.25 and 6.6). The Java client's
``LeaseKeeper`` does the same.

Why a writer needs it
---------------------
A ``remove_all(force=True)`` moves the cluster epoch, and every write under a write lease granted before it
is refused (FENCED). A client that kept such a lease for its next put would see that put fenced, and lost,
even though the put began after the removal returned. The read lease is how the removal reaches the client
before it returns: the master answers a removal only once every session holding a read lease acknowledged
its invalidation, or that session's lease ran out by the master's count. This client applies every
invalidation of everything (an ALL record, which every removeAll publishes; a RESYNC; a new master
incarnation; a gap in the sequence) by calling ``on_drop_all`` before it acknowledges, and the write leases
it keeps are then never used again (``WriteLeasePool.doom``). So for a put that begins after a removal
returned, either this client applied the removal (its kept leases are doomed), or its read lease has run
out: ``valid()`` is false, no kept lease is reused and puts go two-phase until a renewal, which carries the
removal with it, makes the lease valid again.

Readers need it too: the locations this client remembers (``kvpool.locations``) are used only while the lease
runs, and every record (keys, a prefix) is applied to them (``on_record``) before it is acknowledged, exactly as
the Java ``LocationCache`` applies it.

Mechanics
---------
A LEASE request parked at the master on a connection of its own (a long poll, held at most a quarter of the
lease), sent again at once after each answer. An answer is applied before the lease it grants is counted,
from the moment the request was *sent*. ``ensure()`` renews on an ordinary master connection when the lease
is not running, at most once per ``RETRY_AFTER`` while renewals fail. A lease is valid only while the
client's master connections still meet the incarnation that granted it, so a restarted master's clients
take nothing on trust from the one before.

Held only while used: the first put that wants a write lease, or the first read that may use remembered
locations, starts the poller, and it stops (saying END, so no removal waits for this client; everything
remembered is dropped) once ``idle`` says so: no write lease kept, and none taken nor any read made for
``IDLE_STOP`` seconds. An idle process so holds up no removal and keeps no thread. Each start draws a new
session id, so the END of a stopped poller never ends a later session.

Fork: the lease belongs to the process that took it (``pid``). A forked child never renews, acknowledges or
trusts its parent's lease (``abandon``): it starts its own, under its own session id.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from typing import TYPE_CHECKING, Callable

from . import protocol as p
from ._net import Connection, connect
from .codec import signed64
from .errors import KvPoolError
from .protocol import Opcode

if TYPE_CHECKING:
    from .channels import Channels

log = logging.getLogger("kvpool")

#: Shortest pause between failed renewals.
RETRY_AFTER = 0.2
#: Seconds without a write lease taken or kept, or a read, after which the read lease is given up.
IDLE_STOP = 15.0


def new_session() -> tuple[int, int]:
    """A fresh session id, as the two signed i64 the wire carries."""
    u = uuid.uuid4().int
    return signed64(u >> 64), signed64(u & ((1 << 64) - 1))


class ReadLease:
    """This process's read lease. ``on_drop_all`` runs (under this lease's lock, before the acknowledgement is
    sent) whenever an invalidation of everything is applied (an ALL record, a resync, a gap) or the lease is
    given up, and ``on_record`` for each record of keys or a prefix, in order; ``idle`` says when nothing needs
    the lease any more; ``sweep`` runs after each renewal (releases stale write leases, reports reads). None of
    them may block on this lease."""

    def __init__(self, ch: Channels, on_drop_all: Callable[[], None], idle: Callable[[], bool],
                 sweep: Callable[[], None], on_record: Callable[[p.Invalidation], None] = lambda rec: None) -> None:
        self.pid = os.getpid()
        self._ch = ch
        self._on_drop_all = on_drop_all
        self._on_record = on_record
        self._idle = idle
        self._sweep = sweep
        self._lock = threading.Lock()  # the position applied and the lease's end
        self._renew_lock = threading.Lock()  # synchronous renewals; starting and stopping the poller
        self._incarnation = 0
        self._seq = 0
        self._leased = False
        self._until = 0.0
        self._session = new_session()
        self._hold_millis = 0
        self._poller: threading.Thread | None = None
        self._poll: Connection | None = None
        self._poll_master: object = None  # the client's master pool the poll connection was opened to
        self._last_failure = -RETRY_AFTER
        self._failing = False
        self._closed = False
        self._wake = threading.Event()
        #: Renewals answered, for tests and counters.
        self.renewals = 0

    def valid(self) -> bool:
        """True while the lease runs, as granted by the master incarnation the client talks to now."""
        return self._leased and time.monotonic() < self._until and self._incarnation == self._ch.master.incarnation

    def ensure(self) -> bool:
        """True if the lease runs now, taking or renewing it first if it does not (unless a renewal failed in
        the last ``RETRY_AFTER``), and the poller that keeps it running."""
        if self._poller is not None and self.valid():
            return True
        with self._renew_lock:
            if self._closed:
                return False
            if not self.valid():
                if time.monotonic() - self._last_failure < RETRY_AFTER:
                    return False
                try:
                    self._renew(0, self._call_master)
                except (KvPoolError, OSError, ValueError) as e:
                    self._last_failure = time.monotonic()
                    log.debug("kvpool: read lease renewal failed: %s", e)
                    return False
            if self._poller is None:
                self._wake.clear()
                self._poller = threading.Thread(target=self._loop, name="kvpool-read-lease", daemon=True)
                self._poller.start()
            return self.valid()

    def _renew(self, hold_millis: int, call: Callable[[bytes, int], p.LeaseReply]) -> None:
        with self._lock:
            body = p.encode_lease(self._session, self._incarnation, self._seq, hold_millis)
        sent = time.monotonic()
        reply = call(body, hold_millis)
        self._apply(reply, sent)
        self._hold_millis = max(1, reply.lease_millis // 4)

    def _apply(self, reply: p.LeaseReply, sent: float) -> None:
        """Applies an answer: its invalidations (or the resync) first, then the lease it grants, from ``sent``."""
        with self._lock:
            if reply.resync or reply.incarnation != self._incarnation:
                self._incarnation, self._seq = reply.incarnation, reply.seq
                self._on_drop_all()
            else:
                for rec in reply.records:
                    if rec.seq <= self._seq:
                        continue  # a second answer for the same position (a renewal raced the long poll)
                    if rec.seq != self._seq + 1 or rec.kind == p.INVALIDATE_ALL:
                        self._on_drop_all()  # everything, or a gap: anything may have been missed
                    else:
                        self._on_record(rec)
                    self._seq = rec.seq
                self._seq = max(self._seq, reply.seq)
            if reply.lease_millis > 0:
                until = sent + reply.lease_millis / 1000
                if not self._leased or until > self._until:
                    self._until = until
                self._leased = True
            self.renewals += 1

    def _call_master(self, body: bytes, hold_millis: int) -> p.LeaseReply:
        """A renewal the master answers at once, on one of the client's master connections."""
        return self._ch.master.call(Opcode.LEASE, body, p.decode_lease_reply)

    def _call_poll(self, body: bytes, hold_millis: int) -> p.LeaseReply:
        """A renewal on the poller's own connection, which the master may hold for ``hold_millis``."""
        ch = self._ch
        master = ch.master.connections()
        c = self._poll
        if c is None or c.broken or self._poll_master is not master:
            self._close_poll()
            c = connect(master.host, master.port, ch.connect_timeout, ch.secrets, ch.tls)
            self._poll, self._poll_master = c, master
        reply, _ = c.call(Opcode.LEASE, body, hold_millis / 1000 + ch.timeout)
        return p.decode_lease_reply(reply)

    def _loop(self) -> None:
        while True:
            with self._renew_lock:
                if self._closed or self._poller is not threading.current_thread():
                    return
                if self._idle():
                    ended = self._stop_locked()
                    break
            try:
                self._renew(self._hold_millis, self._call_poll)
                if self._failing:
                    log.info("kvpool: read lease: master %s answers again", self._ch.master.address)
                    self._failing = False
            except (KvPoolError, OSError, ValueError) as e:
                self._close_poll()
                if self._closed:
                    return
                if not self._failing:
                    log.warning("kvpool: read lease: cannot renew with master %s (%s); puts are two-phase until "
                                "it answers", self._ch.master.address, e)
                    self._failing = True
                self._wake.wait(RETRY_AFTER)
            try:
                self._sweep()
            except Exception as e:  # noqa: BLE001 - the poller must outlive a failed release
                log.debug("kvpool: releasing idle write leases or reporting cached reads failed: %s", e)
        self._end(*ended)

    def _stop_locked(self) -> tuple[tuple[int, int], int, int]:
        """Gives the lease up (renew lock held): nothing kept under it is used again. Returns the session ended,
        with the position it applied, for the END the caller sends once the lock is let go."""
        with self._lock:
            self._leased = False
            self._on_drop_all()
            ended = (self._session, self._incarnation, self._seq)
            self._session = new_session()
        self._poller = None
        self._close_poll()
        return ended

    def _end(self, session: tuple[int, int], incarnation: int, seq: int) -> None:
        """Tells the master a session is over (best effort: it forgets one whose lease ran out by itself)."""
        try:
            self._ch.master.call(Opcode.LEASE, p.encode_lease(session, incarnation, seq, 0, end=True),
                                 lambda b: None)
        except (KvPoolError, OSError, ValueError) as e:
            log.debug("kvpool: could not tell the master this client's read lease ended: %s", e)

    def _close_poll(self) -> None:
        c, self._poll = self._poll, None
        if c is not None:
            c.close()

    def close(self) -> None:
        """Gives the lease up for good and tells the master, so that no removal waits for this client."""
        with self._renew_lock:
            if self._closed:
                return
            self._closed = True
            running = self._poller is not None
            self._poller = None
            with self._lock:
                self._leased = False
                ended = (self._session, self._incarnation, self._seq)
        self._wake.set()
        self._close_poll()  # wakes a poller parked at the master
        if running:
            self._end(*ended)

    def abandon(self) -> None:
        """In a forked child: forgets the parent's lease without a word to the master (it is the parent's)."""
        self._closed = True
        self._leased = False
        self._poller = None
        c, self._poll = self._poll, None
        if c is not None:
            c.close()  # our copy of the parent's socket only (``Connection.close`` shuts down only its own)
