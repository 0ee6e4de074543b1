package io.kvpool.client;

import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.Channels;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.RemoteException;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.NodeMessages;
import io.kvpool.protocol.msg.WriteGrant;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.atomic.AtomicLongArray;

/**
 * Moves a put's values to one segment's node, for either put protocol ({@link ObjectWrites}): over
 * TCP (NODE_WRITE, the values sent from the caller's memory; under a write lease NODE_WRITE_COMMIT,
 * whose node commits them too), or on the node's machine by copying them into the mapped shared segment
 * (per write: NODE_SHM_WRITE_BEGIN and END; under a write lease: NODE_SHM_LEASE once, then the headers
 * stamped in place). A segment's share is cut into frames sent,
 * or copied, by up to {@link #MAX_LANES} threads, each checksumming what it moves. Node failures are
 * result codes, never exceptions.
 */
final class NodeWrites {

    private static final Logger log = LoggerFactory.getLogger(NodeWrites.class);

    /** Most threads and connections one segment's share of a batch is written with. */
    static final int MAX_LANES = 4;
    /** Smallest frame a segment's share is cut into for writing in parallel. */
    static final long MIN_PART_BYTES = 1L << 20;

    private final ClientConfig config;
    private final SegmentAccess segments;
    private final PerSegment tasks;

    NodeWrites(ClientConfig config, SegmentAccess segments, PerSegment tasks) {
        this.config = config;
        this.segments = segments;
        this.tasks = tasks;
    }

    /**
     * One replica write: which item (index within the chunk), which of its replicas, where, which
     * version, and the master's grant that covers it (relayed to the node).
     */
    record Slot(int item, int replica, long offset, long generation, WriteGrant grant) {
    }

    /**
     * What the node writes of one chunk share: keys, values (item j is {@code values.get(from + j)}),
     * the epoch and master term of the reservation, and each value's CRC32C, computed the first time a frame needs it
     * (by the thread that sends that frame; a value with replicas on several segments is checksummed
     * once, or at worst once per racing thread, with the same result).
     */
    static final class Batch {
        final byte[][] keys;
        final List<MemorySegment> values;
        final int from;
        final long epoch;
        final long term;
        /** The master run the reservation was made in ({@link MasterChannel#run}). */
        final int run;
        final boolean parallelOk;
        /** 0: not computed yet; else 1 << 32 | crc. */
        private final AtomicLongArray crcs;

        Batch(byte[][] keys, List<MemorySegment> values, int from, int to, long epoch, long term, int run,
              boolean parallelOk) {
            this(keys, values, from, epoch, term, run, parallelOk, new AtomicLongArray(to - from));
        }

        private Batch(byte[][] keys, List<MemorySegment> values, int from, long epoch, long term, int run,
                      boolean parallelOk, AtomicLongArray crcs) {
            this.keys = keys;
            this.values = values;
            this.from = from;
            this.epoch = epoch;
            this.term = term;
            this.run = run;
            this.parallelOk = parallelOk;
            this.crcs = crcs;
        }

        /** The same items and checksums, written under another reservation (a lease's epoch, term and run). */
        Batch under(long e, long t, int r) {
            return new Batch(keys, values, from, e, t, r, parallelOk, crcs);
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

        /**
         * Copies item {@code item}'s value to {@code at} in {@code shm} and returns its CRC32C, summed during the copy
         * the first time ({@link ObjectLayout#copyWithCrc}: one pass over the value), remembered for its other copies.
         */
        int copy(int item, MemorySegment shm, long at) {
            long c = crcs.get(item);
            if (c != 0) {
                SharedSegments.write(shm, at, value(item));
                return (int) c;
            }
            int crc = SharedSegments.writeSummed(shm, at, value(item));
            crcs.set(item, 1L << 32 | (crc & 0xFFFF_FFFFL));
            return crc;
        }
    }

    /**
     * Writes the given replica slots to one segment; returns a code per slot. Never throws for node
     * failures. All FAILED if the master changed since the reservation: its segment id may name
     * another node now (see {@link SegmentAccess}).
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
    ResultCode[] writeToSegment(int segId, List<Slot> slots, Batch b) {
        ResultCode[] codes = new ResultCode[slots.size()];
        Arrays.fill(codes, ResultCode.FAILED);
        SegmentDirectory.Entry seg = segments.resolve(segId, b.run);
        if (seg == null) {
            return codes;
        }
        MemorySegment shm = segments.mapping(seg);
        ConnectionPool pool = segments.pool(seg.address());
        int lanes = lanes(b);
        List<int[]> frames = frames(slots, b, lanes);
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
     * Writes one lease's slots. Over TCP, slots that fit one frame go in one NODE_WRITE_COMMIT, and the
     * node commits what landed for this client ({@link #writeCommitOverTcp}, version 17); more go as
     * {@link #writeToSegment} sends them, in parallel lanes, and the caller commits. On the same machine by copying
     * every value into the lease's range (in parallel lanes, each checksumming what it copies) and
     * stamping each object's header there itself, COMPLETE last ({@link ObjectLayout#stamp}), in the range
     * its node set aside once for the lease's own connection (NODE_SHM_LEASE). No node exchange per put:
     * the node settles the stamped objects from their headers when anything asks for them (protocol
     * version 16, section 4.28). Before the caller's COMMIT tells the master, the connection is checked:
     * a node that let the range go (it restarted, or it ended the range) closed it first, and then
     * nothing is committed and the slots fail (the caller writes them again under a fresh lease). A node
     * that verifies writes says so when it sets the range aside, and the objects are then recorded with
     * NODE_SHM_LEASE_WRITE instead ({@link #recordLeased}).
     */
    Landed writeLeased(WriteLeasePool.Lease lease, List<Slot> slots, Batch b, boolean upsert) {
        // b.run is the lease's: a lease of the previous master writes nothing (its id may name another node)
        SegmentDirectory.Entry seg = segments.resolve(lease.segmentId, b.run);
        ResultCode[] codes = new ResultCode[slots.size()];
        Arrays.fill(codes, ResultCode.FAILED);
        if (seg == null) {
            return new Landed(codes, null);
        }
        MemorySegment shm = segments.mapping(seg);
        if (shm == null) {
            if (frames(slots, b, lanes(b)).size() == 1) {
                return writeCommitOverTcp(seg, lease, slots, b, upsert);
            }
            return new Landed(writeToSegment(lease.segmentId, slots, b), null);
        }
        return new Landed(writeStamped(seg, shm, lease, slots, b), null);
    }

    /** The same-machine half of {@link #writeLeased}: a code per slot. */
    private ResultCode[] writeStamped(SegmentDirectory.Entry seg, MemorySegment shm, WriteLeasePool.Lease lease,
                                      List<Slot> slots, Batch b) {
        ResultCode[] codes = new ResultCode[slots.size()];
        Arrays.fill(codes, ResultCode.FAILED);
        try {
            ResultCode set = holdLeaseRange(seg, lease, slots.getFirst().offset);
            if (set != ResultCode.OK) {
                Arrays.fill(codes, set);
                return codes;
            }
            List<int[]> frames = new ArrayList<>();
            long part = Math.max(MIN_PART_BYTES, totalBytes(slots, b) / (2L * MAX_LANES) + 1);
            for (int start = 0; start < slots.size(); ) {
                int end = PerSegment.frameEnd(slots, start, slot -> b.value(slot.item).byteSize(), part);
                frames.add(new int[]{start, end});
                start = end;
            }
            boolean stamps = lease.stamps;
            tasks.runParts(frames.size(), b.parallelOk ? Math.min(MAX_LANES, config.maxConnections()) : 1, f -> {
                for (int s = frames.get(f)[0]; s < frames.get(f)[1]; s++) {
                    Slot slot = slots.get(s);
                    byte[] key = b.key(slot.item);
                    int crc = b.copy(slot.item, shm, slot.offset + ObjectLayout.valueOffset(key.length));
                    if (stamps) {
                        ObjectLayout.stamp(shm, slot.offset, key, b.value(slot.item).byteSize(), slot.generation,
                                b.epoch, crc);
                    }
                }
            });
            if (!stamps) {
                // a node that verifies writes checks each value before it becomes readable: recorded, not stamped
                for (int start = 0; start < slots.size(); start += PerSegment.MAX_ITEMS_PER_NODE_FRAME) {
                    int end = Math.min(slots.size(), start + PerSegment.MAX_ITEMS_PER_NODE_FRAME);
                    List<ResultCode> got = recordLeased(lease, frame(slots, start, end, b));
                    for (int s = start; s < end; s++) {
                        codes[s] = got.get(s - start);
                    }
                }
                return codes;
            }
            if (lease.node.peerClosed()) {
                log.debug("the node of segment {} let lease {}'s range go before its commit", seg.name(), lease.id);
                WriteLeasePool.closeNode(lease);
                return codes;
            }
            Arrays.fill(codes, ResultCode.OK);
        } catch (IOException | RemoteException e) {
            log.debug("same-machine lease write to {} failed: {}", seg.name(), e.getMessage());
            WriteLeasePool.closeNode(lease);
        }
        return codes;
    }

    /**
     * Sets the unwritten range of a same-machine lease aside on its node, from {@code from} to the
     * lease's end (NODE_SHM_LEASE, on a connection of the lease's own), unless the lease holds its
     * range already. OK, or the node's refusal (the connection then closed).
     */
    ResultCode holdLeaseRange(SegmentDirectory.Entry seg, WriteLeasePool.Lease lease, long from) throws IOException {
        if (lease.node != null) {
            return ResultCode.OK;
        }
        FrameConnection c = FrameConnection.connect(seg.address(), config.connectTimeout(), config.limits(),
                config.secrets());
        lease.node = c;
        BodyWriter w = new BodyWriter(32);
        new NodeMessages.ShmLease(lease.epoch, lease.term, from, lease.end - from, lease.grant).write(w);
        NodeMessages.ShmLeaseReply set = NodeMessages.ShmLeaseReply.read(
                c.call(Opcode.NODE_SHM_LEASE, w, config.requestTimeout()).body());
        lease.stamps = set.stamps();
        if (set.code() != ResultCode.OK) {
            WriteLeasePool.closeNode(lease);
        }
        return set.code();
    }

    /**
     * Records objects copied into a lease's range on its node (NODE_SHM_LEASE_WRITE on the lease's
     * connection; at most {@link PerSegment#MAX_ITEMS_PER_NODE_FRAME} items): a code per item. Puts in
     * parts record their objects this way; whole puts stamp them ({@link #writeLeased}).
     */
    List<ResultCode> recordLeased(WriteLeasePool.Lease lease, NodeMessages.Write items) throws IOException {
        BodyWriter w = new BodyWriter(16 + items.items().size() * 64);
        items.write(w);
        return MasterMessages.Codes.read(lease.node.call(Opcode.NODE_SHM_LEASE_WRITE, w, config.requestTimeout())
                .body()).codes();
    }

    /**
     * What a lease's writes came to: a write code per slot and, when its node committed the slots that
     * landed for this client (NODE_WRITE_COMMIT), the master's COMMIT code for each of them in slot order;
     * null when the caller commits.
     */
    record Landed(ResultCode[] written, List<ResultCode> committed) {
    }

    /** The lanes a batch's writes to one segment go in: one when the caller's memory must stay on this thread. */
    private int lanes(Batch b) {
        return b.parallelOk ? Math.min(MAX_LANES, config.maxConnections()) : 1;
    }

    /**
     * The frames [start, end) a segment's share of a batch goes in: split at the payload and item limits
     * and, with several lanes, into parts of about {@code 1/(2 * lanes)} of the share, at least
     * {@link #MIN_PART_BYTES}.
     */
    private List<int[]> frames(List<Slot> slots, Batch b, int lanes) {
        long maxBytes = config.limits().maxPayloadBytes();
        if (lanes > 1) {
            long total = totalBytes(slots, b);
            maxBytes = Math.min(maxBytes, Math.max(MIN_PART_BYTES, (total + 2L * lanes - 1) / (2L * lanes)));
        }
        List<int[]> frames = new ArrayList<>();
        for (int start = 0; start < slots.size(); ) {
            int end = PerSegment.frameEnd(slots, start, slot -> b.value(slot.item).byteSize(), maxBytes);
            frames.add(new int[]{start, end});
            start = end;
        }
        return frames;
    }

    /**
     * A lease's slots over TCP in one NODE_WRITE_COMMIT (protocol version 17): the values, after which the
     * node commits what landed at its master for this client and answers with the master's codes. A node
     * that did not ask its master (it says so) leaves the COMMIT to the caller; a failed exchange fails every
     * slot, and the caller then writes them once more under a fresh lease, as after a failed NODE_WRITE.
     */
    private Landed writeCommitOverTcp(SegmentDirectory.Entry seg, WriteLeasePool.Lease lease, List<Slot> slots,
                                      Batch b, boolean upsert) {
        ResultCode[] codes = new ResultCode[slots.size()];
        Arrays.fill(codes, ResultCode.FAILED);
        List<ByteBuffer> views = new ArrayList<>(slots.size());
        for (Slot slot : slots) {
            Channels.addViews(views, b.value(slot.item));
        }
        BodyWriter w = new BodyWriter(32 + slots.size() * 64);
        new NodeMessages.WriteCommit(lease.id, upsert, lease.segmentId, frame(slots, 0, slots.size(), b)).write(w);
        ConnectionPool pool = segments.pool(seg.address());
        FrameConnection c = null;
        try {
            c = pool.borrow(config.requestTimeout());
            NodeMessages.WriteCommitReply reply = NodeMessages.WriteCommitReply.read(c.call(Opcode.NODE_WRITE_COMMIT, w,
                    config.requestTimeout(), views.toArray(ByteBuffer[]::new)).body());
            if (reply.written().size() != slots.size()) {
                throw new IOException("node_write_commit reply has " + reply.written().size() + " results for "
                        + slots.size() + " items");
            }
            List<ResultCode> committed = null;
            if (reply.committed()) {
                committed = new ArrayList<>(slots.size());
            }
            for (int s = 0; s < slots.size(); s++) {
                codes[s] = reply.written().get(s);
                if (committed != null && codes[s] == ResultCode.OK) {
                    committed.add(reply.commit().get(s));
                }
            }
            return new Landed(codes, committed);
        } catch (IOException | RemoteException e) {
            log.debug("write and commit to {} failed: {}", seg.name(), e.getMessage());
            Arrays.fill(codes, ResultCode.FAILED);
            return new Landed(codes, null);
        } finally {
            if (c != null) {
                pool.release(c);
            }
        }
    }

    private static long totalBytes(List<Slot> slots, Batch b) {
        long total = 0;
        for (Slot slot : slots) {
            total += b.value(slot.item).byteSize();
        }
        return total;
    }

    private NodeMessages.Write frame(List<Slot> slots, int start, int end, Batch b) {
        List<NodeMessages.WriteItem> items = new ArrayList<>(end - start);
        for (int s = start; s < end; s++) {
            Slot slot = slots.get(s);
            items.add(new NodeMessages.WriteItem(slot.offset, slot.generation, b.key(slot.item),
                    b.value(slot.item).byteSize(), b.crc(slot.item), slot.grant));
        }
        return new NodeMessages.Write(b.epoch, b.term, items);
    }

    /** One NODE_WRITE of slots [start, end): the header, then the values straight from the caller's memory. */
    private void writeOverTcp(SegmentDirectory.Entry seg, ConnectionPool pool, List<Slot> slots, int start,
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
    private void writeShared(SegmentDirectory.Entry seg, ConnectionPool pool, MemorySegment shm, List<Slot> slots,
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
                Slot slot = slots.get(s);
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
