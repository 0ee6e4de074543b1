package io.kvpool.protocol;

import io.kvpool.config.Durations;
import io.kvpool.config.HostPort;

import java.io.Closeable;
import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.net.SocketTimeoutException;
import java.net.StandardSocketOptions;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.SocketChannel;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;

/**
 * The requesting end of one kvpool connection: send a request frame, receive its reply, stream the
 * reply's payload. Not thread-safe; callers that need concurrency take several connections from a
 * pool.
 *
 * <h2>Pipelining</h2>
 * {@link #call} sends a request and waits for its reply. {@link #send} sends one without waiting,
 * and {@link #receive} takes the oldest reply not yet taken: a server answers a connection's
 * requests one at a time, in the order they came (docs/protocol.md, section 1.2), so many requests
 * can be in flight on one connection. The requester bounds what it leaves unanswered: a server
 * stops reading while a reply it writes finds the socket full, so a requester that kept writing
 * without reading would wait forever once the replies filled the buffers. Replies to NODE_PART_WRITE
 * and the like are a few bytes each, so tens of them fit.
 *
 * <h2>Notices</h2>
 * {@link #notify} sends a request its server answers only when it has something to say (NODE_BEACON: the
 * master answers only news). Since a server answers in order, the reply to a notice, if any, comes before
 * the reply to any later request: {@link #call} and {@link #receive} set such a reply aside and read on, and
 * {@link #notices} hands over what was set aside, and what has arrived since, without waiting for more. A
 * reply to any later request also says that every notice before it that was not answered never will be.
 *
 * <p>Every exchange runs under a {@link Watchdog} deadline: if the peer does not answer in time, the
 * connection is closed and the call fails with a {@link SocketTimeoutException} naming the peer,
 * instead of hanging. A connection that failed in any way is {@link #isBroken() broken} and must be
 * discarded, since the stream position is unknown.
 */
public final class FrameConnection implements Closeable {

    private final Wire wire;
    private final HostPort peer;
    private final Limits limits;
    private final ByteBuffer header = FrameHeader.allocate();
    /** Reply bodies are parsed field by field: a heap buffer makes the many small copies cheap. */
    private ByteBuffer body = ByteBuffer.allocate(64 << 10).order(ByteOrder.LITTLE_ENDIAN);
    private long nextRequestId = 1;
    private boolean broken;
    /** Requests sent and not yet answered, oldest first: opcode and request id. */
    private final ArrayDeque<Sent> unanswered = new ArrayDeque<>();
    /** The request whose reply was received last (error messages name it). */
    private Opcode inFlight;
    /** Whether the request answered last carried payload (after BAD_REQUEST the stream is then unknown). */
    private boolean answeredHadPayload;
    private long payloadLeft;
    /** How a reply is waited for: polled for a bounded time first ({@link #busyPoll}), or not. */
    private BusyPoll replies = new BusyPoll(Duration.ZERO, new BusyPoll.Counters());

    /** Notices sent ({@link #notify}) that may still be answered, oldest first: their request ids. */
    private final ArrayDeque<Long> mayAnswer = new ArrayDeque<>();
    /** Replies to notices, read while waiting for another reply or by {@link #notices}, not yet handed over. */
    private final List<Reply> noticed = new ArrayList<>();

    private record Sent(Opcode op, long id, boolean payload) {
    }

    private FrameConnection(Wire wire, HostPort peer, Limits limits) {
        this.wire = wire;
        this.peer = peer;
        this.limits = limits;
    }

    /**
     * Connects to {@code peer}.
     *
     * @throws IOException naming the peer when it cannot be reached within {@code timeout}
     */
    public static FrameConnection connect(HostPort peer, Duration timeout, Limits limits) throws IOException {
        return connect(peer, timeout, limits, Secrets.NONE);
    }

    /**
     * Connects to {@code peer} in TLS when {@code secrets} carry a TLS identity ({@link Secrets#tls()};
     * the handshake runs within {@code timeout}) and, when {@code secrets} are present, authenticates
     * the connection with them ({@link Handshake}) before returning it.
     *
     * @throws AuthenticationException naming the peer when either side's proof fails
     * @throws IOException             naming the peer when the TLS handshake fails: a certificate not
     *                                 trusted, a server without TLS
     */
    public static FrameConnection connect(HostPort peer, Duration timeout, Limits limits, Secrets secrets)
            throws IOException {
        FrameConnection c = open(peer, timeout, limits, secrets.tls());
        if (secrets.present()) {
            try {
                Handshake.authenticate(c, secrets, timeout);
            } catch (IOException | RuntimeException e) {
                c.close();
                throw e;
            }
        }
        return c;
    }

    private static FrameConnection open(HostPort peer, Duration timeout, Limits limits, Tls tls) throws IOException {
        SocketChannel ch = SocketChannel.open();
        try {
            ch.setOption(StandardSocketOptions.TCP_NODELAY, true);
            ch.socket().connect(peer.toSocketAddress(), (int) Math.max(1, timeout.toMillis()));
        } catch (IOException e) {
            ch.close();
            throw new IOException("cannot connect to " + peer + ": " + e.getMessage(), e);
        }
        if (!tls.enabled()) {
            return new FrameConnection(Wire.plain(ch), peer, limits);
        }
        TlsChannel t = new TlsChannel(ch, tls.clientEngine(peer), peer.toString(), ByteBuffer.allocate(0));
        try (Watchdog.Deadline d = Watchdog.arm(ch, timeout)) {
            t.handshake();
            return new FrameConnection(Wire.tls(ch, t), peer, limits);
        } catch (IOException | RuntimeException e) {
            ch.close();
            if (e instanceof ClosedChannelException) {
                throw new SocketTimeoutException("no TLS handshake with " + peer + " within "
                        + Durations.format(timeout) + " (is it a kvpool server with TLS?)");
            }
            throw e;
        }
    }

    public HostPort peer() {
        return peer;
    }

    /**
     * Polls the socket for up to {@code budget} for each reply before blocking ({@link BusyPoll}; zero, the
     * default here, never polls), counting into {@code counters}. No effect under TLS. Returns this.
     */
    public FrameConnection busyPoll(Duration budget, BusyPoll.Counters counters) {
        replies = new BusyPoll(budget, counters);
        return this;
    }

    public boolean isBroken() {
        return broken || !wire.socket().isOpen();
    }

    /**
     * Whether the peer has closed this connection or sent something unasked, checked without waiting: a
     * server answers only requests, so with none outstanding any byte to read, or the end of the stream,
     * means the connection is over (it is then marked broken). A same-machine writer asks this of the
     * connection holding its lease range after stamping objects there and before telling the master of
     * them: a node that let the range go closed the connection first (docs/protocol.md, section 4.28).
     */
    public boolean peerClosed() {
        if (isBroken()) {
            return true;
        }
        if (!unanswered.isEmpty()) {
            return false;
        }
        try {
            if (readNow(ByteBuffer.allocate(1)) == 0) {
                return false;
            }
        } catch (IOException e) {
            // a reset, or the channel closed under us: over as well
        }
        broken = true;
        return true;
    }

    /** One read from the socket itself into {@code b} that does not wait: what it returned (0: nothing there). */
    private int readNow(ByteBuffer b) throws IOException {
        SocketChannel ch = wire.socket();
        synchronized (ch.blockingLock()) {
            ch.configureBlocking(false);
            try {
                return ch.read(b);
            } finally {
                ch.configureBlocking(true);
            }
        }
    }

    /** The reply to one request: its header fields and body. Payload, if any, is read separately. */
    public record Reply(FrameHeader.Decoded header, BodyReader body) {
        public long payloadLength() {
            return header.payloadLength();
        }
    }

    /**
     * Sends a request and returns its reply, all under one deadline. If the reply carries payload,
     * read it with {@link #readPayload} / {@link #skipPayload} before the next call.
     *
     * @throws RemoteException when the peer answers with an error status (the connection stays usable
     *                         only for {@link FrameStatus#BAD_REQUEST}; otherwise the peer closes it)
     * @throws IOException     on timeout or a broken connection, naming the peer
     */
    public Reply call(Opcode op, BodyWriter request, Duration timeout, ByteBuffer... payload) throws IOException {
        if (!unanswered.isEmpty()) {
            throw new IllegalStateException(unanswered.size() + " pipelined requests to " + peer
                    + " are unanswered: receive their replies before a call");
        }
        return exchange(op, timeout, true, request, payload);
    }

    /**
     * Sends a request without waiting for its reply (pipelining): take the replies in order with
     * {@link #receive}. Returns when the frame is written to the socket, so the caller's buffers may
     * be reused. Fails as {@link #call} does; a connection whose send failed is broken.
     *
     * @throws IllegalStateException when the last reply's payload was not read
     */
    public void send(Opcode op, BodyWriter request, Duration timeout, ByteBuffer... payload) throws IOException {
        exchange(op, timeout, false, request, payload);
    }

    /**
     * Sends a request its server answers only when it has news (NODE_BEACON), without waiting: any answer is
     * read later, by {@link #notices} or while a later call waits for its own reply. Fails as {@link #send}
     * does.
     */
    public void notify(Opcode op, BodyWriter request, Duration timeout) throws IOException {
        exchange(op, timeout, false, request);
        Sent s = unanswered.pollLast();
        mayAnswer.addLast(s.id());
    }

    /**
     * The replies to notices that have arrived, oldest first, read without waiting for more (a frame whose first
     * bytes have arrived is read whole, under {@code timeout}); empty when there are none. Each is handed over
     * once. Only between exchanges: with requests unanswered, their replies come first and this reads nothing.
     * Like {@link #peerClosed}, it also finds a connection the server closed: any other frame, or the end of the
     * stream, breaks it.
     *
     * @throws RemoteException when the server answered a notice with an error (the connection is then broken)
     * @throws IOException     when the connection failed, the server closed it, or sent something unasked
     */
    public List<Reply> notices(Duration timeout) throws IOException {
        if (payloadLeft > 0) {
            throw new IllegalStateException("previous reply from " + peer + " still has " + payloadLeft + " payload bytes unread");
        }
        while (unanswered.isEmpty() && !broken && arrived()) {
            try (Watchdog.Deadline d = Watchdog.arm(wire.socket(), timeout)) {
                Channels.readFully(wire.in(), header); // its first byte is in already
                FrameHeader.Decoded h = FrameHeader.decode(header, limits);
                if (!h.reply() || !noticeReply(h)) {
                    throw new IOException("peer " + peer + " sent a frame nobody asked for (request id "
                            + h.requestId() + ", opcode " + h.opcode() + "); the connection is given up");
                }
            } catch (IOException | RuntimeException e) {
                broken = true;
                throw e;
            }
        }
        if (noticed.isEmpty()) {
            return List.of();
        }
        List<Reply> out = List.copyOf(noticed);
        noticed.clear();
        return out;
    }

    /**
     * Whether a frame has begun to arrive, checked without waiting: if so its first byte is in {@link #header},
     * for the caller to read the rest. Never under TLS ({@link #pollsNotices}).
     */
    private boolean arrived() throws IOException {
        if (!pollsNotices()) {
            return false;
        }
        header.clear().limit(1);
        int n;
        try {
            n = readNow(header);
        } catch (IOException e) {
            broken = true;
            throw new IOException("connection to " + peer + " ended: " + e.getMessage(), e);
        }
        if (n == 0) {
            return false;
        }
        if (n < 0) {
            broken = true;
            throw new IOException("connection to " + peer + " closed by the peer");
        }
        header.limit(header.capacity());
        return true;
    }

    /**
     * Whether {@link #notices} looks for replies that have arrived: on a plain connection. Under TLS it hands over
     * only the replies read while a call waited for its own, so a requester there should not rely on notices.
     */
    public boolean pollsNotices() {
        return wire.in() == wire.socket();
    }

    /**
     * {@code h} is a reply's header: if it answers a notice, reads its body and sets it aside (true); if not,
     * the notices sent before the request it answers will not be answered (false).
     */
    private boolean noticeReply(FrameHeader.Decoded h) throws IOException {
        while (!mayAnswer.isEmpty() && mayAnswer.peekFirst() < h.requestId()) {
            mayAnswer.pollFirst();
        }
        if (mayAnswer.isEmpty() || mayAnswer.peekFirst() != h.requestId()) {
            return false;
        }
        mayAnswer.pollFirst();
        if (h.payloadLength() != 0 || h.bodyLength() > limits.maxBodyBytes()) {
            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, "peer " + peer + " answered notice "
                    + h.requestId() + " with " + h.bodyLength() + " body and " + h.payloadLength() + " payload bytes");
        }
        ByteBuffer b = ByteBuffer.allocate(h.bodyLength()).order(ByteOrder.LITTLE_ENDIAN);
        Channels.readFully(wire.in(), b);
        b.flip();
        BodyReader reader = new BodyReader(b);
        if (h.status() != FrameStatus.OK.code) {
            broken = true; // a later request's reply may be on its way behind this one: the stream is not kept
            throw new RemoteException(peer.toString(), Opcode.of(h.opcode()), FrameStatus.of(h.status()),
                    errorMessage(reader));
        }
        noticed.add(new Reply(h, reader));
        return true;
    }

    /**
     * The reply to the oldest request sent with {@link #send} and not yet answered, under a deadline
     * of {@code timeout}. A {@link RemoteException} answers that request alone: after
     * {@link FrameStatus#BAD_REQUEST} to a request without payload the connection goes on, and the
     * next call receives the next reply.
     *
     * @throws IllegalStateException when no request is unanswered
     */
    public Reply receive(Duration timeout) throws IOException {
        if (unanswered.isEmpty()) {
            throw new IllegalStateException("no request to " + peer + " is waiting for its reply");
        }
        return exchange(unanswered.peekFirst().op(), timeout, true, null);
    }

    /** Requests sent with {@link #send} whose replies were not received yet. */
    public int unanswered() {
        return unanswered.size();
    }

    /** Sends (when {@code request} is not null) and receives (when {@code receive}), under one deadline. */
    private Reply exchange(Opcode op, Duration timeout, boolean receive, BodyWriter request, ByteBuffer... payload)
            throws IOException {
        try (Watchdog.Deadline d = Watchdog.arm(wire.socket(), timeout)) {
            try {
                if (request != null) {
                    write(op, request, payload);
                }
                return receive ? read() : null;
            } catch (ClosedChannelException e) {
                broken = true;
                if (d.fired()) {
                    throw new SocketTimeoutException("no reply from " + peer + " to " + op.metricName + " within "
                            + Durations.format(timeout));
                }
                throw new IOException("connection to " + peer + " closed during " + op.metricName, e);
            } catch (IOException | RuntimeException e) {
                // after BAD_REQUEST the server keeps the connection only if it consumed our payload,
                // which we cannot know: keep it only for requests that carried none
                boolean keep = e instanceof RemoteException re && re.status() == FrameStatus.BAD_REQUEST
                        && !answeredHadPayload;
                if (!keep) {
                    broken = true;
                }
                throw e;
            }
        }
    }

    private static long payloadBytes(ByteBuffer[] payload) {
        long n = 0;
        for (ByteBuffer b : payload) {
            n += b.remaining();
        }
        return n;
    }

    private void write(Opcode op, BodyWriter request, ByteBuffer... payload) throws IOException {
        if (payloadLeft > 0) {
            throw new IllegalStateException("previous reply from " + peer + " still has " + payloadLeft + " payload bytes unread");
        }
        long payloadLength = payloadBytes(payload);
        ByteBuffer bodyBuf = request.buffer();
        long id = nextRequestId++;
        FrameHeader.write(header, op.code, false, 0, id, bodyBuf.remaining(), payloadLength);
        ByteBuffer[] all = new ByteBuffer[2 + payload.length];
        all[0] = header;
        all[1] = bodyBuf;
        System.arraycopy(payload, 0, all, 2, payload.length);
        // counted before the write: a write that fails part way breaks the connection anyway
        unanswered.addLast(new Sent(op, id, payloadLength > 0));
        Channels.writeFully(wire.out(), all);
    }

    private Reply read() throws IOException {
        if (payloadLeft > 0) {
            throw new IllegalStateException("previous reply from " + peer + " still has " + payloadLeft + " payload bytes unread");
        }
        Sent sent = unanswered.pollFirst();
        inFlight = sent.op();
        answeredHadPayload = sent.payload();
        header.clear();
        if (wire.in() == wire.socket()) {
            replies.read(wire.socket(), wire.in(), header); // at the end of the stream, the read below says so
        }
        Channels.readFully(wire.in(), header);
        FrameHeader.Decoded h = FrameHeader.decode(header, limits);
        while (h.reply() && !mayAnswer.isEmpty() && noticeReply(h)) {
            // a notice's answer came first (answers keep the order of the requests): set aside, read on
            header.clear();
            Channels.readFully(wire.in(), header);
            h = FrameHeader.decode(header, limits);
        }
        if (!h.reply()) {
            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, "peer " + peer + " sent a request where a reply was due");
        }
        long expectedId = sent.id();
        if (h.requestId() != expectedId && h.requestId() != 0) {
            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME,
                    "peer " + peer + " answered request " + h.requestId() + " but " + expectedId + " was outstanding");
        }
        if (body.capacity() < h.bodyLength()) {
            body = ByteBuffer.allocate(h.bodyLength()).order(ByteOrder.LITTLE_ENDIAN);
        }
        body.clear().limit(h.bodyLength());
        Channels.readFully(wire.in(), body);
        body.flip();
        BodyReader reader = new BodyReader(body);
        if (h.status() != FrameStatus.OK.code) {
            FrameStatus st = FrameStatus.of(h.status());
            String msg = errorMessage(reader);
            if (h.payloadLength() > 0) {
                broken = true;
            }
            throw new RemoteException(peer.toString(), inFlight, st, msg);
        }
        payloadLeft = h.payloadLength();
        return new Reply(h, reader);
    }

    private static String errorMessage(BodyReader reader) {
        try {
            return reader.string("error message");
        } catch (MalformedFrameException e) {
            return "(no message)";
        }
    }

    /** Reads the next {@code dst.byteSize()} payload bytes of the current reply straight into {@code dst}. */
    public void readPayload(MemorySegment dst, Duration timeout) throws IOException {
        if (dst.byteSize() > payloadLeft) {
            broken = true;
            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME,
                    "reply from " + peer + " has " + payloadLeft + " payload bytes left, " + dst.byteSize() + " expected");
        }
        try (Watchdog.Deadline d = Watchdog.arm(wire.socket(), timeout)) {
            Channels.readFully(wire.in(), dst);
            payloadLeft -= dst.byteSize();
        } catch (IOException e) {
            broken = true;
            throw new IOException("reading payload from " + peer + ": " + e.getMessage(), e);
        }
    }

    /** Drops {@code n} payload bytes of the current reply. */
    public void skipPayload(long n, Duration timeout) throws IOException {
        if (n > payloadLeft) {
            broken = true;
            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME,
                    "reply from " + peer + " has " + payloadLeft + " payload bytes left, " + n + " to skip");
        }
        try (Watchdog.Deadline d = Watchdog.arm(wire.socket(), timeout)) {
            ByteBuffer scratch = ByteBuffer.allocateDirect((int) Math.min(n, 1 << 20));
            Channels.skip(wire.in(), n, scratch);
            payloadLeft -= n;
        } catch (IOException e) {
            broken = true;
            throw new IOException("reading payload from " + peer + ": " + e.getMessage(), e);
        }
    }

    /** Payload bytes of the current reply not yet read. */
    public long payloadLeft() {
        return payloadLeft;
    }

    /** Shrinks the body buffer after an unusually large reply, so idle pooled connections stay small. */
    public void trim() {
        if (body.capacity() > (1 << 20)) {
            body = ByteBuffer.allocate(64 << 10).order(ByteOrder.LITTLE_ENDIAN);
        }
    }

    @Override
    public void close() throws IOException {
        broken = true;
        wire.socket().close();
    }

    /** Gives the caller the underlying channel's limits (for splitting large batches). */
    public Limits limits() {
        return limits;
    }
}
