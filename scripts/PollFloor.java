import java.io.EOFException;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.util.Arrays;

/**
 * What a blocked read costs on this machine, with nothing of kvpool in it: a 64-byte loopback ping-pong between
 * two threads, 20,000 round trips a row, with each end either blocking in its read or polling its socket (non-
 * blocking reads, {@link Thread#yield} between tries, for up to 50 us, then blocking), p50 and p90. Run it pinned
 * (taskset -c 0) to see the same-CPU case.
 *
 * Run from the repository root: java scripts/PollFloor.java   (JDK 25; about 10 s)
 * Used for docs/benchmarks.md, "Polling before blocking", and the design note of BusyPoll.
 */
public final class PollFloor {

    private static final long POLL_NANOS = 50_000;

    private static void read(SocketChannel ch, ByteBuffer b, boolean poll) throws IOException {
        if (poll) {
            ch.configureBlocking(false);
            try {
                long end = System.nanoTime() + POLL_NANOS;
                while (b.hasRemaining() && System.nanoTime() < end) {
                    if (ch.read(b) < 0) {
                        throw new EOFException();
                    }
                    if (b.hasRemaining()) {
                        Thread.yield();
                    }
                }
            } finally {
                ch.configureBlocking(true);
            }
        }
        while (b.hasRemaining()) {
            if (ch.read(b) < 0) {
                throw new EOFException();
            }
        }
    }

    private static String row(boolean serverPolls, boolean clientPolls) throws Exception {
        try (ServerSocketChannel ss = ServerSocketChannel.open().bind(new InetSocketAddress("127.0.0.1", 0))) {
            Thread server = Thread.ofPlatform().daemon().start(() -> {
                try (SocketChannel c = ss.accept()) {
                    c.socket().setTcpNoDelay(true);
                    ByteBuffer b = ByteBuffer.allocateDirect(64);
                    while (true) {
                        b.clear();
                        read(c, b, serverPolls);
                        b.flip();
                        while (b.hasRemaining()) {
                            c.write(b);
                        }
                    }
                } catch (IOException e) {
                    // the client closed: done
                }
            });
            long[] t = new long[20_000];
            try (SocketChannel c = SocketChannel.open(ss.getLocalAddress())) {
                c.socket().setTcpNoDelay(true);
                ByteBuffer b = ByteBuffer.allocateDirect(64);
                for (int round = 0; round < 2; round++) { // the first round warms up
                    for (int i = 0; i < t.length; i++) {
                        long s = System.nanoTime();
                        b.clear();
                        while (b.hasRemaining()) {
                            c.write(b);
                        }
                        b.clear();
                        read(c, b, clientPolls);
                        t[i] = System.nanoTime() - s;
                    }
                }
            }
            server.join();
            Arrays.sort(t);
            return String.format("server %-6s client %-6s  p50 %6.1f us  p90 %6.1f us", serverPolls ? "polls" : "blocks",
                    clientPolls ? "polls" : "blocks", t[t.length / 2] / 1e3, t[t.length * 9 / 10] / 1e3);
        }
    }

    public static void main(String[] args) throws Exception {
        for (boolean server : new boolean[]{false, true}) {
            for (boolean client : new boolean[]{false, true}) {
                System.out.println(row(server, client));
            }
        }
    }
}
