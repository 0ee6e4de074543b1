package io.kvpool.node;

import io.kvpool.protocol.BadRequestException;
import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Request;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.MasterMessages.Codes;
import io.kvpool.protocol.msg.NodeMessages;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Writes by clients on this machine, which copy values into the shared segment themselves: the node
 * only admits the space and records the objects. Two forms (docs/protocol.md, sections 4.23 and 4.28):
 *
 * <ul>
 *   <li><b>Per write</b>: NODE_SHM_WRITE_BEGIN admits each object's region as NODE_WRITE would and
 *       stamps its header; the client copies; NODE_SHM_WRITE_END makes it readable.</li>
 *   <li><b>Per lease</b>: NODE_SHM_LEASE admits the unwritten rest of the client's write lease once, as
 *       one range no read can name ({@link RegionLedger.LeaseRange}); the client copies any number of
 *       values into it. It then either stamps each object's header itself and tells only the master
 *       (version 16: the ledger settles the stamped objects from their headers when anything asks about
 *       that space), or records them with NODE_SHM_LEASE_WRITE (puts in parts do), carving them from the
 *       front of the range ({@link RegionLedger#carve}). So a whole put costs the copy and its COMMIT, and
 *       the admission (waiting for readers of space freed earlier) happens once per lease.</li>
 * </ul>
 *
 * Both are tied to the writer's connection: when it closes, what was begun and not ended is dropped
 * (never readable), and the lease range is settled and the rest of it let go. The server sends its FIN
 * before it tells this class, and a writer checks its connection after stamping and before its COMMIT
 * ({@code FrameConnection.peerClosed}): so an object committed at the master was stamped before the
 * range was settled for the last time. The space a lease range holds is the writer's at the master
 * until it releases the lease, so nothing else is placed there meanwhile; a writer that stalls past its
 * lease's expiry holds the node's admission of that space until its connection closes, and writes
 * placed there wait (bounded by the region wait) and fail as values.
 */
final class SameMachineWrites {

    private final LocalSegment node;
    private final RegionLedger ledger;
    private final MemorySegment segment;
    private final NodeConfig config;
    /** Writes begun with NODE_SHM_WRITE_BEGIN and not yet ended, by connection (peer) and generation. */
    private final Map<String, Map<Long, RegionLedger.Region>> begun = new ConcurrentHashMap<>();
    /** The master term of each connection's latest NODE_SHM_WRITE_BEGIN: its END is refused once a newer term is known. */
    private final Map<String, Long> beginTerms = new ConcurrentHashMap<>();
    /** The lease range each connection holds, by connection (peer). */
    private final Map<String, RegionLedger.LeaseRange> leases = new ConcurrentHashMap<>();

    SameMachineWrites(LocalSegment node, NodeConfig config) {
        this.node = node;
        this.ledger = node.ledger();
        this.segment = node.segment();
        this.config = config;
    }

    /**
     * NODE_SHM_WRITE_BEGIN: admits writes exactly as NODE_WRITE does (waiting for readers of the space,
     * fencing old epochs) and stamps their headers, but the client then copies the values into the
     * shared segment itself. The regions stay "being written" until NODE_SHM_WRITE_END from the same
     * connection, or until that connection closes (then they are dropped).
     */
    void begin(Request req) throws IOException {
        node.requireShared();
        BodyReader body = req.body();
        NodeMessages.Write w = NodeMessages.Write.read(body);
        body.end("node_shm_write_begin");
        node.checkWrites(req.access(), w);
        if (!node.currentTerm(w.term())) {
            reply(req, deposed(w.items().size()));
            return;
        }
        if (!node.gate().enter()) {
            refuse(req, w.items().size());
            return;
        }
        try {
            beginTerms.put(req.peer(), w.term());
            Map<Long, RegionLedger.Region> open = begun.computeIfAbsent(req.peer(), p -> new ConcurrentHashMap<>());
            reply(req, node.admitHeld(w, (it, region) -> {
                RegionLedger.Region previous = open.put(it.generation(), region);
                if (previous != null) {
                    ledger.endWrite(previous, false);
                }
            }));
        } finally {
            node.gate().exit();
        }
    }

    /** NODE_SHM_WRITE_END: completes (or abandons) writes this connection began. */
    void end(Request req) throws IOException {
        BodyReader body = req.body();
        NodeMessages.ShmWriteEnd end = NodeMessages.ShmWriteEnd.read(body);
        body.end("node_shm_write_end");
        Map<Long, RegionLedger.Region> open = begun.getOrDefault(req.peer(), Map.of());
        // a master of a newer term took over since the begin: what the old one placed is not made readable
        boolean current = node.currentTerm(beginTerms.getOrDefault(req.peer(), 0L));
        // a registration or a stop that gave up waiting for this write: it is not made readable either
        boolean admitted = node.gate().carryOn();
        List<ResultCode> codes = new ArrayList<>(end.items().size());
        try {
            for (NodeMessages.ShmWriteEndItem it : end.items()) {
                codes.add(endOne(open, it, current, admitted));
            }
        } finally {
            if (admitted) {
                node.gate().exit();
            }
        }
        reply(req, codes);
    }

    /** One item of NODE_SHM_WRITE_END. */
    private ResultCode endOne(Map<Long, RegionLedger.Region> open, NodeMessages.ShmWriteEndItem it, boolean current,
                              boolean admitted) {
        RegionLedger.Region r = open.get(it.generation());
        if (r == null || r.offset != it.offset()) {
            return ResultCode.NOT_FOUND;
        }
        open.remove(it.generation());
        if (!current || !admitted) {
            ledger.endWrite(r, false);
            node.refusedWrite();
            return current ? ResultCode.NO_SEGMENT : ResultCode.DEPOSED;
        }
        boolean ok = it.copied() && crcHolds(r.valueOffset(), r.valueLength, storedCrc(r.offset));
        if (node.gate().endWrite(r, ok)) {
            node.wrote(r.valueLength);
            return ResultCode.OK;
        }
        return ledger.epoch() > r.epoch ? ResultCode.FENCED : ResultCode.FAILED;
    }

    /**
     * NODE_SHM_LEASE: sets {@code [offset, offset + length)} aside for this connection's lease writes,
     * ending any lease range the connection held before. One code: OK, FENCED (an older epoch than
     * the node's), or FAILED (the space stayed busy for the whole region wait); and whether the writer
     * may stamp its objects ({@link #leaseReply}).
     */
    void lease(Request req) throws IOException {
        node.requireShared();
        BodyReader body = req.body();
        NodeMessages.ShmLease l = NodeMessages.ShmLease.read(body);
        body.end("node_shm_lease");
        node.checkRegion(l.offset(), l.length(), -1);
        if (l.length() == 0) {
            throw new BadRequestException("node_shm_lease of 0 bytes at offset " + l.offset());
        }
        node.checkGrant(req.access(), l.term(), l.offset(), l.length(), l.grant().firstGeneration(), l.grant());
        RegionLedger.LeaseRange previous = leases.remove(req.peer());
        if (previous != null) {
            ledger.endLease(previous);
        }
        if (!node.currentTerm(l.term())) {
            node.refusedWrite();
            leaseReply(req, ResultCode.DEPOSED);
            return;
        }
        if (!node.gate().enter()) {
            node.refusedWrite();
            leaseReply(req, ResultCode.NO_SEGMENT);
            return;
        }
        RegionLedger.LeaseAdmission adm;
        try {
            adm = ledger.beginLease(l.offset(), l.length(), l.epoch(), l.grant().firstGeneration(),
                    l.grant().generationCount(), config.regionWait());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IOException("interrupted while waiting for a lease region of segment " + node.name());
        } finally {
            node.gate().exit();
        }
        ResultCode code = ResultCode.OK;
        if (adm.range() == null) {
            node.refusedWrite();
            code = adm.refusal();
        } else {
            leases.put(req.peer(), adm.range());
        }
        leaseReply(req, code);
    }

    /**
     * The NODE_SHM_LEASE reply: its code, and whether the writer may stamp its objects (version 16): not
     * when this node verifies writes, since a stamped object is readable on this machine before the node
     * could check its value.
     */
    private void leaseReply(Request req, ResultCode code) throws IOException {
        BodyWriter out = new BodyWriter(8);
        new NodeMessages.ShmLeaseReply(code, !config.verifyWrites()).write(out);
        req.reply(out);
    }

    /**
     * NODE_SHM_LEASE_WRITE: the values of these objects are in place in this connection's lease
     * region; each becomes a readable object (in order, each at or after the previous one). Codes per
     * item: OK, FENCED (a reset voided the lease), FAILED (outside the lease region, or a checksum that
     * does not hold when the node verifies writes), NOT_FOUND (the connection holds no lease region).
     */
    void leaseWrite(Request req) throws IOException {
        BodyReader body = req.body();
        NodeMessages.Write w = NodeMessages.Write.read(body);
        body.end("node_shm_lease_write");
        node.checkWrites(req.access(), w);
        if (!node.currentTerm(w.term())) {
            RegionLedger.LeaseRange lease = leases.remove(req.peer());
            if (lease != null) {
                ledger.endLease(lease);
            }
            reply(req, deposed(w.items().size()));
            return;
        }
        if (!node.gate().enter()) {
            // objects carved now might be in no inventory: the lease's range is let go as well
            RegionLedger.LeaseRange lease = leases.remove(req.peer());
            if (lease != null) {
                ledger.endLease(lease);
            }
            refuse(req, w.items().size());
            return;
        }
        try {
            reply(req, carveAll(req, w));
        } finally {
            node.gate().exit();
        }
    }

    /** The objects of a NODE_SHM_LEASE_WRITE, carved from this connection's lease range in order. */
    private List<ResultCode> carveAll(Request req, NodeMessages.Write w) {
        List<ResultCode> codes = new ArrayList<>(w.items().size());
        RegionLedger.LeaseRange lease = leases.get(req.peer());
        for (NodeMessages.WriteItem it : w.items()) {
            RegionLedger.Region front = lease == null ? null : ledger.front(lease);
            if (front == null) {
                codes.add(ResultCode.NOT_FOUND);
                continue;
            }
            long length = ObjectLayout.regionLength(it.key().length, it.valueLength());
            long valueOffset = it.offset() + ObjectLayout.valueOffset(it.key().length);
            if (it.offset() >= front.offset && it.offset() + length <= front.end()
                    && !crcHolds(valueOffset, it.valueLength(), it.valueCrc())) {
                codes.add(ResultCode.FAILED);
                continue;
            }
            ResultCode c = node.gate().carve(lease, it.offset(), length, it.generation(), w.epoch(), it.key(),
                    it.valueLength(), it.valueCrc());
            if (c == ResultCode.OK) {
                node.wrote(it.valueLength());
            } else {
                node.refusedWrite();
            }
            codes.add(c);
        }
        return codes;
    }

    /** Answers every item NO_SEGMENT: the node takes no writes while it registers or drains ({@link WriteGate}). */
    private void refuse(Request req, int items) throws IOException {
        for (int i = 0; i < items; i++) {
            node.refusedWrite();
        }
        reply(req, Collections.nCopies(items, ResultCode.NO_SEGMENT));
    }

    private static List<ResultCode> deposed(int n) {
        return Collections.nCopies(n, ResultCode.DEPOSED);
    }

    /** A connection closed: what it began and did not end, and its lease region, are dropped. */
    void connectionClosed(String peer) {
        beginTerms.remove(peer);
        Map<Long, RegionLedger.Region> open = begun.remove(peer);
        if (open != null) {
            for (RegionLedger.Region r : open.values()) {
                ledger.endWrite(r, false);
            }
        }
        RegionLedger.LeaseRange lease = leases.remove(peer);
        if (lease != null) {
            ledger.endLease(lease);
        }
    }

    /** With {@code --verify-writes}, whether the value's CRC32C is {@code crc}; always true without it. */
    private boolean crcHolds(long valueOffset, long valueLength, int crc) {
        return !config.verifyWrites() || ObjectLayout.valueCrc(segment.asSlice(valueOffset, valueLength)) == crc;
    }

    private int storedCrc(long regionOffset) {
        return segment.get(ValueLayout.JAVA_INT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN),
                regionOffset + ObjectLayout.VALUE_CRC_OFFSET);
    }

    private static void reply(Request req, List<ResultCode> codes) throws IOException {
        BodyWriter out = new BodyWriter(8 + codes.size());
        new Codes(codes).write(out);
        req.reply(out);
    }
}
