package io.kvpool.master;

import com.google.errorprone.annotations.concurrent.GuardedBy;

import java.time.InstantSource;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.Consumer;
import java.util.random.RandomGenerator;

/**
 * Eviction: which complete objects leave memory when it runs short, and where they go.
 *
 * <p>Approximate LRU by last <em>read</em>: a read stamps the object with the coarse {@link #accessTick};
 * existence probes (exists, prefixMatch, size) do not, so they never keep an object alive. A round
 * started by the high watermark ({@link #onTick}) brings usage down to (watermark - ratio) of
 * capacity; one started because a put cannot be placed ({@link #place}) frees {@code evictionRatio}
 * of capacity. A round finds the access tick below which enough bytes lie ({@link LruCut}) and removes
 * those objects. Reads in flight are protected where the bytes are: a node does not let a new write
 * into a region while a read of it is streaming.
 *
 * <p>Owns the access tick (the LRU's clock), the eviction lock and the eviction counters.
 *
 * <p>Invariants: objects whose copies are all in an SSD tier take no memory and are never taken. A
 * memory copy on a node with an SSD tier is spilled there rather than dropped: listed at once as a disk copy
 * on that node (which serves it from its staging memory until it is on disk), and recorded in the
 * {@link SpillLedger} until the node reports it durable. The nodes are told of a round's frees and spills, and
 * acknowledge them, before the allocators get the space back: a node copies what it spills before the
 * space can be handed to anyone else.
 *
 * <p>Locks: the eviction lock serializes rounds, and a put's place-and-evict retries, so two puts that
 * cannot be placed do not both evict for the same shortage. Callers hold the epoch read lock and no
 * shard lock; a round takes each shard's lock in turn, through the index.
 */
public final class Eviction {

    /** Access ticks are milliseconds since start divided by this (16 ms resolution, ~1 year range in an int). */
    private static final int TICK_MILLIS = 16;
    /**
     * Eviction rounds a single put may trigger before reporting POOL_FULL. LRU victims are rarely
     * neighbours, so an object a little larger than the ones evicted may need several rounds before
     * freed ranges merge into one that fits.
     */
    private static final int MAX_ROUNDS_PER_PUT = 16;

    private final MasterConfig config;
    private final InstantSource clock;
    private final long startMillis;
    private final RandomGenerator random;
    private final ObjectIndex index;
    private final Segments segments;
    private final SpillLedger spills;
    private final NodeNotifier nodes;
    private final ReentrantLock lock = new ReentrantLock();

    final AtomicLong attempts = new AtomicLong();
    final AtomicLong successes = new AtomicLong();
    final AtomicLong evictedKeys = new AtomicLong();
    final AtomicLong evictedBytes = new AtomicLong();
    /** Rounds that had to take pinned objects (nothing unpinned was left). */
    final AtomicLong pinnedEvictions = new AtomicLong();

    Eviction(MasterConfig config, InstantSource clock, long startMillis, RandomGenerator random, ObjectIndex index,
             Segments segments, SpillLedger spills, NodeNotifier nodes) {
        this.config = config;
        this.clock = clock;
        this.startMillis = startMillis;
        this.random = random;
        this.index = index;
        this.segments = segments;
        this.spills = spills;
        this.nodes = nodes;
    }

    /** The LRU's clock: what a read (or an object's arrival) stamps on the object. */
    int accessTick() {
        return (int) ((clock.millis() - startMillis) / TICK_MILLIS);
    }

    /** Objects evicted since start. */
    public long evictedKeyCount() {
        return evictedKeys.get();
    }

    /**
     * Reserves {@code replicas} regions on distinct active segments ({@link Placement}); evicts and
     * retries when nothing fits. Caller holds the epoch read lock.
     */
    List<Placement.Placed> place(long regionLength, int replicas, String preferred) {
        List<Placement.Placed> got = tryPlace(regionLength, replicas, preferred);
        if (!got.isEmpty() || segments.placeableCapacity() == 0) {
            return got;
        }
        lock.lock();
        try {
            for (int round = 0; round < MAX_ROUNDS_PER_PUT; round++) {
                // another put may have evicted while we waited for the lock
                got = tryPlace(regionLength, replicas, preferred);
                if (!got.isEmpty()) {
                    return got;
                }
                long target = Math.max((long) (segments.capacity() * config.evictionRatio()), regionLength);
                if (evict(target) == 0) {
                    return got;
                }
            }
            return tryPlace(regionLength, replicas, preferred);
        } finally {
            lock.unlock();
        }
    }

    /** One region where it fits now, or none: never evicts. Caller holds the epoch read lock. */
    List<Placement.Placed> placeWithoutEvicting(long regionLength, String preferred) {
        return tryPlace(regionLength, 1, preferred);
    }

    private List<Placement.Placed> tryPlace(long regionLength, int replicas, String preferred) {
        return Placement.choose(segments.pool(), regionLength, replicas, preferred, random);
    }

    /**
     * The timer's round: evicts when usage is at the high watermark. {@code leasedUnwritten}: bytes
     * live write leases hold and have not written, which count as allocated but hold no object, so
     * evicting objects for them would throw away cache for empty space. Caller holds the epoch read lock.
     */
    void onTick(long leasedUnwritten) {
        long cap = segments.capacity();
        long used = segments.allocated() - leasedUnwritten;
        if (cap > 0 && used >= config.highWatermark() * cap) {
            // one round brings usage to (watermark - ratio), and frees at least ratio of capacity
            long toLowMark = used - (long) ((config.highWatermark() - config.evictionRatio()) * cap);
            evict(Math.max((long) (config.evictionRatio() * cap), toLowMark));
        }
    }

    /**
     * One eviction round: frees at least {@code targetBytes} (if that much is evictable) by removing
     * the least recently read complete objects, those of tenants over their memory quota first
     * ({@link Tenants}). Returns bytes freed. Caller holds the epoch read lock.
     */
    long evict(long targetBytes) {
        lock.lock();
        try {
            attempts.incrementAndGet();
            long now = clock.millis();
            long[] freedAndKeys = {0, 0};
            Tenants tenants = index.events.tenants;
            long over = tenants.active() ? tenants.memoryOverQuota() : 0;
            if (over > 0) {
                boolean[] overQuota = tenants.overMemoryQuota();
                evictRound(Math.min(targetBytes, over), (objects, slot) -> {
                    int ns = tenants.namespace(objects, slot); // a new list meanwhile may name more namespaces
                    return objects.pinned(slot, now) || ns >= overQuota.length || !overQuota[ns] ? -1
                            : memoryWeight(objects, slot);
                }, freedAndKeys);
            }
            evictRound(targetBytes, (objects, slot) -> objects.pinned(slot, now) ? -1 : memoryWeight(objects, slot),
                    freedAndKeys);
            if (freedAndKeys[0] < targetBytes && index.pinnedBytes() > 0) {
                // nothing unpinned is left to take: pinned objects go too, least recently read first
                pinnedEvictions.incrementAndGet();
                evictRound(targetBytes, Eviction::memoryWeight, freedAndKeys);
            }
            long freed = freedAndKeys[0];
            long keys = freedAndKeys[1];
            if (keys > 0) {
                successes.incrementAndGet();
                evictedKeys.addAndGet(keys);
                evictedBytes.addAndGet(freed);
            }
            return freed;
        } finally {
            lock.unlock();
        }
    }

    /**
     * Evicts namespace {@code ns}'s own least recently read unpinned objects until {@code targetBytes} of its memory
     * is freed, or none is left: a tenant over its quota set to evict ({@link Tenants#admit}). Returns bytes freed
     * and objects taken. Caller holds the epoch read lock and no shard lock.
     */
    long[] evictNamespace(int ns, long targetBytes) {
        lock.lock();
        try {
            long now = clock.millis();
            Tenants tenants = index.events.tenants;
            long[] freedAndKeys = {0, 0};
            evictRound(targetBytes, (objects, slot) -> objects.pinned(slot, now) || tenants.namespace(objects, slot) != ns
                    ? -1 : memoryWeight(objects, slot), freedAndKeys);
            evictedKeys.addAndGet(freedAndKeys[1]);
            evictedBytes.addAndGet(freedAndKeys[0]);
            return freedAndKeys;
        } finally {
            lock.unlock();
        }
    }

    /**
     * Removes the least recently read objects that {@code weight} does not leave out until
     * {@code freedAndKeys[0]} reaches {@code targetBytes}; adds to it the bytes freed and to
     * {@code freedAndKeys[1]} the objects taken.
     */
    @GuardedBy("lock")
    private void evictRound(long targetBytes, LruCut.Weight weight, long[] freedAndKeys) {
        LruCut cut = LruCut.find(index, targetBytes - freedAndKeys[0], weight);
        if (cut == null) {
            return;
        }
        // evict buckets below the cutoff entirely, and the cutoff bucket whole or until the target is met
        FreeBatch frees = new FreeBatch();
        Tenants tenants = index.events.tenants;
        // a spill that would take its tenant past its SSD quota (spills in flight counted) drops the object instead
        // (a spilled copy is listed on the SSD tier at once, so the tenant's SSD use counts it from now on)
        FreeBatch.SpillChoice spill = (objects, slot, seg) -> (!tenants.active() || tenants.maySpill(
                tenants.namespace(objects, slot), objects.regionLength(slot))) && spills.begin(objects, slot, seg);
        FreeBatch.Kept kept = new FreeBatch.Kept();
        @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
        Consumer<ObjectIndex.Shard> round = shard -> {
            if (freedAndKeys[0] >= targetBytes && !cut.whole()) {
                return;
            }
            ObjectTable objects = shard.objects;
            objects.removeIf(slot -> {
                if (weight.of(objects, slot) < 0) {
                    return false;
                }
                if (!cut.takes(objects.lastAccess(slot), freedAndKeys[0] >= targetBytes)) {
                    return false;
                }
                // nodes with an SSD tier keep the object there: listed as a disk copy from now on
                freedAndKeys[0] += frees.evict(objects, slot, spill, kept);
                freedAndKeys[1]++;
                if (kept.size == 0) {
                    return true;
                }
                // the same version with the copies it keeps (unpinned; its last read unchanged)
                objects.replace(slot, objects.valueLength(slot), objects.generation(slot), objects.lastAccess(slot),
                        kept.segments, kept.offsets, kept.size);
                return false;
            });
        };
        index.forEachShard(round);
        // nodes copy what they spill before the space can be handed to anyone else: tell them, wait, then free
        frees.notifyNodes(segments, nodes);
        nodes.flush();
        frees.freeAllocators(segments);
    }

    /** What an object weighs for memory eviction: its regions in memory (every copy), or -1 if it has none. */
    private static long memoryWeight(ObjectTable objects, int slot) {
        int inMemory = 0;
        for (int i = 0, n = objects.replicas(slot); i < n; i++) {
            if (!StoredSegment.onDisk(objects.segment(slot, i))) {
                inMemory++;
            }
        }
        return inMemory == 0 ? -1 : objects.regionLength(slot) * inMemory;
    }
}
