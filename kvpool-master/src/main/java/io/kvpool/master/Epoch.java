package io.kvpool.master;

import com.google.errorprone.annotations.concurrent.GuardedBy;

import java.util.concurrent.locks.Lock;
import java.util.concurrent.locks.ReentrantReadWriteLock;
import java.util.function.Consumer;

/**
 * The cluster epoch and the lock that fences it (see "Epoch fencing" in {@link MasterService}).
 *
 * <p>Owns the epoch number, whether it is known yet, and the read-write lock. Every operation that
 * allocates, completes or adopts objects holds the lock {@link #shared()}; what moves the epoch or
 * changes the set of segments holds it {@link #exclusive()}: a forced removeAll, a node's
 * registration and inventory, and dropping a node. So each of those happens entirely before or
 * entirely after the others.
 *
 * <p>Invariants: the epoch only rises. After {@link #reset} no object, allocation or spill of an
 * older epoch is left (pending puts stay, so that their PUT_END can be answered FENCED). A restarted
 * master does not know the epoch until the first node registers, and then adopts the one it reports.
 *
 * <p>Locks: this is the outermost of the master's locks, taken before the eviction lock and before
 * any shard's lock, never under them.
 */
final class Epoch {

    private final ReentrantReadWriteLock lock = new ReentrantReadWriteLock();
    /** Read without the lock (it is volatile); written only under the write lock. */
    private volatile long value;
    /** False until the first node registers after a (re)start: then we adopt the epoch nodes report. */
    @GuardedBy("exclusive()")
    private boolean known;

    private final ObjectIndex index;
    private final Segments segments;
    private final SpillLedger spills;

    Epoch(ObjectIndex index, Segments segments, SpillLedger spills) {
        this.index = index;
        this.segments = segments;
        this.spills = spills;
    }

    long current() {
        return value;
    }

    /** The read lock: held by whatever must happen entirely before or entirely after a reset. */
    Lock shared() {
        return lock.readLock();
    }

    /** The write lock: held to move the epoch or change the set of segments. */
    Lock exclusive() {
        return lock.writeLock();
    }

    /**
     * Drops every object and spill in flight, resets every allocator and moves to {@code newEpoch}.
     * Returns the number of objects dropped.
     */
    @GuardedBy("exclusive()")
    long reset(long newEpoch) {
        spills.clear();
        long n = index.objectCount();
        // pending puts stay, so their PUT_END can be answered FENCED; their space is void
        @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
        Consumer<ObjectIndex.Shard> clear = shard -> shard.objects.clear();
        index.forEachShard(clear);
        index.events.lost.revokePrefix(new byte[0]); // their copies are of the old epoch too
        segments.resetAllocators();
        value = newEpoch;
        restated();
        index.events.allCleared(); // under the write lock: nothing is stored meanwhile (ObjectEvents)
        return n;
    }

    /** A promoted standby's: the epoch its copy of the previous leader had, known (not taken from the first node). */
    @GuardedBy("exclusive()")
    void takeOver(long e) {
        value = e;
        known = true;
    }

    /** The epoch moved: standby masters hear it (with generations 0: the snapshot and the objects tell those). */
    private void restated() {
        if (index.events.feed.on()) {
            index.events.feed.append(FeedRecords.epoch(value, 0));
        }
    }

    /**
     * Takes in the epoch a registering node reports: the first node after a (re)start sets it; a node
     * that saw a later reset than ours (we restarted since) voids what was rebuilt from older epochs.
     * Returns true when that {@link #reset} happened.
     */
    @GuardedBy("exclusive()")
    boolean adopt(long reported) {
        if (!known) {
            value = Math.max(value, reported);
            known = true;
            restated();
            return false;
        }
        if (reported > value) {
            reset(reported);
            return true;
        }
        return false;
    }
}
