package io.kvpool.it;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.client.PutStatus;
import io.kvpool.config.HostPort;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.FrameHeader;
import io.kvpool.protocol.FrameStatus;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.RemoteException;
import io.kvpool.protocol.Secrets;
import io.kvpool.protocol.msg.MasterMessages;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * Issue 32, item 4, against a master in its own JVM with {@code -Xmx256m} (a body budget of 64 MiB)
 * holding the secrets: authenticated clients sending 40 MiB bodies slowly (through a relay that
 * passes 1 MiB every 20 ms) take the budget in turns and every one of them is handled, and a
 * legitimate client's batch of 16,384 long keys (an 8 MiB body) sent while they hold it completes.
 * When bodies took the budget piecemeal, the slow ones each held a share and none was handled.
 * Connections that have not authenticated, hundreds of them, hold no platform thread of the master.
 * No outcome depends on timing: the slow bodies need a few seconds in all, each may wait 15 s.
 */
@Timeout(300)
class BudgetFloodIT {

    private static final String DATA = "cluster-secret-of-the-budget-flood-it";
    private static final String ADMIN = "admin-secret-of-the-budget-flood-it";
    private static final Secrets SECRETS = Secrets.of(DATA, ADMIN);
    private static final Duration CALL = Duration.ofSeconds(120);
    /** Slow senders: four 40 MiB bodies fill the 64 MiB budget in 16 MiB shares, with none complete. */
    private static final int SLOW_SENDERS = 4;
    private static final int SLOW_BODY_KEYS = 81_920; // 512 bytes each with its length: 40 MiB and a count

    @TempDir
    static Path dir;
    private static ProcessCluster cluster;
    private static KvPoolClient client;

    @BeforeAll
    static void start() throws Exception {
        Path data = Files.writeString(dir.resolve("cluster.secret"), DATA);
        Path admin = Files.writeString(dir.resolve("admin.secret"), ADMIN);
        List<String> flags = List.of("--secret-file", data.toString(), "--admin-secret-file", admin.toString());
        cluster = new ProcessCluster("BudgetFloodIT", flags.toArray(new String[0]));
        cluster.startNode("64MiB", "none", 0, flags);
        client = KvPoolClient.connect(ClientConfig.forMaster(cluster.masterAddress()).withSecrets(SECRETS)
                .withSharedMemory(false));
        ProcessCluster.awaitStats(client, s -> s.segments().stream().anyMatch(PoolStats.SegmentStats::active),
                "the node registered");
        assertThat(cluster.metric("master_body_budget_bytes")).isEqualTo(64 << 20);
    }

    @AfterAll
    static void stop() {
        if (client != null) {
            client.close();
        }
        if (cluster != null) {
            cluster.close();
        }
    }

    /** A key of 510 bytes (the most is 512): {@code prefix} and {@code i}, padded. */
    private static String longKey(String prefix, int i) {
        String head = prefix + i + "/";
        return head + "k".repeat(510 - head.length());
    }

    @Test
    void slowLargeBodiesTakeTheBudgetInTurnsAndALegitimateLargeBatchCompletes() throws Exception {
        List<String> keys = new ArrayList<>();
        for (int i = 0; i < 16_384; i++) {
            keys.add(longKey("legit/", i));
        }
        for (int i = 0; i < 64; i++) {
            assertThat(client.put(keys.get(i * 256), Payloads.make(keys.get(i * 256), i, 4096))).isEqualTo(PutStatus.OK);
        }
        BodyWriter slowBody = new BodyWriter(SLOW_BODY_KEYS * 512 + 16).i32(SLOW_BODY_KEYS);
        for (int i = 0; i < SLOW_BODY_KEYS; i++) {
            slowBody.bytes(longKey("slow/", i).getBytes(StandardCharsets.UTF_8));
        }
        assertThat(slowBody.length()).isGreaterThanOrEqualTo(40 << 20);
        double refusedBefore = cluster.metric("master_large_bodies_refused_total");
        try (SlowLink link = new SlowLink(cluster.masterPort, 1 << 20, Duration.ofMillis(20));
             ExecutorService senders = Executors.newVirtualThreadPerTaskExecutor()) {
            HostPort through = new HostPort("127.0.0.1", link.port());
            List<FrameConnection> slow = new ArrayList<>();
            for (int i = 0; i < SLOW_SENDERS; i++) {
                slow.add(FrameConnection.connect(through, CALL, Limits.DEFAULT, SECRETS));
            }
            CountDownLatch go = new CountDownLatch(1);
            List<Future<String>> outcomes = new ArrayList<>();
            for (FrameConnection c : slow) {
                outcomes.add(senders.submit(() -> {
                    go.await();
                    long t0 = System.nanoTime();
                    try (c) {
                        int answers = MasterMessages.Flags.read(c.call(Opcode.BATCH_EXIST_KEY, slowBody, CALL).body())
                                .values().length;
                        assertThat(answers).isEqualTo(SLOW_BODY_KEYS);
                        return "handled after " + (System.nanoTime() - t0) / 1_000_000 + " ms";
                    } catch (RemoteException e) {
                        return "refused after " + (System.nanoTime() - t0) / 1_000_000 + " ms: " + e.getMessage();
                    } catch (IOException e) {
                        // the master refused the body and closed before the relay had passed all of it
                        return "failed after " + (System.nanoTime() - t0) / 1_000_000 + " ms: " + e;
                    }
                }));
            }
            go.countDown();
            // the slow bodies hold the budget: a whole reservation, or shares of it
            Await.untilChecked("the slow bodies hold 40 MiB of the budget", Await.DEFAULT,
                    () -> cluster.metric("master_body_bytes_buffered") >= 40 << 20);
            long t0 = System.nanoTime();
            int removed = client.removeBatch(keys);
            long legitMillis = (System.nanoTime() - t0) / 1_000_000;
            assertThat(removed).as("objects the legitimate batch removed").isEqualTo(64);
            List<String> results = new ArrayList<>();
            for (Future<String> f : outcomes) {
                results.add(f.get());
            }
            long handled = results.stream().filter(r -> r.startsWith("handled")).count();
            double refused = cluster.metric("master_large_bodies_refused_total") - refusedBefore;
            System.out.printf("BudgetFloodIT: the legitimate batch of 16,384 keys completed in %,d ms under %d slow"
                            + " 40 MiB bodies; slow bodies: %s; %.0f refused for the budget%n", legitMillis, SLOW_SENDERS,
                    results, refused);
            assertThat(results).as("every slow body is handled in its turn").allMatch(r -> r.startsWith("handled"));
            assertThat(handled).isEqualTo(SLOW_SENDERS);
            assertThat(refused).isZero();
        }
        assertThat(client.get(keys.getFirst())).isEmpty();
        Await.untilChecked("the budget is given back", Await.DEFAULT,
                () -> cluster.metric("master_body_bytes_buffered") == 0);
    }

    @Test
    void connectionsThatHaveNotAuthenticatedHoldNoPlatformThread() throws Exception {
        double before = cluster.metric("jvm_threads_current");
        long osBefore = osThreads(cluster.masterPid());
        List<SocketChannel> held = new ArrayList<>();
        try {
            // half way through the handshake: AUTH_BEGIN answered, AUTH_PROVE never sent
            for (int i = 0; i < 300; i++) {
                SocketChannel ch = from("127.0.0.5", cluster.masterPort);
                held.add(ch);
                ByteBuffer nonce = new BodyWriter().bytes(new byte[32]).buffer();
                writeFully(ch, FrameHeader.write(FrameHeader.allocate(), Opcode.AUTH_BEGIN.code, false, 0, 1,
                        nonce.remaining(), 0), nonce);
                assertThat(readReply(ch)).isEqualTo(FrameStatus.OK.code);
            }
            // refused for a request without proof, its announced 1 MiB body still owed: the master lingers
            for (int i = 0; i < 100; i++) {
                SocketChannel ch = from("127.0.0.6", cluster.masterPort);
                held.add(ch);
                writeFully(ch, FrameHeader.write(FrameHeader.allocate(), Opcode.BATCH_EXIST_KEY.code, false, 0, 2, 1 << 20,
                        0), ByteBuffer.allocate(64 << 10));
                assertThat(readReply(ch)).isEqualTo(FrameStatus.UNAUTHORIZED.code);
            }
            double during = cluster.metric("jvm_threads_current");
            long osDuring = osThreads(cluster.masterPid());
            // a client with the secret is served meanwhile
            byte[] v = Payloads.make("threads/served", 1, 4096);
            assertThat(client.put("threads/served", v)).isEqualTo(PutStatus.OK);
            assertThat(client.get("threads/served")).hasValueSatisfying(b -> assertThat(b).isEqualTo(v));
            System.out.printf("BudgetFloodIT: master platform threads %.0f before, %.0f with 300 connections half way"
                            + " through authenticating and 100 refused (OS threads %d, %d)%n", before, during, osBefore,
                    osDuring);
            assertThat(during - before).as("platform threads the 400 unauthenticated connections added")
                    .isLessThan(50);
        } finally {
            for (SocketChannel ch : held) {
                ch.close();
            }
        }
    }

    private static long osThreads(long pid) throws IOException {
        for (String line : Files.readAllLines(Path.of("/proc", "" + pid, "status"))) {
            if (line.startsWith("Threads:")) {
                return Long.parseLong(line.replaceAll("\\D", ""));
            }
        }
        throw new IOException("no thread count for " + pid);
    }

    private static SocketChannel from(String local, int port) throws IOException {
        SocketChannel ch = SocketChannel.open();
        ch.bind(new InetSocketAddress(local, 0));
        ch.connect(new InetSocketAddress("127.0.0.1", port));
        return ch;
    }

    private static void writeFully(SocketChannel ch, ByteBuffer... bufs) throws IOException {
        for (ByteBuffer b : bufs) {
            while (b.hasRemaining()) {
                ch.write(b);
            }
        }
    }

    /** Reads one reply frame whole: its status. */
    private static int readReply(SocketChannel ch) throws IOException {
        ByteBuffer h = ByteBuffer.allocate(FrameHeader.LENGTH).order(ByteOrder.LITTLE_ENDIAN);
        readFully(ch, h);
        FrameHeader.Decoded d = FrameHeader.decode(h, Limits.DEFAULT);
        readFully(ch, ByteBuffer.allocate(d.bodyLength()));
        return d.status();
    }

    private static void readFully(SocketChannel ch, ByteBuffer b) throws IOException {
        while (b.hasRemaining()) {
            if (ch.read(b) < 0) {
                throw new IOException("closed after " + b.position() + " of " + b.limit() + " bytes");
            }
        }
    }

    /**
     * A TCP relay to a local port that passes what its clients send at most {@code chunk} bytes per
     * {@code pause} (a slow network), and the answers at full speed.
     */
    private static final class SlowLink implements AutoCloseable {
        private final ServerSocketChannel server;
        private final List<SocketChannel> sockets = Collections.synchronizedList(new ArrayList<>());

        SlowLink(int targetPort, int chunk, Duration pause) throws IOException {
            server = ServerSocketChannel.open().bind(new InetSocketAddress("127.0.0.1", 0));
            Thread.ofVirtual().name("slow-link").start(() -> {
                try {
                    while (true) {
                        SocketChannel in = server.accept();
                        SocketChannel out = from("127.0.0.7", targetPort);
                        sockets.add(in);
                        sockets.add(out);
                        Thread.ofVirtual().start(() -> pump(in, out, chunk, pause));
                        Thread.ofVirtual().start(() -> pump(out, in, 64 << 10, Duration.ZERO));
                    }
                } catch (IOException closed) {
                    // the link was closed
                }
            });
        }

        int port() throws IOException {
            return ((InetSocketAddress) server.getLocalAddress()).getPort();
        }

        private static void pump(SocketChannel from, SocketChannel to, int chunk, Duration pause) {
            ByteBuffer b = ByteBuffer.allocate(chunk);
            try {
                while (from.read(b) >= 0) {
                    b.flip();
                    writeFully(to, b);
                    b.clear();
                    if (pause.isPositive()) {
                        Thread.sleep(pause);
                    }
                }
                to.shutdownOutput();
            } catch (IOException | InterruptedException e) {
                try {
                    from.close();
                    to.close();
                } catch (IOException ignored) {
                    // closing both ends anyway
                }
            }
        }

        @Override
        public void close() throws IOException {
            server.close();
            synchronized (sockets) {
                for (SocketChannel s : sockets) {
                    s.close();
                }
            }
        }
    }
}
