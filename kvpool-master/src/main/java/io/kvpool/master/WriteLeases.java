package io.kvpool.master;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.WriteGrants;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.WriteLeaseMessages.Commit;
import io.kvpool.protocol.msg.WriteLeaseMessages.CommitItem;
import io.kvpool.protocol.msg.WriteLeaseMessages.Grant;
import io.kvpool.protocol.msg.WriteLeaseMessages.Granted;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.time.InstantSource;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Write leases: ranges of a segment handed to one writer, which places objects in them without
 * asking the master, and makes them visible with COMMIT (see docs/architecture.md, "Write leases").
 *
 * <h2>What a lease is</h2>
 * One contiguous range {@code [start, end)} taken from a segment's allocator in one piece, a block of
 * generations {@code [firstGeneration, firstGeneration + count)}, the epoch it was granted in and an
 * idle deadline. The range counts as allocated: eviction makes room for it and never takes it back.
 * Inside it the writer lays objects out upwards. Each COMMIT item must start at or after the end of
 * the lease's last accepted item ({@link Lease#next}), be 64-byte aligned, end inside the range, and
 * carry a generation of the block above the last accepted one. So regions never overlap and every
 * generation names one region.
 *
 * <h2>Where the bytes go</h2>
 * An accepted item becomes an object of the index with its own region, exactly as a PUT_END would
 * make it; from then on it is freed, evicted and spilled like any object. The allocator's single
 * range is cut up as the lease goes: the gap before an accepted item (a write that failed, or was
 * never committed) and the region of an item refused at the index (ALREADY_EXISTS) are freed at once;
 * the rest ({@code [next, end)}) at release or expiry. Nothing is freed twice, because {@code next}
 * only rises. The allocator counts each accepted object as one allocation, and the lease as none.
 *
 * <h2>Epochs and segments</h2>
 * A lease granted in an epoch that has since moved is void (the reset reclaimed its range wholesale):
 * every COMMIT to it is FENCED and it is dropped without freeing anything. A lease whose segment left
 * (its node was lost or registered again, under a new id) is dropped the same way.
 *
 * <h2>A node that registers again</h2>
 * A writer on the node's machine copies values into its lease's range through the shared file
 * before the node hears of them, and any writer may send a write the old registration placed after
 * the node serves again (it restarted and adopted its file under a new name, it was dropped for
 * silence, or it registered once more in the same process). So the unused part of each live lease
 * of the old segment, and each region a two-phase put still pending had reserved there, is held on
 * the new one ({@link #dropped}, {@link #returned}), at the same offsets and until that lease's or put's deadline, as
 * a lease no writer knows the id of: nothing else is placed there while a stale write could land in
 * it. Those writes never become visible: their COMMIT finds the lease void (EXPIRED), their PUT_END
 * finds the segment gone. (A node that came back with a fresh file loses that room for at most the
 * put timeout: the master cannot tell the two apart.)
 *
 * <h2>Locks</h2>
 * Callers hold the epoch read lock. A lease's monitor is taken before any shard's lock and the
 * allocator's monitor, never the other way round.
 */
final class WriteLeases implements Membership.Replaced {

    private static final Logger log = LoggerFactory.getLogger(WriteLeases.class);

    /** Most generations one lease hands out. */
    static final int MAX_GENERATIONS = 1 << 16;
    /** A lease takes at most this fraction of an average segment (unless one batch needs more). */
    static final int SEGMENT_FRACTION = 8;
    /**
     * Live leases together hold at most this fraction of the pool's capacity unwritten: past it a
     * lease gets only what its batch needs. Without the bound many writers' mostly empty leases filled a
     * small pool and drove eviction of the objects in it.
     */
    static final int UNUSED_FRACTION = 8;

    static final class Lease {
        final long id;
        final Segment segment;
        final long start;
        final long end;
        final long epoch;
        final long firstGeneration;
        final int generationCount;
        /** End of the last accepted item: everything below it is either an object or freed already. */
        @GuardedBy("this")
        long next;
        @GuardedBy("this")
        long lastGeneration;
        @GuardedBy("this")
        long deadlineMillis;
        @GuardedBy("this")
        boolean closed;

        Lease(long id, Segment segment, long start, long end, long epoch, long firstGeneration, int generationCount,
              long deadlineMillis) {
            this.id = id;
            this.segment = segment;
            this.start = start;
            this.end = end;
            this.epoch = epoch;
            this.firstGeneration = firstGeneration;
            this.generationCount = generationCount;
            this.next = start;
            this.lastGeneration = firstGeneration - 1;
            this.deadlineMillis = deadlineMillis;
        }

        /** Why item {@code it} cannot be accepted next, or null if it can. */
        @GuardedBy("this")
        String misfit(CommitItem it) {
            long region = ObjectLayout.regionLength(it.key().length, it.valueLength());
            if (it.offset() % ObjectLayout.ALIGNMENT != 0) {
                return "offset " + it.offset() + " is not " + ObjectLayout.ALIGNMENT + "-byte aligned";
            }
            if (it.offset() < next || it.offset() + region > end || it.offset() + region < it.offset()) {
                return "region [" + it.offset() + ", +" + region + ") is not inside the lease's unused range ["
                        + next + ", " + end + ")";
            }
            if (it.generation() <= lastGeneration || it.generation() >= firstGeneration + generationCount) {
                return "generation " + it.generation() + " is not in the lease's block above " + lastGeneration;
            }
            return null;
        }
    }

    private final MasterConfig config;
    private final InstantSource clock;
    private final Epoch epoch;
    private final ObjectIndex index;
    private final Segments segments;
    private final Eviction eviction;
    private final NodeNotifier nodes;
    private final AtomicLong generations;
    private final WriteGrants grants;
    private final Map<Long, Lease> live = new ConcurrentHashMap<>();
    /** Ids start at random, so a writer's lease from a previous master process names none of this one's. */
    private final AtomicLong ids = new AtomicLong(ThreadLocalRandom.current().nextLong() >>> 2);
    final AtomicLong granted = new AtomicLong();
    final AtomicLong expired = new AtomicLong();
    final AtomicLong committed = new AtomicLong();

    WriteLeases(MasterConfig config, InstantSource clock, Epoch epoch, ObjectIndex index, Segments segments,
                Eviction eviction, NodeNotifier nodes, AtomicLong generations, WriteGrants grants) {
        this.config = config;
        this.clock = clock;
        this.epoch = epoch;
        this.index = index;
        this.segments = segments;
        this.eviction = eviction;
        this.nodes = nodes;
        this.generations = generations;
        this.grants = grants;
    }

    /** How long a lease lives without a COMMIT: the put timeout, as for a two-phase put. */
    long idleMillis() {
        return config.putTimeout().toMillis();
    }

    /**
     * WRITE_LEASE: places one range of between {@code leastBytes} and {@code wantedBytes}. Room beyond
     * {@code leastBytes} (the writer's first batch) is only given from free space, never by evicting,
     * and only while live leases hold less than {@code 1/UNUSED_FRACTION} of capacity unwritten; it is
     * capped at {@code 1/SEGMENT_FRACTION} of an average segment, or cut to the longest free range of
     * the segment chosen when none is that long (free space in a full pool is many ranges). Room for
     * {@code leastBytes} is made by evicting as a put does. So eviction takes objects only for bytes
     * about to be written. Caller holds the epoch read lock.
     */
    Granted grant(Grant req) {
        long least = ObjectLayout.align(Math.max(1, req.leastBytes()));
        long spare = segments.capacity() / UNUSED_FRACTION - unusedBytes(false);
        long cap = Math.min(averageSegment() / SEGMENT_FRACTION, Math.max(0, spare));
        long length = Math.max(least, Math.min(ObjectLayout.align(req.wantedBytes()), cap & -ObjectLayout.ALIGNMENT));
        // a lease holds many objects, so placement decides per lease: without a preference each goes to the
        // segment with the most room, which spreads one writer's leases over every segment in turn
        String preferred = req.preferredSegment().isEmpty() ? mostFree() : req.preferredSegment();
        List<Placement.Placed> placed = List.of();
        if (length > least) {
            placed = eviction.placeWithoutEvicting(length, preferred);
            // a pool in its steady state sits at the eviction watermark with its free space in many ranges,
            // none as long as a lease would like: then the longest of them. Without it every lease there got
            // room for its batch only, and each put paid a WRITE_LEASE and a RELEASE besides its COMMIT; and
            // best fit scattered small leases over the holes, so later evictions freed only small holes
            long longest = placed.isEmpty() ? longestFree(preferred) & -ObjectLayout.ALIGNMENT : 0;
            if (longest > least) {
                length = longest;
                placed = eviction.placeWithoutEvicting(length, preferred);
            }
        }
        if (placed.isEmpty()) {
            length = least;
            placed = eviction.place(length, 1, preferred);
        }
        if (placed.isEmpty()) {
            return Granted.refused(segments.placeableCapacity() == 0 ? ResultCode.NO_SEGMENT : ResultCode.POOL_FULL);
        }
        Placement.Placed p = placed.getFirst();
        p.segment().allocator.recount(-1); // the range is no object: its objects count as they are committed
        int count = Math.clamp(req.generations(), 1, MAX_GENERATIONS);
        long first = generations.getAndAdd(count) + 1;
        long ep = epoch.current();
        long idle = idleMillis();
        Lease l = new Lease(ids.incrementAndGet(), p.segment(), p.offset(), p.offset() + length, ep, first, count,
                clock.millis() + idle);
        live.put(l.id, l);
        granted.incrementAndGet();
        return new Granted(ResultCode.OK, l.id, ep, config.term(), p.segment().id, l.start, length, first, count,
                (int) Math.min(Integer.MAX_VALUE, idle),
                grants.sign(p.segment().id, config.term(), l.start, length, first, count).mac());
    }

    /** The longest free range of the placeable segment named {@code name}, 0 when there is none. */
    private long longestFree(String name) {
        for (Segment s : segments.all()) {
            if (s.placeable() && s.name.equals(name)) {
                return s.allocator.largestFree();
            }
        }
        return 0;
    }

    /** The name of the placeable segment with the most free bytes, or "" when there is none. */
    private String mostFree() {
        Segment best = null;
        for (Segment s : segments.all()) {
            if (s.placeable() && (best == null || s.allocator.free() > best.allocator.free())) {
                best = s;
            }
        }
        return best == null ? "" : best.name;
    }

    private long averageSegment() {
        int n = 0;
        for (Segment s : segments.all()) {
            n += s.active ? 1 : 0;
        }
        return n == 0 ? 0 : segments.capacity() / n;
    }

    /**
     * COMMIT: each item that fits the lease (see the class comment) becomes an object, as PUT_END makes
     * one; an item that does not fit the lease is answered FAILED and changes nothing, unless its key
     * already holds its generation (the same COMMIT sent twice: OK, as PUT_END is idempotent). A
     * lease from an older epoch answers FENCED, an unknown or closed one EXPIRED. Upserts that replaced
     * or created an object are added to {@code upserted} (their invalidation is published by the
     * caller). Caller holds the epoch read lock.
     */
    List<ResultCode> commit(Commit req, List<byte[]> upserted) {
        List<CommitItem> items = req.items();
        ResultCode[] out = new ResultCode[items.size()];
        ResultCode[] quota = admit(items); // before the lease's lock: a tenant set to evict may evict its own
        Lease l = live.get(req.leaseId());
        if (l == null) {
            Arrays.fill(out, ResultCode.EXPIRED);
            return Arrays.asList(out);
        }
        synchronized (l) {
            if (l.closed) {
                Arrays.fill(out, ResultCode.EXPIRED);
                return Arrays.asList(out);
            }
            boolean valid = valid(l);
            if (!valid) {
                close(l, false);
                Arrays.fill(out, l.epoch != epoch.current() ? ResultCode.FENCED : ResultCode.EXPIRED);
                return Arrays.asList(out);
            }
            l.deadlineMillis = clock.millis() + idleMillis();
            // the checks, in order: each accepted item moves next and lastGeneration past it
            boolean[] fits = new boolean[items.size()];
            for (int i = 0; i < items.size(); i++) {
                CommitItem it = items.get(i);
                String misfit = it.valueLength() > config.maxValueSize().bytes()
                        ? "value of " + it.valueLength() + " bytes exceeds the max value size" : l.misfit(it);
                if (misfit != null) {
                    log.debug("lease {}: item {} refused: {}", l.id, i, misfit);
                    out[i] = ResultCode.FAILED;
                    continue;
                }
                if (quota != null && quota[i] != ResultCode.OK) {
                    // over its tenant's quota: its region goes back with the gap before it, the node drops it
                    long end = it.offset() + ObjectLayout.regionLength(it.key().length, it.valueLength());
                    freePart(l.segment, l.next, end);
                    nodes.free(l.segment, it.offset(), it.generation(), Tier.MEMORY, false);
                    l.next = end;
                    l.lastGeneration = it.generation();
                    out[i] = quota[i];
                    continue;
                }
                fits[i] = true;
                freePart(l.segment, l.next, it.offset());
                l.next = it.offset() + ObjectLayout.regionLength(it.key().length, it.valueLength());
                l.lastGeneration = it.generation();
            }
            int tick = eviction.accessTick();
            int segId = l.segment.id;
            @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
            ObjectIndex.KeyVisitor store = (shard, i, key, hash) -> {
                if (!fits[i]) {
                    // a COMMIT sent again (its reply was lost) finds its own objects: answered OK again
                    if (shard.holds(key, hash, items.get(i).generation())) {
                        out[i] = ResultCode.OK;
                    }
                    return;
                }
                CommitItem it = items.get(i);
                ObjectTable objects = shard.objects;
                int slot = objects.find(key, hash);
                if (!req.upsert() && shard.taken(key, hash, l.epoch)) {
                    // refused: its region goes back now, and the node drops what was written there
                    freePart(l.segment, it.offset(), it.offset() + ObjectLayout.regionLength(key.length, it.valueLength()));
                    nodes.free(l.segment, it.offset(), it.generation(), Tier.MEMORY, false);
                    out[i] = ResultCode.ALREADY_EXISTS;
                    return;
                }
                if (slot >= 0) {
                    segments.release(objects, slot);
                }
                shard.storeOneCopy(slot, key, hash, it.valueLength(), it.generation(), tick, segId, it.offset());
                l.segment.allocator.recount(1);
                if (req.upsert()) {
                    upserted.add(key);
                }
                out[i] = ResultCode.OK;
            };
            index.forEachKey(items, CommitItem::key, store);
            committed.addAndGet(countOk(out));
        }
        return Arrays.asList(out);
    }

    /** Each item's admission by its tenant's quota ({@link Tenants#admit}), or null without tenants. */
    private ResultCode[] admit(List<CommitItem> items) {
        Tenants tenants = index.events.tenants;
        if (!tenants.active()) {
            return null;
        }
        ResultCode[] out = new ResultCode[items.size()];
        for (int i = 0; i < items.size(); i++) {
            CommitItem it = items.get(i);
            out[i] = tenants.admit(it.key(), ObjectLayout.regionLength(it.key().length, it.valueLength()), eviction);
        }
        return out;
    }

    private static int countOk(ResultCode[] codes) {
        int n = 0;
        for (ResultCode c : codes) {
            n += c == ResultCode.OK ? 1 : 0;
        }
        return n;
    }

    private static void freePart(Segment s, long from, long to) {
        if (to > from) {
            s.allocator.freePart(from, to - from);
        }
    }

    /**
     * A range a registration had placed and a writer may still write, to be held on the node's next
     * registration until its deadline ({@link #dropped}, {@link #returned}): the unused part of a write
     * lease (generation 0), or a pending put's region (with the put's generation), in the epoch it was
     * placed in.
     */
    record Held(long offset, long length, long deadlineMillis, long generation, long epoch) {
    }

    /** Ranges held for puts pending on a replaced registration, by the put's generation ({@link #claimHeld}). */
    private final Map<Long, Lease> heldPuts = new ConcurrentHashMap<>();
    /**
     * What dropped registrations had placed, by segment name, until that name registers again
     * ({@link #returned}) or every deadline passed ({@link #expire}).
     */
    private final Map<String, List<Held>> owedHolds = new ConcurrentHashMap<>();

    /**
     * Registration {@code old} left (replaced by a new registration of its node, or dropped for
     * silence): its live leases are void, and what they and the puts {@code pending} on it had placed
     * is kept under its name, to be held on that name's next registration ({@link #returned}). Caller
     * holds the epoch write lock.
     */
    @Override
    public void dropped(Segment old, List<Held> pending) {
        List<Held> owed = new java.util.ArrayList<>(pending);
        long ep = epoch.current();
        for (Lease l : live.values()) {
            if (l.segment != old) {
                continue;
            }
            synchronized (l) {
                if (!l.closed && l.next < l.end && l.epoch == ep) {
                    owed.add(new Held(l.next, l.end - l.next, l.deadlineMillis, 0, ep));
                }
            }
            close(l, false); // void now: its segment left
        }
        if (!owed.isEmpty()) {
            owedHolds.merge(old.name, owed, (a, b) -> {
                List<Held> both = new java.util.ArrayList<>(a);
                both.addAll(b);
                return both;
            });
        }
    }

    /**
     * Segment {@code now} registered under a name whose previous registration left while writes it had
     * placed may still come (a same-machine writer copies into the segment file before any node sees
     * it; a slow writer's NODE_WRITE reaches the node once it serves again): each such range is
     * reserved on {@code now} at the same offsets, until its deadline, as a lease no writer knows the
     * id of (see the class comment). Ranges of an older epoch are not (a reset fenced their writes).
     * Returns the bytes held. Caller holds the epoch write lock, before {@code now} takes its inventory
     * (its allocator is empty, so every range fits).
     */
    @Override
    public long returned(Segment now) {
        List<Held> owed = owedHolds.remove(now.name);
        if (owed == null) {
            return 0;
        }
        long nowMillis = clock.millis();
        long ep = epoch.current();
        long held = 0;
        for (Held h : owed) {
            if (h.deadlineMillis() < nowMillis || h.epoch() != ep) {
                continue;
            }
            Lease l = hold(now, h.offset(), h.offset() + h.length(), h.deadlineMillis());
            if (l != null) {
                if (h.generation() != 0) {
                    heldPuts.put(h.generation(), l);
                }
                held += h.length();
            }
        }
        if (held > 0) {
            log.info("{}: {} bytes its previous registration's write leases and pending puts had placed held until"
                    + " their deadlines (writes placed there may still reach the node)", now, held);
        }
        return held;
    }

    /** Holds {@code [from, to)} on {@code seg} until {@code deadline}, as a lease no writer knows the id of; null if it could not. */
    private Lease hold(Segment seg, long from, long to, long deadline) {
        if (!seg.allocator.reserve(from, to - from)) {
            log.warn("{}: the range [{}, {}) its previous registration had placed could not be held", seg, from, to);
            return null;
        }
        seg.allocator.recount(-1); // the range is no object
        Lease h = new Lease(ids.incrementAndGet(), seg, from, to, epoch.current(), 0, 0, deadline);
        live.put(h.id, h);
        return h;
    }

    /**
     * The node lists, in the inventory of {@code seg}, the object a put pending on its previous
     * registration was writing: region {@code [offset, offset + length)} under {@code generation}. Its
     * bytes are whole there (the node verified them), so the range held for that put gives way to the
     * object: freed, for the inventory to reserve. True if there was such a hold. Caller holds the
     * epoch write lock.
     */
    @Override
    public boolean claimHeld(Segment seg, long offset, long length, long generation) {
        Lease h = heldPuts.get(generation);
        if (h == null || h.segment != seg || h.start != offset || h.end != offset + length) {
            return false;
        }
        heldPuts.remove(generation, h);
        close(h, valid(h));
        return true;
    }

    /** Whether the lease's range is still its own: same epoch, and its segment still registered. */
    private boolean valid(Lease l) {
        return l.epoch == epoch.current() && segments.get(l.segment.id) == l.segment;
    }

    /** RELEASE: frees what the lease did not use. Unknown ids are ignored (it expired, or the master restarted). */
    void release(long leaseId) {
        Lease l = live.get(leaseId);
        if (l != null) {
            close(l, valid(l));
        }
    }

    /**
     * Closes the lease: frees its unused range (unless {@code valid} is false: its epoch moved or its
     * segment left, and the space was reclaimed wholesale). Idempotent.
     */
    private void close(Lease l, boolean valid) {
        synchronized (l) {
            if (l.closed) {
                return;
            }
            l.closed = true;
            live.remove(l.id);
            if (l.generationCount == 0) {
                heldPuts.values().remove(l);
            }
            if (valid) {
                freePart(l.segment, l.next, l.end);
            }
            l.next = l.end;
        }
    }

    /**
     * Closes every lease idle past its deadline, and every lease made void by a reset or a segment
     * leaving. Caller holds the epoch read lock.
     */
    void expire(long nowMillis) {
        owedHolds.entrySet().removeIf(e -> e.getValue().stream().allMatch(h -> h.deadlineMillis() < nowMillis));
        for (Lease l : live.values()) {
            boolean valid = valid(l);
            boolean due;
            synchronized (l) {
                due = l.deadlineMillis < nowMillis;
            }
            if (due || !valid) {
                close(l, valid);
                if (due) {
                    expired.incrementAndGet();
                }
            }
        }
    }

    int size() {
        return live.size();
    }

    /** Whether lease {@code id} is open. */
    boolean live(long id) {
        return live.containsKey(id);
    }

    /** Bytes held by live leases and not committed yet. */
    long unusedBytes() {
        return unusedBytes(true);
    }

    /**
     * {@link #unusedBytes()}; without {@code held}, leaving out the ranges held for a node that came
     * back ({@link #returned}): no writer can use them, so they do not count against the room live
     * leases may take (before, a restarted node's held ranges left every new lease at its least bytes
     * until they expired).
     */
    long unusedBytes(boolean held) {
        long n = 0;
        for (Lease l : live.values()) {
            if (!held && l.generationCount == 0) {
                continue;
            }
            synchronized (l) {
                n += l.end - l.next;
            }
        }
        return n;
    }
}
