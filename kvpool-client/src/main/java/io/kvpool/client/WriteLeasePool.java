package io.kvpool.client;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.WriteGrant;
import io.kvpool.protocol.msg.WriteLeaseMessages;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;
import java.util.function.IntSupplier;
import java.util.function.LongSupplier;

/**
 * The write leases this client holds (see docs/architecture.md, "Write leases"). A put takes a lease
 * with room for its first object out of the pool (one put at a time per lease: offsets and
 * generations must rise through a lease's commits), places objects in it with a bump pointer, and
 * gives it back after its COMMIT. A lease that is nearly full, out of generations, or idle for half
 * of the master's idle timeout is released instead of kept, so an idle client holds no space for
 * long; {@link #forgetAll} drops every lease when the master restarted (the new one knows none). How
 * much a new lease asks for follows how fast this client uses its leases up ({@link LeaseSize}).
 *
 * <p>A removeAll(force) moves the cluster epoch, and writes under a lease granted before it are
 * refused (FENCED). The removal returns only once every client holding a read lease applied its
 * invalidation (or its read lease ran out), and applying it calls {@link #doom} here: every lease
 * granted until then is released instead of used again. A kept lease is reused only while the read
 * lease is valid. So a put that begins after the removal returned always takes a fresh lease.
 * Clients without a read lease (the location cache off) do not hear of removals, so they do not
 * use write leases at all.
 *
 * <p>Leases are kept per preferred segment, so a put that prefers this host's segment never lands in
 * a lease on another one.
 */
final class WriteLeasePool implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(WriteLeasePool.class);

    /** A lease with less room than this left is released after its commit rather than kept. */
    static final long KEEP_MIN_BYTES = 64L << 10;

    /** One lease: the master's grant, and how far this client has filled it. Owned by one put at a time. */
    static final class Lease {
        final long id;
        final long epoch;
        /** The term of the master that granted it (node writes carry it). */
        final long term;
        final int segmentId;
        final long end;
        final long lastGeneration;
        final long idleNanos;
        final String preference;
        /** The pool's era when granted: a lease of an earlier era is never used again. */
        final int era;
        /**
         * The master run that granted it ({@link MasterChannel#callInRun}): once the master changed, its
         * segment id may name another node, so it is neither written to nor kept.
         */
        final int run;
        /** The master's grant of the range and generations, relayed with every write into it. */
        final WriteGrant grant;
        /** When it was granted (the pool's clock): how fast it was used up sizes the next ask ({@link LeaseSize}). */
        final long grantedNanos;
        long next;
        long nextGeneration;
        long lastUsedNanos;
        /**
         * On the same-machine path, the connection to the node that holds this lease's unwritten range
         * set aside (NODE_SHM_LEASE); closing it ends that. Null until first needed, or over TCP.
         */
        volatile FrameConnection node;
        /**
         * Whether that node lets this writer stamp its objects in the range (protocol version 16), as its
         * NODE_SHM_LEASE reply said; false when it verifies writes (then NODE_SHM_LEASE_WRITE records them).
         */
        volatile boolean stamps;

        Lease(WriteLeaseMessages.Granted g, String preference, int era, int run, long nowNanos) {
            this.era = era;
            this.run = run;
            this.grant = g.grant();
            this.id = g.leaseId();
            this.epoch = g.epoch();
            this.term = g.term();
            this.segmentId = g.segmentId();
            this.end = g.offset() + g.length();
            this.lastGeneration = g.firstGeneration() + g.generationCount() - 1;
            this.idleNanos = g.idleMillis() * 1_000_000L;
            this.preference = preference;
            this.next = g.offset();
            this.nextGeneration = g.firstGeneration();
            this.lastUsedNanos = nowNanos;
            this.grantedNanos = nowNanos;
        }

        /** Whether one more object with a region of {@code regionLength} bytes fits. */
        boolean fits(long regionLength) {
            return next + regionLength <= end && nextGeneration <= lastGeneration;
        }

        boolean stale(long nowNanos) {
            return nowNanos - lastUsedNanos > idleNanos / 2;
        }
    }

    private final MasterChannel master;
    private final LongSupplier nanos;
    /** Whether this client's read lease is valid now: only then does a removeAll wait for it (see above). */
    private final BooleanSupplier heard;
    /** The master run now ({@link MasterChannel#run}). */
    private final IntSupplier run;
    @GuardedBy("this")
    private final Map<String, ArrayDeque<Lease>> idle = new HashMap<>();
    private final AtomicInteger era = new AtomicInteger();
    /** How much the next grant asks for. */
    private final LeaseSize size = new LeaseSize();
    @GuardedBy("this")
    private boolean closed;

    WriteLeasePool(MasterChannel master, LongSupplier nanos, BooleanSupplier heard, IntSupplier run) {
        this.master = master;
        this.nanos = nanos;
        this.heard = heard;
        this.run = run;
    }

    /**
     * A lease with room for an object of {@code firstRegion} bytes: a kept one, or a new grant of at
     * least that and about {@code wantedBytes}. Returns null with {@code refusal[0]} set when the
     * master refused (POOL_FULL, NO_SEGMENT).
     */
    Lease take(String preference, long firstRegion, long wantedBytes, int generations, ResultCode[] refusal) {
        long now = nanos.getAsLong();
        int currentEra = era.get();
        int currentRun = run.getAsInt();
        List<Lease> stale = new ArrayList<>();
        Lease found = null;
        boolean reuse = heard.getAsBoolean();
        synchronized (this) {
            ArrayDeque<Lease> q = idle.get(preference);
            while (q != null && !q.isEmpty()) {
                Lease l = q.pollFirst();
                if (reuse && !l.stale(now) && l.era == currentEra && l.run == currentRun && l.fits(firstRegion)) {
                    found = l;
                    break;
                }
                if (l.stale(now)) {
                    size.idled();
                } else if (l.era == currentEra && l.run == currentRun && !l.fits(firstRegion)) {
                    size.usedUp(now - l.grantedNanos); // too little room left for this writer's objects
                }
                stale.add(l);
            }
        }
        stale.forEach(this::release);
        if (found != null) {
            return found;
        }
        BodyWriter w = new BodyWriter(64);
        new WriteLeaseMessages.Grant(preference, firstRegion, size.bytes(wantedBytes), size.generations(generations))
                .write(w);
        // the grant names a segment of the master run that answered (see SegmentAccess)
        MasterChannel.Answer<WriteLeaseMessages.Granted> a = master.callInRun(Opcode.WRITE_LEASE, w,
                WriteLeaseMessages.Granted::read);
        WriteLeaseMessages.Granted g = a.value();
        if (g.code() != ResultCode.OK) {
            refusal[0] = g.code();
            return null;
        }
        return new Lease(g, preference, currentEra, a.run(), now);
    }

    /** Back after a commit: kept while it has room, time and generations left, else released. */
    void giveBack(Lease l) {
        l.lastUsedNanos = nanos.getAsLong();
        boolean room = l.end - l.next >= KEEP_MIN_BYTES && l.nextGeneration <= l.lastGeneration;
        boolean current = l.era == era.get() && l.run == run.getAsInt();
        if (!room && current) {
            size.usedUp(l.lastUsedNanos - l.grantedNanos);
        }
        if (room && current) {
            synchronized (this) {
                if (!closed) {
                    idle.computeIfAbsent(l.preference, p -> new ArrayDeque<>()).addFirst(l);
                    return;
                }
            }
        }
        release(l);
    }

    /**
     * A removal may have moved the epoch: no lease granted so far is used again. Kept leases let go of
     * their range on the node at once (a reset lets the master place new writes there, and the node
     * holds the range for this client until its connection closes); they are released at the master
     * by the next {@link #sweep} or take. Called with the location cache's lock held: does no I/O but
     * closing sockets.
     */
    void doom() {
        era.incrementAndGet();
        List<Lease> kept = new ArrayList<>();
        synchronized (this) {
            idle.values().forEach(kept::addAll);
        }
        kept.forEach(WriteLeasePool::closeNode);
    }

    /**
     * Releases kept leases that went idle for half the master's idle timeout or were doomed, so an
     * idle client holds no space, at the master or on a node, for long. Run by the client's ping loop.
     */
    void sweep() {
        long now = nanos.getAsLong();
        int current = era.get();
        List<Lease> due = new ArrayList<>();
        synchronized (this) {
            for (ArrayDeque<Lease> q : idle.values()) {
                q.removeIf(l -> {
                    boolean go = l.stale(now) || l.era != current;
                    if (go) {
                        due.add(l);
                    }
                    return go;
                });
            }
            if (due.stream().anyMatch(l -> l.stale(now))) {
                size.idled();
            }
        }
        due.forEach(this::release);
    }

    /** The master restarted: none of our leases exists any more. */
    void forgetAll() {
        List<Lease> all = new ArrayList<>();
        synchronized (this) {
            idle.values().forEach(all::addAll);
            idle.clear();
        }
        all.forEach(WriteLeasePool::closeNode);
    }

    /** Ends the lease's range on its node (same-machine path), if it holds one. */
    static void closeNode(Lease l) {
        FrameConnection c = l.node;
        l.node = null;
        if (c != null) {
            try {
                c.close();
            } catch (IOException e) {
                log.debug("closing the node connection of write lease {}: {}", l.id, e.getMessage());
            }
        }
    }

    /** The factor of the next grant's ask ({@link LeaseSize}; tests). */
    int sizeFactor() {
        return size.factor();
    }

    /** Gives the lease back to the master (best effort: one it does not hear of idles out there). */
    void release(Lease l) {
        closeNode(l); // first: the node lets the range go before the master can place anything there

        BodyWriter w = new BodyWriter(16);
        new WriteLeaseMessages.Release(l.id).write(w);
        try {
            master.call(Opcode.RELEASE, w, r -> null);
        } catch (RuntimeException e) {
            log.debug("release of write lease {} failed; the master reclaims it when it idles out: {}", l.id,
                    e.getMessage());
        }
    }

    /** Releases every kept lease (the client is closing). */
    @Override
    public void close() {
        List<Lease> all = new ArrayList<>();
        synchronized (this) {
            closed = true;
            idle.values().forEach(all::addAll);
            idle.clear();
        }
        all.forEach(this::release);
    }
}
