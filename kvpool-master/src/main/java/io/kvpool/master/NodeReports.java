package io.kvpool.master;

import io.kvpool.protocol.BadRequestException;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.MasterMessages.Inventory;
import io.kvpool.protocol.msg.MasterMessages.InventoryItem;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Function;
import java.util.function.IntSupplier;

/**
 * What nodes report they hold: the inventory a registering node lists (NODE_INVENTORY), and what its
 * SSD tier took in and let go (NODE_DISK_ADD, NODE_DISK_DROP). {@link Membership} owns who is a
 * member; this class turns members' reports into the index.
 *
 * <p>Invariants:
 * <ul>
 *   <li>A segment takes puts only once its inventory is in (it is JOINING until then).</li>
 *   <li>An adopted memory copy reserves its region at the offset the node reports, so new puts never
 *       overlap it. Of two copies of a key, the newer generation wins and the older one is freed; a
 *       copy from another epoch, or of a key with a put in flight, is refused (ALREADY_EXISTS tells the
 *       node to drop it). A copy that is the object a put pending on the node's previous registration
 *       was writing takes the range held for that put ({@link Membership.Replaced#claimHeld}).</li>
 *   <li>A spilled object comes back as a disk replica only through its spill still in the ledger.</li>
 *   <li>Generations handed out after a rebuild are above every generation adopted.</li>
 * </ul>
 *
 * <p>Locks: an inventory holds the epoch write lock (it changes what a reset would have to undo); disk
 * reports hold the read lock. The index is reached through {@link ObjectIndex#withShard}.
 */
final class NodeReports {

    private static final Logger log = LoggerFactory.getLogger(NodeReports.class);

    private final Epoch epoch;
    private final ObjectIndex index;
    private final Segments segments;
    private final SpillLedger spills;
    private final NodeNotifier nodes;
    private final AtomicLong generations;
    /** The LRU clock (eviction's access tick): adopted objects count as just read. */
    private final IntSupplier accessTick;
    /** Told when objects lost copies or a segment joined: the repair has work, or room for it. */
    private final Runnable copiesChanged;
    private final Membership.Replaced replaced;

    NodeReports(Epoch epoch, ObjectIndex index, Segments segments, SpillLedger spills, NodeNotifier nodes,
                AtomicLong generations, IntSupplier accessTick, Runnable copiesChanged, Membership.Replaced replaced) {
        this.epoch = epoch;
        this.index = index;
        this.segments = segments;
        this.spills = spills;
        this.nodes = nodes;
        this.generations = generations;
        this.accessTick = accessTick;
        this.copiesChanged = copiesChanged;
        this.replaced = replaced;
    }

    /** NODE_INVENTORY: take over objects a node already holds. ALREADY_EXISTS tells the node to drop one. */
    List<ResultCode> inventory(Inventory inv) {
        for (InventoryItem it : inv.items()) {
            ObjectIndex.checkKeyLength(it.key());
        }
        epoch.exclusive().lock();
        try {
            // a copy whose free the node missed (removed or evicted while it was away) is not taken back, nor
            // anything of a segment that comes back empty (it missed more frees than were kept: which copies
            // are removed objects is not known), and a copy of an object that kept copies elsewhere when this
            // segment was dropped for silence is taken only while that object lives (it may have been removed,
            // replaced or evicted since), and a copy whose only copy was lost with this segment is taken only if its
            // key was neither removed nor stored since (LostCopies)
            List<ResultCode> out = eachItem(inv, "node_inventory", (seg, it, tick) ->
                    seg.comesBackEmpty || nodes.freedWhileAway(seg.name, it.generation())
                            || (nodes.copiedElsewhere(seg.name, it.generation()) && !live(it))
                            || (lostAndRevoked(seg, it) && !live(it))
                            ? ResultCode.ALREADY_EXISTS : adopt(seg, it, tick));
            if (inv.last()) {
                // still registered: nothing drops a segment while we hold the write lock
                Segment seg = segments.get(inv.segmentId());
                nodes.inventoryTaken(seg.name);
                index.events.lost.settled(seg.name);
                seg.comesBackEmpty = false; // its node dropped what it listed: it holds nothing the index lacks
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
                    objects.addReplica(slot, seg.id | StoredSegment.DISK_BIT, 0);
                    return ResultCode.OK;
                }
                return ResultCode.ALREADY_EXISTS;
            }
            shard.objects.insert(key, hash, it.valueLength(), it.generation(), tick,
                    new int[]{seg.id | StoredSegment.DISK_BIT}, new long[]{0}, 1);
            generations.accumulateAndGet(it.generation() + 1, Math::max);
            return ResultCode.OK;
        };
        return index.withShard(hash, adoptOnDisk);
    }

    // ------------------------------------------------------------------ the SSD tier

    /**
     * NODE_DISK_ADD: objects a node just spilled to its SSD tier are durable there. A spill is listed as a disk
     * copy from its eviction on ({@link FreeBatch#evict}): the report confirms it; a spill the index no longer
     * lists (a node that re-registered meanwhile) is listed again.
     */
    List<ResultCode> diskAdd(Inventory inv) {
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
                        return listedOnDisk(seg, it) ? ResultCode.OK : adoptDisk(seg, it, tick); // re-enters the lock
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
    List<ResultCode> diskDrop(Inventory inv) {
        epoch.shared().lock();
        try {
            return eachItem(inv, "node_disk_drop", (seg, it, tick) -> withDiskReplica(seg, it, (objects, slot, r) -> {
                spills.land(new Key(it.key(), index.hash(it.key())), it.generation(), seg.id); // a spill dropped: done
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
            return action.apply(objects, slot, r >= 0 && StoredSegment.onDisk(objects.segment(slot, r)) ? r : -1);
        };
        return index.withShard(hash, apply);
    }

    /** Whether the key is listed at this generation with a disk replica on {@code seg}. */
    private boolean listedOnDisk(Segment seg, InventoryItem it) {
        return withDiskReplica(seg, it, (objects, slot, r) -> r >= 0 ? ResultCode.OK : ResultCode.NOT_FOUND)
                == ResultCode.OK;
    }


    /** Whether the index holds {@code it}'s key at {@code it}'s generation. Caller holds the epoch lock. */
    /** Whether the item's object was lost with this segment and its key removed or stored since. */
    private boolean lostAndRevoked(Segment seg, InventoryItem it) {
        return index.events.lost.revoked(seg.name, it.key(), index.hash(it.key()), it.generation());
    }

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
