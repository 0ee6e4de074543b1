package io.kvpool.protocol;

import java.io.Closeable;
import java.io.IOException;
import java.time.Duration;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;

/**
 * Deadlines for blocking channel I/O. A blocking {@link java.nio.channels.SocketChannel} has no read
 * timeout, so each exchange arms a deadline that closes the channel if it fires; the blocked read or
 * write then fails at once instead of hanging. One daemon thread serves every deadline in the process.
 */
public final class Watchdog {

    private static final ScheduledThreadPoolExecutor TIMER;

    static {
        TIMER = new ScheduledThreadPoolExecutor(1, r -> {
            Thread t = new Thread(r, "kvpool-watchdog");
            t.setDaemon(true);
            return t;
        });
        TIMER.setRemoveOnCancelPolicy(true);
    }

    private Watchdog() {
    }

    /** An armed deadline; closing it disarms it. {@link #fired()} tells whether it closed the target. */
    public static final class Deadline implements AutoCloseable {
        private final ScheduledFuture<?> future;
        private volatile boolean fired;

        private Deadline(Closeable target, Duration timeout) {
            this.future = TIMER.schedule(() -> {
                fired = true;
                try {
                    target.close();
                } catch (IOException ignored) {
                    // the target is being abandoned; nothing more to do
                }
            }, Math.max(1, timeout.toNanos()), TimeUnit.NANOSECONDS);
        }

        public boolean fired() {
            return fired;
        }

        @Override
        public void close() {
            future.cancel(false);
        }
    }

    /** Arms a deadline that closes {@code target} after {@code timeout} unless disarmed first. */
    public static Deadline arm(Closeable target, Duration timeout) {
        return new Deadline(target, timeout);
    }
}
