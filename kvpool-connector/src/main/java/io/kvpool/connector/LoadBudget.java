package io.kvpool.connector;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.time.Duration;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Executor;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.function.LongSupplier;
import java.util.function.Supplier;

/**
 * How long the pool may make a request wait: a pool that is slow, frozen or partitioned must cost no more than
 * recomputing. It gives each lookup and each step's loads a deadline, from a fixed budget, or from the engine's
 * measured prefill rate ({@link PrefillRate}: the time recomputing those tokens would take, times a factor), the
 * shorter of the two when both are set; and it leaves the pool alone for a while after it missed one
 * ({@link PoolBreaker}) until a probe of it answers, so that the requests behind do not each pay the deadline.
 *
 * <p>Without a budget and without the prefill rate (the default) nothing has a deadline and lookups run on the
 * caller's thread, as before. With either, a lookup runs on the connector's I/O threads and the scheduler waits
 * for it at most its deadline (a lookup still out then is a miss; it finishes, unused, on its own thread).
 */
final class LoadBudget {

    private static final Logger log = LoggerFactory.getLogger(LoadBudget.class);

    private final LongSupplier clock;
    private final PrefillRate rate = new PrefillRate();
    private final PoolBreaker breaker;
    private volatile long fixedNanos = -1;
    private volatile double prefillFactor = Double.NaN;
    private volatile long lastLookupWarning = Long.MIN_VALUE / 2;
    // step timing (engine thread)
    private long stepTokens;
    private long stepStart;
    private boolean stepTimed;

    LoadBudget(LongSupplier nanoClock, Executor probes) {
        this.clock = nanoClock;
        this.breaker = new PoolBreaker(nanoClock, probes);
    }

    /** A fixed budget for every step's loads and every lookup (null: none). */
    void fixed(Duration budget) {
        if (budget != null && (budget.isNegative() || budget.isZero())) {
            throw new IllegalArgumentException("load deadline must be positive, got " + budget);
        }
        fixedNanos = budget == null ? -1 : budget.toNanos();
    }

    /** Deadlines from the measured prefill rate: {@code factor} times the time recomputing would take (NaN: off). */
    void fromPrefill(double factor) {
        if (!Double.isNaN(factor) && !(factor > 0 && factor <= 100)) {
            throw new IllegalArgumentException("load deadline prefill factor must be in (0, 100], got " + factor);
        }
        prefillFactor = factor;
    }

    boolean active() {
        return fixedNanos > 0 || !Double.isNaN(prefillFactor);
    }

    /** The deadline for moving {@code tokens} tokens' KV, nanoseconds; -1: none. */
    long deadlineNanos(long tokens) {
        long fixed = fixedNanos;
        double factor = prefillFactor;
        long measured = Double.isNaN(factor) ? -1 : rate.deadlineNanos(tokens, factor);
        if (fixed > 0 && measured > 0) {
            return Math.min(fixed, measured);
        }
        return Math.max(fixed, measured);
    }

    /** False while the pool is left alone: the request is a miss at once. */
    boolean admit() {
        return !active() || breaker.admit();
    }

    /** False while the pool is left alone (and no probe is due): saves are skipped. */
    boolean poolInUse() {
        return !active() || breaker.isClosed();
    }

    /**
     * {@code lookup}'s answer, or {@code miss} when it throws or takes longer than recomputing {@code tokens}
     * tokens would (with a deadline set, the pool is then left alone for a while; without, a failure is logged
     * at most every 10 s).
     */
    int lookup(Supplier<Integer> lookup, long tokens, ExecutorService io, int miss) {
        long deadline = deadlineNanos(tokens);
        PoolBreaker.Probe probe = () -> { // answered: within the deadline it missed (or a changed one)
            long limit = deadlineNanos(tokens);
            return limit < 0 ? lookup.get() >= 0 : io.submit(lookup::get).get(limit, TimeUnit.NANOSECONDS) >= 0;
        };
        if (deadline < 0) {
            try {
                return lookup.get();
            } catch (RuntimeException e) {
                long now = clock.getAsLong();
                if (active()) {
                    breaker.failed("a lookup failed (" + e + ")", probe);
                } else if (now - lastLookupWarning > 10_000_000_000L) {
                    lastLookupWarning = now;
                    log.warn("kvpool lookup failed ({}); treating as a miss (logged at most every 10 s)", e.toString());
                }
                return miss;
            }
        }
        Future<Integer> f = io.submit(lookup::get);
        try {
            return f.get(deadline, TimeUnit.NANOSECONDS);
        } catch (TimeoutException e) {
            breaker.failed("a lookup took longer than " + deadline / 1000 + " µs (recomputing would take no longer)",
                    probe);
            return miss;
        } catch (ExecutionException e) {
            breaker.failed("a lookup failed (" + e.getCause() + ")", probe);
            return miss;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return miss;
        }
    }

    /** A step's loads passed their deadline; {@code probe} asks the pool for one of them again. */
    void abandoned(int blocks, PoolBreaker.Probe probe) {
        breaker.failed(blocks + " block loads passed their deadline", probe);
    }

    /** A step's loads landed. */
    void landed() {
        breaker.succeeded();
    }

    /** The engine planned a step computing {@code tokens} tokens. */
    void planned(long tokens) {
        stepTokens = tokens;
    }

    /** The step started; {@code loads}: whether it loads anything (then its time is not the engine's alone). */
    void started(boolean loads) {
        stepStart = clock.getAsLong();
        stepTimed = !loads && stepTokens > 0;
    }

    /** Layer {@code layer} of {@code layers} was computed; the last one ends the step's timing. */
    void layerDone(int layer, int layers) {
        if (stepTimed && layer >= layers - 1) {
            stepTimed = false;
            rate.observe(stepTokens, clock.getAsLong() - stepStart);
        }
    }

    /** Requests that skipped the pool while it was left alone. */
    long skipped() {
        return breaker.skipped();
    }
}
