package io.kvpool.master;

import io.kvpool.protocol.ResultCode;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.function.Consumer;

/**
 * Removals: by key, by prefix, and all at once (with or without a new epoch). Each drops what the index
 * lists, frees its regions on the nodes, and returns only once the nodes acknowledged (or their bound
 * passed) and every leased client dropped the locations it remembered (or its read lease ran out):
 * after that no reader anywhere gets a removed object ({@link ReadLeases}). A removal also revokes the
 * copies its keys lost with a dropped node ({@link LostCopies}), so a node that comes back cannot undo
 * it. {@link MasterService} answers REMOVE, REMOVE_BY_PREFIX and REMOVE_ALL through this.
 */
final class Removals {

    private static final Logger log = LoggerFactory.getLogger(Removals.class);

    private final ObjectIndex index;
    private final Epoch epoch;
    private final Segments segments;
    private final SpillLedger spills;
    private final NodeNotifier nodes;
    private final ReadLeases leases;
    private final RecentResets resets;

    Removals(ObjectIndex index, Epoch epoch, Segments segments, SpillLedger spills, NodeNotifier nodes,
             ReadLeases leases, RecentResets resets) {
        this.index = index;
        this.epoch = epoch;
        this.segments = segments;
        this.spills = spills;
        this.nodes = nodes;
        this.leases = leases;
        this.resets = resets;
    }

    /** REMOVE: drop complete objects. NOT_FOUND for keys that were not there. */
    List<ResultCode> remove(List<byte[]> keys) {
        ResultCode[] out = new ResultCode[keys.size()];
        epoch.shared().lock();
        try {
            @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
            ObjectIndex.KeyVisitor drop = (shard, i, key, hash) -> {
                index.events.lost.revoke(key, hash); // a copy lost with a dropped node must not come back now
                ObjectTable objects = shard.objects;
                int slot = objects.find(key, hash);
                spills.forget(new Key(key, hash)); // its listed copies, spills included, are freed below
                if (slot < 0) {
                    out[i] = ResultCode.NOT_FOUND;
                    return;
                }
                segments.release(objects, slot);
                objects.remove(slot);
                out[i] = ResultCode.OK;
            };
            index.forEachKey(keys, drop);
        } finally {
            epoch.shared().unlock();
        }
        // every key named, found or not: a client may remember a location of one evicted meanwhile
        settle(leases.publishKeys(keys));
        return new ArrayList<>(Arrays.asList(out));
    }

    /** REMOVE_BY_PREFIX: drop every complete object whose key starts with {@code prefix}. */
    long removeByPrefix(byte[] prefix) {
        long[] n = {0};
        FreeBatch frees = new FreeBatch();
        long cleared = prefix.length == 0 ? index.events.allCleared() : 0; // KV events: see ObjectEvents
        epoch.shared().lock();
        try {
            index.events.lost.revokePrefix(prefix); // under the lock: a node dropped meanwhile has its losses revoked
            @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
            Consumer<ObjectIndex.Shard> dropPrefix = shard -> {
                ObjectTable objects = shard.objects;
                if (prefix.length == 0) {
                    // everything goes: collect, then drop the shard's storage at once
                    for (int slot = 0; slot < objects.size(); slot++) {
                        frees.addObject(objects, slot, FreeBatch.SpillChoice.NEVER);
                    }
                    n[0] += objects.size();
                    objects.events.clearing(objects, cleared);
                    objects.clear();
                } else {
                    n[0] += objects.removeIf(slot -> {
                        if (!objects.keyStartsWith(slot, prefix)) {
                            return false;
                        }
                        frees.addObject(objects, slot, FreeBatch.SpillChoice.NEVER);
                        return true;
                    });
                }
                // this shard's spills, under its lock, as NODE_DISK_ADD checks them (NodeReports.diskAdd); their
                // objects were listed (as disk copies) and are freed with the rest
                spills.forgetByPrefix(prefix, key -> index.inShard(key.hashCode(), shard));
            };
            index.forEachShard(dropPrefix);
            // still under the epoch lock: a reset cannot slip in and free these regions first
            frees.apply(segments, nodes);
        } finally {
            epoch.shared().unlock();
        }
        settle(prefix.length == 0 ? leases.publishAll() : leases.publishPrefix(prefix));
        resets.removeByPrefix(prefix, n[0], epoch.current());
        return n[0];
    }

    /**
     * Completes a removal whose invalidation {@code seq} is published: the nodes hear of the freed
     * regions (bounded wait), and every leased client applied it or its lease ran out.
     */
    void settle(long seq) {
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
    long removeAll(boolean force) {
        if (!force) {
            return removeByPrefix(new byte[0]);
        }
        long n;
        long newEpoch;
        List<Segment> all;
        epoch.exclusive().lock();
        try {
            newEpoch = epoch.current() + 1;
            n = epoch.reset(newEpoch);
            all = new ArrayList<>(segments.all());
        } finally {
            epoch.exclusive().unlock();
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
        resets.removeAll(true, n, newEpoch);
        return n;
    }
}
