package io.kvpool.protocol;

/**
 * Bounds on what one frame may carry, enforced by whoever receives it. A frame over a limit is
 * answered with {@link FrameStatus#FRAME_TOO_LARGE} and the connection is closed.
 *
 * @param maxBodyBytes    largest body accepted; bodies are buffered in memory whole
 * @param maxPayloadBytes largest payload accepted; payloads stream to or from a segment
 */
public record Limits(int maxBodyBytes, long maxPayloadBytes) {

    /** Default body bound: a batch of 65,536 keys of 512 bytes fits with room to spare. */
    public static final int DEFAULT_MAX_BODY_BYTES = 64 << 20;

    /** Default payload bound: one frame moves at most 1 GiB of object bytes; larger batches are split. */
    public static final long DEFAULT_MAX_PAYLOAD_BYTES = 1L << 30;

    public static final Limits DEFAULT = new Limits(DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_PAYLOAD_BYTES);

    public Limits {
        if (maxBodyBytes < 1024) {
            throw new IllegalArgumentException("maxBodyBytes must be at least 1024, got " + maxBodyBytes);
        }
        if (maxPayloadBytes < 0) {
            throw new IllegalArgumentException("maxPayloadBytes cannot be negative, got " + maxPayloadBytes);
        }
    }
}
