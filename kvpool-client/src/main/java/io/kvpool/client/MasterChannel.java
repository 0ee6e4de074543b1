package io.kvpool.client;

import io.kvpool.config.LocalHost;
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
import java.util.UUID;
import java.util.function.Function;

/**
 * The client's connections to the master: a bounded pool, each connection opened with HELLO, and
 * one call at a time on each. Turns the master's answers into the client's exceptions: a
 * BAD_REQUEST is an {@link IllegalArgumentException} carrying the master's message; anything else
 * that fails is a {@link KvPoolException} naming the master and the operation.
 *
 * <p>HELLO also tells whether the master restarted since the last connection (its incarnation
 * changed); {@code onRestart} then runs, before the new connection is used.
 */
final class MasterChannel implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(MasterChannel.class);

    private final ClientConfig config;
    private final UUID clientId;
    private final String localHost = LocalHost.defaultAdvertiseAddress();
    private final Runnable onRestart;
    private final ConnectionPool pool;
    private volatile long incarnation;
    private volatile long maxValueBytes = Long.MAX_VALUE;
    private volatile int defaultReplicas;
    private volatile boolean closed;

    MasterChannel(ClientConfig config, UUID clientId, Runnable onRestart) {
        this.config = config;
        this.clientId = clientId;
        this.onRestart = onRestart;
        this.pool = new ConnectionPool(config.master(), config.maxConnections(), config.connectTimeout(),
                config.limits(), this::hello);
    }

    /** Largest value the master accepts (from its HELLO reply; unbounded until the first connection). */
    long maxValueBytes() {
        return maxValueBytes;
    }

    /** Copies the master makes of an object when a put asks for 0 (from its HELLO reply; 0 until the first connection). */
    int defaultReplicas() {
        return defaultReplicas;
    }

    private void hello(FrameConnection c) throws IOException {
        BodyWriter w = new BodyWriter();
        new MasterMessages.Hello(MasterMessages.Role.CLIENT, clientId, localHost, ProcessHandle.current().pid()).write(w);
        MasterMessages.HelloReply r = MasterMessages.HelloReply.read(c.call(Opcode.HELLO, w, config.requestTimeout()).body());
        maxValueBytes = r.maxValueBytes();
        defaultReplicas = r.defaultReplicas();
        if (incarnation != 0 && incarnation != r.incarnation()) {
            log.info("master {} restarted; refreshing the segment table and forgetting remembered locations",
                    config.master());
            onRestart.run();
        }
        incarnation = r.incarnation();
    }

    /**
     * One request to the master. A connection-level failure is retried once on a fresh connection
     * (covers idle connections left dead by a master restart); a timeout is not retried.
     */
    <T> T call(Opcode op, BodyWriter body, Function<BodyReader, T> parse) {
        return call(op, body, parse, config.requestTimeout());
    }

    /** {@link #call} with its own bound on the exchange (and on waiting for a free connection). */
    <T> T call(Opcode op, BodyWriter body, Function<BodyReader, T> parse, Duration timeout) {
        if (closed) {
            throw new IllegalStateException("client is closed");
        }
        IOException last = null;
        for (int attempt = 0; attempt < 2; attempt++) {
            FrameConnection c = null;
            try {
                c = pool.borrow(timeout);
                FrameConnection.Reply reply = c.call(op, body, timeout);
                return parse.apply(reply.body());
            } catch (RemoteException e) {
                if (e.status() == FrameStatus.BAD_REQUEST) {
                    throw new IllegalArgumentException(e.getMessage(), e);
                }
                throw new KvPoolException(e.getMessage(), e);
            } catch (SocketTimeoutException e) {
                throw new KvPoolException("master " + config.master() + " did not answer " + op.metricName + " within "
                        + timeout.toMillis() + " ms", e);
            } catch (IOException e) {
                last = e;
                pool.drainIdle();
            } finally {
                if (c != null) {
                    pool.release(c);
                }
            }
        }
        throw new KvPoolException("master " + config.master() + " unreachable for " + op.metricName + ": "
                + last.getMessage(), last);
    }

    @Override
    public void close() {
        closed = true;
        pool.close();
    }
}
