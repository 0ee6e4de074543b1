package io.kvpool.protocol;

import io.kvpool.config.HostPort;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.SocketChannel;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * What a peer can make a {@link FrameServer} hold: connections (in all and per host), time (a
 * silent new connection, a frame that stops midway) and memory (bodies grow as they arrive and every
 * grown one takes its share of a {@link BodyBudget}; before authentication, nothing past a header).
 * Timeouts here are the server's own rules being exercised; every assertion waits for an outcome (a
 * closed connection, a counter) rather than for a clock.
 */
@Timeout(60)
class FrameServerLimitsTest {

    private static final Duration CALL = Duration.ofSeconds(20);

    private final CountDownLatch release = new CountDownLatch(1);
    /** A permit for each EXIST_KEY its handler holds. */
    private final Semaphore holding = new Semaphore(0);
    private final List<AutoCloseable> toClose = new ArrayList<>();
    private FrameServer server;
    private HostPort address;

    /** PING echoes its string body; EXIST_KEY holds its frame until the test ends. */
    private void handle(Request req) throws IOException {
        switch (req.opcode()) {
            case PING -> {
                String text = req.body().string("text");
                req.body().end("ping");
                req.reply(new BodyWriter().string(text));
            }
            case EXIST_KEY -> {
                holding.release();
                try {
                    release.await();
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
                req.reply(new BodyWriter());
            }
            default -> throw new AssertionError("unexpected " + req.opcode());
        }
    }

    private void start(Limits limits, Duration frameTimeout, int bodyBudget) throws IOException {
        start(limits, frameTimeout, bodyBudget, Secrets.NONE);
    }

    /** A server with {@code secrets} (secured unless NONE) and a body budget of its own. */
    private void start(Limits limits, Duration frameTimeout, int bodyBudget, Secrets secrets) throws IOException {
        server = new FrameServer("test", new InetSocketAddress(InetAddress.getLoopbackAddress(), 0), limits,
                frameTimeout, op -> true, this::handle, secrets, secrets.present() ? Opcode::access : op -> Access.NONE,
                new BodyBudget(bodyBudget, "this test's"));
        address = new HostPort("127.0.0.1", server.port());
    }

    private static final Secrets SECRETS = Secrets.of("cluster secret for the test", "admin secret for the test");

    @AfterEach
    void stop() throws Exception {
        release.countDown();
        for (AutoCloseable c : toClose) {
            c.close();
        }
        if (server != null) {
            server.close();
        }
    }

    /** A raw connection from the given loopback address (127.0.0.x are all this machine). */
    private SocketChannel rawFrom(String localAddress) throws IOException {
        SocketChannel ch = SocketChannel.open();
        toClose.add(ch);
        ch.bind(new InetSocketAddress(localAddress, 0));
        ch.connect(address.toSocketAddress());
        return ch;
    }

    private static String ping(SocketChannel ch, String text) throws IOException {
        ByteBuffer body = new BodyWriter().string(text).buffer();
        Channels.writeFully(ch, FrameHeader.write(FrameHeader.allocate(), Opcode.PING.code, false, 0, 7,
                body.remaining(), 0), body);
        Reply r = read(ch);
        assertThat(r.header.status()).as(r.message).isEqualTo(FrameStatus.OK.code);
        return r.message;
    }

    private record Reply(FrameHeader.Decoded header, String message) {
    }

    private static Reply read(SocketChannel ch) throws IOException {
        ByteBuffer h = FrameHeader.allocate();
        Channels.readFully(ch, h);
        FrameHeader.Decoded d = FrameHeader.decode(h, Limits.DEFAULT);
        ByteBuffer body = ByteBuffer.allocate(d.bodyLength()).order(ByteOrder.LITTLE_ENDIAN);
        Channels.readFully(ch, body);
        BodyReader r = new BodyReader(body.flip());
        return new Reply(d, r.string("text"));
    }

    private static void assertClosedByServer(SocketChannel ch) throws IOException {
        ByteBuffer one = ByteBuffer.allocate(1);
        int n;
        try {
            n = ch.read(one);
        } catch (IOException reset) {
            n = -1;
        }
        assertThat(n).as("the server should have closed the connection").isEqualTo(-1);
    }

    private void awaitConnections(int n) throws InterruptedException {
        while (server.connectionCount() != n) {
            Thread.sleep(5);
        }
    }

    /** Waits (within the test's timeout) until the frames handled have given all their budget back. */
    private void awaitBudgetGivenBack() throws InterruptedException {
        while (server.bodyBytesBuffered() != 0) {
            Thread.sleep(5);
        }
    }

    /** Writes a request header announcing {@code bodyLength} body bytes, then {@code sent} of them (zeros). */
    private static void announce(SocketChannel ch, Opcode op, int bodyLength, int sent) throws IOException {
        Channels.writeFully(ch, FrameHeader.write(FrameHeader.allocate(), op.code, false, 0, 9, bodyLength, 0),
                ByteBuffer.allocate(sent));
    }

    @Test
    void aConnectionOverThePerHostLimitIsToldWhyAndClosedAndItsPlaceIsFreedWhenOneCloses() throws Exception {
        start(new Limits(4096, 1 << 20).withConnections(8, 2), CALL, 1 << 20);
        SocketChannel a = rawFrom("127.0.0.1");
        SocketChannel b = rawFrom("127.0.0.1");
        assertThat(ping(a, "a")).isEqualTo("a");
        assertThat(ping(b, "b")).isEqualTo("b");
        SocketChannel c = rawFrom("127.0.0.1");
        Reply refused = read(c);
        assertThat(refused.header.requestId()).isZero();
        assertThat(refused.header.status()).isEqualTo(FrameStatus.INTERNAL_ERROR.code);
        assertThat(refused.message).contains("2 connections open from 127.0.0.1").contains("per host");
        assertClosedByServer(c);
        assertThat(server.refusedConnections()).isEqualTo(1);
        // another address is under its own count
        assertThat(ping(rawFrom("127.0.0.2"), "other host")).isEqualTo("other host");
        // a FrameConnection reports the refusal with the server's words
        a.close();
        awaitConnections(2);
        SocketChannel d = rawFrom("127.0.0.1");
        assertThat(ping(d, "d")).isEqualTo("d");
        assertThat(ping(b, "b again")).isEqualTo("b again");
    }

    @Test
    void aConnectionOverTheTotalLimitIsRefusedWhateverItsHost() throws Exception {
        start(new Limits(4096, 1 << 20).withConnections(3, 2), CALL, 1 << 20);
        ping(rawFrom("127.0.0.1"), "1");
        ping(rawFrom("127.0.0.2"), "2");
        ping(rawFrom("127.0.0.3"), "3");
        SocketChannel over = rawFrom("127.0.0.4");
        Reply refused = read(over);
        assertThat(refused.message).contains("3 connections open").contains("max connections 3");
        assertClosedByServer(over);
        try (FrameConnection fc = FrameConnection.connect(address, CALL, Limits.DEFAULT)) {
            RemoteException e = org.assertj.core.api.Assertions.catchThrowableOfType(RemoteException.class,
                    () -> fc.call(Opcode.PING, new BodyWriter().string("x"), CALL));
            assertThat(e).isNotNull();
            assertThat(e.getMessage()).contains("max connections 3");
        }
    }

    @Test
    void aSilentConnectionAndAFrameThatStopsMidwayAreClosedAtTheFrameTimeout() throws Exception {
        start(new Limits(4096, 1 << 20), Duration.ofMillis(300), 1 << 20);
        SocketChannel silent = rawFrom("127.0.0.1");
        SocketChannel halfHeader = rawFrom("127.0.0.1");
        halfHeader.write(ByteBuffer.wrap(new byte[]{0x4B, 0x50, FrameHeader.VERSION}));
        SocketChannel halfBody = rawFrom("127.0.0.1");
        Channels.writeFully(halfBody, FrameHeader.write(FrameHeader.allocate(), Opcode.PING.code, false, 0, 1, 4000, 0),
                ByteBuffer.wrap(new byte[10]));
        assertClosedByServer(silent);
        assertClosedByServer(halfHeader);
        assertClosedByServer(halfBody);
        awaitConnections(0);
        assertThat(server.timedOutFrames()).isEqualTo(3);
        // a connection that spoke first may then stay idle: it is a pooled one
        SocketChannel pooled = rawFrom("127.0.0.1");
        assertThat(ping(pooled, "first")).isEqualTo("first");
        SocketChannel probe = rawFrom("127.0.0.1");
        assertClosedByServer(probe); // a frame timeout has certainly passed since the first ping
        assertThat(ping(pooled, "later")).isEqualTo("later");
    }

    @Test
    void aBodySentInPiecesArrivesWholeAndItsBufferCountsAgainstTheBudgetUntilHandled() throws Exception {
        start(new Limits(8 << 20, 1 << 20), CALL, 1 << 20);
        String text = "x".repeat(60_000);
        SocketChannel pieces = rawFrom("127.0.0.1");
        ByteBuffer body = new BodyWriter().string(text).buffer();
        int length = body.remaining();
        Channels.writeFully(pieces, FrameHeader.write(FrameHeader.allocate(), Opcode.PING.code, false, 0, 3,
                length, 0));
        while (body.hasRemaining()) {
            ByteBuffer piece = body.slice().limit(Math.min(body.remaining(), 7_000));
            Channels.writeFully(pieces, piece);
            body.position(body.position() + piece.limit());
        }
        assertThat(read(pieces).message).isEqualTo(text);
        // a body of 60 kB, far under the old 1 MiB exemption, took its whole buffer from the budget...
        assertThat(server.budget().peak()).isEqualTo(length);
        // ...and gave it back once handled
        awaitBudgetGivenBack();
        // a body that fits the connection's standing buffer takes nothing
        assertThat(ping(pieces, "small")).isEqualTo("small");
        assertThat(server.budget().peak()).isEqualTo(length);
    }

    @Test
    void onAnOpenServerEveryBufferedBodyCountsAgainstTheBudgetAndNoMoreIsHeld() throws Exception {
        int budget = 1 << 20;
        int medium = 256 << 10; // a quarter of the budget, a quarter of the old exemption
        start(new Limits(8 << 20, 1 << 20), Duration.ofSeconds(2), budget);
        // a header announcing a body, with none of it sent, takes nothing
        announce(rawFrom("127.0.0.9"), Opcode.EXIST_KEY, medium, 0);
        // four bodies held by their handler take the whole budget...
        for (int i = 1; i <= 4; i++) {
            announce(rawFrom("127.0.0.1"), Opcode.EXIST_KEY, medium, medium);
            assertThat(holding.tryAcquire(CALL.toSeconds(), TimeUnit.SECONDS)).as("handler %d entered", i).isTrue();
        }
        assertThat(server.bodyBytesBuffered()).isEqualTo(budget);
        // ...so twelve more, from other addresses, are each refused naming the budget, none buffered
        List<SocketChannel> more = new ArrayList<>();
        for (int i = 0; i < 12; i++) {
            SocketChannel ch = rawFrom("127.0.0." + (2 + i % 3));
            announce(ch, Opcode.EXIST_KEY, medium, medium);
            more.add(ch);
        }
        for (SocketChannel ch : more) {
            Reply refused = read(ch);
            assertThat(refused.header.status()).isEqualTo(FrameStatus.FRAME_TOO_LARGE.code);
            assertThat(refused.message).contains("body budget of 1 MiB (this test's)").contains("stayed in use");
            assertClosedByServer(ch);
        }
        assertThat(server.refusedBodies()).isEqualTo(12);
        assertThat(holding.availablePermits()).isZero();
        assertThat(server.budget().peak()).isEqualTo(budget);
        assertThat(server.bodyBytesBuffered()).isEqualTo(budget);
    }

    @Test
    void aBodyLargerThanTheWholeBudgetIsRefusedFromItsHeader() throws Exception {
        start(new Limits(8 << 20, 1 << 20), CALL, 1 << 20);
        SocketChannel ch = rawFrom("127.0.0.1");
        announce(ch, Opcode.PING, 2 << 20, 0);
        Reply refused = read(ch);
        assertThat(refused.header.status()).isEqualTo(FrameStatus.FRAME_TOO_LARGE.code);
        assertThat(refused.message).contains("2097152 bytes can never be buffered")
                .contains("whole body budget of 1 MiB (this test's)");
        assertClosedByServer(ch);
        assertThat(server.refusedBodies()).isEqualTo(1);
        assertThat(server.budget().peak()).isZero();
    }

    @Test
    void beforeAuthenticationAFrameIsRefusedFromItsHeaderAndItsBodyIsNeverBuffered() throws Exception {
        start(new Limits(8 << 20, 1 << 20), CALL, 1 << 20, SECRETS);
        // the attack: many connections, from several addresses, each announcing 1 MiB and sending all but a byte
        int connections = 24;
        ByteBuffer almostAll = ByteBuffer.allocate((1 << 20) - 1);
        List<SocketChannel> attackers = new ArrayList<>();
        List<Thread> senders = new ArrayList<>();
        for (int i = 0; i < connections; i++) {
            SocketChannel ch = rawFrom("127.0.0." + (1 + i % 3));
            attackers.add(ch);
            Opcode op = i % 2 == 0 ? Opcode.PING : Opcode.NODE_WRITE;
            senders.add(Thread.ofVirtual().start(() -> {
                try {
                    Channels.writeFully(ch, FrameHeader.write(FrameHeader.allocate(), op.code, false, 0, 5, 1 << 20, 0),
                            almostAll.duplicate());
                } catch (IOException closedMidway) {
                    // the server may close before it drained the rest: that is what it should do
                }
            }));
        }
        for (int i = 0; i < connections; i++) {
            Reply refused = read(attackers.get(i));
            assertThat(refused.header.status()).isEqualTo(FrameStatus.UNAUTHORIZED.code);
            assertThat(refused.message).contains(i % 2 == 0 ? "ping needs the cluster secret" : "node_write needs")
                    .contains("may send only auth_begin and auth_prove");
            assertClosedByServer(attackers.get(i));
        }
        for (Thread t : senders) {
            t.join();
        }
        assertThat(server.refusedAuth()).isEqualTo(connections);
        // not one body byte was buffered past the connections' standing buffers
        assertThat(server.budget().peak()).isZero();
        // and a client that authenticates is served
        try (FrameConnection c = FrameConnection.connect(address, CALL, Limits.DEFAULT, SECRETS)) {
            BodyReader echoed = c.call(Opcode.PING, new BodyWriter().string("proven"), CALL).body();
            assertThat(echoed.string("text")).isEqualTo("proven");
        }
    }

    @Test
    void anAuthenticationFrameOverItsFixedSizeIsRefusedFromItsHeader() throws Exception {
        start(new Limits(8 << 20, 1 << 20), CALL, 1 << 20, SECRETS);
        SocketChannel big = rawFrom("127.0.0.1");
        announce(big, Opcode.AUTH_BEGIN, 1 << 20, 64 << 10);
        Reply refused = read(big);
        assertThat(refused.header.status()).isEqualTo(FrameStatus.FRAME_TOO_LARGE.code);
        assertThat(refused.message).contains("auth_begin carries a body of at most 66 bytes and no payload")
                .contains("announced 1048576 body");
        assertClosedByServer(big);
        SocketChannel withPayload = rawFrom("127.0.0.1");
        Channels.writeFully(withPayload, FrameHeader.write(FrameHeader.allocate(), Opcode.AUTH_PROVE.code, false, 0, 6,
                35, 4096));
        Reply payloadRefused = read(withPayload);
        assertThat(payloadRefused.header.status()).isEqualTo(FrameStatus.FRAME_TOO_LARGE.code);
        assertThat(payloadRefused.message).contains("auth_prove carries a body of at most 35 bytes");
        assertClosedByServer(withPayload);
        assertThat(server.refusedAuth()).isEqualTo(2);
        assertThat(server.budget().peak()).isZero();
    }

    @Test
    void everyServerOfTheProcessSharesOneBudgetSizedFromTheHeap() throws Exception {
        try (FrameServer a = new FrameServer("a", new InetSocketAddress(InetAddress.getLoopbackAddress(), 0),
                Limits.DEFAULT, CALL, op -> true, this::handle);
             FrameServer b = new FrameServer("b", new InetSocketAddress(InetAddress.getLoopbackAddress(), 0),
                     Limits.DEFAULT, CALL, op -> true, this::handle, SECRETS, Opcode::access)) {
            assertThat(a.budget()).isSameAs(BodyBudget.PROCESS).isSameAs(b.budget());
            assertThat(a.bodyBudgetBytes()).isEqualTo(BodyBudget.sizeFor(Runtime.getRuntime().maxMemory()));
        }
        assertThat(BodyBudget.sizeFor(256L << 20)).as("floor").isEqualTo(64 << 20);
        assertThat(BodyBudget.sizeFor(2L << 30)).as("an eighth").isEqualTo(256 << 20);
        assertThat(BodyBudget.sizeFor(64L << 30)).as("ceiling").isEqualTo(1 << 30);
        assertThat(BodyBudget.PROCESS.toString()).contains("an eighth of the heap (-Xmx)");
    }
}
