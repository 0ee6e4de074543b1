package io.kvpool.protocol.msg;

import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameStatus;
import io.kvpool.protocol.MalformedFrameException;

import java.util.ArrayList;
import java.util.List;
import java.util.UUID;

/**
 * LEASE (0x03): a client's read lease and the invalidations that travel with it. The rule these
 * frames carry is described in docs/architecture.md ("Read leases"); the layouts are drawn in
 * docs/protocol.md, section 4.25.
 *
 * <pre>
 * request                                   reply
 * +--------------------------------+        +--------------------------------+
 * | session id (16: two i64)       |        | master incarnation (i64)       |
 * | master incarnation known (i64) |        | sequence after this reply (i64)|
 * | sequence applied (i64)         |        | lease millis (i32)             |
 * | hold millis (i32)              |        | flags (u8): 1 RESYNC           |
 * | flags (u8): 1 END              |        | record count (i32)             |
 * +--------------------------------+        | records ...                    |
 *                                           +--------------------------------+
 * record: sequence (i64), kind (u8: 1 KEYS, 2 PREFIX, 3 ALL), then
 *         KEYS: count (i32) and that many keys; PREFIX: one byte string; ALL: nothing
 * </pre>
 */
public final class LeaseMessages {

    private LeaseMessages() {
    }

    /** Request flag: the client is closing; the master stops counting on it at once. */
    public static final int FLAG_END = 1;
    /** Reply flag: the client must drop every location it remembers (it missed records, or the master is new). */
    public static final int FLAG_RESYNC = 1;

    /**
     * A lease renewal, which is also the acknowledgement of every invalidation up to {@code appliedSeq}.
     *
     * @param session     the client's id (the one its HELLO and PING carry)
     * @param incarnation the master incarnation {@code appliedSeq} belongs to; 0 when the client has none
     * @param appliedSeq  the last invalidation sequence the client has applied
     * @param holdMillis  how long the master may hold the request waiting for a new invalidation (0: answer now)
     * @param end         the client is closing: release the session, grant nothing
     */
    public record LeaseRequest(UUID session, long incarnation, long appliedSeq, int holdMillis, boolean end) {
        public void write(BodyWriter w) {
            MasterMessages.writeUuid(w, session);
            w.i64(incarnation).i64(appliedSeq).i32(holdMillis).u8(end ? FLAG_END : 0);
        }

        public static LeaseRequest read(BodyReader r) {
            UUID id = MasterMessages.readUuid(r);
            long inc = r.i64("incarnation");
            long seq = r.i64("applied sequence");
            int hold = r.i32("hold millis");
            int flags = r.u8("flags");
            if (hold < 0) {
                throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, "lease hold millis " + hold + " is negative");
            }
            if ((flags & ~FLAG_END) != 0) {
                throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, "unknown lease flags " + flags);
            }
            return new LeaseRequest(id, inc, seq, hold, (flags & FLAG_END) != 0);
        }
    }

    /** What an invalidation covers. */
    public enum Kind {
        /** These keys. */
        KEYS(1),
        /** Every key starting with a prefix. */
        PREFIX(2),
        /** Every key. */
        ALL(3);

        public final int code;

        Kind(int code) {
            this.code = code;
        }

        static Kind of(int code) {
            for (Kind k : values()) {
                if (k.code == code) {
                    return k;
                }
            }
            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, "unknown invalidation kind " + code);
        }
    }

    /**
     * One invalidation: after it, a location remembered for a covered key must not be used.
     *
     * @param keys   for {@link Kind#KEYS}; empty otherwise
     * @param prefix for {@link Kind#PREFIX}; empty otherwise
     */
    public record Invalidation(long seq, Kind kind, List<byte[]> keys, byte[] prefix) {
        private static final byte[] NONE = new byte[0];

        public static Invalidation keys(long seq, List<byte[]> keys) {
            return new Invalidation(seq, Kind.KEYS, List.copyOf(keys), NONE);
        }

        public static Invalidation prefix(long seq, byte[] prefix) {
            return new Invalidation(seq, Kind.PREFIX, List.of(), prefix.clone());
        }

        public static Invalidation all(long seq) {
            return new Invalidation(seq, Kind.ALL, List.of(), NONE);
        }

        /** Bytes this record takes in a reply body. */
        public int wireBytes() {
            int n = 9;
            switch (kind) {
                case KEYS -> {
                    n += 4;
                    for (byte[] k : keys) {
                        n += 2 + k.length;
                    }
                }
                case PREFIX -> n += 2 + prefix.length;
                case ALL -> {
                }
            }
            return n;
        }

        void write(BodyWriter w) {
            w.i64(seq).u8(kind.code);
            switch (kind) {
                case KEYS -> new KeyList(keys).write(w);
                case PREFIX -> w.bytes(prefix);
                case ALL -> {
                }
            }
        }

        static Invalidation read(BodyReader r) {
            long seq = r.i64("invalidation sequence");
            Kind kind = Kind.of(r.u8("invalidation kind"));
            return switch (kind) {
                case KEYS -> keys(seq, KeyList.read(r).keys());
                case PREFIX -> prefix(seq, r.bytes("prefix"));
                case ALL -> all(seq);
            };
        }
    }

    /**
     * The master's answer: the invalidations after the client's {@code appliedSeq} (or RESYNC), and
     * a lease of {@code leaseMillis} counted from when the client sent the request.
     *
     * @param seq    the sequence the client is at once it applied this reply
     * @param resync the client must first drop every location it remembers; {@code records} is then empty
     */
    public record LeaseReply(long incarnation, long seq, int leaseMillis, boolean resync, List<Invalidation> records) {
        public void write(BodyWriter w) {
            w.i64(incarnation).i64(seq).i32(leaseMillis).u8(resync ? FLAG_RESYNC : 0).i32(records.size());
            for (Invalidation inv : records) {
                inv.write(w);
            }
        }

        public static LeaseReply read(BodyReader r) {
            long inc = r.i64("incarnation");
            long seq = r.i64("sequence");
            int lease = r.i32("lease millis");
            int flags = r.u8("flags");
            if ((flags & ~FLAG_RESYNC) != 0) {
                throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, "unknown lease reply flags " + flags);
            }
            int n = r.count("record count", 9);
            List<Invalidation> records = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                records.add(Invalidation.read(r));
            }
            return new LeaseReply(inc, seq, lease, (flags & FLAG_RESYNC) != 0, records);
        }
    }
}
