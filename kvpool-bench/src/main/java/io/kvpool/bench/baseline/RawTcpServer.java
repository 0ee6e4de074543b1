package io.kvpool.bench.baseline;

import java.io.EOFException;
import java.io.IOException;
import java.io.PrintStream;
import java.lang.foreign.Arena;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.StandardSocketOptions;
import java.nio.ByteBuffer;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;

/**
 * The server half of the raw loopback TCP baseline: the least work a request/response data path
 * between two JVMs can do while still behaving like a store. A put's bytes are read into a 1 GiB
 * region of committed off-heap memory, each request at the next offset (so, as in a real store,
 * they land in memory that is not in the cache), and acknowledged with one byte; a get is answered
 * with {@code length} bytes from the next offset of the same region. Nothing is indexed or kept.
 *
 * <p>Protocol (big-endian): a 16-byte request header {@code int op, int reserved (0), long length},
 * with {@code op} {@value #OP_PUT} = put (the client then sends {@code length} bytes; the server
 * replies one byte, {@value #ACK}) or {@value #OP_GET} = get (the server replies {@code length}
 * bytes). A malformed header gets the one-byte reply {@value #NACK} and the connection is closed.
 *
 * <p>Run as {@code java -cp ... io.kvpool.bench.baseline.RawTcpServer [port]} (port 0 or none: any
 * free port). It listens on 127.0.0.1, prints the port it got as its first line on stdout, serves
 * each connection on its own thread, and exits when its stdin reaches end of file (so it dies with
 * the benchmark that started it).
 */
public final class RawTcpServer {

    static final int HEADER_BYTES = 16;
    static final int OP_PUT = 1;
    static final int OP_GET = 2;
    static final byte ACK = 1;
    static final byte NACK = 0;
    /** Largest value one request may carry. */
    static final long MAX_LENGTH = 1L << 30;

    /** Where values land and come from: big enough that consecutive requests do not hit the cache. */
    private static final long REGION_BYTES = 1L << 30;
    private static java.lang.foreign.MemorySegment region;
    /** Next offset, shared by all connections, so concurrent clients never read or write the same (cached) bytes. */
    private static final java.util.concurrent.atomic.AtomicLong NEXT = new java.util.concurrent.atomic.AtomicLong();

    private RawTcpServer() {
    }

    public static void main(String[] args) throws IOException {
        int port = args.length > 0 ? Integer.parseInt(args[0]) : 0;
        region = Arena.global().allocate(REGION_BYTES, 4096);
        region.fill((byte) 1); // commit every page now, not during the measurement
        ServerSocketChannel server = ServerSocketChannel.open();
        server.bind(new InetSocketAddress(InetAddress.getLoopbackAddress(), port), 64);
        PrintStream out = System.out;
        out.println(((InetSocketAddress) server.getLocalAddress()).getPort());
        out.flush();

        Thread.ofPlatform().daemon().name("raw-tcp-stdin-watch").start(() -> {
            try {
                while (System.in.read() >= 0) {
                    // ignore input; end of file means our parent has gone
                }
            } catch (IOException ignored) {
                // same as end of file
            }
            System.exit(0);
        });

        int n = 0;
        while (true) {
            SocketChannel ch = server.accept();
            Thread.ofPlatform().daemon().name("raw-tcp-conn-" + n++).start(() -> serve(ch));
        }
    }

    private static void serve(SocketChannel ch) {
        try (ch; Arena conn = Arena.ofConfined()) {
            ch.setOption(StandardSocketOptions.TCP_NODELAY, true);
            ByteBuffer header = conn.allocate(HEADER_BYTES, 64).asByteBuffer();
            ByteBuffer reply = conn.allocate(1, 64).asByteBuffer();
            while (true) {
                header.clear();
                if (!readFully(ch, header, true)) {
                    return; // the client closed the connection between requests
                }
                header.flip();
                int op = header.getInt();
                header.getInt();
                long length = header.getLong();
                if ((op != OP_PUT && op != OP_GET) || length < 0 || length > MAX_LENGTH || length > REGION_BYTES) {
                    reply.clear().put(NACK).flip();
                    writeFully(ch, reply);
                    return;
                }
                long span = (length + 4095) & -4096L;
                long at = Math.floorMod(NEXT.getAndAdd(span), REGION_BYTES - span + 1) & -4096L;
                ByteBuffer data = region.asSlice(at, length).asByteBuffer();
                if (op == OP_PUT) {
                    readFully(ch, data, false);
                    reply.clear().put(ACK).flip();
                    writeFully(ch, reply);
                } else {
                    writeFully(ch, data);
                }
            }
        } catch (IOException e) {
            // a client that goes away mid-request (e.g. a killed benchmark) just ends its connection
        }
    }

    /** Reads until {@code b} is full; false if the stream ended before any byte and {@code eofOk}. */
    static boolean readFully(SocketChannel ch, ByteBuffer b, boolean eofOk) throws IOException {
        boolean any = false;
        while (b.hasRemaining()) {
            int r = ch.read(b);
            if (r < 0) {
                if (eofOk && !any) {
                    return false;
                }
                throw new EOFException("connection closed with " + b.remaining() + " bytes still expected");
            }
            any |= r > 0;
        }
        return true;
    }

    static void writeFully(SocketChannel ch, ByteBuffer b) throws IOException {
        while (b.hasRemaining()) {
            ch.write(b);
        }
    }
}
