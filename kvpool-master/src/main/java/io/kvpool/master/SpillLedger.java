package io.kvpool.master;

import io.kvpool.protocol.Keys;
import io.kvpool.protocol.Tier;

import java.time.InstantSource;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Objects on their way from memory to a node's SSD tier: evicted with the spill flag, and not yet
 * reported back by the node (NODE_DISK_ADD). Until then such an object is a miss; once reported it
 * is listed again, as a disk replica.
 *
 * <p>Owns the spills in flight, by key: for each copy on its way (an object with copies on several
 * nodes spills each to its own node's tier), the generation spilled, the segment, and a deadline.
 *
 * <p>Invariants:
 * <ul>
 *   <li>A node's report is accepted only for a spill still here, of that generation on that segment
 *       ({@link #land}). A removal of the key in between {@link #cancel}s the spill and tells the
 *       node to drop the disk copy, so a removed object cannot come back from disk.</li>
 *   <li>A reset forgets every spill ({@link #clear}): what was spilled before it belongs to an older
 *       epoch.</li>
 *   <li>A spill whose report never comes (the node's queue was full) is forgotten after
 *       {@value #TIMEOUT_MILLIS} ms ({@link #expire}).</li>
 * </ul>
 *
 * <p>Locks: none of its own (a concurrent map). {@link #begin} runs under the object's shard lock,
 * during an eviction round; {@link #land}, {@link #cancel} and {@link #cancelByPrefix} under the key's shard
 * lock (so a removal and a disk report of one key never interleave) and the epoch
 * lock (either mode), {@link #clear} under the epoch write lock.
 */
final class SpillLedger {

    /** How long a spill may take to be reported before it is forgotten. */
    static final long TIMEOUT_MILLIS = 60_000;

    /**
     * A spill in flight: which version of the object, to which segment's SSD tier, reported by when; its tenant's
     * namespace (-1 without tenants) and its bytes, counted against the tenant's SSD quota until it is resolved.
     */
    private record Spill(long generation, int segmentId, long deadlineMillis, int namespace, long bytes) {
    }

    /** By key, the spills of its copies (one per segment); the lists are never changed, only replaced. */
    private final Map<Key, List<Spill>> inFlight = new ConcurrentHashMap<>();
    private final Segments segments;
    private final NodeNotifier nodes;
    private final InstantSource clock;
    private final Tenants tenants;
    /** Bytes in flight to the SSD tier, by tenant namespace. */
    private final Map<Integer, Long> spillingBytes = new ConcurrentHashMap<>();

    SpillLedger(Segments segments, NodeNotifier nodes, InstantSource clock, Tenants tenants) {
        this.segments = segments;
        this.nodes = nodes;
        this.clock = clock;
        this.tenants = tenants;
    }

    /** Bytes of namespace {@code ns} on their way to the SSD tier (spilled, not reported yet). */
    long spilling(int ns) {
        return spillingBytes.getOrDefault(ns, 0L);
    }

    private void resolved(Spill s) {
        if (s.namespace >= 0) {
            spillingBytes.merge(s.namespace, -s.bytes, (a, b) -> a + b == 0 ? null : a + b);
        }
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
        int ns = tenants.active() ? tenants.namespace(objects, slot) : -1;
        Spill spill = new Spill(objects.generation(slot), segmentId, clock.millis() + TIMEOUT_MILLIS, ns,
                objects.regionLength(slot));
        inFlight.compute(new Key(objects.key(slot), objects.hash(slot)), (k, was) -> {
            List<Spill> now = new ArrayList<>();
            if (was != null) {
                for (Spill s2 : was) {
                    if (s2.segmentId != segmentId) {
                        now.add(s2); // another copy's spill, to another node
                    } else {
                        resolved(s2);
                    }
                }
            }
            now.add(spill);
            return List.copyOf(now);
        });
        if (ns >= 0) {
            spillingBytes.merge(ns, spill.bytes, Long::sum);
        }
        return true;
    }

    /**
     * A node reports {@code key} at {@code generation} durable in its SSD tier: true (and the spill is
     * done) if that is the spill in flight to {@code segmentId}; false if there is none (removed or
     * replaced on its way to disk, reported twice, or never spilled).
     */
    boolean land(Key key, long generation, int segmentId) {
        boolean[] landed = {false};
        inFlight.computeIfPresent(key, (k, was) -> {
            List<Spill> now = new ArrayList<>(was.size());
            for (Spill s : was) {
                if (!landed[0] && s.generation == generation && s.segmentId == segmentId) {
                    landed[0] = true;
                    resolved(s);
                } else {
                    now.add(s);
                }
            }
            return now.isEmpty() ? null : List.copyOf(now);
        });
        return landed[0];
    }

    /** Forgets the key's spills in flight and tells their nodes to drop the disk copies that made it there. */
    boolean cancel(Key key) {
        List<Spill> gone = inFlight.remove(key);
        if (gone == null) {
            return false;
        }
        for (Spill s : gone) {
            resolved(s);
            Segment seg = segments.get(s.segmentId);
            if (seg != null) {
                nodes.free(seg, 0, s.generation, Tier.DISK, false);
            }
        }
        return true;
    }

    /** {@link #cancel}s every spill in flight whose key starts with {@code prefix}; returns how many. */
    long cancelByPrefix(byte[] prefix, java.util.function.Predicate<Key> which) {
        long n = 0;
        for (Key k : new ArrayList<>(inFlight.keySet())) {
            if (Keys.hasPrefix(k.bytes, prefix) && which.test(k) && cancel(k)) {
                n++;
            }
        }
        return n;
    }

    /** Forgets the spills not reported by their deadline. */
    void expire(long nowMillis) {
        for (Key k : new ArrayList<>(inFlight.keySet())) {
            inFlight.computeIfPresent(k, (key, was) -> {
                List<Spill> now = new ArrayList<>(was.size());
                for (Spill s : was) {
                    if (s.deadlineMillis >= nowMillis) {
                        now.add(s);
                    } else {
                        resolved(s);
                    }
                }
                return now.isEmpty() ? null : List.copyOf(now);
            });
        }
    }

    /** Forgets every spill (a reset). Caller holds the epoch write lock. */
    void clear() {
        inFlight.clear();
        spillingBytes.clear();
    }
}
