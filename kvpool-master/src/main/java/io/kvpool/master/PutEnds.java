package io.kvpool.master;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.MasterMessages.PutEndItem;

import java.util.List;

/**
 * PUT_END, one item at a time ({@link MasterService#putEnd} visits a batch shard by shard): the pending put
 * becomes the object, on the copies that were written, or is answered why not. Also idempotent: a PUT_END sent
 * again finds its object stored and is answered OK.
 */
final class PutEnds {

    private final Epoch epoch;
    private final Segments segments;
    private final NodeNotifier nodes;
    private final Repair repair;

    PutEnds(Epoch epoch, Segments segments, NodeNotifier nodes, Repair repair) {
        this.epoch = epoch;
        this.segments = segments;
        this.nodes = nodes;
        this.repair = repair;
    }

    /** One item of PUT_END. Caller holds the epoch read lock too. */
    @GuardedBy("shard.lock")
    ResultCode one(ObjectIndex.Shard shard, PutEndItem it, byte[] key, int hash, int tick,
                                 List<byte[]> upserted) {
        ObjectTable objects = shard.objects;
        ObjectIndex.PendingPut p = shard.pending(key, hash);
        if (p == null || p.generation != it.generation()) {
            int slot = objects.find(key, hash);
            return slot >= 0 && objects.generation(slot) == it.generation() ? ResultCode.OK : ResultCode.EXPIRED;
        }
        shard.pending.remove(new Key(key, hash));
        long regionLength = ObjectLayout.regionLength(key.length, p.valueLength);
        if (p.epoch != epoch.current()) {
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
            segments.release(objects, slot);
            objects.replace(slot, p.valueLength, p.generation, tick, segs, offs, kept);
        } else {
            slot = objects.insert(key, hash, p.valueLength, p.generation, tick, segs, offs, kept);
        }
        if (p.wanted > kept) {
            // placed on fewer segments than asked, or a copy failed: the repair makes up for it when it can
            objects.setWanted(slot, p.wanted);
            repair.markDirty();
        }
        if (p.pinUntil != 0) {
            objects.pin(slot, p.pinUntil);
        }
        if (p.upsert) {
            upserted.add(key);
        }
        return ResultCode.OK;
    }
}
