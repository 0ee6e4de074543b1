package io.kvpool.master;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.config.HostPort;
import io.kvpool.protocol.BadRequestException;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.MasterMessages.HeartbeatReply;
import io.kvpool.protocol.msg.MasterMessages.Inventory;
import io.kvpool.protocol.msg.MasterMessages.InventoryItem;
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
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;
import java.util.function.Function;
import java.util.function.IntSupplier;

/**
 * Membership: nodes register, beat, list what they hold, report what their SSD tier took in and let
 * go, and are lost.
 *
 * <p>A node registers, lists its objects (each verified from its self-describing header) and then
 * takes puts. A node silent for the TTL is dropped: its replicas vanish, so its objects become misses.
 * A restarted master starts empty and rebuilds from the inventories nodes send when they re-register;
 * it adopts the newest epoch a node reports, and refuses objects from older epochs.
 *
 * <p>Owns the node-facing flow and the count of dropped segments; the segments themselves are in
 * {@link Segments}, the epoch in {@link Epoch}, spills in flight in the {@link SpillLedger}.
 *
 * <p>Invariants:
 * <ul>
 *   <li>A segment takes puts only once its inventory is in (it is JOINING until then). A node that
 *       registers again replaces its segment: the old one is dropped with every replica on it, and its
 *       objects come back only through the new inventory.</li>
 *   <li>An adopted memory copy reserves its region at the offset the node reports, so new puts never
 *       overlap it. Of two copies of a key, the newer generation wins and the older one is freed; a
 *       copy from another epoch, or of a key with a put in flight, is refused (ALREADY_EXISTS tells the
 *       node to drop it).</li>
 *   <li>A spilled object comes back as a disk replica only through its spill still in the ledger.</li>
 *   <li>Generations handed out after a rebuild are above every generation adopted.</li>
 * </ul>
 *
 * <p>Locks: registration, inventory and dropping a node hold the epoch write lock (they change the
 * set of segments, or what a reset would have to undo); disk reports hold the read lock; a heartbeat
 * takes none. The index is reached through {@link ObjectIndex#withShard} and
 * {@link ObjectIndex#forEachShard}.
 */
public final class Membership {

    private static final Logger log = LoggerFactory.getLogger(Membership.class);

    private final MasterConfig config;
    private final InstantSource clock;
    private final Epoch epoch;
    private final ObjectIndex index;
    private final Segments segments;
    private final SpillLedger spills;
    private final ReadLeases leases;
    private final NodeNotifier nodes;
    private final AtomicLong generations;
    /** The LRU clock (eviction's access tick): adopted objects count as just read. */
    private final IntSupplier accessTick;

    final AtomicLong droppedSegments = new AtomicLong();
    /** Registrations refused because they would have replaced a live node's segment without proof. */
    final AtomicLong refusedRegistrations = new AtomicLong();
    /** NODE_DRAIN requests that put a segment into draining. */
    final AtomicLong drains = new AtomicLong();

    /** Told when objects lost copies or a segment joined: the repair has work, or room for it. */
    private final Runnable copiesChanged;
    /**
     * Told when a registration replaced an earlier one of the same name (the node restarted, or
     * registered again): the old segment, the new one, and the regions two-phase puts still pending
     * had reserved on the old one. Writes placed by the old registration may still reach the node at
     * those offsets (a same-machine copy goes into the file before any node sees it; a slow writer's
     * NODE_WRITE reaches the node once it serves again), so that space is held on the new segment until
     * those puts' and leases' deadlines ({@link WriteLeases#carryOver}).
     */
    private final Replaced replaced;

    /** What {@link #registerNode} tells when a registration replaced an earlier one of the same name. */
    interface Replaced {
        /** Caller holds the epoch write lock, before {@code now} takes its inventory. */
        void replaced(Segment old, Segment now, List<WriteLeases.Held> pending);

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
        this.config = config;
        this.clock = clock;
        this.epoch = epoch;
        this.index = index;
        this.segments = segments;
        this.spills = spills;
        this.leases = leases;
        this.nodes = nodes;
        this.generations = generations;
        this.accessTick = accessTick;
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
        epoch.exclusive().lock();
        try {
            long now = clock.millis();
            List<Segment> same = new ArrayList<>();
            for (Segment existing : segments.all()) {
                if (existing.name.equals(r.name())) {
                    String refusal = replacement(existing, r, peer, now);
                    if (refusal != null) {
                        refusedRegistrations.incrementAndGet();
                        log.warn("{}", refusal);
                        throw new BadRequestException(refusal);
                    }
                    same.add(existing);
                }
            }
            List<WriteLeases.Held> pending = new ArrayList<>();
            for (Segment existing : same) {
                pending.addAll(pendingOn(existing));
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
            // a node that missed too many frees while away comes back empty rather than with removed objects
            keep = r.epoch() == newEpoch && !nodes.mustComeBackEmpty(r.name());
            seg = segments.add(r.name(), address, r.capacity(), r.nodeIncarnation(), r.shmPath(), r.controlToken(),
                    now);
            seg.link = peer;
            if (toReset.isEmpty()) {
                for (Segment existing : same) {
                    replaced.replaced(existing, seg, pending);
                    pending = List.of();
                }
            }
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
                r.inventoryCount(), keep ? "" : r.epoch() != newEpoch ? " (older epoch " + r.epoch() + ": dropped)"
                        : " (it missed too many frees while away: dropped)");
        return new RegisterReply(seg.id, newEpoch, keep, config.term());
    }

    /**
     * Why registration {@code r} (on connection {@code peer}) may not replace {@code existing}, a segment
     * of the same name; null when it may (see {@link #registerNode(RegisterNode, String)}).
     */
    private String replacement(Segment existing, RegisterNode r, String peer, long nowMillis) {
        long silent = nowMillis - existing.lastHeartbeatMillis;
        String link = existing.link;
        if (existing.controlToken.matches(r.previousToken()) || link == null || link.equals(peer)
                || silent > config.nodeTtl().toMillis()) {
            return null;
        }
        return "register_node of segment " + r.name() + " from " + (peer == null ? "this process" : peer)
                + " refused: that segment is registered (id " + existing.id + ", its node last heard from " + silent
                + " ms ago on the connection from " + link + ") and this registration does not prove it is that"
                + " node's next run (it does not carry the control token of that registration). If that node"
                + " restarted, it registers once its old connection is closed or its registration expires (node TTL "
                + config.nodeTtl().toMillis() + " ms); if another node was started with the same address, give each"
                + " node its own --advertise-host and --port";
    }

    /** The regions pending two-phase puts reserved on {@code seg}, with their deadlines. Caller holds the epoch write lock. */
    private List<WriteLeases.Held> pendingOn(Segment seg) {
        List<WriteLeases.Held> out = new ArrayList<>();
        @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
        Consumer<ObjectIndex.Shard> collect = shard -> {
            for (Map.Entry<Key, ObjectIndex.PendingPut> e : shard.pending.entrySet()) {
                ObjectIndex.PendingPut p = e.getValue();
                for (int i = 0; i < p.segments.length; i++) {
                    if (p.segments[i] == seg.id) {
                        out.add(new WriteLeases.Held(p.offsets[i],
                                ObjectLayout.regionLength(e.getKey().bytes.length, p.valueLength), p.deadlineMillis,
                                p.generation));
                    }
                }
            }
        };
        index.forEachShard(collect);
        return out;
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

    /** NODE_INVENTORY: take over objects a node already holds. ALREADY_EXISTS tells the node to drop one. */
    public List<ResultCode> inventory(Inventory inv) {
        for (InventoryItem it : inv.items()) {
            ObjectIndex.checkKeyLength(it.key());
        }
        epoch.exclusive().lock();
        try {
            // a copy whose free the node missed (removed or evicted while it was away) is not taken back
            // and a copy of an object that kept copies elsewhere when this segment was dropped for silence is
            // taken only while that object lives (it may have been removed, replaced or evicted since)
            List<ResultCode> out = eachItem(inv, "node_inventory", (seg, it, tick) ->
                    nodes.freedWhileAway(seg.name, it.generation())
                            || (nodes.copiedElsewhere(seg.name, it.generation()) && !live(it))
                            ? ResultCode.ALREADY_EXISTS : adopt(seg, it, tick));
            if (inv.last()) {
                // still registered: nothing drops a segment while we hold the write lock
                Segment seg = segments.get(inv.segmentId());
                nodes.inventoryTaken(seg.name);
                seg.active = true;
                copiesChanged.run(); // room for copies that waited for it
                log.info("{} active: {} objects, {} bytes used", seg, seg.allocator.allocations(), seg.allocator.used());
            }
            return out;
        } finally {
            epoch.exclusive().unlock();
        }
    }

    /** What a node's report asks for one item, on the reporting node's segment. */
    private interface ItemAction {
        /** {@code tick} is the access tick the report is handled at. */
        ResultCode apply(Segment seg, InventoryItem it, int tick);
    }

    /**
     * Applies {@code action} to each item of a node's report, in order, on the node's segment; refused
     * whole if the node is not (or no longer) registered. Caller holds the epoch lock.
     */
    private List<ResultCode> eachItem(Inventory inv, String op, ItemAction action) {
        Segment seg = segments.get(inv.segmentId());
        if (seg == null || seg.nodeIncarnation != inv.nodeIncarnation()) {
            throw new BadRequestException(op + " for segment id " + inv.segmentId()
                    + ", which is not registered (register again)");
        }
        int tick = accessTick.getAsInt();
        List<ResultCode> out = new ArrayList<>(inv.items().size());
        for (InventoryItem it : inv.items()) {
            out.add(action.apply(seg, it, tick));
        }
        return out;
    }

    /** One item of an inventory. Caller holds the epoch write lock. */
    private ResultCode adopt(Segment seg, InventoryItem it, int tick) {
        if (it.epoch() != epoch.current()) {
            return ResultCode.ALREADY_EXISTS;
        }
        if (it.tier() == Tier.DISK) {
            return adoptDisk(seg, it, tick);
        }
        byte[] key = it.key();
        int hash = index.hash(key);
        long regionLength = ObjectLayout.regionLength(key.length, it.valueLength());
        @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
        Function<ObjectIndex.Shard, ResultCode> adoptOne = shard -> {
            if (shard.pending(key, hash) != null) {
                return ResultCode.ALREADY_EXISTS;
            }
            ObjectTable objects = shard.objects;
            int slot = objects.find(key, hash);
            if (slot >= 0 && objects.generation(slot) == it.generation() && objects.valueLength(slot) == it.valueLength()) {
                // another replica of the same object version: keep it as one more replica
                if (objects.replicaOn(slot, seg.id) >= 0 || !seg.allocator.reserve(it.offset(), regionLength)) {
                    return ResultCode.ALREADY_EXISTS;
                }
                objects.addReplica(slot, seg.id, it.offset());
                return ResultCode.OK;
            }
            if (slot >= 0 && objects.generation(slot) >= it.generation()) {
                // an older version (an upsert replaced it), or a copy that disagrees with the one held
                return ResultCode.ALREADY_EXISTS;
            }
            if (!seg.allocator.reserve(it.offset(), regionLength)
                    && !(replaced.claimHeld(seg, it.offset(), regionLength, it.generation())
                    && seg.allocator.reserve(it.offset(), regionLength))) {
                return ResultCode.ALREADY_EXISTS;
            }
            if (slot >= 0) {
                // this copy is newer than the one listed first: it wins, the older one is freed
                segments.release(objects, slot);
            }
            shard.storeOneCopy(slot, key, hash, it.valueLength(), it.generation(), tick, seg.id, it.offset());
            generations.accumulateAndGet(it.generation() + 1, Math::max);
            return ResultCode.OK;
        };
        return index.withShard(hash, adoptOne);
    }

    /**
     * An object in a node's SSD tier (from its inventory, or just spilled there): listed as a disk
     * replica unless the key is held by something else (a newer version, a put in flight).
     * Caller holds the epoch lock (either mode).
     */
    private ResultCode adoptDisk(Segment seg, InventoryItem it, int tick) {
        byte[] key = it.key();
        int hash = index.hash(key);
        long ep = epoch.current();
        @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
        Function<ObjectIndex.Shard, ResultCode> adoptOnDisk = shard -> {
            if (shard.taken(key, hash, ep)) {
                ObjectTable objects = shard.objects;
                int slot = objects.find(key, hash);
                if (slot >= 0 && objects.generation(slot) == it.generation() && objects.replicaOn(slot, seg.id) < 0) {
                    objects.addReplica(slot, seg.id | ObjectTable.DISK_BIT, 0);
                    return ResultCode.OK;
                }
                return ResultCode.ALREADY_EXISTS;
            }
            shard.objects.insert(key, hash, it.valueLength(), it.generation(), tick,
                    new int[]{seg.id | ObjectTable.DISK_BIT}, new long[]{0}, 1);
            generations.accumulateAndGet(it.generation() + 1, Math::max);
            return ResultCode.OK;
        };
        return index.withShard(hash, adoptOnDisk);
    }

    // ================================================================== the SSD tier

    /** NODE_DISK_ADD: objects a node just spilled to its SSD tier become visible again, as disk replicas. */
    public List<ResultCode> diskAdd(Inventory inv) {
        epoch.shared().lock();
        try {
            return eachItem(inv, "node_disk_add", (seg, it, tick) -> {
                if (it.epoch() != epoch.current()) {
                    return ResultCode.FENCED;
                }
                int hash = index.hash(it.key());
                // the ledger check and the adoption under the key's shard lock, which a removal of the key
                // holds while it cancels the spill: the removal comes wholly before (the spill is gone:
                // EXPIRED) or wholly after (it removes the disk copy), never in between
                return index.withShard(hash, shard -> {
                    if (spills.land(new Key(it.key(), hash), it.generation(), seg.id)) {
                        return adoptDisk(seg, it, tick); // re-enters the same shard lock
                    }
                    // already listed (a report repeated after a lost reply, or the node's inventory listed
                    // it after a re-registration): nothing to do; else removed or replaced on its way to disk
                    return listedOnDisk(seg, it) ? ResultCode.OK : ResultCode.EXPIRED;
                });
            });
        } finally {
            epoch.shared().unlock();
        }
    }

    /** NODE_DISK_DROP: a node's SSD tier let objects go; their disk replicas (that generation only) leave the index. */
    public List<ResultCode> diskDrop(Inventory inv) {
        epoch.shared().lock();
        try {
            return eachItem(inv, "node_disk_drop", (seg, it, tick) -> withDiskReplica(seg, it, (objects, slot, r) -> {
                if (r < 0) {
                    return ResultCode.NOT_FOUND;
                }
                if (objects.replicas(slot) == 1) {
                    objects.remove(slot);
                } else {
                    objects.removeReplica(slot, r);
                    copiesChanged.run();
                }
                return ResultCode.OK;
            }));
        } finally {
            epoch.shared().unlock();
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
        @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
        Function<ObjectIndex.Shard, ResultCode> apply = shard -> {
            ObjectTable objects = shard.objects;
            int slot = objects.find(key, hash);
            int r = slot < 0 || objects.generation(slot) != it.generation() ? -1 : objects.replicaOn(slot, seg.id);
            return action.apply(objects, slot, r >= 0 && ObjectTable.onDisk(objects.segment(slot, r)) ? r : -1);
        };
        return index.withShard(hash, apply);
    }

    /** Whether the key is listed at this generation with a disk replica on {@code seg}. */
    private boolean listedOnDisk(Segment seg, InventoryItem it) {
        return withDiskReplica(seg, it, (objects, slot, r) -> r >= 0 ? ResultCode.OK : ResultCode.NOT_FOUND)
                == ResultCode.OK;
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
        Segment seg = segments.get(segmentId);
        if (seg == null || seg.nodeIncarnation != nodeIncarnation) {
            return new HeartbeatReply(ResultCode.NOT_FOUND, epoch.current());
        }
        if (tiers != null) {
            seg.tiers = tiers;
        }
        if (peer != null) {
            seg.link = peer;
        }
        seg.lastHeartbeatMillis = clock.millis();
        return new HeartbeatReply(ResultCode.OK, epoch.current());
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
        segments.remove(seg);
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
                if (onlyOn(it.next(), seg.id)) {
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
        if (kept[0] > 0) {
            copiesChanged.run(); // objects that still have a copy get their lost ones back (Repair)
        }
        nodes.forget(seg);
        droppedSegments.incrementAndGet();
        log.warn("{} dropped ({}): {} objects lost with it{}", seg, why, lost[0],
                forgotten[0] == 0 ? "" : ", " + forgotten[0] + " puts pending only on it forgotten");
        return elsewhere;
    }

    /** Whether every replica of pending put {@code p} is on segment {@code id}. */
    private static boolean onlyOn(ObjectIndex.PendingPut p, int id) {
        for (int s : p.segments) {
            if (s != id) {
                return false;
            }
        }
        return true;
    }

    /** Whether the index holds {@code it}'s key at {@code it}'s generation. Caller holds the epoch lock. */
    private boolean live(InventoryItem it) {
        byte[] key = it.key();
        int hash = index.hash(key);
        @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
        Function<ObjectIndex.Shard, Boolean> holds = shard -> {
            int slot = shard.objects.find(key, hash);
            return slot >= 0 && shard.objects.generation(slot) == it.generation();
        };
        return index.withShard(hash, holds);
    }
}
