package io.kvpool.client;

/**
 * How much room and how many generations this client asks for with its next write lease.
 *
 * <h2>Why it moves</h2>
 * Taking a lease is not free: a WRITE_LEASE to the master, and on the node's machine a connection of
 * the lease's own to the node and a NODE_SHM_LEASE on it; giving one back is a RELEASE to the master.
 * Measured here with one client putting 1 MiB values on its own machine: about 1.1 ms a renewal, one
 * renewal every 27 puts of a 32 MiB lease, so 40 us of every put's 330 us (the copy itself is 170).
 * A writer that streams large values uses a lease up quickly and should ask for more; one that writes
 * now and then should not hold a large range it barely uses.
 *
 * <h2>The rule</h2>
 * The ask is {@link #BASE_BYTES} and {@link #BASE_GENERATIONS} times a factor. A lease used up (too
 * little room or no generation left to keep) within {@link #FAST_NANOS} of its grant doubles the factor,
 * up to {@link #MAX_FACTOR}; one that took longer than {@link #SLOW_NANOS} halves it; a lease let go
 * because it sat idle sets it back to 1. So a streaming writer reaches 8x (256 MiB) after three quick
 * leases, and an occasional one stays at 1x. The master still decides what it grants: room beyond the
 * first batch only from free space, at most an eighth of an average segment, and only while all live
 * leases hold less than an eighth of the pool unwritten (docs/architecture.md, "Write leases"), so a
 * larger ask never evicts anything. Thread-safe.
 */
final class LeaseSize {

    /** Bytes asked for at factor 1 when the batch needs less: later puts fill the rest. */
    static final long BASE_BYTES = 32L << 20;
    /** Generations asked for at factor 1 when the batch needs fewer. */
    static final int BASE_GENERATIONS = 1024;
    /** The largest factor: 256 MiB and 8,192 generations. */
    static final int MAX_FACTOR = 8;
    /** A lease used up within this of its grant makes the next ask twice as large. */
    static final long FAST_NANOS = 1_000_000_000L;
    /** A lease that took longer than this to use up makes the next ask half as large. */
    static final long SLOW_NANOS = 10_000_000_000L;

    private int factor = 1;

    /** Bytes to ask for now, when the batch needs {@code needed}. */
    synchronized long bytes(long needed) {
        return Math.max(BASE_BYTES * factor, needed);
    }

    /** Generations to ask for now, when the batch needs {@code needed}. */
    synchronized int generations(int needed) {
        return Math.max(BASE_GENERATIONS * factor, needed);
    }

    synchronized int factor() {
        return factor;
    }

    /** A lease was used up {@code lifetimeNanos} after its grant. */
    synchronized void usedUp(long lifetimeNanos) {
        if (lifetimeNanos < FAST_NANOS) {
            factor = Math.min(MAX_FACTOR, factor * 2);
        } else if (lifetimeNanos > SLOW_NANOS) {
            factor = Math.max(1, factor / 2);
        }
    }

    /** A lease was let go because it sat idle: the writer is not streaming now. */
    synchronized void idled() {
        factor = 1;
    }
}
