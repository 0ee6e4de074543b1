package io.kvpool.master;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.protocol.ObjectLayout;

import java.util.Comparator;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;

/**
 * Hands out byte ranges of one segment. Best fit with immediate coalescing: free ranges are indexed
 * both by offset (to merge neighbours on free) and by (size, offset) (to find the smallest range that
 * fits). Every operation is O(log f) in the number f of free ranges. Offsets and lengths are
 * multiples of {@link ObjectLayout#ALIGNMENT}.
 *
 * <p>Invariant: free ranges never overlap and never touch (touching ranges are merged), and
 * {@code used + sum(free sizes) == capacity}. {@code RangeAllocatorTest} checks it against a
 * bitmap model after random operations.
 *
 * <p>Thread-safe (every method synchronized); calls are short.
 */
final class RangeAllocator {

    private record Free(long size, long offset) {
    }

    private static final Comparator<Free> BY_SIZE =
            Comparator.comparingLong(Free::size).thenComparingLong(Free::offset);

    private final long capacity;
    @GuardedBy("this")
    private final TreeMap<Long, Long> byOffset = new TreeMap<>();
    @GuardedBy("this")
    private final TreeSet<Free> bySize = new TreeSet<>(BY_SIZE);
    @GuardedBy("this")
    private long used;
    @GuardedBy("this")
    private long allocations;

    RangeAllocator(long capacity) {
        this.capacity = capacity & -ObjectLayout.ALIGNMENT;
        if (this.capacity > 0) {
            addFree(0, this.capacity);
        }
    }

    /** Bytes actually taken for a request of {@code length}: aligned, and at least one alignment unit. */
    private static long units(long length) {
        return Math.max(ObjectLayout.ALIGNMENT, ObjectLayout.align(length));
    }

    synchronized long capacity() {
        return capacity;
    }

    synchronized long used() {
        return used;
    }

    synchronized long allocations() {
        return allocations;
    }

    synchronized long free() {
        return capacity - used;
    }

    /** Largest single range that could be allocated now. */
    synchronized long largestFree() {
        return bySize.isEmpty() ? 0 : bySize.last().size;
    }

    /** Allocates {@code length} bytes (rounded up to the alignment); returns the offset, or -1 if no range fits. */
    synchronized long allocate(long length) {
        long len = units(length);
        Free fit = bySize.ceiling(new Free(len, -1));
        if (fit == null) {
            return -1;
        }
        removeFree(fit.offset, fit.size);
        if (fit.size > len) {
            addFree(fit.offset + len, fit.size - len);
        }
        used += len;
        allocations++;
        return fit.offset;
    }

    /**
     * Marks a specific range allocated (used when a node lists objects it already holds). Returns
     * false if any part of it is not free.
     */
    synchronized boolean reserve(long offset, long length) {
        long len = units(length);
        if (offset < 0 || offset % ObjectLayout.ALIGNMENT != 0 || offset + len > capacity) {
            return false;
        }
        Map.Entry<Long, Long> e = byOffset.floorEntry(offset);
        if (e == null || e.getKey() + e.getValue() < offset + len) {
            return false;
        }
        long fStart = e.getKey();
        long fSize = e.getValue();
        removeFree(fStart, fSize);
        if (offset > fStart) {
            addFree(fStart, offset - fStart);
        }
        long tail = fStart + fSize - (offset + len);
        if (tail > 0) {
            addFree(offset + len, tail);
        }
        used += len;
        allocations++;
        return true;
    }

    /**
     * Marks the ranges {@code offsets[i], lengths[i]} ({@code i < n}, sorted by offset) allocated on an allocator
     * nothing was taken from yet (a promoted standby's segments): one pass that lays the free ranges between them,
     * instead of a split per range. A range that overlaps the one before it or runs past the end is not taken.
     * Returns how many were not.
     */
    synchronized int takeSorted(long[] offsets, long[] lengths, int n) {
        if (used != 0) {
            throw new IllegalStateException("takeSorted on an allocator in use (" + used + " bytes)");
        }
        byOffset.clear();
        bySize.clear();
        long at = 0;
        int refused = 0;
        for (int i = 0; i < n; i++) {
            long len = units(lengths[i]);
            long off = offsets[i];
            if (off < at || off % ObjectLayout.ALIGNMENT != 0 || off + len > capacity) {
                refused++;
                continue;
            }
            if (off > at) {
                addFree(at, off - at);
            }
            at = off + len;
            used += len;
            allocations++;
        }
        if (at < capacity) {
            addFree(at, capacity - at);
        }
        return refused;
    }

    /** Returns a range to the free pool, merging it with free neighbours. */
    synchronized void free(long offset, long length) {
        freePart(offset, length);
        allocations--;
    }

    /**
     * Frees part of an allocation without counting an allocation gone: a write lease's range is one
     * allocation that its objects are carved from ({@code WriteLeases}), and what they do not use comes
     * back piece by piece.
     */
    synchronized void freePart(long offset, long length) {
        long len = units(length);
        if (offset < 0 || offset + len > capacity) {
            throw new IllegalStateException("free of [" + offset + ", " + (offset + len) + ") outside a segment of "
                    + capacity + " bytes");
        }
        long start = offset;
        long end = offset + len;
        Map.Entry<Long, Long> prev = byOffset.floorEntry(offset);
        if (prev != null && prev.getKey() + prev.getValue() > offset) {
            throw new IllegalStateException("double free: [" + offset + ", " + end + ") overlaps free range ["
                    + prev.getKey() + ", " + (prev.getKey() + prev.getValue()) + ")");
        }
        Map.Entry<Long, Long> next = byOffset.ceilingEntry(offset);
        if (next != null && next.getKey() < end) {
            throw new IllegalStateException("double free: [" + offset + ", " + end + ") overlaps free range at "
                    + next.getKey());
        }
        if (prev != null && prev.getKey() + prev.getValue() == offset) {
            removeFree(prev.getKey(), prev.getValue());
            start = prev.getKey();
        }
        if (next != null && next.getKey() == end) {
            removeFree(next.getKey(), next.getValue());
            end = next.getKey() + next.getValue();
        }
        addFree(start, end - start);
        used -= len;
    }

    /** Counts allocations carved out of a write lease's range: +1 per object, -1 for the range itself. */
    synchronized void recount(int delta) {
        allocations += delta;
    }

    /** Frees everything at once. */
    synchronized void reset() {
        byOffset.clear();
        bySize.clear();
        used = 0;
        allocations = 0;
        if (capacity > 0) {
            addFree(0, capacity);
        }
    }

    /** Number of free ranges (fragmentation indicator). */
    synchronized int freeRanges() {
        return byOffset.size();
    }

    @GuardedBy("this")
    private void addFree(long offset, long size) {
        byOffset.put(offset, size);
        bySize.add(new Free(size, offset));
    }

    @GuardedBy("this")
    private void removeFree(long offset, long size) {
        byOffset.remove(offset);
        bySize.remove(new Free(size, offset));
    }
}
