package io.kvpool.protocol;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;

/**
 * One request received by a {@link FrameServer}, handed to a {@link RequestHandler}. The handler
 * reads the body, consumes exactly the declared payload (into a segment, or by skipping it), and
 * sends exactly one reply (or, for a request answered only with news, {@link #answerNothing}). Valid only during the handler call.
 */
public final class Request {

    private final Wire wire;
    private final String peer;
    private final Opcode opcode;
    private final long requestId;
    private final BodyReader body;
    private final long payloadLength;
    private final ByteBuffer replyHeader;
    private final ByteBuffer scratch;
    private final Access access;
    private long payloadRead;
    private boolean replied;

    Request(Wire wire, String peer, Opcode opcode, long requestId, BodyReader body, long payloadLength,
            ByteBuffer replyHeader, ByteBuffer scratch, Access access) {
        this.wire = wire;
        this.peer = peer;
        this.opcode = opcode;
        this.requestId = requestId;
        this.body = body;
        this.payloadLength = payloadLength;
        this.replyHeader = replyHeader;
        this.scratch = scratch;
        this.access = access;
    }

    /**
     * What the connection had proven when this request arrived ({@link Access#ADMIN} on a server
     * without secrets): handlers that grant less than their opcode's level allows (a node writing for
     * a cluster-secret client only what a write grant covers) ask here.
     */
    public Access access() {
        return access;
    }

    public Opcode opcode() {
        return opcode;
    }

    public long requestId() {
        return requestId;
    }

    public BodyReader body() {
        return body;
    }

    /** The remote address, for messages. */
    public String peer() {
        return peer;
    }

    public long payloadLength() {
        return payloadLength;
    }

    public long payloadRemaining() {
        return payloadLength - payloadRead;
    }

    /**
     * Reads the next {@code dst.byteSize()} bytes of payload from the socket straight into {@code dst}
     * (typically a slice of the node's segment): no heap copy.
     */
    public void readPayload(MemorySegment dst) throws IOException {
        if (dst.byteSize() > payloadRemaining()) {
            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, opcode.metricName + " from " + peer
                    + " declares " + payloadLength + " payload bytes but its items need more");
        }
        Channels.readFully(wire.in(), dst);
        payloadRead += dst.byteSize();
    }

    /** Reads and drops {@code n} payload bytes (an item that will not be stored). */
    public void skipPayload(long n) throws IOException {
        if (n > payloadRemaining()) {
            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, opcode.metricName + " from " + peer
                    + " declares " + payloadLength + " payload bytes but its items need more");
        }
        Channels.skip(wire.in(), n, scratch);
        payloadRead += n;
    }

    /** Sends an OK reply with {@code reply} as body and no payload. */
    public void reply(BodyWriter reply) throws IOException {
        reply(reply, new ByteBuffer[0]);
    }

    /**
     * Sends an OK reply whose payload is {@code payload} (for a node read: views over its segment),
     * written with one gathering write and no heap copy.
     */
    public void reply(BodyWriter reply, ByteBuffer... payload) throws IOException {
        checkNotReplied();
        long n = 0;
        for (ByteBuffer b : payload) {
            n += b.remaining();
        }
        ByteBuffer bodyBuf = reply.buffer();
        FrameHeader.write(replyHeader, opcode.code, true, FrameStatus.OK.code, requestId, bodyBuf.remaining(), n);
        ByteBuffer[] all = new ByteBuffer[2 + payload.length];
        all[0] = replyHeader;
        all[1] = bodyBuf;
        System.arraycopy(payload, 0, all, 2, payload.length);
        replied = true;
        Channels.writeFully(wire.out(), all);
    }

    /**
     * Answers with nothing at all: for a request whose opcode is answered only when there is news (NODE_BEACON,
     * docs/protocol.md section 4.42), when there is none. It counts as this request's one reply.
     */
    public void answerNothing() {
        checkNotReplied();
        if (payloadLength != 0) {
            throw new IllegalStateException(opcode.metricName + " with payload must be answered");
        }
        replied = true;
    }

    /** Sends an error reply with a message. */
    public void replyError(FrameStatus status, String message) throws IOException {
        checkNotReplied();
        replied = true;
        FrameServer.writeError(wire.out(), replyHeader, opcode.code, requestId, status, message);
    }

    private void checkNotReplied() {
        if (replied) {
            throw new IllegalStateException("second reply to " + opcode.metricName + " request " + requestId);
        }
    }

    boolean replied() {
        return replied;
    }
}
