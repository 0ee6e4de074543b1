package io.kvpool.master;

import io.kvpool.config.HostPort;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.MasterMessages.SegmentInfo;

import java.util.ArrayList;
import java.util.Collection;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.ToLongFunction;

/**
 * The registered segments, by id, and their space: what puts are placed on, what capacity and usage
 * add up to, and giving an object's regions back.
 *
 * <p>Owns the segments by id and the id counter. A segment gets a new id at every registration, so a
 * stale reference to an earlier registration (a pending put, a replica in the index) finds nothing
 * rather than the new one. {@link Membership} adds and removes segments, under the epoch write lock;
 * everyone else only reads them, and a lookup that finds nothing means the segment is gone.
 *
 * <p>Locks: none of its own. The map is concurrent and each segment's allocator is synchronized;
 * {@link #release} runs under the object's shard lock, {@link #resetAllocators} under the epoch write
 * lock.
 */
final class Segments {

    private final Map<Integer, Segment> byId = new ConcurrentHashMap<>();
    private final AtomicInteger nextId = new AtomicInteger(1);
    private final NodeNotifier nodes;
    /** Told of every registration that comes and goes, for standby masters. */
    private final ChangeFeed feed;

    Segments(NodeNotifier nodes, ChangeFeed feed) {
        this.nodes = nodes;
        this.feed = feed;
    }

    /** What placement samples: every registered segment, rebuilt when one comes or goes. */
    private volatile Placement.Pool pool = Placement.Pool.EMPTY;

    /** Every registered segment, as placement reads them (rebuilt when one comes or goes, never in place). */
    Placement.Pool pool() {
        return pool;
    }

    private void changed() {
        pool = Placement.Pool.of(byId.values());
    }

    /** The segment with this id, or null if it is gone. */
    Segment get(int id) {
        return byId.get(id);
    }

    /** Every registered segment, active or joining (a live view). */
    Collection<Segment> all() {
        return byId.values();
    }

    /** Admits a node's segment under a fresh id, JOINING until its inventory is in. Caller holds the epoch write lock. */
    Segment add(String name, HostPort address, long capacity, long nodeIncarnation, String shmPath,
                ControlToken controlToken, long nowMillis) {
        Segment seg = new Segment(nextId.getAndIncrement(), name, address, capacity, nodeIncarnation, shmPath,
                controlToken, nowMillis);
        byId.put(seg.id, seg);
        changed();
        if (feed.on()) {
            feed.append(FeedRecords.segment(seg));
        }
        return seg;
    }

    /**
     * Takes over a segment the previous leader registered (a promoted standby's copy): same id, name, address,
     * incarnation, shared-memory file and control token, placed on only once its node follows this master's term;
     * its space is {@code kept} (the copy's allocator for it) or, when null, a fresh allocator the caller fills.
     * Caller holds the epoch write lock.
     */
    Segment adopt(FeedRecords.SegmentRecord r, long nowMillis, RangeAllocator kept) {
        Segment seg = new Segment(r.id(), r.name(), r.address(), r.nodeIncarnation(), r.shmPath(), r.controlToken(),
                nowMillis, kept != null ? kept : new RangeAllocator(r.capacity()));
        seg.awaitingTerm = true;
        byId.put(seg.id, seg); // placement sees it after adopted(): rebuilt once, not once a segment
        nextId.accumulateAndGet(seg.id + 1, Math::max);
        return seg;
    }

    /** Every segment of a take-over is adopted: placement sees them now. Caller holds the epoch write lock. */
    void adopted() {
        changed();
    }

    /** Forgets a segment. Caller holds the epoch write lock. */
    void remove(Segment seg) {
        byId.remove(seg.id);
        changed();
        if (feed.on()) {
            feed.append(FeedRecords.segmentGone(seg.id));
        }
    }

    /** Capacity of the active segments. */
    long capacity() {
        return sumActive(RangeAllocator::capacity);
    }

    /**
     * Capacity of the segments new objects may be placed on (active and not draining): 0 when every
     * node is joining or stopping for a restart, and then a put is refused NO_SEGMENT rather than
     * evicting objects whose room nothing could use.
     */
    long placeableCapacity() {
        long n = 0;
        for (Segment s : byId.values()) {
            if (s.placeable()) {
                n += s.allocator.capacity();
            }
        }
        return n;
    }

    /** Bytes allocated on the active segments. */
    long allocated() {
        return sumActive(RangeAllocator::used);
    }

    /** Free ranges of the active segments: many short ones mean a fragmented pool (short write leases). */
    long freeRanges() {
        return sumActive(RangeAllocator::freeRanges);
    }

    /** The longest free range of any active segment. */
    long longestFree() {
        long best = 0;
        for (Segment s : byId.values()) {
            if (s.active) {
                best = Math.max(best, s.allocator.largestFree());
            }
        }
        return best;
    }

    private long sumActive(ToLongFunction<RangeAllocator> figure) {
        long n = 0;
        for (Segment s : byId.values()) {
            if (s.active) {
                n += figure.applyAsLong(s.allocator);
            }
        }
        return n;
    }

    /** One row per segment, ordered by id. */
    List<SegmentInfo> infos(long nowMillis) {
        List<SegmentInfo> out = new ArrayList<>();
        List<Segment> sorted = new ArrayList<>(byId.values());
        sorted.sort(Comparator.comparingInt(s -> s.id));
        for (Segment s : sorted) {
            out.add(new SegmentInfo(s.id, s.name, s.address.host(), s.address.port(), s.allocator.capacity(),
                    s.allocator.used(), s.allocator.allocations(),
                    !s.active ? SegmentInfo.STATE_JOINING : s.draining ? SegmentInfo.STATE_DRAINING
                            : SegmentInfo.STATE_ACTIVE, nowMillis - s.lastHeartbeatMillis,
                    s.shmPath, s.tiers));
        }
        return out;
    }

    /**
     * Frees a complete object's regions and tells their nodes (memory copies and disk copies alike).
     * Returns the memory bytes freed. Caller holds the lock of the shard whose table is {@code objects}.
     */
    long release(ObjectTable objects, int slot) {
        long len = objects.regionLength(slot);
        long generation = objects.generation(slot);
        long freed = 0;
        for (int i = 0, n = objects.replicas(slot); i < n; i++) {
            int stored = objects.segment(slot, i);
            Segment s = byId.get(StoredSegment.id(stored));
            if (s == null) {
                continue;
            }
            long offset = objects.offset(slot, i);
            if (StoredSegment.onDisk(stored)) {
                nodes.free(s, offset, generation, Tier.DISK, false);
            } else {
                s.allocator.free(offset, len);
                nodes.free(s, offset, generation, Tier.MEMORY, false);
                freed += len;
            }
        }
        return freed;
    }

    /** Empties every allocator (a reset reclaims all space wholesale). Caller holds the epoch write lock. */
    void resetAllocators() {
        for (Segment seg : byId.values()) {
            seg.allocator.reset();
        }
    }
}
