package io.kvpool.protocol;

/**
 * Bounds on what a peer may make a server hold, enforced by whoever receives. A frame over a size
 * limit is answered with {@link FrameStatus#FRAME_TOO_LARGE} and the connection is closed; a
 * connection over a count limit is answered with an error naming the limit and closed at once.
 *
 * @param maxBodyBytes          largest body accepted; bodies are buffered in memory whole, but only
 *                              as their bytes arrive (a header announcing a large body allocates nothing)
 * @param maxPayloadBytes       largest payload accepted; payloads stream to or from a segment
 * @param maxConnections        most connections a server keeps open at once
 * @param maxConnectionsPerHost most connections from one peer address; a host running many engine
 *                              processes needs a few per process and peer
 */
public record Limits(int maxBodyBytes, long maxPayloadBytes, int maxConnections, int maxConnectionsPerHost) {

    /** Default body bound: a batch of 65,536 keys of 512 bytes fits with room to spare. */
    public static final int DEFAULT_MAX_BODY_BYTES = 64 << 20;

    /** Default payload bound: one frame moves at most 1 GiB of object bytes; larger batches are split. */
    public static final long DEFAULT_MAX_PAYLOAD_BYTES = 1L << 30;

    /** Default bound on open connections per server. */
    public static final int DEFAULT_MAX_CONNECTIONS = 4096;

    /** Default bound on open connections from one peer address. */
    public static final int DEFAULT_MAX_CONNECTIONS_PER_HOST = 1024;

    public static final Limits DEFAULT = new Limits(DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_PAYLOAD_BYTES);

    public Limits {
        if (maxBodyBytes < 1024) {
            throw new IllegalArgumentException("maxBodyBytes must be at least 1024, got " + maxBodyBytes);
        }
        if (maxPayloadBytes < 0) {
            throw new IllegalArgumentException("maxPayloadBytes cannot be negative, got " + maxPayloadBytes);
        }
        if (maxConnections < 1) {
            throw new IllegalArgumentException("max connections must be at least 1, got " + maxConnections);
        }
        if (maxConnectionsPerHost < 1 || maxConnectionsPerHost > maxConnections) {
            throw new IllegalArgumentException("max connections per host must be in [1, max connections = "
                    + maxConnections + "], got " + maxConnectionsPerHost);
        }
    }

    /** Frame bounds with the default connection bounds. */
    public Limits(int maxBodyBytes, long maxPayloadBytes) {
        this(maxBodyBytes, maxPayloadBytes, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_HOST);
    }

    /** These frame bounds with other connection bounds. */
    public Limits withConnections(int total, int perHost) {
        return new Limits(maxBodyBytes, maxPayloadBytes, total, perHost);
    }
}
