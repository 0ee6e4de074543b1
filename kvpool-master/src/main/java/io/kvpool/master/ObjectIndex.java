package io.kvpool.master;

import java.util.HashMap;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The master's object metadata: complete objects and reserved (pending) puts, by key, in
 * {@link #SHARDS} independently locked shards. Pending puts live apart from complete objects, so a
 * lookup can never see an object whose bytes are not all written.
 *
 * <p>Locking: a shard's lock guards both of its maps and every mutable field of the entries in them.
 * It is held for map operations and allocator calls only, never for I/O, and never together with
 * another shard's lock.
 */
final class ObjectIndex {

    /** Number of shards; a power of two. Enough that two cores never queue on one lock for long. */
    static final int SHARDS = 64;

    /** A complete, readable object. */
    static final class ObjectEntry {
        final long valueLength;
        final long generation;
        int[] segments;
        long[] offsets;
        /** Coarse time of the last read (see {@link MasterService#accessTick}); probes never touch it. */
        int lastAccess;

        ObjectEntry(long valueLength, long generation, int[] segments, long[] offsets, int lastAccess) {
            this.valueLength = valueLength;
            this.generation = generation;
            this.segments = segments;
            this.offsets = offsets;
            this.lastAccess = lastAccess;
        }
    }

    /** A put between PUT_START and PUT_END: its space is reserved but nothing is visible. */
    static final class PendingPut {
        final long valueLength;
        final long generation;
        final long epoch;
        final int[] segments;
        final long[] offsets;
        final long deadlineMillis;

        PendingPut(long valueLength, long generation, long epoch, int[] segments, long[] offsets, long deadlineMillis) {
            this.valueLength = valueLength;
            this.generation = generation;
            this.epoch = epoch;
            this.segments = segments;
            this.offsets = offsets;
            this.deadlineMillis = deadlineMillis;
        }
    }

    static final class Shard {
        final ReentrantLock lock = new ReentrantLock();
        final HashMap<Key, ObjectEntry> objects = new HashMap<>();
        final HashMap<Key, PendingPut> pending = new HashMap<>();
    }

    private final Shard[] shards = new Shard[SHARDS];

    ObjectIndex() {
        for (int i = 0; i < SHARDS; i++) {
            shards[i] = new Shard();
        }
    }

    Shard shard(Key key) {
        return shards[key.hashCode() & (SHARDS - 1)];
    }

    /** Runs {@code body} on every shard in turn, each under its own lock. */
    void forEachShard(java.util.function.Consumer<Shard> body) {
        for (Shard s : shards) {
            s.lock.lock();
            try {
                body.accept(s);
            } finally {
                s.lock.unlock();
            }
        }
    }

    /** Complete objects, summed over shards (each read under its lock). */
    long objectCount() {
        long[] n = {0};
        forEachShard(s -> n[0] += s.objects.size());
        return n[0];
    }

    long pendingCount() {
        long[] n = {0};
        forEachShard(s -> n[0] += s.pending.size());
        return n[0];
    }
}
