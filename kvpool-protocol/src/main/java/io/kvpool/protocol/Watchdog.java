package io.kvpool.protocol;

import java.io.Closeable;
import java.io.IOException;
import java.time.Duration;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Deadlines for blocking channel I/O. A blocking {@link java.nio.channels.SocketChannel} has no read
 * timeout, so each exchange arms a deadline that closes the channel if it fires; the blocked read or
 * write then fails at once instead of hanging. Armed deadlines sit in a set that one daemon thread
 * sweeps every {@link #TICK_MILLIS} ms: arming and disarming are a set insert and remove, and wake
 * no thread (a timer queue signalled its thread on every exchange, which cost a quarter of a
 * client's CPU on small requests). A deadline fires up to one tick late.
 */
public final class Watchdog {

    /** How often armed deadlines are checked. */
    static final long TICK_MILLIS = 10;

    private static final Set<Deadline> ARMED = ConcurrentHashMap.newKeySet();

    static {
        Thread t = new Thread(Watchdog::sweep, "kvpool-watchdog");
        t.setDaemon(true);
        t.start();
    }

    private Watchdog() {
    }

    private static void sweep() {
        while (true) {
            try {
                Thread.sleep(TICK_MILLIS);
            } catch (InterruptedException e) {
                return;
            }
            long now = System.nanoTime();
            for (Deadline d : ARMED) {
                if (now - d.at >= 0 && ARMED.remove(d)) {
                    d.fired = true;
                    try {
                        d.target.close();
                    } catch (IOException ignored) {
                        // the target is being abandoned; nothing more to do
                    }
                }
            }
        }
    }

    /** An armed deadline; closing it disarms it. {@link #fired()} tells whether it closed the target. */
    public static final class Deadline implements AutoCloseable {
        private final Closeable target;
        private final long at;
        private volatile boolean fired;

        private Deadline(Closeable target, Duration timeout) {
            this.target = target;
            this.at = System.nanoTime() + Math.max(1, timeout.toNanos());
            ARMED.add(this);
        }

        public boolean fired() {
            return fired;
        }

        @Override
        public void close() {
            ARMED.remove(this);
        }
    }

    /** Arms a deadline that closes {@code target} after {@code timeout} unless disarmed first. */
    public static Deadline arm(Closeable target, Duration timeout) {
        return new Deadline(target, timeout);
    }
}
