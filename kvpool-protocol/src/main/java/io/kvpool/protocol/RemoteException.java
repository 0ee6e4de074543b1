package io.kvpool.protocol;

/**
 * A peer answered a request with an error status. The message is the peer's own account of what was
 * wrong, prefixed with who said it.
 */
public final class RemoteException extends RuntimeException {

    private final FrameStatus status;
    private final String peer;

    public RemoteException(String peer, Opcode op, FrameStatus status, String message) {
        super(peer + " rejected " + (op == null ? "request" : op.metricName) + " (" + status + "): " + message);
        this.status = status;
        this.peer = peer;
    }

    public FrameStatus status() {
        return status;
    }

    public String peer() {
        return peer;
    }
}
