package io.kvpool.client;

import java.time.Duration;

/**
 * Per-call placement options.
 *
 * @param preferredSegment segment ({@code host:port}) to try first for this call; overrides the
 *                         client's configured and detected preference; null for none
 * @param replicas         copies wanted, on distinct segments (of distinct hosts while another host has
 *                         room); 0 uses the client's setting. Best effort: {@link PutResult#copies()} says
 *                         how many were written, and the master's repair adds missing ones later
 * @param pinSeconds       pin the objects for this many seconds: they are evicted only once no unpinned
 *                         object is left to evict; {@link #PIN_FOREVER} until removed or replaced; 0 no pin.
 *                         Granted while the pool's pins stay under the master's cap ({@link PutResult#pinned()})
 */
public record PutOptions(String preferredSegment, int replicas, int pinSeconds) {

    /** A pin that lasts until the object is removed or replaced. */
    public static final int PIN_FOREVER = -1;

    public static final PutOptions DEFAULT = new PutOptions(null, 0, 0);

    public PutOptions {
        if (replicas < 0 || replicas > 8) {
            throw new IllegalArgumentException("replicas must be 0 (default) to 8, got " + replicas);
        }
        if (pinSeconds < PIN_FOREVER) {
            throw new IllegalArgumentException("pin seconds must be 0 (none), positive, or PIN_FOREVER (-1), got "
                    + pinSeconds);
        }
    }

    public PutOptions(String preferredSegment, int replicas) {
        this(preferredSegment, replicas, 0);
    }

    public static PutOptions preferring(String segment) {
        return new PutOptions(segment, 0);
    }

    /** The same options with {@code n} copies wanted. */
    public PutOptions withReplicas(int n) {
        return new PutOptions(preferredSegment, n, pinSeconds);
    }

    /** The same options, pinned for {@code d} (rounded up to whole seconds). */
    public PutOptions pinnedFor(Duration d) {
        if (d.isNegative() || d.isZero()) {
            throw new IllegalArgumentException("a pin lasts a positive time, got " + d);
        }
        long s = Math.ceilDiv(d.toMillis(), 1000);
        if (s > Integer.MAX_VALUE) {
            throw new IllegalArgumentException("pin of " + d + " is longer than " + Integer.MAX_VALUE + " s; use pinnedForever()");
        }
        return new PutOptions(preferredSegment, replicas, (int) s);
    }

    /** The same options, pinned until the object is removed or replaced. */
    public PutOptions pinnedForever() {
        return new PutOptions(preferredSegment, replicas, PIN_FOREVER);
    }
}
