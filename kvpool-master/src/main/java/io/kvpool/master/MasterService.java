package io.kvpool.master;

import io.kvpool.config.HostPort;
import io.kvpool.protocol.BadRequestException;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Keys;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.LeaseMessages.LeaseReply;
import io.kvpool.protocol.msg.LeaseMessages.LeaseRequest;
import io.kvpool.protocol.msg.MasterMessages.ClusterStats;
import io.kvpool.protocol.msg.MasterMessages.HeartbeatReply;
import io.kvpool.protocol.msg.MasterMessages.Inventory;
import io.kvpool.protocol.msg.MasterMessages.InventoryItem;
import io.kvpool.protocol.msg.MasterMessages.PutEndItem;
import io.kvpool.protocol.msg.MasterMessages.PutStart;
import io.kvpool.protocol.msg.MasterMessages.PutStartItem;
import io.kvpool.protocol.msg.MasterMessages.PutStartReply;
import io.kvpool.protocol.msg.MasterMessages.PutStartResult;
import io.kvpool.protocol.msg.MasterMessages.RegisterNode;
import io.kvpool.protocol.msg.MasterMessages.RegisterReply;
import io.kvpool.protocol.msg.MasterMessages.ReplicaList;
import io.kvpool.protocol.msg.MasterMessages.SegmentInfo;
import io.kvpool.protocol.msg.MasterMessages.TierStats;
import io.kvpool.protocol.msg.Replica;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.time.InstantSource;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.ReentrantLock;
import java.util.concurrent.locks.ReentrantReadWriteLock;
import java.util.function.LongSupplier;
import java.util.random.RandomGenerator;

/**
 * The master's state machine: object metadata, segments, placement, eviction, membership and the
 * cluster epoch. Transport-free (see {@link MasterHandler} for the wire side) and driven by an
 * injected clock through {@link #tick()}, so tests run it step by step without sleeping.
 *
 * <h2>Two-phase put</h2>
 * PUT_START reserves a region on one or more segments and records a {@link ObjectIndex.PendingPut}
 * with a fresh generation and the current epoch; the writer sends the bytes straight to the nodes;
 * PUT_END moves the entry to the complete map, which is the only map lookups read. So an object is
 * visible only after all its bytes are written. PUT_REVOKE, or the put timeout for a writer that
 * died, frees the reservation.
 *
 * <h2>Batches</h2>
 * Batch operations hash each key once and work shard by shard, taking each shard's lock once per
 * batch ({@link ObjectIndex#forEachKey}, {@link ObjectIndex#lookupEach}); results come back in batch
 * order, and a key repeated in a batch is handled in batch order. PUT_START is the exception: it
 * takes items one at a time, in order, because placing an item may start an eviction round (which
 * takes every shard's lock in turn) and must see the items placed before it.
 *
 * <h2>Epoch fencing (removeAll for RL weight updates)</h2>
 * {@code removeAll(force=true)} takes the epoch write lock, moves to epoch e+1, drops every object
 * and resets every allocator, then tells every node to refuse writes older than e+1 before it
 * returns. Every operation that allocates or completes takes the read lock, so it happens entirely
 * before or entirely after a reset. A put reserved in epoch e finds at PUT_END that the epoch moved
 * and is answered FENCED: a put that started before a removeAll can never become visible after it.
 * Space reserved in an older epoch is never freed again (the allocator reset already reclaimed it).
 *
 * <h2>Removals are absolute</h2>
 * Clients read from locations they remember without asking here, and a frozen or dead node cannot
 * mark what it held dead. So remove, removeByPrefix, removeAll and every upsert change the index,
 * then publish an invalidation through {@link ReadLeases} and return only once every client holding
 * a read lease has applied it or its lease has run out. Nodes are told as before (bounded waits);
 * readers no longer depend on them for this guarantee.
 *
 * <h2>Eviction</h2>
 * Approximate LRU by last <em>read</em>: {@link #getReplicaList} stamps a coarse access tick;
 * existence probes (exists, prefixMatch, size) do not, so they never keep an object alive. A round
 * started by the high watermark brings usage down to (watermark - ratio) of capacity; one started
 * because a put cannot be placed frees {@code evictionRatio} of capacity. A round histograms complete
 * objects by access tick, finds the tick below which enough bytes lie, and removes those objects.
 * Reads in flight are protected where the bytes are: a node does not let a new write into a region
 * while a read of it is streaming.
 *
 * <h2>Membership and rebuild</h2>
 * A node registers, lists its objects (each verified from its self-describing header) and then takes
 * puts. A node silent for the TTL is dropped: its replicas vanish, so its objects become misses. A
 * restarted master starts empty and rebuilds from the inventories nodes send when they re-register;
 * it adopts the newest epoch a node reports, and refuses objects from older epochs.
 */
public final class MasterService {

    private static final Logger log = LoggerFactory.getLogger(MasterService.class);
    /** Access ticks are milliseconds since start divided by this (16 ms resolution, ~1 year range in an int). */
    private static final int TICK_MILLIS = 16;
    /**
     * Eviction rounds a single put may trigger before reporting POOL_FULL. LRU victims are rarely
     * neighbours, so an object a little larger than the ones evicted may need several rounds before
     * freed ranges merge into one that fits.
     */
    private static final int MAX_EVICTION_ROUNDS_PER_PUT = 16;

    private final MasterConfig config;
    private final InstantSource clock;
    private final RandomGenerator random;
    private final NodeNotifier nodes;
    private final long startMillis;
    private final long incarnation = ThreadLocalRandom.current().nextLong();

    private final ReentrantReadWriteLock epochLock = new ReentrantReadWriteLock();
    private volatile long epoch;
    /** False until the first node registers after a (re)start: then we adopt the epoch nodes report. */
    private boolean epochKnown;

    private final ObjectIndex index;
    private final Probes probes;
    private final Map<Integer, Segment> segments = new ConcurrentHashMap<>();
    private final AtomicInteger nextSegmentId = new AtomicInteger(1);
    private final AtomicLong generations;
    private final ReentrantLock evictionLock = new ReentrantLock();
    private final Map<UUID, Long> clients = new ConcurrentHashMap<>();
    /** Read leases and invalidations: what makes removals, resets and upserts absolute (see {@link ReadLeases}). */
    final ReadLeases leases;

    /** An object evicted to a node's SSD tier, not yet reported back by the node (NODE_DISK_ADD). */
    private record Spill(long generation, int segmentId, long deadlineMillis) {
    }

    /**
     * Spills in flight, by key. A node's report is accepted only for a spill still here: a remove of
     * the key in between takes it out (and tells the node), so a removed object cannot come back from
     * disk. Entries whose report never comes (the node's queue was full) expire.
     */
    private final Map<Key, Spill> spilling = new ConcurrentHashMap<>();
    /** How long a spill may take to be reported before it is forgotten. */
    private static final long SPILL_TIMEOUT_MILLIS = 60_000;

    final AtomicLong evictionAttempts = new AtomicLong();
    final AtomicLong evictionSuccesses = new AtomicLong();
    final AtomicLong evictedKeys = new AtomicLong();
    final AtomicLong evictedBytes = new AtomicLong();
    final AtomicLong expiredPuts = new AtomicLong();
    final AtomicLong droppedSegments = new AtomicLong();

    /**
     * A master driven by {@code clock} alone: read leases are counted on the same clock, and there is
     * no start grace (for tests and benchmarks of a lone master; see {@link #serving}).
     */
    public MasterService(MasterConfig config, InstantSource clock, RandomGenerator random, NodeNotifier nodes) {
        this(config, clock, random, nodes, new ObjectIndex(), () -> clock.millis() * 1_000_000L, false);
    }

    /** With a given index: tests pass one whose hashes collide on purpose ({@link ObjectIndex#ObjectIndex(int)}). */
    MasterService(MasterConfig config, InstantSource clock, RandomGenerator random, NodeNotifier nodes, ObjectIndex index) {
        this(config, clock, random, nodes, index, () -> clock.millis() * 1_000_000L, false);
    }

    /**
     * @param leaseNanos monotonic clock for read leases
     * @param startGrace complete no invalidation until one lease after start (leases a previous master
     *                   granted may still run)
     */
    MasterService(MasterConfig config, InstantSource clock, RandomGenerator random, NodeNotifier nodes, ObjectIndex index,
                  LongSupplier leaseNanos, boolean startGrace) {
        this.index = index;
        this.probes = new Probes(index);
        this.config = config;
        this.clock = clock;
        this.random = random;
        this.nodes = nodes;
        this.startMillis = clock.millis();
        // generations only need to be unique per region; starting from the clock keeps them rising across restarts
        this.generations = new AtomicLong(startMillis << 10);
        this.leases = new ReadLeases(incarnation, config.readLease(), leaseNanos, startGrace);
    }

    /** The master as a server runs it: leases on the monotonic clock, with the start grace. */
    public static MasterService serving(MasterConfig config, InstantSource clock, RandomGenerator random,
                                        NodeNotifier nodes) {
        return new MasterService(config, clock, random, nodes, new ObjectIndex(), System::nanoTime, true);
    }

    public MasterConfig config() {
        return config;
    }

    public long incarnation() {
        return incarnation;
    }

    public long epoch() {
        return epoch;
    }

    int accessTick() {
        return (int) ((clock.millis() - startMillis) / TICK_MILLIS);
    }

    // ================================================================== clients

    /** Records that a client is alive (HELLO and PING). */
    public void clientSeen(UUID clientId) {
        clients.put(clientId, clock.millis());
    }

    /** LEASE: a client's read lease renewal and acknowledgement; may wait for the next invalidation. */
    public LeaseReply renewLease(LeaseRequest req) {
        if (!req.end()) {
            clientSeen(req.session());
        }
        return leases.renew(req);
    }

    /** Sessions holding a read lease (clients that read from remembered locations). */
    public int leaseSessions() {
        return leases.sessionCount();
    }

    /** Stops parked lease renewals and invalidations waiting for clients (the server is closing). */
    public void shutdown() {
        leases.close();
    }

    public int activeClients() {
        long cutoff = clock.millis() - config.clientTtl().toMillis();
        int n = 0;
        for (long seen : clients.values()) {
            if (seen >= cutoff) {
                n++;
            }
        }
        return n;
    }

    // ================================================================== put

    /** PUT_START: reserve space for each item (or report ALREADY_EXISTS / POOL_FULL / TOO_LARGE as values). */
    public PutStartReply putStart(PutStart req) {
        int replicas = req.replicas() == 0 ? config.defaultReplicas() : Math.min(req.replicas(), MasterConfig.MAX_REPLICAS);
        for (PutStartItem item : req.items()) {
            checkKeyLength(item.key());
        }
        List<PutStartResult> results = new ArrayList<>(req.items().size());
        epochLock.readLock().lock();
        try {
            long ep = epoch;
            for (PutStartItem item : req.items()) {
                results.add(putStartOne(item, req.upsert(), replicas, req.preferredSegment(), ep));
            }
            return new PutStartReply(ep, results);
        } finally {
            epochLock.readLock().unlock();
        }
    }

    /**
     * Refuses a key the index cannot hold before anything is reserved. The wire already limits keys to
     * {@value io.kvpool.protocol.Keys#MAX_KEY_BYTES} bytes; this guards direct callers.
     */
    private static void checkKeyLength(byte[] key) {
        if (key.length > ObjectTable.MAX_KEY) {
            throw new BadRequestException("key of " + key.length + " bytes; the index holds keys of at most "
                    + ObjectTable.MAX_KEY);
        }
    }

    private PutStartResult putStartOne(PutStartItem item, boolean upsert, int replicas, String preferred, long ep) {
        if (item.valueLength() > config.maxValueSize().bytes()) {
            return PutStartResult.of(ResultCode.TOO_LARGE);
        }
        byte[] key = item.key();
        int hash = index.hash(key);
        ObjectIndex.Shard shard = index.shard(hash);
        if (!upsert && present(shard, key, hash)) {
            return PutStartResult.of(ResultCode.ALREADY_EXISTS);
        }
        if (upsert && item.ifGeneration() != 0 && !holds(shard, key, hash, item.ifGeneration())) {
            return PutStartResult.of(ResultCode.ALREADY_EXISTS);
        }
        long regionLength = ObjectLayout.regionLength(item.key().length, item.valueLength());
        List<Placement.Placed> placed = place(regionLength, replicas, preferred);
        if (placed.isEmpty()) {
            return PutStartResult.of(capacity() == 0 ? ResultCode.NO_SEGMENT : ResultCode.POOL_FULL);
        }
        int[] segIds = new int[placed.size()];
        long[] offsets = new long[placed.size()];
        for (int i = 0; i < placed.size(); i++) {
            segIds[i] = placed.get(i).segment().id;
            offsets[i] = placed.get(i).offset();
        }
        long generation = generations.incrementAndGet();
        shard.lock.lock();
        try {
            if ((!upsert && presentLocked(shard, key, hash))
                    || (upsert && item.ifGeneration() != 0 && !holdsLocked(shard, key, hash, item.ifGeneration()))) {
                freeRegions(segIds, offsets, regionLength, ep, generation, false);
                return PutStartResult.of(ResultCode.ALREADY_EXISTS);
            }
            ObjectIndex.PendingPut superseded = shard.pending.put(new Key(key, hash), new ObjectIndex.PendingPut(
                    item.valueLength(), generation, ep, segIds, offsets, clock.millis() + config.putTimeout().toMillis(),
                    upsert));
            if (superseded != null) {
                // an upsert wins over an earlier put of the same key still in flight; that one will find EXPIRED
                freeRegions(superseded.segments, superseded.offsets,
                        ObjectLayout.regionLength(key.length, superseded.valueLength),
                        superseded.epoch, superseded.generation, true);
            }
        } finally {
            shard.lock.unlock();
        }
        List<Replica> reps = new ArrayList<>(placed.size());
        for (int i = 0; i < segIds.length; i++) {
            reps.add(new Replica(segIds[i], offsets[i]));
        }
        return new PutStartResult(ResultCode.OK, generation, reps);
    }

    /** True if the key's complete object has this generation (a conditional upsert's precondition). */
    private static boolean holds(ObjectIndex.Shard shard, byte[] key, int hash, long generation) {
        shard.lock.lock();
        try {
            return holdsLocked(shard, key, hash, generation);
        } finally {
            shard.lock.unlock();
        }
    }

    private static boolean holdsLocked(ObjectIndex.Shard shard, byte[] key, int hash, long generation) {
        int slot = shard.objects.find(key, hash);
        return slot >= 0 && shard.objects.generation(slot) == generation;
    }

    private boolean present(ObjectIndex.Shard shard, byte[] key, int hash) {
        shard.lock.lock();
        try {
            return presentLocked(shard, key, hash);
        } finally {
            shard.lock.unlock();
        }
    }

    /**
     * A complete object, or a put in flight in the current epoch (one from before a reset no longer
     * holds its key). Caller holds the shard lock.
     */
    private boolean presentLocked(ObjectIndex.Shard shard, byte[] key, int hash) {
        if (shard.objects.find(key, hash) >= 0) {
            return true;
        }
        ObjectIndex.PendingPut p = shard.pending(key, hash);
        return p != null && p.epoch == epoch;
    }

    /** PUT_END: make each put visible, keeping the replicas whose writes succeeded. */
    public List<ResultCode> putEnd(List<PutEndItem> items) {
        ResultCode[] out = new ResultCode[items.size()];
        List<byte[]> upserted = new ArrayList<>();
        epochLock.readLock().lock();
        try {
            int tick = accessTick();
            index.forEachKey(items, PutEndItem::key,
                    (shard, i, key, hash) -> out[i] = putEndOne(shard, items.get(i), key, hash, tick, upserted));
        } finally {
            epochLock.readLock().unlock();
        }
        if (!upserted.isEmpty()) {
            // an upsert is absolute: once it returns, no client reads the value it replaced (nor, for a key
            // that was evicted meanwhile, the value it had), through a remembered location included
            settle(leases.publishKeys(upserted));
        }
        return new ArrayList<>(Arrays.asList(out));
    }

    /** One item of PUT_END. Caller holds the epoch read lock and the shard lock. */
    private ResultCode putEndOne(ObjectIndex.Shard shard, PutEndItem it, byte[] key, int hash, int tick,
                                 List<byte[]> upserted) {
        ObjectTable objects = shard.objects;
        ObjectIndex.PendingPut p = shard.pending(key, hash);
        if (p == null || p.generation != it.generation()) {
            int slot = objects.find(key, hash);
            return slot >= 0 && objects.generation(slot) == it.generation() ? ResultCode.OK : ResultCode.EXPIRED;
        }
        shard.pending.remove(new Key(key, hash));
        long regionLength = ObjectLayout.regionLength(key.length, p.valueLength);
        if (p.epoch != epoch) {
            return ResultCode.FENCED;
        }
        int kept = 0;
        int[] segs = new int[p.segments.length];
        long[] offs = new long[p.segments.length];
        for (int i = 0; i < p.segments.length; i++) {
            boolean failed = i < 64 && (it.failedReplicas() & (1L << i)) != 0;
            Segment s = segments.get(p.segments[i]);
            if (failed || s == null) {
                if (s != null) {
                    s.allocator.free(p.offsets[i], regionLength);
                    nodes.free(s, p.offsets[i], p.generation, Tier.MEMORY, false);
                }
                continue;
            }
            segs[kept] = p.segments[i];
            offs[kept] = p.offsets[i];
            kept++;
        }
        if (kept == 0) {
            return ResultCode.FAILED;
        }
        int slot = objects.find(key, hash);
        if (slot >= 0) {
            // an upsert completes: the old version's regions are freed as the new one takes its place
            release(objects, slot);
            objects.replace(slot, p.valueLength, p.generation, tick, segs, offs, kept);
        } else {
            objects.insert(key, hash, p.valueLength, p.generation, tick, segs, offs, kept);
        }
        if (p.upsert) {
            upserted.add(key);
        }
        return ResultCode.OK;
    }

    /** PUT_REVOKE: give back a reservation whose bytes could not be written. */
    public List<ResultCode> putRevoke(List<PutEndItem> items) {
        ResultCode[] out = new ResultCode[items.size()];
        epochLock.readLock().lock();
        try {
            index.forEachKey(items, PutEndItem::key, (shard, i, key, hash) -> {
                ObjectIndex.PendingPut p = shard.pending(key, hash);
                if (p == null || p.generation != items.get(i).generation()) {
                    out[i] = ResultCode.EXPIRED;
                    return;
                }
                shard.pending.remove(new Key(key, hash));
                freeRegions(p.segments, p.offsets, ObjectLayout.regionLength(key.length, p.valueLength), p.epoch,
                        p.generation, true);
                out[i] = ResultCode.OK;
            });
            return new ArrayList<>(Arrays.asList(out));
        } finally {
            epochLock.readLock().unlock();
        }
    }

    // ================================================================== read side

    /** GET_REPLICA_LIST: where to read each object. Counts as a read for LRU. */
    public List<ReplicaList> getReplicaList(List<byte[]> keys) {
        ReplicaList[] out = new ReplicaList[keys.size()];
        int tick = accessTick();
        index.lookupEach(keys, (shard, i, slot) -> {
            if (slot < 0) {
                out[i] = ReplicaList.NOT_FOUND;
                return;
            }
            ObjectTable objects = shard.objects;
            objects.touch(slot, tick);
            int n = objects.replicas(slot);
            List<Replica> reps = new ArrayList<>(n);
            for (int r = 0; r < n; r++) {
                reps.add(replica(objects.segment(slot, r), objects.offset(slot, r)));
            }
            out[i] = new ReplicaList(ResultCode.OK, objects.valueLength(slot), objects.generation(slot), reps);
        });
        return new ArrayList<>(Arrays.asList(out));
    }

    /** The probes (exists, prefixMatch, sizes; by key or by digest): they read the index only. */
    public Probes probes() {
        return probes;
    }

    // ================================================================== removal

    /** REMOVE: drop complete objects. NOT_FOUND for keys that were not there. */
    public List<ResultCode> remove(List<byte[]> keys) {
        ResultCode[] out = new ResultCode[keys.size()];
        epochLock.readLock().lock();
        try {
            index.forEachKey(keys, (shard, i, key, hash) -> {
                ObjectTable objects = shard.objects;
                int slot = objects.find(key, hash);
                if (slot < 0) {
                    out[i] = cancelSpill(new Key(key, hash)) ? ResultCode.OK : ResultCode.NOT_FOUND;
                    return;
                }
                release(objects, slot);
                objects.remove(slot);
                out[i] = ResultCode.OK;
            });
        } finally {
            epochLock.readLock().unlock();
        }
        // every key named, found or not: a client may remember a location of one evicted meanwhile
        settle(leases.publishKeys(keys));
        return new ArrayList<>(Arrays.asList(out));
    }

    /** REMOVE_BY_PREFIX: drop every complete object whose key starts with {@code prefix}. */
    public long removeByPrefix(byte[] prefix) {
        long[] n = {0};
        FreeBatch frees = new FreeBatch();
        epochLock.readLock().lock();
        try {
            index.forEachShard(shard -> {
                ObjectTable objects = shard.objects;
                if (prefix.length == 0) {
                    // everything goes: collect, then drop the shard's storage at once
                    for (int slot = 0; slot < objects.size(); slot++) {
                        collect(objects, slot, frees, false);
                    }
                    n[0] += objects.size();
                    objects.clear();
                    return;
                }
                n[0] += objects.removeIf(slot -> {
                    if (!objects.keyStartsWith(slot, prefix)) {
                        return false;
                    }
                    collect(objects, slot, frees, false);
                    return true;
                });
            });
            for (Key k : new ArrayList<>(spilling.keySet())) {
                if (Keys.hasPrefix(k.bytes, prefix) && cancelSpill(k)) {
                    n[0]++;
                }
            }
            // still under the epoch lock: a reset cannot slip in and free these regions first
            frees.apply(segments, nodes);
        } finally {
            epochLock.readLock().unlock();
        }
        settle(prefix.length == 0 ? leases.publishAll() : leases.publishPrefix(prefix));
        return n[0];
    }

    /**
     * Completes a removal whose invalidation {@code seq} is published: the nodes hear of the freed
     * regions (bounded wait), and every leased client applied it or its lease ran out.
     */
    private void settle(long seq) {
        nodes.flushRemovals();
        leases.await(seq);
    }

    /**
     * REMOVE_ALL. With {@code force}, moves to a new epoch so that no put in flight can land
     * afterwards; without it, removes the complete objects present now and leaves puts in flight
     * alone. Either way it returns only once every client has dropped the locations it remembered
     * (or its read lease ran out) and the nodes acknowledged (or their bound passed): after that no
     * reader anywhere gets a removed object.
     *
     * @return the number of objects removed
     */
    public long removeAll(boolean force) {
        if (!force) {
            return removeByPrefix(new byte[0]);
        }
        long n;
        long newEpoch;
        List<Segment> all;
        epochLock.writeLock().lock();
        try {
            newEpoch = epoch + 1;
            n = resetLocked(newEpoch);
            all = new ArrayList<>(segments.values());
        } finally {
            epochLock.writeLock().unlock();
        }
        long seq = leases.publishAll();
        nodes.reset(all, newEpoch);
        int waitedOut = leases.await(seq);
        if (waitedOut > 0) {
            log.info("removeAll(force): removed {} objects, now at epoch {}; {} client(s) did not answer and were"
                    + " waited out (their read leases ran out)", n, newEpoch, waitedOut);
        } else {
            log.info("removeAll(force): removed {} objects, now at epoch {}", n, newEpoch);
        }
        return n;
    }

    /** Drops every object and reservation, resets every allocator, moves to {@code newEpoch}. Holds the write lock. */
    private long resetLocked(long newEpoch) {
        spilling.clear();
        long n = index.objectCount();
        // pending puts stay, so their PUT_END can be answered FENCED; their space is void
        index.forEachShard(shard -> shard.objects.clear());
        for (Segment seg : segments.values()) {
            seg.allocator.reset();
        }
        epoch = newEpoch;
        return n;
    }

    // ================================================================== placement and eviction

    /**
     * Reserves {@code replicas} regions on distinct active segments ({@link Placement}); evicts and
     * retries when nothing fits. Caller holds the epoch read lock.
     */
    private List<Placement.Placed> place(long regionLength, int replicas, String preferred) {
        List<Placement.Placed> got = tryPlace(regionLength, replicas, preferred);
        if (!got.isEmpty() || capacity() == 0) {
            return got;
        }
        evictionLock.lock();
        try {
            for (int round = 0; round < MAX_EVICTION_ROUNDS_PER_PUT; round++) {
                // another put may have evicted while we waited for the lock
                got = tryPlace(regionLength, replicas, preferred);
                if (!got.isEmpty()) {
                    return got;
                }
                long target = Math.max((long) (capacity() * config.evictionRatio()), regionLength);
                if (evict(target) == 0) {
                    return got;
                }
            }
            return tryPlace(regionLength, replicas, preferred);
        } finally {
            evictionLock.unlock();
        }
    }

    private List<Placement.Placed> tryPlace(long regionLength, int replicas, String preferred) {
        return Placement.choose(segments.values(), regionLength, replicas, preferred, random);
    }

    /**
     * One eviction round: frees at least {@code targetBytes} (if that much is evictable) by removing
     * the least recently read complete objects. Returns bytes freed. Caller holds the epoch read lock.
     */
    long evict(long targetBytes) {
        evictionLock.lock();
        try {
            evictionAttempts.incrementAndGet();
            LruCut cut = LruCut.find(index, targetBytes, MasterService::memoryWeight);
            if (cut == null) {
                return 0;
            }
            // evict buckets below the cutoff entirely, and the cutoff bucket until the target is met
            long[] freedAndKeys = {0, 0};
            FreeBatch frees = new FreeBatch();
            index.forEachShard(shard -> {
                if (freedAndKeys[0] >= targetBytes) {
                    return;
                }
                ObjectTable objects = shard.objects;
                objects.removeIf(slot -> {
                    if (diskOnly(objects, slot)) {
                        return false;
                    }
                    if (!cut.takes(objects.lastAccess(slot), freedAndKeys[0] >= targetBytes)) {
                        return false;
                    }
                    // nodes with an SSD tier keep the object there; it comes back as a disk replica (NODE_DISK_ADD)
                    freedAndKeys[0] += collect(objects, slot, frees, true);
                    freedAndKeys[1]++;
                    return true;
                });
            });
            // nodes copy what they spill before the space can be handed to anyone else: tell them, wait, then free
            frees.notifyNodes(segments, nodes);
            nodes.flush();
            frees.freeAllocators(segments);
            long freed = freedAndKeys[0];
            long keys = freedAndKeys[1];
            if (keys > 0) {
                evictionSuccesses.incrementAndGet();
                evictedKeys.addAndGet(keys);
                evictedBytes.addAndGet(freed);
            }
            return freed;
        } finally {
            evictionLock.unlock();
        }
    }

    /** What an object weighs for memory eviction: its regions in memory, or -1 if it has none (disk only). */
    private static long memoryWeight(ObjectTable objects, int slot) {
        return diskOnly(objects, slot) ? -1 : regionLength(objects, slot) * objects.replicas(slot);
    }

    // ================================================================== membership

    /** REGISTER_NODE: admit a node's segment (JOINING until its inventory is in). */
    public RegisterReply registerNode(RegisterNode r) {
        HostPort address = new HostPort(r.host(), r.port());
        List<Segment> toReset = List.of();
        long newEpoch;
        Segment seg;
        boolean keep;
        epochLock.writeLock().lock();
        try {
            for (Segment existing : new ArrayList<>(segments.values())) {
                if (existing.name.equals(r.name())) {
                    dropSegmentLocked(existing, existing.nodeIncarnation == r.nodeIncarnation()
                            ? "it registered again" : "its node restarted");
                }
            }
            if (!epochKnown) {
                epoch = Math.max(epoch, r.epoch());
                epochKnown = true;
            } else if (r.epoch() > epoch) {
                // a node saw a reset we do not know about (we restarted since): what we rebuilt is older
                log.warn("segment {} reports epoch {} > ours {}; dropping objects from the older epoch", r.name(),
                        r.epoch(), epoch);
                resetLocked(r.epoch());
                toReset = new ArrayList<>(segments.values());
            }
            keep = r.epoch() == epoch;
            newEpoch = epoch;
            seg = new Segment(nextSegmentId.getAndIncrement(), r.name(), address, r.capacity(), r.nodeIncarnation(),
                    r.shmPath(), clock.millis());
            segments.put(seg.id, seg);
        } finally {
            epochLock.writeLock().unlock();
        }
        if (!toReset.isEmpty()) {
            // objects rebuilt from an older epoch were dropped: as absolute as any reset
            long seq = leases.publishAll();
            nodes.reset(toReset, newEpoch);
            leases.await(seq);
        }
        log.info("{} registered at {} with {} bytes; {} objects offered{}", seg, address, r.capacity(),
                r.inventoryCount(), keep ? "" : " (older epoch " + r.epoch() + ": dropped)");
        return new RegisterReply(seg.id, newEpoch, keep);
    }

    /** NODE_INVENTORY: take over objects a node already holds. ALREADY_EXISTS tells the node to drop one. */
    public List<ResultCode> inventory(Inventory inv) {
        for (InventoryItem it : inv.items()) {
            checkKeyLength(it.key());
        }
        List<ResultCode> out = new ArrayList<>(inv.items().size());
        epochLock.writeLock().lock();
        try {
            Segment seg = segments.get(inv.segmentId());
            if (seg == null || seg.nodeIncarnation != inv.nodeIncarnation()) {
                throw new BadRequestException("node_inventory for segment id " + inv.segmentId()
                        + ", which is not registered (register again)");
            }
            int tick = accessTick();
            for (InventoryItem it : inv.items()) {
                out.add(adopt(seg, it, tick));
            }
            if (inv.last()) {
                seg.active = true;
                log.info("{} active: {} objects, {} bytes used", seg, seg.allocator.allocations(), seg.allocator.used());
            }
            return out;
        } finally {
            epochLock.writeLock().unlock();
        }
    }

    private ResultCode adopt(Segment seg, InventoryItem it, int tick) {
        if (it.epoch() != epoch) {
            return ResultCode.ALREADY_EXISTS;
        }
        if (it.tier() == Tier.DISK) {
            return adoptDisk(seg, it, tick);
        }
        byte[] key = it.key();
        int hash = index.hash(key);
        long regionLength = ObjectLayout.regionLength(key.length, it.valueLength());
        ObjectIndex.Shard shard = index.shard(hash);
        shard.lock.lock();
        try {
            if (shard.pending(key, hash) != null) {
                return ResultCode.ALREADY_EXISTS;
            }
            ObjectTable objects = shard.objects;
            int slot = objects.find(key, hash);
            if (slot >= 0 && objects.generation(slot) == it.generation() && objects.valueLength(slot) == it.valueLength()) {
                // another replica of the same object version: keep it as one more replica
                if (replicaIndex(objects, slot, seg.id) >= 0 || !seg.allocator.reserve(it.offset(), regionLength)) {
                    return ResultCode.ALREADY_EXISTS;
                }
                objects.addReplica(slot, seg.id, it.offset());
                return ResultCode.OK;
            }
            if (slot >= 0 && objects.generation(slot) >= it.generation()) {
                // an older version (an upsert replaced it), or a copy that disagrees with the one held
                return ResultCode.ALREADY_EXISTS;
            }
            if (!seg.allocator.reserve(it.offset(), regionLength)) {
                return ResultCode.ALREADY_EXISTS;
            }
            int[] segs = {seg.id};
            long[] offs = {it.offset()};
            if (slot >= 0) {
                // this copy is newer than the one listed first: it wins, the older one is freed
                release(objects, slot);
                objects.replace(slot, it.valueLength(), it.generation(), tick, segs, offs, 1);
            } else {
                objects.insert(key, hash, it.valueLength(), it.generation(), tick, segs, offs, 1);
            }
            generations.accumulateAndGet(it.generation() + 1, Math::max);
            return ResultCode.OK;
        } finally {
            shard.lock.unlock();
        }
    }

    /**
     * An object in a node's SSD tier (from its inventory, or just spilled there): listed as a disk
     * replica unless the key is held by something else (a newer version, a put in flight).
     * Caller holds the epoch lock (either mode).
     */
    private ResultCode adoptDisk(Segment seg, InventoryItem it, int tick) {
        byte[] key = it.key();
        int hash = index.hash(key);
        ObjectIndex.Shard shard = index.shard(hash);
        shard.lock.lock();
        try {
            if (presentLocked(shard, key, hash)) {
                ObjectTable objects = shard.objects;
                int slot = objects.find(key, hash);
                if (slot >= 0 && objects.generation(slot) == it.generation() && replicaIndex(objects, slot, seg.id) < 0) {
                    objects.addReplica(slot, seg.id | DISK_BIT, 0);
                    return ResultCode.OK;
                }
                return ResultCode.ALREADY_EXISTS;
            }
            shard.objects.insert(key, hash, it.valueLength(), it.generation(), tick, new int[]{seg.id | DISK_BIT},
                    new long[]{0}, 1);
            generations.accumulateAndGet(it.generation() + 1, Math::max);
            return ResultCode.OK;
        } finally {
            shard.lock.unlock();
        }
    }

    /** NODE_DISK_ADD: objects a node just spilled to its SSD tier become visible again, as disk replicas. */
    public List<ResultCode> diskAdd(Inventory inv) {
        List<ResultCode> out = new ArrayList<>(inv.items().size());
        epochLock.readLock().lock();
        try {
            Segment seg = registered(inv.segmentId(), inv.nodeIncarnation(), "node_disk_add");
            int tick = accessTick();
            for (InventoryItem it : inv.items()) {
                Spill s = spilling.get(new Key(it.key(), index.hash(it.key())));
                if (it.epoch() != epoch) {
                    out.add(ResultCode.FENCED);
                } else if (s == null || s.generation != it.generation() || s.segmentId != seg.id) {
                    // already listed (a report repeated after a lost reply, or the node's inventory
                    // listed it after a re-registration): nothing to do; else removed or replaced
                    // while on its way to disk
                    out.add(listedOnDisk(seg, it) ? ResultCode.OK : ResultCode.EXPIRED);
                } else {
                    spilling.remove(new Key(it.key(), index.hash(it.key())), s);
                    out.add(adoptDisk(seg, it, tick));
                }
            }
            return out;
        } finally {
            epochLock.readLock().unlock();
        }
    }

    /** What to do, under its shard's lock, with an object's disk replica on a segment. */
    private interface DiskReplicaAction {
        /** {@code replica} is the replica's index, or -1 if the object has no disk replica there at that generation. */
        ResultCode apply(ObjectTable objects, int slot, int replica);
    }

    /** Finds the disk replica of {@code it}'s key and generation on {@code seg} and applies {@code action}. */
    private ResultCode withDiskReplica(Segment seg, InventoryItem it, DiskReplicaAction action) {
        byte[] key = it.key();
        int hash = index.hash(key);
        ObjectIndex.Shard shard = index.shard(hash);
        shard.lock.lock();
        try {
            ObjectTable objects = shard.objects;
            int slot = objects.find(key, hash);
            int r = slot < 0 || objects.generation(slot) != it.generation() ? -1 : replicaIndex(objects, slot, seg.id);
            return action.apply(objects, slot, r >= 0 && onDisk(objects.segment(slot, r)) ? r : -1);
        } finally {
            shard.lock.unlock();
        }
    }

    /** Whether the key is listed at this generation with a disk replica on {@code seg}. */
    private boolean listedOnDisk(Segment seg, InventoryItem it) {
        return withDiskReplica(seg, it, (objects, slot, r) -> r >= 0 ? ResultCode.OK : ResultCode.NOT_FOUND)
                == ResultCode.OK;
    }

    /** NODE_DISK_DROP: a node's SSD tier let objects go; their disk replicas (that generation only) leave the index. */
    public List<ResultCode> diskDrop(Inventory inv) {
        List<ResultCode> out = new ArrayList<>(inv.items().size());
        epochLock.readLock().lock();
        try {
            Segment seg = registered(inv.segmentId(), inv.nodeIncarnation(), "node_disk_drop");
            for (InventoryItem it : inv.items()) {
                out.add(withDiskReplica(seg, it, (objects, slot, r) -> {
                    if (r < 0) {
                        return ResultCode.NOT_FOUND;
                    }
                    if (objects.replicas(slot) == 1) {
                        objects.remove(slot);
                    } else {
                        objects.removeReplica(slot, r);
                    }
                    return ResultCode.OK;
                }));
            }
            return out;
        } finally {
            epochLock.readLock().unlock();
        }
    }

    private Segment registered(int segmentId, long nodeIncarnation, String op) {
        Segment seg = segments.get(segmentId);
        if (seg == null || seg.nodeIncarnation != nodeIncarnation) {
            throw new BadRequestException(op + " for segment id " + segmentId + ", which is not registered (register again)");
        }
        return seg;
    }

    /** NODE_HEARTBEAT: NOT_FOUND tells the node to register again. */
    public HeartbeatReply heartbeat(int segmentId, long nodeIncarnation) {
        return heartbeat(segmentId, nodeIncarnation, null);
    }

    /** NODE_HEARTBEAT with the node's per-tier counters (kept for metrics and status). */
    public HeartbeatReply heartbeat(int segmentId, long nodeIncarnation, TierStats tiers) {
        Segment seg = segments.get(segmentId);
        if (seg == null || seg.nodeIncarnation != nodeIncarnation) {
            return new HeartbeatReply(ResultCode.NOT_FOUND, epoch);
        }
        if (tiers != null) {
            seg.tiers = tiers;
        }
        seg.lastHeartbeatMillis = clock.millis();
        return new HeartbeatReply(ResultCode.OK, epoch);
    }

    /** Removes a segment and every replica on it; objects left with no replica are gone. Holds the write lock. */
    private void dropSegmentLocked(Segment seg, String why) {
        segments.remove(seg.id);
        long[] lost = {0};
        index.forEachShard(shard -> {
            ObjectTable objects = shard.objects;
            objects.removeIf(slot -> {
                int idx = replicaIndex(objects, slot, seg.id);
                if (idx < 0) {
                    return false;
                }
                if (objects.replicas(slot) == 1) {
                    lost[0]++;
                    return true;
                }
                objects.removeReplica(slot, idx);
                return false;
            });
        });
        nodes.forget(seg);
        droppedSegments.incrementAndGet();
        log.warn("{} dropped ({}): {} objects lost with it", seg, why, lost[0]);
    }

    // ================================================================== timers

    /**
     * Runs the timers once: drops nodes silent past the TTL, reclaims puts past their timeout, forgets
     * long-gone clients, and evicts when usage is at the high watermark. Called periodically by the
     * server, and directly by tests with a manual clock.
     */
    public void tick() {
        long now = clock.millis();
        List<Segment> silent = new ArrayList<>();
        for (Segment s : segments.values()) {
            if (now - s.lastHeartbeatMillis > config.nodeTtl().toMillis()) {
                silent.add(s);
            }
        }
        if (!silent.isEmpty()) {
            epochLock.writeLock().lock();
            try {
                for (Segment s : silent) {
                    if (segments.get(s.id) == s && now - s.lastHeartbeatMillis > config.nodeTtl().toMillis()) {
                        dropSegmentLocked(s, "no heartbeat for " + (now - s.lastHeartbeatMillis) + " ms");
                    }
                }
            } finally {
                epochLock.writeLock().unlock();
            }
        }
        epochLock.readLock().lock();
        try {
            index.forEachShard(shard -> shard.pending.entrySet().removeIf(e -> {
                ObjectIndex.PendingPut p = e.getValue();
                if (p.deadlineMillis >= now) {
                    return false;
                }
                freeRegions(p.segments, p.offsets, ObjectLayout.regionLength(e.getKey().bytes.length, p.valueLength), p.epoch,
                        p.generation, true);
                expiredPuts.incrementAndGet();
                return true;
            }));
            long cap = capacity();
            long used = allocated();
            if (cap > 0 && used >= config.highWatermark() * cap) {
                // one round brings usage to (watermark - ratio), and frees at least ratio of capacity
                long toLowMark = used - (long) ((config.highWatermark() - config.evictionRatio()) * cap);
                evict(Math.max((long) (config.evictionRatio() * cap), toLowMark));
            }
        } finally {
            epochLock.readLock().unlock();
        }
        spilling.values().removeIf(s -> s.deadlineMillis < now);
        leases.expire();
        long forget = now - 10 * config.clientTtl().toMillis();
        clients.values().removeIf(seen -> seen < forget);
    }

    // ================================================================== stats

    /** Objects evicted since start. */
    public long evictedKeyCount() {
        return evictedKeys.get();
    }

    public long keyCount() {
        return index.objectCount();
    }

    public long capacity() {
        long n = 0;
        for (Segment s : segments.values()) {
            if (s.active) {
                n += s.allocator.capacity();
            }
        }
        return n;
    }

    public long allocated() {
        long n = 0;
        for (Segment s : segments.values()) {
            if (s.active) {
                n += s.allocator.used();
            }
        }
        return n;
    }

    /** One row per segment, ordered by id. */
    public List<SegmentInfo> segmentInfos() {
        long now = clock.millis();
        List<SegmentInfo> out = new ArrayList<>();
        List<Segment> sorted = new ArrayList<>(segments.values());
        sorted.sort(Comparator.comparingInt(s -> s.id));
        for (Segment s : sorted) {
            out.add(new SegmentInfo(s.id, s.name, s.address.host(), s.address.port(), s.allocator.capacity(),
                    s.allocator.used(), s.allocator.allocations(),
                    s.active ? SegmentInfo.STATE_ACTIVE : SegmentInfo.STATE_JOINING, now - s.lastHeartbeatMillis,
                    s.shmPath, s.tiers));
        }
        return out;
    }

    public ClusterStats stats() {
        return new ClusterStats(incarnation, epoch, keyCount(), index.pendingCount(), allocated(), capacity(),
                activeClients(), segmentInfos());
    }

    // ================================================================== helpers

    /**
     * A replica's segment id as the index stores it: the segment id, with {@link #DISK_BIT} set for a
     * copy in that node's SSD tier (found there by generation; its offset is 0).
     */
    static final int DISK_BIT = 1 << 30;

    static boolean onDisk(int storedSegment) {
        return (storedSegment & DISK_BIT) != 0;
    }

    static int segmentId(int storedSegment) {
        return storedSegment & ~DISK_BIT;
    }

    private static Replica replica(int storedSegment, long offset) {
        return new Replica(segmentId(storedSegment), onDisk(storedSegment) ? Tier.DISK : Tier.MEMORY, offset);
    }

    /** The region an object takes on each of its replicas (header, key and value). */
    private static long regionLength(ObjectTable objects, int slot) {
        return ObjectLayout.regionLength(objects.keyLength(slot), objects.valueLength(slot));
    }

    /** Frees a complete object's regions and tells their nodes. Returns bytes freed. Caller holds the shard lock. */
    private long release(ObjectTable objects, int slot) {
        long len = regionLength(objects, slot);
        long generation = objects.generation(slot);
        long freed = 0;
        for (int i = 0, n = objects.replicas(slot); i < n; i++) {
            int stored = objects.segment(slot, i);
            Segment s = segments.get(segmentId(stored));
            if (s == null) {
                continue;
            }
            long offset = objects.offset(slot, i);
            if (onDisk(stored)) {
                nodes.free(s, offset, generation, Tier.DISK, false);
            } else {
                s.allocator.free(offset, len);
                nodes.free(s, offset, generation, Tier.MEMORY, false);
                freed += len;
            }
        }
        return freed;
    }

    /**
     * Queues a complete object's copies on a batch instead of freeing them now. With {@code spill},
     * memory copies on nodes that have an SSD tier are moved there rather than dropped. Returns the
     * memory bytes the batch will free.
     */
    private long collect(ObjectTable objects, int slot, FreeBatch batch, boolean spill) {
        long len = regionLength(objects, slot);
        long generation = objects.generation(slot);
        long memory = 0;
        for (int i = 0, n = objects.replicas(slot); i < n; i++) {
            int stored = objects.segment(slot, i);
            if (onDisk(stored)) {
                batch.add(segmentId(stored), objects.offset(slot, i), 0, generation, Tier.DISK, false);
            } else {
                Segment s = segments.get(stored);
                boolean toDisk = spill && s != null && s.tiers.hasDisk();
                batch.add(stored, objects.offset(slot, i), len, generation, Tier.MEMORY, toDisk);
                if (toDisk) {
                    spilling.put(new Key(objects.key(slot), objects.hash(slot)),
                            new Spill(generation, stored, clock.millis() + SPILL_TIMEOUT_MILLIS));
                }
                memory += len;
            }
        }
        return memory;
    }

    /** Forgets a spill in flight and tells its node to drop the disk copy if it made it there. */
    private boolean cancelSpill(Key key) {
        Spill s = spilling.remove(key);
        if (s == null) {
            return false;
        }
        Segment seg = segments.get(s.segmentId);
        if (seg != null) {
            nodes.free(seg, 0, s.generation, Tier.DISK, false);
        }
        return true;
    }

    /** True when every copy of the object is in an SSD tier: it takes no memory and memory eviction skips it. */
    private static boolean diskOnly(ObjectTable objects, int slot) {
        for (int i = 0, n = objects.replicas(slot); i < n; i++) {
            if (!onDisk(objects.segment(slot, i))) {
                return false;
            }
        }
        return true;
    }

    /**
     * Frees a reservation's regions, unless it belongs to an older epoch (a reset already reclaimed
     * that space wholesale). Caller holds the epoch read lock and the shard lock.
     */
    private void freeRegions(int[] segIds, long[] offsets, long regionLength, long ep, long generation, boolean notify) {
        if (ep != epoch) {
            return;
        }
        for (int i = 0; i < segIds.length; i++) {
            Segment s = segments.get(segIds[i]);
            if (s != null) {
                s.allocator.free(offsets[i], regionLength);
                if (notify) {
                    nodes.free(s, offsets[i], generation, Tier.MEMORY, false);
                }
            }
        }
    }

    /** Which replica of the object in {@code slot} is on segment {@code segmentId} (either tier), or -1. */
    private static int replicaIndex(ObjectTable objects, int slot, int segmentId) {
        for (int i = 0, n = objects.replicas(slot); i < n; i++) {
            if (segmentId(objects.segment(slot, i)) == segmentId) {
                return i;
            }
        }
        return -1;
    }
}
