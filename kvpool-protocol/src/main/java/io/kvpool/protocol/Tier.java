package io.kvpool.protocol;

/**
 * Where a replica's bytes are on its node: in the memory segment, or in the node's SSD tier. On the
 * wire a tier is one byte.
 */
public final class Tier {

    /** In the node's memory segment, at a region offset. */
    public static final int MEMORY = 0;
    /** In the node's SSD tier, found by generation (the offset is unused). */
    public static final int DISK = 1;

    private Tier() {
    }

    /** Validates a tier byte from the wire. */
    public static int check(int tier) {
        if (tier != MEMORY && tier != DISK) {
            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, "unknown tier " + tier);
        }
        return tier;
    }

    public static String name(int tier) {
        return tier == DISK ? "disk" : "memory";
    }
}
