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
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The node side of a put in parts ({@link PutInParts}): one connection per segment, held from the
 * begin to the end, because the node ties the writes begun with NODE_PART_BEGIN to the connection
 * that began them (docs/protocol.md, section 4.35). Parts for a segment on this host are copied into
 * the mapped segment at once, by the calling thread; parts for other segments go as NODE_PART_WRITE
 * frames on that connection, from the caller's memory (no staging copy), one frame per call and node
 * (split at the payload and item limits), one call at a time per node. Those frames are pipelined
 * (docs/protocol.md, section 1.2): a write returns once its frame is on the socket, not after the
 * node's answer, so layer l+1's part follows layer l's without a round trip between them; up to
 * {@link #PIPELINED_WRITES} frames ({@link #PIPELINED_PARTS} parts) are unanswered at once, and the
 * answers (a part the node refused fails its copy) are taken as the window fills and before the end.
 *
 * <h2>Same-machine copies under a write lease</h2>
 * A copy placed in a write lease on a segment mapped here goes without any part frame: the lease's
 * unwritten range is set aside on the node for the lease's own connection (NODE_SHM_LEASE, once per
 * lease, as for whole puts; {@link NodeWrites#holdLeaseRange}), parts are copied into it, and the end
 * records the complete objects with their checksums (NODE_SHM_LEASE_WRITE). So a put in parts on the
 * same machine costs no node exchange per part, and one at the end.
 *
 * <h2>Copies into a mapped segment</h2>
 * Before each copy the object's header must still say WRITING with this copy's generation: the node
 * stamped it so at the begin, and marks it DEAD when it drops the write (a reset, or the connection
 * lost, after which it may admit another writer there). A copy whose header says otherwise is not
 * made and the copy is failed. What remains is the window between that check and the end of the
 * memory copy, the same as for NODE_SHM_WRITE_BEGIN and END.
 *
 * <p>Node failures are outcomes of the copies, never exceptions: a refused part, or a connection
 * that fails (then every copy on it), fails those copies, and the end reports it.
 */
final class PartCopies {

    private static final Logger log = LoggerFactory.getLogger(PartCopies.class);

    /**
     * Most NODE_PART_WRITE frames unanswered on one connection, and most parts in them. An answer is
     * a 36-byte frame and a byte a part, so at these bounds the answers not yet read take at most
     * about 19 KiB, well inside a socket's buffers: the node never stalls writing an answer while this
     * side is still writing parts (which would stall both).
     */
    static final int PIPELINED_WRITES = 64;
    static final int PIPELINED_PARTS = 16_384;

    /** One copy of one item: where it is reserved, under what, and how its write stands. */
    static final class Copy {
        final int item;
        final int replica;
        final int segmentId;
        /** The master run of the reservation ({@link MasterChannel#run}). */
        final int run;
        final long epoch;
        final long term;
        final long offset;
        final long generation;
        final WriteGrant grant;
        final byte[] key;
        final long valueLength;
        /** The write lease the copy is placed in, or null (a PUT_START reservation). */
        final WriteLeasePool.Lease lease;
        Session session;
        /** Set when the copy goes into its lease's range held on a mapped segment (no part frames). */
        LeaseHold hold;
        /** Whether the node began this write on the session's connection (it must be ended there). */
        boolean begun;
        /** OK while the write stands; the first refusal or failure otherwise. FAILED until begun. */
        volatile ResultCode outcome = ResultCode.FAILED;

        Copy(int item, int replica, int segmentId, int run, long epoch, long term, long offset, long generation,
             WriteGrant grant, byte[] key, long valueLength, WriteLeasePool.Lease lease) {
            this.item = item;
            this.replica = replica;
            this.segmentId = segmentId;
            this.run = run;
            this.epoch = epoch;
            this.term = term;
            this.offset = offset;
            this.generation = generation;
            this.grant = grant;
            this.key = key;
            this.valueLength = valueLength;
            this.lease = lease;
        }

        boolean alive() {
            return outcome == ResultCode.OK;
        }

        void fail(ResultCode code) {
            if (outcome == ResultCode.OK) {
                outcome = code == ResultCode.OK ? ResultCode.FAILED : code;
            }
        }

        long valueAt() {
            return offset + ObjectLayout.valueOffset(key.length);
        }
    }

    /** One part to send: the copy, where in its value, and the bytes. */
    record Part(Copy copy, long rangeOffset, MemorySegment src) {
    }

    /** A segment's connection, held for the whole put. */
    static final class Session {
        final SegmentDirectory.Entry segment;
        final ConnectionPool pool;
        /** The segment mapped into this process, or null (parts over TCP). */
        final MemorySegment shm;
        final ReentrantLock lock = new ReentrantLock();
        final List<Copy> copies = new ArrayList<>();
        FrameConnection connection;
        /** The parts of each NODE_PART_WRITE sent on {@link #connection} and not answered yet, oldest first. */
        final ArrayDeque<List<Part>> unanswered = new ArrayDeque<>();
        /** Parts in {@link #unanswered}. */
        int unansweredParts;

        Session(SegmentDirectory.Entry segment, ConnectionPool pool, MemorySegment shm) {
            this.segment = segment;
            this.pool = pool;
            this.shm = shm;
        }
    }

    /** A same-machine lease's range held on its node, and the copies placed in it, in order. */
    static final class LeaseHold {
        final WriteLeasePool.Lease lease;
        final List<Copy> copies = new ArrayList<>();
        final ReentrantLock lock = new ReentrantLock();

        LeaseHold(WriteLeasePool.Lease lease) {
            this.lease = lease;
        }
    }

    private final ClientConfig config;
    private final SegmentAccess segments;
    private final PerSegment tasks;
    private final NodeWrites nodes;
    private final Map<Integer, Session> sessions = new LinkedHashMap<>();
    private final Map<Long, LeaseHold> holds = new LinkedHashMap<>();

    PartCopies(ClientConfig config, SegmentAccess segments, PerSegment tasks, NodeWrites nodes) {
        this.config = config;
        this.segments = segments;
        this.tasks = tasks;
        this.nodes = nodes;
    }

    /**
     * Opens a session per segment and begins every copy there (NODE_PART_BEGIN); each copy's outcome
     * is then OK or why not. A copy of a segment that cannot be resolved in its master run fails.
     */
    void begin(List<Copy> copies) {
        Map<Integer, List<Copy>> bySegment = new LinkedHashMap<>();
        for (Copy c : copies) {
            bySegment.computeIfAbsent(c.segmentId, x -> new ArrayList<>()).add(c);
        }
        for (Map.Entry<Integer, List<Copy>> e : bySegment.entrySet()) {
            Copy first = e.getValue().getFirst();
            SegmentDirectory.Entry seg = segments.resolve(e.getKey(), first.run);
            if (seg == null) {
                continue; // the master changed since the reservation: those copies fail
            }
            Session s = new Session(seg, segments.pool(seg.address()), segments.mapping(seg));
            for (Copy c : e.getValue()) {
                c.session = s;
                if (c.lease != null && s.shm != null) {
                    c.hold = holds.computeIfAbsent(c.lease.id, id -> new LeaseHold(c.lease));
                    c.hold.copies.add(c);
                } else {
                    s.copies.add(c);
                }
            }
            if (!s.copies.isEmpty()) {
                sessions.put(e.getKey(), s);
            }
        }
        tasks.run(new LinkedHashMap<>(sessionsBySegment()), true, (segId, one) -> beginOn(one.getFirst()));
        for (LeaseHold h : holds.values()) {
            hold(h);
        }
    }

    /** Sets the lease's unwritten range aside on its node for the copies placed in it (from the first). */
    private void hold(LeaseHold h) {
        Copy first = h.copies.getFirst();
        ResultCode code;
        try {
            code = nodes.holdLeaseRange(first.session.segment, h.lease, first.offset);
        } catch (IOException | RemoteException e) {
            log.debug("put in parts: setting lease {} aside on {} failed: {}", h.lease.id, first.session.segment.name(),
                    e.getMessage());
            WriteLeasePool.closeNode(h.lease);
            code = ResultCode.FAILED;
        }
        for (Copy c : h.copies) {
            c.outcome = code;
        }
    }

    private Map<Integer, List<Session>> sessionsBySegment() {
        Map<Integer, List<Session>> out = new LinkedHashMap<>();
        sessions.forEach((id, s) -> out.put(id, List.of(s)));
        return out;
    }

    private void beginOn(Session s) {
        s.lock.lock();
        try {
            s.connection = s.pool.borrow(config.requestTimeout());
            for (int start = 0; start < s.copies.size(); start += PerSegment.MAX_ITEMS_PER_NODE_FRAME) {
                int end = Math.min(s.copies.size(), start + PerSegment.MAX_ITEMS_PER_NODE_FRAME);
                // one epoch and term per frame: copies of other reservations (another lease) go in their own
                int cut = start;
                while (cut < end) {
                    Copy head = s.copies.get(cut);
                    int to = cut;
                    List<NodeMessages.WriteItem> items = new ArrayList<>();
                    while (to < end && s.copies.get(to).epoch == head.epoch && s.copies.get(to).term == head.term) {
                        Copy c = s.copies.get(to);
                        items.add(new NodeMessages.WriteItem(c.offset, c.generation, c.key, c.valueLength, 0, c.grant));
                        to++;
                    }
                    BodyWriter w = new BodyWriter(32 + items.size() * 128);
                    new NodeMessages.Write(head.epoch, head.term, items).write(w);
                    List<ResultCode> codes = MasterMessages.Codes.read(
                            s.connection.call(Opcode.NODE_PART_BEGIN, w, config.requestTimeout()).body()).codes();
                    for (int i = cut; i < to; i++) {
                        Copy c = s.copies.get(i);
                        c.begun = codes.get(i - cut) == ResultCode.OK;
                        c.outcome = codes.get(i - cut);
                    }
                    cut = to;
                }
            }
        } catch (IOException | RemoteException e) {
            broken(s, "begin", e);
        } finally {
            s.lock.unlock();
        }
    }

    /**
     * Writes part k ({@code srcs.get(k)} at {@code offsets[k]}) to each of {@code targets.get(k)} and
     * returns each part's CRC32C: the parts are checksummed, and copied into segments mapped here, by
     * up to {@link NodeWrites#MAX_LANES} threads, one a MiB, when the caller's memory allows it (each lane reads a
     * part once for both); then the parts for other nodes go as one NODE_PART_WRITE per session (or
     * more, at the payload and item limits), sessions in parallel. Copies that are not alive are skipped.
     */
    int[] write(long[] offsets, List<MemorySegment> srcs, List<List<Copy>> targets, boolean parallelOk) {
        int n = srcs.size();
        int[] crcs = new int[n];
        Map<Integer, List<Part>> overTcp = new LinkedHashMap<>();
        for (int k = 0; k < n; k++) {
            for (Copy c : targets.get(k)) {
                if (c.alive() && srcs.get(k).byteSize() > 0 && c.session.shm == null) {
                    overTcp.computeIfAbsent(c.segmentId, x -> new ArrayList<>()).add(new Part(c, offsets[k], srcs.get(k)));
                }
            }
        }
        long bytes = 0;
        for (MemorySegment src : srcs) {
            bytes += src.byteSize();
        }
        // a lane per MiB at most: handing a few KiB of checksumming to another thread costs more than it saves
        int lanes = parallelOk ? (int) Math.min(Math.min(NodeWrites.MAX_LANES, config.maxConnections()),
                Math.max(1, bytes / NodeWrites.MIN_PART_BYTES)) : 1;
        int chunks = Math.min(n, 4 * lanes);
        tasks.runParts(chunks, lanes, chunk -> {
            for (int k = (int) ((long) n * chunk / chunks); k < (long) n * (chunk + 1) / chunks; k++) {
                MemorySegment src = srcs.get(k);
                crcs[k] = src.byteSize() == 0 ? 0 : ObjectLayout.valueCrc(src);
                for (Copy c : targets.get(k)) {
                    if (c.alive() && src.byteSize() > 0 && c.session.shm != null) {
                        copy(c, offsets[k], src);
                    }
                }
            }
        });
        if (!overTcp.isEmpty()) {
            tasks.run(overTcp, parallelOk, (segId, list) -> sendParts(sessions.get(segId), list));
        }
        return crcs;
    }

    /** A part into a segment mapped here: into the lease's held range, or a region begun and still ours. */
    private static void copy(Copy c, long rangeOffset, MemorySegment src) {
        MemorySegment shm = c.session.shm;
        if (c.hold == null && !stillOurs(shm, c)) {
            c.fail(ResultCode.FENCED);
            return;
        }
        SharedSegments.write(shm, c.valueAt() + rangeOffset, src);
    }

    /** Whether the header of the copy's region still says that this write is in progress there. */
    private static boolean stillOurs(MemorySegment shm, Copy c) {
        return ObjectLayout.state(shm, c.offset) == ObjectLayout.STATE_WRITING
                && ObjectLayout.generation(shm, c.offset) == c.generation;
    }

    private void sendParts(Session s, List<Part> parts) {
        s.lock.lock();
        try {
            if (s.connection == null) {
                parts.forEach(p -> p.copy.fail(ResultCode.FAILED));
                return;
            }
            long maxBytes = config.limits().maxPayloadBytes();
            for (int start = 0; start < parts.size(); ) {
                int end = PerSegment.frameEnd(parts, start, p -> p.src.byteSize(), maxBytes);
                List<NodeMessages.PartItem> items = new ArrayList<>(end - start);
                List<ByteBuffer> views = new ArrayList<>(end - start);
                for (int i = start; i < end; i++) {
                    Part p = parts.get(i);
                    items.add(new NodeMessages.PartItem(p.copy.offset, p.copy.generation, p.rangeOffset,
                            p.src.byteSize()));
                    Channels.addViews(views, p.src);
                }
                BodyWriter w = new BodyWriter(16 + items.size() * NodeMessages.PartWrite.ITEM_BYTES);
                new NodeMessages.PartWrite(items).write(w);
                while (!s.unanswered.isEmpty() && (s.unanswered.size() >= PIPELINED_WRITES
                        || s.unansweredParts + (end - start) > PIPELINED_PARTS)) {
                    answered(s);
                }
                // pipelined: the next part (the next layer) goes without waiting for this one's answer
                s.connection.send(Opcode.NODE_PART_WRITE, w, config.requestTimeout(), views.toArray(ByteBuffer[]::new));
                s.unanswered.addLast(parts.subList(start, end));
                s.unansweredParts += end - start;
                start = end;
            }
        } catch (IOException | RemoteException e) {
            broken(s, "part write", e);
        } finally {
            s.lock.unlock();
        }
    }

    /** Takes the oldest unanswered NODE_PART_WRITE's answer: its refused parts fail. Caller holds the session's lock. */
    private void answered(Session s) throws IOException {
        List<Part> parts = s.unanswered.pollFirst();
        s.unansweredParts -= parts.size();
        List<ResultCode> codes = MasterMessages.Codes.read(s.connection.receive(config.requestTimeout()).body()).codes();
        if (codes.size() != parts.size()) {
            throw new IOException(s.segment.name() + " answered " + codes.size() + " codes to a part write of "
                    + parts.size() + " parts");
        }
        for (int i = 0; i < parts.size(); i++) {
            if (codes.get(i) != ResultCode.OK) {
                parts.get(i).copy.fail(codes.get(i));
            }
        }
    }

    /**
     * Ends every copy still alive (NODE_PART_END with its item's checksum, and whether all of the
     * item was written) and returns the connections to their pools. Copies that failed before are
     * ended as not written, so the node drops them at once. Each copy's outcome is then final.
     */
    void end(int[] crcs, boolean[] complete) {
        tasks.run(sessionsBySegment(), true, (segId, one) -> endOn(one.getFirst(), crcs, complete));
        for (LeaseHold h : holds.values()) {
            record(h, crcs, complete);
        }
    }

    /**
     * Records the complete copies placed in a held lease range (NODE_SHM_LEASE_WRITE, in placement
     * order); an incomplete one is left out, and fails.
     */
    private void record(LeaseHold h, int[] crcs, boolean[] complete) {
        h.lock.lock();
        try {
            List<Copy> done = new ArrayList<>();
            for (Copy c : h.copies) {
                if (c.alive() && complete[c.item]) {
                    done.add(c);
                } else {
                    c.fail(ResultCode.FAILED);
                }
            }
            for (int start = 0; start < done.size() && h.lease.node != null;
                 start += PerSegment.MAX_ITEMS_PER_NODE_FRAME) {
                int end = Math.min(done.size(), start + PerSegment.MAX_ITEMS_PER_NODE_FRAME);
                List<NodeMessages.WriteItem> items = new ArrayList<>(end - start);
                for (Copy c : done.subList(start, end)) {
                    items.add(new NodeMessages.WriteItem(c.offset, c.generation, c.key, c.valueLength, crcs[c.item],
                            c.grant));
                }
                List<ResultCode> codes = nodes.recordLeased(h.lease,
                        new NodeMessages.Write(h.lease.epoch, h.lease.term, items));
                for (int i = start; i < end; i++) {
                    done.get(i).outcome = codes.get(i - start);
                }
            }
            if (h.lease.node == null) {
                done.forEach(c -> c.fail(ResultCode.FAILED));
            } else if (done.size() < h.copies.size() || done.stream().anyMatch(c -> c.outcome != ResultCode.OK)) {
                // a copy left out is a gap in the range, and a refusal may mean the node let the range go without
                // closing the connection: the objects whole puts stamp after either would be settled by no one
                // (the walk stops at the first header that is not an object), so the range ends here
                WriteLeasePool.closeNode(h.lease);
            }
        } catch (IOException | RemoteException e) {
            log.debug("put in parts: recording lease {} failed: {}", h.lease.id, e.getMessage());
            WriteLeasePool.closeNode(h.lease);
            h.copies.forEach(c -> c.fail(ResultCode.FAILED));
        } finally {
            h.lock.unlock();
        }
    }

    private void endOn(Session s, int[] crcs, boolean[] complete) {
        s.lock.lock();
        try {
            if (s.connection == null) {
                return;
            }
            while (!s.unanswered.isEmpty()) {
                answered(s);
            }
            List<Copy> begun = new ArrayList<>();
            List<NodeMessages.PartEndItem> items = new ArrayList<>();
            for (Copy c : s.copies) {
                if (c.begun) { // failed since or not, its region is held for this connection until ended
                    begun.add(c);
                    items.add(new NodeMessages.PartEndItem(c.offset, c.generation, crcs[c.item],
                            complete[c.item] && c.alive()));
                }
            }
            for (int start = 0; start < items.size(); start += PerSegment.MAX_ITEMS_PER_NODE_FRAME) {
                int end = Math.min(items.size(), start + PerSegment.MAX_ITEMS_PER_NODE_FRAME);
                BodyWriter w = new BodyWriter(16 + (end - start) * NodeMessages.PartEnd.ITEM_BYTES);
                new NodeMessages.PartEnd(items.subList(start, end)).write(w);
                List<ResultCode> codes = MasterMessages.Codes.read(
                        s.connection.call(Opcode.NODE_PART_END, w, config.requestTimeout()).body()).codes();
                for (int i = start; i < end; i++) {
                    Copy c = begun.get(i);
                    ResultCode code = codes.get(i - start);
                    if (c.alive()) {
                        c.outcome = code == ResultCode.OK && !complete[c.item] ? ResultCode.FAILED : code;
                    }
                }
            }
            s.pool.release(s.connection);
            s.connection = null;
        } catch (IOException | RemoteException e) {
            broken(s, "end", e);
        } finally {
            s.lock.unlock();
        }
    }

    /**
     * Drops every write (the put is abandoned): closing the connections makes the nodes drop what was
     * begun on them, so nothing becomes readable.
     */
    void abandon() {
        for (Session s : sessions.values()) {
            s.lock.lock();
            try {
                for (Copy c : s.copies) {
                    c.fail(ResultCode.FAILED);
                }
                discard(s);
            } finally {
                s.lock.unlock();
            }
        }
    }

    /** A session's connection failed: every copy on it fails, and the node drops their writes. */
    private void broken(Session s, String what, Exception e) {
        log.debug("put in parts: {} on {} failed: {}", what, s.segment.name(), e.getMessage());
        for (Copy c : s.copies) {
            c.fail(ResultCode.FAILED);
        }
        discard(s);
    }

    private static void discard(Session s) {
        FrameConnection c = s.connection;
        s.connection = null;
        s.unanswered.clear();
        s.unansweredParts = 0;
        if (c != null) {
            try {
                c.close();
            } catch (IOException ignored) {
                // the node drops the writes begun on it either way
            }
            s.pool.release(c);
        }
    }
}
