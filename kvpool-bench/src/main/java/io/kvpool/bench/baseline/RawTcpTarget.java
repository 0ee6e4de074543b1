package io.kvpool.bench.baseline;

import io.kvpool.bench.Load;
import io.kvpool.bench.Measurement;
import io.kvpool.bench.StoreTarget;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.StandardSocketOptions;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.SplittableRandom;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * The ceiling of a request/response TCP data path between two JVMs on this machine: clients in this
 * JVM, a {@link RawTcpServer} in its own JVM, blocking {@link SocketChannel}s with TCP_NODELAY and
 * direct buffers on both sides, one connection per client. Nothing is stored or looked up, so
 * whatever kvpool-over-TCP loses against this is its own overhead.
 */
public final class RawTcpTarget implements StoreTarget {

    private static final long STARTUP_TIMEOUT_SECONDS = 60;

    private final Process server;
    private final InetSocketAddress address;

    private RawTcpTarget(Process server, InetSocketAddress address) {
        this.server = server;
        this.address = address;
    }

    /**
     * Starts a {@link RawTcpServer} in a new JVM (this JVM's java binary and class path,
     * {@code -Xmx256m}, any free loopback port) and returns a target using it; {@link #close()} stops it.
     */
    public static RawTcpTarget start() throws IOException, InterruptedException {
        List<String> cmd = List.of(javaBinary(), "-Xmx256m", "-cp", System.getProperty("java.class.path"),
                RawTcpServer.class.getName(), "0");
        Process p = new ProcessBuilder(cmd)
                .redirectError(ProcessBuilder.Redirect.INHERIT)
                .start();
        try {
            int port = readPort(p);
            return new RawTcpTarget(p, new InetSocketAddress(InetAddress.getLoopbackAddress(), port));
        } catch (IOException | RuntimeException | InterruptedException e) {
            stop(p);
            throw e;
        }
    }

    static String javaBinary() {
        return ProcessHandle.current().info().command()
                .orElse(Path.of(System.getProperty("java.home"), "bin", "java").toString());
    }

    private static int readPort(Process p) throws IOException, InterruptedException {
        BufferedReader out = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.US_ASCII));
        CompletableFuture<String> line = new CompletableFuture<>();
        Thread.ofVirtual().start(() -> {
            try {
                line.complete(out.readLine());
            } catch (IOException e) {
                line.completeExceptionally(e);
            }
        });
        String first;
        try {
            first = line.get(STARTUP_TIMEOUT_SECONDS, TimeUnit.SECONDS);
        } catch (TimeoutException e) {
            throw new IOException("the raw TCP server did not print its port within " + STARTUP_TIMEOUT_SECONDS + " s");
        } catch (ExecutionException e) {
            throw new IOException("reading the raw TCP server's port failed", e.getCause());
        }
        if (first == null) {
            int exit = p.waitFor(10, TimeUnit.SECONDS) ? p.exitValue() : -1;
            throw new IOException("the raw TCP server exited (status " + exit
                    + ") before printing its port; its stderr is above");
        }
        try {
            return Integer.parseInt(first.strip());
        } catch (NumberFormatException e) {
            throw new IOException("the raw TCP server printed '" + first + "' instead of its port", e);
        }
    }

    @Override
    public String name() {
        return "raw-tcp";
    }

    /** The server's address (127.0.0.1 and the port it chose). */
    public InetSocketAddress address() {
        return address;
    }

    /** The server JVM's process id. */
    public long serverPid() {
        return server.pid();
    }

    @Override
    public Measurement put(int valueSize, int clients, Duration warmup, Duration duration) throws Exception {
        return run(RawTcpServer.OP_PUT, valueSize, clients, warmup, duration);
    }

    @Override
    public Measurement get(int valueSize, int clients, Duration warmup, Duration duration) throws Exception {
        return run(RawTcpServer.OP_GET, valueSize, clients, warmup, duration);
    }

    /**
     * Puts of {@code depth} values a call, pipelined: the client writes {@code depth} requests back to
     * back in one gathering write, then reads the {@code depth} acknowledgements. What a store that
     * takes a batch of small values in one frame and answers it once could at best do.
     */
    public Measurement putPipelined(int valueSize, int depth, int clients, Duration warmup, Duration duration)
            throws Exception {
        return run(RawTcpServer.OP_PUT, valueSize, depth, clients, warmup, duration);
    }

    /** Gets of {@code depth} values a call, pipelined: {@code depth} requests written at once, then the values read. */
    public Measurement getPipelined(int valueSize, int depth, int clients, Duration warmup, Duration duration)
            throws Exception {
        return run(RawTcpServer.OP_GET, valueSize, depth, clients, warmup, duration);
    }

    private Measurement run(int op, int valueSize, int clients, Duration warmup, Duration duration) throws Exception {
        return run(op, valueSize, 1, clients, warmup, duration);
    }

    private Measurement run(int op, int valueSize, int depth, int clients, Duration warmup, Duration duration)
            throws Exception {
        if (valueSize <= 0 || valueSize > RawTcpServer.MAX_LENGTH) {
            throw new IllegalArgumentException("value size must be in 1.." + RawTcpServer.MAX_LENGTH + ": " + valueSize);
        }
        if (!server.isAlive()) {
            throw new IllegalStateException("the raw TCP server (PID " + server.pid() + ") has exited");
        }
        if (depth < 1) {
            throw new IllegalArgumentException("pipelining depth must be at least 1: " + depth);
        }
        return Load.run(clients, warmup, duration, id -> new Connection(address, valueSize, id, op, depth));
    }

    /** One client: its own connection and direct buffers, reused for every operation. */
    static final class Connection implements Load.Client {
        private final SocketChannel ch;
        private final Arena arena = Arena.ofShared(); // built on the runner's thread, used on the client's
        private final ByteBuffer header;
        private final ByteBuffer reply;
        private final ByteBuffer data;
        private final ByteBuffer[] request;
        private final int length;
        private final int op;
        /** Requests written before the replies are read (1: one at a time). */
        private final int depth;
        /** With depth > 1: {@code depth} headers in one buffer, and the requests as {header i, value} pairs. */
        private final ByteBuffer headers;
        private final ByteBuffer[] pipelined;

        Connection(InetSocketAddress address, int length, long seed, int op) throws IOException {
            this(address, length, seed, op, 1);
        }

        Connection(InetSocketAddress address, int length, long seed, int op, int depth) throws IOException {
            this.length = length;
            this.op = op;
            this.depth = depth;
            try {
                header = arena.allocate(RawTcpServer.HEADER_BYTES, 64).asByteBuffer();
                reply = arena.allocate(depth, 64).asByteBuffer();
                headers = arena.allocate((long) RawTcpServer.HEADER_BYTES * depth, 64).asByteBuffer();
                pipelined = new ByteBuffer[2 * depth];
                MemorySegment d = arena.allocate(length, 4096);
                SplittableRandom rnd = new SplittableRandom(seed);
                for (long i = 0; i + 8 <= length; i += 8) {
                    d.set(ValueLayout.JAVA_LONG_UNALIGNED, i, rnd.nextLong());
                }
                data = d.asByteBuffer();
                request = new ByteBuffer[] {header, data};
                ch = SocketChannel.open();
                ch.setOption(StandardSocketOptions.TCP_NODELAY, true);
                ch.connect(address);
            } catch (IOException | RuntimeException e) {
                arena.close();
                throw e;
            }
        }

        @Override
        public Load.Op op() {
            if (depth > 1) {
                return op == RawTcpServer.OP_PUT ? i -> putPipelined() : i -> getPipelined();
            }
            return op == RawTcpServer.OP_PUT ? i -> put() : i -> get();
        }

        private void fillHeaders(int requestOp) {
            headers.clear();
            for (int i = 0; i < depth; i++) {
                headers.putInt(requestOp).putInt(0).putLong(length);
            }
            headers.flip();
        }

        long putPipelined() throws IOException {
            fillHeaders(RawTcpServer.OP_PUT);
            long remaining = 0;
            for (int i = 0; i < depth; i++) {
                pipelined[2 * i] = headers.slice(i * RawTcpServer.HEADER_BYTES, RawTcpServer.HEADER_BYTES);
                pipelined[2 * i + 1] = data.duplicate().clear();
                remaining += RawTcpServer.HEADER_BYTES + (long) length;
            }
            while (remaining > 0) {
                remaining -= ch.write(pipelined);
            }
            reply.clear().limit(depth);
            RawTcpServer.readFully(ch, reply, false);
            for (int i = 0; i < depth; i++) {
                if (reply.get(i) != RawTcpServer.ACK) {
                    throw new IOException("the raw TCP server rejected a pipelined put of " + length + " bytes");
                }
            }
            return (long) length * depth;
        }

        long getPipelined() throws IOException {
            fillHeaders(RawTcpServer.OP_GET);
            RawTcpServer.writeFully(ch, headers);
            for (int i = 0; i < depth; i++) {
                data.clear();
                RawTcpServer.readFully(ch, data, false);
            }
            return (long) length * depth;
        }

        long put() throws IOException {
            header.clear();
            header.putInt(RawTcpServer.OP_PUT).putInt(0).putLong(length).flip();
            data.clear();
            // header and value in one gathering write
            long remaining = header.remaining() + (long) data.remaining();
            while (remaining > 0) {
                remaining -= ch.write(request);
            }
            reply.clear().limit(1); // one acknowledgement (the buffer holds a pipelined call's)
            RawTcpServer.readFully(ch, reply, false);
            byte ack = reply.get(0);
            if (ack != RawTcpServer.ACK) {
                throw new IOException("the raw TCP server rejected a put of " + length + " bytes (reply " + ack + ")");
            }
            return length;
        }

        long get() throws IOException {
            header.clear();
            header.putInt(RawTcpServer.OP_GET).putInt(0).putLong(length).flip();
            RawTcpServer.writeFully(ch, header);
            data.clear();
            RawTcpServer.readFully(ch, data, false);
            return data.position();
        }

        @Override
        public void close() throws IOException {
            try {
                ch.close();
            } finally {
                arena.close();
            }
        }
    }

    private static void stop(Process p) {
        try {
            p.getOutputStream().close(); // end of file on its stdin: the server exits by itself
        } catch (IOException ignored) {
            // it is being killed anyway
        }
        p.destroy();
        boolean interrupted = false;
        try {
            if (!p.waitFor(5, TimeUnit.SECONDS)) {
                p.destroyForcibly();
                p.waitFor(5, TimeUnit.SECONDS);
            }
        } catch (InterruptedException e) {
            interrupted = true;
            p.destroyForcibly();
        }
        if (interrupted) {
            Thread.currentThread().interrupt();
        }
    }

    /** Stops the server JVM. */
    @Override
    public void close() {
        stop(server);
    }
}
