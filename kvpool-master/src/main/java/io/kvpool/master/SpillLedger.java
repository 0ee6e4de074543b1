package io.kvpool.master;

import io.kvpool.protocol.Keys;

import java.time.InstantSource;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Objects on their way from memory to a node's SSD tier: evicted with the spill flag, and not yet
 * reported back by the node (NODE_DISK_ADD). Such an object is listed as a disk copy from the moment it is
 * evicted ({@link FreeBatch#evict}), so it is never a miss on its way; the node serves it from its staging
 * memory until its report says the copy is durable. The ledger is what checks that report.
 *
 * <p>Owns the spills in flight, by key: for each copy on its way (an object with copies on several
 * nodes spills each to its own node's tier), the generation spilled, the segment, and a deadline.
 *
 * <p>Invariants:
 * <ul>
 *   <li>A node's report is accepted only for a spill still here, of that generation on that segment
 *       ({@link #land}), or for a disk copy the index still lists. A removal of the key frees its listed
 *       copies (the node drops the spill) and {@link #forget}s the spill, so a removed object cannot come
 *       back from disk.</li>
 *   <li>A reset forgets every spill ({@link #clear}): what was spilled before it belongs to an older
 *       epoch.</li>
 *   <li>A spill whose report never comes is forgotten after {@value #TIMEOUT_MILLIS} ms ({@link #expire}); a
 *       spill the node could not keep is reported dropped (NODE_DISK_DROP) and leaves the index then.</li>
 * </ul>
 *
 * <p>Locks: none of its own (a concurrent map). {@link #begin} runs under the object's shard lock,
 * during an eviction round; {@link #land}, {@link #forget} and {@link #forgetByPrefix} under the key's shard
 * lock (so a removal and a disk report of one key never interleave) and the epoch
 * lock (either mode), {@link #clear} under the epoch write lock.
 */
final class SpillLedger {

    /** How long a spill may take to be reported before it is forgotten. */
    static final long TIMEOUT_MILLIS = 60_000;

    /** A spill in flight: which version of the object, to which segment's SSD tier, reported by when. */
    private record Spill(long generation, int segmentId, long deadlineMillis) {
    }

    /** By key, the spills of its copies (one per segment); the lists are never changed, only replaced. */
    private final Map<Key, List<Spill>> inFlight = new ConcurrentHashMap<>();
    private final ObjectIndex index;
    private final Segments segments;
    private final InstantSource clock;

    SpillLedger(ObjectIndex index, Segments segments, InstantSource clock) {
        this.index = index;
        this.segments = segments;
        this.clock = clock;
    }

    /**
     * Whether the memory copy on {@code segmentId} of the object in {@code slot}, about to be evicted,
     * goes to that node's SSD tier: yes when the node has one, and then the spill is recorded. A
     * {@link FreeBatch.SpillChoice}. Caller holds the lock of the shard whose table is {@code objects}.
     */
    boolean begin(ObjectTable objects, int slot, int segmentId) {
        Segment s = segments.get(segmentId);
        if (s == null || !s.tiers.hasDisk()) {
            return false;
        }
        Spill spill = new Spill(objects.generation(slot), segmentId, clock.millis() + TIMEOUT_MILLIS);
        inFlight.compute(new Key(objects.key(slot), objects.hash(slot)), (k, was) -> {
            List<Spill> now = new ArrayList<>();
            if (was != null) {
                for (Spill s2 : was) {
                    if (s2.segmentId != segmentId) {
                        now.add(s2); // another copy's spill, to another node
                    }
                }
            }
            now.add(spill);
            return List.copyOf(now);
        });
        return true;
    }

    /**
     * A node reports {@code key} at {@code generation} durable in its SSD tier (or dropped): true (and the
     * spill is done) if that is the spill in flight to {@code segmentId}; false if there is none (removed or
     * replaced on its way to disk, reported twice, or never spilled).
     */
    boolean land(Key key, long generation, int segmentId) {
        boolean[] landed = {false};
        inFlight.computeIfPresent(key, (k, was) -> {
            List<Spill> now = new ArrayList<>(was.size());
            for (Spill s : was) {
                if (!landed[0] && s.generation == generation && s.segmentId == segmentId) {
                    landed[0] = true;
                } else {
                    now.add(s);
                }
            }
            return now.isEmpty() ? null : List.copyOf(now);
        });
        return landed[0];
    }

    /** Forgets the key's spills in flight (the key was removed: freeing its listed copies told the nodes to drop them). */
    void forget(Key key) {
        inFlight.remove(key);
    }

    /** {@link #forget}s every spill in flight whose key starts with {@code prefix}. */
    void forgetByPrefix(byte[] prefix, java.util.function.Predicate<Key> which) {
        inFlight.keySet().removeIf(k -> Keys.hasPrefix(k.bytes, prefix) && which.test(k));
    }

    /**
     * Forgets the spills not reported by their deadline, and takes their disk copies out of the index: a node
     * that never said the copy is durable (nor dropped) may not hold it. Caller holds the epoch lock (either mode)
     * and no shard lock.
     */
    void expire(long nowMillis) {
        for (Key k : new ArrayList<>(inFlight.keySet())) {
            List<Spill> seen = inFlight.get(k);
            if (seen == null || seen.stream().allMatch(s -> s.deadlineMillis >= nowMillis)) {
                continue; // nothing due: no shard lock taken
            }
            @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
            java.util.function.Consumer<ObjectIndex.Shard> expireKey = shard -> inFlight.computeIfPresent(k, (key, was) -> {
                List<Spill> now = new ArrayList<>(was.size());
                for (Spill s : was) {
                    if (s.deadlineMillis >= nowMillis) {
                        now.add(s);
                    } else {
                        delist(shard.objects, key, s);
                    }
                }
                return now.isEmpty() ? null : List.copyOf(now);
            });
            index.withShard(k.hashCode(), shard -> {
                expireKey.accept(shard);
                return null;
            });
        }
    }

    /** Removes the disk copy {@code s} listed for {@code key}, if the index still lists it. Under the key's shard lock. */
    private static void delist(ObjectTable objects, Key key, Spill s) {
        int slot = objects.find(key.bytes, key.hashCode());
        if (slot < 0 || objects.generation(slot) != s.generation) {
            return;
        }
        int r = objects.replicaOn(slot, s.segmentId);
        if (r < 0 || !StoredSegment.onDisk(objects.segment(slot, r))) {
            return;
        }
        if (objects.replicas(slot) == 1) {
            objects.remove(slot);
        } else {
            objects.removeReplica(slot, r);
        }
    }

    /** Forgets every spill (a reset). Caller holds the epoch write lock. */
    void clear() {
        inFlight.clear();
    }
}
