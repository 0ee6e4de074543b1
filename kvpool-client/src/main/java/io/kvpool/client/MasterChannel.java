package io.kvpool.client;

import io.kvpool.config.HostPort;
import io.kvpool.config.LocalHost;
import io.kvpool.etcd.LeaderRecord;
import io.kvpool.etcd.MasterLocator;
import io.kvpool.protocol.AuthenticationException;
import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.FrameStatus;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.RemoteException;
import io.kvpool.protocol.msg.MasterMessages;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.net.SocketTimeoutException;
import java.time.Duration;
import java.util.Collections;
import java.util.Map;
import java.util.UUID;
import java.util.WeakHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Function;

/**
 * The client's connections to the master: a bounded pool, each connection opened with HELLO, and
 * one call at a time on each. Turns the master's answers into the client's exceptions: a
 * BAD_REQUEST is an {@link IllegalArgumentException} carrying the master's message; anything else
 * that fails is a {@link KvPoolException} naming the master and the operation.
 *
 * <p>HELLO also tells whether the master restarted since the last connection (its incarnation
 * changed); {@code onRestart} then runs, before the new connection is used.
 *
 * <h2>Elected masters</h2>
 * Given {@code etcd://...}, the channel talks to the leader that the leader record names once it is
 * ready ({@link MasterLocator}). When a call to it fails at the connection level, the channel looks
 * the leader up again (a new one may have been elected) and retries on a fresh connection until the
 * call's deadline: a failover costs the calls in flight a wait, not an error. A new leader is a new
 * master incarnation, so {@code onRestart} runs as after a restart. A call is sent again only when its
 * connection failed; what the old leader did with it before failing is answered by the new one as any
 * retry is (a PUT_END it never saw is EXPIRED, a COMMIT of a lease it never granted is EXPIRED).
 *
 * <h2>Master runs</h2>
 * Each new master incarnation met (a restart, a new leader) moves {@link #run}, before
 * {@code onRestart} runs. Every connection remembers the run it greeted its master in, and
 * {@link #callInRun} hands it back with the answer: an answer naming segment ids and offsets is
 * valid only in that run (see SegmentAccess). The run is the answering connection's, not the one
 * read before the call: a call retried on a new master's connection is answered in the new run, and
 * an answer from a connection to a deposed leader carries the old one.
 */
final class MasterChannel implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(MasterChannel.class);

    private final ClientConfig config;
    private final UUID clientId;
    private final String localHost = LocalHost.defaultAdvertiseAddress();
    private final Runnable onRestart;
    private final MasterLocator masters;
    /** The master connected to and its pool; replaced when the leader changes. */
    private volatile Current current;
    private volatile long incarnation;
    private volatile long maxValueBytes = Long.MAX_VALUE;
    private volatile int defaultReplicas;
    private volatile long term;
    private volatile boolean closed;
    /** Master runs met (see the class comment); moved under {@link #runLock}. */
    private final AtomicInteger run = new AtomicInteger();
    private final Object runLock = new Object();
    /** The run each open connection greeted its master in (weak: the pools close and drop connections). */
    private final Map<FrameConnection, Integer> greetedIn = Collections.synchronizedMap(new WeakHashMap<>());

    /** One master's connections. */
    private record Current(MasterLocator.Leader leader, ConnectionPool pool) {
    }

    /** A master's answer and the master run of the connection that carried it. */
    record Answer<T>(T value, int run) {
    }

    MasterChannel(ClientConfig config, UUID clientId, Runnable onRestart) {
        this.config = config;
        this.clientId = clientId;
        this.onRestart = onRestart;
        this.masters = MasterLocator.of(config.master(), config.connectTimeout());
        masters.onChange(this::leaderChanged);
    }

    /**
     * The leader record changed: once it names a ready leader other than the one connected to, move
     * there and abandon the old connections, so calls waiting on a leader that is frozen or cut off
     * fail over now instead of at their deadline.
     */
    private void leaderChanged() {
        LeaderRecord r = masters.latest();
        Current c = current;
        if (r == null || !r.ready() || c == null || closed) {
            return;
        }
        HostPort address;
        try {
            address = HostPort.parse(r.address());
        } catch (IllegalArgumentException e) {
            return; // the locator reports it when asked
        }
        MasterLocator.Leader l = new MasterLocator.Leader(address, r.term());
        synchronized (this) {
            if (current == c && !c.leader().equals(l) && r.term() > c.leader().term()) {
                log.info("master: leader is now {} (term {}); was {}", address, r.term(), c.leader().address());
                current = open(l);
                c.pool().abandon();
            }
        }
    }

    /** Largest value the master accepts (from its HELLO reply; unbounded until the first connection). */
    long maxValueBytes() {
        return maxValueBytes;
    }

    /** Copies the master makes of an object when a put asks for 0 (from its HELLO reply; 0 until the first connection). */
    int defaultReplicas() {
        return defaultReplicas;
    }

    /** The term of the master last connected to (0 when masters are not elected). */
    long term() {
        return term;
    }

    /** The master to talk to now (the leader, with an election), waiting up to the request timeout to learn it. */
    HostPort address() {
        return current(config.requestTimeout()).leader().address();
    }

    private void hello(FrameConnection c) throws IOException {
        BodyWriter w = new BodyWriter();
        new MasterMessages.Hello(MasterMessages.Role.CLIENT, clientId, localHost, ProcessHandle.current().pid()).write(w);
        MasterMessages.HelloReply r = MasterMessages.HelloReply.read(c.call(Opcode.HELLO, w, config.requestTimeout()).body());
        maxValueBytes = r.maxValueBytes();
        defaultReplicas = r.defaultReplicas();
        term = r.term();
        synchronized (runLock) {
            if (incarnation != 0 && incarnation != r.incarnation()) {
                log.info("master {} {}; refreshing the segment table and forgetting remembered locations",
                        config.master(), masters.elected() ? "is a new leader (term " + r.term() + ")" : "restarted");
                run.incrementAndGet();
                onRestart.run();
            }
            incarnation = r.incarnation();
            greetedIn.put(c, run.get());
        }
    }

    /** How many master changes this client has met (see the class comment). */
    int run() {
        return run.get();
    }

    /** The current master's pool, locating the master first if there is none yet. */
    private Current current(Duration timeout) {
        Current c = current;
        if (c != null) {
            return c;
        }
        synchronized (this) {
            if (current == null) {
                current = open(locate(timeout));
            }
            return current;
        }
    }

    private MasterLocator.Leader locate(Duration timeout) {
        try {
            return masters.locate(timeout, true);
        } catch (IOException e) {
            throw new KvPoolException("no master to talk to: " + e.getMessage(), e);
        }
    }

    private Current open(MasterLocator.Leader l) {
        return new Current(l, new ConnectionPool(l.address(), config.maxConnections(), config.connectTimeout(),
                config.limits(), config.secrets(), config.busyPoll(), this::hello));
    }

    /**
     * After a connection-level failure talking to {@code failed}: moves to the leader etcd names now,
     * waiting (up to {@code deadline}) for a ready one other than {@code failed}. False when none came.
     */
    private boolean relocate(Current failed, long deadline) {
        while (!closed) {
            long left = deadline - System.nanoTime();
            if (left <= 0) {
                return false;
            }
            MasterLocator.Leader l;
            try {
                l = masters.locate(Duration.ofNanos(left), true);
            } catch (IOException e) {
                return false;
            }
            if (!l.equals(failed.leader())) {
                synchronized (this) {
                    if (current == failed) {
                        log.info("master: leader is now {} (term {}); was {}", l.address(), l.term(),
                                failed.leader().address());
                        current = open(l);
                        failed.pool().close();
                    }
                }
                return true;
            }
            // etcd still names the master that failed: its lease has not run out yet
            try {
                Thread.sleep(Math.min(100, Math.max(1, left / 1_000_000)));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return false;
            }
        }
        return false;
    }

    /**
     * One request to the master. A connection-level failure is retried once on a fresh connection
     * (covers idle connections left dead by a master restart), and with elected masters on the new
     * leader until the timeout; a timeout is not retried.
     */
    <T> T call(Opcode op, BodyWriter body, Function<BodyReader, T> parse) {
        return call(op, body, parse, config.requestTimeout());
    }

    /** {@link #call} with its own bound on the exchange (and on waiting for a free connection). */
    <T> T call(Opcode op, BodyWriter body, Function<BodyReader, T> parse, Duration timeout) {
        return callInRun(op, body, parse, timeout).value();
    }

    /** {@link #call}, with the master run the answer belongs to (see the class comment). */
    <T> Answer<T> callInRun(Opcode op, BodyWriter body, Function<BodyReader, T> parse) {
        return callInRun(op, body, parse, config.requestTimeout());
    }

    private <T> Answer<T> callInRun(Opcode op, BodyWriter body, Function<BodyReader, T> parse, Duration timeout) {
        if (closed) {
            throw new IllegalStateException("client is closed");
        }
        long deadline = System.nanoTime() + timeout.toNanos();
        IOException last = null;
        Current cur = current(timeout);
        for (int attempt = 0; ; attempt++) {
            FrameConnection c = null;
            try {
                c = cur.pool().borrow(timeout);
                FrameConnection.Reply reply = c.call(op, body, timeout);
                Integer in = greetedIn.get(c);
                return new Answer<>(parse.apply(reply.body()), in == null ? -1 : in);
            } catch (RemoteException e) {
                if (e.status() == FrameStatus.BAD_REQUEST) {
                    throw new IllegalArgumentException(e.getMessage(), e);
                }
                throw new KvPoolException(e.getMessage(), e);
            } catch (SocketTimeoutException e) {
                if (current == cur) {
                    throw new KvPoolException("master " + cur.leader().address() + " did not answer " + op.metricName
                            + " within " + timeout.toMillis() + " ms", e);
                }
                last = e; // a new leader took over meanwhile: go there
            } catch (AuthenticationException e) {
                throw new KvPoolException(e.getMessage(), e); // a wrong secret: retrying cannot help
            } catch (IOException e) {
                last = e;
                cur.pool().drainIdle();
            } finally {
                if (c != null) {
                    cur.pool().release(c);
                }
            }
            if (current != cur && !closed && System.nanoTime() < deadline) {
                cur = current(timeout); // a new leader took over meanwhile
                continue;
            }
            if (attempt == 0) {
                continue; // once more on a fresh connection to the same master
            }
            if (!masters.elected() || closed || !relocate(cur, deadline)) {
                break;
            }
            cur = current(timeout);
        }
        throw new KvPoolException("master " + (masters.elected() ? config.master() : cur.leader().address())
                + " unreachable for " + op.metricName + ": " + last.getMessage(), last);
    }

    @Override
    public void close() {
        closed = true;
        Current c = current;
        if (c != null) {
            c.pool().close();
        }
        masters.close();
    }
}
