package io.kvpool.protocol.msg;

import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;

import java.security.MessageDigest;
import java.security.SecureRandom;
import java.util.Arrays;

/**
 * Whom a node takes administration from (protocol version 10): 16 random bytes a node draws for each
 * registration and sends in REGISTER_NODE. The master it registered with keeps them with the
 * segment and presents them in every NODE_FREE, NODE_RESET and NODE_REPLICATE it sends that node;
 * the node acts on such a frame only when it carries the token of its current registration (and the
 * term of that master). Anyone else who can reach the node's port, on an open pool anyone at all,
 * cannot make the node drop, free or copy anything, nor move its term.
 *
 * <p>A new registration (the master restarted or dropped the node, or a new leader was elected)
 * draws a new token, so the master the node left can no longer administer it. The token is not a
 * secret against someone who can read the traffic: that is what TLS is for (docs/security.md).
 * {@link #toString()} never shows it.
 */
public record ControlToken(byte[] bytes) {

    public static final int BYTES = 16;

    private static final SecureRandom RANDOM = new SecureRandom();

    public ControlToken {
        if (bytes == null || bytes.length != BYTES) {
            throw new IllegalArgumentException("a control token has " + BYTES + " bytes, got "
                    + (bytes == null ? "none" : bytes.length));
        }
        bytes = bytes.clone();
    }

    /** All zeros: no token. A node never draws it, so it administers nothing. */
    public static final ControlToken NONE = new ControlToken(new byte[BYTES]);

    /** A fresh token (never {@link #NONE}). */
    public static ControlToken random() {
        byte[] b = new byte[BYTES];
        do {
            RANDOM.nextBytes(b);
        } while (Arrays.equals(b, NONE.bytes));
        return new ControlToken(b);
    }

    /** Whether {@code other} is this token, compared in constant time; false for {@link #NONE} and null. */
    public boolean matches(ControlToken other) {
        return other != null && !Arrays.equals(bytes, NONE.bytes) && MessageDigest.isEqual(bytes, other.bytes);
    }

    public void write(BodyWriter w) {
        w.fixed(bytes);
    }

    public static ControlToken read(BodyReader r) {
        return new ControlToken(r.fixed(BYTES, "control token"));
    }

    @Override
    public byte[] bytes() {
        return bytes.clone();
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof ControlToken t && Arrays.equals(bytes, t.bytes);
    }

    @Override
    public int hashCode() {
        return Arrays.hashCode(bytes);
    }

    @Override
    public String toString() {
        return this.equals(NONE) ? "ControlToken[none]" : "ControlToken[hidden]";
    }
}
