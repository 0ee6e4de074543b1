package io.kvpool.protocol;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.Closeable;
import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.net.StandardSocketOptions;
import java.nio.ByteBuffer;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.GatheringByteChannel;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Function;
import java.util.function.Predicate;

/**
 * The serving end of kvpool connections, used by the master and by nodes.
 *
 * <h2>Threads</h2>
 * One platform thread accepts. A virtual thread waits for each new connection's first bytes (so a
 * connection that never speaks costs a few KiB, not a thread stack), runs its TLS handshake, and
 * serves its frames until it has authenticated ({@link ServedConnection}): a connection refused at
 * a limit, one that fails or never finishes its proof, and one refused for a request it may not send
 * never hold a platform thread. Once authenticated (on a server without secrets: once its first
 * frame was handled), the connection is served on its own thread (platform by default, see
 * {@link #VIRTUAL_THREADS}), which blocks on the socket and runs the {@link RequestHandler} inline.
 * Blocking channel I/O lets a node read a payload straight from the socket into its segment and
 * write a reply straight from it. A connection being closed lingers (its error reply must not be lost
 * to a reset) on a virtual thread too, never on its platform thread. A server whose owner named quick
 * opcodes ({@link #serveInLoop}: the master's NODE_HEARTBEAT) serves the connections that send them in
 * one selector loop instead ({@link FrameLoop}), back on a thread for any other frame.
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
 *       sends one at once), and so must the rest of any frame once it began; on a secured server the
 *       connection must also have authenticated within the frame timeout of its first byte. After
 *       that an idle connection is a pooled one and may wait.</li>
 *   <li>Memory: a connection has a small standing body buffer ({@link BodyIntake}); a larger body
 *       reserves its whole size from the process's {@link BodyBudget} (shared with every other server
 *       in the JVM, sized from the heap), first come first served, before a byte of it is read, and
 *       holds it until its frame is handled (a sender that stalls holds it until the frame timeout
 *       closes its connection). A body that cannot get its reservation by half the frame timeout
 *       after the frame began, or that is larger than the whole budget, is refused
 *       ({@code FRAME_TOO_LARGE}, naming the budget, the body's size and what to do) and its
 *       connection closed.</li>
 *   <li>Threads: a platform thread only for a connection that authenticated (above).</li>
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
 * bytes, reserve nothing from the body budget, and start no platform thread. A failed proof is answered {@code UNAUTHORIZED} too. A server without secrets is open:
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
    private final RequestHandler handler;
    private final Tls tls;
    private final boolean secured;
    private final ServerSocketChannel server;
    private final Set<SocketChannel> connections = ConcurrentHashMap.newKeySet();
    private final ConcurrentHashMap<InetAddress, AtomicInteger> perHost = new ConcurrentHashMap<>();
    /** Bytes of bodies being received or handled past the connections' standing buffers, process-wide. */
    private final BodyBudget budget;
    private final ServerCounters counters = new ServerCounters();
    /** What every connection of this server is served by. */
    private final ServedConnection.Rules rules;
    private final Thread acceptor;
    private volatile boolean closed;
    /** Serves the quick frames of connections that sent them, when the owner asked ({@link #serveInLoop}). */
    private volatile FrameLoop loop;

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
        this.tls = secrets.tls();
        this.secured = secrets.present();
        this.budget = budget;
        this.name = name;
        this.limits = limits;
        this.frameTimeout = frameTimeout;
        this.handler = handler;
        this.rules = new ServedConnection.Rules(name, limits, frameTimeout, accepts, required, handler, secrets,
                tls.enabled(), budget, counters, () -> closed, BusyPoll.configured());
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

    /** Connections waiting for their next frame in the {@link FrameLoop} now (0 without one). */
    public int loopConnections() {
        FrameLoop l = loop;
        return l == null ? 0 : l.connections();
    }

    /** Frames the {@link FrameLoop} served so far, answered or (NODE_BEACON) not (0 without one). */
    public long loopFrames() {
        FrameLoop l = loop;
        return l == null ? 0 : l.frames();
    }

    /**
     * Reads the {@link FrameLoop} made from its connections' sockets so far (0 without one): with {@link
     * #loopFrames}, how many frames one read brought in.
     */
    public long loopReads() {
        FrameLoop l = loop;
        return l == null ? 0 : l.reads();
    }

    /** Connections refused because a connection limit was reached. */
    public long refusedConnections() {
        return counters.refusedConnections.get();
    }

    /** Connections closed because a frame, or a new connection's first frame, did not arrive in time. */
    public long timedOutFrames() {
        return counters.timedOutFrames.get();
    }

    /** Connections closed because their authentication failed or a request needed more than they proved. */
    public long refusedAuth() {
        return counters.refusedAuth.get();
    }

    /**
     * Connections refused for TLS: a failed or timed-out handshake (no client certificate, one of
     * another CA), a plain-TCP client of a TLS server, or a TLS client of a plain one.
     */
    public long tlsHandshakeFailures() {
        return counters.tlsFailures.get();
    }

    /** Whether connections must use TLS. */
    public boolean tls() {
        return tls.enabled();
    }

    /**
     * Frames refused because the body budget stayed in use, or because their body was larger than
     * the whole budget.
     */
    /** Waits for a connection's next frame that polled the socket and found it ({@link BusyPoll}). */
    public long busyPollHits() {
        return counters.busyPoll.hits();
    }

    /** Waits for a connection's next frame that polled the socket until the budget ran out, then blocked. */
    public long busyPollMisses() {
        return counters.busyPoll.misses();
    }

    /** Waits for a connection's next frame whose poll stopped because the CPU was busy (a yield ran another thread). */
    public long busyPollsYielded() {
        return counters.busyPoll.yielded();
    }

    /** Time this server's connection threads spent polling for frames, in nanoseconds. */
    public long busyPollNanos() {
        return counters.busyPoll.nanos();
    }

    public long refusedBodies() {
        return counters.refusedBodies.get();
    }

    /** Bytes of the process's body budget taken now (by every server of this process). */
    public long bodyBytesBuffered() {
        return budget.inUse();
    }

    /** Bodies waiting now for their reservation from the process's body budget (by every server of this process). */
    public int bodiesWaiting() {
        return budget.waiting();
    }

    /** The process's body budget, in bytes (see {@link BodyBudget}). */
    public long bodyBudgetBytes() {
        return budget.bytes();
    }

    /** The budget this server's bodies come out of. */
    BodyBudget budget() {
        return budget;
    }

    private void acceptLoop() {
        while (!closed) {
            try {
                SocketChannel ch = server.accept();
                ch.setOption(StandardSocketOptions.TCP_NODELAY, true);
                InetAddress from = addressOf(ch);
                String refusal = admit(from);
                if (refusal != null) {
                    counters.refusedConnections.incrementAndGet();
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

    private static String peerOf(SocketChannel ch) {
        try {
            return String.valueOf(ch.getRemoteAddress()).replaceFirst("^/", "");
        } catch (IOException e) {
            return "unknown peer";
        }
    }

    /**
     * A new connection's first bytes, awaited on a virtual thread (cheap while it waits): every kvpool
     * peer speaks at once, so one that stays silent for the frame timeout is closed. Then its TLS
     * handshake and its frames until it has authenticated, on the same virtual thread; only then does
     * it get a connection thread of its own.
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
                counters.timedOutFrames.incrementAndGet();
                log.info("{}: closed a connection from {} that sent nothing in {}", name, peer, frameTimeout);
            }
            finish(ch, from, peer, null);
            return;
        }
        Wire wire = tls.enabled() ? handshake(ch, from, peer, header) : Wire.plain(ch);
        if (wire == null) {
            return;
        }
        ServedConnection c = new ServedConnection(rules, wire, peer, from, header, !tls.enabled());
        ServedConnection.Outcome o;
        // on a secured server, authenticating must be done within the frame timeout: the connection's
        // peer has nothing to wait for before it, so one that stalls half way is closed
        try (Watchdog.Deadline d = secured ? Watchdog.arm(ch, frameTimeout) : null) {
            o = c.serve(true, null);
            if (d != null && d.fired()) {
                log.info("{}: closed a connection from {} that did not authenticate within {}", name, peer, frameTimeout);
            }
        }
        if (o == ServedConnection.Outcome.AUTHENTICATED && c.loopable(loop)) {
            toLoop(c); // its first frame was a quick one (a server without secrets): no thread of its own yet
        } else if (o == ServedConnection.Outcome.AUTHENTICATED && VIRTUAL_THREADS) {
            serveFrom(c);
        } else if (o == ServedConnection.Outcome.AUTHENTICATED) {
            serveOnThread(c);
        } else {
            finish(ch, from, peer, c.scratch());
        }
    }

    /** From here on {@code c} is served on a platform thread of its own (or a virtual one, as configured). */
    private void serveOnThread(ServedConnection c) {
        if (VIRTUAL_THREADS) {
            Thread.ofVirtual().name(name + "-conn").start(() -> serveFrom(c));
        } else {
            Thread.ofPlatform().daemon().name(name + "-conn").start(() -> serveFrom(c));
        }
    }

    /** Serves {@code c} on this thread until it ends or moves to the {@link FrameLoop}. */
    private void serveFrom(ServedConnection c) {
        if (c.serve(false, loop) == ServedConnection.Outcome.TO_LOOP) {
            toLoop(c);
        } else {
            finish(c.socket(), c.from(), c.peer(), c.scratch());
        }
    }

    /** {@code c}, between two frames, waits for its next in the {@link FrameLoop}. */
    private void toLoop(ServedConnection c) {
        try {
            c.socket().configureBlocking(false);
            loop.join(c);
        } catch (IOException | RuntimeException e) {
            log.debug("{}: connection from {} could not join the frame loop: {}", name, c.peer(), e.toString());
            finish(c.socket(), c.from(), c.peer(), c.scratch());
        }
    }

    /**
     * Serves the frames of the opcodes {@code quick} names for many connections on one thread ({@link FrameLoop}):
     * a connection whose last frame was one of them waits for its next in the loop instead of on a thread of its
     * own. Only for handlers that never block on those opcodes. Not on a TLS server (its connections keep their
     * threads). Call once, before connections arrive.
     */
    public void serveInLoop(Predicate<Opcode> quick) throws IOException {
        if (tls.enabled() || loop != null) {
            return;
        }
        loop = new FrameLoop(name, quick, frameTimeout.toNanos(), counters, new FrameLoop.Owner() {
            @Override
            public void serveOnThread(ServedConnection c) {
                FrameServer.this.serveOnThread(c);
            }

            @Override
            public void end(ServedConnection c) {
                finish(c.socket(), c.from(), c.peer(), c.scratch());
            }
        });
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
                counters.tlsFailures.incrementAndGet();
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
            counters.tlsFailures.incrementAndGet();
            if (!closed) {
                log.warn("{}: TLS handshake with {} failed: {}", name, peer, ch.isOpen() ? e.getMessage()
                        : "not finished within " + frameTimeout);
            }
            finish(ch, from, peer, null);
            return null;
        }
    }

    /**
     * A connection is over: it no longer counts against the limits, and it is closed and its handler
     * told on a virtual thread (a platform thread ends here, not after the linger).
     */
    private void finish(SocketChannel ch, InetAddress from, String peer, ByteBuffer scratch) {
        connections.remove(ch);
        release(from);
        Runnable close = () -> {
            lingeringClose(ch, scratch == null ? ByteBuffer.allocate(4 << 10) : scratch);
            handler.connectionClosed(peer);
        };
        if (Thread.currentThread().isVirtual()) {
            close.run();
        } else {
            Thread.ofVirtual().name(name + "-close").start(close);
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
        FrameLoop l = loop;
        if (l != null) {
            l.close();
        }
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
