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
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * What a peer can make a {@link FrameServer} hold: connections (in all and per host), time (a
 * silent new connection, a frame that stops midway), memory (a body larger than a connection's
 * standing buffer reserves its whole size from a {@link BodyBudget}, in turn; before authentication,
 * nothing past a header) and threads (none of a platform kind before authentication).
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

    /**
     * PING echoes its string body; BATCH_EXIST_KEY answers how many body bytes it received; EXIST_KEY
     * holds its frame until the test ends.
     */
    private void handle(Request req) throws IOException {
        switch (req.opcode()) {
            case PING -> {
                String text = req.body().string("text");
                req.body().end("ping");
                req.reply(new BodyWriter().string(text));
            }
            case BATCH_EXIST_KEY -> req.reply(new BodyWriter().i32(req.body().remaining()));
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
        start("test", limits, frameTimeout, bodyBudget, secrets);
    }

    /** The same, named {@code name} (its threads' names begin with it). */
    private void start(String name, Limits limits, Duration frameTimeout, int bodyBudget, Secrets secrets)
            throws IOException {
        server = new FrameServer(name, new InetSocketAddress(InetAddress.getLoopbackAddress(), 0), limits,
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
        RawReply r = readRaw(ch);
        return new Reply(r.header, r.body.string("text"));
    }

    private record RawReply(FrameHeader.Decoded header, BodyReader body) {
    }

    private static RawReply readRaw(SocketChannel ch) throws IOException {
        ByteBuffer h = FrameHeader.allocate();
        Channels.readFully(ch, h);
        FrameHeader.Decoded d = FrameHeader.decode(h, Limits.DEFAULT);
        ByteBuffer body = ByteBuffer.allocate(d.bodyLength()).order(ByteOrder.LITTLE_ENDIAN);
        Channels.readFully(ch, body);
        return new RawReply(d, new BodyReader(body.flip()));
    }

    private static RawReply exchange(SocketChannel ch, Opcode op, BodyWriter w) throws IOException {
        ByteBuffer b = w.buffer();
        Channels.writeFully(ch, FrameHeader.write(FrameHeader.allocate(), op.code, false, 0, 11, b.remaining(), 0), b);
        return readRaw(ch);
    }

    /**
     * AUTH_BEGIN on a raw connection: the server's nonce, once the server has answered (the
     * connection is then half way through authenticating).
     */
    private static byte[] challenge(SocketChannel ch, byte[] clientNonce) throws IOException {
        RawReply r = exchange(ch, Opcode.AUTH_BEGIN, new BodyWriter().bytes(clientNonce));
        assertThat(r.header.status()).isEqualTo(FrameStatus.OK.code);
        assertThat(r.body.u8("mode")).isEqualTo(Handshake.MODE_SECURED);
        return r.body.bytes("server nonce");
    }

    /** Proves the cluster secret on a raw connection, as {@link Handshake#authenticate} does. */
    private static SocketChannel authenticated(SocketChannel ch) throws IOException {
        byte[] cn = Handshake.nonce();
        byte[] sn = challenge(ch, cn);
        RawReply r = exchange(ch, Opcode.AUTH_PROVE, new BodyWriter().u8(Access.DATA.code)
                .bytes(Handshake.clientProof(SECRETS.key(Access.DATA), Access.DATA, sn, cn)));
        assertThat(r.header.status()).isEqualTo(FrameStatus.OK.code);
        return ch;
    }

    /** Live platform threads whose name begins with {@code prefix} (virtual threads are not listed). */
    private static long platformThreads(String prefix) {
        return Thread.getAllStackTraces().keySet().stream().filter(t -> t.getName().startsWith(prefix)).count();
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
    void onASecuredServerAConnectionThatStallsBeforeAuthenticatingIsClosedAtTheFrameTimeout() throws Exception {
        start(new Limits(4096, 1 << 20), Duration.ofMillis(300), 1 << 20, SECRETS);
        // every frame of it arrived whole and was answered, but it never proves anything
        SocketChannel halfway = rawFrom("127.0.0.1");
        challenge(halfway, Handshake.nonce());
        FrameConnection proven = FrameConnection.connect(address, CALL, Limits.DEFAULT, SECRETS);
        toClose.add(proven);
        assertClosedByServer(halfway);
        awaitConnections(1);
        assertThat(server.timedOutFrames()).isEqualTo(1);
        // an authenticated connection may stay idle past the frame timeout: it is a pooled one
        SocketChannel probe = rawFrom("127.0.0.1");
        assertClosedByServer(probe); // a frame timeout has certainly passed since it connected
        assertThat(proven.call(Opcode.PING, new BodyWriter().string("later"), CALL).body().string("text"))
                .isEqualTo("later");
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
        // a header announcing a body reserves all of it before a byte of it arrives...
        SocketChannel announced = rawFrom("127.0.0.9");
        announce(announced, Opcode.EXIST_KEY, medium, 0);
        while (server.bodyBytesBuffered() != medium) {
            Thread.sleep(5);
        }
        Channels.writeFully(announced, ByteBuffer.allocate(medium));
        assertThat(holding.tryAcquire(CALL.toSeconds(), TimeUnit.SECONDS)).as("the announced body's handler").isTrue();
        // ...so it and three more bodies held by their handler take the whole budget...
        for (int i = 1; i <= 3; i++) {
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

    /**
     * Issue 32's flood, small: eight authenticated connections send, all at once and slowly, bodies
     * of which the budget holds two. When bodies took the budget piecemeal as their bytes arrived,
     * each held a share, none could ever finish, and all eight were refused when their wait ran out
     * (the legitimate body got through only after that). Whole reservations, granted in order, let
     * them finish in turn, and a legitimate large body sent while they hold the budget completes
     * behind them. Taking turns needs about a second here; every wait allows 10 s (half the frame
     * timeout).
     */
    @Test
    void slowBodiesTakeTheBudgetInTurnsAndALargeBodySentDuringThemCompletes() throws Exception {
        int budget = 4 << 20;
        int body = 3 << 19; // 1.5 MiB: two fit in the budget at once
        start(new Limits(8 << 20, 1 << 20), Duration.ofSeconds(20), budget, SECRETS);
        int senders = 8;
        List<SocketChannel> slow = new ArrayList<>();
        for (int i = 0; i < senders; i++) {
            slow.add(authenticated(rawFrom("127.0.0." + (1 + i % 4))));
        }
        CountDownLatch go = new CountDownLatch(1);
        List<Future<RawReply>> outcomes = new ArrayList<>();
        try (ExecutorService senderThreads = Executors.newVirtualThreadPerTaskExecutor()) {
            for (SocketChannel ch : slow) {
                outcomes.add(senderThreads.submit(() -> {
                    go.await();
                    try {
                        Channels.writeFully(ch, FrameHeader.write(FrameHeader.allocate(), Opcode.BATCH_EXIST_KEY.code,
                                false, 0, 12, body, 0));
                        for (int sent = 0; sent < body; sent += 64 << 10) {
                            Channels.writeFully(ch, ByteBuffer.allocate(Math.min(64 << 10, body - sent)));
                            Thread.sleep(10);
                        }
                    } catch (IOException refusedMidway) {
                        // the server refused the body and closed; its reply says why
                    }
                    return readRaw(ch);
                }));
            }
            go.countDown();
            // the flood holds the budget (whole reservations or shares of it, depending on the server)
            while (server.bodyBytesBuffered() < 2L * body) {
                Thread.sleep(5);
            }
            try (FrameConnection legit = FrameConnection.connect(address, CALL, Limits.DEFAULT, SECRETS)) {
                BodyReader r = legit.call(Opcode.BATCH_EXIST_KEY, new BodyWriter(body).fixed(new byte[body]), CALL).body();
                assertThat(r.i32("bytes received")).isEqualTo(body);
            }
            int handled = 0;
            for (Future<RawReply> f : outcomes) {
                RawReply r = f.get();
                if (r.header.status() == FrameStatus.OK.code) {
                    assertThat(r.body.i32("bytes received")).isEqualTo(body);
                    handled++;
                } else {
                    assertThat(r.header.status()).isEqualTo(FrameStatus.FRAME_TOO_LARGE.code);
                    assertThat(r.body.string("text")).contains("body budget of 4 MiB (this test's)");
                }
            }
            System.out.printf("slow bodies: %d of %d handled, %d refused for the budget; budget peak %d of %d bytes%n",
                    handled, senders, server.refusedBodies(), server.budget().peak(), budget);
            // every slow body finished in its turn (taking turns needs about a second here; each waits 10 s)
            assertThat(handled).as("slow bodies handled").isEqualTo(senders);
            assertThat(server.refusedBodies()).isZero();
        }
        awaitBudgetGivenBack();
    }

    /**
     * A connection is served on a virtual thread until it has authenticated: half way through the
     * handshake, refused for sending a request without proof (and lingering while the server drains
     * it), refused for a wrong proof or over the per-host limit, none holds a platform thread. A
     * connection that authenticates gets one; it ends when the connection closes.
     */
    @Test
    void onlyAuthenticatedConnectionsHoldAPlatformThread() throws Exception {
        start("threads", new Limits(8 << 20, 1 << 20).withConnections(64, 16), CALL, 1 << 20, SECRETS);
        for (int i = 0; i < 16; i++) {
            challenge(rawFrom("127.0.0.4"), Handshake.nonce());
        }
        SocketChannel overLimit = rawFrom("127.0.0.4");
        assertThat(read(overLimit).message).contains("per host");
        List<SocketChannel> refused = new ArrayList<>();
        for (int i = 0; i < 8; i++) {
            // a request without proof, announcing 1 MiB of which 64 KiB come: refused from its header; the
            // rest is still owed, so the server lingers on the connection draining it
            SocketChannel ch = rawFrom("127.0.0.2");
            announce(ch, Opcode.PING, 1 << 20, 64 << 10);
            assertThat(read(ch).header.status()).isEqualTo(FrameStatus.UNAUTHORIZED.code);
            refused.add(ch);
        }
        for (int i = 0; i < 8; i++) {
            SocketChannel ch = rawFrom("127.0.0.3");
            byte[] cn = Handshake.nonce();
            byte[] sn = challenge(ch, cn);
            RawReply r = exchange(ch, Opcode.AUTH_PROVE, new BodyWriter().u8(Access.DATA.code)
                    .bytes(Handshake.clientProof(new byte[32], Access.DATA, sn, cn)));
            assertThat(r.header.status()).isEqualTo(FrameStatus.UNAUTHORIZED.code);
            refused.add(ch);
        }
        assertThat(platformThreads("threads-conn")).as("platform threads of unauthenticated or refused connections")
                .isZero();
        for (SocketChannel ch : refused) {
            assertClosedByServer(ch);
        }
        List<FrameConnection> proven = new ArrayList<>();
        for (int i = 0; i < 3; i++) {
            FrameConnection c = FrameConnection.connect(address, CALL, Limits.DEFAULT, SECRETS);
            toClose.add(c);
            proven.add(c);
            assertThat(c.call(Opcode.PING, new BodyWriter().string("proven"), CALL).body().string("text"))
                    .isEqualTo("proven");
        }
        while (platformThreads("threads-conn") != 3) {
            Thread.sleep(5);
        }
        for (FrameConnection c : proven) {
            c.close();
        }
        while (platformThreads("threads-conn") != 0) {
            Thread.sleep(5);
        }
        assertThat(server.refusedConnections()).isEqualTo(1);
        assertThat(server.refusedAuth()).isEqualTo(16);
    }
}
