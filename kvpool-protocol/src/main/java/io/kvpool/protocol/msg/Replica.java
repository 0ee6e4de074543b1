package io.kvpool.protocol.msg;

import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;

/**
 * Where one copy of an object lives: a segment (by id, resolved to a node address through the
 * cluster's segment table) and the region's start offset in it.
 *
 * <pre>
 *  +-------------------+---------------------------------------+
 *  | segment id (i32)  |            offset (i64)               |
 *  +-------------------+---------------------------------------+
 * </pre>
 */
public record Replica(int segmentId, long offset) {

    public static final int WIRE_BYTES = 12;

    public void write(BodyWriter w) {
        w.i32(segmentId).i64(offset);
    }

    public static Replica read(BodyReader r) {
        return new Replica(r.i32("segment id"), r.length("offset"));
    }
}
