package io.kvpool.client;

import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.RemoteException;
import io.kvpool.protocol.msg.LeaseMessages.LeaseReply;
import io.kvpool.protocol.msg.LeaseMessages.LeaseRequest;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.time.Duration;
import java.util.UUID;
import java.util.function.Function;

/**
 * Keeps this client's read lease (see {@link LocationCache} for the rule it serves) with a long
 * poll: a LEASE request on a connection of its own, which the master holds until an invalidation
 * is published or a quarter of the lease passed. Each answer is applied (invalidations first, then
 * the lease), and the next request, sent at once, acknowledges it. A healthy client therefore
 * applies a removal about one round trip after the master published it, and renews its lease about
 * four times per lease.
 *
 * <p>When the lease has run out anyway (the master was slow or unreachable, or this process was
 * stopped), a reader renews it synchronously through {@link #ensure()}, at most once per
 * {@link #RETRY_AFTER} while renewals fail; until then reads ask the master, as without a cache.
 */
final class LeaseKeeper implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(LeaseKeeper.class);
    /** Shortest pause between failed renewals. */
    static final Duration RETRY_AFTER = Duration.ofMillis(200);

    private final ClientConfig config;
    private final LocationCache cache;
    private final UUID session;
    /** The client's ordinary master connections: renewals there are never held by the master. */
    private final MasterChannel master;
    private final Object renewLock = new Object();
    private final Thread poller;
    private volatile FrameConnection poll; // the poller's own connection
    private volatile int holdMillis;
    private volatile long lastFailure = System.nanoTime() - RETRY_AFTER.toNanos();
    private volatile boolean failing;
    private volatile boolean closed;

    LeaseKeeper(ClientConfig config, LocationCache cache, UUID session, MasterChannel master) {
        this.config = config;
        this.cache = cache;
        this.session = session;
        this.master = master;
        this.poller = Thread.ofVirtual().name("kvpool-client-lease").unstarted(this::pollLoop);
    }

    /** Takes the first lease (so the client starts with one if the master answers) and starts polling. */
    void start() {
        ensure();
        poller.start();
    }

    /**
     * True if the lease runs now, renewing it first if it does not (unless a renewal failed within
     * {@link #RETRY_AFTER}). False means: ask the master for every location.
     */
    boolean ensure() {
        if (cache.leaseValid(System.nanoTime())) {
            return true;
        }
        synchronized (renewLock) {
            long now = System.nanoTime();
            if (cache.leaseValid(now)) {
                return true;
            }
            if (closed || now - lastFailure < RETRY_AFTER.toNanos()) {
                return false;
            }
            try {
                renew(0, this::call);
            } catch (RuntimeException e) {
                lastFailure = System.nanoTime();
                log.debug("read lease renewal failed: {}", e.getMessage());
                return false;
            }
            return cache.leaseValid(System.nanoTime());
        }
    }

    /** One renewal through {@code via}: sends what this client has applied, applies the answer. */
    private void renew(int hold, Function<LeaseRequest, LeaseReply> via) {
        long[] at = cache.position();
        long sent = System.nanoTime();
        LeaseReply reply = via.apply(new LeaseRequest(session, at[0], at[1], hold, false));
        cache.apply(reply, sent);
        holdMillis = Math.max(1, reply.leaseMillis() / 4);
    }

    private void pollLoop() {
        while (!closed) {
            try {
                renew(holdMillis, this::pollCall);
                if (failing) {
                    log.info("read lease: master {} answers again", config.master());
                    failing = false;
                }
            } catch (RuntimeException e) {
                closePoll();
                if (closed) {
                    return;
                }
                if (!failing) {
                    log.warn("read lease: cannot renew with master {} ({}); reads ask the master until it answers",
                            config.master(), e.getMessage());
                    failing = true;
                }
                try {
                    Thread.sleep(RETRY_AFTER);
                } catch (InterruptedException ie) {
                    return;
                }
            }
        }
    }

    /**
     * A renewal on an ordinary master connection (answered at once: hold 0, or an end), bounded by
     * the connect timeout rather than the request timeout: a reader waiting on it would otherwise wait
     * for a hung master far longer than the lease it is after.
     */
    private LeaseReply call(LeaseRequest req) {
        BodyWriter w = new BodyWriter(48);
        req.write(w);
        return master.call(Opcode.LEASE, w, LeaseReply::read, config.connectTimeout());
    }

    /** A renewal on the poller's own connection, which the master may hold for {@code holdMillis}. */
    private LeaseReply pollCall(LeaseRequest req) {
        try {
            if (poll == null || poll.isBroken()) {
                closePoll();
                poll = FrameConnection.connect(master.address(), config.connectTimeout(), config.limits(), config.secrets());
            }
            BodyWriter w = new BodyWriter(48);
            req.write(w);
            Duration timeout = Duration.ofMillis(req.holdMillis()).plus(config.requestTimeout());
            return LeaseReply.read(poll.call(Opcode.LEASE, w, timeout).body());
        } catch (IOException | RemoteException e) {
            throw new KvPoolException("lease renewal with " + config.master() + " failed: " + e.getMessage(), e);
        }
    }

    private void closePoll() {
        FrameConnection c = poll;
        poll = null;
        if (c != null) {
            try {
                c.close();
            } catch (IOException ignored) {
                // replacing it
            }
        }
    }

    /** Gives the lease up and tells the master, so that no removal waits for this client. */
    @Override
    public void close() {
        if (closed) {
            return;
        }
        closed = true;
        cache.release();
        poller.interrupt();
        closePoll();
        try {
            long[] at = cache.position();
            call(new LeaseRequest(session, at[0], at[1], 0, true));
        } catch (RuntimeException e) {
            log.debug("could not tell the master this client's lease ended: {}", e.getMessage());
        }
    }
}
