package io.kvpool.client;

/**
 * Per-call placement options.
 *
 * @param preferredSegment segment ({@code host:port}) to try first for this call; overrides the
 *                         client's configured and detected preference; null for none
 * @param replicas         copies wanted; 0 uses the client's setting
 */
public record PutOptions(String preferredSegment, int replicas) {

    public static final PutOptions DEFAULT = new PutOptions(null, 0);

    public PutOptions {
        if (replicas < 0 || replicas > 8) {
            throw new IllegalArgumentException("replicas must be 0 (default) to 8, got " + replicas);
        }
    }

    public static PutOptions preferring(String segment) {
        return new PutOptions(segment, 0);
    }
}
