package io.kvpool.master;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.protocol.msg.LeaseMessages.Invalidation;
import io.kvpool.protocol.msg.LeaseMessages.LeaseReply;
import io.kvpool.protocol.msg.LeaseMessages.LeaseRequest;

import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.LongFunction;
import java.util.function.LongSupplier;

/**
 * Read leases: the master's half of the rule that makes removals, resets and upserts absolute for
 * clients that read from locations they remember (docs/architecture.md, "Read leases").
 *
 * <h2>The problem</h2>
 * A client that remembers where an object lives reads it without asking the master: from the node
 * over TCP, or straight out of the node's shared-memory segment. Where the bytes are, a check by
 * generation protects the read, but only as long as the node is alive to mark a removed object
 * dead. A node that is frozen or killed cannot, so a remembered location could serve an object
 * that a {@code removeAll(force)} (an RL weight update) has already removed.
 *
 * <h2>The rule</h2>
 * <ul>
 *   <li>A client may use a remembered location only while it holds a <em>read lease</em>, and only
 *       for a key that no invalidation it has applied since covers. Its lease runs for
 *       {@link #leaseNanos} from the moment it <em>sent</em> the renewal that granted it.</li>
 *   <li>Every operation that removes or replaces values (remove, removeByPrefix, removeAll, an
 *       upsert) first changes the index, then {@link #publish}es an invalidation (the next
 *       sequence number, and what it covers), then {@link #await}s it: it returns to its caller
 *       only once every session has acknowledged that sequence or has had its lease run out.</li>
 *   <li>A renewal carries the sequence the client has applied (its acknowledgement) and may wait
 *       here up to a hold time for the next invalidation (a long poll), so a healthy client applies
 *       an invalidation about one round trip after it is published.</li>
 * </ul>
 *
 * <h2>Why the master's count of a lease is safe</h2>
 * The master counts a session's lease from the moment it built the last reply ({@code grantedAt}),
 * which is after the client sent the request the lease is counted from. Clocks are monotonic on
 * both sides and may run at slightly different rates, so the master waits
 * {@code lease * (1 + }{@value #DRIFT}{@code ) + }{@link #MARGIN} past {@code grantedAt} before
 * it takes a lease as over. A reply that carries invalidations grants nothing until the client has
 * applied them, so the lease that matters for a frozen client is the one it already held: counting
 * from any later reply is only more conservative.
 *
 * <h2>A new master</h2>
 * Leases granted by a previous master process cannot be known. So a master does not complete any
 * invalidation until one full lease has passed since it started ({@code graceUntil}), and a client
 * whose applied sequence belongs to another incarnation is told to resynchronise (drop everything).
 *
 * <h2>Bounds</h2>
 * An invalidation waits at most {@link #maxWaitNanos()} for a client that is frozen, partitioned
 * or dead; with healthy clients, one round trip. Sessions whose lease ran out are forgotten by
 * {@link #expire()}.
 *
 * <p>Thread-safe: one lock guards every field below it; holders never do I/O.
 */
final class ReadLeases {

    /** Relative clock rate difference the master allows between itself and a client. */
    static final double DRIFT = 0.01;
    /** Added to every lease the master waits out, for scheduling delays around the clock reads. */
    static final Duration MARGIN = Duration.ofMillis(50);
    /** Invalidations kept for clients that fall behind; beyond them a client is told to resync. */
    static final int MAX_RECORDS = 4096;
    /** Bytes of keys and prefixes kept in {@link #records}, same purpose. */
    static final long MAX_RECORD_BYTES = 32L << 20;
    /** Most record bytes in one reply; a client further behind renews again at once. */
    static final int MAX_REPLY_BYTES = 8 << 20;

    private final long incarnation;
    private final long leaseNanos;
    private final long expiryNanos;
    private final long maxHoldNanos;
    private final LongSupplier nanos;
    private final boolean startGrace;
    private final long graceUntil;

    private final ReentrantLock lock = new ReentrantLock();
    /** Signalled on every publish: parked renewals answer. */
    private final Condition published = lock.newCondition();
    /** Signalled on every acknowledgement and session end: awaiting invalidations look again. */
    private final Condition acknowledged = lock.newCondition();
    @GuardedBy("lock")
    private final Map<UUID, Session> sessions = new HashMap<>();
    @GuardedBy("lock")
    private final ArrayDeque<Invalidation> records = new ArrayDeque<>();
    @GuardedBy("lock")
    private long recordBytes;
    @GuardedBy("lock")
    private long seq;
    @GuardedBy("lock")
    private boolean closed;

    final AtomicLong invalidations = new AtomicLong();
    /** Sessions an invalidation waited out (lease ran out) instead of being acknowledged. */
    final AtomicLong leasesWaitedOut = new AtomicLong();
    final AtomicLong waitNanosTotal = new AtomicLong();
    final AtomicLong waitNanosMax = new AtomicLong();

    private static final class Session {
        /** The last sequence the client said it applied (its acknowledgement). */
        long applied;
        /** When the master built the last reply: the lease is counted from here. */
        long grantedAt;
        /** Renewals of this session parked in {@link #renew} right now. */
        int parked;
    }

    /**
     * @param incarnation the master process's incarnation (a renewal from another one resyncs)
     * @param lease       how long a renewal's lease lasts, counted by the client from its send time
     * @param nanos       a monotonic clock in nanoseconds ({@code System::nanoTime} in production)
     * @param startGrace  wait one lease after start before completing invalidations (a master that may
     *                    replace an earlier one must; tests of a lone master need not)
     */
    ReadLeases(long incarnation, Duration lease, LongSupplier nanos, boolean startGrace) {
        if (lease.isNegative() || lease.isZero()) {
            throw new IllegalArgumentException("read lease must be positive, got " + lease);
        }
        this.incarnation = incarnation;
        this.leaseNanos = lease.toNanos();
        this.expiryNanos = (long) (leaseNanos * (1 + DRIFT)) + MARGIN.toNanos();
        this.maxHoldNanos = leaseNanos / 4;
        this.nanos = nanos;
        this.startGrace = startGrace;
        this.graceUntil = nanos.getAsLong() + expiryNanos;
    }

    /** The longest an invalidation waits for clients that do not answer (and for nothing else). */
    long maxWaitNanos() {
        return expiryNanos;
    }

    /** The last sequence published. */
    long sequence() {
        lock.lock();
        try {
            return seq;
        } finally {
            lock.unlock();
        }
    }

    int sessionCount() {
        lock.lock();
        try {
            return sessions.size();
        } finally {
            lock.unlock();
        }
    }

    // ================================================================== invalidations

    /** Publishes an invalidation of these keys; returns its sequence for {@link #await}. */
    long publishKeys(List<byte[]> keys) {
        return publish(seq -> Invalidation.keys(seq, keys));
    }

    /** Publishes an invalidation of every key starting with {@code prefix}. */
    long publishPrefix(byte[] prefix) {
        return publish(seq -> Invalidation.prefix(seq, prefix));
    }

    /** Publishes an invalidation of every key. */
    long publishAll() {
        return publish(Invalidation::all);
    }

    /** Numbers the invalidation {@code make} builds with the next sequence, keeps it, wakes parked renewals. */
    private long publish(LongFunction<Invalidation> make) {
        lock.lock();
        try {
            return add(make.apply(seq + 1));
        } finally {
            lock.unlock();
        }
    }

    @GuardedBy("lock")
    private long add(Invalidation inv) {
        seq = inv.seq();
        records.addLast(inv);
        recordBytes += inv.wireBytes();
        while (records.size() > MAX_RECORDS || (recordBytes > MAX_RECORD_BYTES && records.size() > 1)) {
            recordBytes -= records.removeFirst().wireBytes();
        }
        invalidations.incrementAndGet();
        published.signalAll();
        return seq;
    }

    /**
     * Waits until every session has applied invalidation {@code target} or its lease has run out,
     * and until the start grace is over. Returns how many sessions were waited out rather than
     * heard from. Bounded by {@link #maxWaitNanos()} after the last lease granted.
     */
    int await(long target) {
        long start = nanos.getAsLong();
        int waitedOut = 0;
        lock.lock();
        try {
            while (!closed) {
                long next = nanosUntilApplied(target);
                if (next == 0) {
                    break;
                }
                try {
                    acknowledged.awaitNanos(next);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new IllegalStateException("interrupted while waiting for clients to apply invalidation "
                            + target, e);
                }
            }
            long now = nanos.getAsLong();
            for (Session s : sessions.values()) {
                if (s.applied < target && now - (s.grantedAt + expiryNanos) >= 0) {
                    waitedOut++;
                }
            }
        } finally {
            lock.unlock();
        }
        long took = nanos.getAsLong() - start;
        waitNanosTotal.addAndGet(took);
        waitNanosMax.accumulateAndGet(took, Math::max);
        leasesWaitedOut.addAndGet(waitedOut);
        return waitedOut;
    }

    /**
     * 0 if invalidation {@code target} is applied everywhere it must be (every session acknowledged
     * it or its lease ran out, and the start grace is over); otherwise how long until the earliest
     * pending lease runs out, an upper bound on the next change.
     */
    @GuardedBy("lock")
    private long nanosUntilApplied(long target) {
        long now = nanos.getAsLong();
        long next = Long.MAX_VALUE;
        if (startGrace && now - graceUntil < 0) {
            next = graceUntil - now;
        }
        for (Session s : sessions.values()) {
            if (s.applied >= target) {
                continue;
            }
            long left = s.grantedAt + expiryNanos - now;
            if (left > 0) {
                next = Math.min(next, left);
            }
        }
        return next == Long.MAX_VALUE ? 0 : next;
    }

    /** Whether {@link #await} would return at once (for tests driving the clock by hand). */
    boolean applied(long target) {
        lock.lock();
        try {
            return nanosUntilApplied(target) == 0;
        } finally {
            lock.unlock();
        }
    }

    // ================================================================== renewals

    /**
     * LEASE: records the client's acknowledgement, waits up to the hold time (at most a quarter of
     * the lease) for a new invalidation, and answers with what the client has not applied yet and a
     * new lease.
     */
    LeaseReply renew(LeaseRequest req) {
        lock.lock();
        try {
            if (req.end()) {
                sessions.remove(req.session());
                acknowledged.signalAll();
                return new LeaseReply(incarnation, seq, 0, false, List.of());
            }
            Session s = sessions.get(req.session());
            boolean ours = req.incarnation() == incarnation && req.appliedSeq() <= seq;
            if (s == null) {
                s = new Session();
                sessions.put(req.session(), s);
                // a session new to this master holds no lease from it: until it applies this reply
                // (which brings it to seq, or resyncs it) it can use nothing, so it holds up no one
                s.applied = seq;
            } else if (ours && req.appliedSeq() > s.applied) {
                s.applied = req.appliedSeq();
                acknowledged.signalAll();
            }
            long holdNanos = Math.min(TimeUnit.MILLISECONDS.toNanos(req.holdMillis()), maxHoldNanos);
            if (ours && req.appliedSeq() == seq && holdNanos > 0) {
                long deadline = nanos.getAsLong() + holdNanos;
                s.parked++;
                try {
                    while (!closed && req.appliedSeq() == seq) {
                        long left = deadline - nanos.getAsLong();
                        if (left <= 0) {
                            break;
                        }
                        published.awaitNanos(left);
                    }
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                } finally {
                    s.parked--;
                }
            }
            s.grantedAt = nanos.getAsLong();
            int leaseMillis = (int) TimeUnit.NANOSECONDS.toMillis(leaseNanos);
            if (!ours || (req.appliedSeq() < seq && (records.isEmpty() || records.peekFirst().seq() > req.appliedSeq() + 1))) {
                return new LeaseReply(incarnation, seq, leaseMillis, true, List.of());
            }
            List<Invalidation> out = new ArrayList<>();
            long last = req.appliedSeq();
            int bytes = 0;
            for (Invalidation inv : records) {
                if (inv.seq() <= req.appliedSeq()) {
                    continue;
                }
                if (!out.isEmpty() && bytes + inv.wireBytes() > MAX_REPLY_BYTES) {
                    break;
                }
                out.add(inv);
                bytes += inv.wireBytes();
                last = inv.seq();
            }
            return new LeaseReply(incarnation, last, leaseMillis, false, out);
        } finally {
            lock.unlock();
        }
    }

    /** Forgets sessions whose lease ran out long ago and that have no renewal parked. */
    void expire() {
        lock.lock();
        try {
            long now = nanos.getAsLong();
            sessions.values().removeIf(s -> s.parked == 0 && now - (s.grantedAt + 2 * expiryNanos) > 0);
        } finally {
            lock.unlock();
        }
    }

    /** Wakes every parked renewal and waiter; they answer at once. */
    void close() {
        lock.lock();
        try {
            closed = true;
            published.signalAll();
            acknowledged.signalAll();
        } finally {
            lock.unlock();
        }
    }
}
