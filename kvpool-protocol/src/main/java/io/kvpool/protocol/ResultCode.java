package io.kvpool.protocol;

/**
 * Per-item outcome inside a reply body (one byte). These are the expected outcomes of normal
 * operation, returned as values to the caller, never thrown.
 */
public enum ResultCode {
    /** Done: the object was found, reserved, completed or removed. */
    OK(0),
    /** No complete object under this key (or no region with this generation on a node). */
    NOT_FOUND(1),
    /** A put found the key already present (complete or being written). The pool was not changed. */
    ALREADY_EXISTS(2),
    /** No segment has room for the object, even after eviction. */
    POOL_FULL(3),
    /** The put started in an earlier cluster epoch; a removeAll(force) happened since, so it was discarded. */
    FENCED(4),
    /** A put's reservation is gone (it timed out, was superseded by an upsert, or its segment left). */
    EXPIRED(5),
    /**
     * No segment is registered, or the named segment cannot take the object. From a node (version 12):
     * the node takes no writes now, because it is registering with the master (and lists what it holds)
     * or draining for a restart; nothing was written, and the writer asks the master for another place.
     */
    NO_SEGMENT(6),
    /** The node could not carry out the transfer (region busy too long, I/O failure). */
    FAILED(7),
    /** The object is larger than the pool accepts (the master's max value size). */
    TOO_LARGE(8),
    /**
     * A node refused a write authorised by a master that is no longer the leader (the node knows a
     * newer term; version 6). Nothing was written; the writer asks the current leader again.
     */
    DEPOSED(9),
    /**
     * The key's tenant is at its memory quota (version 14): its namespace refuses puts over it, or could not make
     * room from its own objects. Nothing was stored, and no other tenant's object was touched.
     */
    QUOTA_EXCEEDED(10);

    private static final ResultCode[] BY_CODE = values();

    public final int code;

    ResultCode(int code) {
        this.code = code;
    }

    /**
     * The result with this code.
     *
     * @throws MalformedFrameException when the code is unknown
     */
    public static ResultCode of(int code) {
        if (code < 0 || code >= BY_CODE.length) {
            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, "unknown result code " + code);
        }
        return BY_CODE[code];
    }
}
