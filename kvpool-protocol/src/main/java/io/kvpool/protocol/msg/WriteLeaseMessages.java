package io.kvpool.protocol.msg;

import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.ResultCode;

import java.util.ArrayList;
import java.util.List;

/**
 * WRITE_LEASE (0x16), COMMIT (0x17) and RELEASE (0x18): puts under a write lease, protocol version
 * 5. The rules are in docs/architecture.md ("Write leases"); the layouts are drawn in
 * docs/protocol.md, section 4.27.
 *
 * <pre>
 * WRITE_LEASE request                      WRITE_LEASE reply
 * +--------------------------------+       +--------------------------------+
 * | preferred segment (string)     |       | result (u8)                    |
 * | least bytes (i64)              |       | -- only when result is OK: --  |
 * | wanted bytes (i64)             |       | lease id (i64)                 |
 * | generations wanted (i32)       |       | epoch (i64)                    |
 * +--------------------------------+       | term (i64, since version 6)    |
 *                                          | segment id (i32)               |
 *                                          | offset (i64), length (i64)     |
 *                                          | first generation (i64)         |
 * COMMIT request                           | generation count (i32)         |
 * +--------------------------------+       | idle timeout millis (i32)      |
 * | lease id (i64)                 |       | grant MAC (16 bytes, since 9)  |
 * | upsert (u8)                    |       +--------------------------------+
 * | item count (i32)               |
 * | items: key (u16 length, bytes),|       COMMIT reply: Codes (one result per item)
 * |   offset (i64),                |
 * |   value length (i64),          |       RELEASE request: lease id (i64)
 * |   generation (i64)             |       RELEASE reply: empty
 * +--------------------------------+
 * </pre>
 */
public final class WriteLeaseMessages {

    private WriteLeaseMessages() {
    }

    /**
     * WRITE_LEASE: a contiguous range of one segment.
     *
     * @param preferredSegment segment name to try first, or empty
     * @param leastBytes       the smallest range the writer can use (its batch's regions)
     * @param wantedBytes      what it would like, to place later puts in too; the master may give less,
     *                         never less than {@code leastBytes}
     * @param generations      generations wanted, one per object the writer expects to place
     */
    public record Grant(String preferredSegment, long leastBytes, long wantedBytes, int generations) {
        public void write(BodyWriter w) {
            w.string(preferredSegment).i64(leastBytes).i64(wantedBytes).i32(generations);
        }

        public static Grant read(BodyReader r) {
            return new Grant(r.string("preferred segment"), r.length("least bytes"), r.length("wanted bytes"),
                    r.i32("generations"));
        }
    }

    /**
     * WRITE_LEASE reply. When {@code code} is not OK (POOL_FULL, NO_SEGMENT) the other
     * fields are zero and not on the wire.
     *
     * @param idleMillis the lease is reclaimed when no COMMIT renewed it for this long
     */
    public record Granted(ResultCode code, long leaseId, long epoch, long term, int segmentId, long offset, long length,
                          long firstGeneration, int generationCount, int idleMillis, byte[] mac) {

        public static Granted refused(ResultCode code) {
            return new Granted(code, 0, 0, 0, 0, 0, 0, 0, 0, 0, new byte[WriteGrant.MAC_BYTES]);
        }

        /** The lease's range and generations as the grant a writer relays to the node (since version 9). */
        public WriteGrant grant() {
            return new WriteGrant(offset, length, firstGeneration, generationCount, mac);
        }

        public void write(BodyWriter w) {
            w.u8(code.code);
            if (code == ResultCode.OK) {
                w.i64(leaseId).i64(epoch).i64(term).i32(segmentId).i64(offset).i64(length).i64(firstGeneration)
                        .i32(generationCount).i32(idleMillis).fixed(mac);
            }
        }

        public static Granted read(BodyReader r) {
            ResultCode code = ResultCode.of(r.u8("result"));
            if (code != ResultCode.OK) {
                return refused(code);
            }
            return new Granted(code, r.i64("lease id"), r.i64("epoch"), r.i64("term"), r.i32("segment id"), r.length("offset"),
                    r.length("length"), r.i64("first generation"), r.i32("generation count"), r.i32("idle millis"),
                    r.fixed(WriteGrant.MAC_BYTES, "grant mac"));
        }
    }

    /** One object of a COMMIT: its key, where it was written in the lease, its value length and generation. */
    public record CommitItem(byte[] key, long offset, long valueLength, long generation) {
    }

    /**
     * COMMIT: objects written inside lease {@code leaseId} become visible, in order. Offsets and
     * generations rise through a lease's commits.
     *
     * @param upsert replace existing objects instead of answering ALREADY_EXISTS
     */
    public record Commit(long leaseId, boolean upsert, List<CommitItem> items) {
        /** The body's exact size (a commit of a save's thousands of objects grew its writer several times). */
        public int bodyBytes() {
            int n = 8 + 1 + 4;
            for (CommitItem it : items) {
                n += 2 + it.key.length + 3 * 8;
            }
            return n;
        }

        public void write(BodyWriter w) {
            w.i64(leaseId).bool(upsert).i32(items.size());
            for (CommitItem it : items) {
                w.bytes(it.key).i64(it.offset).i64(it.valueLength).i64(it.generation);
            }
        }

        public static Commit read(BodyReader r) {
            long id = r.i64("lease id");
            boolean upsert = r.bool("upsert");
            int n = r.count("item count", 27);
            List<CommitItem> items = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                items.add(new CommitItem(KeyList.readKey(r), r.length("offset"), r.length("value length"),
                        r.i64("generation")));
            }
            return new Commit(id, upsert, items);
        }
    }

    /** RELEASE: the writer is done with lease {@code leaseId}; what it did not commit is freed. */
    public record Release(long leaseId) {
        public void write(BodyWriter w) {
            w.i64(leaseId);
        }

        public static Release read(BodyReader r) {
            return new Release(r.i64("lease id"));
        }
    }
}
