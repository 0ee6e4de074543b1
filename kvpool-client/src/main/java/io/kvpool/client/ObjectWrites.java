package io.kvpool.client;

import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.Channels;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.Keys;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.RemoteException;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.NodeMessages;
import io.kvpool.protocol.msg.Replica;
import io.kvpool.protocol.msg.WriteLeaseMessages;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLongArray;

/**
 * The put path. A single-copy put goes under a write lease ({@link #putLeased}): the bytes go to the
 * node at once, into a region of a range the master leased to this client (NODE_WRITE over TCP; on
 * the same machine a copy into the shared segment and one NODE_SHM_LEASE_WRITE, see
 * {@link #writeLeased}), and one COMMIT per lease and batch makes them visible. Otherwise a put is
 * two-phase: PUT_START reserves regions at the master (one round trip for
 * the batch), the values go straight to the nodes (NODE_WRITE frames, nodes in parallel and a
 * node's share of a large batch over a few connections at once; or, for a segment on this host,
 * NODE_SHM_WRITE_BEGIN, a memory copy, NODE_SHM_WRITE_END), and PUT_END makes what landed at least
 * once visible; PUT_REVOKE gives back what landed nowhere. Values are sent from the caller's memory,
 * never copied. Node failures are values (FAILED, FENCED), never exceptions.
 */
final class ObjectWrites {

    private static final Logger log = LoggerFactory.getLogger(ObjectWrites.class);

    /** Most threads and connections one segment's share of a batch is written with. */
    static final int MAX_LANES = 4;
    /** Smallest frame a segment's share is cut into for writing in parallel. */
    static final long MIN_PART_BYTES = 1L << 20;

    private final ClientConfig config;
    private final MasterChannel master;
    private final SegmentAccess segments;
    private final PerSegment tasks;
    private final LocationCache locations;
    /** Null when puts are two-phase only (write leases off, or no read lease to hear of removals by). */
    private final WriteLeasePool leases;

    ObjectWrites(ClientConfig config, MasterChannel master, SegmentAccess segments, PerSegment tasks,
                 LocationCache locations, WriteLeasePool leases) {
        this.config = config;
        this.master = master;
        this.segments = segments;
        this.tasks = tasks;
        this.locations = locations;
        this.leases = leases;
    }

    /** One replica write: which item (index within the chunk), which of its replicas, where, which version. */
    private record WriteSlot(int item, int replica, long offset, long generation) {
    }

    /**
     * Stores the values (keys and values checked first, naming the key at fault); one status per key.
     * Large batches go in chunks of {@link KvPoolClient#MAX_KEYS_PER_FRAME}.
     */
    List<PutStatus> write(List<String> keys, List<MemorySegment> values, String preferred, int replicas,
                          boolean upsert, boolean batch) {
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
        boolean leased = leases != null && (replicas == 1 || replicas == 0 && master.defaultReplicas() == 1);
        for (int from = 0; from < n; from += KvPoolClient.MAX_KEYS_PER_FRAME) {
            int to = Math.min(n, from + KvPoolClient.MAX_KEYS_PER_FRAME);
            if (leased) {
                putLeased(k, values, from, to, preferred, upsert, status);
            } else {
                putChunk(k, values, from, to, preferred, replicas, upsert, batch, status);
            }
        }
        return Arrays.asList(status);
    }

    /**
     * Puts items [from, to) under write leases: each item gets the next region and generation of a
     * lease this client holds (a new one when none has room), the values go to the node as in
     * {@link #putChunk}, and one COMMIT per lease makes what landed visible. No master exchange
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
        Batch b = new Batch(k, values, from, to, 0, PerSegment.shareable(values.subList(from, to)));
        List<Integer> expired = new ArrayList<>();
        long epoch = putLeased(b, all, preferred == null ? "" : preferred, upsert, status, expired, -1);
        if (!expired.isEmpty()) {
            putLeased(b, expired.stream().mapToInt(Integer::intValue).toArray(), preferred == null ? "" : preferred,
                    upsert, status, new ArrayList<>(), epoch);
        }
    }

    /**
     * One pass over {@code items} (indices within {@code b}); adds to {@code expired} the items whose
     * lease the master no longer knew. With {@code onlyEpoch} >= 0, items that would go under a lease
     * of another epoch are FENCED instead. Returns the epoch of the last lease used.
     */
    private long putLeased(Batch b, int[] items, String pref, boolean upsert, PutStatus[] status,
                           List<Integer> expired, long onlyEpoch) {
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
            List<WriteSlot> slots = new ArrayList<>();
            while (j < items.length && lease.fits(region[j])) {
                slots.add(new WriteSlot(items[j], 0, lease.next, lease.nextGeneration++));
                lease.next += region[j];
                remaining -= region[j];
                j++;
            }
            if (onlyEpoch >= 0 && lease.epoch != onlyEpoch) {
                for (WriteSlot slot : slots) {
                    status[b.from + slot.item] = PutStatus.FENCED;
                }
                leases.giveBack(lease);
                continue;
            }
            epoch = lease.epoch;
            try {
                writeAndCommit(lease, slots, b.withEpoch(lease.epoch), upsert, status, expired);
            } catch (RuntimeException e) {
                WriteLeasePool.closeNode(lease); // not used again: let its range go on the node
                throw e;
            }
        }
        return epoch;
    }

    /** Writes one lease's slots to its segment and commits what landed; gives the lease back or drops it. */
    private void writeAndCommit(WriteLeasePool.Lease lease, List<WriteSlot> slots, Batch b, boolean upsert,
                                PutStatus[] status, List<Integer> expired) {
        ResultCode[] written = writeLeased(lease, slots, b);
        List<WriteLeaseMessages.CommitItem> items = new ArrayList<>(slots.size());
        int[] itemOf = new int[slots.size()];
        for (int s = 0; s < slots.size(); s++) {
            WriteSlot slot = slots.get(s);
            if (written[s] == ResultCode.OK) {
                itemOf[items.size()] = slot.item;
                items.add(new WriteLeaseMessages.CommitItem(b.key(slot.item), slot.offset,
                        b.value(slot.item).byteSize(), slot.generation));
            } else {
                status[b.from + slot.item] = written[s] == ResultCode.FENCED ? PutStatus.FENCED : PutStatus.FAILED;
            }
        }
        if (items.isEmpty()) {
            // nothing landed: this lease is of no further use. Unless the node fenced the writes (a reset
            // came after the lease), its segment may be gone: a fresh lease may find another one
            leases.release(lease);
            for (int s = 0; s < slots.size(); s++) {
                if (written[s] != ResultCode.FENCED) {
                    expired.add(slots.get(s).item);
                }
            }
            return;
        }
        BodyWriter w = new BodyWriter(32 + items.size() * 64);
        new WriteLeaseMessages.Commit(lease.id, upsert, items).write(w);
        List<ResultCode> codes = master.call(Opcode.COMMIT, w, MasterMessages.Codes::read).codes();
        boolean lost = false;
        for (int c = 0; c < items.size(); c++) {
            ResultCode code = codes.get(c);
            lost |= code == ResultCode.EXPIRED || code == ResultCode.FENCED;
            if (code == ResultCode.EXPIRED) {
                expired.add(itemOf[c]);
            }
            status[b.from + itemOf[c]] = switch (code) {
                case OK -> PutStatus.OK;
                case ALREADY_EXISTS -> PutStatus.ALREADY_EXISTS;
                case FENCED -> PutStatus.FENCED;
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
                          boolean upsert, boolean batch, PutStatus[] status) {
        List<MasterMessages.PutStartItem> items = new ArrayList<>(to - from);
        for (int i = from; i < to; i++) {
            items.add(new MasterMessages.PutStartItem(k[i], values.get(i).byteSize()));
        }
        BodyWriter w = new BodyWriter(64 + items.size() * 64);
        new MasterMessages.PutStart(upsert, replicas, preferred == null ? "" : preferred, items).write(w);
        MasterMessages.PutStartReply reply = master.call(batch ? Opcode.BATCH_PUT_START : Opcode.PUT_START, w,
                MasterMessages.PutStartReply::read);

        // group replica writes by segment
        Map<Integer, List<WriteSlot>> bySegment = new LinkedHashMap<>();
        List<MasterMessages.PutStartResult> results = reply.results();
        for (int j = 0; j < results.size(); j++) {
            MasterMessages.PutStartResult r = results.get(j);
            int i = from + j;
            switch (r.code()) {
                case OK -> {
                    for (int rep = 0; rep < r.replicas().size(); rep++) {
                        Replica replica = r.replicas().get(rep);
                        bySegment.computeIfAbsent(replica.segmentId(), x -> new ArrayList<>())
                                .add(new WriteSlot(j, rep, replica.offset(), r.generation()));
                    }
                }
                case ALREADY_EXISTS -> status[i] = PutStatus.ALREADY_EXISTS;
                case POOL_FULL -> status[i] = PutStatus.POOL_FULL;
                case NO_SEGMENT -> status[i] = PutStatus.NO_SEGMENT;
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
        Batch b = new Batch(k, values, from, to, reply.epoch(), parallelOk);
        tasks.run(bySegment, parallelOk, (segId, slots) -> {
            ResultCode[] codes = writeToSegment(segId, slots, b);
            synchronized (failed) {
                for (int s = 0; s < slots.size(); s++) {
                    if (codes[s] != ResultCode.OK) {
                        failed[slots.get(s).item] |= 1L << slots.get(s).replica;
                        fenced[slots.get(s).item] |= codes[s] == ResultCode.FENCED;
                    }
                }
            }
        });
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

    /**
     * What the node writes of one chunk share: keys, values (item j is {@code values.get(from + j)}),
     * the epoch of the reservation, and each value's CRC32C, computed the first time a frame needs it
     * (by the thread that sends that frame; a value with replicas on several segments is checksummed
     * once, or at worst once per racing thread, with the same result).
     */
    private static final class Batch {
        final byte[][] keys;
        final List<MemorySegment> values;
        final int from;
        final long epoch;
        final boolean parallelOk;
        /** 0: not computed yet; else 1 << 32 | crc. */
        private final AtomicLongArray crcs;

        Batch(byte[][] keys, List<MemorySegment> values, int from, int to, long epoch, boolean parallelOk) {
            this(keys, values, from, epoch, parallelOk, new AtomicLongArray(to - from));
        }

        private Batch(byte[][] keys, List<MemorySegment> values, int from, long epoch, boolean parallelOk,
                      AtomicLongArray crcs) {
            this.keys = keys;
            this.values = values;
            this.from = from;
            this.epoch = epoch;
            this.parallelOk = parallelOk;
            this.crcs = crcs;
        }

        /** The same items and checksums, written under another epoch (a lease's). */
        Batch withEpoch(long e) {
            return new Batch(keys, values, from, e, parallelOk, crcs);
        }

        byte[] key(int item) {
            return keys[from + item];
        }

        MemorySegment value(int item) {
            return values.get(from + item);
        }

        int crc(int item) {
            long c = crcs.get(item);
            if (c == 0) {
                c = 1L << 32 | (ObjectLayout.valueCrc(value(item)) & 0xFFFF_FFFFL);
                crcs.set(item, c);
            }
            return (int) c;
        }
    }

    /**
     * Writes the given replica slots to one segment; returns a code per slot. Never throws for node
     * failures.
     *
     * <p>The share is cut into frames (at most {@link PerSegment#MAX_ITEMS_PER_NODE_FRAME} items and
     * the payload limit, and, when the caller's memory may be touched by other threads, into parts of
     * about {@code 1/(2 * lanes)} of the share, at least {@link #MIN_PART_BYTES}), sent by up to
     * {@link #MAX_LANES} threads on as many pooled connections, each frame checksummed by the thread
     * that sends it: the checksums of one frame overlap the sending of another, and the node receives
     * several frames at once. A frame that fails fails only its own slots.
     *
     * <p>A segment mapped into this process takes the same-machine path for each frame
     * (NODE_SHM_WRITE_BEGIN, a memory copy, NODE_SHM_WRITE_END on one connection).
     */
    private ResultCode[] writeToSegment(int segId, List<WriteSlot> slots, Batch b) {
        ResultCode[] codes = new ResultCode[slots.size()];
        Arrays.fill(codes, ResultCode.FAILED);
        SegmentDirectory.Entry seg = segments.resolve(segId);
        if (seg == null) {
            return codes;
        }
        MemorySegment shm = segments.mapping(seg);
        ConnectionPool pool = segments.pool(seg.address());
        long maxBytes = config.limits().maxPayloadBytes();
        int lanes = b.parallelOk ? Math.min(MAX_LANES, config.maxConnections()) : 1;
        if (lanes > 1) {
            long total = 0;
            for (WriteSlot slot : slots) {
                total += b.value(slot.item).byteSize();
            }
            maxBytes = Math.min(maxBytes, Math.max(MIN_PART_BYTES, (total + 2L * lanes - 1) / (2L * lanes)));
        }
        List<int[]> frames = new ArrayList<>();
        for (int start = 0; start < slots.size(); ) {
            int end = PerSegment.frameEnd(slots, start, slot -> b.value(slot.item).byteSize(), maxBytes);
            frames.add(new int[]{start, end});
            start = end;
        }
        tasks.runParts(frames.size(), lanes, f -> {
            int start = frames.get(f)[0];
            int end = frames.get(f)[1];
            if (shm != null) {
                writeShared(seg, pool, shm, slots, start, end, b, codes);
            } else {
                writeOverTcp(seg, pool, slots, start, end, b, codes);
            }
        });
        return codes;
    }

    /**
     * Writes one lease's slots: over TCP as {@link #writeToSegment} does; on the same machine by
     * copying every value into the lease's range (in parallel lanes, each checksumming what it copies)
     * and recording them all with NODE_SHM_LEASE_WRITE on the lease's own node connection, which set
     * the range aside once (NODE_SHM_LEASE). A failure of that connection fails the slots and ends the
     * range (the lease is then released by the caller).
     */
    private ResultCode[] writeLeased(WriteLeasePool.Lease lease, List<WriteSlot> slots, Batch b) {
        SegmentDirectory.Entry seg = segments.resolve(lease.segmentId);
        MemorySegment shm = seg == null ? null : segments.mapping(seg);
        if (shm == null) {
            return writeToSegment(lease.segmentId, slots, b);
        }
        ResultCode[] codes = new ResultCode[slots.size()];
        Arrays.fill(codes, ResultCode.FAILED);
        try {
            if (lease.node == null) {
                FrameConnection c = FrameConnection.connect(seg.address(), config.connectTimeout(), config.limits());
                lease.node = c;
                long from = slots.getFirst().offset;
                BodyWriter w = new BodyWriter(32);
                new NodeMessages.ShmLease(b.epoch, from, lease.end - from).write(w);
                ResultCode set = MasterMessages.Codes.read(c.call(Opcode.NODE_SHM_LEASE, w, config.requestTimeout())
                        .body()).codes().getFirst();
                if (set != ResultCode.OK) {
                    WriteLeasePool.closeNode(lease);
                    Arrays.fill(codes, set);
                    return codes;
                }
            }
            List<int[]> frames = new ArrayList<>();
            long part = Math.max(MIN_PART_BYTES, totalBytes(slots, b) / (2L * MAX_LANES) + 1);
            for (int start = 0; start < slots.size(); ) {
                int end = PerSegment.frameEnd(slots, start, slot -> b.value(slot.item).byteSize(), part);
                frames.add(new int[]{start, end});
                start = end;
            }
            tasks.runParts(frames.size(), b.parallelOk ? Math.min(MAX_LANES, config.maxConnections()) : 1, f -> {
                for (int s = frames.get(f)[0]; s < frames.get(f)[1]; s++) {
                    WriteSlot slot = slots.get(s);
                    SharedSegments.write(shm, slot.offset + ObjectLayout.valueOffset(b.key(slot.item).length),
                            b.value(slot.item));
                    b.crc(slot.item);
                }
            });
            for (int start = 0; start < slots.size(); start += PerSegment.MAX_ITEMS_PER_NODE_FRAME) {
                int end = Math.min(slots.size(), start + PerSegment.MAX_ITEMS_PER_NODE_FRAME);
                BodyWriter w = new BodyWriter(16 + (end - start) * 64);
                frame(slots, start, end, b).write(w);
                List<ResultCode> got = MasterMessages.Codes.read(lease.node.call(Opcode.NODE_SHM_LEASE_WRITE, w,
                        config.requestTimeout()).body()).codes();
                for (int s = start; s < end; s++) {
                    codes[s] = got.get(s - start);
                }
            }
        } catch (IOException | RemoteException e) {
            log.debug("same-machine lease write to {} failed: {}", seg.name(), e.getMessage());
            WriteLeasePool.closeNode(lease);
        }
        return codes;
    }

    private static long totalBytes(List<WriteSlot> slots, Batch b) {
        long total = 0;
        for (WriteSlot slot : slots) {
            total += b.value(slot.item).byteSize();
        }
        return total;
    }

    private NodeMessages.Write frame(List<WriteSlot> slots, int start, int end, Batch b) {
        List<NodeMessages.WriteItem> items = new ArrayList<>(end - start);
        for (int s = start; s < end; s++) {
            WriteSlot slot = slots.get(s);
            items.add(new NodeMessages.WriteItem(slot.offset, slot.generation, b.key(slot.item),
                    b.value(slot.item).byteSize(), b.crc(slot.item)));
        }
        return new NodeMessages.Write(b.epoch, items);
    }

    /** One NODE_WRITE of slots [start, end): the header, then the values straight from the caller's memory. */
    private void writeOverTcp(SegmentDirectory.Entry seg, ConnectionPool pool, List<WriteSlot> slots, int start,
                              int end, Batch b, ResultCode[] codes) {
        NodeMessages.Write frame = frame(slots, start, end, b);
        List<ByteBuffer> views = new ArrayList<>(end - start);
        for (int s = start; s < end; s++) {
            Channels.addViews(views, b.value(slots.get(s).item));
        }
        BodyWriter w = new BodyWriter(16 + (end - start) * 64);
        frame.write(w);
        FrameConnection c = null;
        try {
            c = pool.borrow(config.requestTimeout());
            List<ResultCode> reply = MasterMessages.Codes.read(
                    c.call(Opcode.NODE_WRITE, w, config.requestTimeout(), views.toArray(ByteBuffer[]::new)).body()).codes();
            for (int s = start; s < end; s++) {
                codes[s] = reply.get(s - start);
            }
        } catch (IOException | RemoteException e) {
            log.debug("write to {} failed: {}", seg.name(), e.getMessage());
        } finally {
            if (c != null) {
                pool.release(c);
            }
        }
    }

    /**
     * The same-machine write of slots [start, end): the node admits the writes
     * (NODE_SHM_WRITE_BEGIN), this thread copies the values into the mapped segment, and
     * NODE_SHM_WRITE_END makes them readable, all on one connection. See {@link SharedSegments}.
     */
    private void writeShared(SegmentDirectory.Entry seg, ConnectionPool pool, MemorySegment shm, List<WriteSlot> slots,
                             int start, int end, Batch b, ResultCode[] codes) {
        NodeMessages.Write frame = frame(slots, start, end, b);
        FrameConnection c = null;
        try {
            c = pool.borrow(config.requestTimeout());
            BodyWriter w = new BodyWriter(16 + (end - start) * 64);
            frame.write(w);
            List<ResultCode> begun = MasterMessages.Codes.read(
                    c.call(Opcode.NODE_SHM_WRITE_BEGIN, w, config.requestTimeout()).body()).codes();
            List<NodeMessages.ShmWriteEndItem> ends = new ArrayList<>(end - start);
            int[] endSlots = new int[end - start];
            for (int s = start; s < end; s++) {
                ResultCode r = begun.get(s - start);
                if (r != ResultCode.OK) {
                    codes[s] = r;
                    continue;
                }
                WriteSlot slot = slots.get(s);
                SharedSegments.write(shm, slot.offset + ObjectLayout.valueOffset(b.key(slot.item).length),
                        b.value(slot.item));
                endSlots[ends.size()] = s;
                ends.add(new NodeMessages.ShmWriteEndItem(slot.offset, slot.generation, true));
            }
            if (!ends.isEmpty()) {
                BodyWriter ew = new BodyWriter(16 + ends.size() * 17);
                new NodeMessages.ShmWriteEnd(ends).write(ew);
                List<ResultCode> done = MasterMessages.Codes.read(
                        c.call(Opcode.NODE_SHM_WRITE_END, ew, config.requestTimeout()).body()).codes();
                for (int e = 0; e < ends.size(); e++) {
                    codes[endSlots[e]] = done.get(e);
                }
            }
        } catch (IOException | RemoteException e) {
            // begun writes of a connection that fails are dropped by the node when it closes
            log.debug("same-machine write to {} failed: {}", seg.name(), e.getMessage());
        } finally {
            if (c != null) {
                pool.release(c);
            }
        }
    }
}
