package io.kvpool.it;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * A TCP relay between one peer and another that can be cut and healed, to simulate a network
 * partition without killing either side. While cut, it closes every relayed connection and every
 * new one at once.
 */
final class Partition implements AutoCloseable {

    private final ServerSocket server;
    private final InetSocketAddress target;
    private final Set<Socket> open = ConcurrentHashMap.newKeySet();
    private volatile boolean cut;
    private volatile boolean closed;

    Partition(InetSocketAddress target) throws IOException {
        this.target = target;
        this.server = new ServerSocket(0, 50, java.net.InetAddress.getLoopbackAddress());
        Thread.ofVirtual().start(this::acceptLoop);
    }

    int port() {
        return server.getLocalPort();
    }

    void cut() {
        cut = true;
        for (Socket s : open) {
            closeQuietly(s);
        }
    }

    void heal() {
        cut = false;
    }

    private void acceptLoop() {
        while (!closed) {
            try {
                Socket in = server.accept();
                if (cut) {
                    closeQuietly(in);
                    continue;
                }
                Socket out = new Socket();
                out.connect(target, 2000);
                open.add(in);
                open.add(out);
                Thread.ofVirtual().start(() -> pump(in, out));
                Thread.ofVirtual().start(() -> pump(out, in));
            } catch (IOException e) {
                if (closed) {
                    return;
                }
            }
        }
    }

    private void pump(Socket from, Socket to) {
        byte[] buf = new byte[64 << 10];
        try (InputStream is = from.getInputStream(); OutputStream os = to.getOutputStream()) {
            int n;
            while ((n = is.read(buf)) >= 0 && !cut) {
                os.write(buf, 0, n);
            }
        } catch (IOException ignored) {
            // one side went away
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
    public void close() throws IOException {
        closed = true;
        server.close();
        cut();
    }
}
