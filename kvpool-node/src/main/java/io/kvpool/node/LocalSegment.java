package io.kvpool.node;

import io.kvpool.protocol.Access;
import io.kvpool.protocol.BadRequestException;
import io.kvpool.protocol.Handshake;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.WriteGrants;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.NodeMessages;
import io.kvpool.protocol.msg.WriteGrant;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.BiConsumer;

/**
 * This node's segment as the node's parts see it: its memory and {@link RegionLedger}, its name and
 * address, the segment id the master gave it, the highest master term it has heard of, the admission
 * of writes into it, and its byte counters.
 *
 * <p>It exists so that the parts that talk to the master ({@link MasterLink}) and to the SSD tier
 * ({@link DiskTier}), and the same-machine writes ({@link SameMachineWrites}), receive this narrow
 * object instead of the whole {@link StorageNode}: none of them can reach the frame server, and
 * nothing here calls back into the node.
 *
 * <h2>Terms</h2>
 * With several masters (elected through etcd), each leader has a term, rising from one leader to the
 * next. Every write, free, reset and copy carries the term of the master that authorised it; one
 * from an older term than the segment follows is refused ({@link #currentTerm}). The term moves only
 * when the node registers ({@link #followTerm}): with the master its link chose (the configured one,
 * or the leader etcd names), never because a frame names a newer one, which anyone who reaches the
 * port could send. A single master has term 0 throughout.
 *
 * <h2>Administration</h2>
 * NODE_FREE, NODE_RESET and NODE_REPLICATE act only when they come from the master this node
 * registered with ({@link #checkAdmin}): each registration draws a fresh {@link ControlToken}, sent in
 * REGISTER_NODE before the master can know the segment, and the master presents it in each of them.
 * A frame without it is refused UNAUTHORIZED (on an open pool too, where every connection otherwise
 * counts as admin); one of an older term than the node follows is refused as a deposed master's,
 * and one of a newer term as a bad request (that is not the term the node registered under; a frame
 * that overtakes the registration's reply is refused too, and its master sends it again or the node
 * catches up at its next heartbeat). Either way nothing changes. A new registration (another leader,
 * the master restarted or dropped the node) replaces the token, so the master the node left can no
 * longer administer it.
 *
 * <h2>Write admission</h2>
 * Writes are admitted only while the node serves a registration and is not draining for a restart
 * ({@link WriteGate}); otherwise they are answered NO_SEGMENT and nothing is written.
 * A connection that proved the admin secret (the master, a node replicating) writes where it says.
 * One that proved only the cluster secret (a client) writes only what a {@link WriteGrant} the master
 * signed for this segment and the write's term covers ({@link #checkWrites}); anything else closes
 * the connection as UNAUTHORIZED before a byte of it is stored. An open node grants everyone admin.
 */
final class LocalSegment {

    private final NodeConfig config;
    private final SegmentMemory memory;
    private final MemorySegment segment;
    private final RegionLedger ledger;
    private final String name;
    private final String advertiseHost;
    private final int port;
    private final AtomicLong bytesWritten = new AtomicLong();
    private final AtomicLong bytesRead = new AtomicLong();
    private final AtomicLong refusedWrites = new AtomicLong();
    private final AtomicLong refusedGrants = new AtomicLong();
    private final AtomicLong memoryReads = new AtomicLong();
    /** Items of NODE_READ_RANGE frames served (hits and misses). */
    private final AtomicLong rangedReads = new AtomicLong();
    /** Items of NODE_PART_WRITE frames received, and their bytes stored. */
    private final AtomicLong partsWritten = new AtomicLong();
    private final AtomicLong partBytes = new AtomicLong();
    /** Objects written in parts that NODE_PART_END made readable. */
    private final AtomicLong partObjects = new AtomicLong();
    private final AtomicLong term = new AtomicLong();
    /** Administration frames refused (no control token of this registration, or another term). */
    private final AtomicLong refusedAdmin = new AtomicLong();
    /** The current registration's token; null before the first registration is sent. */
    private volatile ControlToken controlToken;
    private final WriteGrants grants;
    private volatile int segmentId = -1;
    /** Whether writes are admitted now (only while registered, not draining), and those in progress. */
    private final WriteGate gate;

    LocalSegment(NodeConfig config, SegmentMemory memory, String name, String advertiseHost, int port) {
        this.config = config;
        this.memory = memory;
        this.segment = memory.segment();
        this.ledger = new RegionLedger(segment, config.verifyWrites());
        this.gate = new WriteGate(ledger);
        this.name = name;
        this.advertiseHost = advertiseHost;
        this.port = port;
        this.grants = WriteGrants.of(config.secrets());
    }

    /** {@code host:port} as clients reach this node. */
    String name() {
        return name;
    }

    String advertiseHost() {
        return advertiseHost;
    }

    int port() {
        return port;
    }

    MemorySegment segment() {
        return segment;
    }

    RegionLedger ledger() {
        return ledger;
    }

    /** Whether writes are admitted now; every write path enters it ({@link WriteGate}). */
    WriteGate gate() {
        return gate;
    }

    long capacity() {
        return segment.byteSize();
    }

    /** The shared-memory file backing the segment, or "" when it is anonymous memory. */
    String shmPath() {
        return memory.file() == null ? "" : memory.file().toAbsolutePath().toString();
    }

    /** The segment id the master gave this node, or -1 while not registered. */
    int segmentId() {
        return segmentId;
    }

    void segmentId(int id) {
        this.segmentId = id;
    }

    /** The highest master term this segment has heard of. */
    long term() {
        return term.get();
    }

    /**
     * Whether a write authorised by a master of {@code t} may act: {@code t} is not older than the term
     * this segment follows. It does not move the term (only {@link #followTerm} does).
     */
    boolean currentTerm(long t) {
        return t >= term.get();
    }

    /**
     * A registration answered with the term {@code t} of the master it went to: follow it if it is
     * not older than the term followed so far, and say whether it was.
     */
    boolean followTerm(long t) {
        long seen = term.get();
        while (t > seen) {
            if (term.compareAndSet(seen, t)) {
                return true;
            }
            seen = term.get();
        }
        return t == seen;
    }

    /**
     * A fresh control token for the registration about to be sent; from now on administration is
     * taken only with it (the previous registration's master is no longer this node's).
     */
    ControlToken newRegistration() {
        ControlToken t = ControlToken.random();
        controlToken = t;
        return t;
    }

    /**
     * Refuses an administration frame ({@code what}: node_free, node_reset, node_replicate) unless it
     * comes from the master of this node's current registration: its {@code token} is that
     * registration's and its term {@code t} is the one the node follows. Changes nothing.
     *
     * @throws BadRequestException             a master of an older term (deposed), or a newer term
     * @throws Handshake.UnauthorizedException any other sender: not the master this node registered with
     */
    void checkAdmin(String what, long t, ControlToken token) {
        long following = term.get();
        if (t < following) {
            refusedAdmin.incrementAndGet();
            throw new BadRequestException(what + " from a master of term " + t + " refused: node " + name
                    + " follows term " + following + " (that master lost its leadership)");
        }
        ControlToken mine = controlToken;
        if (mine == null || !mine.matches(token)) {
            refusedAdmin.incrementAndGet();
            throw new Handshake.UnauthorizedException(what + " of term " + t + " refused: node " + name
                    + " takes administration only from the master it registered with"
                    + (mine == null ? " (it has not registered yet)" : segmentId < 0 ? " (its registration is under way)"
                    : " (as segment " + segmentId + ", term " + following + ")")
                    + ", and this frame does not carry the control token of that registration");
        }
        if (t != following) {
            refusedAdmin.incrementAndGet();
            throw new BadRequestException(what + " of term " + t + " refused: node " + name + " registered under term "
                    + following + ", and only a registration moves its term");
        }
    }

    /** The current registration's control token; null before the first registration. */
    ControlToken controlToken() {
        return controlToken;
    }

    /** Administration frames refused since start ({@link #checkAdmin}). */
    long refusedAdmin() {
        return refusedAdmin.get();
    }

    /** Refuses a same-machine write when the segment is not in shared memory. */
    void requireShared() {
        if (memory.file() == null) {
            throw new BadRequestException("segment " + name + " is not in shared memory; use node_write");
        }
    }

    void checkRegion(long offset, long length, long generation) {
        if (offset % ObjectLayout.ALIGNMENT != 0 || offset < 0 || length < 0 || offset + length > segment.byteSize()
                || offset + length < 0) {
            throw new BadRequestException("region at offset " + offset + " of " + length + " bytes (generation "
                    + generation + ") does not fit segment " + name + " of " + segment.byteSize()
                    + " bytes, or is not " + ObjectLayout.ALIGNMENT + "-byte aligned");
        }
    }

    /**
     * Checks every item of a write (NODE_WRITE, NODE_SHM_WRITE_BEGIN, NODE_SHM_LEASE_WRITE) before any
     * is admitted: the region fits the segment (BadRequestException), and a connection without the
     * admin secret holds a grant covering it (UnauthorizedException naming what is wrong).
     */
    void checkWrites(Access access, NodeMessages.Write w) {
        for (NodeMessages.WriteItem it : w.items()) {
            long length = ObjectLayout.regionLength(it.key().length, it.valueLength());
            checkRegion(it.offset(), length, it.generation());
            checkGrant(access, w.term(), it.offset(), length, it.generation(), it.grant());
        }
    }

    /** The grant check of one region (a lease's range: any of its generations). */
    void checkGrant(Access access, long t, long offset, long length, long generation, WriteGrant g) {
        if (access == Access.ADMIN) {
            return;
        }
        String why = grants.refusal(g, segmentId, t, offset, length, generation);
        if (why != null) {
            refusedWrites.incrementAndGet();
            refusedGrants.incrementAndGet();
            throw new Handshake.UnauthorizedException("segment " + name + " refuses a write without the admin secret: "
                    + why);
        }
    }

    RegionLedger.WriteAdmission admit(NodeMessages.WriteItem it, long epoch, long waitDeadline) throws IOException {
        try {
            return ledger.beginWrite(it.offset(), ObjectLayout.regionLength(it.key().length, it.valueLength()),
                    it.generation(), epoch, it.key(), it.valueLength(),
                    Duration.ofNanos(Math.max(0, waitDeadline - System.nanoTime())));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IOException("interrupted while waiting for region " + it.offset() + " of segment " + name);
        }
    }

    /**
     * Admits every item of a write whose bytes arrive later (NODE_SHM_WRITE_BEGIN, NODE_PART_BEGIN):
     * as NODE_WRITE admits them, all waits of the frame under one bound of the region wait; stamps
     * each admitted object's header WRITING and hands its region to {@code held}. One code per item.
     */
    List<ResultCode> admitHeld(NodeMessages.Write w, BiConsumer<NodeMessages.WriteItem, RegionLedger.Region> held)
            throws IOException {
        List<ResultCode> codes = new ArrayList<>(w.items().size());
        long waitDeadline = System.nanoTime() + config.regionWait().toNanos();
        for (NodeMessages.WriteItem it : w.items()) {
            RegionLedger.WriteAdmission adm = admit(it, w.epoch(), waitDeadline);
            if (adm.region() == null) {
                refusedWrite();
                codes.add(adm.refusal());
                continue;
            }
            ObjectLayout.writeHeader(segment, it.offset(), ObjectLayout.STATE_WRITING, it.key(), it.valueLength(),
                    it.generation(), w.epoch(), it.valueCrc());
            held.accept(it, adm.region());
            codes.add(ResultCode.OK);
        }
        return codes;
    }

    /**
     * Writes an object into this segment (a promotion from the disk tier), with the same admission as
     * a client's write. Returns true once it is readable.
     */
    boolean writeLocal(long offset, long generation, long epoch, byte[] key, MemorySegment value, int crc) {
        long regionLength = ObjectLayout.regionLength(key.length, value.byteSize());
        if (offset < 0 || offset % ObjectLayout.ALIGNMENT != 0 || offset + regionLength > segment.byteSize()) {
            return false;
        }
        if (!gate.enter()) {
            return false; // registering or draining: the promotion is given up, the disk copy stays
        }
        try {
            RegionLedger.WriteAdmission adm;
            try {
                adm = ledger.beginWrite(offset, regionLength, generation, epoch, key, value.byteSize(), config.regionWait());
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return false;
            }
            if (adm.region() == null) {
                return false;
            }
            boolean ok = false;
            try {
                ObjectLayout.writeHeader(segment, offset, ObjectLayout.STATE_WRITING, key, value.byteSize(), generation,
                        epoch, crc);
                MemorySegment.copy(value, 0, segment, adm.region().valueOffset(), value.byteSize());
                ok = true;
            } finally {
                ok = gate.endWrite(adm.region(), ok);
            }
            if (ok) {
                bytesWritten.addAndGet(value.byteSize());
            }
            return ok;
        } finally {
            gate.exit();
        }
    }

    void refusedWrite() {
        refusedWrites.incrementAndGet();
    }

    void wrote(long valueBytes) {
        bytesWritten.addAndGet(valueBytes);
    }

    /** A read served from memory: its value bytes. */
    void served(long valueBytes, int objects) {
        bytesRead.addAndGet(valueBytes);
        memoryReads.addAndGet(objects);
    }

    /** Items of a NODE_READ_RANGE frame answered. */
    void servedRanges(int items) {
        rangedReads.addAndGet(items);
    }

    /** A NODE_PART_WRITE frame: its items, and the bytes stored (refused items' bytes not counted). */
    void partsWritten(int items, long bytes) {
        partsWritten.addAndGet(items);
        partBytes.addAndGet(bytes);
    }

    /** An object written in parts became readable. */
    void partObjectDone() {
        partObjects.incrementAndGet();
    }

    long rangedReads() {
        return rangedReads.get();
    }

    long partsWritten() {
        return partsWritten.get();
    }

    long partBytes() {
        return partBytes.get();
    }

    long partObjects() {
        return partObjects.get();
    }

    /** Value bytes written: through the node, and stamped by same-machine writers and settled since ({@link RegionLedger#stampedBytes}). */
    long bytesWritten() {
        return bytesWritten.get() + ledger.stampedBytes();
    }

    long bytesRead() {
        return bytesRead.get();
    }

    long memoryReads() {
        return memoryReads.get();
    }

    /** Writes refused, stamped objects whose value failed verification when settled included. */
    long refusedWrites() {
        return refusedWrites.get() + ledger.refusedStamps();
    }

    /** Writes refused because a connection without the admin secret held no grant covering them. */
    long refusedGrants() {
        return refusedGrants.get();
    }
}
