package io.kvpool.protocol;

import io.kvpool.config.Durations;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.ReadableByteChannel;
import java.nio.channels.SocketChannel;
import java.time.Duration;
import java.util.concurrent.atomic.LongAdder;

/**
 * Waiting for the next bytes of one plain connection by polling its socket for a short, bounded time
 * before blocking in the kernel: a client waiting for a reply ({@link FrameConnection}), a server
 * waiting for a connection's next frame ({@link ServedConnection}). One per connection; not thread-safe.
 *
 * <h2>Why</h2>
 * A thread that blocks in a read puts its CPU to sleep when nothing else runs there, and the bytes'
 * arrival must wake it. On the virtual machines these benchmarks run on (guest halt-polling off), that
 * wake costs about 30 us, on each side of a round trip. A loopback ping-pong between two threads on
 * different CPUs measured here (a 64-byte request and reply, p50 of 20,000; {@code java scripts/PollFloor.java}):
 * <pre>
 *   both ends block                 79 us
 *   one end polls, the other blocks 25 us
 *   both ends poll                   8 us
 *   same CPU, both block (pinned)    7 us
 * </pre>
 * A prefix match of 1,024 keys by digest is 43 us when the client and the master happen to share a
 * CPU and 110 to 140 us when they do not; which one a run gets is the scheduler's choice.
 *
 * <h2>Bounded, and only where it pays</h2>
 * A poll lasts at most its budget, yielding the CPU between tries ({@link Thread#yield}). It stops as soon
 * as a yield hands the CPU to another thread (the yield took over {@link #YIELDED_AWAY_NANOS}), and the
 * caller blocks: polling pays only on a CPU that would otherwise sleep, and on a busy one it would take
 * the CPU from threads with work to do. A poll that runs out without a byte is a miss: after one, the
 * connection waits without polling, but for one wait in {@value #FIRST_RETRY}, then (after more misses
 * in a row) one in 16, 32 and at most {@value #LAST_RETRY}, until a poll finds its bytes again. So a
 * connection whose peer answers (or asks) within the budget polls every time, and one that carries slow
 * exchanges (a 1 MiB transfer, a client that pauses between requests) soon spends one budget in
 * {@value #LAST_RETRY} waits: 1.6 us a wait at the default budget. Never on a virtual thread (a poll
 * would hold its carrier) and never under TLS (bytes may wait decrypted in the TLS engine, not the
 * socket).
 *
 * <p>The budget: the system property {@value #PROPERTY} for every server (master and node) of the JVM and the
 * default of its Java clients ({@code ClientConfig.busyPoll} sets a client's own), {@code busy_poll} for Python
 * clients; {@code 0} turns polling off.
 */
public final class BusyPoll {

    /**
     * The system property that sets the budget of a JVM's servers and its clients' default (a duration such as
     * {@code 50us}; {@code 0} turns polling off).
     */
    public static final String PROPERTY = "kvpool.busyPoll";

    /**
     * The budget by default, client and server: a master's answer to a 1,024-key lookup is about 45 us, and a
     * client that digests 1,024 keys between two lookups asks again about 50 us after its last answer.
     */
    public static final Duration DEFAULT = Duration.ofNanos(100_000);

    /** The largest budget accepted: past it a poll costs more CPU than a halted CPU's wake-up saves. */
    public static final Duration MAX = Duration.ofMillis(1);

    /**
     * A {@link Thread#yield} that took longer than this gave the CPU to another thread: the CPU is not idle, and a
     * poll stops there (not a miss: the next wait polls again). On an idle CPU a yield returns in about a
     * microsecond.
     */
    static final long YIELDED_AWAY_NANOS = 10_000;

    /** After a miss, one wait in this many polls; each further miss in a row doubles it, up to {@link #LAST_RETRY}. */
    static final int FIRST_RETRY = 8;
    static final int LAST_RETRY = 64;

    /** How the polls of many connections went: found their bytes, ran out, stopped at a busy CPU; time spent. */
    public static final class Counters {
        final LongAdder hits = new LongAdder();
        final LongAdder misses = new LongAdder();
        final LongAdder nanos = new LongAdder();
        final LongAdder yielded = new LongAdder();

        public long hits() {
            return hits.sum();
        }

        public long misses() {
            return misses.sum();
        }

        /** Polls that stopped because a yield ran another thread (the CPU was busy): neither hits nor misses. */
        public long yielded() {
            return yielded.sum();
        }

        /** Wall time spent polling (about the CPU time, minus what {@link Thread#yield} gave away). */
        public long nanos() {
            return nanos.sum();
        }
    }

    private final long budgetNanos;
    private final Counters counters;
    private final long yieldedAwayNanos;
    /** One wait in how many polls (0: every one, the last poll found its bytes). */
    private int retryEvery;
    /** Waits without a poll since the last poll. */
    private int skipped;

    /**
     * A poller with budget {@code budget} ({@link Duration#ZERO}: never polls).
     *
     * @throws IllegalArgumentException when the budget is negative or over {@link #MAX}
     */
    public BusyPoll(Duration budget, Counters counters) {
        this(budget, counters, YIELDED_AWAY_NANOS);
    }

    /** As the public constructor, with another bound on a yield that did not run another thread (tests). */
    BusyPoll(Duration budget, Counters counters, long yieldedAwayNanos) {
        this.budgetNanos = check("busy poll", budget).toNanos();
        this.counters = counters;
        this.yieldedAwayNanos = yieldedAwayNanos;
    }

    /** {@code budget} if it is a budget a poller accepts; else an error naming {@code what}. */
    public static Duration check(String what, Duration budget) {
        if (budget == null || budget.isNegative() || budget.compareTo(MAX) > 0) {
            throw new IllegalArgumentException(what + " must be 0 (off) to " + Durations.format(MAX) + ", got "
                    + (budget == null ? "none" : Durations.format(budget)));
        }
        return budget;
    }

    /**
     * The budget of this JVM's servers, and its clients' default: the system property {@value #PROPERTY} if set,
     * else {@link #DEFAULT}.
     *
     * @throws IllegalArgumentException naming the property when its value is not a budget
     */
    public static Duration configured() {
        String v = System.getProperty(PROPERTY);
        if (v == null || v.isBlank()) {
            return DEFAULT;
        }
        Duration d;
        try {
            d = v.trim().equals("0") ? Duration.ZERO : Durations.parse(v);
        } catch (IllegalArgumentException e) {
            throw new IllegalArgumentException("-D" + PROPERTY + ": " + e.getMessage(), e);
        }
        return check("-D" + PROPERTY, d);
    }

    /**
     * Reads what arrives in {@code in} (the channel over {@code socket}, in blocking mode) into {@code dst}
     * within the budget, if this wait is one to poll. Returns the bytes read (more than 0), -1 at the end
     * of the stream, or 0 when nothing was read (not polled, or nothing came in time): the caller then
     * reads as usual, blocking. The channel is in blocking mode again on return, whatever happened.
     */
    public int read(SocketChannel socket, ReadableByteChannel in, ByteBuffer dst) throws IOException {
        if (budgetNanos == 0 || !dst.hasRemaining() || Thread.currentThread().isVirtual()) {
            return 0;
        }
        if (retryEvery > 0 && ++skipped < retryEvery) {
            return 0;
        }
        skipped = 0;
        long start = System.nanoTime();
        socket.configureBlocking(false);
        try {
            do {
                int n = in.read(dst);
                if (n != 0) {
                    retryEvery = 0;
                    counters.hits.increment();
                    return n;
                }
                long before = System.nanoTime();
                Thread.yield();
                if (System.nanoTime() - before > yieldedAwayNanos) {
                    // another thread wanted this CPU: it is busy, and polling would only take from it; not a
                    // miss (the peer may well be quick), so the next wait polls as this one did
                    counters.yielded.increment();
                    return 0;
                }
            } while (System.nanoTime() - start < budgetNanos);
            retryEvery = retryEvery == 0 ? FIRST_RETRY : Math.min(LAST_RETRY, 2 * retryEvery);
            counters.misses.increment();
            return 0;
        } finally {
            counters.nanos.add(System.nanoTime() - start);
            socket.configureBlocking(true);
        }
    }
}
