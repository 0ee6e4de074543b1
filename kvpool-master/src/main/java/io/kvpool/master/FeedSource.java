package io.kvpool.master;

import io.kvpool.protocol.BadRequestException;
import io.kvpool.protocol.msg.StandbyMessages.FeedBatch;
import io.kvpool.protocol.msg.StandbyMessages.Follow;
import io.kvpool.protocol.msg.StandbyMessages.Snapshot;
import io.kvpool.protocol.msg.StandbyMessages.SnapshotPart;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Function;

/**
 * The leader's side of the hot standby: FEED_FOLLOW from the {@link ChangeFeed}, FEED_SNAPSHOT from the index,
 * the segments and the epoch. A standby turns the feed on, snapshots, then follows ({@link ChangeFeed} says why
 * that is exact); {@link Follower} is the other side.
 *
 * <p>A shard's snapshot is taken under that shard's lock, in parts when it is big: part {@code p} of {@code n}
 * holds the objects whose hash, below the shard bits, falls in the p-th of n equal ranges. A hash never changes,
 * so an object moved to another slot between two parts (a removal moves the last slot's object into the gap) is
 * still in exactly one part.
 */
final class FeedSource {

    /** Bytes a snapshot part aims at when the leader chooses the parts. */
    static final long PART_BYTES = 16 << 20;
    /** The longest a FEED_FOLLOW waits for a record. */
    static final int MAX_WAIT_MILLIS = 1000;

    private final long feedId;
    private final long term;
    private final ObjectIndex index;
    private final Segments segments;
    private final Epoch epoch;
    private final AtomicLong generations;
    /** The standbys acknowledged writes wait for. */
    private volatile SyncSet sync;

    FeedSource(long feedId, long term, ObjectIndex index, Segments segments, Epoch epoch, AtomicLong generations) {
        this.sync = new SyncSet(() -> index.events.feed.end(), SyncSet.UNPUBLISHED, DEFAULT_SYNC_TIMEOUT.toNanos());
        this.feedId = feedId;
        this.term = term;
        this.index = index;
        this.segments = segments;
        this.epoch = epoch;
        this.generations = generations;
    }

    /** How long a write waits for a standby in sync before the standby is dropped from the set. */
    static final java.time.Duration DEFAULT_SYNC_TIMEOUT = java.time.Duration.ofMillis(100);

    ChangeFeed feed() {
        return index.events.feed;
    }

    /** From now on the standbys in sync are made known through {@code p} (an elected master: etcd), waiting {@code timeout}. */
    void publishSyncTo(SyncSet.Publisher p, java.time.Duration timeout) {
        this.sync = new SyncSet(() -> index.events.feed.end(), p, timeout.toNanos());
    }

    SyncSet sync() {
        return sync;
    }

    /**
     * Called after a write and before its acknowledgement: returns once every standby in sync has read the write's
     * records (every record in the feed now), or has been dropped from the set.
     */
    void replicated() throws IOException {
        SyncSet s = sync;
        ChangeFeed f = feed();
        if (f.on()) {
            s.await(f.end());
        }
    }

    FeedBatch follow(Follow f) throws InterruptedException, IOException {
        ChangeFeed feed = feed();
        if (f.from() < 0) {
            return new FeedBatch(feedId, term, false, feed.start(), 0, new byte[0]);
        }
        if (!feed.on()) {
            // positions of a feed that was never turned on here: another incarnation's
            return new FeedBatch(feedId, term, true, feed.end(), 0, new byte[0]);
        }
        if (f.from() > feed.end()) {
            throw new BadRequestException("feed position " + f.from() + " is past the end of this master's feed ("
                    + feed.end() + "): it is another master's");
        }
        sync.acked(f.follower(), f.from()); // it applied every record below from
        ChangeFeed.Batch b = feed.read(f.from(), f.maxBytes(),
                TimeUnit.MILLISECONDS.toNanos(Math.min(f.waitMillis(), MAX_WAIT_MILLIS)));
        return new FeedBatch(feedId, term, b.behind(), b.next(), b.count(), b.records());
    }

    SnapshotPart snapshot(Snapshot s) {
        if (s.shard() >= ObjectIndex.SHARDS) {
            throw new BadRequestException("shard " + s.shard() + "; the index has " + ObjectIndex.SHARDS);
        }
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        if (s.shard() < 0) {
            epoch.shared().lock(); // segments and the epoch change only under the write lock
            try {
                int n = 0;
                for (Segment seg : segments.all()) {
                    out.writeBytes(FeedRecords.segment(seg));
                    n++;
                }
                out.writeBytes(FeedRecords.epoch(epoch.current(), generations.get()));
                return new SnapshotPart(feedId, 1, n + 1, out.toByteArray());
            } finally {
                epoch.shared().unlock();
            }
        }
        @SuppressWarnings("GuardedBy") // atShard runs it under the shard's lock, out of the checker's sight
        Function<ObjectIndex.Shard, SnapshotPart> part = shard -> {
            ObjectTable t = shard.objects;
            int parts = s.parts() > 0 ? s.parts() : partsFor(t);
            int n = 0;
            for (int slot = 0, size = t.size(); slot < size; slot++) {
                if (part(t.hash(slot), parts) == s.part()) {
                    out.writeBytes(FeedRecords.object(t, slot));
                    n++;
                }
            }
            return new SnapshotPart(feedId, parts, n, out.toByteArray());
        };
        if (s.parts() == 0 && s.part() != 0) {
            throw new BadRequestException("part " + s.part() + " of parts the leader chooses: ask part 0 first");
        }
        return index.atShard(s.shard(), part);
    }

    /** How many parts a shard's snapshot takes at about {@link #PART_BYTES} each. */
    private static int partsFor(ObjectTable t) {
        long bytes = 0;
        for (int slot = 0, size = t.size(); slot < size; slot++) {
            bytes += 41 + t.keyLength(slot) + 12L * (t.replicas(slot) - 1);
        }
        return (int) Math.max(1, Math.min(1 << 16, (bytes + PART_BYTES - 1) / PART_BYTES));
    }

    /** Which of {@code parts} parts an object with this hash is in (by the hash's bits below the shard bits). */
    static int part(int hash, int parts) {
        return (int) ((((long) hash << ObjectIndex.SHARD_BITS) & 0xFFFF_FFFFL) * parts >>> 32);
    }
}
