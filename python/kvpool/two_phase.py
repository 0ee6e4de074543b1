"""The two-phase put (docs/protocol.md 6.1): what multi-replica and pinned puts, and every put while the
client holds no read lease, go through; and the node writes of a reservation, which single-copy puts under a
write lease share over TCP (``kvpool.leased_puts``).

PUT_START reserves regions at the master (its answer is valid in the master run of the connection that
carried it, see ``kvpool.master_channel``), the values go straight to the nodes (NODE_WRITE over TCP, or a memory
copy into the node's shared segment between NODE_SHM_WRITE_BEGIN and END on this host, for frames of at least
``Client.shm_write_min_bytes``), and PUT_END makes them visible with a bit per replica whose write failed; an
item whose every replica write failed is revoked (PUT_REVOKE). The master never sees value bytes.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Callable

from . import protocol as p
from ._net import frame_end
from .codec import signed64
from .crc import crc32c
from .errors import KvPoolError
from .protocol import Opcode, ResultCode
from .results import PutStatus

if TYPE_CHECKING:
    from .channels import Channels

log = logging.getLogger("kvpool")


def write_chunk(ch: Channels, kb: list[bytes], views: list[memoryview], lo: int, hi: int, upsert: bool,
                replicas: int, pin_seconds: int, preferred: str, batch: bool, status: list[PutStatus],
                copies: list[int], pinned: list[bool]) -> None:
    """Puts items [lo, hi) two-phase, setting their ``status``, ``copies`` written and ``pinned``."""
    items = [(kb[i], views[i].nbytes) for i in range(lo, hi)]
    # the regions are valid in the master run that answered, and void once that changed (kvpool.master_channel)
    (epoch, term, results), master_run = ch.master.call_in_run(
        Opcode.BATCH_PUT_START if batch else Opcode.PUT_START,
        p.encode_put_start(upsert, replicas, preferred, items, pin_seconds), p.decode_put_start_reply)
    if len(results) != hi - lo:
        raise p.ProtocolError(f"PUT_START reply has {len(results)} results for {hi - lo} items")
    too_large = [lo + j for j, r in enumerate(results) if r.code == ResultCode.TOO_LARGE]
    if too_large:
        # the master's limit is below what its HELLO said: give back this chunk's reservations first
        revoke = [(kb[lo + j], r.generation, 0) for j, r in enumerate(results) if r.code == ResultCode.OK]
        if revoke:
            ch.master.call(Opcode.BATCH_PUT_REVOKE, p.encode_put_end(revoke),
                           lambda b: p.decode_codes(b, "PUT_REVOKE reply"))
        i = too_large[0]
        raise ValueError(f"value for key {p.abbreviate(kb[i])!r} of {views[i].nbytes} bytes exceeds the "
                         "master's max value size")
    by_segment: dict[int, list[tuple[int, int, p.WriteItem]]] = {}
    for j, r in enumerate(results):
        i = lo + j
        if r.code == ResultCode.OK:
            crc = crc32c(views[i])
            region = p.region_length(len(kb[i]), views[i].nbytes)
            for rep_no, rep in enumerate(r.replicas):
                by_segment.setdefault(rep.segment_id, []).append((j, rep_no, p.WriteItem(
                    rep.offset, r.generation, kb[i], views[i].nbytes, crc, r.grant(rep_no, region))))
        else:
            status[i] = {ResultCode.ALREADY_EXISTS: PutStatus.ALREADY_EXISTS, ResultCode.POOL_FULL:
                         PutStatus.POOL_FULL, ResultCode.NO_SEGMENT: PutStatus.NO_SEGMENT,
                         ResultCode.QUOTA_EXCEEDED: PutStatus.QUOTA_EXCEEDED}.get(r.code, PutStatus.FAILED)
    if not by_segment:
        return
    failed = [0] * (hi - lo)
    fenced = [False] * (hi - lo)
    guard = threading.Lock()

    def task(sid: int, slots: list[tuple[int, int, p.WriteItem]]) -> Callable[[], None]:
        def run() -> None:
            codes = write_segment(ch, sid, master_run, epoch, term, slots, [views[lo + s[0]] for s in slots])
            with guard:
                for (j, rep_no, _), code in zip(slots, codes):
                    if code != ResultCode.OK:
                        failed[j] |= 1 << rep_no
                        fenced[j] |= code == ResultCode.FENCED
        return run

    ch.run_tasks([task(sid, slots) for sid, slots in by_segment.items()])
    ends: list[tuple[bytes, int, int]] = []
    end_idx: list[int] = []
    revokes: list[tuple[bytes, int, int]] = []
    for j, r in enumerate(results):
        if r.code != ResultCode.OK:
            continue
        everything = (1 << len(r.replicas)) - 1
        if failed[j] & everything == everything:
            revokes.append((kb[lo + j], r.generation, 0))
            status[lo + j] = PutStatus.FENCED if fenced[j] else PutStatus.FAILED
        else:
            ends.append((kb[lo + j], r.generation, signed64(failed[j] & ((1 << 64) - 1))))
            end_idx.append(lo + j)
            copies[lo + j] = len(r.replicas) - bin(failed[j] & everything).count("1")
            pinned[lo + j] = r.pinned
    if revokes:
        try:
            ch.master.call(Opcode.BATCH_PUT_REVOKE if batch or len(revokes) > 1 else Opcode.PUT_REVOKE,
                           p.encode_put_end(revokes), lambda b: p.decode_codes(b, "PUT_REVOKE reply"))
        except KvPoolError as e:
            log.debug("kvpool: revoke failed; the master reclaims the space at its put timeout: %s", e)
    if ends:
        codes = ch.master.call(Opcode.BATCH_PUT_END if batch or len(ends) > 1 else Opcode.PUT_END,
                               p.encode_put_end(ends), lambda b: p.decode_codes(b, "PUT_END reply"))
        for i, code in zip(end_idx, codes):
            status[i] = PutStatus.OK if code == ResultCode.OK else \
                PutStatus.FENCED if code == ResultCode.FENCED else PutStatus.FAILED


def write_segment(ch: Channels, sid: int, run: int, epoch: int, term: int,
                  slots: list[tuple[int, int, p.WriteItem]], values: list[memoryview]) -> list[ResultCode]:
    """Writes the slots' values to one segment of master run ``run``; a code per slot. Never raises for node
    failures."""
    codes = [ResultCode.FAILED] * len(slots)
    seg = ch.segments.segment(sid, run)
    if seg is None:
        return codes
    pool = ch.segments.node_pool(seg)
    mapping = ch.segments.shm.mapping(seg)
    start = 0
    while start < len(slots):
        end = frame_end([v.nbytes for v in values], start, p.DEFAULT_MAX_PAYLOAD_BYTES)
        items = [s[2] for s in slots[start:end]]
        shm = mapping is not None and mapping.writable and \
            sum(v.nbytes for v in values[start:end]) >= ch.shm_write_min_bytes
        try:
            c = pool.borrow(ch.timeout)
        except KvPoolError as e:
            log.debug("kvpool: write to %s failed: %s", seg.name, e)
            return codes
        try:
            body = p.encode_node_write(epoch, term, items)
            if shm:
                assert mapping is not None
                reply, _ = c.call(Opcode.NODE_SHM_WRITE_BEGIN, body, ch.timeout)
                begun = p.decode_codes(reply, "NODE_SHM_WRITE_BEGIN reply")
                done = []
                for k, code in enumerate(begun):
                    if code == ResultCode.OK:
                        mapping.write_value(items[k].offset, len(items[k].key), values[start + k])
                        done.append((items[k].offset, items[k].generation, True))
                ended = iter(p.decode_codes(c.call(Opcode.NODE_SHM_WRITE_END, p.encode_shm_write_end(done),
                                                   ch.timeout)[0], "NODE_SHM_WRITE_END reply") if done else [])
                for k, code in enumerate(begun):
                    codes[start + k] = next(ended) if code == ResultCode.OK else code
                ch.count("bytes_written_shm", sum(values[start + k].nbytes for k, code in enumerate(begun)
                                                  if code == ResultCode.OK))
            else:
                reply, _ = c.call(Opcode.NODE_WRITE, body, ch.timeout, values[start:end])
                for k, code in enumerate(p.decode_codes(reply, "NODE_WRITE reply")):
                    codes[start + k] = code
                ch.count("bytes_written_tcp", sum(v.nbytes for v in values[start:end]))
        except (OSError, KvPoolError, ValueError) as e:
            c.close()  # begun shared-memory writes die with the connection
            log.debug("kvpool: write to %s failed: %s", seg.name, e)
        finally:
            pool.release(c)
        start = end
    return codes
