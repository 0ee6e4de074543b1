package io.kvpool.protocol;

import io.kvpool.config.Durations;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.Closeable;
import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.net.StandardSocketOptions;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.GatheringByteChannel;
import java.nio.channels.ReadableByteChannel;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Function;
import java.util.function.Predicate;

/**
 * The serving end of kvpool connections, used by the master and by nodes.
 *
 * <h2>Threads</h2>
 * One platform thread accepts. A virtual thread waits for each new connection's first bytes (so a
 * connection that never speaks costs a few KiB, not a thread stack); from then on the connection is
 * served on its own thread (platform by default, see {@link #VIRTUAL_THREADS}), which blocks on the
 * socket and runs the {@link RequestHandler} inline. Blocking channel I/O lets a node read a
 * payload straight from the socket into its segment and write a reply straight from it.
 *
 * <h2>Bad input</h2>
 * Every header is validated before anything is allocated for it. A bad magic, version or reserved
 * field, an unknown opcode, or a body or payload over {@link Limits} gets an error reply naming the
 * problem and the connection is closed (its stream position can no longer be trusted). Other
 * connections are unaffected. Once a frame has begun to arrive, the rest of it must arrive within
 * the frame timeout, so a stalled sender cannot hold a half-written region forever.
 *
 * <h2>What a peer can make the server hold</h2>
 * <ul>
 *   <li>Connections: at most {@link Limits#maxConnections()} in all and
 *       {@link Limits#maxConnectionsPerHost()} from one address; one more is answered with an error
 *       naming the limit (request id 0, status {@code INTERNAL_ERROR}) and closed.</li>
 *   <li>Time: a new connection's first frame must arrive within the frame timeout (every kvpool peer
 *       sends one at once), and so must the rest of any frame once it began. After that an idle
 *       connection is a pooled one and may wait.</li>
 *   <li>Memory: a connection starts with a small body buffer that grows (fourfold at a time) only
 *       as body bytes arrive, so a header announcing a large body costs nothing until the body is
 *       sent. Every grown buffer comes out of the process's {@link BodyBudget} (shared with every
 *       other server in the JVM, sized from the heap) until its frame is handled; a frame whose
 *       buffer cannot get its share by half the frame timeout after the frame began, or whose body
 *       is larger than the whole budget, is refused ({@code FRAME_TOO_LARGE}, naming the budget) and
 *       its connection closed.</li>
 * </ul>
 *
 * <h2>Authentication (version 8)</h2>
 * A server given {@link Secrets} serves nothing on a connection but AUTH_BEGIN and AUTH_PROVE
 * ({@link Handshake}) until it has proven the level the request needs ({@code required}: the
 * cluster secret for data operations, the admin secret for destructive ones and node
 * administration). This is judged from the header, before any body byte is read: a request above
 * the connection's level is answered {@code UNAUTHORIZED} naming what is missing, counted, and its
 * connection closed with its body unread, and the authentication frames themselves may carry no
 * more than {@link Handshake#maxBodyBytes} (which fits the connection's standing body buffer) and
 * no payload. So a peer that has not authenticated makes the server buffer at most a few dozen
 * bytes. A failed proof is answered {@code UNAUTHORIZED} too. A server without secrets is open:
 * every connection may do everything.
 *
 * <h2>TLS</h2>
 * When the secrets carry a TLS identity ({@link Secrets#tls()}), every connection is TLS 1.3 with a
 * client certificate the CA bundle vouches for ({@link Tls}), below the frames: the handshake runs on
 * the greeting virtual thread within the frame timeout, then frames (authentication first) flow as
 * without TLS. A new connection whose first bytes are a kvpool frame (a client without TLS) is
 * answered, in plain TCP, {@code UNAUTHORIZED} saying the server requires TLS; a failed handshake
 * gets the TLS alert. Both are counted ({@link #tlsHandshakeFailures()}) and logged with the peer's
 * address. A server without TLS that receives a TLS handshake answers with an error frame saying it
 * does not use TLS, which the client's {@link TlsChannel} recognises and reports.
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
    private final Secrets secrets;
    private final Function<Opcode, Access> required;
    private final AtomicLong refusedAuth = new AtomicLong();
    private final Tls tls;
    private final AtomicLong tlsFailures = new AtomicLong();
    private final ServerSocketChannel server;
    private final Set<SocketChannel> connections = ConcurrentHashMap.newKeySet();
    private final ConcurrentHashMap<InetAddress, AtomicInteger> perHost = new ConcurrentHashMap<>();
    /** Bytes of bodies being received or handled past the connections' standing buffers, process-wide. */
    private final BodyBudget budget;
    private final AtomicLong refusedConnections = new AtomicLong();
    private final AtomicLong timedOutFrames = new AtomicLong();
    private final AtomicLong refusedBodies = new AtomicLong();
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
        this(name, bind, limits, frameTimeout, accepts, handler, Secrets.NONE, op -> Access.NONE, BodyBudget.PROCESS);
    }

    /**
     * As the open constructor, checking that each connection proved with {@code secrets} the level
     * {@code required} names for each opcode (secrets {@link Secrets#NONE}: open).
     */
    public FrameServer(String name, InetSocketAddress bind, Limits limits, Duration frameTimeout,
                       Predicate<Opcode> accepts, RequestHandler handler, Secrets secrets,
                       Function<Opcode, Access> required) throws IOException {
        this(name, bind, limits, frameTimeout, accepts, handler, secrets, required, BodyBudget.PROCESS);
    }

    /** As the public constructors, with another budget for bodies than the process's (tests). */
    FrameServer(String name, InetSocketAddress bind, Limits limits, Duration frameTimeout,
                Predicate<Opcode> accepts, RequestHandler handler, Secrets secrets, Function<Opcode, Access> required,
                BodyBudget budget) throws IOException {
        if (secrets.present() && !secrets.hasAdmin()) {
            throw new IllegalArgumentException(name + ": a server with the cluster secret needs the admin secret too");
        }
        this.secrets = secrets;
        this.tls = secrets.tls();
        this.required = required;
        this.budget = budget;
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

    /** Connections refused because a connection limit was reached. */
    public long refusedConnections() {
        return refusedConnections.get();
    }

    /** Connections closed because a frame, or a new connection's first frame, did not arrive in time. */
    public long timedOutFrames() {
        return timedOutFrames.get();
    }

    /** Connections closed because their authentication failed or a request needed more than they proved. */
    public long refusedAuth() {
        return refusedAuth.get();
    }

    /**
     * Connections refused for TLS: a failed or timed-out handshake (no client certificate, one of
     * another CA), a plain-TCP client of a TLS server, or a TLS client of a plain one.
     */
    public long tlsHandshakeFailures() {
        return tlsFailures.get();
    }

    /** Whether connections must use TLS. */
    public boolean tls() {
        return tls.enabled();
    }

    /**
     * Frames refused because the body budget stayed in use, or because their body was larger than
     * the whole budget.
     */
    public long refusedBodies() {
        return refusedBodies.get();
    }

    /** Bytes of the process's body budget taken now (by every server of this process). */
    public long bodyBytesBuffered() {
        return budget.inUse();
    }

    /** The process's body budget, in bytes (see {@link BodyBudget}). */
    public long bodyBudgetBytes() {
        return budget.bytes();
    }

    /** The budget this server's bodies come out of. */
    BodyBudget budget() {
        return budget;
    }

    /**
     * A connection's standing body buffer, kept for its life; a larger body grows another as its
     * bytes arrive, out of the {@link BodyBudget}, let go after its frame.
     */
    static final int INITIAL_BODY_BYTES = 4 << 10;

    private void acceptLoop() {
        while (!closed) {
            try {
                SocketChannel ch = server.accept();
                ch.setOption(StandardSocketOptions.TCP_NODELAY, true);
                InetAddress from = addressOf(ch);
                String refusal = admit(from);
                if (refusal != null) {
                    refusedConnections.incrementAndGet();
                    Thread.ofVirtual().name(name + "-refuse").start(() -> refuse(ch, refusal));
                    continue;
                }
                connections.add(ch);
                Thread.ofVirtual().name(name + "-greet").start(() -> greet(ch, from));
            } catch (ClosedChannelException e) {
                return;
            } catch (IOException e) {
                if (!closed) {
                    log.warn("{}: accept failed: {}", name, e.toString());
                }
            }
        }
    }

    private static InetAddress addressOf(SocketChannel ch) throws IOException {
        SocketAddress a = ch.getRemoteAddress();
        return a instanceof InetSocketAddress isa ? isa.getAddress() : InetAddress.getLoopbackAddress();
    }

    /** Counts a new connection from {@code from}, or says which limit refuses it (nothing counted then). */
    private String admit(InetAddress from) {
        if (connections.size() >= limits.maxConnections()) {
            return name + " has " + connections.size() + " connections open, its limit (max connections "
                    + limits.maxConnections() + "); try again later";
        }
        AtomicInteger n = perHost.computeIfAbsent(from, k -> new AtomicInteger());
        if (n.incrementAndGet() > limits.maxConnectionsPerHost()) {
            n.decrementAndGet();
            return name + " has " + limits.maxConnectionsPerHost() + " connections open from "
                    + from.getHostAddress() + ", its limit per host (max connections per host); try again later";
        }
        return null;
    }

    private void release(InetAddress from) {
        perHost.computeIfPresent(from, (k, n) -> n.decrementAndGet() <= 0 ? null : n);
    }

    /** Tells a connection over a limit why (in a frame it can read only without TLS), then closes it. */
    private void refuse(SocketChannel ch, String why) {
        log.warn("{}: refusing a connection: {}", name, why);
        if (tls.enabled()) {
            lingeringClose(ch, ByteBuffer.allocate(4 << 10));
            return;
        }
        try {
            writeError(ch, FrameHeader.allocate(), 0, 0, FrameStatus.INTERNAL_ERROR, why);
        } catch (IOException ignored) {
            // the peer went away; closing regardless
        }
        lingeringClose(ch, ByteBuffer.allocate(4 << 10));
    }

    /**
     * Reads a body of {@code length} bytes, growing {@code body} only as bytes arrive; returns the
     * buffer holding it (a larger one when it had to grow), flipped for reading, or null when a larger
     * buffer could not get its share of the body budget by {@code giveUpAt} ({@link System#nanoTime()}).
     * {@code held[0]} counts the budget taken (the capacity of the grown buffer), for the caller to give
     * back.
     */
    private ByteBuffer readBody(ReadableByteChannel ch, ByteBuffer body, int length, int[] held, long giveUpAt)
            throws IOException, InterruptedException {
        ByteBuffer b = body;
        b.clear().limit(Math.min(length, b.capacity()));
        while (true) {
            Channels.readFully(ch, b);
            if (b.position() == length) {
                return b.flip();
            }
            int capacity = (int) Math.min(length, 4L * b.capacity());
            // the old grown buffer becomes garbage: the budget follows the live one's capacity. Every wait
            // of a frame ends by one deadline, half the frame timeout after it began: the refusal is written
            // before the frame's own deadline closes the connection, and a frame that waited at several
            // growths still gives its share back in time
            if (!budget.take(capacity - held[0], Duration.ofNanos(Math.max(0, giveUpAt - System.nanoTime())))) {
                return null;
            }
            held[0] = capacity;
            ByteBuffer bigger = ByteBuffer.allocate(capacity).order(ByteOrder.LITTLE_ENDIAN);
            bigger.put(b.flip());
            bigger.limit(Math.min(length, bigger.capacity()));
            b = bigger;
        }
    }

    private static String peerOf(SocketChannel ch) {
        try {
            return String.valueOf(ch.getRemoteAddress()).replaceFirst("^/", "");
        } catch (IOException e) {
            return "unknown peer";
        }
    }

    /**
     * A new connection's first bytes, awaited on a virtual thread (cheap while it waits): every kvpool
     * peer speaks at once, so one that stays silent for the frame timeout is closed. Then the
     * connection is served on a connection thread.
     */
    private void greet(SocketChannel ch, InetAddress from) {
        String peer = peerOf(ch);
        ByteBuffer header = FrameHeader.allocate();
        try (Watchdog.Deadline d0 = Watchdog.arm(ch, frameTimeout)) {
            if (ch.read(header) < 0) {
                finish(ch, from, peer, null);
                return;
            }
        } catch (IOException e) {
            if (!ch.isOpen() && !closed) {
                timedOutFrames.incrementAndGet();
                log.info("{}: closed a connection from {} that sent nothing in {}", name, peer, frameTimeout);
            }
            finish(ch, from, peer, null);
            return;
        }
        Wire wire = tls.enabled() ? handshake(ch, from, peer, header) : Wire.plain(ch);
        if (wire == null) {
            return;
        }
        boolean begun = !tls.enabled();
        if (VIRTUAL_THREADS) {
            serve(wire, from, peer, header, begun);
        } else {
            Thread.ofPlatform().daemon().name(name + "-conn").start(() -> serve(wire, from, peer, header, begun));
        }
    }

    /**
     * The TLS handshake of a new connection whose first bytes are in {@code first}, within the frame
     * timeout: its wire, or null when it failed (counted, logged, the connection closed). A peer whose
     * first bytes are a kvpool frame is told in plain TCP that this server requires TLS.
     */
    private Wire handshake(SocketChannel ch, InetAddress from, String peer, ByteBuffer first) {
        try (Watchdog.Deadline d = Watchdog.arm(ch, frameTimeout)) {
            if (first.get(0) == (byte) (FrameHeader.MAGIC & 0xFF)) {
                Channels.readFully(ch, first);
                String why = name + " requires TLS and this connection is plain TCP: give the client the pool's"
                        + " certificate files (--tls-cert, --tls-key, --tls-ca, or KVPOOL_TLS_CERT, KVPOOL_TLS_KEY"
                        + " and KVPOOL_TLS_CA)";
                tlsFailures.incrementAndGet();
                log.warn("{}: refusing a plain-TCP connection from {}: it must use TLS", name, peer);
                writeError(ch, FrameHeader.allocate(), first.get(FrameHeader.OPCODE_OFFSET) & 0xFF,
                        first.getLong(FrameHeader.REQUEST_ID_OFFSET), FrameStatus.UNAUTHORIZED, why);
                finish(ch, from, peer, null);
                return null;
            }
            TlsChannel t = new TlsChannel(ch, tls.serverEngine(), peer, first.flip());
            t.handshake();
            return Wire.tls(ch, t);
        } catch (IOException | RuntimeException e) {
            tlsFailures.incrementAndGet();
            if (!closed) {
                log.warn("{}: TLS handshake with {} failed: {}", name, peer, ch.isOpen() ? e.getMessage()
                        : "not finished within " + frameTimeout);
            }
            finish(ch, from, peer, null);
            return null;
        }
    }

    /**
     * Serves a connection: {@code header} holds the first bytes of its first frame when {@code begun}
     * (a plain connection's greeting read them); otherwise the first frame is yet to be read.
     */
    private void serve(Wire wire, InetAddress from, String peer, ByteBuffer header, boolean begun) {
        SocketChannel ch = wire.socket();
        Handshake.ServerSide auth = new Handshake.ServerSide(secrets);
        ByteBuffer replyHeader = FrameHeader.allocate();
        ByteBuffer scratch = ByteBuffer.allocateDirect(16 << 10);
        // bodies live on the heap: parsing copies many small fields (keys) out of them, which is far
        // cheaper from a heap buffer than from a direct one; payloads never come through here
        ByteBuffer body = ByteBuffer.allocate(INITIAL_BODY_BYTES).order(ByteOrder.LITTLE_ENDIAN);
        ReadableByteChannel in = wire.in();
        GatheringByteChannel out = wire.out();
        try {
            while (!closed) {
                if (!begun) {
                    header.clear();
                    if (in.read(header) < 0) {
                        // a pooled connection may wait as long as it likes for its next frame to begin
                        return;
                    }
                }
                begun = false;
                try (Watchdog.Deadline d = Watchdog.arm(ch, frameTimeout)) {
                    long giveUpAt = System.nanoTime() + frameTimeout.toNanos() / 2;
                    Channels.readFully(in, header);
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
                        if (op == null || (!op.isAuth() && !accepts.test(op))) {
                            throw new MalformedFrameException(FrameStatus.UNKNOWN_OPCODE, h.requestId(),
                                    String.format("opcode 0x%02x is not served by %s", h.opcode(), name));
                        }
                    } catch (MalformedFrameException e) {
                        String why = e.getMessage();
                        if (!tls.enabled() && header.get(0) == TLS_HANDSHAKE_RECORD && header.get(1) == 3) {
                            tlsFailures.incrementAndGet();
                            why = name + " does not use TLS and this connection began a TLS handshake: start "
                                    + name + " with the pool's certificate files (--tls-cert, --tls-key, --tls-ca)"
                                    + " or connect without TLS";
                        }
                        log.warn("{}: closing connection from {}: {}", name, peer, why);
                        writeError(out, replyHeader, header.get(FrameHeader.OPCODE_OFFSET) & 0xFF, e.requestId(),
                                e.status(), why);
                        return;
                    }
                    Refusal refusal = refuseFromHeader(h, op, auth.level());
                    if (refusal != null) {
                        refusal.counter.incrementAndGet();
                        log.warn("{}: refusing {} from {} without reading its body: {}", name, op.metricName, peer,
                                refusal.why);
                        writeError(out, replyHeader, op.code, h.requestId(), refusal.status, refusal.why);
                        return;
                    }
                    int[] held = {0};
                    try {
                        ByteBuffer got = readBody(in, body, h.bodyLength(), held, giveUpAt);
                        if (got == null) {
                            refusedBodies.incrementAndGet();
                            String why = String.format("a body of %d bytes cannot be buffered now: this process's"
                                    + " body budget of %s stayed in use until %s after the frame began (half the"
                                    + " frame timeout)", h.bodyLength(), budget,
                                    Durations.format(frameTimeout.dividedBy(2)));
                            log.warn("{}: closing connection from {}: {}", name, peer, why);
                            writeError(out, replyHeader, op.code, h.requestId(), FrameStatus.FRAME_TOO_LARGE, why);
                            return;
                        }
                        body = got;
                        Request req = new Request(wire, peer, op, h.requestId(), new BodyReader(body),
                                h.payloadLength(), replyHeader, scratch, auth.level());
                        if (!dispatch(req, out, replyHeader, op.isAuth() ? auth::serve : handler)) {
                            return;
                        }
                    } finally {
                        if (held[0] > 0) {
                            // a grown buffer is let go with its share, so an idle connection holds no budget
                            body = ByteBuffer.allocate(INITIAL_BODY_BYTES).order(ByteOrder.LITTLE_ENDIAN);
                            budget.give(held[0]);
                        }
                    }
                    if (d.fired()) {
                        timedOutFrames.incrementAndGet();
                        return;
                    }
                }
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } catch (IOException e) {
            if (!closed) {
                if (!ch.isOpen()) {
                    timedOutFrames.incrementAndGet(); // the frame deadline closed it mid-frame
                }
                log.debug("{}: connection from {} ended: {}", name, peer, e.toString());
            }
        } finally {
            finish(ch, from, peer, scratch);
        }
    }

    /** Why a frame is refused from its header alone, the status to answer and the counter that counts it. */
    private record Refusal(FrameStatus status, String why, AtomicLong counter) {
    }

    /**
     * Whether a request must be refused from its header, before a byte of its body is read: one that
     * needs a level the connection has not proven (on a secured server, anything but AUTH_BEGIN and
     * AUTH_PROVE before authentication), an authentication frame over its fixed size, or a body larger
     * than the whole body budget. Null when the body may be read.
     */
    private Refusal refuseFromHeader(FrameHeader.Decoded h, Opcode op, Access level) {
        if (op.isAuth()) {
            int cap = Handshake.maxBodyBytes(op);
            if (h.bodyLength() > cap || h.payloadLength() != 0) {
                return new Refusal(FrameStatus.FRAME_TOO_LARGE, String.format("%s carries a body of at most %d bytes"
                        + " and no payload; this one announced %d body and %d payload bytes", op.metricName, cap,
                        h.bodyLength(), h.payloadLength()), refusedAuth);
            }
            return null;
        }
        Access needed = required.apply(op);
        if (!level.allows(needed)) {
            String why = String.format("%s needs the %s secret; this connection has proven %s (set KVPOOL_SECRET_FILE%s)",
                    op.metricName, needed == Access.ADMIN ? "admin" : "cluster",
                    level == Access.NONE ? "none" : "the cluster secret only",
                    needed == Access.ADMIN ? " and KVPOOL_ADMIN_SECRET_FILE" : "");
            if (level == Access.NONE) {
                why += ": until a connection to " + name + " authenticates, it may send only auth_begin and auth_prove";
            }
            return new Refusal(FrameStatus.UNAUTHORIZED, why, refusedAuth);
        }
        if (h.bodyLength() > budget.bytes()) {
            return new Refusal(FrameStatus.FRAME_TOO_LARGE, String.format("a body of %d bytes can never be buffered:"
                    + " it is larger than this process's whole body budget of %s", h.bodyLength(), budget), refusedBodies);
        }
        return null;
    }

    private void finish(SocketChannel ch, InetAddress from, String peer, ByteBuffer scratch) {
        connections.remove(ch);
        release(from);
        lingeringClose(ch, scratch == null ? ByteBuffer.allocate(4 << 10) : scratch);
        handler.connectionClosed(peer);
    }

    /** The first byte of a TLS handshake record (a ClientHello): what a TLS client sends first. */
    private static final byte TLS_HANDSHAKE_RECORD = 0x16;

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
    private boolean dispatch(Request req, GatheringByteChannel ch, ByteBuffer replyHeader, RequestHandler h)
            throws IOException {
        try {
            h.handle(req);
            if (!req.replied()) {
                throw new IllegalStateException("handler for " + req.opcode().metricName + " sent no reply");
            }
            if (req.payloadRemaining() != 0) {
                log.warn("{}: {} from {} left {} payload bytes unread; closing connection", name,
                        req.opcode().metricName, req.peer(), req.payloadRemaining());
                return false;
            }
            return true;
        } catch (Handshake.UnauthorizedException e) {
            refusedAuth.incrementAndGet();
            log.warn("{}: refusing {} from {}: {}", name, req.opcode().metricName, req.peer(), e.getMessage());
            writeError(ch, replyHeader, req.opcode().code, req.requestId(), FrameStatus.UNAUTHORIZED, e.getMessage());
            return false;
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

    static void writeError(GatheringByteChannel ch, ByteBuffer header, int opcode, long requestId, FrameStatus status,
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
