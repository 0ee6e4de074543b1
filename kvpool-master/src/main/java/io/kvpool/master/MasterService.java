package io.kvpool.master;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.master.events.KvEventSink;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.WriteGrants;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.LeaseMessages.LeaseReply;
import io.kvpool.protocol.msg.LeaseMessages.LeaseRequest;
import io.kvpool.protocol.msg.MasterMessages.ClusterStats;
import io.kvpool.protocol.msg.MasterMessages.PutEndItem;
import io.kvpool.protocol.msg.MasterMessages.PutStart;
import io.kvpool.protocol.msg.MasterMessages.PutStartItem;
import io.kvpool.protocol.msg.MasterMessages.PutStartReply;
import io.kvpool.protocol.msg.MasterMessages.PutStartResult;
import io.kvpool.protocol.msg.MasterMessages.ReplicaList;
import io.kvpool.protocol.msg.MasterMessages.SegmentInfo;
import io.kvpool.protocol.msg.Replica;
import io.kvpool.protocol.msg.WriteLeaseMessages;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.time.InstantSource;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;
import java.util.function.Function;
import java.util.function.LongSupplier;
import java.util.random.RandomGenerator;

/**
 * The master's state machine: the put, read and removal paths over the object index, the clients,
 * the timers, and the parts it is built from. Transport-free (see {@link MasterHandler} for the wire
 * side) and driven by an injected clock through {@link #tick()}, so tests run it step by step without
 * sleeping.
 *
 * <h2>Parts</h2>
 * <ul>
 *   <li>{@link ObjectIndex}: complete objects and pending puts, in independently locked shards.</li>
 *   <li>{@link Segments}: the registered segments and their space.</li>
 *   <li>{@link Epoch}: the cluster epoch and the lock that fences it.</li>
 *   <li>{@link Eviction}: placement when memory runs short, eviction rounds, the LRU clock
 *       ({@link #eviction()}).</li>
 *   <li>{@link SpillLedger}: evicted objects on their way to a node's SSD tier.</li>
 *   <li>{@link Membership}: registration, heartbeats, inventories, disk reports, node loss
 *       ({@link #membership()}).</li>
 *   <li>{@link Probes}: exists, prefixMatch and sizes ({@link #probes()}).</li>
 *   <li>{@link Removals}: by key, by prefix and all, each settled with the nodes and the clients.</li>
 *   <li>{@link LostCopies} (in {@link ObjectEvents}): objects lost with a dropped node that it may bring back.</li>
 *   <li>{@link ReadLeases}: what makes removals absolute.</li>
 *   <li>{@link WriteLeases}: ranges writers fill without asking, made visible by COMMIT.</li>
 * </ul>
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
 * readers no longer depend on them for this guarantee. A removal also cancels a spill of the key
 * still on its way to disk ({@link SpillLedger}), and revokes a copy of it lost with a dropped node
 * ({@link LostCopies}), so that node cannot bring the key back when it returns.
 *
 * <h2>Locks</h2>
 * In the order they are taken: the epoch lock ({@link Epoch}), the eviction lock ({@link Eviction}),
 * one shard's lock (taken only inside {@link ObjectIndex}: work on a shard is handed to it), and
 * each allocator's monitor. Waits for nodes and for clients happen after the epoch lock is let go,
 * except an eviction round's wait for the nodes to take its spills.
 */
public final class MasterService {

    private static final Logger log = LoggerFactory.getLogger(MasterService.class);

    private final MasterConfig config;
    private final InstantSource clock;
    private final NodeNotifier nodes;
    private final long incarnation = ThreadLocalRandom.current().nextLong();

    private final ObjectIndex index;
    private final Segments segments;
    private final SpillLedger spills;
    private final Epoch epoch;
    private final Eviction eviction;
    private final PutEnds putEnds;
    private final Membership membership;
    private final Probes probes;
    private final Repair repair;
    /** Write leases: ranges writers place objects in without asking, made visible by COMMIT. */
    final WriteLeases writeLeases;
    /** Generations handed to puts; rebuilt objects raise it past theirs ({@link Membership}). */
    private final AtomicLong generations;
    /** Signs what each put and lease may write, for the nodes to check (keyed by the admin secret). */
    private final WriteGrants grants;
    private final Map<UUID, Long> clients = new ConcurrentHashMap<>();
    /** Read leases and invalidations: what makes removals, resets and upserts absolute (see {@link ReadLeases}). */
    final ReadLeases leases;
    /** What standby masters follow (FEED_FOLLOW, FEED_SNAPSHOT). */
    final FeedSource feed;

    final AtomicLong expiredPuts = new AtomicLong();
    /** The last resets, for the status page. */
    final RecentResets resets;
    private final Removals removals;

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
        this.config = config;
        this.clock = clock;
        this.nodes = nodes;
        this.index = index;
        long startMillis = clock.millis();
        // generations only need to be unique per region; starting from the clock keeps them rising across restarts
        this.generations = new AtomicLong(startMillis << 10);
        this.leases = new ReadLeases(incarnation, config.readLease(), leaseNanos, startGrace);
        this.segments = new Segments(nodes, index.events.feed);
        this.spills = new SpillLedger(index, segments, clock);
        this.epoch = new Epoch(index, segments, spills);
        this.eviction = new Eviction(config, clock, startMillis, random, index, segments, spills, nodes);
        this.repair = new Repair(clock, epoch, index, segments, nodes, random);
        this.grants = WriteGrants.of(config.secrets());
        this.writeLeases = new WriteLeases(config, clock, epoch, index, segments, eviction, nodes, generations, grants);
        this.membership = new Membership(config, clock, epoch, index, segments, spills, leases, nodes, generations,
                eviction::accessTick, repair::markDirty, writeLeases);
        this.probes = new Probes(index);
        this.resets = new RecentResets(clock);
        this.removals = new Removals(index, epoch, segments, spills, nodes, leases, resets);
        this.putEnds = new PutEnds(epoch, segments, nodes, repair);
        index.events.tenants.configure(config.tenants(), index);
        this.feed = new FeedSource(incarnation, config.term(), index, segments, epoch, generations);
    }

    /**
     * The master as a server runs it: leases on the monotonic clock, with the start grace; over a promoted
     * standby's copy of the previous leader's metadata unless {@code copy} is null ({@link TakeOver}).
     */
    static MasterService serving(MasterConfig config, InstantSource clock, RandomGenerator random, NodeNotifier nodes,
                                 StandbyCopy copy) {
        MasterService s = new MasterService(config, clock, random, nodes, copy == null ? new ObjectIndex() : copy.index,
                System::nanoTime, true);
        if (copy != null) {
            TakeOver.apply(copy, s.index, s.segments, s.epoch, s.generations, clock.millis());
            s.repair.holdOff(Repair.RETRY_MILLIS);
        }
        return s;
    }

    public MasterConfig config() {
        return config;
    }

    public long incarnation() {
        return incarnation;
    }

    public long epoch() {
        return epoch.current();
    }

    /** Nodes joining, beating, listing what they hold, and being lost. */
    public Membership membership() {
        return membership;
    }

    /** Eviction rounds and their counters. */
    public Eviction eviction() {
        return eviction;
    }

    /** Namespaces by key prefix, their use and quotas. */
    Tenants tenants() {
        return index.events.tenants;
    }

    /** Takes {@code t} as the tenants from now on (a run-time change), re-counting what each holds. */
    public void configureTenants(List<Tenant> t) {
        epoch.shared().lock(); // no reset clears a shard mid-count
        try {
            index.events.tenants.configure(t, index);
        } finally {
            epoch.shared().unlock();
        }
    }

    /** From now on tells {@code sink} what the index lists, and where (KV events for routers; NONE: nobody). */
    public void publishEvents(KvEventSink sink) {
        index.events.publishTo(sink);
    }

    /** Background repair of objects below the copies their put asked for. */
    Repair repair() {
        return repair;
    }

    /** The probes (exists, prefixMatch, sizes; by key or by digest): they read the index only. */
    public Probes probes() {
        return probes;
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
            ObjectIndex.checkKeyLength(item.key());
        }
        List<PutStartResult> results = new ArrayList<>(req.items().size());
        epoch.shared().lock();
        try {
            long ep = epoch.current();
            for (PutStartItem item : req.items()) {
                results.add(putStartOne(item, req.upsert(), replicas, req.preferredSegment(), req.pinSeconds(), ep));
            }
            return new PutStartReply(ep, config.term(), results);
        } finally {
            epoch.shared().unlock();
        }
    }

    /** One item of PUT_START. Caller holds the epoch read lock, and no shard lock (placing may evict). */
    private PutStartResult putStartOne(PutStartItem item, boolean upsert, int replicas, String preferred, int pinSeconds,
                                       long ep) {
        if (item.valueLength() > config.maxValueSize().bytes()) {
            return PutStartResult.of(ResultCode.TOO_LARGE);
        }
        byte[] key = item.key();
        int hash = index.hash(key);
        // a plain put needs the key free, a conditional upsert the generation it names; a plain upsert nothing
        boolean conditional = !upsert || item.ifGeneration() != 0;
        @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
        Function<ObjectIndex.Shard, Boolean> refusedNow = shard -> refused(shard, item, hash, upsert, ep);
        if (conditional && index.withShard(hash, refusedNow)) {
            return PutStartResult.of(ResultCode.ALREADY_EXISTS);
        }
        long regionLength = ObjectLayout.regionLength(key.length, item.valueLength());
        ResultCode quota = tenants().admit(key, regionLength * replicas, eviction); // may evict the tenant's own
        if (quota != ResultCode.OK) {
            return PutStartResult.of(quota);
        }
        List<Placement.Placed> placed = eviction.place(regionLength, replicas, preferred);
        if (placed.isEmpty()) {
            return PutStartResult.of(segments.placeableCapacity() == 0 ? ResultCode.NO_SEGMENT : ResultCode.POOL_FULL);
        }
        int[] segIds = new int[placed.size()];
        long[] offsets = new long[placed.size()];
        for (int i = 0; i < placed.size(); i++) {
            segIds[i] = placed.get(i).segment().id;
            offsets[i] = placed.get(i).offset();
        }
        long generation = generations.incrementAndGet();
        long pinUntil = pinUntil(pinSeconds, regionLength * replicas);
        @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
        Function<ObjectIndex.Shard, ResultCode> reserve = shard -> {
            // checked again: the key may have been taken while we placed
            if (conditional && refused(shard, item, hash, upsert, ep)) {
                freeRegions(segIds, offsets, regionLength, ep, generation, false);
                return ResultCode.ALREADY_EXISTS;
            }
            ObjectIndex.PendingPut superseded = shard.pending.put(new Key(key, hash), new ObjectIndex.PendingPut(
                    item.valueLength(), generation, ep, segIds, offsets, clock.millis() + config.putTimeout().toMillis(),
                    upsert, replicas, pinUntil));
            if (superseded != null) {
                // an upsert wins over an earlier put of the same key still in flight; that one will find EXPIRED
                freeRegions(superseded.segments, superseded.offsets,
                        ObjectLayout.regionLength(key.length, superseded.valueLength),
                        superseded.epoch, superseded.generation, true);
            }
            return ResultCode.OK;
        };
        ResultCode code = index.withShard(hash, reserve);
        if (code != ResultCode.OK) {
            return PutStartResult.of(code);
        }
        List<Replica> reps = new ArrayList<>(placed.size());
        List<byte[]> macs = new ArrayList<>(placed.size());
        for (int i = 0; i < segIds.length; i++) {
            reps.add(new Replica(segIds[i], offsets[i]));
            macs.add(grants.sign(segIds[i], config.term(), offsets[i], regionLength, generation, 1).mac());
        }
        return new PutStartResult(ResultCode.OK, generation, reps, pinUntil != 0, macs);
    }

    /** Frees owed to nodes that could not be reached ({@link UndeliveredFrees}). */
    public long undeliveredFrees() {
        return nodes.undeliveredFrees();
    }

    /** Objects lost with a dropped node that it may still bring back ({@link LostCopies}). */
    public long lostCopies() {
        return index.events.lost.size();
    }

    /** Names of the segments whose lost objects are remembered (the next leader makes them come back empty). */
    Set<String> lostOn() {
        return index.events.lost.segments();
    }

    /** Pins asked for and refused because the pool's pins were at their cap. */
    final AtomicLong pinsRefused = new AtomicLong();

    /**
     * The deadline of the pin a put asks for ({@code pinSeconds}; {@link PutStart#PIN_FOREVER}: none), or
     * 0 when it asks for none or the pins would pass their cap ({@link MasterConfig#maxPinnedFraction()}
     * of the memory capacity; puts in flight at once may pass it by their own size).
     */
    private long pinUntil(int pinSeconds, long weight) {
        if (pinSeconds == 0) {
            return 0;
        }
        if (index.pinnedBytes() + weight > config.maxPinnedFraction() * segments.capacity()) {
            pinsRefused.incrementAndGet();
            return 0;
        }
        return pinSeconds == PutStart.PIN_FOREVER ? Long.MAX_VALUE : clock.millis() + pinSeconds * 1000L;
    }

    /**
     * Whether a put of the item is refused: a plain put's key is taken (a complete object, or a put in
     * flight in epoch {@code ep}); a conditional upsert's key does not hold the generation it names.
     */
    @GuardedBy("shard.lock")
    private static boolean refused(ObjectIndex.Shard shard, PutStartItem item, int hash, boolean upsert, long ep) {
        return upsert
                ? item.ifGeneration() != 0 && !shard.holds(item.key(), hash, item.ifGeneration())
                : shard.taken(item.key(), hash, ep);
    }

    /** PUT_END: make each put visible, keeping the replicas whose writes succeeded. */
    public List<ResultCode> putEnd(List<PutEndItem> items) {
        ResultCode[] out = new ResultCode[items.size()];
        List<byte[]> upserted = new ArrayList<>();
        epoch.shared().lock();
        try {
            int tick = eviction.accessTick();
            @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
            ObjectIndex.KeyVisitor end = (shard, i, key, hash) -> out[i] = putEnds.one(shard, items.get(i), key, hash, tick,
                    upserted);
            index.forEachKey(items, PutEndItem::key, end);
        } finally {
            epoch.shared().unlock();
        }
        if (!upserted.isEmpty()) {
            // an upsert is absolute: once it returns, no client reads the value it replaced (nor, for a key
            // that was evicted meanwhile, the value it had), through a remembered location included
            removals.settle(leases.publishKeys(upserted));
        }
        return new ArrayList<>(Arrays.asList(out));
    }

    /** PUT_REVOKE: give back a reservation whose bytes could not be written. */
    public List<ResultCode> putRevoke(List<PutEndItem> items) {
        ResultCode[] out = new ResultCode[items.size()];
        epoch.shared().lock();
        try {
            @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
            ObjectIndex.KeyVisitor revoke = (shard, i, key, hash) -> {
                ObjectIndex.PendingPut p = shard.pending(key, hash);
                if (p == null || p.generation != items.get(i).generation()) {
                    out[i] = ResultCode.EXPIRED;
                    return;
                }
                shard.pending.remove(new Key(key, hash));
                freeRegions(p.segments, p.offsets, ObjectLayout.regionLength(key.length, p.valueLength), p.epoch,
                        p.generation, true);
                out[i] = ResultCode.OK;
            };
            index.forEachKey(items, PutEndItem::key, revoke);
            return new ArrayList<>(Arrays.asList(out));
        } finally {
            epoch.shared().unlock();
        }
    }

    /**
     * Frees a reservation's regions, unless it belongs to an older epoch (a reset already reclaimed
     * that space wholesale). Caller holds the epoch read lock and a shard's lock.
     */
    @GuardedBy("epoch.shared()")
    private void freeRegions(int[] segIds, long[] offsets, long regionLength, long ep, long generation, boolean notify) {
        if (ep != epoch.current()) {
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

    // ================================================================== put under a write lease

    /** WRITE_LEASE: a range of a segment for one writer (see {@link WriteLeases}). */
    public WriteLeaseMessages.Granted writeLease(WriteLeaseMessages.Grant req) {
        epoch.shared().lock();
        try {
            return writeLeases.grant(req);
        } finally {
            epoch.shared().unlock();
        }
    }

    /** COMMIT: objects written inside a lease become visible; an upsert's invalidation is published first. */
    public List<ResultCode> commit(WriteLeaseMessages.Commit req) {
        for (WriteLeaseMessages.CommitItem item : req.items()) {
            ObjectIndex.checkKeyLength(item.key());
        }
        List<byte[]> upserted = new ArrayList<>();
        List<ResultCode> out;
        epoch.shared().lock();
        try {
            out = writeLeases.commit(req, upserted);
        } finally {
            epoch.shared().unlock();
        }
        if (!upserted.isEmpty()) {
            removals.settle(leases.publishKeys(upserted));
        }
        return out;
    }

    /** RELEASE: gives back what a lease did not use. */
    public void release(long leaseId) {
        epoch.shared().lock();
        try {
            writeLeases.release(leaseId);
        } finally {
            epoch.shared().unlock();
        }
    }

    // ================================================================== read side

    /** GET_REPLICA_LIST: where to read each object. Counts as a read for LRU. */
    public List<ReplicaList> getReplicaList(List<byte[]> keys) {
        return Locations.of(index, eviction.accessTick(), keys);
    }

    // ================================================================== removal ({@link Removals})

    /** REMOVE: drop complete objects. NOT_FOUND for keys that were not there. */
    public List<ResultCode> remove(List<byte[]> keys) {
        return removals.remove(keys);
    }

    /** REMOVE_BY_PREFIX: drop every complete object whose key starts with {@code prefix}. */
    public long removeByPrefix(byte[] prefix) {
        return removals.removeByPrefix(prefix);
    }

    /** REMOVE_ALL, with or without a new epoch ({@link Removals#removeAll}); the number of objects removed. */
    public long removeAll(boolean force) {
        return removals.removeAll(force);
    }

    // ================================================================== timers

    /**
     * Runs the timers once: drops nodes silent past the TTL, reclaims puts past their timeout, evicts
     * when usage is at the high watermark, forgets spills never reported, expired read leases and
     * long-gone clients. Called periodically by the server, and directly by tests with a manual clock.
     */
    public void tick() {
        long now = clock.millis();
        membership.dropSilent(now);
        epoch.shared().lock();
        try {
            @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
            Consumer<ObjectIndex.Shard> expirePuts = shard -> shard.pending.entrySet().removeIf(e -> {
                ObjectIndex.PendingPut p = e.getValue();
                if (p.deadlineMillis >= now) {
                    return false;
                }
                freeRegions(p.segments, p.offsets, ObjectLayout.regionLength(e.getKey().bytes.length, p.valueLength), p.epoch,
                        p.generation, true);
                expiredPuts.incrementAndGet();
                return true;
            });
            index.forEachShard(expirePuts);
            writeLeases.expire(now);
            @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
            Consumer<ObjectIndex.Shard> expirePins = shard -> shard.objects.expirePins(now);
            index.forEachShard(expirePins);
            eviction.onTick(writeLeases.unusedBytes());
            spills.expire(now);
        } finally {
            epoch.shared().unlock();
        }
        leases.expire();
        long forget = now - 10 * config.clientTtl().toMillis();
        clients.values().removeIf(seen -> seen < forget);
    }

    // ================================================================== stats

    public long keyCount() {
        return index.objectCount();
    }

    public long capacity() {
        return segments.capacity();
    }

    /** Region bytes held by pinned objects (times their copies wanted). */
    public long pinnedBytes() {
        return index.pinnedBytes();
    }

    public long allocated() {
        return segments.allocated();
    }

    /** Free ranges of the active segments together (fragmentation). */
    public long freeRanges() {
        return segments.freeRanges();
    }

    /** The longest free range of any active segment: the longest write lease placeable without evicting. */
    public long longestFree() {
        return segments.longestFree();
    }

    /** One row per segment, ordered by id. */
    public List<SegmentInfo> segmentInfos() {
        return segments.infos(clock.millis());
    }

    public ClusterStats stats() {
        return new ClusterStats(incarnation, epoch.current(), keyCount(), index.pendingCount(), allocated(), capacity(),
                activeClients(), segmentInfos());
    }
}
