package io.kvpool.master;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

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
        epoch.exclusive().lock();
        try {
            epoch.takeOver(copy.epoch());
            copy.segments.values().forEach(r -> segments.adopt(r, nowMillis));
            long[] unplaced = {0};
            @SuppressWarnings("GuardedBy") // forEachShard runs it under the shard's lock, out of the checker's sight
            Consumer<ObjectIndex.Shard> reserve = shard -> {
                ObjectTable t = shard.objects;
                for (int slot = 0; slot < t.size(); slot++) {
                    for (int i = 0, n = t.replicas(slot); i < n; i++) {
                        int stored = t.segment(slot, i);
                        Segment seg = segments.get(StoredSegment.id(stored));
                        if (!StoredSegment.onDisk(stored)
                                && (seg == null || !seg.allocator.reserve(t.offset(slot, i), t.regionLength(slot)))) {
                            unplaced[0]++;
                        }
                    }
                }
            };
            index.forEachShard(reserve);
            if (unplaced[0] > 0) {
                // cannot happen with a copy that followed the leader: the leader's allocators never overlapped
                log.warn("take-over: {} copies of the previous leader's objects did not fit their segments", unplaced[0]);
            }
            generations.accumulateAndGet(copy.generations() + 1, Math::max);
        } finally {
            epoch.exclusive().unlock();
        }
        log.info("took over the previous leader's metadata: {} objects on {} segments, epoch {}", copy.objects(),
                copy.segments.size(), copy.epoch());
    }
}
