package io.kvpool.bench.soak;

import io.kvpool.config.Ports;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The only way to a node: a TCP relay on the address the node advertises, forwarding to where the
 * node really listens. Clients, the master and other nodes all reach the node through it (the node's
 * own connection to the master does not), so cutting it partitions the node from all of them while
 * the node keeps running and heartbeating.
 *
 * <p>Two kinds of partition:
 * <ul>
 *   <li>{@link Mode#STALL}: packets stop, as when a switch or cable fails. Nothing is forwarded in
 *       either direction; new connections are accepted and then left unanswered. Bytes in flight
 *       wait in the kernel's buffers and are delivered after {@link #heal()}, as TCP retransmission
 *       would deliver them, unless a side gave up and closed first. Callers see timeouts.</li>
 *   <li>{@link Mode#RESET}: every connection is closed at once and new ones are closed on accept, as
 *       when a host or firewall answers with resets. Callers see errors at once.</li>
 * </ul>
 * Public for the integration tests, which partition a node from its master the same way.
 */
public final class Relay implements AutoCloseable {

    /** How a cut behaves (see the class comment). */
    public enum Mode { STALL, RESET }

    private final ServerSocket server;
    private final InetSocketAddress target;
    private final Set<Socket> open = ConcurrentHashMap.newKeySet();
    private final Object gate = new Object();
    private volatile Mode cut;
    private volatile boolean closed;

    /** A relay on {@code listen} (port 0: any) to {@code target}. */
    public Relay(InetSocketAddress listen, InetSocketAddress target) throws IOException {
        this.target = target;
        this.server = new ServerSocket();
        server.setReuseAddress(true);
        server.bind(listen, 200);
        Thread.ofVirtual().name("soak-relay-" + listen.getPort()).start(this::acceptLoop);
    }

    /** A relay on a free port P of 127.0.0.1 to port P of {@code targetHost} (where the node is to listen). */
    static Relay onLoopback(InetAddress targetHost) throws IOException {
        int port = Ports.reservable(); // free on every address, and no client connection takes it on the target's
        return new Relay(new InetSocketAddress(InetAddress.getLoopbackAddress(), port),
                new InetSocketAddress(targetHost, port));
    }

    public int port() {
        return server.getLocalPort();
    }

    InetSocketAddress target() {
        return target;
    }

    boolean isCut() {
        return cut != null;
    }

    /** Starts a partition of the given kind. */
    public void cut(Mode mode) {
        cut = mode;
        if (mode == Mode.RESET) {
            for (Socket s : open) {
                closeQuietly(s);
            }
        }
    }

    /** Ends the partition: stalled connections move again, new ones are forwarded. */
    public void heal() {
        synchronized (gate) {
            cut = null;
            gate.notifyAll();
        }
    }

    /** Waits while a stall lasts; false when the connection must be dropped instead. */
    private boolean passable() {
        synchronized (gate) {
            while (cut == Mode.STALL && !closed) {
                try {
                    gate.wait();
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    return false;
                }
            }
        }
        return cut == null && !closed;
    }

    private void acceptLoop() {
        while (!closed) {
            Socket in;
            try {
                in = server.accept();
            } catch (IOException e) {
                continue;
            }
            open.add(in);
            Thread.ofVirtual().start(() -> connect(in));
        }
    }

    private void connect(Socket in) {
        if (!passable()) {
            closeQuietly(in);
            open.remove(in);
            return;
        }
        Socket out = new Socket();
        try {
            out.setTcpNoDelay(true);
            in.setTcpNoDelay(true);
            out.connect(target, 5000);
        } catch (IOException e) {
            closeQuietly(in);
            closeQuietly(out);
            open.remove(in);
            return;
        }
        open.add(out);
        Thread.ofVirtual().start(() -> pump(in, out));
        Thread.ofVirtual().start(() -> pump(out, in));
    }

    private void pump(Socket from, Socket to) {
        byte[] buf = new byte[64 << 10];
        try (InputStream is = from.getInputStream(); OutputStream os = to.getOutputStream()) {
            int n;
            while ((n = is.read(buf)) >= 0) {
                if (!passable()) {
                    break;
                }
                os.write(buf, 0, n);
            }
        } catch (IOException ignored) {
            // one side went away, or a RESET cut closed the sockets
        } finally {
            closeQuietly(from);
            closeQuietly(to);
            open.remove(from);
            open.remove(to);
        }
    }

    private static void closeQuietly(Socket s) {
        try {
            s.close();
        } catch (IOException ignored) {
            // closing anyway
        }
    }

    @Override
    public void close() {
        closed = true;
        heal();
        try {
            server.close();
        } catch (IOException ignored) {
            // closing anyway
        }
        for (Socket s : open) {
            closeQuietly(s);
        }
    }
}
