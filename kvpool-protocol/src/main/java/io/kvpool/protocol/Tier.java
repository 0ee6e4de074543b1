package io.kvpool.protocol;

/**
 * Where a replica's bytes are on its node: in the memory segment, or in the node's SSD tier. On the
 * wire a tier is one byte, its {@link #code}.
 */
public enum Tier {
    /** In the node's memory segment, at a region offset. */
    MEMORY(0, "memory"),
    /** In the node's SSD tier, found by generation (the offset is unused). */
    DISK(1, "disk");

    /** By code: the codes are the ordinals. */
    private static final Tier[] BY_CODE = values();

    /** The tier's byte on the wire. */
    public final int code;
    private final String label;

    Tier(int code, String label) {
        this.code = code;
        this.label = label;
    }

    /**
     * The tier with this wire byte.
     *
     * @throws MalformedFrameException when the code is unknown
     */
    public static Tier of(int code) {
        if (code < 0 || code >= BY_CODE.length) {
            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, "unknown tier " + code);
        }
        return BY_CODE[code];
    }

    /** The tier's lowercase display name ("memory", "disk"), as in logs and metric labels. */
    public String label() {
        return label;
    }
}
