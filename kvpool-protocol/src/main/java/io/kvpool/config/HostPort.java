package io.kvpool.config;

import java.net.InetSocketAddress;

/**
 * A {@code host:port} address as written in flags and config ({@code 10.0.0.1:50051},
 * {@code [::1]:50051}, {@code head-node:50051}). Resolution is left to the caller.
 */
public record HostPort(String host, int port) {

    public HostPort {
        if (host == null || host.isBlank()) {
            throw new IllegalArgumentException("address has no host");
        }
        if (port < 0 || port > 65535) {
            throw new IllegalArgumentException("port " + port + " is out of range 0..65535");
        }
    }

    /**
     * Parses {@code host:port}.
     *
     * @throws IllegalArgumentException naming the text when it is not {@code host:port}
     */
    public static HostPort parse(String text) {
        if (text == null || text.isBlank()) {
            throw new IllegalArgumentException("missing address; expected host:port, e.g. 127.0.0.1:50051");
        }
        String t = text.trim();
        int colon = t.lastIndexOf(':');
        if (colon <= 0 || colon == t.length() - 1) {
            throw new IllegalArgumentException("'" + text + "' is not host:port, e.g. 127.0.0.1:50051");
        }
        String host = t.substring(0, colon);
        if (host.startsWith("[") && host.endsWith("]")) {
            host = host.substring(1, host.length() - 1);
        }
        int port;
        try {
            port = Integer.parseInt(t.substring(colon + 1));
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("'" + text + "' has a port that is not a number");
        }
        if (port < 0 || port > 65535) {
            throw new IllegalArgumentException("'" + text + "' has port " + port + ", outside 0..65535");
        }
        return new HostPort(host, port);
    }

    public InetSocketAddress toSocketAddress() {
        return new InetSocketAddress(host, port);
    }

    @Override
    public String toString() {
        return host.indexOf(':') >= 0 ? "[" + host + "]:" + port : host + ":" + port;
    }
}
