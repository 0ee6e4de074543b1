import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.net.InetSocketAddress;
import java.net.StandardSocketOptions;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.concurrent.atomic.AtomicLong;

/**
 * What it costs a loopback receiver to put each value in new memory, with nothing of kvpool in it. Two client
 * threads send 1 MiB messages, each to a server thread of its own that reads the message whole and answers 8
 * bytes. The server reads either into one reused buffer, as the bench's raw TCP baseline does, or into the
 * next 1 MiB slot of a 4 GiB shared-memory file mapped and touched up front, as a node's segment is. Prints
 * GB/s for each, alternating, three rounds of 3 s after a second of warm-up.
 *
 * Run from the repository root: java scripts/RecvFloor.java   (JDK 25; about 30 s; 4 GiB of /dev/shm, removed after)
 * Used for docs/benchmarks.md, "Page tables once per process, saves measured warm".
 */
public final class RecvFloor {

    private static final int VALUE = 1 << 20;
    private static final long REGION = 4L << 30;
    private static final int SECONDS = 3;

    public static void main(String[] args) throws Exception {
        Path file = Files.createTempFile(Path.of("/dev/shm"), "recvfloor-", ".seg");
        try (Arena arena = Arena.ofShared()) {
            MemorySegment region;
            try (FileChannel fc = FileChannel.open(file, StandardOpenOption.READ, StandardOpenOption.WRITE)) {
                fc.write(ByteBuffer.allocate(1), REGION - 1);
                region = fc.map(FileChannel.MapMode.READ_WRITE, 0, REGION, arena);
            }
            region.fill((byte) 1); // committed and mapped, like a node's prefaulted segment
            for (int round = 0; round < 3; round++) {
                for (boolean fresh : new boolean[]{false, true}) {
                    System.out.printf("%-36s %6.2f GB/s%n", fresh ? "into the next slot of a mapped file"
                            : "into one reused buffer", run(fresh, region));
                }
            }
        } finally {
            Files.deleteIfExists(file);
        }
    }

    private static double run(boolean fresh, MemorySegment region) throws Exception {
        AtomicLong next = new AtomicLong();
        AtomicLong counted = new AtomicLong();
        try (ServerSocketChannel server = ServerSocketChannel.open().bind(new InetSocketAddress("127.0.0.1", 0))) {
            Thread[] servers = new Thread[2];
            for (int t = 0; t < 2; t++) {
                servers[t] = Thread.ofPlatform().start(() -> serve(server, fresh, region, next));
            }
            long measureFrom = System.nanoTime() + 1_000_000_000L;
            long end = measureFrom + SECONDS * 1_000_000_000L;
            Thread[] clients = new Thread[2];
            for (int t = 0; t < 2; t++) {
                clients[t] = Thread.ofPlatform().start(() -> send(server, measureFrom, end, counted));
            }
            for (Thread t : clients) {
                t.join();
            }
            for (Thread t : servers) {
                t.join();
            }
        }
        return counted.get() * (double) VALUE / SECONDS / 1e9;
    }

    private static void serve(ServerSocketChannel server, boolean fresh, MemorySegment region, AtomicLong next) {
        try (SocketChannel c = server.accept()) {
            c.setOption(StandardSocketOptions.TCP_NODELAY, true);
            ByteBuffer reused = ByteBuffer.allocateDirect(VALUE);
            ByteBuffer ack = ByteBuffer.allocateDirect(8);
            long slots = REGION / VALUE;
            while (true) {
                ByteBuffer dst = fresh ? region.asSlice(next.getAndIncrement() % slots * VALUE, VALUE).asByteBuffer()
                        : reused.clear();
                while (dst.hasRemaining()) {
                    if (c.read(dst) < 0) {
                        return; // the client is done
                    }
                }
                ack.clear();
                while (ack.hasRemaining()) {
                    c.write(ack);
                }
            }
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
    }

    private static void send(ServerSocketChannel server, long measureFrom, long end, AtomicLong counted) {
        try (SocketChannel c = SocketChannel.open(server.getLocalAddress())) {
            c.setOption(StandardSocketOptions.TCP_NODELAY, true);
            ByteBuffer src = ByteBuffer.allocateDirect(VALUE);
            ByteBuffer ack = ByteBuffer.allocateDirect(8);
            long now;
            while ((now = System.nanoTime()) < end) {
                src.clear();
                while (src.hasRemaining()) {
                    c.write(src);
                }
                ack.clear();
                while (ack.hasRemaining()) {
                    c.read(ack);
                }
                if (now >= measureFrom) {
                    counted.incrementAndGet();
                }
            }
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
    }
}
