"""Single-copy puts under write leases (docs/protocol.md 6.1; the Java ``ObjectWrites.putLeased`` and
``NodeWrites.writeLeased``).

Each object takes the next region and generation of a lease this process keeps (``kvpool.write_leases``; a
new one when none has room), its bytes go to the node at once, and one COMMIT per lease and call makes what
landed visible. No master exchange comes before the bytes move, and none at all but the COMMIT while a kept
lease has room: a single small put over TCP is one exchange with the node, which sends the COMMIT (version 17),
where the two-phase put takes four.

* **Over TCP** the values go under the lease's epoch, term and grant in one NODE_WRITE_COMMIT when they fit one
  lane and one frame, and the node commits what landed at its master for this client: one exchange (version 17).
  A larger call goes in NODE_WRITE frames in parallel lanes (``two_phase.write_segment``, shared with the
  two-phase put), then the COMMIT.
* **On the node's machine** the lease's unwritten range is set aside on the node once (NODE_SHM_LEASE, on a
  connection the lease keeps), each value is checksummed and copied into the mapped segment at its region's
  value offset, by a few threads at once for a large call (``kvpool.lanes``; the lease's windows of the
  segment are prefaulted while the node admits the range), and each object's header is stamped in place, COMPLETE
  last. The node hears nothing per put: it settles stamped objects from their headers when anything asks about
  that space (version 16). So a put there is the copy and the COMMIT, one exchange.
* **Outcomes.** An object whose node write failed is left out of the COMMIT (FENCED if the node said so,
  FAILED otherwise). Objects whose COMMIT finds the lease gone (EXPIRED: the master restarted, or the
  segment left), and those of a lease none of whose writes landed (unless fenced), are written once more
  under a fresh lease of the same epoch; under a lease of another epoch they are FENCED, so a put is never
  carried across a removeAll(force). A node that answers DEPOSED (the lease came from a master that lost its
  leadership) makes the client forget every kept lease.
* **When.** Only single-copy puts without a pin, and only while this process holds a read lease
  (``kvpool.read_lease``), which is how a removeAll reaches it before it returns; otherwise the client puts
  two-phase. ``Leasing`` holds the read lease, the write leases and the remembered locations of one process
  (``kvpool.locations``, which reads use under the same read lease): a forked child makes its own
  (``Leases.here``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from . import lanes, read_lease
from . import locations as _locations
from . import protocol as p
from ._net import Connection, connect, pid
from .buffers import Filler
from .crc import crc32c
from .errors import KvPoolError
from .locations import Locations
from .protocol import Opcode, ResultCode
from .read_lease import ReadLease
from .results import MISS, PutStatus
from .shm import Mapping
from .two_phase import write_segment
from .write_leases import Lease, WriteLeasePool

if TYPE_CHECKING:
    from .channels import Channels

log = logging.getLogger("kvpool")

#: (index of the object in the call, region offset, generation)
Slot = tuple[int, int, int]

_COMMIT_STATUS = {ResultCode.OK: PutStatus.OK, ResultCode.ALREADY_EXISTS: PutStatus.ALREADY_EXISTS,
                  ResultCode.FENCED: PutStatus.FENCED, ResultCode.QUOTA_EXCEEDED: PutStatus.QUOTA_EXCEEDED}


class Leasing:
    """The read lease, the write leases and the remembered locations of one process, and the put path that uses
    the write leases."""

    def __init__(self, ch: Channels) -> None:
        self.pid = os.getpid()
        self._ch = ch
        self.leases: WriteLeasePool = WriteLeasePool(ch, heard=self._heard)
        self.locations: Locations = Locations(ch.location_cache)
        self._last_read = 0.0
        self._reported = time.monotonic()
        self.read: ReadLease = ReadLease(ch, on_drop_all=self._drop_all, idle=self._idle, sweep=self._sweep,
                                         on_record=self.locations.apply)

    def _heard(self) -> bool:
        return self.read.valid()

    def ready(self) -> bool:
        """True if puts may go under write leases now: the read lease runs (taken or renewed first if not)."""
        return self.read.ensure()

    def reading(self) -> Locations | None:
        """The remembered locations, if a read may use them now: the read lease runs (taken or renewed first if
        not); else None (the read asks the master)."""
        if not self.locations.capacity:
            return None
        self._last_read = time.monotonic()
        return self.locations if self.read.ensure() else None

    def settle(self, kb: list[bytes], cached: list[int], lengths: list[int], snapshot: int) -> list[int]:
        """After copying items ``cached`` from remembered locations: each copy stands only if the lease still runs
        and no invalidation since ``snapshot`` covers its key (``Locations.confirm``); the others, and those whose
        location missed, become misses and are returned, to be asked of the master once more."""
        valid = self.read.valid()  # after the copies
        retry = []
        for i in cached:
            if lengths[i] != MISS and not (valid and self.locations.confirm(kb[i], snapshot)):
                lengths[i] = MISS
            if lengths[i] == MISS:
                retry.append(i)
            else:
                self.locations.touched(kb[i])
        if retry:
            self.locations.invalidate([kb[i] for i in retry])
        return retry

    def _drop_all(self) -> None:
        self.locations.drop_all()
        self.leases.doom()

    def _idle(self) -> bool:
        return self.leases.idle() and time.monotonic() - self._last_read > read_lease.IDLE_STOP

    def _sweep(self) -> None:
        """After a renewal (the read lease's thread): releases stale write leases; every ``REPORT_INTERVAL``
        reports the reads served from remembered locations (the master's LRU sees them) and refreshes or drops
        their entries with its answer."""
        self.leases.sweep()
        if time.monotonic() - self._reported < _locations.REPORT_INTERVAL:
            return
        self._reported = time.monotonic()
        keys = self.locations.drain_touched(p.MAX_KEYS_PER_FRAME)
        if not keys:
            return
        snapshot = self.locations.snapshot()
        where, run = self._ch.master.call_in_run(Opcode.BATCH_GET_REPLICA_LIST, p.encode_keys(keys),
                                                 p.decode_replica_lists)
        for k, w in zip(keys, where):
            if w.code == ResultCode.OK and w.replicas:
                self.locations.remember(k, w, snapshot, run)
            else:
                self.locations.invalidate([k])

    def close(self) -> None:
        self.read.close()  # first: tells the master, so no removal waits for this client
        self.leases.close()  # gives back the space leased and not used

    def abandon(self) -> None:
        """In a forked child: the parent's leases are the parent's."""
        self.read.abandon()
        self.leases.abandon()

    def put(self, kb: list[bytes], views: list[memoryview], lo: int, hi: int, preferred: str, upsert: bool,
            status: list[PutStatus]) -> None:
        """Puts objects [lo, hi) under write leases, setting their ``status``."""
        crcs: dict[int, int] = {}
        expired: list[int] = []
        tried: dict[int, int] = {}
        epoch = self._pass(kb, views, list(range(lo, hi)), preferred, upsert, status, crcs, expired, None, tried)
        if not expired:
            return
        # a COMMIT the master took before it went away (a failover, a restart, a lost reply) left the object
        # stored under the generation this client gave it: that put is done, not to be made again
        again = [i for i in expired if not self._stored_at(kb, [i], tried, status)]
        if not again:
            return
        first = dict(tried)
        self._pass(kb, views, again, preferred, upsert, status, crcs, [], epoch, tried)
        # the first attempt's object showed up meanwhile (a node listed it again): it is this client's own
        self._stored_at(kb, [i for i in again if status[i] == PutStatus.ALREADY_EXISTS], first, status)

    def _stored_at(self, kb: list[bytes], items: list[int], generations: dict[int, int],
                   status: list[PutStatus]) -> bool:
        """Sets ``status[i]`` OK for each of ``items`` whose key holds the generation this client gave it
        (``generations[i]``; generations are unique, no other put has it), asking the master; True if all of
        them do. Used only after an EXPIRED COMMIT, so a retried put answers OK for its own object instead of
        ALREADY_EXISTS (issue 32). A lookup that fails answers False."""
        asked = [i for i in items if generations.get(i)]
        if not asked:
            return not items
        try:
            where = self._ch.master.call(Opcode.BATCH_GET_REPLICA_LIST, p.encode_keys([kb[i] for i in asked]),
                                         p.decode_replica_lists)
        except KvPoolError as e:
            log.debug("kvpool: cannot tell whether %d keys hold the generations this client gave them: %s",
                      len(asked), e)
            return False
        held = 0
        for i, w in zip(asked, where):
            if w.code == ResultCode.OK and w.generation == generations[i]:
                status[i] = PutStatus.OK
                held += 1
        return held == len(items)

    def _pass(self, kb: list[bytes], views: list[memoryview], items: list[int], preferred: str, upsert: bool,
              status: list[PutStatus], crcs: dict[int, int], expired: list[int], only_epoch: int | None,
              tried: dict[int, int]) -> int | None:
        """One pass over ``items``; adds to ``expired`` those to write once more, and to ``tried`` the generation
        each item was written under. With ``only_epoch``, items that would go under a lease of another epoch are
        FENCED instead. Returns the epoch of the last lease used."""
        region = [p.region_length(len(kb[i]), views[i].nbytes) for i in items]
        remaining = sum(region)
        epoch = only_epoch
        j = 0
        while j < len(items):
            lease = self.leases.take(preferred, region[j], remaining, len(items) - j)
            if not isinstance(lease, Lease):
                refused = PutStatus.NO_SEGMENT if lease == ResultCode.NO_SEGMENT else PutStatus.POOL_FULL
                for i in items[j:]:
                    status[i] = refused
                return epoch
            slots: list[Slot] = []
            while j < len(items) and lease.fits(region[j]):
                slots.append((items[j], lease.next, lease.next_generation))
                lease.next += region[j]
                lease.next_generation += 1
                remaining -= region[j]
                j += 1
            if only_epoch is not None and lease.epoch != only_epoch:
                for i, _, _ in slots:
                    status[i] = PutStatus.FENCED
                lease.close_node()  # their regions stay unwritten: a gap the node's walk over stamps stops at
                self.leases.give_back(lease)
                continue
            epoch = lease.epoch
            for i, _, gen in slots:
                tried[i] = gen
            try:
                self._write_and_commit(lease, slots, kb, views, upsert, status, crcs, expired)
            except BaseException:
                lease.close_node()  # not used again: let its range go on the node
                raise
        return epoch

    def _write_and_commit(self, lease: Lease, slots: list[Slot], kb: list[bytes], views: list[memoryview],
                          upsert: bool, status: list[PutStatus], crcs: dict[int, int], expired: list[int]) -> None:
        """Writes one lease's slots to its segment and commits what landed; gives the lease back or drops it."""
        written, committed = self._write(lease, slots, kb, views, crcs, upsert)
        items: list[tuple[bytes, int, int, int]] = []
        item_of: list[int] = []
        for (i, off, gen), code in zip(slots, written):
            if code == ResultCode.OK:
                items.append((kb[i], off, views[i].nbytes, gen))
                item_of.append(i)
            else:
                status[i] = PutStatus.FENCED if code == ResultCode.FENCED else PutStatus.FAILED
        deposed = ResultCode.DEPOSED in written
        if deposed:
            self.leases.forget_all()  # every lease kept came from the master that lost its leadership
        if not items:
            # nothing landed: unless the node fenced the writes (a reset came after the lease), its segment may be
            # gone or its master deposed, and a fresh lease may do
            if deposed:
                lease.close_node()
            else:
                self.leases.release(lease)
            expired += [i for (i, _, _), code in zip(slots, written) if code != ResultCode.FENCED]
            return
        # over TCP the node committed what landed for this client (NODE_WRITE_COMMIT), unless it said it did not
        codes = committed if committed is not None else self._ch.master.call(
            Opcode.COMMIT, p.encode_commit(lease.id, upsert, items), lambda b: p.decode_codes(b, "COMMIT reply"))
        if len(codes) != len(items):
            raise p.ProtocolError(f"COMMIT reply has {len(codes)} results for {len(items)} items")
        lost = False
        for i, code in zip(item_of, codes):
            lost |= code in (ResultCode.EXPIRED, ResultCode.FENCED)
            if code == ResultCode.EXPIRED:
                expired.append(i)
            status[i] = _COMMIT_STATUS.get(code, PutStatus.FAILED)
        self._ch.count("objects_leased", sum(code == ResultCode.OK for code in codes))
        if lost:
            lease.close_node()  # gone at the master: its range on the node goes too
        else:
            self.leases.give_back(lease)

    def _write(self, lease: Lease, slots: list[Slot], kb: list[bytes], views: list[memoryview],
               crcs: dict[int, int], upsert: bool) -> tuple[list[ResultCode], list[ResultCode] | None]:
        """Moves one lease's slots to its node: a code per slot, and the master's COMMIT codes of the slots that
        landed when the node committed them for this client (NODE_WRITE_COMMIT), else None. Never raises for node
        failures.

        Over TCP, slots that go in one lane and one frame go in one NODE_WRITE_COMMIT (version 17): the put is one
        exchange. More go in NODE_WRITE frames in parallel lanes, and the caller sends the COMMIT."""
        ch = self._ch
        seg = ch.segments.segment(lease.segment_id, lease.run)  # None once the master run changed
        if seg is None:
            return [ResultCode.FAILED] * len(slots), None
        mapping = ch.segments.shm.mapping(seg)
        if mapping is not None and mapping.writable:
            return self._write_shared(lease, seg, mapping, slots, kb, views, crcs), None
        codes = [ResultCode.FAILED] * len(slots)

        def items_of(lo: int, hi: int) -> list[p.WriteItem]:
            """Slots [lo, hi) as NODE_WRITE items, each value checksummed. A device block (a Filler) is copied to
            host memory first, in the lane that sends it, so one lane's device copies overlap another's sending."""
            part = slots[lo:hi]
            for i, _, _ in part:
                v: Any = views[i]
                if isinstance(v, Filler):
                    views[i] = v.materialize()
                if i not in crcs:
                    crcs[i] = crc32c(views[i])
            return [p.WriteItem(off, gen, kb[i], views[i].nbytes, crcs[i], lease.grant) for i, off, gen in part]

        sizes = [views[i].nbytes for i, _, _ in slots]
        runs = lanes.parts(sizes, ch.copy_lanes)
        if len(runs) == 1 and len(slots) <= p.MAX_ITEMS_PER_NODE_FRAME and sum(sizes) <= p.DEFAULT_MAX_PAYLOAD_BYTES:
            items = items_of(0, len(slots))  # first: it turns device blocks into the host views sent below
            return self._write_commit(lease, seg, items, [views[i] for i, _, _ in slots], upsert)

        def run(lo: int, hi: int) -> None:
            """A lane's share, checksummed and sent on a pooled connection of its own (as the Java client's lanes),
            so one share's checksums and sending overlap another's."""
            items = items_of(lo, hi)
            codes[lo:hi] = write_segment(ch, lease.segment_id, lease.run, lease.epoch, lease.term,
                                         [(k, 0, it) for k, it in enumerate(items)], [views[i] for i, _, _ in slots[lo:hi]])

        lanes.run_parts(runs, run)
        return codes, None

    def _write_commit(self, lease: Lease, seg: p.SegmentStats, items: list[p.WriteItem], values: list[memoryview],
                      upsert: bool) -> tuple[list[ResultCode], list[ResultCode] | None]:
        """One NODE_WRITE_COMMIT (version 17, section 4.41): the values, after which the node commits what landed at
        its master for this client. Returns the write codes, and the COMMIT codes of the items that landed when the
        node committed them (None when it left the COMMIT to this client). A failed exchange fails every item, as a
        failed NODE_WRITE does: the caller writes them again under a fresh lease, and asks first whether the node's
        COMMIT went through (``_stored_at``)."""
        ch = self._ch
        failed = [ResultCode.FAILED] * len(items)
        pool = ch.segments.node_pool(seg)
        try:
            c = pool.borrow(ch.timeout)
        except KvPoolError as e:
            log.debug("kvpool: write and commit to %s failed: %s", seg.name, e)
            return failed, None
        try:
            body = p.encode_node_write_commit(lease.id, upsert, lease.segment_id, lease.epoch, lease.term, items)
            reply, _ = c.call(Opcode.NODE_WRITE_COMMIT, body, ch.timeout, values)
            committed, written, commit = p.decode_node_write_commit_reply(reply)
            if len(written) != len(items):
                raise p.ProtocolError(f"NODE_WRITE_COMMIT reply has {len(written)} results for {len(items)} items")
            ch.count("bytes_written_tcp", sum(v.nbytes for v in values))
        except (OSError, KvPoolError, ValueError) as e:
            c.close()
            log.debug("kvpool: write and commit to %s failed: %s", seg.name, e)
            return failed, None
        finally:
            pool.release(c)
        if not committed:
            return written, None
        return written, [code for w, code in zip(written, commit) if w == ResultCode.OK]

    def _write_shared(self, lease: Lease, seg: p.SegmentStats, mapping: Mapping, slots: list[Slot],
                      kb: list[bytes], views: list[memoryview], crcs: dict[int, int]) -> list[ResultCode]:
        """The same-machine path: the range set aside once, the values copied and checksummed in lanes
        (``kvpool.lanes``), and each object's header stamped in place, COMPLETE last (``p.stamp``): no node
        exchange per call, the node settles stamped objects from their headers (version 16, section 4.28). A
        lease connection the node closed (checked before the COMMIT), or any failure of it, fails the slots and
        ends the range. A node with ``--verify-writes`` says so when it sets the range aside: the objects are then
        recorded with NODE_SHM_LEASE_WRITE, one per 4,096, as before version 16."""
        ch = self._ch
        codes = [ResultCode.FAILED] * len(slots)
        values = [views[i] for i, _, _ in slots]
        try:
            i, last, _ = slots[-1]
            lanes.prefault_ahead(mapping, slots[0][1], last + p.region_length(len(kb[i]), views[i].nbytes))
            c = lease.node
            if c is None:
                c = lease.node = self._connect(seg)
                start = slots[0][1]
                reply, _ = c.call(Opcode.NODE_SHM_LEASE, p.encode_shm_lease(lease.epoch, lease.term, start,
                                                                            lease.end - start, lease.grant),
                                  ch.timeout)
                code, lease.stamps = p.decode_shm_lease_reply(reply)
                if code != ResultCode.OK:
                    lease.close_node()
                    return [code] * len(slots)
            got: list[int | None] = [crcs.get(i) for i, _, _ in slots]
            lanes.copy_in(mapping, [off + p.value_offset(len(kb[i])) for i, off, _ in slots], values, got,
                          ch.copy_lanes)
            view = mapping.view
            items = []
            for (i, off, gen), crc in zip(slots, got):
                assert crc is not None
                crcs[i] = crc
                if lease.stamps:
                    p.stamp(view, off, p.object_header(kb[i], views[i].nbytes, gen, lease.epoch, crc))
                else:
                    items.append(p.WriteItem(off, gen, kb[i], views[i].nbytes, crc, lease.grant))
            if not lease.stamps:
                # a node that verifies writes checks each value before it becomes readable: recorded, not stamped
                for start in range(0, len(items), p.MAX_ITEMS_PER_NODE_FRAME):
                    part = items[start:start + p.MAX_ITEMS_PER_NODE_FRAME]
                    reply, _ = c.call(Opcode.NODE_SHM_LEASE_WRITE, p.encode_node_write(lease.epoch, lease.term, part),
                                      ch.timeout)
                    got_codes = p.decode_codes(reply, "NODE_SHM_LEASE_WRITE reply")
                    if len(got_codes) != len(part):
                        raise p.ProtocolError(f"NODE_SHM_LEASE_WRITE reply has {len(got_codes)} results for "
                                              f"{len(part)} items")
                    codes[start:start + len(part)] = got_codes
            # a node that let the range go (it restarted, or ended the range) closed this connection first
            elif c.peer_closed():
                log.debug("kvpool: the node of segment %s let lease %d's range go before its commit", seg.name,
                          lease.id)
                lease.close_node()
            else:
                codes = [ResultCode.OK] * len(slots)
        except (OSError, KvPoolError, ValueError) as e:
            log.debug("kvpool: same-machine lease write to %s failed: %s", seg.name, e)
            lease.close_node()
        ch.count("bytes_written_shm", sum(v.nbytes for v, code in zip(values, codes) if code == ResultCode.OK))
        return codes

    def _connect(self, seg: p.SegmentStats) -> Connection:
        """A connection of the lease's own to its node (a node holds one range per connection)."""
        ch = self._ch
        return connect(seg.host, seg.port, ch.connect_timeout, ch.secrets, ch.tls)


class Leases:
    """The ``Leasing`` of the process this client is used in, made at its first use: a forked child forgets its
    parent's (without touching them) and makes its own. A HELLO that meets a new master run drops what the
    locations remembered of the old one."""

    def __init__(self, ch: Channels) -> None:
        self._ch = ch
        self._leasing: Leasing | None = None
        self._lock = threading.Lock()
        ch.master.after_new_run(self._new_run)

    def here(self) -> Leasing:
        """This process's leasing, made now if it has none."""
        leasing = self._leasing
        if leasing is None or leasing.pid != pid():
            with self._lock:
                leasing = self._leasing
                if leasing is None or leasing.pid != pid():
                    if leasing is not None:
                        leasing.abandon()
                    leasing = self._leasing = Leasing(self._ch)
        return leasing

    def current(self) -> Leasing | None:
        """This process's leasing if it made one, else None (nothing is made)."""
        leasing = self._leasing
        return leasing if leasing is not None and leasing.pid == pid() else None

    def _new_run(self) -> None:
        leasing = self.current()
        if leasing is not None:
            leasing.locations.drop_all()

    def close(self) -> None:
        """Ends this process's read lease and gives back its unused write leases (while the master is there)."""
        leasing = self.current()
        if leasing is not None:
            leasing.close()
