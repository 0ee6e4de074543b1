package io.kvpool.protocol;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;

/**
 * Reads a frame body written by {@link BodyWriter}. Every read is bounds-checked: a body that ends
 * early or carries an impossible count raises {@link MalformedFrameException} naming the field, so
 * a corrupt frame never turns into an out-of-bounds access or a huge allocation.
 */
public final class BodyReader {

    private final ByteBuffer buf;

    public BodyReader(ByteBuffer buf) {
        this.buf = buf.slice().order(ByteOrder.LITTLE_ENDIAN);
    }

    private void need(int n, String field) {
        if (buf.remaining() < n) {
            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME,
                    "body ends early reading " + field + " (need " + n + " bytes, " + buf.remaining() + " left)");
        }
    }

    public int u8(String field) {
        need(1, field);
        return buf.get() & 0xFF;
    }

    public boolean bool(String field) {
        int v = u8(field);
        if (v > 1) {
            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, field + " must be 0 or 1, got " + v);
        }
        return v == 1;
    }

    public int u16(String field) {
        need(2, field);
        return buf.getShort() & 0xFFFF;
    }

    public int i32(String field) {
        need(4, field);
        return buf.getInt();
    }

    public long i64(String field) {
        need(8, field);
        return buf.getLong();
    }

    /** {@code n} i64s into {@code dst[0, n)}, in one bulk copy. */
    public void i64s(long[] dst, int n, String field) {
        need(8 * n, field);
        buf.asLongBuffer().get(dst, 0, n); // a view of this little-endian buffer: little-endian too
        buf.position(buf.position() + 8 * n);
    }

    /** A non-negative i64, e.g. a length or offset. */
    public long length(String field) {
        long v = i64(field);
        if (v < 0) {
            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, field + " is negative: " + v);
        }
        return v;
    }

    /**
     * An item count (i32) that must be non-negative and plausible: each item takes at least
     * {@code minItemBytes} of what remains of the body.
     */
    public int count(String field, int minItemBytes) {
        int n = i32(field);
        if (n < 0 || (long) n * Math.max(1, minItemBytes) > buf.remaining()) {
            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME,
                    field + " of " + n + " does not fit the " + buf.remaining() + " bytes left in the body");
        }
        return n;
    }

    public byte[] bytes(String field) {
        int len = u16(field + " length");
        need(len, field);
        byte[] b = new byte[len];
        buf.get(b);
        return b;
    }

    /**
     * A byte string (u16 length, then its bytes) read in place as its {@link KeyDigest} into {@code out[at]} and
     * {@code out[at + 1]}, with no copy of its bytes; returns its length.
     */
    public int digest(String field, long[] out, int at) {
        int len = u16(field + " length");
        need(len, field);
        int at0 = buf.position();
        KeyDigest.digest(buf, at0, len, out, at);
        buf.position(at0 + len);
        return len;
    }

    /** {@code n} bytes of a length both sides know (no length prefix): the counterpart of BodyWriter.fixed. */
    public byte[] fixed(int n, String field) {
        need(n, field);
        byte[] b = new byte[n];
        buf.get(b);
        return b;
    }

    public String string(String field) {
        return new String(bytes(field), StandardCharsets.UTF_8);
    }

    public int remaining() {
        return buf.remaining();
    }

    /** Checks that the body was consumed exactly. */
    public void end(String what) {
        if (buf.hasRemaining()) {
            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME,
                    what + " body has " + buf.remaining() + " unexpected trailing bytes");
        }
    }
}
