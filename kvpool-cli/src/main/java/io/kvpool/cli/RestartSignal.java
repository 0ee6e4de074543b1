package io.kvpool.cli;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * SIGUSR1 as "stop for a restart": a node stops keeping its segment file, for the next start to
 * adopt ({@link RollingRestart} sends it). SIGTERM keeps its meaning, stop and remove everything.
 * SIGUSR2 is the JVM's own, SIGHUP already means stop, hence USR1. The handler runs on a thread of
 * its own, as a shutdown hook would.
 */
final class RestartSignal {

    private static final Logger log = LoggerFactory.getLogger(RestartSignal.class);

    /** The signal's name as {@code kill -s} takes it. */
    static final String NAME = "USR1";

    private RestartSignal() {
    }

    /** Runs {@code action} when the process receives SIGUSR1; returns false (and logs) where it cannot be caught. */
    @SuppressWarnings("removal")
    static boolean onRestart(Runnable action) {
        try {
            sun.misc.Signal.handle(new sun.misc.Signal(NAME),
                    sig -> Thread.ofPlatform().name("kvpool-restart").start(action));
            return true;
        } catch (IllegalArgumentException | UnsupportedOperationException e) {
            log.warn("SIGUSR1 cannot be handled here ({}); a rolling restart will stop this process with SIGTERM", e.toString());
            return false;
        }
    }
}
