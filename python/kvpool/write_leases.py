"""The write leases a Python client keeps between puts (docs/architecture.md, "Write leases"; docs/protocol.md,
section 4.27). The Java client's ``WriteLeasePool`` does the same.

A put takes a lease with room for its first object (one put at a time per lease: offsets and generations
must rise through a lease's commits), places objects in it with a bump pointer, and gives it back after its
COMMIT. How much a new lease asks for follows how fast this client uses its leases up (``LeaseSize``). A lease is
kept, per preferred segment (so a put that prefers this host's segment never lands in a
lease on another), while it has at least ``KEEP_MIN_BYTES`` and a generation left; it is released when nearly
full, idle for half the master's idle timeout (``sweep``, run by the read lease's poller), or granted before
the last invalidation of everything this client applied (``doom``).

Rules that keep a kept lease from writing to the wrong place or at the wrong time:

* **Epochs.** A removeAll(force) fences every lease granted before it. The removal reaches this client through
  its read lease before the removal returns, and ``doom`` then moves the pool's era: no lease of an earlier
  era is used again. A kept lease is also reused only while the read lease runs (``heard``): a client that may
  have missed a removal takes a fresh lease, granted in the current epoch.
* **Master runs.** A lease names a segment by id, and ids are per master run (``kvpool.master_channel``): a lease is
  used only in the run of the connection that granted it, and one of an earlier run is dropped without a
  RELEASE (the new master does not know it).
* **Nodes.** On the same-machine path a lease keeps a connection to its node that holds its unwritten range
  set aside (NODE_SHM_LEASE). Closing it ends that, and it is closed before the lease is released, when the
  lease is doomed, and when the lease turns out lost.
* **Fork.** The pool belongs to the process that made it; a forked child gets a pool of its own and never
  writes into, commits or releases a parent's lease (``abandon``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Callable

from . import protocol as p
from ._net import Connection
from .errors import KvPoolError
from .protocol import Opcode, ResultCode
from .read_lease import IDLE_STOP

if TYPE_CHECKING:
    from .channels import Channels

log = logging.getLogger("kvpool")

#: Bytes a lease is asked for at factor 1 when the batch needs less: later puts fill the rest.
WANTED_BYTES = 32 << 20
#: Generations asked for with a lease at factor 1 when the batch needs fewer.
WANTED_GENERATIONS = 1024
#: The largest factor of the ask (``LeaseSize``): 256 MiB and 8,192 generations.
MAX_FACTOR = 8
#: A lease used up within this many seconds of its grant doubles the next ask.
FAST_SECONDS = 1.0
#: A lease that took longer than this many seconds to use up halves the next ask.
SLOW_SECONDS = 10.0
#: A lease with less room than this left after its commit is released rather than kept.
KEEP_MIN_BYTES = 64 << 10


class LeaseSize:
    """How much the next lease asks for, as the Java client's ``LeaseSize``: taking a lease costs a WRITE_LEASE,
    on the node's machine a connection and a NODE_SHM_LEASE, and later a RELEASE, so a writer that uses its leases
    up quickly asks for more. A lease used up within ``FAST_SECONDS`` of its grant doubles the factor (up to
    ``MAX_FACTOR``), one that took over ``SLOW_SECONDS`` halves it, and one let go idle sets it back to 1. The master
    still grants room beyond the first batch only from free space, within its caps, so a larger ask evicts
    nothing. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._factor = 1

    @property
    def factor(self) -> int:
        return self._factor

    def bytes(self, needed: int) -> int:
        """Bytes to ask for when the batch needs ``needed``."""
        return max(WANTED_BYTES * self._factor, needed)

    def generations(self, needed: int) -> int:
        """Generations to ask for when the batch needs ``needed``."""
        return max(WANTED_GENERATIONS * self._factor, needed)

    def used_up(self, lifetime: float) -> None:
        """A lease was used up ``lifetime`` seconds after its grant."""
        with self._lock:
            if lifetime < FAST_SECONDS:
                self._factor = min(MAX_FACTOR, self._factor * 2)
            elif lifetime > SLOW_SECONDS:
                self._factor = max(1, self._factor // 2)

    def idled(self) -> None:
        """A lease was let go because it sat idle: the writer is not streaming now."""
        with self._lock:
            self._factor = 1


class Lease:
    """One lease: the master's grant, and how far this client has filled it. Owned by one put at a time."""

    __slots__ = ("id", "epoch", "term", "segment_id", "end", "last_generation", "idle", "preference", "era",
                 "run", "grant", "next", "next_generation", "last_used", "granted", "node", "stamps")

    def __init__(self, g: p.WriteLease, preference: str, era: int, run: int, now: float) -> None:
        self.id = g.lease_id
        self.epoch = g.epoch
        self.term = g.term
        self.segment_id = g.segment_id
        self.end = g.offset + g.length
        self.last_generation = g.first_generation + g.generation_count - 1
        self.idle = g.idle_millis / 1000
        self.preference = preference
        #: The pool's era when granted: a lease of an earlier era is never used again.
        self.era = era
        #: The master run that granted it: its segment id means nothing in another run.
        self.run = run
        #: Relayed with every write into it.
        self.grant = g.grant()
        self.next = g.offset
        self.next_generation = g.first_generation
        self.last_used = now
        #: When it was granted: how fast it was used up sizes the next ask (``LeaseSize``).
        self.granted = now
        #: Same-machine path: the connection holding this lease's unwritten range on its node, once set aside.
        self.node: Connection | None = None
        #: whether that node lets the writer stamp its objects (version 16), from its NODE_SHM_LEASE reply
        self.stamps = True

    def fits(self, region: int) -> bool:
        """Whether one more object with a region of ``region`` bytes fits."""
        return self.next + region <= self.end and self.next_generation <= self.last_generation

    def stale(self, now: float) -> bool:
        return now - self.last_used > self.idle / 2

    def close_node(self) -> None:
        """Ends the lease's range on its node (same-machine path), if it holds one."""
        c, self.node = self.node, None
        if c is not None:
            c.close()


class WriteLeasePool:
    """The leases this process keeps between puts. ``heard()`` says whether the read lease runs now."""

    def __init__(self, ch: Channels, heard: Callable[[], bool]) -> None:
        self.pid = os.getpid()
        self._ch = ch
        self._heard = heard
        self._lock = threading.Lock()
        self._kept: dict[str, list[Lease]] = {}
        self._era = 0
        self._last_take = time.monotonic()
        self._closed = False
        #: How much the next grant asks for.
        self.size = LeaseSize()

    def take(self, preference: str, first_region: int, wanted_bytes: int, generations: int) -> Lease | ResultCode:
        """A lease with room for an object of ``first_region`` bytes: a kept one, or a new grant of at least that
        and about ``wanted_bytes``; else why the master refused one (POOL_FULL, NO_SEGMENT)."""
        now = time.monotonic()
        run = self._ch.master.run
        reuse = self._heard()
        stale: list[Lease] = []
        found = None
        with self._lock:
            self._last_take = now
            era = self._era
            q = self._kept.get(preference)
            while q:
                lease = q.pop()
                if reuse and lease.era == era and lease.run == run and not lease.stale(now) and lease.fits(first_region):
                    found = lease
                    break
                if lease.stale(now):
                    self.size.idled()
                elif lease.era == era and lease.run == run and not lease.fits(first_region):
                    self.size.used_up(now - lease.granted)  # too little room left for this writer's objects
                stale.append(lease)
        for lease in stale:
            self.release(lease)
        if found is not None:
            return found
        # the grant names a segment of the master run that answered; the era is the one before asking, so a
        # removal applied while the request is out dooms what it grants
        g, granted_in = self._ch.master.call_in_run(
            Opcode.WRITE_LEASE, p.encode_write_lease(preference, first_region, self.size.bytes(wanted_bytes),
                                                     self.size.generations(generations)), p.decode_write_lease)
        if g.code != ResultCode.OK:
            return g.code
        self._ch.count("write_leases", 1)
        return Lease(g, preference, era, granted_in, now)

    def give_back(self, lease: Lease) -> None:
        """After a commit: kept while it has room, generations and its era left, else released."""
        lease.last_used = time.monotonic()
        room = lease.end - lease.next >= KEEP_MIN_BYTES and lease.next_generation <= lease.last_generation
        if not room and lease.run == self._ch.master.run and lease.era == self._era:
            self.size.used_up(lease.last_used - lease.granted)
        if room and lease.run == self._ch.master.run:
            with self._lock:
                if not self._closed and lease.era == self._era:
                    self._kept.setdefault(lease.preference, []).append(lease)
                    return
        self.release(lease)

    def doom(self) -> None:
        """A removal may have moved the epoch: no lease granted so far is used again. Kept leases let go of their
        range on the node at once (the master may place others' writes there now); ``sweep`` or ``take``
        releases them at the master. Runs under the read lease's lock: no I/O but closing sockets."""
        with self._lock:
            self._era += 1
            kept = [lease for q in self._kept.values() for lease in q]
        for lease in kept:
            lease.close_node()

    def sweep(self) -> None:
        """Releases kept leases idle for half the master's idle timeout, doomed, or of an earlier master run."""
        now = time.monotonic()
        run = self._ch.master.run
        due: list[Lease] = []
        with self._lock:
            for q in self._kept.values():
                go = [lease for lease in q if lease.stale(now) or lease.era != self._era or lease.run != run]
                if any(lease.stale(now) for lease in go):
                    self.size.idled()
                if go:
                    due += go
                    q[:] = [lease for lease in q if lease not in go]
        for lease in due:
            self.release(lease)

    def idle(self) -> bool:
        """True once no lease is kept and none was taken for ``IDLE_STOP`` seconds: the read lease may go."""
        with self._lock:
            return not any(self._kept.values()) and time.monotonic() - self._last_take > IDLE_STOP

    def forget_all(self) -> None:
        """The leases came from a master that lost its leadership (DEPOSED): drops them without a word to it."""
        with self._lock:
            kept = [lease for q in self._kept.values() for lease in q]
            self._kept.clear()
        for lease in kept:
            lease.close_node()

    def release(self, lease: Lease) -> None:
        """Gives the lease back to the master (best effort: one it does not hear of idles out there)."""
        lease.close_node()  # first: the node lets the range go before the master can place anything there
        if lease.run != self._ch.master.run:
            return  # granted by an earlier master run, which the master now does not know
        try:
            self._ch.master.call(Opcode.RELEASE, p.encode_release(lease.id), lambda b: None)
        except (KvPoolError, OSError, ValueError) as e:
            log.debug("kvpool: release of write lease %d failed; the master reclaims it when it idles out: %s",
                      lease.id, e)

    def kept(self) -> list[Lease]:
        """The leases kept now (a snapshot, for tests)."""
        with self._lock:
            return [lease for q in self._kept.values() for lease in q]

    def close(self) -> None:
        """Releases every kept lease (the client is closing)."""
        with self._lock:
            self._closed = True
            kept = [lease for q in self._kept.values() for lease in q]
            self._kept.clear()
        for lease in kept:
            self.release(lease)

    def abandon(self) -> None:
        """In a forked child: forgets the parent's leases, closing only this process's copies of their sockets."""
        self._closed = True
        for q in self._kept.values():
            for lease in q:
                lease.close_node()
        self._kept = {}
