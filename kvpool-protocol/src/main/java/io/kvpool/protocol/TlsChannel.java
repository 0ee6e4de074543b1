package io.kvpool.protocol;

import javax.net.ssl.SSLEngine;
import javax.net.ssl.SSLEngineResult;
import javax.net.ssl.SSLException;
import javax.net.ssl.SSLSession;
import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.ByteChannel;
import java.nio.channels.GatheringByteChannel;
import java.nio.channels.SocketChannel;

/**
 * TLS over a blocking {@link SocketChannel}: an {@link SSLEngine} driven so that frames read and
 * write through it exactly as through the socket.
 *
 * <h2>Why an adapter</h2>
 * kvpool's connections are blocking channels: a node reads a payload from the socket straight into
 * its segment and writes a reply straight from it (gathering writes of segment views), and every
 * exchange's deadline is a {@link Watchdog} that closes the socket. {@code SSLSocket} offers only
 * streams over byte arrays, which would copy every payload through the heap; a library adapter
 * (tls-channel) is not served by the package registry here. So this class is the small part of one
 * that kvpool needs: blocking mode only, one thread at a time.
 *
 * <h2>Buffers</h2>
 * {@code netIn} holds ciphertext read from the socket and not yet decrypted (kept ready for writing:
 * its position is the end of the bytes held), {@code netOut} ciphertext being written, {@code appIn}
 * plaintext decrypted but not yet read (kept ready for reading). A read into a buffer that can hold
 * a whole record's plaintext decrypts straight into it, so a payload read into a segment costs the
 * decryption and no extra copy; smaller reads (headers, bodies) go through {@code appIn}. A write
 * encrypts one record (up to 16 KiB of plaintext, gathered across the caller's buffers: a frame's
 * header, body and the start of its payload share one record) and writes it whole before the next.
 * About 50 KiB of heap per connection.
 *
 * <h2>Threads and closing</h2>
 * One thread reads and writes at a time (a kvpool connection is used by one thread at a time).
 * Another thread may close the <em>socket</em> (a deadline, a server shutting down): the
 * blocked socket call then fails with the usual {@code AsynchronousCloseException}, which passes
 * through unchanged so callers tell a timeout as they do without TLS. No close_notify is sent, and an
 * end of stream without one reads as an ordinary end of stream: kvpool frames carry their own
 * lengths, so a truncated frame is caught by the frame layer ({@link Channels#readFully} fails).
 *
 * <h2>Errors</h2>
 * An {@link SSLException} (a bad certificate, a refused handshake, a corrupted record) first sends
 * the alert the engine prepared, best effort, so the peer learns why, and then surfaces as a
 * {@link TlsException} naming the peer.
 */
final class TlsChannel implements ByteChannel, GatheringByteChannel {

    private static final ByteBuffer[] NOTHING = {ByteBuffer.allocate(0)};

    private final SocketChannel socket;
    private final SSLEngine engine;
    private final String peer;
    private ByteBuffer netIn;
    private ByteBuffer netOut;
    private ByteBuffer appIn;
    private boolean inboundDone;

    /** {@code received}: bytes the caller already read from the socket (a server's peek at a new connection). */
    TlsChannel(SocketChannel socket, SSLEngine engine, String peer, ByteBuffer received) {
        this.socket = socket;
        this.engine = engine;
        this.peer = peer;
        SSLSession s = engine.getSession();
        this.netIn = ByteBuffer.allocate(Math.max(s.getPacketBufferSize(), received.remaining()));
        this.netIn.put(received);
        this.netOut = ByteBuffer.allocate(s.getPacketBufferSize());
        this.appIn = ByteBuffer.allocate(s.getApplicationBufferSize()).flip();
    }

    /**
     * Runs the handshake to its end (the caller bounds it with a deadline on the socket). A peer that
     * answers with a kvpool frame instead of TLS is named as a plain-TCP server.
     */
    void handshake() throws IOException {
        engine.beginHandshake();
        while (true) {
            switch (engine.getHandshakeStatus()) {
                case NEED_TASK -> runTasks();
                case NEED_WRAP -> wrapAndSend(NOTHING, 0, 1);
                case NEED_UNWRAP, NEED_UNWRAP_AGAIN -> {
                    if (!appIn.hasRemaining()) {
                        appIn.clear();
                        int n = unwrapRecord(appIn, true);
                        appIn.flip();
                        if (n < 0) {
                            throw new EOFException(peer + " closed the connection during the TLS handshake");
                        }
                    } else {
                        // application data arrived with the end of the handshake: keep it for the first read
                        ByteBuffer spare = ByteBuffer.allocate(engine.getSession().getApplicationBufferSize());
                        if (unwrapRecord(spare, true) < 0) {
                            throw new EOFException(peer + " closed the connection during the TLS handshake");
                        }
                        appIn = concat(appIn, spare.flip());
                    }
                }
                case FINISHED, NOT_HANDSHAKING -> {
                    return;
                }
            }
        }
    }

    private static ByteBuffer concat(ByteBuffer a, ByteBuffer b) {
        ByteBuffer c = ByteBuffer.allocate(a.remaining() + b.remaining());
        return c.put(a).put(b).flip();
    }

    @Override
    public int read(ByteBuffer dst) throws IOException {
        if (!dst.hasRemaining()) {
            return 0;
        }
        while (true) {
            if (appIn.hasRemaining()) {
                int n = Math.min(appIn.remaining(), dst.remaining());
                dst.put(dst.position(), appIn, appIn.position(), n);
                dst.position(dst.position() + n);
                appIn.position(appIn.position() + n);
                return n;
            }
            if (inboundDone) {
                return -1;
            }
            if (dst.remaining() >= engine.getSession().getApplicationBufferSize()) {
                int n = unwrapRecord(dst, false);
                if (n > 0) {
                    return n;
                }
                if (n == -1) {
                    inboundDone = true;
                }
                if (n != OVERFLOW) {
                    continue;
                }
            }
            appIn.clear();
            if (appIn.capacity() < engine.getSession().getApplicationBufferSize()) {
                appIn = ByteBuffer.allocate(engine.getSession().getApplicationBufferSize());
            }
            int n = unwrapRecord(appIn, false);
            appIn.flip();
            if (n == -1) {
                inboundDone = true;
            }
        }
    }

    /** {@link #unwrapRecord}: the target cannot hold the next record's plaintext. */
    private static final int OVERFLOW = -2;

    /**
     * Decrypts the next record into {@code target}, reading the socket until a whole record is there:
     * the plaintext bytes produced (0 for a record that carries none, such as a session ticket), -1 at
     * the end of the stream (the socket's, or the peer's close_notify), or {@link #OVERFLOW}.
     */
    private int unwrapRecord(ByteBuffer target, boolean handshaking) throws IOException {
        while (true) {
            if (handshaking && netIn.position() >= 2 && looksLikeFrame(netIn)) {
                throw new TlsException(peer + " answered in plain TCP, not TLS: it is a kvpool server"
                        + " without TLS (give every role the same --tls-cert/--tls-key/--tls-ca, or none)");
            }
            SSLEngineResult r;
            netIn.flip();
            try {
                r = engine.unwrap(netIn, target);
            } catch (SSLException e) {
                throw failed(e);
            } finally {
                netIn.compact();
            }
            switch (r.getStatus()) {
                case OK -> {
                    if (!handshaking) {
                        // a post-handshake message (key update) may ask for an answer
                        SSLEngineResult.HandshakeStatus hs = r.getHandshakeStatus();
                        if (hs == SSLEngineResult.HandshakeStatus.NEED_TASK) {
                            runTasks();
                        }
                        if (engine.getHandshakeStatus() == SSLEngineResult.HandshakeStatus.NEED_WRAP) {
                            wrapAndSend(NOTHING, 0, 1);
                        }
                    }
                    return r.bytesProduced();
                }
                case CLOSED -> {
                    return -1;
                }
                case BUFFER_OVERFLOW -> {
                    return OVERFLOW;
                }
                case BUFFER_UNDERFLOW -> {
                    int need = engine.getSession().getPacketBufferSize();
                    if (netIn.capacity() < need) {
                        netIn = ByteBuffer.allocate(need).put(netIn.flip());
                    }
                    if (socket.read(netIn) < 0) {
                        return -1;
                    }
                }
            }
        }
    }

    /** Whether the bytes received start like a kvpool frame (its magic), not a TLS record. */
    private static boolean looksLikeFrame(ByteBuffer received) {
        return received.get(0) == (byte) (FrameHeader.MAGIC & 0xFF) && received.get(1) == (byte) (FrameHeader.MAGIC >> 8);
    }

    @Override
    public int write(ByteBuffer src) throws IOException {
        return (int) write(new ByteBuffer[]{src}, 0, 1);
    }

    @Override
    public long write(ByteBuffer[] srcs) throws IOException {
        return write(srcs, 0, srcs.length);
    }

    @Override
    public long write(ByteBuffer[] srcs, int offset, int length) throws IOException {
        long total = 0;
        for (int i = offset; i < offset + length; i++) {
            total += srcs[i].remaining();
        }
        long left = total;
        while (left > 0) {
            left -= wrapAndSend(srcs, offset, length);
        }
        return total;
    }

    /** Encrypts one record from {@code srcs} (or a handshake message) and writes it whole: plaintext bytes consumed. */
    private long wrapAndSend(ByteBuffer[] srcs, int offset, int length) throws IOException {
        while (true) {
            netOut.clear();
            SSLEngineResult r;
            try {
                r = engine.wrap(srcs, offset, length, netOut);
            } catch (SSLException e) {
                throw failed(e);
            }
            switch (r.getStatus()) {
                case OK -> {
                    netOut.flip();
                    while (netOut.hasRemaining()) {
                        socket.write(netOut);
                    }
                    if (r.getHandshakeStatus() == SSLEngineResult.HandshakeStatus.NEED_TASK) {
                        runTasks();
                    }
                    return r.bytesConsumed();
                }
                case BUFFER_OVERFLOW -> netOut = ByteBuffer.allocate(Math.max(2 * netOut.capacity(),
                        engine.getSession().getPacketBufferSize()));
                case CLOSED -> {
                    netOut.flip();
                    while (netOut.hasRemaining()) {
                        socket.write(netOut); // the alert closing the session
                    }
                    throw new TlsException("the TLS session with " + peer + " is closed");
                }
                case BUFFER_UNDERFLOW -> throw new IllegalStateException("SSLEngine.wrap reported an underflow");
            }
        }
    }

    private void runTasks() {
        Runnable t;
        while ((t = engine.getDelegatedTask()) != null) {
            t.run();
        }
    }

    /**
     * Sends the alert the engine prepared for {@code e} (best effort: the peer learns why) and returns
     * the exception to throw, naming the peer and, where it helps, the likely cause.
     */
    private TlsException failed(SSLException e) {
        try {
            netOut.clear();
            engine.closeOutbound();
            engine.wrap(NOTHING, netOut);
            netOut.flip();
            while (netOut.hasRemaining() && socket.write(netOut) > 0) {
                // a few bytes; the socket buffer takes them
            }
        } catch (IOException | RuntimeException ignored) {
            // the alert is a courtesy; the exception below is what matters
        }
        String why = e.getMessage();
        String hint = hint(why == null ? "" : why);
        return new TlsException("TLS with " + peer + " failed: " + why + hint, e);
    }

    private static String hint(String why) {
        if (why.contains("certificate_required")) {
            // the JDK's client sends no certificate when it has none the server's CA list names
            return " (the server requires a client certificate signed by its CA; the client had none, or none that"
                    + " CA signed: check --tls-cert/--tls-key or KVPOOL_TLS_CERT/KVPOOL_TLS_KEY)";
        }
        if (why.contains("unknown_ca") || why.contains("bad_certificate") || why.contains("PKIX path")
                || why.contains("certificate_unknown")) {
            return " (the certificate is not signed by a CA in the other side's CA bundle)";
        }
        if (why.contains("No subject alternative") || why.contains("No name matching")) {
            return " (the server's certificate does not list the address dialed as a subject alternative name)";
        }
        if (why.contains("Unsupported or unrecognized SSL message")) {
            return " (the peer does not speak TLS)";
        }
        return "";
    }

    @Override
    public boolean isOpen() {
        return socket.isOpen();
    }

    @Override
    public void close() throws IOException {
        socket.close();
    }

    /** A TLS failure: handshake refused, certificate not trusted, peer without TLS, corrupted record. */
    static final class TlsException extends IOException {
        TlsException(String message) {
            super(message);
        }

        TlsException(String message, Throwable cause) {
            super(message, cause);
        }
    }
}
