package io.kvpool.client;

import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.Keys;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.KeyList;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.Replica;
import io.kvpool.protocol.msg.WriteLeaseMessages;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.function.IntFunction;
import java.util.function.IntToLongFunction;

/**
 * The put path. A single-copy put goes under a write lease ({@link #putLeased}): the bytes go to the
 * node at once, into a region of a range the master leased to this client, and one COMMIT per lease and
 * batch makes them visible: over TCP the node sends it for the client (NODE_WRITE_COMMIT, one exchange;
 * a batch too large for one frame goes as NODE_WRITE frames in parallel lanes and the client's COMMIT); on
 * the same machine the client copies the values and stamps their headers in the shared segment and sends
 * the COMMIT (see {@link NodeWrites#writeLeased}). Otherwise a put is
 * two-phase: PUT_START reserves regions at the master (one round trip for
 * the batch), the values go straight to the nodes (NODE_WRITE frames, nodes in parallel and a
 * node's share of a large batch over a few connections at once; or, for a segment on this host,
 * NODE_SHM_WRITE_BEGIN, a memory copy, NODE_SHM_WRITE_END), and PUT_END makes what landed at least
 * once visible; PUT_REVOKE gives back what landed nowhere. Values are sent from the caller's memory,
 * never copied. Node failures are values (FAILED, FENCED), never exceptions.
 */
final class ObjectWrites {

    private static final Logger log = LoggerFactory.getLogger(ObjectWrites.class);

    private final ClientConfig config;
    private final MasterChannel master;
    private final PerSegment tasks;
    private final LocationCache locations;
    private final NodeWrites nodes;
    private final SegmentAccess segments;
    /** Null when puts are two-phase only (write leases off, or no read lease to hear of removals by). */
    private final WriteLeasePool leases;

    ObjectWrites(ClientConfig config, MasterChannel master, SegmentAccess segments, PerSegment tasks,
                 LocationCache locations, WriteLeasePool leases) {
        this.config = config;
        this.master = master;
        this.tasks = tasks;
        this.locations = locations;
        this.leases = leases;
        this.segments = segments;
        this.nodes = new NodeWrites(config, segments, tasks);
    }


    /**
     * Stores the values (keys and values checked first, naming the key at fault); one result per key.
     * Large batches go in chunks of {@link KvPoolClient#MAX_KEYS_PER_FRAME}. {@code replicas} 0 means
     * the master's default; {@code pinSeconds} as {@link PutOptions#pinSeconds()}.
     */
    List<PutResult> write(List<String> keys, List<MemorySegment> values, String preferred, int replicas,
                          int pinSeconds, boolean upsert, boolean batch) {
        int n = keys.size();
        byte[][] k = new byte[n][];
        for (int i = 0; i < n; i++) {
            k[i] = Keys.encode(keys.get(i));
            long len = values.get(i).byteSize();
            if (len > master.maxValueBytes()) {
                throw new IllegalArgumentException("value for key '" + Keys.abbreviate(keys.get(i)) + "' is " + len
                        + " bytes; the pool accepts at most " + master.maxValueBytes());
            }
        }
        for (String key : keys) {
            locations.invalidate(key);
        }
        PutStatus[] status = new PutStatus[n];
        int wanted = replicas == 0 ? master.defaultReplicas() : replicas;
        // copies written per key (two-phase puts; a leased put writes one); pins granted per key
        int[] copies = new int[n];
        boolean[] pinned = new boolean[n];
        boolean leased = leases != null && wanted == 1 && pinSeconds == 0;
        for (int from = 0; from < n; from += KvPoolClient.MAX_KEYS_PER_FRAME) {
            int to = Math.min(n, from + KvPoolClient.MAX_KEYS_PER_FRAME);
            if (leased) {
                putLeased(k, values, from, to, preferred, upsert, status);
                Arrays.fill(copies, from, to, 1);
            } else {
                putChunk(k, values, from, to, preferred, replicas, pinSeconds, upsert, batch, status, copies, pinned);
            }
        }
        List<PutResult> out = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            boolean ok = status[i] == PutStatus.OK;
            out.add(new PutResult(status[i], ok ? copies[i] : 0, wanted, ok && pinned[i]));
            if (ok && copies[i] < wanted) {
                log.debug("put of '{}' wrote {} of {} copies; the master repairs it when there is room",
                        keys.get(i), copies[i], wanted);
            }
        }
        return out;
    }

    /**
     * Begins a put in parts ({@link PutInParts}): reserves every object as a whole put would (under
     * write leases for single copies when this client uses them, else PUT_START) and has the nodes
     * admit every copy. Keys and lengths checked first, naming the key at fault.
     */
    PutInParts beginParts(List<String> keys, long[] lengths, String preferred, int replicas, int pinSeconds) {
        if (keys.size() != lengths.length) {
            throw new IllegalArgumentException(keys.size() + " keys but " + lengths.length + " value lengths");
        }
        byte[][] k = new byte[keys.size()][];
        for (int i = 0; i < k.length; i++) {
            k[i] = Keys.encode(keys.get(i));
            if (lengths[i] < 0 || lengths[i] > master.maxValueBytes()) {
                throw new IllegalArgumentException("value length " + lengths[i] + " for key '"
                        + Keys.abbreviate(keys.get(i)) + "' is outside 0.." + master.maxValueBytes()
                        + " (the pool's largest value)");
            }
        }
        for (String key : keys) {
            locations.invalidate(key);
        }
        int wanted = replicas == 0 ? master.defaultReplicas() : replicas;
        PartReservation r = leases != null && wanted == 1 && pinSeconds == 0
                ? PartReservation.leased(this, master, leases, k, lengths, preferred)
                : PartReservation.twoPhase(this, master, k, lengths, preferred, replicas, pinSeconds);
        PartCopies copies = new PartCopies(config, segments, tasks, nodes);
        try {
            copies.begin(r.copies);
        } catch (RuntimeException e) {
            copies.abandon();
            r.abandon();
            throw e;
        }
        return new PutInParts(keys, lengths, r, copies);
    }

    /**
     * Puts items [from, to) under write leases: each item gets the next region and generation of a
     * lease this client holds (a new one when none has room), the values go to the node
     * ({@link NodeWrites#writeLeased}), and one COMMIT per lease makes what landed visible. No master exchange
     * before the bytes move, and none at all while a kept lease has room.
     *
     * <p>Items whose COMMIT finds the lease gone (EXPIRED: the master restarted, or the segment left),
     * and items of a lease none of whose writes landed (its node unknown or unreachable), are written
     * once more under a fresh lease, provided it is of the same epoch: a put is never
     * carried across a removeAll(force) that way (a fresh lease of a later epoch makes them FENCED).
     */
    private void putLeased(byte[][] k, List<MemorySegment> values, int from, int to, String preferred,
                           boolean upsert, PutStatus[] status) {
        int[] all = new int[to - from];
        Arrays.setAll(all, j -> j);
        NodeWrites.Batch b = new NodeWrites.Batch(k, values, from, to, 0, 0, 0,
                PerSegment.shareable(values.subList(from, to)));
        List<Integer> expired = new ArrayList<>();
        long[] tried = new long[to - from];
        long epoch = putLeased(b, all, preferred == null ? "" : preferred, upsert, status, expired, tried, -1);
        if (expired.isEmpty()) {
            return;
        }
        // a COMMIT the master took before it went away (a failover, a restart, a lost reply) left the
        // object stored under the generation this client gave it: that put is done, not to be made again
        int[] again = expired.stream().mapToInt(Integer::intValue)
                .filter(item -> !storedAt(b.key(item), tried[item], b.from + item, status)).toArray();
        if (again.length == 0) {
            return;
        }
        long[] first = tried.clone();
        putLeased(b, again, preferred == null ? "" : preferred, upsert, status, new ArrayList<>(), tried, epoch);
        for (int item : again) {
            // the first attempt's object showed up meanwhile (a node re-listed it): it is this client's own
            if (status[b.from + item] == PutStatus.ALREADY_EXISTS) {
                storedAt(b.key(item), first[item], b.from + item, status);
            }
        }
    }

    /**
     * Whether the key holds the object this client wrote under {@code generation} (generations are
     * unique: no other put has it), asking the master; if so the put is done and {@code status[i]} is
     * set OK. Used only after an EXPIRED COMMIT, so a retried put answers OK for its own object instead
     * of ALREADY_EXISTS (issue 32). A lookup that fails answers false.
     */
    boolean storedAt(byte[] key, long generation, int i, PutStatus[] status) {
        if (generation == 0) {
            return false;
        }
        BodyWriter w = new BodyWriter(16 + key.length);
        new KeyList(List.of(key)).write(w);
        MasterMessages.ReplicaList where;
        try {
            where = master.call(Opcode.GET_REPLICA_LIST, w, MasterMessages.ReplicaListReply::read).items().getFirst();
        } catch (KvPoolException e) {
            log.debug("cannot tell whether '{}' holds generation {}: {}", Keys.decode(key), generation, e.getMessage());
            return false;
        }
        if (where.code() == ResultCode.OK && where.generation() == generation) {
            status[i] = PutStatus.OK;
            return true;
        }
        return false;
    }

    /**
     * One pass over {@code items} (indices within {@code b}); adds to {@code expired} the items whose
     * lease the master no longer knew. With {@code onlyEpoch} >= 0, items that would go under a lease
     * of another epoch are FENCED instead. Returns the epoch of the last lease used.
     */
    private long putLeased(NodeWrites.Batch b, int[] items, String pref, boolean upsert, PutStatus[] status,
                           List<Integer> expired, long[] tried, long onlyEpoch) {
        long[] region = new long[items.length];
        long remaining = 0;
        for (int j = 0; j < items.length; j++) {
            region[j] = ObjectLayout.regionLength(b.key(items[j]).length, b.value(items[j]).byteSize());
            remaining += region[j];
        }
        ResultCode[] refusal = new ResultCode[1];
        long epoch = onlyEpoch;
        for (int j = 0; j < items.length; ) {
            WriteLeasePool.Lease lease = leases.take(pref, region[j], remaining, items.length - j, refusal);
            if (lease == null) {
                PutStatus refused = refusal[0] == ResultCode.NO_SEGMENT ? PutStatus.NO_SEGMENT : PutStatus.POOL_FULL;
                for (; j < items.length; j++) {
                    status[b.from + items[j]] = refused;
                }
                break;
            }
            List<NodeWrites.Slot> slots = new ArrayList<>();
            while (j < items.length && lease.fits(region[j])) {
                slots.add(new NodeWrites.Slot(items[j], 0, lease.next, lease.nextGeneration++, lease.grant));
                lease.next += region[j];
                remaining -= region[j];
                j++;
            }
            if (onlyEpoch >= 0 && lease.epoch != onlyEpoch) {
                for (NodeWrites.Slot slot : slots) {
                    status[b.from + slot.item()] = PutStatus.FENCED;
                }
                // their regions stay unwritten: a gap the node's walk over stamped objects would stop at
                WriteLeasePool.closeNode(lease);
                leases.giveBack(lease);
                continue;
            }
            epoch = lease.epoch;
            try {
                writeAndCommit(lease, slots, b.under(lease.epoch, lease.term, lease.run), upsert, status, expired, tried);
            } catch (RuntimeException e) {
                WriteLeasePool.closeNode(lease); // not used again: let its range go on the node
                throw e;
            }
        }
        return epoch;
    }

    /** Writes one lease's slots to its segment and commits what landed; gives the lease back or drops it. */
    private void writeAndCommit(WriteLeasePool.Lease lease, List<NodeWrites.Slot> slots, NodeWrites.Batch b, boolean upsert,
                                PutStatus[] status, List<Integer> expired, long[] tried) {
        NodeWrites.Landed landed = nodes.writeLeased(lease, slots, b, upsert);
        for (NodeWrites.Slot slot : slots) {
            tried[slot.item()] = slot.generation();
        }
        commitLanded(lease, slots, landed.written(), landed.committed(), b::key, item -> b.value(item).byteSize(), b.from,
                upsert, status, expired);
    }

    /**
     * Commits the slots of one lease whose node writes landed ({@code written[s]} OK) and sets the
     * status of every slot's item ({@code status[from + item]}); adds to {@code expired} the items to
     * write once more under a fresh lease. Gives the lease back, releases it or drops it. Shared by
     * whole puts and puts in parts ({@link PutInParts}). {@code committed}: the master's codes for the slots
     * that landed, when their node committed them for this client (NODE_WRITE_COMMIT); null to send the COMMIT.
     */
    void commitLanded(WriteLeasePool.Lease lease, List<NodeWrites.Slot> slots, ResultCode[] written,
                      List<ResultCode> committed, IntFunction<byte[]> key, IntToLongFunction valueLength, int from, boolean upsert,
                      PutStatus[] status, List<Integer> expired) {
        List<WriteLeaseMessages.CommitItem> items = new ArrayList<>(slots.size());
        int[] itemOf = new int[slots.size()];
        for (int s = 0; s < slots.size(); s++) {
            NodeWrites.Slot slot = slots.get(s);
            if (written[s] == ResultCode.OK) {
                itemOf[items.size()] = slot.item();
                items.add(new WriteLeaseMessages.CommitItem(key.apply(slot.item()), slot.offset(),
                        valueLength.applyAsLong(slot.item()), slot.generation()));
            } else {
                status[from + slot.item()] = written[s] == ResultCode.FENCED ? PutStatus.FENCED : PutStatus.FAILED;
            }
        }
        boolean deposed = false;
        for (ResultCode code : written) {
            deposed |= code == ResultCode.DEPOSED;
        }
        if (deposed) {
            // the lease came from a master that lost its leadership, and so did every lease kept with it
            leases.forgetAll();
        }
        if (items.isEmpty()) {
            // nothing landed: this lease is of no further use. Unless the node fenced the writes (a reset
            // came after the lease), its segment may be gone, or its master deposed: a fresh lease may do
            if (deposed) {
                WriteLeasePool.closeNode(lease);
            } else {
                leases.release(lease);
            }
            for (int s = 0; s < slots.size(); s++) {
                if (written[s] != ResultCode.FENCED) {
                    expired.add(slots.get(s).item());
                }
            }
            return;
        }
        List<ResultCode> codes = committed;
        if (codes == null) {
            WriteLeaseMessages.Commit commit = new WriteLeaseMessages.Commit(lease.id, upsert, items);
            BodyWriter w = new BodyWriter(commit.bodyBytes());
            commit.write(w);
            codes = master.call(Opcode.COMMIT, w, MasterMessages.Codes::read).codes();
        }
        boolean lost = false;
        for (int c = 0; c < items.size(); c++) {
            ResultCode code = codes.get(c);
            lost |= code == ResultCode.EXPIRED || code == ResultCode.FENCED;
            if (code == ResultCode.EXPIRED) {
                expired.add(itemOf[c]);
            }
            status[from + itemOf[c]] = switch (code) {
                case OK -> PutStatus.OK;
                case ALREADY_EXISTS -> PutStatus.ALREADY_EXISTS;
                case FENCED -> PutStatus.FENCED;
                case QUOTA_EXCEEDED -> PutStatus.QUOTA_EXCEEDED;
                default -> PutStatus.FAILED;
            };
        }
        if (lost) {
            WriteLeasePool.closeNode(lease); // gone at the master: its range on the node goes too
        } else {
            leases.giveBack(lease);
        }
    }

    private void putChunk(byte[][] k, List<MemorySegment> values, int from, int to, String preferred, int replicas,
                          int pinSeconds, boolean upsert, boolean batch, PutStatus[] status, int[] copies,
                          boolean[] pinned) {
        List<MasterMessages.PutStartItem> items = new ArrayList<>(to - from);
        for (int i = from; i < to; i++) {
            items.add(new MasterMessages.PutStartItem(k[i], values.get(i).byteSize()));
        }
        BodyWriter w = new BodyWriter(64 + items.size() * 64);
        new MasterMessages.PutStart(upsert, replicas, preferred == null ? "" : preferred, pinSeconds, items).write(w);
        // its regions are valid in the master run that answered, and void once that changed (SegmentAccess)
        MasterChannel.Answer<MasterMessages.PutStartReply> answer = master.callInRun(
                batch ? Opcode.BATCH_PUT_START : Opcode.PUT_START, w, MasterMessages.PutStartReply::read);
        MasterMessages.PutStartReply reply = answer.value();
        int run = answer.run();

        // group replica writes by segment
        Map<Integer, List<NodeWrites.Slot>> bySegment = new LinkedHashMap<>();
        List<MasterMessages.PutStartResult> results = reply.results();
        for (int j = 0; j < results.size(); j++) {
            MasterMessages.PutStartResult r = results.get(j);
            int i = from + j;
            switch (r.code()) {
                case OK -> {
                    long regionLength = ObjectLayout.regionLength(k[i].length, values.get(i).byteSize());
                    for (int rep = 0; rep < r.replicas().size(); rep++) {
                        Replica replica = r.replicas().get(rep);
                        bySegment.computeIfAbsent(replica.segmentId(), x -> new ArrayList<>()).add(new NodeWrites.Slot(
                                j, rep, replica.offset(), r.generation(), r.grant(rep, regionLength)));
                    }
                }
                case ALREADY_EXISTS -> status[i] = PutStatus.ALREADY_EXISTS;
                case POOL_FULL -> status[i] = PutStatus.POOL_FULL;
                case NO_SEGMENT -> status[i] = PutStatus.NO_SEGMENT;
                case QUOTA_EXCEEDED -> status[i] = PutStatus.QUOTA_EXCEEDED;
                case TOO_LARGE -> throw new IllegalArgumentException("value for key '" + Keys.decode(k[i]) + "' of "
                        + values.get(i).byteSize() + " bytes exceeds the master's max value size");
                default -> status[i] = PutStatus.FAILED;
            }
        }
        if (bySegment.isEmpty()) {
            return;
        }
        // write every replica; failed[j] has a bit per replica whose write failed
        long[] failed = new long[to - from];
        boolean[] fenced = new boolean[to - from];
        boolean parallelOk = PerSegment.shareable(values.subList(from, to));
        NodeWrites.Batch b = new NodeWrites.Batch(k, values, from, to, reply.epoch(), reply.term(), run, parallelOk);
        tasks.run(bySegment, parallelOk, (segId, slots) -> {
            ResultCode[] codes = nodes.writeToSegment(segId, slots, b);
            synchronized (failed) {
                for (int s = 0; s < slots.size(); s++) {
                    if (codes[s] != ResultCode.OK) {
                        failed[slots.get(s).item()] |= 1L << slots.get(s).replica();
                        fenced[slots.get(s).item()] |= codes[s] == ResultCode.FENCED;
                    }
                }
            }
        });
        endOrRevoke(k, from, results, failed, fenced, batch, status, copies, pinned);
    }

    /**
     * The last phase of a two-phase put of items [from, from + results.size()): PUT_END for what
     * landed at least once ({@code failed[j]} has a bit per replica that did not), PUT_REVOKE for what
     * landed nowhere; sets status, copies and pinned of each. Shared by whole puts and puts in parts.
     */
    void endOrRevoke(byte[][] k, int from, List<MasterMessages.PutStartResult> results, long[] failed,
                     boolean[] fenced, boolean batch, PutStatus[] status, int[] copies, boolean[] pinned) {
        // complete what landed at least once; revoke what landed nowhere
        List<MasterMessages.PutEndItem> ends = new ArrayList<>();
        List<Integer> endIdx = new ArrayList<>();
        List<MasterMessages.PutEndItem> revokes = new ArrayList<>();
        for (int j = 0; j < results.size(); j++) {
            MasterMessages.PutStartResult r = results.get(j);
            if (r.code() != ResultCode.OK) {
                continue;
            }
            long all = r.replicas().size() >= 64 ? -1L : (1L << r.replicas().size()) - 1;
            copies[from + j] = r.replicas().size() - Long.bitCount(failed[j] & all);
            pinned[from + j] = r.pinned();
            MasterMessages.PutEndItem item = new MasterMessages.PutEndItem(k[from + j], r.generation(), failed[j]);
            if ((failed[j] & all) == all) {
                revokes.add(new MasterMessages.PutEndItem(k[from + j], r.generation(), 0));
                status[from + j] = fenced[j] ? PutStatus.FENCED : PutStatus.FAILED;
            } else {
                ends.add(item);
                endIdx.add(from + j);
            }
        }
        if (!revokes.isEmpty()) {
            BodyWriter rw = new BodyWriter(16 + revokes.size() * 64);
            new MasterMessages.PutEnd(revokes).write(rw);
            try {
                master.call(revokes.size() == 1 && !batch ? Opcode.PUT_REVOKE : Opcode.BATCH_PUT_REVOKE, rw,
                        MasterMessages.Codes::read);
            } catch (KvPoolException e) {
                log.debug("revoke failed; the master reclaims the space at the put timeout: {}", e.getMessage());
            }
        }
        if (!ends.isEmpty()) {
            BodyWriter ew = new BodyWriter(16 + ends.size() * 64);
            new MasterMessages.PutEnd(ends).write(ew);
            MasterMessages.Codes codes = master.call(ends.size() == 1 && !batch ? Opcode.PUT_END : Opcode.BATCH_PUT_END,
                    ew, MasterMessages.Codes::read);
            for (int e = 0; e < ends.size(); e++) {
                status[endIdx.get(e)] = switch (codes.codes().get(e)) {
                    case OK -> PutStatus.OK;
                    case FENCED -> PutStatus.FENCED;
                    default -> PutStatus.FAILED;
                };
            }
        }
    }
}
