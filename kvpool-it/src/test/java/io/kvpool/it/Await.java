package io.kvpool.it;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.master.MasterConfig;

import java.time.Duration;
import java.util.function.BooleanSupplier;

/** Waits in tests, each with a deadline: a fault fails the test with what it waited for, never hangs CI. */
final class Await {

    /** The deadline of a wait that names none. */
    static final Duration DEFAULT = Duration.ofSeconds(60);

    private Await() {
    }

    /** Polls {@code condition} every 20 ms until it holds; an AssertionError naming {@code what} after {@code timeout}. */
    static void until(String what, Duration timeout, BooleanSupplier condition) throws InterruptedException {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("timed out after " + timeout.toSeconds() + " s waiting until " + what);
            }
            Thread.sleep(20);
        }
    }

    static void until(String what, BooleanSupplier condition) throws InterruptedException {
        until(what, DEFAULT, condition);
    }

    /**
     * Waits until objects stop moving between tiers: {@code keys} objects listed (one on its way to the
     * SSD tier is a miss until the node reports it written) and memory below the master's high watermark,
     * so no timer round of eviction will spill more. Only after this may a test of a tiered pool take a
     * miss for a fault: a spill that starts after a bare "every object listed" is a miss for its flight.
     * Assumes the default watermark and no reads that promote.
     */
    static void tiersSettled(KvPoolClient c, long keys) throws InterruptedException {
        until("every object listed (memory or disk) and memory below the eviction watermark", () -> {
            PoolStats s = c.stats();
            return s.keys() == keys && s.allocatedBytes() < MasterConfig.DEFAULT_HIGH_WATERMARK * s.capacityBytes();
        });
    }

    /** A condition whose check may throw (a metrics scrape, a log read). */
    @FunctionalInterface
    interface Check {
        boolean holds() throws Exception;
    }

    /** {@link #until} for a check that may throw: its exception fails the wait (wrapped, naming {@code what}). */
    static void untilChecked(String what, Duration timeout, Check check) throws InterruptedException {
        until(what, timeout, () -> {
            try {
                return check.holds();
            } catch (RuntimeException e) {
                throw e;
            } catch (Exception e) {
                throw new AssertionError("while waiting until " + what + ": " + e, e);
            }
        });
    }
}
