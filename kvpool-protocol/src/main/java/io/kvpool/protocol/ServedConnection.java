package io.kvpool.protocol;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.net.InetAddress;
import java.nio.ByteBuffer;
import java.nio.channels.GatheringByteChannel;
import java.nio.channels.ReadableByteChannel;
import java.nio.channels.SocketChannel;
import java.time.Duration;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.BooleanSupplier;
import java.util.function.Function;
import java.util.function.Predicate;

/**
 * One connection of a {@link FrameServer} from its first frame on: each frame's header read and
 * checked, its body taken in ({@link BodyIntake}), its request handled and answered, in order.
 *
 * <h2>A platform thread is earned</h2>
 * A connection is served first on the virtual thread that greeted it. Asked to, {@link #serve}
 * returns as soon as the connection, between two frames, has proven a secret (on a server without
 * secrets: once its first frame was handled); its server then hands it to a platform thread of its
 * own for the rest of its life. So a connection that fails its proof, stalls half way through the
 * handshake, sends a request it may not, or closes before authenticating never holds a platform
 * thread, however many of them there are: only peers holding the cluster secret can make a server
 * start one.
 *
 * <h2>Or the frame loop</h2>
 * On a server with a {@link FrameLoop}, a plain connection whose last frame was one of the loop's quick
 * opcodes leaves its thread between two frames ({@link Outcome#TO_LOOP}); the loop then serves its quick
 * frames ({@link #serveBuffered}) and hands any other back to a thread with its header read
 * ({@link #headerRead}).
 *
 * <h2>Refusals from the header</h2>
 * A request is judged from its 32-byte header before a byte of its body is read ({@link #refusal}):
 * one needing more than the connection proved, an authentication frame over its fixed size, or a
 * body larger than the whole budget is answered and the connection closed with the body unread.
 */
final class ServedConnection {

    private static final Logger log = LoggerFactory.getLogger(FrameServer.class);

    /** The first byte of a TLS handshake record (a ClientHello): what a TLS client sends first. */
    private static final byte TLS_HANDSHAKE_RECORD = 0x16;

    /** What the connections of one server share: its rules, handler and counters, and whether it closed. */
    record Rules(String name, Limits limits, Duration frameTimeout, Predicate<Opcode> accepts,
                 Function<Opcode, Access> required, RequestHandler handler, Secrets secrets, boolean tls,
                 BodyBudget budget, ServerCounters counters, BooleanSupplier closed, Duration busyPoll) {
    }

    /** How {@link #serve} let the connection go. */
    enum Outcome {
        /** It ended (or must): the caller closes it. */
        CLOSE,
        /** It authenticated, between two frames (asked for with {@code untilAuthenticated}). */
        AUTHENTICATED,
        /** Its last frame was a quick one and the server has a {@link FrameLoop}: the loop serves it from now on. */
        TO_LOOP
    }

    private final Rules rules;
    private final Wire wire;
    private final String peer;
    /** The peer's address, as its server counts its connections. */
    private final InetAddress from;
    private final Handshake.ServerSide auth;
    private final ByteBuffer header;
    private final ByteBuffer replyHeader = FrameHeader.allocate();
    private final ByteBuffer scratch = ByteBuffer.allocateDirect(16 << 10);
    private final BodyIntake bodies;
    /** Whether {@link #header} already holds the first bytes of the next frame. */
    private boolean begun;
    /** The opcode of the last frame served (null before the first). */
    private Opcode lastOp;
    /** Bytes a {@link FrameLoop} read past the header of the frame it handed over (read before the socket's). */
    private ByteBuffer readAhead = ByteBuffer.allocate(0);
    /** The wire of frames served in a {@link FrameLoop}: no payload, replies to the loop's outbox for this connection. */
    private Wire loopWire;
    /** How the next frame is waited for on a thread: the socket polled for a bounded time first, or not. */
    private final BusyPoll nextFrame;

    /** The connection's input: {@link #readAhead} first, then its wire. */
    private final class ReadAheadFirst implements ReadableByteChannel {
        private final ReadableByteChannel in;

        ReadAheadFirst(ReadableByteChannel in) {
            this.in = in;
        }

        @Override
        public int read(ByteBuffer dst) throws IOException {
            if (!readAhead.hasRemaining()) {
                return in.read(dst);
            }
            int n = Math.min(dst.remaining(), readAhead.remaining());
            dst.put(dst.position(), readAhead, readAhead.position(), n).position(dst.position() + n);
            readAhead.position(readAhead.position() + n);
            return n;
        }

        @Override
        public boolean isOpen() {
            return in.isOpen();
        }

        @Override
        public void close() throws IOException {
            in.close();
        }
    }

    /**
     * A connection over {@code wire}; {@code header} holds the first bytes of its first frame when
     * {@code begun} (a plain connection's greeting read them), else that frame is yet to be read.
     */
    ServedConnection(Rules rules, Wire wire, String peer, InetAddress from, ByteBuffer header, boolean begun) {
        this.rules = rules;
        // every read takes first what a frame loop read ahead of a frame it handed over
        this.wire = new Wire(wire.socket(), new ReadAheadFirst(wire.in()), wire.out());
        this.peer = peer;
        this.from = from;
        this.header = header;
        this.begun = begun;
        this.auth = new Handshake.ServerSide(rules.secrets());
        this.bodies = new BodyIntake(rules.budget());
        this.nextFrame = new BusyPoll(rules.tls() ? Duration.ZERO : rules.busyPoll(), rules.counters().busyPoll);
    }

    SocketChannel socket() {
        return wire.socket();
    }

    String peer() {
        return peer;
    }

    InetAddress from() {
        return from;
    }

    /** A buffer the connection no longer needs once served: for draining it while it closes. */
    ByteBuffer scratch() {
        return scratch;
    }

    /** Where the next frame's header is read (by a {@link FrameLoop} too). */
    ByteBuffer header() {
        return header;
    }

    Limits limits() {
        return rules.limits();
    }

    /** A {@link FrameLoop} read the next frame's whole header: {@link #serve} goes on from there. */
    void headerRead() {
        begun = true;
    }

    /** A {@link FrameLoop} read {@code bytes} (its remaining ones) past the header it hands over: they are read first. */
    void readAhead(ByteBuffer bytes) {
        ByteBuffer copy = ByteBuffer.allocate(bytes.remaining());
        copy.put(bytes).flip();
        readAhead = copy;
    }

    /** Moves what is left of the read-ahead bytes into {@code into} (a {@link FrameLoop}'s inbox, in write mode). */
    void takeReadAhead(ByteBuffer into) {
        if (readAhead.hasRemaining()) {
            into.put(readAhead);
        }
    }

    /** Whether this connection may move to {@code loop}: plain TCP, authenticated, its last frame a quick one. */
    boolean loopable(FrameLoop loop) {
        return loop != null && !rules.tls() && auth.level() != Access.NONE && lastOp != null && loop.quick(lastOp);
    }

    /**
     * For a {@link FrameLoop}: whether a frame with header {@code h} (decoded, not a reply, status 0) of
     * opcode {@code op} may be served as it is, with no error to answer: served by this server, and allowed
     * by what the connection proved.
     */
    boolean mayServe(FrameHeader.Decoded h, Opcode op) {
        return !op.isAuth() && rules.accepts().test(op) && refusal(h, op) == null;
    }

    /**
     * For a {@link FrameLoop}: handles a frame whose header is {@code h} and whose whole body is in
     * {@code body}, with no payload ({@link #mayServe} said yes); its reply (or error) goes to {@code out}.
     * False when the connection must be closed once that is written.
     */
    boolean serveBuffered(FrameHeader.Decoded h, Opcode op, ByteBuffer body, FrameLoop.Outbox out) throws IOException {
        lastOp = op;
        if (loopWire == null || loopWire.out() != out) {
            loopWire = new Wire(wire.socket(), FrameLoop.NO_PAYLOAD, out); // one per stay in the loop, not per frame
        }
        Request req = new Request(loopWire, peer, op, h.requestId(),
                new BodyReader(body), 0, replyHeader, scratch, auth.level());
        return dispatch(req, out, rules.handler());
    }

    /**
     * Serves frames until the connection ends ({@link Outcome#CLOSE}: the caller closes it). With
     * {@code untilAuthenticated}, returns {@link Outcome#AUTHENTICATED} instead as soon as the connection
     * has authenticated, between two frames, for the caller to go on serving it on another thread. Given a
     * {@code loop}, returns {@link Outcome#TO_LOOP} after a quick frame, with the channel still in blocking
     * mode, for the caller to hand it to the loop.
     */
    Outcome serve(boolean untilAuthenticated, FrameLoop loop) {
        SocketChannel ch = wire.socket();
        ReadableByteChannel in = wire.in();
        GatheringByteChannel out = wire.out();
        try {
            while (!rules.closed().getAsBoolean()) {
                if (!begun) {
                    header.clear();
                    int polled = nextFrame.read(ch, in, header);
                    if (polled < 0 || (polled == 0 && in.read(header) < 0)) {
                        // a pooled connection may wait as long as it likes for its next frame to begin
                        return Outcome.CLOSE;
                    }
                }
                begun = false;
                try (Watchdog.Deadline d = Watchdog.arm(ch, rules.frameTimeout())) {
                    if (!serveFrame(in, out, System.nanoTime() + rules.frameTimeout().toNanos() / 2)) {
                        return Outcome.CLOSE;
                    }
                    if (d.fired()) {
                        rules.counters().timedOutFrames.incrementAndGet();
                        return Outcome.CLOSE;
                    }
                }
                if (untilAuthenticated && auth.level() != Access.NONE) {
                    return Outcome.AUTHENTICATED;
                }
                if (loopable(loop)) {
                    return Outcome.TO_LOOP;
                }
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } catch (IOException e) {
            if (!rules.closed().getAsBoolean()) {
                if (!ch.isOpen()) {
                    rules.counters().timedOutFrames.incrementAndGet(); // the frame deadline closed it mid-frame
                }
                log.debug("{}: connection from {} ended: {}", rules.name(), peer, e.toString());
            }
        }
        return Outcome.CLOSE;
    }

    /**
     * One frame whose first header bytes are in {@link #header}: false when the connection must be
     * closed after it. A body that must wait for its reservation gives up at {@code giveUpAt}
     * ({@link System#nanoTime()}): half the frame timeout after the frame began, so the refusal is
     * written before the frame's own deadline closes the connection.
     */
    private boolean serveFrame(ReadableByteChannel in, GatheringByteChannel out, long giveUpAt)
            throws IOException, InterruptedException {
        Channels.readFully(in, header);
        FrameHeader.Decoded h;
        Opcode op;
        try {
            h = FrameHeader.decode(header, rules.limits());
            op = Opcode.of(h.opcode());
            if (h.reply()) {
                throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, h.requestId(),
                        "received a reply frame where a request was expected");
            }
            if (h.status() != 0) {
                throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, h.requestId(),
                        "a request must have status 0, got " + h.status());
            }
            if (op == null || (!op.isAuth() && !rules.accepts().test(op))) {
                throw new MalformedFrameException(FrameStatus.UNKNOWN_OPCODE, h.requestId(),
                        String.format("opcode 0x%02x is not served by %s", h.opcode(), rules.name()));
            }
        } catch (MalformedFrameException e) {
            String why = e.getMessage();
            if (!rules.tls() && header.get(0) == TLS_HANDSHAKE_RECORD && header.get(1) == 3) {
                rules.counters().tlsFailures.incrementAndGet();
                why = rules.name() + " does not use TLS and this connection began a TLS handshake: start "
                        + rules.name() + " with the pool's certificate files (--tls-cert, --tls-key, --tls-ca)"
                        + " or connect without TLS";
            }
            log.warn("{}: closing connection from {}: {}", rules.name(), peer, why);
            FrameServer.writeError(out, replyHeader, header.get(FrameHeader.OPCODE_OFFSET) & 0xFF, e.requestId(),
                    e.status(), why);
            return false;
        }
        Refusal refusal = refusal(h, op);
        if (refusal != null) {
            refusal.counter.incrementAndGet();
            log.warn("{}: refusing {} from {} without reading its body: {}", rules.name(), op.metricName, peer,
                    refusal.why);
            FrameServer.writeError(out, replyHeader, op.code, h.requestId(), refusal.status, refusal.why);
            return false;
        }
        try {
            ByteBuffer body = bodies.read(in, h.bodyLength(), Duration.ofNanos(Math.max(0, giveUpAt - System.nanoTime())));
            if (body == null) {
                rules.counters().refusedBodies.incrementAndGet();
                String why = rules.budget().refusal(h.bodyLength(), rules.frameTimeout().dividedBy(2));
                log.warn("{}: closing connection from {}: {}", rules.name(), peer, why);
                FrameServer.writeError(out, replyHeader, op.code, h.requestId(), FrameStatus.FRAME_TOO_LARGE, why);
                return false;
            }
            lastOp = op;
            Request req = new Request(wire, peer, op, h.requestId(), new BodyReader(body), h.payloadLength(),
                    replyHeader, scratch, auth.level());
            return dispatch(req, out, op.isAuth() ? auth::serve : rules.handler());
        } finally {
            bodies.release();
        }
    }

    /** Why a frame is refused from its header, the status to answer and the counter that counts it. */
    private record Refusal(FrameStatus status, String why, AtomicLong counter) {
    }

    /**
     * Whether a request must be refused from its header, before a byte of its body is read: one that
     * needs a level the connection has not proven (on a secured server, anything but AUTH_BEGIN and
     * AUTH_PROVE before authentication), an authentication frame over its fixed size, or a body larger
     * than the whole body budget. Null when the body may be read.
     */
    private Refusal refusal(FrameHeader.Decoded h, Opcode op) {
        Access level = auth.level();
        if (op.isAuth()) {
            int cap = Handshake.maxBodyBytes(op);
            if (h.bodyLength() > cap || h.payloadLength() != 0) {
                return new Refusal(FrameStatus.FRAME_TOO_LARGE, String.format("%s carries a body of at most %d bytes"
                        + " and no payload; this one announced %d body and %d payload bytes", op.metricName, cap,
                        h.bodyLength(), h.payloadLength()), rules.counters().refusedAuth);
            }
            return null;
        }
        Access needed = rules.required().apply(op);
        if (!level.allows(needed)) {
            String why = String.format("%s needs the %s secret; this connection has proven %s (set KVPOOL_SECRET_FILE%s)",
                    op.metricName, needed == Access.ADMIN ? "admin" : "cluster",
                    level == Access.NONE ? "none" : "the cluster secret only",
                    needed == Access.ADMIN ? " and KVPOOL_ADMIN_SECRET_FILE" : "");
            if (level == Access.NONE) {
                why += ": until a connection to " + rules.name() + " authenticates, it may send only auth_begin and auth_prove";
            }
            return new Refusal(FrameStatus.UNAUTHORIZED, why, rules.counters().refusedAuth);
        }
        if (h.bodyLength() > rules.budget().bytes()) {
            return new Refusal(FrameStatus.FRAME_TOO_LARGE, rules.budget().neverFits(h.bodyLength()),
                    rules.counters().refusedBodies);
        }
        return null;
    }

    /** Runs the handler; returns false when the connection must be closed afterwards. */
    private boolean dispatch(Request req, GatheringByteChannel ch, RequestHandler h) throws IOException {
        String name = rules.name();
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
            rules.counters().refusedAuth.incrementAndGet();
            log.warn("{}: refusing {} from {}: {}", name, req.opcode().metricName, req.peer(), e.getMessage());
            FrameServer.writeError(ch, replyHeader, req.opcode().code, req.requestId(), FrameStatus.UNAUTHORIZED,
                    e.getMessage());
            return false;
        } catch (MalformedFrameException e) {
            log.warn("{}: closing connection from {}: {}", name, req.peer(), e.getMessage());
            if (!req.replied()) {
                FrameServer.writeError(ch, replyHeader, req.opcode().code, req.requestId(), e.status(), e.getMessage());
            }
            return false;
        } catch (BadRequestException | IllegalArgumentException e) {
            if (!req.replied()) {
                FrameServer.writeError(ch, replyHeader, req.opcode().code, req.requestId(), FrameStatus.BAD_REQUEST,
                        e.getMessage());
            }
            // the stream stays in step only if the request's payload was consumed
            return req.payloadRemaining() == 0;
        } catch (IOException e) {
            throw e;
        } catch (RuntimeException e) {
            log.error("{}: {} from {} failed", name, req.opcode().metricName, req.peer(), e);
            if (!req.replied()) {
                FrameServer.writeError(ch, replyHeader, req.opcode().code, req.requestId(), FrameStatus.INTERNAL_ERROR,
                        e.getClass().getSimpleName() + ": " + e.getMessage());
            }
            return req.payloadRemaining() == 0;
        }
    }
}
