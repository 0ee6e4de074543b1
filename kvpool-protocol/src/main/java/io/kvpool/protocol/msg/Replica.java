package io.kvpool.protocol.msg;

import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.Tier;

/**
 * Where one copy of an object lives: a segment (by id, resolved to a node address through the
 * cluster's segment table), the tier on that node, and for the memory tier the region's start
 * offset (a disk-tier copy is found on its node by generation; its offset is 0, or, for a copy the
 * master asked the node to spill, where its memory copy was, which the node reads until it holds
 * the copy in its SSD tier).
 *
 * <pre>
 *  +-------------------+----------+---------------------------------------+
 *  | segment id (i32)  | tier(u8) |            offset (i64)               |
 *  +-------------------+----------+---------------------------------------+
 * </pre>
 */
public record Replica(int segmentId, Tier tier, long offset) {

    public static final int WIRE_BYTES = 13;

    /** A memory-tier replica. */
    public Replica(int segmentId, long offset) {
        this(segmentId, Tier.MEMORY, offset);
    }

    public boolean onDisk() {
        return tier == Tier.DISK;
    }

    public void write(BodyWriter w) {
        w.i32(segmentId).u8(tier.code).i64(offset);
    }

    public static Replica read(BodyReader r) {
        return new Replica(r.i32("segment id"), Tier.of(r.u8("tier")), r.length("offset"));
    }
}
