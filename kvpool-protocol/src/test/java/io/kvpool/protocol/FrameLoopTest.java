package io.kvpool.protocol;

import io.kvpool.config.HostPort;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Nested;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The {@link FrameLoop}: every {@link FrameServerTest} case again with PING, HELLO, GET_REPLICA_LIST and
 * NODE_BEACON (a handler that may answer nothing) served in the loop (so well-formed traffic, refusals and handler errors all cross between the loop and
 * the connections' threads), and what only the loop does: many connections on one thread, a reply the
 * socket does not take at once, a frame that stops half way. No assertion depends on timing; the
 * timeouts only guard against hangs.
 */
class FrameLoopTest extends FrameServerTest {

    @Override
    void configure(FrameServer s) throws IOException {
        s.serveInLoop(op -> op == Opcode.PING || op == Opcode.HELLO || op == Opcode.GET_REPLICA_LIST
                || op == Opcode.NODE_BEACON);
    }

    /** A server of its own: PING echoes, EXIST_KEY answers with as many bytes as its body asks, PUT_START is not quick. */
    @Nested
    @Timeout(60)
    class OnlyTheLoop {

        private static final Duration CALL = Duration.ofSeconds(20);
        private final List<AutoCloseable> open = new ArrayList<>();
        /** The threads each opcode was handled on. */
        private final ConcurrentHashMap<Opcode, java.util.Set<String>> threads = new ConcurrentHashMap<>();
        private FrameServer server;
        private HostPort address;

        private void handle(Request req) throws IOException {
            threads.computeIfAbsent(req.opcode(), o -> ConcurrentHashMap.newKeySet()).add(Thread.currentThread().getName());
            switch (req.opcode()) {
                case PING -> {
                    String text = req.body().string("text");
                    req.reply(new BodyWriter().string(text));
                }
                case EXIST_KEY -> {
                    int n = req.body().i32("n");
                    if (n == -1) {
                        throw new BadRequestException("n must not be negative");
                    }
                    if (n == -2) {
                        throw new IllegalStateException("handler bug");
                    }
                    byte[] big = new byte[n];
                    Arrays.fill(big, (byte) 7);
                    req.reply(new BodyWriter(n + 8).fixed(big));
                }
                case PUT_START -> req.reply(new BodyWriter().string("slow path"));
                default -> throw new AssertionError("unexpected " + req.opcode());
            }
        }

        @BeforeEach
        void start() throws IOException {
            start(Duration.ofSeconds(30));
        }

        private void start(Duration frameTimeout) throws IOException {
            server = new FrameServer("loop-test", new InetSocketAddress(InetAddress.getLoopbackAddress(), 0),
                    Limits.DEFAULT, frameTimeout, op -> true, this::handle);
            server.serveInLoop(op -> op == Opcode.PING || op == Opcode.EXIST_KEY);
            address = new HostPort(InetAddress.getLoopbackAddress().getHostAddress(), server.port());
        }

        @AfterEach
        void stop() throws Exception {
            for (AutoCloseable c : open) {
                c.close();
            }
            server.close();
        }

        private FrameConnection connect() throws IOException {
            FrameConnection c = FrameConnection.connect(address, CALL, Limits.DEFAULT);
            open.add(c);
            return c;
        }

        private String echo(FrameConnection c, String text) throws IOException {
            return c.call(Opcode.PING, new BodyWriter().string(text), CALL).body().string("text");
        }

        @Test
        void manyConnectionsAreAnsweredByTheLoopThreadAndSlowOpcodesOnTheirOwn() throws Exception {
            List<FrameConnection> conns = new ArrayList<>();
            for (int i = 0; i < 40; i++) {
                conns.add(connect());
            }
            List<Thread> clients = new ArrayList<>();
            AtomicReference<Throwable> failed = new AtomicReference<>();
            AtomicInteger answered = new AtomicInteger();
            for (int i = 0; i < conns.size(); i++) {
                FrameConnection c = conns.get(i);
                int id = i;
                clients.add(Thread.ofPlatform().start(() -> {
                    try {
                        for (int r = 0; r < 200; r++) {
                            String text = id + "/" + r;
                            if (!echo(c, text).equals(text)) {
                                throw new AssertionError("wrong echo on connection " + id);
                            }
                            answered.incrementAndGet();
                            if (r % 50 == 49) {
                                // a frame the loop does not serve: the connection's thread answers it, then the loop again
                                assertThat(c.call(Opcode.PUT_START, new BodyWriter(), CALL).body().string("text"))
                                        .isEqualTo("slow path");
                            }
                        }
                    } catch (Throwable t) {
                        failed.compareAndSet(null, t);
                    }
                }));
            }
            for (Thread t : clients) {
                t.join();
            }
            assertThat(failed.get()).isNull();
            assertThat(answered.get()).isEqualTo(40 * 200);
            // the first PING of each connection is answered on the thread that greeted it; then the loop serves it
            assertThat(threads.get(Opcode.PING)).contains("loop-test-loop");
            assertThat(threads.get(Opcode.PUT_START)).doesNotContain("loop-test-loop");
            for (FrameConnection c : conns) {
                c.close();
            }
            waitFor(() -> server.connectionCount() == 0); // every connection ended
        }

        @Test
        void aReplyTheSocketCannotTakeAtOnceHoldsUpNoOtherConnection() throws Exception {
            FrameConnection other = connect();
            assertThat(echo(other, "warm")).isEqualTo("warm");
            // a raw peer: one PING (to move to the loop), then asks for a 16 MiB reply and does not read it yet
            SocketChannel ch = SocketChannel.open(address.toSocketAddress());
            open.add(ch);
            send(ch, Opcode.PING.code, 1, new BodyWriter().string("in"));
            readReply(ch);
            int big = 16 << 20;
            send(ch, Opcode.EXIST_KEY.code, 2, new BodyWriter().i32(big));
            waitFor(() -> threads.getOrDefault(Opcode.EXIST_KEY, java.util.Set.of()).size() == 1); // the big request handled
            for (int i = 0; i < 100; i++) {
                assertThat(echo(other, "meanwhile " + i)).isEqualTo("meanwhile " + i);
            }
            ByteBuffer body = readReply(ch);
            assertThat(body.remaining()).isGreaterThanOrEqualTo(big);
            // and the same connection goes on
            send(ch, Opcode.PING.code, 3, new BodyWriter().string("after"));
            ByteBuffer r = readReply(ch);
            assertThat(new BodyReader(r).string("text")).isEqualTo("after");
        }

        @Test
        void pipelinedFramesCrossBetweenTheLoopAndTheThreadInOrder() throws Exception {
            SocketChannel ch = SocketChannel.open(address.toSocketAddress());
            open.add(ch);
            send(ch, Opcode.PING.code, 1, new BodyWriter().string("in"));
            readReply(ch);
            // six frames in one write: the loop reads several at once, hands the PUT_START to a thread with the
            // bytes after its header, the thread answers it and the next PING from those bytes, and the loop gets
            // the rest back
            List<ByteBuffer> frames = new ArrayList<>();
            frames.addAll(frame(Opcode.PING.code, 2, new BodyWriter().string("two")));
            frames.addAll(frame(Opcode.PING.code, 3, new BodyWriter().string("three")));
            frames.addAll(frame(Opcode.PUT_START.code, 4, new BodyWriter().string("four")));
            frames.addAll(frame(Opcode.PING.code, 5, new BodyWriter().string("five")));
            frames.addAll(frame(Opcode.EXIST_KEY.code, 6, new BodyWriter().i32(10)));
            frames.addAll(frame(Opcode.PING.code, 7, new BodyWriter().string("seven")));
            Channels.writeFully(ch, frames.toArray(new ByteBuffer[0]));
            String[] want = {"two", "three", "slow path", "five", null, "seven"};
            for (int i = 0; i < want.length; i++) {
                ByteBuffer h = FrameHeader.allocate();
                Channels.readFully(ch, h);
                FrameHeader.Decoded d = FrameHeader.decode(h, Limits.DEFAULT);
                ByteBuffer body = ByteBuffer.allocate(d.bodyLength()).order(java.nio.ByteOrder.LITTLE_ENDIAN);
                Channels.readFully(ch, body);
                body.flip();
                assertThat(d.requestId()).isEqualTo(i + 2);
                assertThat(d.status()).isEqualTo(FrameStatus.OK.code);
                if (want[i] == null) {
                    assertThat(body.remaining()).isEqualTo(10);
                } else {
                    assertThat(new BodyReader(body).string("text")).isEqualTo(want[i]);
                }
            }
            assertThat(threads.get(Opcode.PUT_START)).doesNotContain("loop-test-loop");
            assertThat(threads.get(Opcode.EXIST_KEY)).containsExactly("loop-test-loop");
            send(ch, Opcode.PING.code, 8, new BodyWriter().string("eight"));
            assertThat(new BodyReader(readReply(ch)).string("text")).isEqualTo("eight");
        }

        private static List<ByteBuffer> frame(int opcode, long id, BodyWriter body) {
            ByteBuffer b = body.buffer();
            return List.of(FrameHeader.write(FrameHeader.allocate(), opcode, false, 0, id, b.remaining(), 0), b);
        }

        @Test
        void handlerErrorsInTheLoopAreAnsweredAndTheConnectionGoesOn() throws Exception {
            SocketChannel ch = SocketChannel.open(address.toSocketAddress());
            open.add(ch);
            send(ch, Opcode.PING.code, 1, new BodyWriter().string("in"));
            readReply(ch);
            send(ch, Opcode.EXIST_KEY.code, 2, new BodyWriter().i32(-1));
            assertThat(readStatus(ch)).isEqualTo(FrameStatus.BAD_REQUEST.code);
            send(ch, Opcode.EXIST_KEY.code, 3, new BodyWriter().i32(-2));
            assertThat(readStatus(ch)).isEqualTo(FrameStatus.INTERNAL_ERROR.code);
            send(ch, Opcode.PING.code, 4, new BodyWriter().string("still here"));
            assertThat(new BodyReader(readReply(ch)).string("text")).isEqualTo("still here");
            assertThat(threads.get(Opcode.EXIST_KEY)).containsExactly("loop-test-loop");
        }

        @Test
        void aFrameThatStopsHalfWayInTheLoopIsClosedAtTheFrameTimeout() throws Exception {
            server.close();
            start(Duration.ofSeconds(1));
            SocketChannel ch = SocketChannel.open(address.toSocketAddress());
            open.add(ch);
            send(ch, Opcode.PING.code, 1, new BodyWriter().string("in"));
            readReply(ch);
            long before = server.timedOutFrames();
            ByteBuffer half = FrameHeader.write(FrameHeader.allocate(), Opcode.PING.code, false, 0, 2, 40, 0);
            half.limit(20);
            ch.write(half);
            // the server closes it once the frame timeout passes: our read then ends
            ByteBuffer sink = ByteBuffer.allocate(64);
            int n;
            do {
                sink.clear();
                n = ch.read(sink);
            } while (n >= 0);
            waitFor(() -> server.timedOutFrames() == before + 1); // the timed-out frame counted
            waitFor(() -> server.connectionCount() == 0); // the connection counted out
        }

        private static void send(SocketChannel ch, int opcode, long id, BodyWriter body) throws IOException {
            ByteBuffer b = body.buffer();
            ByteBuffer h = FrameHeader.write(FrameHeader.allocate(), opcode, false, 0, id, b.remaining(), 0);
            Channels.writeFully(ch, h, b);
        }

        /** One reply's body (status OK expected). */
        private static ByteBuffer readReply(SocketChannel ch) throws IOException {
            ByteBuffer h = FrameHeader.allocate();
            Channels.readFully(ch, h);
            FrameHeader.Decoded d = FrameHeader.decode(h, Limits.DEFAULT);
            ByteBuffer body = ByteBuffer.allocate(d.bodyLength()).order(java.nio.ByteOrder.LITTLE_ENDIAN);
            Channels.readFully(ch, body);
            assertThat(d.status()).as(new String(body.array(), StandardCharsets.UTF_8)).isEqualTo(FrameStatus.OK.code);
            return body.flip();
        }

        /** One reply's status (its body read and dropped). */
        private static int readStatus(SocketChannel ch) throws IOException {
            ByteBuffer h = FrameHeader.allocate();
            Channels.readFully(ch, h);
            FrameHeader.Decoded d = FrameHeader.decode(h, Limits.DEFAULT);
            Channels.readFully(ch, ByteBuffer.allocate(d.bodyLength()));
            return d.status();
        }

        private static void waitFor(java.util.function.BooleanSupplier what) throws InterruptedException {
            while (!what.getAsBoolean()) {
                Thread.sleep(5); // bounded by the class timeout: a hang fails, a slow machine does not
            }
        }
    }
}
