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
 * <p>The copy also keeps each segment's allocator as the leader's stands, so that a promotion need not rebuild them
 * (seconds at ten million objects, {@link RegionsBuild}). Not from the start: a snapshot is taken shard by shard while
 * the leader changes, and the records from the snapshot's start restate changes some shards already show, so replaying
 * them over allocators could free a region another object took meanwhile. Once the follower has applied the feed up to
 * a position read after the snapshot's last part (a batch that held all there was), the copy is the leader's state at
 * one moment: the allocators are then built in one pass ({@link #settle}) and kept record by record from there: an object record
 * frees the regions the copy held for the key and reserves the ones it names, a removal or a cleared shard frees, a
 * segment record adds an allocator. A region that does not fit (which a consistent copy never meets) drops the kept
 * allocators, and a promotion rebuilds them as before.
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
    /** Each segment's allocator, kept from the records once the copy settled; null before, or after a misfit. */
    private volatile Map<Integer, RangeAllocator> allocators;
    /** Regions that did not fit the kept allocators (each one dropped them). */
    private final AtomicLong misfits = new AtomicLong();

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
        allocators = null;
    }

    /**
     * Builds every segment's allocator from the objects the copy holds; from now on records keep them. Called once the
     * copy is the leader's state at one moment: when it applied the feed up to a position read after the snapshot's
     * last part.
     */
    void settle() {
        Map<Integer, RangeAllocator> built = new ConcurrentHashMap<>();
        segments.values().forEach(r -> built.put(r.id(), new RangeAllocator(r.capacity())));
        long unplaced = RegionsBuild.reserveAll(index, built::get);
        if (unplaced > 0) {
            misfits.addAndGet(unplaced);
            return; // a promotion rebuilds them, and finds the same: nothing better to keep
        }
        allocators = built;
    }

    /** The allocators the copy kept, or null (not settled, or a region did not fit). For the promotion. */
    Map<Integer, RangeAllocator> allocators() {
        return allocators;
    }

    /** Regions that did not fit the kept allocators since the copy was made. */
    long misfits() {
        return misfits.get();
    }

    /** Frees the memory regions of {@code slot} in the kept allocators. Under the slot's shard lock. */
    private void freeRegions(Map<Integer, RangeAllocator> kept, ObjectTable t, int slot) {
        for (int i = 0, n = t.replicas(slot); i < n; i++) {
            int stored = t.segment(slot, i);
            RangeAllocator a = StoredSegment.onDisk(stored) ? null : kept.get(StoredSegment.id(stored));
            if (a != null) {
                try {
                    a.free(t.offset(slot, i), t.regionLength(slot));
                } catch (IllegalStateException notHeld) {
                    misfit(); // a region the allocator did not hold: not the leader's any more
                }
            }
        }
    }

    /** Reserves the memory regions of {@code slot}; false when one does not fit. Under the slot's shard lock. */
    private boolean reserveRegions(Map<Integer, RangeAllocator> kept, ObjectTable t, int slot) {
        boolean fits = true;
        for (int i = 0, n = t.replicas(slot); i < n; i++) {
            int stored = t.segment(slot, i);
            if (!StoredSegment.onDisk(stored)) {
                RangeAllocator a = kept.get(StoredSegment.id(stored));
                fits &= a != null && a.reserve(t.offset(slot, i), t.regionLength(slot));
            }
        }
        return fits;
    }

    /** A region did not fit: the kept allocators are not the leader's, so none are kept. */
    private void misfit() {
        misfits.incrementAndGet();
        allocators = null;
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
            Map<Integer, RangeAllocator> kept = allocators;
            int slot = t.find(key, hash);
            if (slot >= 0) {
                if (kept != null) {
                    freeRegions(kept, t, slot);
                }
                t.replace(slot, valueLength, generation, 0, segs, offs, segs.length);
            } else {
                slot = t.insert(key, hash, valueLength, generation, 0, segs, offs, segs.length);
            }
            if (kept != null && !reserveRegions(kept, t, slot)) {
                misfit();
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
                Map<Integer, RangeAllocator> kept = allocators;
                if (kept != null) {
                    freeRegions(kept, s.objects, slot);
                }
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
            Map<Integer, RangeAllocator> kept = allocators;
            if (kept != null) {
                for (int slot = 0; slot < s.objects.size(); slot++) {
                    freeRegions(kept, s.objects, slot);
                }
            }
            s.objects.clear();
            return null;
        };
        index.atShard(shard, clear);
        applied.incrementAndGet();
    }

    @Override
    public void segment(SegmentRecord s) {
        segments.put(s.id(), s);
        Map<Integer, RangeAllocator> kept = allocators;
        if (kept != null) {
            kept.putIfAbsent(s.id(), new RangeAllocator(s.capacity()));
        }
        applied.incrementAndGet();
    }

    @Override
    public void segmentGone(int id) {
        segments.remove(id);
        Map<Integer, RangeAllocator> kept = allocators;
        if (kept != null) {
            kept.remove(id);
        }
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
