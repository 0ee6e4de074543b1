package io.kvpool.master;

import io.kvpool.protocol.Tier;

import java.util.Arrays;

/**
 * Regions freed by a bulk removal (removeByPrefix, removeAll without force, an eviction round),
 * collected first and returned to the allocators in (segment, offset) order. Freed in key-hash order,
 * a million regions would shatter each segment's free list into hundreds of thousands of ranges and
 * every free would pay for that; freed in offset order, each region merges with the one freed just
 * before it and the free list stays short.
 */
final class FreeBatch {

    /** Whether a memory copy about to be freed goes to its node's SSD tier instead of being dropped. */
    @FunctionalInterface
    interface SpillChoice {
        /** Decides for the copy on {@code segmentId} of the object in {@code slot} (under its shard's lock). */
        boolean spills(ObjectTable objects, int slot, int segmentId);

        /** Drops every copy (an explicit removal). */
        SpillChoice NEVER = (objects, slot, segmentId) -> false;
    }

    private int[] segments = new int[1024];
    private long[] offsets = new long[1024];
    private long[] lengths = new long[1024];
    private long[] generations = new long[1024];
    /** Bit 0: the copy is on disk (no allocator space); bit 1: spill a memory copy to the node's SSD tier. */
    private byte[] flags = new byte[1024];
    private int size;

    void add(int segment, long offset, long length, long generation, Tier tier, boolean spill) {
        if (size == segments.length) {
            int cap = size * 2;
            segments = Arrays.copyOf(segments, cap);
            offsets = Arrays.copyOf(offsets, cap);
            lengths = Arrays.copyOf(lengths, cap);
            generations = Arrays.copyOf(generations, cap);
            flags = Arrays.copyOf(flags, cap);
        }
        segments[size] = segment;
        offsets[size] = offset;
        lengths[size] = length;
        generations[size] = generation;
        flags[size] = (byte) ((tier == Tier.DISK ? 1 : 0) | (spill ? 2 : 0));
        size++;
    }

    int size() {
        return size;
    }

    /**
     * Queues every copy of the complete object in {@code slot}: disk copies to be dropped, memory copies
     * to be freed or, where {@code spill} says so, moved to their node's SSD tier. Returns the memory
     * bytes the batch will free. Caller holds the lock of the shard whose table is {@code objects}.
     */
    long addObject(ObjectTable objects, int slot, SpillChoice spill) {
        long len = objects.regionLength(slot);
        long generation = objects.generation(slot);
        long memory = 0;
        for (int i = 0, n = objects.replicas(slot); i < n; i++) {
            int stored = objects.segment(slot, i);
            if (StoredSegment.onDisk(stored)) {
                add(StoredSegment.id(stored), objects.offset(slot, i), 0, generation, Tier.DISK, false);
            } else {
                add(stored, objects.offset(slot, i), len, generation, Tier.MEMORY, spill.spills(objects, slot, stored));
                memory += len;
            }
        }
        return memory;
    }

    /** The copies an evicted object keeps: the SSD-tier copies it had, and one for each memory copy spilled. */
    static final class Kept {
        int[] segments = new int[4];
        long[] offsets = new long[4];
        int size;

        private void add(int segment, long offset) {
            if (size == segments.length) {
                segments = Arrays.copyOf(segments, size * 2);
                offsets = Arrays.copyOf(offsets, size * 2);
            }
            segments[size] = segment;
            offsets[size] = offset;
            size++;
        }
    }

    /**
     * Queues the memory copies of the complete object in {@code slot} to leave memory: each is freed or, where
     * {@code spill} says so, moved to its node's SSD tier. Fills {@code kept} (emptied first) with the copies the
     * object keeps: the SSD-tier copies it had, and a disk copy for each memory copy spilled, listed at once on the
     * same segment with the offset the memory copy had. Until the node reports the spill durable it serves that
     * copy from its staging memory (or, before it has taken the spill, from the memory region the offset names),
     * so the object is never a miss on its way to disk. Returns the memory bytes the batch will free. Caller holds
     * the lock of the shard whose table is {@code objects}.
     */
    long evict(ObjectTable objects, int slot, SpillChoice spill, Kept kept) {
        long len = objects.regionLength(slot);
        long generation = objects.generation(slot);
        long memory = 0;
        kept.size = 0;
        for (int i = 0, n = objects.replicas(slot); i < n; i++) {
            int stored = objects.segment(slot, i);
            long offset = objects.offset(slot, i);
            if (StoredSegment.onDisk(stored)) {
                kept.add(stored, offset);
                continue;
            }
            boolean spills = spill.spills(objects, slot, stored);
            add(stored, offset, len, generation, Tier.MEMORY, spills);
            memory += len;
            if (spills) {
                kept.add(stored | StoredSegment.DISK_BIT, offset);
            }
        }
        return memory;
    }

    /**
     * Frees every collected region on its segment (skipping segments that are gone) and tells the
     * nodes. Returns the memory bytes freed.
     */
    long apply(Segments live, NodeNotifier nodes) {
        notifyNodes(live, nodes);
        return freeAllocators(live);
    }

    /** Queues the frees (and spills) for the nodes, in (segment, offset) order. */
    void notifyNodes(Segments live, NodeNotifier nodes) {
        sort(0, size - 1);
        for (int i = 0; i < size; i++) {
            Segment s = live.get(segments[i]);
            if (s != null) {
                Tier tier = (flags[i] & 1) != 0 ? Tier.DISK : Tier.MEMORY;
                nodes.free(s, offsets[i], generations[i], tier, (flags[i] & 2) != 0);
            }
        }
    }

    /** Returns the memory regions to their allocators (after the nodes were told); empties the batch. */
    long freeAllocators(Segments live) {
        sort(0, size - 1);
        long freed = 0;
        for (int i = 0; i < size; i++) {
            Segment s = live.get(segments[i]);
            if (s != null && (flags[i] & 1) == 0) {
                s.allocator.free(offsets[i], lengths[i]);
                freed += lengths[i];
            }
        }
        size = 0;
        return freed;
    }

    private boolean less(int i, int j) {
        return segments[i] != segments[j] ? segments[i] < segments[j] : offsets[i] < offsets[j];
    }

    /** Quicksort of the four parallel arrays by (segment, offset); insertion sort for short runs. */
    private void sort(int lo, int hi) {
        while (hi - lo > 16) {
            int mid = (lo + hi) >>> 1;
            swap(mid, hi);
            int store = lo;
            for (int i = lo; i < hi; i++) {
                if (less(i, hi)) {
                    swap(i, store++);
                }
            }
            swap(store, hi);
            // recurse into the smaller side, loop on the larger: stack depth stays O(log n)
            if (store - lo < hi - store) {
                sort(lo, store - 1);
                lo = store + 1;
            } else {
                sort(store + 1, hi);
                hi = store - 1;
            }
        }
        for (int i = lo + 1; i <= hi; i++) {
            for (int j = i; j > lo && less(j, j - 1); j--) {
                swap(j, j - 1);
            }
        }
    }

    private void swap(int i, int j) {
        int s = segments[i];
        segments[i] = segments[j];
        segments[j] = s;
        long o = offsets[i];
        offsets[i] = offsets[j];
        offsets[j] = o;
        long l = lengths[i];
        lengths[i] = lengths[j];
        lengths[j] = l;
        long g = generations[i];
        generations[i] = generations[j];
        generations[j] = g;
        byte f = flags[i];
        flags[i] = flags[j];
        flags[j] = f;
    }
}
