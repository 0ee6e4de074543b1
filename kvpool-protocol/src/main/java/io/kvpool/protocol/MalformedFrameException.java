package io.kvpool.protocol;

/**
 * A frame that breaks the protocol: bad header, a body that does not parse, an unknown opcode, a
 * length over the limit. The receiving server answers with an error reply carrying {@link #status()}
 * and this message, then closes the connection.
 */
public final class MalformedFrameException extends RuntimeException {

    private final FrameStatus status;
    private final long requestId;

    public MalformedFrameException(FrameStatus status, String message) {
        this(status, 0, message);
    }

    public MalformedFrameException(FrameStatus status, long requestId, String message) {
        super(message);
        this.status = status;
        this.requestId = requestId;
    }

    public FrameStatus status() {
        return status;
    }

    /** The request id from the header, when the header got far enough to have one; otherwise 0. */
    public long requestId() {
        return requestId;
    }
}
