package io.kvpool.connector;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.concurrent.Executor;
import java.util.concurrent.atomic.LongAdder;
import java.util.function.LongSupplier;

/**
 * Whether the connector uses the pool now: a pool that just made a request wait past its deadline (a lookup that
 * did not answer in time, loads abandoned) is left alone, so that the requests behind recompute at once instead of
 * each paying the deadline again, and it is probed off the requests' path until it answers.
 *
 * <h2>Design</h2>
 * <pre>
 *   closed --failed(why, probe)--&gt; open: admit() false (the request skips the pool, counted)
 *   open, the backoff passed: the next admit() starts the probe on the probe executor (still false)
 *   probe answered:  closed, backoff back to 1 s
 *   probe failed:    open, backoff doubles (1 s, 2 s, ... at most 30 s)
 *   loads landed:    closed
 * </pre>
 * The probe is what failed, asked again: the lookup that timed out, or a short read of a block whose load was
 * abandoned (so a frozen node is probed, not only the master). No request ever waits for a probe; probes start only
 * when requests come (an idle engine probes nothing), one at a time. The clock and the executor are injected (tests
 * step the clock and run probes inline). Thread-safe: the scheduler's thread admits, the I/O threads report.
 */
final class PoolBreaker {

    private static final Logger log = LoggerFactory.getLogger(PoolBreaker.class);

    static final long FIRST_BACKOFF_NANOS = 1_000_000_000L;
    static final long MAX_BACKOFF_NANOS = 30_000_000_000L;

    /** A failed call asked again: true when the pool answered it. */
    interface Probe {
        boolean answered() throws Exception;
    }

    private final LongSupplier clock;
    private final Executor probes;
    private final LongAdder skipped = new LongAdder();
    private final LongAdder trips = new LongAdder();
    private boolean open;
    private boolean probing;
    private Probe probe;
    private long retryAt;
    private long backoff = FIRST_BACKOFF_NANOS;

    PoolBreaker(LongSupplier nanoClock, Executor probes) {
        this.clock = nanoClock;
        this.probes = probes;
    }

    /** True when the pool is in use; false (counted as skipped) while it is left alone, maybe starting a probe. */
    boolean admit() {
        Probe start;
        synchronized (this) {
            if (!open) {
                return true;
            }
            skipped.increment();
            if (probing || clock.getAsLong() - retryAt < 0) {
                return false;
            }
            probing = true;
            start = probe;
        }
        probes.execute(() -> probed(ask(start)));
        return false;
    }

    private static boolean ask(Probe p) {
        try {
            return p.answered();
        } catch (Exception | Error e) {
            return false;
        }
    }

    private synchronized void probed(boolean answered) {
        probing = false;
        if (answered) {
            close("a probe answered");
        } else if (open) {
            backoff = Math.min(2 * backoff, MAX_BACKOFF_NANOS);
            retryAt = clock.getAsLong() + backoff;
        }
    }

    /** False while the pool is left alone: saves are skipped then. */
    synchronized boolean isClosed() {
        return !open;
    }

    /** The pool made a request wait past its deadline, or failed it: leave it alone, and probe it with {@code probe}. */
    synchronized void failed(String why, Probe probe) {
        this.probe = probe;
        if (open) {
            return; // a late report of what left it alone already
        }
        open = true;
        backoff = FIRST_BACKOFF_NANOS;
        retryAt = clock.getAsLong() + backoff;
        trips.increment();
        log.warn("kvpool: {}; the engine recomputes without the pool until a probe of it answers (the first in {} ms)",
                why, backoff / 1_000_000);
    }

    /** Loads landed: the pool is in use again. */
    synchronized void succeeded() {
        close("loads landed");
    }

    private void close(String why) {
        if (open) {
            open = false;
            backoff = FIRST_BACKOFF_NANOS;
            log.info("kvpool: {} again; the pool is back in use", why);
        }
    }

    /** Requests that did not use the pool because it was left alone. */
    long skipped() {
        return skipped.sum();
    }

    /** Times the pool was left alone. */
    long trips() {
        return trips.sum();
    }
}
