package io.kvpool.master;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.protocol.BadRequestException;

import java.util.HashMap;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.Consumer;
import java.util.function.Function;

/**
 * The master's object metadata: complete objects and reserved (pending) puts, by key, in
 * {@link #SHARDS} independently locked shards. Pending puts live apart from complete objects, so a
 * lookup can never see an object whose bytes are not all written.
 *
 * <p>Complete objects are held compactly by an {@link ObjectTable} per shard (no object per entry,
 * keys in byte slabs; see there for the layout). Pending puts, of which there are few at any time
 * (one per put in flight), stay in a {@code HashMap}.
 *
 * <p>A key's shard is the top {@value #SHARD_BITS} bits of its {@link Key#hash}; the table inside the
 * shard uses the low bits. Batch operations hash every key once and visit the keys shard by shard,
 * taking each shard's lock once per batch instead of once per key: {@link #forEachKey} for those that
 * change the index, {@link #lookupEach} for reads and probes, which looks up all of a shard's keys
 * together ({@link ObjectTable#findAll}) so that their cache misses overlap.
 *
 * <p>Locking: a shard's lock guards both of its maps and every field of the entries in them. Only
 * this class takes it: code elsewhere works on a shard inside {@link #withShard} (one key), the batch
 * visits above, or {@link #forEachShard} (every shard in turn), and is handed the shard only while
 * its lock is held. It is held for map operations, allocator calls and queueing notices to nodes
 * only, never for I/O, and never together with another shard's lock. It is the innermost of the
 * master's locks: taken under the epoch lock and the eviction lock, never the other way round.
 *
 * <p>The build checks this ({@code @GuardedBy}, Error Prone) wherever the lock is held in sight: in
 * this class, and in methods elsewhere marked {@code @GuardedBy("shard.lock")}, whose callers must
 * hold it. A visitor lambda runs under the lock as well, but the checker does not follow a lock into
 * a lambda: such lambdas are assigned to locals marked {@code @SuppressWarnings("GuardedBy")}, the
 * places where a reviewer checks by hand that the lambda is only ever handed to this class.
 */
final class ObjectIndex {

    /** Number of shards; a power of two. Enough that two cores never queue on one lock for long. */
    static final int SHARDS = 64;
    static final int SHARD_BITS = 6;

    /** A put between PUT_START and PUT_END: its space is reserved but nothing is visible. */
    static final class PendingPut {
        final long valueLength;
        final long generation;
        final long epoch;
        final int[] segments;
        final long[] offsets;
        final long deadlineMillis;
        /** An upsert: its completion invalidates the key for clients that remember where it was. */
        final boolean upsert;
        /** Copies the put asked for (it may have been placed on fewer). */
        final int wanted;
        /** The pin granted: its deadline in epoch millis (Long.MAX_VALUE: until removed), or 0. */
        final long pinUntil;

        PendingPut(long valueLength, long generation, long epoch, int[] segments, long[] offsets, long deadlineMillis,
                   boolean upsert) {
            this(valueLength, generation, epoch, segments, offsets, deadlineMillis, upsert, segments.length, 0);
        }

        PendingPut(long valueLength, long generation, long epoch, int[] segments, long[] offsets, long deadlineMillis,
                   boolean upsert, int wanted, long pinUntil) {
            this.wanted = wanted;
            this.pinUntil = pinUntil;
            this.valueLength = valueLength;
            this.generation = generation;
            this.epoch = epoch;
            this.segments = segments;
            this.offsets = offsets;
            this.deadlineMillis = deadlineMillis;
            this.upsert = upsert;
        }
    }

    /** One shard: its complete objects and its pending puts, under one lock that only the index takes. */
    static final class Shard {
        private final ReentrantLock lock = new ReentrantLock();
        @GuardedBy("lock")
        final ObjectTable objects;
        @GuardedBy("lock")
        final HashMap<Key, PendingPut> pending = new HashMap<>();

        Shard(AtomicLong poolPinned, ObjectEvents events) {
            this.objects = new ObjectTable(poolPinned, events.newShard());
        }

        /**
         * Stores a one-copy object: replaces the version at {@code slot} (the key's slot, as looked up
         * under this lock; the caller released the old version's regions) or, when {@code slot < 0}, inserts.
         */
        @GuardedBy("lock")
        void storeOneCopy(int slot, byte[] key, int hash, long valueLength, long generation, int tick, int segment,
                          long offset) {
            int[] segs = {segment};
            long[] offs = {offset};
            if (slot >= 0) {
                objects.replace(slot, valueLength, generation, tick, segs, offs, 1);
            } else {
                objects.insert(key, hash, valueLength, generation, tick, segs, offs, 1);
            }
        }

        /** The pending put of {@code key}, if any. Allocates only when some put is pending in this shard. */
        @GuardedBy("lock")
        PendingPut pending(byte[] key, int hash) {
            return pending.isEmpty() ? null : pending.get(new Key(key, hash));
        }

        /**
         * Whether the key is taken: a complete object, or a put in flight in epoch {@code epoch} (one
         * from before a reset no longer holds its key).
         */
        @GuardedBy("lock")
        boolean taken(byte[] key, int hash, long epoch) {
            if (objects.find(key, hash) >= 0) {
                return true;
            }
            PendingPut p = pending(key, hash);
            return p != null && p.epoch == epoch;
        }

        /** True if the key's complete object has this generation (a conditional upsert's precondition). */
        @GuardedBy("lock")
        boolean holds(byte[] key, int hash, long generation) {
            int slot = objects.find(key, hash);
            return slot >= 0 && objects.generation(slot) == generation;
        }

        /** For assertions: whether the calling thread holds this shard's lock. */
        boolean heldByCurrentThread() {
            return lock.isHeldByCurrentThread();
        }
    }

    /** What a batch operation does with one key, under its shard's lock. */
    @FunctionalInterface
    interface KeyVisitor {
        /** {@code index} is the key's position in the batch. */
        void visit(Shard shard, int index, byte[] key, int hash);
    }

    /** What a read-only batch operation does with one key's lookup, under its shard's lock. */
    @FunctionalInterface
    interface SlotVisitor {
        /**
         * {@code slot} is where {@code shard.objects} holds the key at batch position {@code index},
         * or -1. The visitor may read the object and {@link ObjectTable#touch} it, nothing else: the
         * other slots of the batch were looked up before it ran.
         */
        void visit(Shard shard, int index, int slot);
    }

    private final Shard[] shards = new Shard[SHARDS];
    /** Region bytes held by pins over every shard (each shard's table adds its changes). */
    private final AtomicLong pinnedBytes = new AtomicLong();
    /** What the index lists, told to a sink for routers (KV events; off until {@link ObjectEvents#publishTo}). */
    final ObjectEvents events;
    /** All ones, except in tests that force keys into few shards and few hash values. */
    private final int hashMask;

    ObjectIndex() {
        this(-1);
    }

    /**
     * Test hook: every key hash is ANDed with {@code hashMask}, so for example {@code 0} puts every key
     * in shard 0 with the same hash, and {@code 0xF} in shard 0 with 16 distinct hashes.
     */
    ObjectIndex(int hashMask) {
        this(hashMask, new ChangeFeed(ChangeFeed.DEFAULT_MAX_BYTES));
    }

    /** With a change feed of its own (tests of a small one). */
    ObjectIndex(int hashMask, ChangeFeed feed) {
        this.hashMask = hashMask;
        this.events = new ObjectEvents(feed);
        for (int i = 0; i < SHARDS; i++) {
            shards[i] = new Shard(pinnedBytes, events);
        }
    }

    /** Runs {@code body} on shard {@code i} (0 .. SHARDS-1) under its lock. */
    <T> T atShard(int i, Function<? super Shard, T> body) {
        Shard s = shards[i];
        s.lock.lock();
        try {
            return body.apply(s);
        } finally {
            s.lock.unlock();
        }
    }

    int hash(byte[] key) {
        return Key.hash(key) & hashMask;
    }

    static int shardOf(int hash) {
        return hash >>> (32 - SHARD_BITS);
    }

    /** True if a key with this hash lives in {@code shard} (for work done shard by shard). */
    boolean inShard(int hash, Shard shard) {
        return shard(hash) == shard;
    }

    private Shard shard(int hash) {
        return shards[shardOf(hash)];
    }

    /**
     * Refuses a key the index cannot hold before anything is reserved. The wire already limits keys to
     * {@value io.kvpool.protocol.Keys#MAX_KEY_BYTES} bytes; this guards direct callers.
     */
    static void checkKeyLength(byte[] key) {
        if (key.length > ObjectTable.MAX_KEY) {
            throw new BadRequestException("key of " + key.length + " bytes; the index holds keys of at most "
                    + ObjectTable.MAX_KEY);
        }
    }

    /** Runs {@code body} on the shard of a key whose hash is {@code hash}, under that shard's lock. */
    <T> T withShard(int hash, Function<? super Shard, T> body) {
        return atShard(shardOf(hash), body);
    }

    /** A batch's keys, their hashes, and their positions ordered by shard (a stable counting sort). */
    private final class Batch {
        final byte[][] keys;
        final int[] hashes;
        /** Batch positions, shard by shard; shard g's are {@code order[start[g] .. start[g+1])}. */
        final int[] order;
        final int[] start = new int[SHARDS + 1];

        <T> Batch(List<T> items, Function<? super T, byte[]> keyOf) {
            int n = items.size();
            keys = new byte[n][];
            hashes = new int[n];
            for (int i = 0; i < n; i++) {
                byte[] key = keyOf.apply(items.get(i));
                int h = hash(key);
                keys[i] = key;
                hashes[i] = h;
                start[shardOf(h) + 1]++;
            }
            for (int g = 0; g < SHARDS; g++) {
                start[g + 1] += start[g];
            }
            order = new int[n];
            int[] fill = start.clone();
            for (int i = 0; i < n; i++) {
                order[fill[shardOf(hashes[i])]++] = i;
            }
        }
    }

    /**
     * Visits every key of a batch once, grouped by shard (each shard's lock taken once), in batch
     * order within a shard, so repeated keys are seen in the order the batch gives them. For
     * operations that change the index.
     */
    <T> void forEachKey(List<T> items, Function<? super T, byte[]> keyOf, KeyVisitor v) {
        int n = items.size();
        if (n == 1) {
            byte[] key = keyOf.apply(items.getFirst());
            int h = hash(key);
            Shard s = shard(h);
            s.lock.lock();
            try {
                v.visit(s, 0, key, h);
            } finally {
                s.lock.unlock();
            }
            return;
        }
        Batch b = new Batch(items, keyOf);
        int[] scratch = new int[n];
        for (int g = 0; g < SHARDS; g++) {
            if (b.start[g] == b.start[g + 1]) {
                continue;
            }
            Shard s = shards[g];
            s.lock.lock();
            try {
                if (b.start[g + 1] - b.start[g] > 1) {
                    // the answers are stale after the first change, but the cache is warm for the lookups to come
                    s.objects.findAll(b.keys, b.hashes, b.order, b.start[g], b.start[g + 1], scratch);
                }
                for (int j = b.start[g]; j < b.start[g + 1]; j++) {
                    int i = b.order[j];
                    v.visit(s, i, b.keys[i], b.hashes[i]);
                }
            } finally {
                s.lock.unlock();
            }
        }
    }

    /** {@link #forEachKey(List, Function, KeyVisitor)} for a plain list of keys. */
    void forEachKey(List<byte[]> keys, KeyVisitor v) {
        forEachKey(keys, Function.identity(), v);
    }

    /**
     * Looks every key of a batch up, shard by shard (each shard's lock taken once, all of its keys
     * looked up together by {@link ObjectTable#findAll}), and hands each answer to {@code v} under
     * that lock. For operations that only read (and touch) objects.
     */
    void lookupEach(List<byte[]> keys, SlotVisitor v) {
        int n = keys.size();
        if (n == 1) {
            byte[] key = keys.getFirst();
            int h = hash(key);
            Shard s = shard(h);
            s.lock.lock();
            try {
                v.visit(s, 0, s.objects.find(key, h));
            } finally {
                s.lock.unlock();
            }
            return;
        }
        Batch b = new Batch(keys, Function.identity());
        int[] slots = new int[n];
        for (int g = 0; g < SHARDS; g++) {
            if (b.start[g] == b.start[g + 1]) {
                continue;
            }
            Shard s = shards[g];
            s.lock.lock();
            try {
                s.objects.findAll(b.keys, b.hashes, b.order, b.start[g], b.start[g + 1], slots);
                for (int j = b.start[g]; j < b.start[g + 1]; j++) {
                    v.visit(s, b.order[j], slots[j]);
                }
            } finally {
                s.lock.unlock();
            }
        }
    }

    /**
     * Looks up keys given by their digests ({@code digests[2i]} low half, {@code digests[2i + 1]} high
     * half of key i, for i in {@code [from, to)}), shard by shard under each shard's lock, and hands
     * {@code v} each answer (position relative to {@code from}). For the lookups by digest.
     */
    void lookupDigests(long[] digests, int from, int to, SlotVisitor v) {
        int n = to - from;
        int[] hashes = new int[n];
        int[] start = new int[SHARDS + 1];
        for (int i = 0; i < n; i++) {
            hashes[i] = (int) digests[2 * (from + i)] & hashMask;
            start[shardOf(hashes[i]) + 1]++;
        }
        for (int g = 0; g < SHARDS; g++) {
            start[g + 1] += start[g];
        }
        int[] order = new int[n];
        int[] fill = start.clone();
        for (int i = 0; i < n; i++) {
            order[fill[shardOf(hashes[i])]++] = i;
        }
        for (int g = 0; g < SHARDS; g++) {
            if (start[g] == start[g + 1]) {
                continue;
            }
            Shard s = shards[g];
            s.lock.lock();
            try {
                for (int j = start[g]; j < start[g + 1]; j++) {
                    int i = order[j];
                    v.visit(s, i, s.objects.findDigest(digests[2 * (from + i)], digests[2 * (from + i) + 1], hashes[i]));
                }
            } finally {
                s.lock.unlock();
            }
        }
    }

    /** Runs {@code body} on every shard in turn, each under its own lock. */
    void forEachShard(Consumer<Shard> body) {
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
        @SuppressWarnings("GuardedBy") // forEachShard runs it under the shard's lock, out of the checker's sight
        Consumer<Shard> count = s -> n[0] += s.objects.size();
        forEachShard(count);
        return n[0];
    }

    /** Region bytes the pinned objects hold (times their copies wanted), without taking a lock. */
    long pinnedBytes() {
        return pinnedBytes.get();
    }

    long pendingCount() {
        long[] n = {0};
        @SuppressWarnings("GuardedBy") // forEachShard runs it under the shard's lock, out of the checker's sight
        Consumer<Shard> count = s -> n[0] += s.pending.size();
        forEachShard(count);
        return n[0];
    }
}
