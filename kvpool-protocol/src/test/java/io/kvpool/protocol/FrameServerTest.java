package io.kvpool.protocol;

import io.kvpool.config.HostPort;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.SocketTimeoutException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CountDownLatch;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.assertj.core.api.Assertions.catchThrowableOfType;

/**
 * {@link FrameServer} and {@link FrameConnection} over loopback, including what the server does with
 * frames that break the protocol. The class-level timeout only guards against hangs; no assertion
 * depends on timing.
 */
@Timeout(30)
class FrameServerTest {

    private static final Limits LIMITS = new Limits(4096, 1 << 20);
    private static final Duration CALL = Duration.ofSeconds(10);

    private final CountDownLatch release = new CountDownLatch(1);
    private final List<AutoCloseable> toClose = new ArrayList<>();
    private FrameServer server;
    private HostPort address;

    /**
     * PING echoes its string body; PUT_START echoes its string body and its payload; HELLO throws
     * BadRequestException; GET_REPLICA_LIST throws an unexpected exception; EXIST_KEY never replies
     * until the test ends; NODE_BEACON answers nothing to an empty string, BAD_REQUEST to "bad", and its string
     * otherwise; REMOVE_ALL is not served at all.
     */
    private void handle(Request req) throws IOException {
        switch (req.opcode()) {
            case PING -> {
                String text = req.body().string("text");
                req.body().end("ping");
                req.reply(new BodyWriter().string(text));
            }
            case PUT_START -> {
                String text = req.body().string("text");
                req.body().end("put_start");
                byte[] payload = new byte[(int) req.payloadLength()];
                req.readPayload(MemorySegment.ofArray(payload));
                req.reply(new BodyWriter().string(text), ByteBuffer.wrap(payload));
            }
            case HELLO -> throw new BadRequestException("hello carries a bad field: " + req.body().string("text"));
            case GET_REPLICA_LIST -> throw new IllegalStateException("handler bug");
            case EXIST_KEY -> {
                try {
                    release.await();
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
                req.reply(new BodyWriter());
            }
            case NODE_BEACON -> {
                String text = req.body().string("text");
                req.body().end("beacon");
                if (text.isEmpty()) {
                    req.answerNothing();
                } else if (text.equals("bad")) {
                    throw new BadRequestException("a beacon the server refuses");
                } else {
                    req.reply(new BodyWriter().string(text));
                }
            }
            default -> throw new AssertionError("unexpected " + req.opcode());
        }
    }

    @BeforeEach
    void start() throws IOException {
        server = new FrameServer("test", new InetSocketAddress(InetAddress.getLoopbackAddress(), 0), LIMITS,
                Duration.ofSeconds(20), op -> op != Opcode.REMOVE_ALL, this::handle);
        configure(server);
        address = new HostPort(InetAddress.getLoopbackAddress().getHostAddress(), server.port());
    }

    /** What a subclass changes on the server before any connection arrives ({@link FrameLoopTest}: the frame loop). */
    void configure(FrameServer s) throws IOException {
    }

    @AfterEach
    void stop() throws Exception {
        release.countDown();
        for (AutoCloseable c : toClose) {
            c.close();
        }
        server.close();
    }

    private FrameConnection connect() throws IOException {
        FrameConnection c = FrameConnection.connect(address, CALL, Limits.DEFAULT);
        toClose.add(c);
        return c;
    }

    private SocketChannel raw() throws IOException {
        SocketChannel ch = SocketChannel.open(address.toSocketAddress());
        toClose.add(ch);
        return ch;
    }

    private static String echo(FrameConnection c, String text) throws IOException {
        FrameConnection.Reply r = c.call(Opcode.PING, new BodyWriter().string(text), CALL);
        assertThat(r.header().reply()).isTrue();
        assertThat(r.header().status()).isEqualTo(FrameStatus.OK.code);
        assertThat(r.payloadLength()).isZero();
        String s = r.body().string("text");
        r.body().end("ping reply");
        return s;
    }

    /** Reads one reply frame from a raw channel: its header and its error message. */
    private record RawReply(FrameHeader.Decoded header, String message) {
    }

    private static RawReply readReply(SocketChannel ch) throws IOException {
        ByteBuffer h = FrameHeader.allocate();
        Channels.readFully(ch, h);
        FrameHeader.Decoded d = FrameHeader.decode(h, Limits.DEFAULT);
        ByteBuffer body = ByteBuffer.allocate(d.bodyLength()).order(ByteOrder.LITTLE_ENDIAN);
        Channels.readFully(ch, body);
        body.flip();
        BodyReader r = new BodyReader(body);
        String msg = r.string("message");
        r.end("error reply");
        return new RawReply(d, msg);
    }

    private static void assertClosedByServer(SocketChannel ch) throws IOException {
        ByteBuffer one = ByteBuffer.allocate(1);
        assertThat(ch.read(one)).as("server should have closed the connection").isEqualTo(-1);
    }

    private static ByteBuffer validHeader(int opcode, long requestId, int bodyLength, long payloadLength) {
        return FrameHeader.write(FrameHeader.allocate(), opcode, false, 0, requestId, bodyLength, payloadLength);
    }

    // ------------------------------------------------------------------ well-formed traffic

    @Test
    void echoesManyCallsOnOneConnection() throws IOException {
        FrameConnection c = connect();
        for (int i = 0; i < 50; i++) {
            assertThat(echo(c, "hello " + i)).isEqualTo("hello " + i);
        }
        assertThat(echo(c, "")).isEmpty();
        assertThat(echo(c, "\u00e9\u20ac")).isEqualTo("\u00e9\u20ac");
        assertThat(c.isBroken()).isFalse();
        assertThat(c.peer()).isEqualTo(address);
    }

    @Test
    void payloadTravelsBothWays() throws IOException {
        long seed = 0x9A710ADL;
        Random rnd = new Random(seed);
        FrameConnection c = connect();
        for (int len : new int[]{0, 1, 4096, 300_000}) {
            byte[] out = new byte[len];
            rnd.nextBytes(out);
            FrameConnection.Reply r = c.call(Opcode.PUT_START, new BodyWriter().string("p" + len), CALL,
                    ByteBuffer.wrap(out));
            assertThat(r.body().string("text")).isEqualTo("p" + len);
            assertThat(r.payloadLength()).isEqualTo(len);
            assertThat(c.payloadLeft()).isEqualTo(len);
            byte[] back = new byte[len];
            c.readPayload(MemorySegment.ofArray(back), CALL);
            assertThat(c.payloadLeft()).isZero();
            assertThat(back).as("seed=%d len=%d", seed, len).isEqualTo(out);
        }
        // skipping a payload also keeps the connection in step
        c.call(Opcode.PUT_START, new BodyWriter().string("skip"), CALL, ByteBuffer.wrap(new byte[5000]));
        c.skipPayload(5000, CALL);
        assertThat(echo(c, "after skip")).isEqualTo("after skip");
    }

    @Test
    void nextCallBeforeReadingPayloadIsRefused() throws IOException {
        FrameConnection c = connect();
        c.call(Opcode.PUT_START, new BodyWriter().string("x"), CALL, ByteBuffer.wrap(new byte[10]));
        assertThatThrownBy(() -> c.call(Opcode.PING, new BodyWriter().string("y"), CALL))
                .isInstanceOf(IllegalStateException.class).hasMessageContaining("10 payload bytes unread");
    }

    @Test
    void manyConnectionsAtOnce() throws IOException {
        List<FrameConnection> conns = new ArrayList<>();
        for (int i = 0; i < 8; i++) {
            conns.add(connect());
        }
        for (int round = 0; round < 5; round++) {
            for (int i = 0; i < conns.size(); i++) {
                assertThat(echo(conns.get(i), round + "/" + i)).isEqualTo(round + "/" + i);
            }
        }
    }

    // ------------------------------------------------------------------ malformed input

    @Test
    void garbageGetsMalformedFrameAndClose() throws IOException {
        SocketChannel ch = raw();
        byte[] garbage = "GET / HTTP/1.1\r\nHost: kvpool\r\n\r\n".getBytes(StandardCharsets.US_ASCII);
        assertThat(garbage).hasSize(32);
        Channels.writeFully(ch, ByteBuffer.wrap(garbage));
        RawReply r = readReply(ch);
        assertThat(r.header().reply()).isTrue();
        assertThat(FrameStatus.of(r.header().status())).isEqualTo(FrameStatus.MALFORMED_FRAME);
        assertThat(r.message()).contains("bad magic");
        assertClosedByServer(ch);
        assertThat(echo(connect(), "still serving")).isEqualTo("still serving");
    }

    @Test
    void unknownOpcodeGetsUnknownOpcodeAndClose() throws IOException {
        SocketChannel ch = raw();
        Channels.writeFully(ch, validHeader(0x7F, 4242, 0, 0));
        RawReply r = readReply(ch);
        assertThat(FrameStatus.of(r.header().status())).isEqualTo(FrameStatus.UNKNOWN_OPCODE);
        assertThat(r.header().requestId()).isEqualTo(4242);
        assertThat(r.header().opcode()).isEqualTo(0x7F);
        assertThat(r.message()).contains("0x7f");
        assertClosedByServer(ch);
        assertThat(echo(connect(), "still serving")).isEqualTo("still serving");
    }

    /**
     * {@link FrameConnection#peerClosed}: false on a live connection, without disturbing it, and false with
     * a request outstanding (its reply is the caller's to read); true once the server closed the connection.
     */
    @Test
    void peerClosedTellsALiveConnectionFromOneTheServerClosed() throws Exception {
        FrameConnection c = connect();
        assertThat(echo(c, "one")).isEqualTo("one");
        assertThat(c.peerClosed()).isFalse();
        assertThat(echo(c, "two")).as("the check read nothing of the stream").isEqualTo("two");
        c.send(Opcode.EXIST_KEY, new BodyWriter(), CALL);
        assertThat(c.peerClosed()).as("a reply is due: not the check's to read").isFalse();
        release.countDown();
        c.receive(CALL);

        // a frame the server does not serve: it answers UNKNOWN_OPCODE and closes the connection
        assertThatThrownBy(() -> c.call(Opcode.REMOVE_ALL, new BodyWriter(), CALL)).isInstanceOf(RemoteException.class);
        while (!c.peerClosed()) {
            Thread.sleep(1); // the FIN follows the reply; the class timeout bounds the wait
        }
        assertThat(c.isBroken()).isTrue();
        assertThat(c.peerClosed()).isTrue();
    }

    @Test
    void knownOpcodeThisServerDoesNotServeGetsUnknownOpcode() throws IOException {
        SocketChannel ch = raw();
        Channels.writeFully(ch, validHeader(Opcode.REMOVE_ALL.code, 5, 0, 0));
        RawReply r = readReply(ch);
        assertThat(FrameStatus.of(r.header().status())).isEqualTo(FrameStatus.UNKNOWN_OPCODE);
        assertThat(r.header().requestId()).isEqualTo(5);
        assertClosedByServer(ch);
        assertThat(echo(connect(), "still serving")).isEqualTo("still serving");
    }

    @Test
    void bodyOverTheLimitGetsFrameTooLargeAndClose() throws IOException {
        SocketChannel ch = raw();
        Channels.writeFully(ch, validHeader(Opcode.PING.code, 77, LIMITS.maxBodyBytes() + 1, 0));
        RawReply r = readReply(ch);
        assertThat(FrameStatus.of(r.header().status())).isEqualTo(FrameStatus.FRAME_TOO_LARGE);
        assertThat(r.header().requestId()).isEqualTo(77);
        assertThat(r.message()).contains("body length 4097");
        assertClosedByServer(ch);
        assertThat(echo(connect(), "still serving")).isEqualTo("still serving");
    }

    @Test
    void payloadOverTheLimitGetsFrameTooLargeAndClose() throws IOException {
        SocketChannel ch = raw();
        Channels.writeFully(ch, validHeader(Opcode.PUT_START.code, 78, 0, LIMITS.maxPayloadBytes() + 1));
        RawReply r = readReply(ch);
        assertThat(FrameStatus.of(r.header().status())).isEqualTo(FrameStatus.FRAME_TOO_LARGE);
        assertThat(r.message()).contains("payload length");
        assertClosedByServer(ch);
        assertThat(echo(connect(), "still serving")).isEqualTo("still serving");
    }

    @Test
    void unsupportedVersionGetsUnsupportedVersionAndClose() throws IOException {
        SocketChannel ch = raw();
        ByteBuffer h = validHeader(Opcode.PING.code, 12, 0, 0);
        h.put(FrameHeader.VERSION_OFFSET, (byte) (FrameHeader.VERSION + 1));
        Channels.writeFully(ch, h);
        RawReply r = readReply(ch);
        assertThat(FrameStatus.of(r.header().status())).isEqualTo(FrameStatus.UNSUPPORTED_VERSION);
        assertThat(r.header().requestId()).isEqualTo(12);
        assertClosedByServer(ch);
        assertThat(echo(connect(), "still serving")).isEqualTo("still serving");
    }

    @Test
    void replyFrameSentAsRequestGetsMalformedFrameAndClose() throws IOException {
        SocketChannel ch = raw();
        Channels.writeFully(ch, FrameHeader.write(FrameHeader.allocate(), Opcode.PING.code, true, 0, 3, 0, 0));
        RawReply r = readReply(ch);
        assertThat(FrameStatus.of(r.header().status())).isEqualTo(FrameStatus.MALFORMED_FRAME);
        assertClosedByServer(ch);
        assertThat(echo(connect(), "still serving")).isEqualTo("still serving");
    }

    @Test
    void badFrameAfterGoodTrafficOnlyClosesThatConnection() throws IOException {
        FrameConnection bystander = connect();
        assertThat(echo(bystander, "before")).isEqualTo("before");
        SocketChannel ch = raw();
        // one good request, then garbage on the same connection
        BodyWriter body = new BodyWriter().string("good");
        Channels.writeFully(ch, validHeader(Opcode.PING.code, 1, body.length(), 0), body.buffer());
        ByteBuffer h = FrameHeader.allocate();
        Channels.readFully(ch, h);
        FrameHeader.Decoded d = FrameHeader.decode(h, Limits.DEFAULT);
        assertThat(d.status()).isEqualTo(FrameStatus.OK.code);
        assertThat(d.requestId()).isEqualTo(1);
        Channels.readFully(ch, ByteBuffer.allocate(d.bodyLength()));
        Channels.writeFully(ch, ByteBuffer.wrap(new byte[32]));
        RawReply r = readReply(ch);
        assertThat(FrameStatus.of(r.header().status())).isEqualTo(FrameStatus.MALFORMED_FRAME);
        assertClosedByServer(ch);
        assertThat(echo(bystander, "after")).isEqualTo("after");
        assertThat(bystander.isBroken()).isFalse();
    }

    @Test
    void truncatedBodyFromAHandlerGetsMalformedFrameAndBreaksTheConnection() throws IOException {
        FrameConnection c = connect();
        RemoteException e = catchThrowableOfType(RemoteException.class,
                () -> c.call(Opcode.PING, new BodyWriter().u8(5), CALL));
        assertThat(e).isNotNull();
        assertThat(e.status()).isEqualTo(FrameStatus.MALFORMED_FRAME);
        assertThat(e.getMessage()).contains("text");
        assertThat(c.isBroken()).isTrue();
        assertThat(echo(connect(), "still serving")).isEqualTo("still serving");
    }

    // ------------------------------------------------------------------ handler errors

    @Test
    void badRequestKeepsTheConnectionUsable() throws IOException {
        FrameConnection c = connect();
        RemoteException e = catchThrowableOfType(RemoteException.class,
                () -> c.call(Opcode.HELLO, new BodyWriter().string("role=7"), CALL));
        assertThat(e).isNotNull();
        assertThat(e.status()).isEqualTo(FrameStatus.BAD_REQUEST);
        assertThat(e.getMessage()).contains("hello carries a bad field: role=7").contains("hello");
        assertThat(e.peer()).isEqualTo(address.toString());
        assertThat(c.isBroken()).isFalse();
        assertThat(echo(c, "next call")).isEqualTo("next call");
        // and again, to show the request ids stay in step
        assertThatThrownBy(() -> c.call(Opcode.HELLO, new BodyWriter().string("again"), CALL))
                .isInstanceOf(RemoteException.class);
        assertThat(echo(c, "third call")).isEqualTo("third call");
    }

    @Test
    void unexpectedHandlerExceptionGetsInternalError() throws IOException {
        FrameConnection c = connect();
        RemoteException e = catchThrowableOfType(RemoteException.class,
                () -> c.call(Opcode.GET_REPLICA_LIST, new BodyWriter(), CALL));
        assertThat(e).isNotNull();
        assertThat(e.status()).isEqualTo(FrameStatus.INTERNAL_ERROR);
        assertThat(e.getMessage()).contains("IllegalStateException").contains("handler bug");
        assertThat(echo(connect(), "still serving")).isEqualTo("still serving");
    }

    @Test
    void callTimesOutWhenTheServerNeverReplies() throws IOException {
        FrameConnection c = connect();
        assertThatThrownBy(() -> c.call(Opcode.EXIST_KEY, new BodyWriter(), Duration.ofMillis(300)))
                .isInstanceOf(SocketTimeoutException.class)
                .hasMessageContaining(address.toString())
                .hasMessageContaining("exist_key");
        assertThat(c.isBroken()).isTrue();
        // the stuck handler holds one connection only
        assertThat(echo(connect(), "still serving")).isEqualTo("still serving");
    }

    @Test
    void connectToAClosedPortNamesThePeer() throws IOException {
        int port;
        try (java.nio.channels.ServerSocketChannel s = java.nio.channels.ServerSocketChannel.open()) {
            s.bind(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0));
            port = ((InetSocketAddress) s.getLocalAddress()).getPort();
        }
        HostPort nobody = new HostPort(InetAddress.getLoopbackAddress().getHostAddress(), port);
        assertThatThrownBy(() -> FrameConnection.connect(nobody, CALL, Limits.DEFAULT))
                .isInstanceOf(IOException.class).hasMessageContaining(nobody.toString());
    }

    /**
     * Pipelining (protocol section 1.2): many requests sent before any reply is read are answered one
     * each, in order, each with its own request id; a BAD_REQUEST answers its request alone, and the
     * requests behind it are served.
     */
    @Test
    void pipelinedRequestsAreAnsweredInOrderAndABadOneAnswersOnlyItself() throws IOException {
        FrameConnection c = connect();
        int n = 200;
        for (int i = 0; i < n; i++) {
            if (i == 100) {
                c.send(Opcode.HELLO, new BodyWriter().string("field " + i), CALL);
            } else if (i % 2 == 0) {
                c.send(Opcode.PING, new BodyWriter().string("ping " + i), CALL);
            } else {
                byte[] payload = ("payload " + i).getBytes(StandardCharsets.UTF_8);
                c.send(Opcode.PUT_START, new BodyWriter().string("put " + i), CALL, ByteBuffer.wrap(payload));
            }
        }
        assertThat(c.unanswered()).isEqualTo(n);
        long lastId = 0;
        for (int i = 0; i < n; i++) {
            if (i == 100) {
                RemoteException e = catchThrowableOfType(RemoteException.class, () -> c.receive(CALL));
                assertThat(e.status()).isEqualTo(FrameStatus.BAD_REQUEST);
                assertThat(e.getMessage()).contains("field 100");
                assertThat(c.isBroken()).isFalse();
                continue;
            }
            FrameConnection.Reply r = c.receive(CALL);
            assertThat(r.header().requestId()).as("reply %d's id", i).isGreaterThan(lastId);
            lastId = r.header().requestId();
            if (i % 2 == 0) {
                assertThat(r.body().string("text")).isEqualTo("ping " + i);
            } else {
                assertThat(r.body().string("text")).isEqualTo("put " + i);
                byte[] back = new byte[(int) r.payloadLength()];
                c.readPayload(MemorySegment.ofArray(back), CALL);
                assertThat(new String(back, StandardCharsets.UTF_8)).isEqualTo("payload " + i);
            }
        }
        assertThat(c.unanswered()).isZero();
        assertThat(echo(c, "after")).isEqualTo("after");
    }

    @Test
    void aCallWhileRepliesAreUnansweredAndAReceiveWithNoneAreRefused() throws IOException {
        FrameConnection c = connect();
        assertThatThrownBy(() -> c.receive(CALL)).isInstanceOf(IllegalStateException.class)
                .hasMessageContaining("no request");
        c.send(Opcode.PING, new BodyWriter().string("one"), CALL);
        assertThatThrownBy(() -> c.call(Opcode.PING, new BodyWriter().string("two"), CALL))
                .isInstanceOf(IllegalStateException.class).hasMessageContaining("1 pipelined requests");
        assertThat(c.receive(CALL).body().string("text")).isEqualTo("one");
        assertThat(echo(c, "three")).isEqualTo("three");
    }

    private static void beacon(FrameConnection c, String text) throws IOException {
        c.notify(Opcode.NODE_BEACON, new BodyWriter().string(text), CALL);
    }

    private static List<String> texts(List<FrameConnection.Reply> replies) {
        List<String> out = new ArrayList<>();
        for (FrameConnection.Reply r : replies) {
            assertThat(r.header().opcode()).isEqualTo(Opcode.NODE_BEACON.code);
            out.add(r.body().string("text"));
        }
        return out;
    }

    /** The answers that have arrived, waiting (without a deadline of its own: the class's guards a hang) for one. */
    private static List<String> awaitNotices(FrameConnection c) throws Exception {
        List<String> got = new ArrayList<>();
        while (got.isEmpty()) {
            got.addAll(texts(c.notices(CALL)));
            Thread.sleep(1);
        }
        return got;
    }

    @Test
    void noticesAreAnsweredOnlyWithNewsAndTheirAnswersNeverGetInTheWayOfACall() throws Exception {
        FrameConnection c = connect();
        assertThat(echo(c, "first")).isEqualTo("first");
        beacon(c, "");
        beacon(c, "news 1");
        beacon(c, "");
        beacon(c, "");
        beacon(c, "news 2");
        // the answers come before the call's reply: set aside, in order, and the call gets its own
        assertThat(echo(c, "call")).isEqualTo("call");
        assertThat(texts(c.notices(CALL))).containsExactly("news 1", "news 2");
        assertThat(c.notices(CALL)).as("each is handed over once").isEmpty();
        // without a call in between: read once it has arrived
        beacon(c, "");
        beacon(c, "news 3");
        assertThat(awaitNotices(c)).containsExactly("news 3");
        // unanswered ones before a reply are given up: an answer after them is still matched to its own
        beacon(c, "");
        assertThat(echo(c, "between")).isEqualTo("between");
        beacon(c, "news 4");
        assertThat(awaitNotices(c)).containsExactly("news 4");
        assertThat(echo(c, "after")).isEqualTo("after");
        assertThat(c.isBroken()).isFalse();
    }

    @Test
    void aRefusedNoticeBreaksTheConnectionAtItsAnswer() throws Exception {
        FrameConnection c = connect();
        assertThat(echo(c, "first")).isEqualTo("first");
        beacon(c, "bad");
        RemoteException e = catchThrowableOfType(RemoteException.class, () -> echo(c, "call"));
        assertThat(e.status()).isEqualTo(FrameStatus.BAD_REQUEST);
        assertThat(e.getMessage()).contains("node_beacon").contains("a beacon the server refuses");
        assertThat(c.isBroken()).as("the call's own reply is still on its way: the stream is given up").isTrue();
    }

    @Test
    void noticesFindAConnectionTheServerClosed() throws Exception {
        FrameConnection c = connect();
        assertThat(echo(c, "first")).isEqualTo("first");
        beacon(c, "");
        server.close();
        IOException e = catchThrowableOfType(IOException.class, () -> {
            while (true) {
                c.notices(CALL); // nothing to hand over until the end of the stream arrives, which it says
                Thread.sleep(1);
            }
        });
        assertThat(e).hasMessageContaining("connection to " + address); // closed, or reset: the beacon was unread
        assertThat(c.isBroken()).isTrue();
    }
}
