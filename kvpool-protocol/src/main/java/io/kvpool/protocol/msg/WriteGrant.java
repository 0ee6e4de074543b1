package io.kvpool.protocol.msg;

import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;

import java.util.Arrays;

/**
 * The master's permission to write into part of one segment (protocol version 9): the byte range
 * {@code [offset, offset + length)} and the generations {@code [firstGeneration, firstGeneration +
 * generationCount)}, with a MAC over them, the segment's id and the master's term, keyed by a key
 * derived from the admin secret ({@link io.kvpool.protocol.WriteGrants}), so that only the master
 * (and the nodes, which check it) can make one.
 *
 * <p>A put's reservation of one region is a grant of that region and its one generation; a write
 * lease is a grant of the lease's range and its block of generations. A client relays the grant in
 * each write item; a node serving a connection that proved only the cluster secret writes nothing
 * the grant does not cover. An open pool (no secrets) sends grants with a zero MAC and checks none.
 *
 * <pre>
 *  +--------------------------------+--------------------------------+
 *  |          offset (i64)          |          length (i64)          |
 *  +--------------------------------+----------------+---------------+
 *  |     first generation (i64)     | gen count (i32)|
 *  +--------------------------------+----------------+
 *  |                   MAC (16 bytes, no length prefix)              |
 *  +-----------------------------------------------------------------+
 * </pre>
 */
public record WriteGrant(long offset, long length, long firstGeneration, int generationCount, byte[] mac) {

    public static final int MAC_BYTES = 16;
    public static final int WIRE_BYTES = 8 + 8 + 8 + 4 + MAC_BYTES;

    public WriteGrant {
        if (mac.length != MAC_BYTES) {
            throw new IllegalArgumentException("a write grant's MAC has " + MAC_BYTES + " bytes, got " + mac.length);
        }
    }

    /** No grant: what a writer that proved the admin secret (a node replicating) sends. */
    public static WriteGrant none() {
        return new WriteGrant(0, 0, 0, 0, new byte[MAC_BYTES]);
    }

    /** A grant of one region of {@code regionLength} bytes and one generation, as a put reserves it. */
    public static WriteGrant region(long offset, long regionLength, long generation, byte[] mac) {
        return new WriteGrant(offset, regionLength, generation, 1, mac);
    }

    /**
     * Whether this grant allows writing {@code regionLength} bytes at {@code at} under
     * {@code generation}.
     */
    public boolean covers(long at, long regionLength, long generation) {
        return at >= offset && regionLength >= 0 && at - offset <= length - regionLength
                && generation >= firstGeneration && generation - firstGeneration < generationCount;
    }

    public void write(BodyWriter w) {
        w.i64(offset).i64(length).i64(firstGeneration).i32(generationCount).fixed(mac);
    }

    public static WriteGrant read(BodyReader r) {
        return new WriteGrant(r.length("grant offset"), r.length("grant length"), r.i64("grant first generation"),
                r.i32("grant generation count"), r.fixed(MAC_BYTES, "grant mac"));
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof WriteGrant g && offset == g.offset && length == g.length
                && firstGeneration == g.firstGeneration && generationCount == g.generationCount
                && Arrays.equals(mac, g.mac);
    }

    @Override
    public int hashCode() {
        return Long.hashCode(offset) * 31 + Long.hashCode(firstGeneration);
    }

    @Override
    public String toString() {
        return "WriteGrant[offset=" + offset + ", length=" + length + ", generations=" + firstGeneration + "+"
                + generationCount + "]";
    }
}
