package io.kvpool.master;

import io.kvpool.protocol.ObjectLayout;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Consumer;
import java.util.function.IntFunction;

/**
 * Every memory region the objects of an index hold, reserved in their segments' fresh allocators: the regions of each
 * segment collected in one pass over the index, sorted by offset, and taken in one pass
 * ({@link RangeAllocator#takeSorted}). Reserved one by one in the index's order, they would split the free space into
 * as many ranges as there are objects on the way (seconds at a million). Used by a promoted standby whose copy did not
 * keep its allocators ({@link TakeOver}), and by a copy that becomes consistent ({@link StandbyCopy#settle}).
 */
final class RegionsBuild {

    private RegionsBuild() {
    }

    /**
     * Reserves every memory copy of every object of {@code index} in {@code allocatorOf.apply(segmentId)}, each
     * allocator nothing was taken from yet; returns how many copies found no allocator or did not fit.
     */
    static long reserveAll(ObjectIndex index, IntFunction<RangeAllocator> allocatorOf) {
        Map<Integer, Regions> bySegment = new HashMap<>();
        long[] unplaced = {0};
        @SuppressWarnings("GuardedBy") // forEachShard runs it under the shard's lock, out of the checker's sight
        Consumer<ObjectIndex.Shard> collect = shard -> {
            ObjectTable t = shard.objects;
            for (int slot = 0; slot < t.size(); slot++) {
                for (int i = 0, n = t.replicas(slot); i < n; i++) {
                    int stored = t.segment(slot, i);
                    if (!StoredSegment.onDisk(stored)) {
                        bySegment.computeIfAbsent(StoredSegment.id(stored), x -> new Regions())
                                .add(t.offset(slot, i), t.regionLength(slot));
                    }
                }
            }
        };
        index.forEachShard(collect);
        bySegment.forEach((id, regions) -> {
            RangeAllocator a = allocatorOf.apply(id);
            unplaced[0] += a == null ? regions.count() : regions.reserveIn(a);
        });
        return unplaced[0];
    }

    /**
     * One segment's regions to reserve, each packed in a long as (offset / 64) above 24 bits of (length / 64), so a
     * primitive sort puts them in offset order; one too big to pack (an offset past 2^39 units or a region of 1 GiB
     * or more) waits aside and is reserved last.
     */
    private static final class Regions {
        private long[] packed = new long[1024];
        private int n;
        private final List<long[]> aside = new ArrayList<>();

        void add(long offset, long length) {
            long units = (length + ObjectLayout.ALIGNMENT - 1) / ObjectLayout.ALIGNMENT;
            long at = offset / ObjectLayout.ALIGNMENT;
            if (units >= 1 << 24 || at >= 1L << 39) {
                aside.add(new long[]{offset, length});
                return;
            }
            if (n == packed.length) {
                packed = Arrays.copyOf(packed, n * 2);
            }
            packed[n++] = at << 24 | units;
        }

        long count() {
            return n + aside.size();
        }

        /** Reserves every region in a fresh allocator; returns how many did not fit. */
        long reserveIn(RangeAllocator allocator) {
            Arrays.sort(packed, 0, n);
            long[] offsets = new long[n];
            long[] lengths = new long[n];
            for (int i = 0; i < n; i++) {
                offsets[i] = (packed[i] >>> 24) * ObjectLayout.ALIGNMENT;
                lengths[i] = (packed[i] & 0xFF_FFFFL) * ObjectLayout.ALIGNMENT;
            }
            long failed = allocator.takeSorted(offsets, lengths, n);
            for (long[] r : aside) {
                failed += allocator.reserve(r[0], r[1]) ? 0 : 1;
            }
            return failed;
        }
    }
}
