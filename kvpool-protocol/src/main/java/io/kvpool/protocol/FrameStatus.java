package io.kvpool.protocol;

/**
 * The status field of a reply header. {@link #OK} means the body holds the operation's reply;
 * every other status means the body holds a UTF-8 message that says what was wrong. Outcomes that
 * are expected in normal operation (a miss, "already exists", "pool full") are never frame
 * statuses: they are {@link ResultCode}s inside an OK reply's body.
 */
public enum FrameStatus {
    /** The request was carried out; the body is the operation's reply. */
    OK(0),
    /** The frame could not be parsed (bad magic, truncated body, field out of range). Connection closed. */
    MALFORMED_FRAME(1),
    /** The header names a protocol version this side does not speak. Connection closed. */
    UNSUPPORTED_VERSION(2),
    /** The opcode is not one this server handles. Connection closed. */
    UNKNOWN_OPCODE(3),
    /** The body or payload length exceeds the receiver's limit. Connection closed. */
    FRAME_TOO_LARGE(4),
    /** The request was well formed but its contents are invalid (key too long, offset outside the segment). */
    BAD_REQUEST(5),
    /** The server failed while handling the request; the message says how. */
    INTERNAL_ERROR(6),
    /**
     * (version 8) The connection has not proven the secret this request needs (none yet, or the
     * cluster secret where the admin secret is needed), or a proof failed. Connection closed.
     */
    UNAUTHORIZED(7);

    private static final FrameStatus[] BY_CODE = new FrameStatus[8];

    static {
        for (FrameStatus s : values()) {
            BY_CODE[s.code] = s;
        }
    }

    public final int code;

    FrameStatus(int code) {
        this.code = code;
    }

    /** The status with this code, or {@link #INTERNAL_ERROR} for codes this version does not know. */
    public static FrameStatus of(int code) {
        return code >= 0 && code < BY_CODE.length && BY_CODE[code] != null ? BY_CODE[code] : INTERNAL_ERROR;
    }
}
