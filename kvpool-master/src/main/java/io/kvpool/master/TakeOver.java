package io.kvpool.master;

import io.kvpool.protocol.ObjectLayout;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;

/**
 * A promoted standby's first step: the master it starts serves from the standby's copy of the previous leader's
 * metadata ({@link StandbyCopy}) instead of rebuilding it from the nodes.
 *
 * <ul>
 *   <li>The copy's index becomes the master's (no object is copied).</li>
 *   <li>Its segments come back under their ids and control tokens ({@link Segments#adopt}), so the replicas in the
 *       index point at them, and a node keeps its registration: its next heartbeat is answered OK with the new term,
 *       which it follows. A segment takes puts only once its node heartbeats in that term
 *       ({@link Segment#awaitingTerm}): from then on the node refuses the old leader's grants.</li>
 *   <li>Every memory copy's region is reserved in its segment's allocator, at the offset the copy gives.</li>
 *   <li>The epoch is the copy's, and generations handed out from now on are above every one the copy saw.</li>
 * </ul>
 */
final class TakeOver {

    private static final Logger log = LoggerFactory.getLogger(TakeOver.class);

    private TakeOver() {
    }

    static void apply(StandbyCopy copy, ObjectIndex index, Segments segments, Epoch epoch, AtomicLong generations,
                      long nowMillis) {
        if (copy.index != index) {
            throw new IllegalArgumentException("a take-over serves from the copy's own index");
        }
        long started = System.nanoTime();
        epoch.exclusive().lock();
        try {
            epoch.takeOver(copy.epoch());
            copy.segments.values().forEach(r -> segments.adopt(r, nowMillis));
            // each segment's regions, taken in offset order in one pass (RangeAllocator.takeSorted): reserved one by
            // one in the index's order they would split the free space into as many ranges as there are objects on
            // the way (seconds at a million)
            Map<Integer, Regions> bySegment = new HashMap<>();
            long[] unplaced = {0};
            @SuppressWarnings("GuardedBy") // forEachShard runs it under the shard's lock, out of the checker's sight
            Consumer<ObjectIndex.Shard> collect = shard -> {
                ObjectTable t = shard.objects;
                for (int slot = 0; slot < t.size(); slot++) {
                    for (int i = 0, n = t.replicas(slot); i < n; i++) {
                        int stored = t.segment(slot, i);
                        if (StoredSegment.onDisk(stored)) {
                            continue;
                        }
                        Segment seg = segments.get(StoredSegment.id(stored));
                        if (seg == null) {
                            unplaced[0]++;
                        } else {
                            bySegment.computeIfAbsent(seg.id, x -> new Regions()).add(t.offset(slot, i), t.regionLength(slot));
                        }
                    }
                }
            };
            index.forEachShard(collect);
            bySegment.forEach((id, regions) -> unplaced[0] += regions.reserveIn(segments.get(id).allocator));
            if (unplaced[0] > 0) {
                // cannot happen with a copy that followed the leader: the leader's allocators never overlapped
                log.warn("take-over: {} copies of the previous leader's objects did not fit their segments", unplaced[0]);
            }
            generations.accumulateAndGet(copy.generations() + 1, Math::max);
        } finally {
            epoch.exclusive().unlock();
        }
        log.info("took over the previous leader's metadata: {} objects on {} segments, epoch {}, in {} ms",
                copy.objects(), copy.segments.size(), copy.epoch(), (System.nanoTime() - started) / 1_000_000);
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
