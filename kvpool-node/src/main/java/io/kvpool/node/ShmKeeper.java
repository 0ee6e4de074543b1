package io.kvpool.node;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.time.Duration;

/**
 * A running node's part in the orphan rule ({@link OrphanedSegments}): every
 * {@link ShmDir#sweepInterval()} it looks at the shared-memory directory, so that it notices the
 * files of nodes that died while it runs, and reclaims those it has seen for the orphan grace. So a
 * node that never comes back leaves nothing behind while any node runs on the machine, and one that
 * comes back within the grace finds its file. One daemon thread, stopped by {@link #close()};
 * {@link #runOnce()} is one round, which tests call with an injected clock.
 */
final class ShmKeeper implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(ShmKeeper.class);

    private final OrphanedSegments orphans;
    private final Duration interval;
    private final Thread thread;
    private volatile boolean running = true;

    /** Starts the thread when {@code start} (a node); without it only {@link #runOnce()} runs (tests). */
    ShmKeeper(OrphanedSegments orphans, Duration interval, boolean start) {
        this.orphans = orphans;
        this.interval = interval;
        this.thread = start ? Thread.ofPlatform().daemon().name("kvpool-node-shm-keeper").start(this::run) : null;
    }

    /** One round: remember new orphans, reclaim those seen for the grace. */
    void runOnce() {
        orphans.reclaimExpired();
    }

    private void run() {
        while (running) {
            try {
                Thread.sleep(interval);
                runOnce();
            } catch (InterruptedException e) {
                return;
            } catch (RuntimeException e) {
                log.warn("looking for orphaned segment files failed ({}); trying again in {}", e.toString(), interval);
            }
        }
    }

    @Override
    public void close() {
        running = false;
        if (thread != null) {
            thread.interrupt();
            try {
                thread.join(2000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }
}
