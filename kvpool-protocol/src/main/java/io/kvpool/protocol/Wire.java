package io.kvpool.protocol;

import java.nio.channels.GatheringByteChannel;
import java.nio.channels.ReadableByteChannel;
import java.nio.channels.SocketChannel;

/**
 * What one connection's frames travel over: its socket, and the channels that carry its bytes: the
 * socket itself, or TLS over it ({@link TlsChannel}). Deadlines ({@link Watchdog}) and closing act on
 * the socket, so they work the same either way.
 */
record Wire(SocketChannel socket, ReadableByteChannel in, GatheringByteChannel out) {

    static Wire plain(SocketChannel socket) {
        return new Wire(socket, socket, socket);
    }

    static Wire tls(SocketChannel socket, TlsChannel tls) {
        return new Wire(socket, tls, tls);
    }
}
