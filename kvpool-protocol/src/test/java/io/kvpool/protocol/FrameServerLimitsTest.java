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

import static org.assertj.core.api.Assertions.assertThat;

/**
 * What a peer can make a {@link FrameServer} hold: connections (in all and per host), time (a
 * silent new connection, a frame that stops midway) and memory (bodies grow as they arrive; large
 * ones share a budget). Timeouts here are the server's own rules being exercised; every assertion
 * waits for an outcome (a closed connection, a counter) rather than for a clock.
 */
@Timeout(60)
class FrameServerLimitsTest {

    private static final Duration CALL = Duration.ofSeconds(20);

    private final CountDownLatch release = new CountDownLatch(1);
    private final CountDownLatch held = new CountDownLatch(1);
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
                held.countDown();
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

    private void start(Limits limits, Duration frameTimeout, int largeBodyBudget) throws IOException {
        server = new FrameServer("test", new InetSocketAddress(InetAddress.getLoopbackAddress(), 0), limits,
                frameTimeout, op -> true, this::handle, Secrets.NONE, op -> Access.NONE, largeBodyBudget);
        address = new HostPort("127.0.0.1", server.port());
    }

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
    void bodiesGrowAsTheyArriveAndLargeOnesShareABudget() throws Exception {
        start(new Limits(8 << 20, 1 << 20), Duration.ofSeconds(1), 3 << 20);
        // a body many times the first buffer, sent in pieces, arrives whole
        String text = "x".repeat(60_000);
        SocketChannel pieces = rawFrom("127.0.0.1");
        ByteBuffer body = new BodyWriter().string(text).buffer();
        Channels.writeFully(pieces, FrameHeader.write(FrameHeader.allocate(), Opcode.PING.code, false, 0, 3,
                body.remaining(), 0));
        while (body.hasRemaining()) {
            ByteBuffer piece = body.slice().limit(Math.min(body.remaining(), 7_000));
            Channels.writeFully(pieces, piece);
            body.position(body.position() + piece.limit());
        }
        Reply echoed = read(pieces);
        assertThat(echoed.message).isEqualTo(text);
        // a header announcing 3 MiB with nothing after it takes no budget
        SocketChannel announced = rawFrom("127.0.0.4");
        Channels.writeFully(announced, FrameHeader.write(FrameHeader.allocate(), Opcode.EXIST_KEY.code, false, 0, 4,
                3 << 20, 0));
        // a 3 MiB body held by its handler takes 2 of the 3 MiB budget (what its buffer holds past 1 MiB)...
        SocketChannel holder = rawFrom("127.0.0.1");
        Channels.writeFully(holder, FrameHeader.write(FrameHeader.allocate(), Opcode.EXIST_KEY.code, false, 0, 4,
                3 << 20, 0), ByteBuffer.allocate(3 << 20));
        held.await();
        // ...so another one, once past its first MiB, is refused when the frame timeout passes, naming the budget
        SocketChannel second = rawFrom("127.0.0.2");
        Channels.writeFully(second, FrameHeader.write(FrameHeader.allocate(), Opcode.EXIST_KEY.code, false, 0, 5,
                3 << 20, 0), ByteBuffer.allocate((1 << 20) + 100));
        Reply refused = read(second);
        assertThat(refused.header.status()).isEqualTo(FrameStatus.FRAME_TOO_LARGE.code);
        assertThat(refused.message).contains("budget of 3 MiB");
        assertThat(server.refusedBodies()).isEqualTo(1);
        // small bodies need no budget
        assertThat(ping(rawFrom("127.0.0.3"), "small")).isEqualTo("small");
    }
}
