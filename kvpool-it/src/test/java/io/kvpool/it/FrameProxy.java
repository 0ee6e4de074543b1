package io.kvpool.it;

import io.kvpool.protocol.FrameHeader;

import java.io.DataInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * A loopback TCP proxy in front of a kvpool server that reads the frames going through it, for
 * faults a test must place exactly: it can hold back the reply to the first request of a given
 * opcode (the server did the work; the requester has not heard), then drop that connection, as a
 * server that dies between doing and answering would. Frames are forwarded whole and unchanged.
 */
final class FrameProxy implements AutoCloseable {

    private final ServerSocket listener;
    private final int target;
    private final List<Socket> open = new CopyOnWriteArrayList<>();
    private final Set<Long> watched = ConcurrentHashMap.newKeySet();
    private volatile int holdOpcode = -1;
    /** Counted down when the held reply arrived from the server (and was not passed on). */
    final CountDownLatch held = new CountDownLatch(1);
    private final CountDownLatch release = new CountDownLatch(1);
    private final Thread acceptor;

    FrameProxy(int targetPort) throws IOException {
        this.target = targetPort;
        this.listener = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
        this.acceptor = Thread.ofPlatform().daemon().name("frame-proxy").start(this::accept);
    }

    int port() {
        return listener.getLocalPort();
    }

    /** Holds back the reply to the next request with this opcode, until {@link #dropHeld}. */
    void holdReplyTo(int opcode) {
        holdOpcode = opcode;
    }

    /** Closes the connection whose reply was held, without passing it on. */
    void dropHeld() {
        release.countDown();
    }

    private void accept() {
        while (!listener.isClosed()) {
            try {
                Socket client = listener.accept();
                Socket server = new Socket(InetAddress.getLoopbackAddress(), target);
                client.setTcpNoDelay(true);
                server.setTcpNoDelay(true);
                open.add(client);
                open.add(server);
                Thread.ofPlatform().daemon().start(() -> pump(client, server, true));
                Thread.ofPlatform().daemon().start(() -> pump(server, client, false));
            } catch (IOException e) {
                return;
            }
        }
    }

    /** Forwards frames from {@code from} to {@code to}; {@code requests}: the client-to-server direction. */
    private void pump(Socket from, Socket to, boolean requests) {
        try (from; to) {
            DataInputStream in = new DataInputStream(from.getInputStream());
            OutputStream out = to.getOutputStream();
            byte[] header = new byte[FrameHeader.LENGTH];
            while (true) {
                in.readFully(header);
                ByteBuffer h = ByteBuffer.wrap(header).order(ByteOrder.LITTLE_ENDIAN);
                int opcode = h.get(FrameHeader.OPCODE_OFFSET) & 0xFF;
                long id = h.getLong(FrameHeader.REQUEST_ID_OFFSET);
                long rest = Integer.toUnsignedLong(h.getInt(FrameHeader.BODY_LENGTH_OFFSET))
                        + h.getLong(FrameHeader.PAYLOAD_LENGTH_OFFSET);
                if (requests && opcode == holdOpcode) {
                    holdOpcode = -1;
                    watched.add(id);
                }
                if (!requests && watched.remove(id)) {
                    skip(in, rest);
                    held.countDown();
                    release.await();
                    return; // both sockets close: the requester never hears
                }
                out.write(header);
                copy(in, out, rest);
                out.flush();
            }
        } catch (IOException | InterruptedException e) {
            // a side closed: the other closes with it
        }
    }

    private static void copy(InputStream in, OutputStream out, long n) throws IOException {
        byte[] buf = new byte[64 << 10];
        while (n > 0) {
            int r = in.read(buf, 0, (int) Math.min(buf.length, n));
            if (r < 0) {
                throw new IOException("closed mid-frame");
            }
            out.write(buf, 0, r);
            n -= r;
        }
    }

    private static void skip(DataInputStream in, long n) throws IOException {
        while (n > 0) {
            long s = in.skip(n);
            if (s <= 0) {
                if (in.read() < 0) {
                    throw new IOException("closed mid-frame");
                }
                s = 1;
            }
            n -= s;
        }
    }

    /** Waits for the held reply. */
    boolean awaitHeld(long seconds) throws InterruptedException {
        return held.await(seconds, TimeUnit.SECONDS);
    }

    @Override
    public void close() throws IOException {
        release.countDown();
        listener.close();
        for (Socket s : open) {
            s.close();
        }
        try {
            acceptor.join(2000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
