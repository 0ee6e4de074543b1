package io.kvpool.client;

import io.kvpool.config.HostPort;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.Limits;

import java.io.IOException;
import java.time.Duration;
import java.util.concurrent.ConcurrentLinkedDeque;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;

/**
 * Connections to one peer, at most {@code max} at a time. A caller borrows one, runs one exchange,
 * and gives it back; a connection that failed is closed instead of returned. Borrowing blocks (up to
 * the request timeout) when all {@code max} are busy: that is the back-pressure on one peer.
 */
final class ConnectionPool implements AutoCloseable {

    /** Sets up a fresh connection (e.g. HELLO to the master) before its first use. */
    interface Initializer {
        void init(FrameConnection c) throws IOException;
    }

    private final HostPort peer;
    private final Duration connectTimeout;
    private final Limits limits;
    private final Initializer initializer;
    private final Semaphore permits;
    private final ConcurrentLinkedDeque<FrameConnection> idle = new ConcurrentLinkedDeque<>();
    private volatile boolean closed;

    ConnectionPool(HostPort peer, int max, Duration connectTimeout, Limits limits, Initializer initializer) {
        this.peer = peer;
        this.connectTimeout = connectTimeout;
        this.limits = limits;
        this.initializer = initializer;
        this.permits = new Semaphore(max);
    }

    HostPort peer() {
        return peer;
    }

    /**
     * Borrows a connection, opening one if none is idle.
     *
     * @throws IOException naming the peer if it cannot be reached, or if all connections stay busy for {@code wait}
     */
    FrameConnection borrow(Duration wait) throws IOException {
        if (closed) {
            throw new IOException("client is closed");
        }
        try {
            if (!permits.tryAcquire(wait.toNanos(), TimeUnit.NANOSECONDS)) {
                throw new IOException("all connections to " + peer + " stayed busy for " + wait.toMillis() + " ms");
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IOException("interrupted waiting for a connection to " + peer);
        }
        FrameConnection c;
        while ((c = idle.pollFirst()) != null) {
            if (!c.isBroken()) {
                return c;
            }
            closeQuietly(c);
        }
        try {
            c = FrameConnection.connect(peer, connectTimeout, limits);
            if (initializer != null) {
                initializer.init(c);
            }
            return c;
        } catch (IOException | RuntimeException e) {
            if (c != null) {
                closeQuietly(c);
            }
            permits.release();
            throw e;
        }
    }

    /** Returns a borrowed connection; broken ones are closed. */
    void release(FrameConnection c) {
        if (c.isBroken() || closed || c.payloadLeft() > 0) {
            closeQuietly(c);
        } else {
            c.trim();
            idle.addFirst(c);
        }
        permits.release();
    }

    /** Closes idle connections, e.g. after the peer restarted. */
    void drainIdle() {
        FrameConnection c;
        while ((c = idle.pollFirst()) != null) {
            closeQuietly(c);
        }
    }

    private static void closeQuietly(FrameConnection c) {
        try {
            c.close();
        } catch (IOException ignored) {
            // discarding it anyway
        }
    }

    @Override
    public void close() {
        closed = true;
        drainIdle();
    }
}
