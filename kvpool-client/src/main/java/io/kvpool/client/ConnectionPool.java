package io.kvpool.client;

import io.kvpool.config.HostPort;
import io.kvpool.protocol.BusyPoll;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.Secrets;

import java.io.IOException;
import java.time.Duration;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedDeque;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Connections to one peer, at most {@code max} at a time. A caller borrows one, runs one exchange,
 * and gives it back; a connection that failed is closed instead of returned. Borrowing blocks (up to
 * the request timeout) when all {@code max} are busy: that is the back-pressure on one peer.
 *
 * <p>Connections a virtual thread used are kept apart: the JDK switches a socket a virtual thread
 * reads or writes to non-blocking mode for good, after which every blocking read by a platform
 * thread costs a read that fails, a poll and a read again. So platform threads take connections no
 * virtual thread used (opening one while fewer than {@code max} are open), and virtual threads (the
 * client's keep-alive and lease threads, callers on virtual threads) take the others first.
 */
final class ConnectionPool implements AutoCloseable {

    /** Sets up a fresh connection (e.g. HELLO to the master) before its first use. */
    interface Initializer {
        void init(FrameConnection c) throws IOException;
    }

    private final HostPort peer;
    private final int max;
    private final Duration connectTimeout;
    private final Limits limits;
    private final Secrets secrets;
    private final Initializer initializer;
    private final Semaphore permits;
    /** Idle connections no virtual thread used: their sockets block. */
    private final ConcurrentLinkedDeque<FrameConnection> idle = new ConcurrentLinkedDeque<>();
    /** Idle connections a virtual thread used: their sockets are non-blocking. */
    private final ConcurrentLinkedDeque<FrameConnection> idleNonBlocking = new ConcurrentLinkedDeque<>();
    private final Set<FrameConnection> nonBlocking = ConcurrentHashMap.newKeySet();
    /** Every connection opened and not closed yet, idle or borrowed (for {@link #abandon}). */
    private final Set<FrameConnection> all = ConcurrentHashMap.newKeySet();
    /** Connections opened and not closed yet. */
    private final AtomicInteger open = new AtomicInteger();
    private volatile boolean closed;
    private final Duration busyPoll;
    /** How the connections' polls for replies went. */
    final BusyPoll.Counters polls = new BusyPoll.Counters();

    ConnectionPool(HostPort peer, int max, Duration connectTimeout, Limits limits, Initializer initializer) {
        this(peer, max, connectTimeout, limits, Secrets.NONE, Duration.ZERO, initializer);
    }

    /**
     * A pool whose connections authenticate with {@code secrets} before anything else (when present), and
     * poll for each reply for up to {@code busyPoll} before blocking ({@link BusyPoll}).
     */
    ConnectionPool(HostPort peer, int max, Duration connectTimeout, Limits limits, Secrets secrets, Duration busyPoll,
                   Initializer initializer) {
        this.secrets = secrets;
        this.busyPoll = busyPoll;
        this.peer = peer;
        this.max = max;
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
        boolean virtual = Thread.currentThread().isVirtual();
        FrameConnection c = virtual ? takeIdle(idleNonBlocking) : takeIdle(idle);
        if (c == null && (virtual || open.get() >= max)) {
            c = takeIdle(virtual ? idle : idleNonBlocking);
        }
        if (c == null) {
            try {
                open.incrementAndGet();
                c = FrameConnection.connect(peer, connectTimeout, limits, secrets).busyPoll(busyPoll, polls);
                all.add(c);
                if (initializer != null) {
                    initializer.init(c);
                }
            } catch (IOException | RuntimeException e) {
                if (c != null) {
                    closeQuietly(c);
                } else {
                    open.decrementAndGet();
                }
                permits.release();
                throw e;
            }
        }
        if (virtual) {
            nonBlocking.add(c);
        }
        return c;
    }

    private FrameConnection takeIdle(ConcurrentLinkedDeque<FrameConnection> from) {
        FrameConnection c;
        while ((c = from.pollFirst()) != null) {
            if (!c.isBroken()) {
                return c;
            }
            closeQuietly(c);
        }
        return null;
    }

    /** Returns a borrowed connection; broken ones are closed. */
    void release(FrameConnection c) {
        if (c.isBroken() || closed || c.payloadLeft() > 0) {
            closeQuietly(c);
        } else {
            c.trim();
            (nonBlocking.contains(c) ? idleNonBlocking : idle).addFirst(c);
        }
        permits.release();
    }

    /** Closes idle connections, e.g. after the peer restarted. */
    void drainIdle() {
        FrameConnection c;
        while ((c = idle.pollFirst()) != null) {
            closeQuietly(c);
        }
        while ((c = idleNonBlocking.pollFirst()) != null) {
            closeQuietly(c);
        }
    }

    /** Connections open now, idle or borrowed. */
    int openConnections() {
        return open.get();
    }

    /** Idle connections: [no virtual thread used them, one did]. */
    int[] idleConnections() {
        return new int[]{idle.size(), idleNonBlocking.size()};
    }

    private void closeQuietly(FrameConnection c) {
        all.remove(c);
        nonBlocking.remove(c);
        open.decrementAndGet();
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

    /**
     * Closes the pool and every connection it opened, borrowed ones too: a call in progress on one
     * fails at once with an I/O error instead of waiting for a peer that will not answer (a master
     * that lost its leadership, frozen or partitioned).
     */
    void abandon() {
        close();
        for (FrameConnection c : all) {
            try {
                c.close();
            } catch (IOException ignored) {
                // abandoning it
            }
        }
    }
}
