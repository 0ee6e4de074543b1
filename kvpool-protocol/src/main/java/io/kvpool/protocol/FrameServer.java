package io.kvpool.protocol;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.Closeable;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.StandardSocketOptions;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Predicate;

/**
 * The serving end of kvpool connections, used by the master and by nodes.
 *
 * <h2>Threads</h2>
 * One platform thread accepts; each connection is served on its own thread (platform by default,
 * see {@link #VIRTUAL_THREADS}), which blocks on the socket and runs the {@link RequestHandler} inline. Blocking channel I/O lets a node read a
 * payload straight from the socket into its segment and write a reply straight from it.
 *
 * <h2>Bad input</h2>
 * Every header is validated before anything is allocated for it. A bad magic, version or reserved
 * field, an unknown opcode, or a body or payload over {@link Limits} gets an error reply naming the
 * problem and the connection is closed (its stream position can no longer be trusted). Other
 * connections are unaffected. Once a frame has begun to arrive, the rest of it must arrive within
 * the frame timeout, so a stalled sender cannot hold a half-written region forever.
 */
public final class FrameServer implements Closeable {

    private static final Logger log = LoggerFactory.getLogger(FrameServer.class);

    /**
     * Connection threads: platform threads by default (a blocking read sleeps in the kernel and wakes
     * straight up; measured here, a small request's round trip takes about half as long as on a
     * virtual thread, whose reads go through the poller and the scheduler). Set the system property
     * {@code kvpool.serverThreads=virtual} for deployments with many thousands of connections.
     */
    static final boolean VIRTUAL_THREADS = "virtual".equalsIgnoreCase(System.getProperty("kvpool.serverThreads", "platform"));

    private final String name;
    private final Limits limits;
    private final Duration frameTimeout;
    private final Predicate<Opcode> accepts;
    private final RequestHandler handler;
    private final ServerSocketChannel server;
    private final Set<SocketChannel> connections = ConcurrentHashMap.newKeySet();
    private final Thread acceptor;
    private volatile boolean closed;

    /**
     * Binds and starts serving.
     *
     * @param name         for thread names and logs, e.g. {@code master} or {@code node 10.0.0.2:50052}
     * @param bind         address to listen on; port 0 picks a free port
     * @param accepts      which opcodes this server serves; others get {@link FrameStatus#UNKNOWN_OPCODE}
     * @param frameTimeout how long the rest of a frame may take once its first byte arrived
     */
    public FrameServer(String name, InetSocketAddress bind, Limits limits, Duration frameTimeout,
                       Predicate<Opcode> accepts, RequestHandler handler) throws IOException {
        this.name = name;
        this.limits = limits;
        this.frameTimeout = frameTimeout;
        this.accepts = accepts;
        this.handler = handler;
        this.server = ServerSocketChannel.open();
        try {
            server.setOption(StandardSocketOptions.SO_REUSEADDR, true);
            server.bind(bind, 1024);
        } catch (IOException e) {
            server.close();
            throw new IOException(name + ": cannot listen on " + bind + ": " + e.getMessage(), e);
        }
        this.acceptor = Thread.ofPlatform().daemon().name(name + "-accept").start(this::acceptLoop);
    }

    public int port() {
        return ((InetSocketAddress) server.socket().getLocalSocketAddress()).getPort();
    }

    public int connectionCount() {
        return connections.size();
    }

    private void acceptLoop() {
        while (!closed) {
            try {
                SocketChannel ch = server.accept();
                ch.setOption(StandardSocketOptions.TCP_NODELAY, true);
                connections.add(ch);
                (VIRTUAL_THREADS ? Thread.ofVirtual() : Thread.ofPlatform().daemon())
                        .name(name + "-conn").start(() -> serve(ch));
            } catch (ClosedChannelException e) {
                return;
            } catch (IOException e) {
                if (!closed) {
                    log.warn("{}: accept failed: {}", name, e.toString());
                }
            }
        }
    }

    private void serve(SocketChannel ch) {
        String peer;
        try {
            peer = String.valueOf(ch.getRemoteAddress()).replaceFirst("^/", "");
        } catch (IOException e) {
            peer = "unknown peer";
        }
        ByteBuffer header = FrameHeader.allocate();
        ByteBuffer replyHeader = FrameHeader.allocate();
        ByteBuffer scratch = ByteBuffer.allocateDirect(64 << 10);
        // bodies live on the heap: parsing copies many small fields (keys) out of them, which is far
        // cheaper from a heap buffer than from a direct one; payloads never come through here
        ByteBuffer body = ByteBuffer.allocate(64 << 10).order(ByteOrder.LITTLE_ENDIAN);
        try {
            while (!closed) {
                header.clear();
                // wait as long as it takes for a frame to begin, then bound the rest of it
                if (ch.read(header) < 0) {
                    return;
                }
                try (Watchdog.Deadline d = Watchdog.arm(ch, frameTimeout)) {
                    Channels.readFully(ch, header);
                    FrameHeader.Decoded h;
                    Opcode op;
                    try {
                        h = FrameHeader.decode(header, limits);
                        op = Opcode.of(h.opcode());
                        if (h.reply()) {
                            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, h.requestId(),
                                    "received a reply frame where a request was expected");
                        }
                        if (h.status() != 0) {
                            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, h.requestId(),
                                    "a request must have status 0, got " + h.status());
                        }
                        if (op == null || !accepts.test(op)) {
                            throw new MalformedFrameException(FrameStatus.UNKNOWN_OPCODE, h.requestId(),
                                    String.format("opcode 0x%02x is not served by %s", h.opcode(), name));
                        }
                    } catch (MalformedFrameException e) {
                        log.warn("{}: closing connection from {}: {}", name, peer, e.getMessage());
                        writeError(ch, replyHeader, header.get(FrameHeader.OPCODE_OFFSET) & 0xFF, e.requestId(),
                                e.status(), e.getMessage());
                        return;
                    }
                    if (body.capacity() < h.bodyLength()) {
                        body = ByteBuffer.allocate(h.bodyLength()).order(ByteOrder.LITTLE_ENDIAN);
                    }
                    body.clear().limit(h.bodyLength());
                    Channels.readFully(ch, body);
                    body.flip();
                    Request req = new Request(ch, peer, op, h.requestId(), new BodyReader(body), h.payloadLength(),
                            replyHeader, scratch);
                    if (!dispatch(req, ch, replyHeader)) {
                        return;
                    }
                    if (d.fired()) {
                        return;
                    }
                }
                if (body.capacity() > (1 << 20)) {
                    body = ByteBuffer.allocate(64 << 10).order(ByteOrder.LITTLE_ENDIAN);
                }
            }
        } catch (IOException e) {
            if (!closed) {
                log.debug("{}: connection from {} ended: {}", name, peer, e.toString());
            }
        } finally {
            connections.remove(ch);
            lingeringClose(ch, scratch);
            handler.connectionClosed(peer);
        }
    }

    /** Most bytes drained from a connection being closed, and how long that may take. */
    private static final int LINGER_BYTES = 4 << 20;
    private static final Duration LINGER_TIME = Duration.ofSeconds(1);

    /**
     * Closes a connection without losing the error reply just written: closing a socket with unread
     * input makes TCP send a reset, and the peer's read of our reply then fails. So: send FIN, drain
     * what the peer already sent (bounded in bytes and time), then close.
     */
    private void lingeringClose(SocketChannel ch, ByteBuffer scratch) {
        if (!closed && ch.isOpen()) {
            try (Watchdog.Deadline d = Watchdog.arm(ch, LINGER_TIME)) {
                ch.shutdownOutput();
                long drained = 0;
                int n;
                do {
                    scratch.clear();
                    n = ch.read(scratch);
                    drained += Math.max(0, n);
                } while (n >= 0 && drained < LINGER_BYTES);
            } catch (IOException ignored) {
                // the peer went away or the linger time passed; close regardless
            }
        }
        try {
            ch.close();
        } catch (IOException ignored) {
            // closing anyway
        }
    }

    /** Runs the handler; returns false when the connection must be closed afterwards. */
    private boolean dispatch(Request req, SocketChannel ch, ByteBuffer replyHeader) throws IOException {
        try {
            handler.handle(req);
            if (!req.replied()) {
                throw new IllegalStateException("handler for " + req.opcode().metricName + " sent no reply");
            }
            if (req.payloadRemaining() != 0) {
                log.warn("{}: {} from {} left {} payload bytes unread; closing connection", name,
                        req.opcode().metricName, req.peer(), req.payloadRemaining());
                return false;
            }
            return true;
        } catch (MalformedFrameException e) {
            log.warn("{}: closing connection from {}: {}", name, req.peer(), e.getMessage());
            if (!req.replied()) {
                writeError(ch, replyHeader, req.opcode().code, req.requestId(), e.status(), e.getMessage());
            }
            return false;
        } catch (BadRequestException | IllegalArgumentException e) {
            if (!req.replied()) {
                writeError(ch, replyHeader, req.opcode().code, req.requestId(), FrameStatus.BAD_REQUEST, e.getMessage());
            }
            // the stream stays in step only if the request's payload was consumed
            return req.payloadRemaining() == 0;
        } catch (IOException e) {
            throw e;
        } catch (RuntimeException e) {
            log.error("{}: {} from {} failed", name, req.opcode().metricName, req.peer(), e);
            if (!req.replied()) {
                writeError(ch, replyHeader, req.opcode().code, req.requestId(), FrameStatus.INTERNAL_ERROR,
                        e.getClass().getSimpleName() + ": " + e.getMessage());
            }
            return req.payloadRemaining() == 0;
        }
    }

    static void writeError(SocketChannel ch, ByteBuffer header, int opcode, long requestId, FrameStatus status,
                           String message) throws IOException {
        String text = message == null ? "" : message;
        if (text.length() > 2000) {
            // cut on a character boundary (never inside a surrogate pair) so the message stays valid UTF-8
            int cut = Character.isHighSurrogate(text.charAt(1999)) ? 1999 : 2000;
            text = text.substring(0, cut) + "...";
        }
        byte[] msg = text.getBytes(StandardCharsets.UTF_8);
        BodyWriter w = new BodyWriter(msg.length + 2).bytes(msg);
        ByteBuffer b = w.buffer();
        FrameHeader.write(header, opcode, true, status.code, requestId, b.remaining(), 0);
        try {
            Channels.writeFully(ch, header, b);
        } catch (IOException e) {
            // the peer may already be gone; the connection is being closed either way
        }
    }

    @Override
    public void close() throws IOException {
        closed = true;
        server.close();
        for (SocketChannel ch : connections) {
            try {
                ch.close();
            } catch (IOException ignored) {
                // shutting down
            }
        }
        try {
            acceptor.join(2000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
