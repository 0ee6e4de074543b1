package io.kvpool.it;

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
