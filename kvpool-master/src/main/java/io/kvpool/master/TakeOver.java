package io.kvpool.master;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;

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
 *   <li>Every memory copy's region is reserved in its segment's allocator, at the offset the copy gives: the
 *       copy's own allocators when it kept them record by record ({@link StandbyCopy#settle}), else rebuilt here
 *       in one sorted pass per segment ({@link RegionsBuild}), seconds at ten million objects.</li>
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
        Map<Integer, RangeAllocator> kept = copy.allocators();
        boolean reused = kept != null && kept.keySet().containsAll(copy.segments.keySet());
        epoch.exclusive().lock();
        try {
            epoch.takeOver(copy.epoch());
            long[] unplaced = {0};
            if (reused) {
                // the copy kept the leader's allocators record by record: nothing to rebuild
                copy.segments.values().forEach(r -> segments.adopt(r, nowMillis, kept.get(r.id())));
            } else {
                copy.segments.values().forEach(r -> segments.adopt(r, nowMillis, null));
                unplaced[0] = RegionsBuild.reserveAll(index, id -> {
                    Segment seg = segments.get(id);
                    return seg == null ? null : seg.allocator;
                });
            }
            segments.adopted();
            if (unplaced[0] > 0) {
                // cannot happen with a copy that followed the leader: the leader's allocators never overlapped
                log.warn("take-over: {} copies of the previous leader's objects did not fit their segments", unplaced[0]);
            }
            generations.accumulateAndGet(copy.generations() + 1, Math::max);
        } finally {
            epoch.exclusive().unlock();
        }
        log.info("took over the previous leader's metadata: {} objects on {} segments, epoch {}, in {} ms ({})",
                copy.objects(), copy.segments.size(), copy.epoch(), (System.nanoTime() - started) / 1_000_000,
                reused ? "the copy kept the allocators" : "allocators rebuilt from the objects");
    }
}
