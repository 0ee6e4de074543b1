package io.kvpool.master;

import io.kvpool.master.FeedRecords.SegmentRecord;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Function;

/**
 * A standby master's copy of the leader's metadata, kept by applying the leader's records ({@link ChangeFeed},
 * {@link FeedSource}): the objects in an index of its own, the segments by id, the epoch, and the highest
 * generation seen. Records are full states, so applying one is an upsert or a removal, never arithmetic: an
 * object record replaces whatever the copy held for the key (length, generation, replicas, copies wanted, pin).
 *
 * <p>Not thread-safe for writers: one follower applies records in feed order. Readers (status pages, the
 * promotion) read the index under its shard locks and the other fields as volatile or concurrent values.
 */
final class StandbyCopy implements FeedRecords.Visitor {

    final ObjectIndex index;
    final Map<Integer, SegmentRecord> segments = new ConcurrentHashMap<>();
    private volatile long epoch;
    /** The leader's generation counter as its last snapshot said, and the highest generation of any object seen. */
    private volatile long generations;
    /** Records applied since the copy was made or last cleared. */
    private final AtomicLong applied = new AtomicLong();

    StandbyCopy(ObjectIndex index) {
        this.index = index;
    }

    long epoch() {
        return epoch;
    }

    /** Generations the leader may have handed out: a promoted master hands out only higher ones. */
    long generations() {
        return generations;
    }

    long applied() {
        return applied.get();
    }

    long objects() {
        return index.objectCount();
    }

    /** Forgets everything (before a fresh snapshot). */
    void clear() {
        @SuppressWarnings("GuardedBy") // forEachShard runs it under the shard's lock, out of the checker's sight
        java.util.function.Consumer<ObjectIndex.Shard> clear = s -> s.objects.clear();
        index.forEachShard(clear);
        segments.clear();
        epoch = 0;
        generations = 0;
        applied.set(0);
    }

    /** Applies {@code count} records; a malformed one is an error, and the records before it stay applied. */
    void apply(byte[] records, int count) {
        FeedRecords.read(records, count, this);
    }

    @Override
    public void object(byte[] key, long valueLength, long generation, int wanted, long pinnedUntil, int[] segs,
                       long[] offs) {
        int hash = index.hash(key);
        @SuppressWarnings("GuardedBy") // withShard runs it under the shard's lock, out of the checker's sight
        Function<ObjectIndex.Shard, Void> put = s -> {
            ObjectTable t = s.objects;
            int slot = t.find(key, hash);
            if (slot >= 0) {
                t.replace(slot, valueLength, generation, 0, segs, offs, segs.length);
            } else {
                slot = t.insert(key, hash, valueLength, generation, 0, segs, offs, segs.length);
            }
            if (t.wanted(slot) != wanted) {
                t.setWanted(slot, wanted);
            }
            t.pin(slot, pinnedUntil);
            return null;
        };
        index.withShard(hash, put);
        if (generation > generations) {
            generations = generation;
        }
        applied.incrementAndGet();
    }

    @Override
    public void removed(byte[] key) {
        int hash = index.hash(key);
        @SuppressWarnings("GuardedBy") // withShard runs it under the shard's lock, out of the checker's sight
        Function<ObjectIndex.Shard, Void> remove = s -> {
            int slot = s.objects.find(key, hash);
            if (slot >= 0) {
                s.objects.remove(slot);
            }
            return null;
        };
        index.withShard(hash, remove);
        applied.incrementAndGet();
    }

    @Override
    public void cleared(int shard) {
        if (shard >= ObjectIndex.SHARDS) {
            throw new IllegalArgumentException("feed record: shard " + shard + " of " + ObjectIndex.SHARDS);
        }
        @SuppressWarnings("GuardedBy") // atShard runs it under the shard's lock, out of the checker's sight
        Function<ObjectIndex.Shard, Void> clear = s -> {
            s.objects.clear();
            return null;
        };
        index.atShard(shard, clear);
        applied.incrementAndGet();
    }

    @Override
    public void segment(SegmentRecord s) {
        segments.put(s.id(), s);
        applied.incrementAndGet();
    }

    @Override
    public void segmentGone(int id) {
        segments.remove(id);
        applied.incrementAndGet();
    }

    @Override
    public void epoch(long epoch, long generations) {
        this.epoch = epoch;
        if (generations > this.generations) {
            this.generations = generations;
        }
        applied.incrementAndGet();
    }
}
