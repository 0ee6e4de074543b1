package io.kvpool.protocol.msg;

import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameStatus;
import io.kvpool.protocol.MalformedFrameException;

/**
 * What a standby master and the leader say to each other (version 15): FEED_FOLLOW and FEED_SNAPSHOT.
 * The records themselves (full-state records of objects, removals, cleared shards, segments, the epoch)
 * are the master's business and travel here as opaque bytes; docs/protocol.md section 4.40 draws them.
 *
 * <pre>
 *  Follow        from (i64, -1: "where does the feed end now", and turns the feed on) | max bytes (i32) | wait ms (i32)
 *                | follower (str: the standby's master id; empty for a reader that is no candidate)
 *  FeedBatch     feed id (i64) | term (i64) | behind (bool) | next (i64) | count (i32) | bytes (i32) | records
 *  Snapshot      shard (i32, -1: segments and epoch) | part (i32) | parts (i32, 0: the leader chooses)
 *  SnapshotPart  feed id (i64) | parts (i32) | count (i32) | bytes (i32) | records
 * </pre>
 * The feed id names the leader's incarnation: positions from another incarnation mean nothing, and a
 * follower that sees a new id starts over from a snapshot. {@code behind} says the position asked for
 * is no longer kept (the follower starts over too). A FEED_FOLLOW from position p tells the leader that its
 * follower applied every record below p: writes the leader acknowledges wait for that from the standbys in sync.
 */
public final class StandbyMessages {

    private StandbyMessages() {
    }

    /** Largest records part a reply carries (a frame's body is at most 64 MiB by default). */
    public static final int MAX_RECORD_BYTES = 48 << 20;

    public record Follow(long from, int maxBytes, int waitMillis, String follower) {
        public Follow {
            if (from < -1) {
                throw new IllegalArgumentException("feed position " + from);
            }
        }

        public void write(BodyWriter w) {
            w.i64(from).i32(maxBytes).i32(waitMillis).string(follower);
        }

        public static Follow read(BodyReader r) {
            long from = r.i64("feed position");
            int max = r.i32("max bytes");
            int wait = r.i32("wait millis");
            String follower = r.string("follower");
            if (from < -1 || max < 1 || wait < 0) {
                throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME,
                        "feed_follow from " + from + ", max bytes " + max + ", wait " + wait + " ms");
            }
            return new Follow(from, Math.min(max, MAX_RECORD_BYTES), wait, follower);
        }
    }

    /** Records from a position: {@code next} is where the follower asks next. */
    public record FeedBatch(long feedId, long term, boolean behind, long next, int count, byte[] records) {
        public void write(BodyWriter w) {
            w.i64(feedId).i64(term).bool(behind).i64(next).i32(count).i32(records.length).fixed(records);
        }

        public static FeedBatch read(BodyReader r) {
            long id = r.i64("feed id");
            long term = r.i64("term");
            boolean behind = r.bool("behind");
            long next = r.i64("next position");
            int count = r.i32("record count");
            int n = r.i32("record bytes");
            if (count < 0 || n < 0 || n > r.remaining()) {
                throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME,
                        count + " records in " + n + " bytes, with " + r.remaining() + " left");
            }
            return new FeedBatch(id, term, behind, next, count, r.fixed(n, "records"));
        }
    }

    public record Snapshot(int shard, int part, int parts) {
        public void write(BodyWriter w) {
            w.i32(shard).i32(part).i32(parts);
        }

        public static Snapshot read(BodyReader r) {
            int shard = r.i32("shard");
            int part = r.i32("part");
            int parts = r.i32("parts");
            if (shard < -1 || parts < 0 || part < 0 || (parts > 0 && part >= parts)) {
                throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME,
                        "feed_snapshot of shard " + shard + ", part " + part + " of " + parts);
            }
            return new Snapshot(shard, part, parts);
        }
    }

    /** Part {@code part} of {@code parts} of a shard, as records ({@code parts}: what the leader chose when asked 0). */
    public record SnapshotPart(long feedId, int parts, int count, byte[] records) {
        public void write(BodyWriter w) {
            w.i64(feedId).i32(parts).i32(count).i32(records.length).fixed(records);
        }

        public static SnapshotPart read(BodyReader r) {
            long id = r.i64("feed id");
            int parts = r.i32("parts");
            int count = r.i32("record count");
            int n = r.i32("record bytes");
            if (parts < 1 || count < 0 || n < 0 || n > r.remaining()) {
                throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME,
                        "snapshot part of " + parts + " parts: " + count + " records in " + n + " bytes, with "
                                + r.remaining() + " left");
            }
            return new SnapshotPart(id, parts, count, r.fixed(n, "records"));
        }
    }
}
