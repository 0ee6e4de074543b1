package io.kvpool.master;

import io.kvpool.config.HostPort;
import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameStatus;
import io.kvpool.protocol.MalformedFrameException;
import io.kvpool.protocol.msg.ControlToken;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * The records of the {@link ChangeFeed} and of a snapshot, each self-delimiting, little-endian as the rest of the
 * wire (docs/protocol.md section 4.40 draws them):
 * <pre>
 *  OBJECT   (1) | key (u16 len + bytes) | value length (i64) | generation (i64) | wanted (u8) | pinned until (i64)
 *               | replicas n (u8) | n x (stored segment (i32; bit 30: the SSD tier) | offset (i64))
 *  REMOVED  (2) | key (u16 len + bytes)
 *  CLEARED  (3) | shard (u8)
 *  SEGMENT  (4) | id (i32) | name (str) | address (str) | capacity (i64) | node incarnation (i64) | shm path (str)
 *               | control token (16 bytes)
 *  SEGMENT_GONE (5) | id (i32)
 *  EPOCH    (6) | epoch (i64) | generations handed out below (i64)
 * </pre>
 */
final class FeedRecords {

    static final int OBJECT = 1;
    static final int REMOVED = 2;
    static final int CLEARED = 3;
    static final int SEGMENT = 4;
    static final int SEGMENT_GONE = 5;
    static final int EPOCH = 6;

    private FeedRecords() {
    }

    /** The object in {@code slot} as it is now (caller holds its shard's lock). */
    static byte[] object(ObjectTable t, int slot) {
        int n = t.replicas(slot);
        byte[] key = t.key(slot);
        BodyWriter w = new BodyWriter(1 + 2 + key.length + 8 + 8 + 1 + 8 + 1 + 12 * n);
        w.u8(OBJECT).bytes(key).i64(t.valueLength(slot)).i64(t.generation(slot)).u8(t.wanted(slot))
                .i64(t.pinnedUntil(slot)).u8(n);
        for (int i = 0; i < n; i++) {
            w.i32(t.segment(slot, i)).i64(t.offset(slot, i));
        }
        return bytes(w);
    }

    static byte[] removed(byte[] key) {
        return bytes(new BodyWriter(3 + key.length).u8(REMOVED).bytes(key));
    }

    static byte[] cleared(int shard) {
        return new byte[]{CLEARED, (byte) shard};
    }

    static byte[] segment(Segment s) {
        BodyWriter w = new BodyWriter(128).u8(SEGMENT).i32(s.id).string(s.name).string(s.address.toString())
                .i64(s.allocator.capacity()).i64(s.nodeIncarnation).string(s.shmPath);
        s.controlToken.write(w);
        return bytes(w);
    }

    static byte[] segmentGone(int id) {
        return bytes(new BodyWriter(5).u8(SEGMENT_GONE).i32(id));
    }

    static byte[] epoch(long epoch, long generations) {
        return bytes(new BodyWriter(17).u8(EPOCH).i64(epoch).i64(generations));
    }

    private static byte[] bytes(BodyWriter w) {
        byte[] out = new byte[w.length()];
        w.buffer().get(out);
        return out;
    }

    /** A segment as a record tells it. */
    record SegmentRecord(int id, String name, HostPort address, long capacity, long nodeIncarnation, String shmPath,
                         ControlToken controlToken) {
    }

    /** What reading records finds, one call per record. */
    interface Visitor {
        void object(byte[] key, long valueLength, long generation, int wanted, long pinnedUntil, int[] segments,
                    long[] offsets);

        void removed(byte[] key);

        void cleared(int shard);

        void segment(SegmentRecord s);

        void segmentGone(int id);

        void epoch(long epoch, long generations);
    }

    /** Reads {@code count} records from {@code records}; a malformed one is an error naming it. */
    static void read(byte[] records, int count, Visitor v) {
        BodyReader r = new BodyReader(ByteBuffer.wrap(records).order(ByteOrder.LITTLE_ENDIAN));
        for (int i = 0; i < count; i++) {
            int type = r.u8("record type");
            switch (type) {
                case OBJECT -> {
                    byte[] key = r.bytes("key");
                    long length = r.length("value length");
                    long gen = r.i64("generation");
                    int wanted = r.u8("copies wanted");
                    long pin = r.i64("pinned until");
                    int n = r.u8("replica count");
                    if (n < 1 || wanted < 1) {
                        throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME,
                                "feed record " + i + ": an object with " + n + " replicas and " + wanted + " wanted");
                    }
                    int[] segs = new int[n];
                    long[] offs = new long[n];
                    for (int j = 0; j < n; j++) {
                        segs[j] = r.i32("segment");
                        offs[j] = r.length("offset");
                    }
                    v.object(key, length, gen, wanted, pin, segs, offs);
                }
                case REMOVED -> v.removed(r.bytes("key"));
                case CLEARED -> v.cleared(r.u8("shard"));
                case SEGMENT -> v.segment(new SegmentRecord(r.i32("segment id"), r.string("name"),
                        HostPort.parse(r.string("address")), r.length("capacity"), r.i64("node incarnation"),
                        r.string("shm path"), ControlToken.read(r)));
                case SEGMENT_GONE -> v.segmentGone(r.i32("segment id"));
                case EPOCH -> v.epoch(r.i64("epoch"), r.i64("generations"));
                default -> throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME,
                        "feed record " + i + " of " + count + ": unknown type " + type);
            }
        }
        r.end("feed records");
    }
}
