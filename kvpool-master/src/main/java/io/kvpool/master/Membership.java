package io.kvpool.master;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.config.HostPort;
import io.kvpool.protocol.BadRequestException;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.MasterMessages.HeartbeatReply;
import io.kvpool.protocol.msg.MasterMessages.Inventory;
import io.kvpool.protocol.msg.MasterMessages.RegisterNode;
import io.kvpool.protocol.msg.MasterMessages.RegisterReply;
import io.kvpool.protocol.msg.MasterMessages.TierStats;
import io.kvpool.protocol.msg.MasterMessages;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.time.InstantSource;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;
import java.util.function.IntSupplier;

/**
 * Membership: nodes register, drain for a restart, beat, and are lost; what they report they hold goes
 * to {@link NodeReports}, who may replace a registered segment is {@link SegmentReplacement}'s rule.
 *
 * <p>A node registers, lists its objects (each verified from its self-describing header) and then
 * takes puts. A node silent for the TTL is dropped: its replicas vanish, so its objects become misses.
 * A restarted master starts empty and rebuilds from the inventories nodes send when they re-register;
 * it adopts the newest epoch a node reports, and refuses objects from older epochs.
 *
 * <p>Owns the node-facing flow and the counts of dropped segments, refused registrations and drains;
 * the segments themselves are in {@link Segments}, the epoch in {@link Epoch}.
 *
 * <p>Invariants:
 * <ul>
 *   <li>A node that registers again replaces its segment: the old one is dropped with every replica on
 *       it, and its objects come back only through the new inventory. Only the same node, or a
 *       registration of a segment with nobody behind it, replaces one (invariant I15).</li>
 *   <li>A put pending only on a dropped segment is forgotten with it; what the old registration
 *       placed and is still on its way is held on the new one ({@link Replaced}).</li>
 *   <li>Nothing new is placed on a DRAINING segment.</li>
 * </ul>
 *
 * <p>Locks: registration and dropping a node hold the epoch write lock (they change the set of
 * segments); a heartbeat, a drain and a closed connection take none. The index is reached through
 * {@link ObjectIndex#forEachShard}.
 */
public final class Membership {

    private static final Logger log = LoggerFactory.getLogger(Membership.class);

    private final MasterConfig config;
    private final InstantSource clock;
    private final Epoch epoch;
    private final ObjectIndex index;
    private final Segments segments;
    private final ReadLeases leases;
    private final NodeNotifier nodes;

    final AtomicLong droppedSegments = new AtomicLong();
    /** Registrations refused because they would have replaced a live node's segment without proof. */
    final AtomicLong refusedRegistrations = new AtomicLong();
    /** NODE_DRAIN requests that put a segment into draining. */
    final AtomicLong drains = new AtomicLong();

    /** Told when objects lost copies or a segment joined: the repair has work, or room for it. */
    private final Runnable copiesChanged;
    /**
     * Told when a registration leaves (replaced, or dropped for silence) and when a name registers:
     * writes the old registration placed may still reach the node at those offsets (a same-machine
     * copy goes into the file before any node sees it; a slow writer's NODE_WRITE reaches the node once
     * it serves again), so that space is held on the name's next registration until those puts' and
     * leases' deadlines ({@link WriteLeases#dropped}, {@link WriteLeases#returned}).
     */
    private final Replaced replaced;
    /** Who may replace a registered segment, and what a replaced one had placed. */
    private final SegmentReplacement replacements;
    /** What members report they hold. */
    private final NodeReports reports;

    /** What membership tells about registrations that leave and come back (see {@link WriteLeases#dropped}). */
    interface Replaced {
        /** Registration {@code old} left; {@code pending}: the regions of puts pending on it. Caller holds the epoch write lock. */
        void dropped(Segment old, List<WriteLeases.Held> pending);

        /** Segment {@code now} registered; what a previous registration of its name placed is held on it. Returns the bytes held. */
        long returned(Segment now);

        /**
         * An inventory item of {@code seg} is the object a put pending on the previous registration was
         * writing: the range held for it gives way. True if there was such a hold. Caller holds the
         * epoch write lock.
         */
        default boolean claimHeld(Segment seg, long offset, long length, long generation) {
            return false;
        }
    }

    Membership(MasterConfig config, InstantSource clock, Epoch epoch, ObjectIndex index, Segments segments,
               SpillLedger spills, ReadLeases leases, NodeNotifier nodes, AtomicLong generations, IntSupplier accessTick,
               Runnable copiesChanged, Replaced replaced) {
        this.copiesChanged = copiesChanged;
        this.replaced = replaced;
        this.replacements = new SegmentReplacement(config, index);
        this.reports = new NodeReports(epoch, index, segments, spills, nodes, generations, accessTick, copiesChanged,
                replaced);
        this.config = config;
        this.clock = clock;
        this.epoch = epoch;
        this.index = index;
        this.segments = segments;
        this.leases = leases;
        this.nodes = nodes;
    }

    // ================================================================== joining

    /** REGISTER_NODE made in this process, on no connection (tests, benchmarks): see {@link #registerNode(RegisterNode, String)}. */
    public RegisterReply registerNode(RegisterNode r) {
        return registerNode(r, null);
    }

    /**
     * REGISTER_NODE: admit a node's segment (JOINING until its inventory is in), received on the master
     * connection {@code peer} (null: in-process).
     *
     * <p>A registration under a name already registered replaces that segment only when the old one
     * has nobody behind it or this is the same node: it proves it is ({@code previousToken} is the old
     * registration's control token, which only that node and its next run have), or it arrives on the
     * connection the old one last spoke on, or the old one's connection closed, or it is silent past the
     * TTL. Anything else is refused (BAD_REQUEST naming the live segment), and nothing changes: a forged
     * registration, or a second node misconfigured with a live node's address, would otherwise drop the
     * live node's objects from the index and have new puts placed over them.
     */
    public RegisterReply registerNode(RegisterNode r, String peer) {
        if (r.controlToken().equals(ControlToken.NONE)) {
            throw new BadRequestException("register_node of segment " + r.name() + " carries no control token: the"
                    + " master could not free, reset or copy anything on it");
        }
        HostPort address = new HostPort(r.host(), r.port());
        List<Segment> toReset = List.of();
        long newEpoch;
        Segment seg;
        boolean keep;
        boolean empty;
        epoch.exclusive().lock();
        try {
            long now = clock.millis();
            List<Segment> same = new ArrayList<>();
            for (Segment existing : segments.all()) {
                if (existing.name.equals(r.name())) {
                    String refusal = replacements.refusal(existing, r, peer, now);
                    if (refusal != null) {
                        refusedRegistrations.incrementAndGet();
                        log.warn("{}", refusal);
                        throw new BadRequestException(refusal);
                    }
                    same.add(existing);
                }
            }
            for (Segment existing : same) {
                drop(existing, existing.nodeIncarnation == r.nodeIncarnation()
                        ? "it registered again" : "its node restarted");
            }
            long ours = epoch.current();
            if (epoch.adopt(r.epoch())) {
                // a node saw a reset we do not know about (we restarted since): what we rebuilt is older
                log.warn("segment {} reports epoch {} > ours {}; dropped objects from the older epoch", r.name(),
                        r.epoch(), ours);
                toReset = new ArrayList<>(segments.all());
            }
            newEpoch = epoch.current();
            keep = r.epoch() == newEpoch;
            // a node that missed too many frees while away comes back empty rather than with removed objects. It
            // still lists them, so that each is refused and the node drops it: told only to skip its inventory,
            // a node of this epoch kept them (a reset drops only older epochs), and the next master to rebuild
            // from the nodes took the removed objects back (the soak's stale reads after a second failover)
            empty = keep && (nodes.mustComeBackEmpty(r.name()) || index.events.lost.overflowed(r.name()));
            seg = segments.add(r.name(), address, r.capacity(), r.nodeIncarnation(), r.shmPath(), r.controlToken(),
                    now);
            seg.comesBackEmpty = empty;
            seg.link = peer;
            // what its previous registration placed (replaced just now, or dropped for silence earlier) and
            // may still be written is held on this one; after a reset nothing is (its writes are fenced)
            replaced.returned(seg);
        } finally {
            epoch.exclusive().unlock();
        }
        if (!toReset.isEmpty()) {
            // objects rebuilt from an older epoch were dropped: as absolute as any reset
            long seq = leases.publishAll();
            nodes.reset(toReset, newEpoch);
            leases.await(seq);
        }
        log.info("{} registered at {} with {} bytes; {} objects offered{}", seg, address, r.capacity(),
                r.inventoryCount(), !keep ? " (older epoch " + r.epoch() + ": dropped)"
                        : empty ? " (it missed too many frees while away: each is refused, so its node drops it)" : "");
        return new RegisterReply(seg.id, newEpoch, keep, config.term());
    }

    /** The peer address of a master connection that closed: the registrations that last spoke on it have nobody behind them. */
    public void linkClosed(String peer) {
        for (Segment s : segments.all()) {
            if (peer.equals(s.link)) {
                s.link = null;
            }
        }
    }

    /**
     * NODE_DRAIN: the node of this registration is stopping for a restart. Nothing new is placed on its
     * segment from now on; what it holds stays listed (and readable while the node runs). NOT_FOUND when
     * the registration is not known (the master restarted, or dropped it).
     */
    public ResultCode drain(MasterMessages.NodeDrain d) {
        Segment seg = segments.get(d.segmentId());
        if (seg == null || seg.nodeIncarnation != d.nodeIncarnation()) {
            return ResultCode.NOT_FOUND;
        }
        if (!seg.draining) {
            seg.draining = true;
            drains.incrementAndGet();
            log.info("{} draining: its node stops for a restart; nothing more is placed on it", seg);
        }
        return ResultCode.OK;
    }

    /** NODE_INVENTORY: take over objects a node already holds ({@link NodeReports#inventory}). */
    public List<ResultCode> inventory(Inventory inv) {
        return reports.inventory(inv);
    }

    /** NODE_DISK_ADD ({@link NodeReports#diskAdd}). */
    public List<ResultCode> diskAdd(Inventory inv) {
        return reports.diskAdd(inv);
    }

    /** NODE_DISK_DROP ({@link NodeReports#diskDrop}). */
    public List<ResultCode> diskDrop(Inventory inv) {
        return reports.diskDrop(inv);
    }

    // ================================================================== liveness

    /** NODE_HEARTBEAT: NOT_FOUND tells the node to register again. */
    public HeartbeatReply heartbeat(int segmentId, long nodeIncarnation) {
        return heartbeat(segmentId, nodeIncarnation, null);
    }

    /** NODE_HEARTBEAT with the node's per-tier counters (kept for metrics and status). */
    public HeartbeatReply heartbeat(int segmentId, long nodeIncarnation, TierStats tiers) {
        return heartbeat(segmentId, nodeIncarnation, tiers, null);
    }

    /** NODE_HEARTBEAT received on master connection {@code peer} (null: in-process), which the registration now speaks on. */
    public HeartbeatReply heartbeat(int segmentId, long nodeIncarnation, TierStats tiers, String peer) {
        return heartbeat(segmentId, nodeIncarnation, tiers, peer, config.term());
    }

    /**
     * NODE_HEARTBEAT from a node following master term {@code nodeTerm}. A segment a promoted standby took over
     * ({@link Segment#awaitingTerm}) takes puts once its node follows this master's term, so the old leader's
     * grants are refused there before anything new is placed.
     */
    public HeartbeatReply heartbeat(int segmentId, long nodeIncarnation, TierStats tiers, String peer, long nodeTerm) {
        Segment seg = segments.get(segmentId);
        if (seg == null || seg.nodeIncarnation != nodeIncarnation) {
            return new HeartbeatReply(ResultCode.NOT_FOUND, epoch.current(), config.term());
        }
        if (seg.awaitingTerm && nodeTerm == config.term()) {
            seg.awaitingTerm = false;
            seg.active = true;
            copiesChanged.run();
            log.info("{} follows term {}: taking puts", seg, nodeTerm);
        }
        if (tiers != null) {
            seg.tiers = tiers;
        }
        if (peer != null) {
            seg.link = peer;
        }
        seg.lastHeartbeatMillis = clock.millis();
        return new HeartbeatReply(ResultCode.OK, epoch.current(), config.term());
    }

    /** Drops the nodes silent past the TTL (the timer's part; takes the epoch write lock only if there is one). */
    void dropSilent(long nowMillis) {
        long ttl = config.nodeTtl().toMillis();
        List<Segment> silent = new ArrayList<>();
        for (Segment s : segments.all()) {
            if (nowMillis - s.lastHeartbeatMillis > ttl) {
                silent.add(s);
            }
        }
        if (silent.isEmpty()) {
            return;
        }
        epoch.exclusive().lock();
        try {
            for (Segment s : silent) {
                if (segments.get(s.id) == s && nowMillis - s.lastHeartbeatMillis > ttl) {
                    List<Long> elsewhere = drop(s, "no heartbeat for " + (nowMillis - s.lastHeartbeatMillis) + " ms");
                    // its copies left the index, so a removal from now on cannot be owed to it: when it comes
                    // back, a copy of an object that kept other copies is taken only if that object still lives
                    nodes.silenced(s.name, elsewhere);
                }
            }
        } finally {
            epoch.exclusive().unlock();
        }
    }

    /**
     * Removes a segment and every replica on it; objects left with no replica are gone. Returns the
     * generations of the objects that kept other copies.
     */
    @GuardedBy("epoch.exclusive()")
    private List<Long> drop(Segment seg, String why) {
        // what it placed that may still be written: held on its name's next registration
        replaced.dropped(seg, replacements.pendingOn(seg));
        long[] lost = {0};
        long[] kept = {0};
        List<Long> elsewhere = new ArrayList<>();
        long[] forgotten = {0};
        @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
        Consumer<ObjectIndex.Shard> dropReplicas = shard -> {
            // a put pending only on this segment can no longer complete; forgotten, it no longer keeps the
            // key from the node's next inventory, which may list the object whole (its bytes were written,
            // its PUT_END had not come: that PUT_END then finds it stored). Kept, it made the node drop
            // both its copies of an object caught mid-promotion (the new one in memory, the old on disk)
            for (Iterator<ObjectIndex.PendingPut> it = shard.pending.values().iterator(); it.hasNext(); ) {
                if (SegmentReplacement.onlyOn(it.next(), seg.id)) {
                    it.remove();
                    forgotten[0]++;
                }
            }
            ObjectTable objects = shard.objects;
            objects.removeIf(slot -> {
                int idx = objects.replicaOn(slot, seg.id);
                if (idx < 0) {
                    return false;
                }
                if (objects.replicas(slot) == 1) {
                    // its node may bring it back, taken only if the key was neither removed nor stored meanwhile
                    index.events.lost.lost(seg.name, objects.key(slot), objects.hash(slot), objects.generation(slot));
                    lost[0]++;
                    return true;
                }
                objects.removeReplica(slot, idx);
                elsewhere.add(objects.generation(slot));
                kept[0]++;
                return false;
            });
        };
        index.forEachShard(dropReplicas);
        // only now out of the segment list: lookups take no epoch lock, so with the segment gone first a lookup
        // during the drop found copies on a segment the pool's status no longer listed (Python's repair test read
        // every object at 2 copies after the node was gone from the status, and at 1 a moment later)
        segments.remove(seg);
        if (kept[0] > 0) {
            copiesChanged.run(); // objects that still have a copy get their lost ones back (Repair)
        }
        nodes.forget(seg);
        droppedSegments.incrementAndGet();
        log.warn("{} dropped ({}): {} objects lost with it{}", seg, why, lost[0],
                forgotten[0] == 0 ? "" : ", " + forgotten[0] + " puts pending only on it forgotten");
        return elsewhere;
    }

}
