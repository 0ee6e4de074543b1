package io.kvpool.client;

import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.Replica;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.ArrayList;
import java.util.List;

/**
 * The master side of a put in parts ({@link PutInParts}): where its objects go, and how they become
 * visible. Either of the put protocols the client uses for whole puts:
 * <ul>
 *   <li><b>two-phase</b>: one PUT_START per chunk of keys reserves a region per copy; PUT_END makes
 *       what landed at least once visible and PUT_REVOKE gives back the rest
 *       ({@link ObjectWrites#endOrRevoke});</li>
 *   <li><b>under write leases</b> (single copies, when the client holds a read lease): each object
 *       takes the next region and generation of a lease, with no master exchange while a kept lease
 *       has room; one COMMIT per lease makes what landed visible ({@link ObjectWrites#commitLanded}).
 *       A lease is this put's from the begin to the end (one put at a time per lease). On a segment
 *       mapped into this process the parts go into the lease's range set aside on the node
 *       ({@link PartCopies}), as a whole put's values do.</li>
 * </ul>
 * Either way the reservation lasts the master's put timeout ({@code --put-timeout}, 30 s by default):
 * a put in parts finished later is refused at its end (FAILED), as a two-phase put would be.
 */
final class PartReservation {

    private static final Logger log = LoggerFactory.getLogger(PartReservation.class);

    /** One PUT_START's items [from, from + results.size()) and its answer. */
    private record Chunk(int from, List<MasterMessages.PutStartResult> results) {
    }

    /** One lease's objects, in the order placed: the slots for the COMMIT, the copies for their outcomes. */
    private record Leased(WriteLeasePool.Lease lease, List<NodeWrites.Slot> slots, List<PartCopies.Copy> copies) {
    }

    private final ObjectWrites writes;
    private final MasterChannel master;
    private final WriteLeasePool leases;
    private final byte[][] keys;
    private final long[] lengths;
    /** Per item: the refusal at the reservation (ALREADY_EXISTS, POOL_FULL, ...), or null. */
    final PutStatus[] refused;
    final List<PartCopies.Copy> copies = new ArrayList<>();
    private final List<Chunk> chunks = new ArrayList<>();
    private final List<Leased> leased = new ArrayList<>();

    private PartReservation(ObjectWrites writes, MasterChannel master, WriteLeasePool leases, byte[][] keys,
                            long[] lengths) {
        this.writes = writes;
        this.master = master;
        this.leases = leases;
        this.keys = keys;
        this.lengths = lengths;
        this.refused = new PutStatus[keys.length];
    }

    /** Reserves under PUT_START (one per chunk of keys). */
    static PartReservation twoPhase(ObjectWrites writes, MasterChannel master, byte[][] keys, long[] lengths,
                                    String preferred, int replicas, int pinSeconds) {
        PartReservation r = new PartReservation(writes, master, null, keys, lengths);
        for (int from = 0; from < keys.length; from += KvPoolClient.MAX_KEYS_PER_FRAME) {
            int to = Math.min(keys.length, from + KvPoolClient.MAX_KEYS_PER_FRAME);
            List<MasterMessages.PutStartItem> items = new ArrayList<>(to - from);
            for (int i = from; i < to; i++) {
                items.add(new MasterMessages.PutStartItem(keys[i], lengths[i]));
            }
            BodyWriter w = new BodyWriter(64 + items.size() * 64);
            new MasterMessages.PutStart(false, replicas, preferred == null ? "" : preferred, pinSeconds, items).write(w);
            MasterChannel.Answer<MasterMessages.PutStartReply> a = master.callInRun(
                    keys.length > 1 ? Opcode.BATCH_PUT_START : Opcode.PUT_START, w, MasterMessages.PutStartReply::read);
            MasterMessages.PutStartReply reply = a.value();
            r.chunks.add(new Chunk(from, reply.results()));
            for (int j = 0; j < reply.results().size(); j++) {
                MasterMessages.PutStartResult res = reply.results().get(j);
                int i = from + j;
                if (res.code() != ResultCode.OK) {
                    r.refused[i] = switch (res.code()) {
                        case ALREADY_EXISTS -> PutStatus.ALREADY_EXISTS;
                        case POOL_FULL -> PutStatus.POOL_FULL;
                        case NO_SEGMENT -> PutStatus.NO_SEGMENT;
                        case QUOTA_EXCEEDED -> PutStatus.QUOTA_EXCEEDED;
                        default -> PutStatus.FAILED;
                    };
                    continue;
                }
                long region = ObjectLayout.regionLength(keys[i].length, lengths[i]);
                for (int rep = 0; rep < res.replicas().size(); rep++) {
                    Replica replica = res.replicas().get(rep);
                    r.copies.add(new PartCopies.Copy(i, rep, replica.segmentId(), a.run(), reply.epoch(), reply.term(),
                            replica.offset(), res.generation(), res.grant(rep, region), keys[i], lengths[i], null));
                }
            }
        }
        return r;
    }

    /** Reserves in write leases: each object the next region and generation of a lease this client holds. */
    static PartReservation leased(ObjectWrites writes, MasterChannel master, WriteLeasePool leases, byte[][] keys,
                                  long[] lengths, String preferred) {
        PartReservation r = new PartReservation(writes, master, leases, keys, lengths);
        int n = keys.length;
        long[] region = new long[n];
        long remaining = 0;
        for (int i = 0; i < n; i++) {
            region[i] = ObjectLayout.regionLength(keys[i].length, lengths[i]);
            remaining += region[i];
        }
        ResultCode[] refusal = new ResultCode[1];
        String pref = preferred == null ? "" : preferred;
        for (int i = 0; i < n; ) {
            WriteLeasePool.Lease lease = leases.take(pref, region[i], remaining, n - i, refusal);
            if (lease == null) {
                PutStatus no = refusal[0] == ResultCode.NO_SEGMENT ? PutStatus.NO_SEGMENT : PutStatus.POOL_FULL;
                for (; i < n; i++) {
                    r.refused[i] = no;
                }
                break;
            }
            Leased l = new Leased(lease, new ArrayList<>(), new ArrayList<>());
            while (i < n && lease.fits(region[i])) {
                NodeWrites.Slot slot = new NodeWrites.Slot(i, 0, lease.next, lease.nextGeneration++, lease.grant);
                l.slots.add(slot);
                l.copies.add(new PartCopies.Copy(i, 0, lease.segmentId, lease.run, lease.epoch, lease.term,
                        slot.offset(), slot.generation(), lease.grant, keys[i], lengths[i], lease));
                lease.next += region[i];
                remaining -= region[i];
                i++;
            }
            r.leased.add(l);
            r.copies.addAll(l.copies);
        }
        return r;
    }

    /**
     * Makes what landed visible (the copies' outcomes are final: the nodes ended the writes) and
     * returns a status per item.
     */
    PutStatus[] complete() {
        PutStatus[] status = refused.clone();
        for (Chunk c : chunks) {
            int n = c.results.size();
            long[] failed = new long[n];
            boolean[] fenced = new boolean[n];
            for (PartCopies.Copy copy : copies) {
                int j = copy.item - c.from;
                if (j >= 0 && j < n && !copy.alive()) {
                    failed[j] |= 1L << copy.replica;
                    fenced[j] |= copy.outcome == ResultCode.FENCED;
                }
            }
            writes.endOrRevoke(keys, c.from, c.results, failed, fenced, keys.length > 1, status,
                    new int[keys.length], new boolean[keys.length]);
        }
        for (Leased l : leased) {
            ResultCode[] written = new ResultCode[l.copies.size()];
            for (int s = 0; s < written.length; s++) {
                written[s] = l.copies.get(s).outcome;
            }
            List<Integer> expired = new ArrayList<>();
            writes.commitLanded(l.lease, l.slots, written, null, i -> keys[i], i -> lengths[i], 0, false, status, expired);
            for (int i : expired) {
                // its bytes are not here to write again under a fresh lease; but the COMMIT may have been taken
                // by a master that went away since, and the object rebuilt with the generation given here
                if (!writes.storedAt(keys[i], generationOf(l, i), i, status)) {
                    status[i] = PutStatus.FAILED;
                }
            }
        }
        return status;
    }

    /** The generation lease reservation {@code l} gave item {@code i}, or 0. */
    private static long generationOf(Leased l, int i) {
        for (NodeWrites.Slot slot : l.slots) {
            if (slot.item() == i) {
                return slot.generation();
            }
        }
        return 0;
    }

    /** Gives back everything reserved: nothing becomes visible. Best effort (the put timeout reclaims the rest). */
    void abandon() {
        List<MasterMessages.PutEndItem> revokes = new ArrayList<>();
        for (Chunk c : chunks) {
            for (int j = 0; j < c.results.size(); j++) {
                MasterMessages.PutStartResult res = c.results.get(j);
                if (res.code() == ResultCode.OK) {
                    revokes.add(new MasterMessages.PutEndItem(keys[c.from + j], res.generation(), 0));
                }
            }
        }
        for (int from = 0; from < revokes.size(); from += KvPoolClient.MAX_KEYS_PER_FRAME) {
            List<MasterMessages.PutEndItem> part = revokes.subList(from,
                    Math.min(revokes.size(), from + KvPoolClient.MAX_KEYS_PER_FRAME));
            BodyWriter w = new BodyWriter(16 + part.size() * 64);
            new MasterMessages.PutEnd(part).write(w);
            try {
                master.call(Opcode.BATCH_PUT_REVOKE, w, MasterMessages.Codes::read);
            } catch (KvPoolException e) {
                log.debug("revoke of an abandoned put in parts failed; the put timeout reclaims it: {}", e.getMessage());
            }
        }
        for (Leased l : leased) {
            leases.release(l.lease);
        }
    }
}
