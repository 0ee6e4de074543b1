package io.kvpool.protocol;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;

/**
 * Builds a frame body: little-endian fixed-width integers, and byte strings as a u16 length followed
 * by the bytes. Grows as needed. Not thread-safe; one per request.
 */
public final class BodyWriter {

    private ByteBuffer buf;

    public BodyWriter() {
        this(256);
    }

    public BodyWriter(int initialCapacity) {
        buf = ByteBuffer.allocate(Math.max(16, initialCapacity)).order(ByteOrder.LITTLE_ENDIAN);
    }

    private void ensure(int n) {
        if (buf.remaining() < n) {
            int need = buf.position() + n;
            int cap = Math.max(need, buf.capacity() * 2);
            ByteBuffer bigger = ByteBuffer.allocate(cap).order(ByteOrder.LITTLE_ENDIAN);
            buf.flip();
            bigger.put(buf);
            buf = bigger;
        }
    }

    public BodyWriter u8(int v) {
        ensure(1);
        buf.put((byte) v);
        return this;
    }

    public BodyWriter bool(boolean v) {
        return u8(v ? 1 : 0);
    }

    public BodyWriter u16(int v) {
        ensure(2);
        buf.putShort((short) v);
        return this;
    }

    public BodyWriter i32(int v) {
        ensure(4);
        buf.putInt(v);
        return this;
    }

    /** {@code a[from, from + n)} as {@code n} i64s, in one bulk copy. */
    public BodyWriter i64s(long[] a, int from, int n) {
        ensure(8 * n);
        buf.asLongBuffer().put(a, from, n); // a view of this little-endian buffer: little-endian too
        buf.position(buf.position() + 8 * n);
        return this;
    }

    public BodyWriter i64(long v) {
        ensure(8);
        buf.putLong(v);
        return this;
    }

    /** A byte string: u16 length then the bytes (at most 65,535 bytes). */
    public BodyWriter bytes(byte[] b) {
        if (b.length > 0xFFFF) {
            throw new IllegalArgumentException("byte string of " + b.length + " bytes exceeds 65535");
        }
        ensure(2 + b.length);
        buf.putShort((short) b.length);
        buf.put(b);
        return this;
    }

    /** Bytes of a length both sides know (a MAC, say): no length prefix. */
    public BodyWriter fixed(byte[] b) {
        ensure(b.length);
        buf.put(b);
        return this;
    }

    /** A UTF-8 string with a u16 length. */
    public BodyWriter string(String s) {
        return bytes(s.getBytes(StandardCharsets.UTF_8));
    }

    /** Overwrites an i32 previously written at {@code position} (for counts known only at the end). */
    public BodyWriter i32At(int position, int v) {
        buf.putInt(position, v);
        return this;
    }

    public int position() {
        return buf.position();
    }

    /** The body written so far, as a read-ready view (position 0, limit = length). */
    public ByteBuffer buffer() {
        return buf.duplicate().flip().order(ByteOrder.LITTLE_ENDIAN);
    }

    public int length() {
        return buf.position();
    }
}
