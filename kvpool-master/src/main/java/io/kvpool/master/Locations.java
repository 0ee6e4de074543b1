package io.kvpool.master;

import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.MasterMessages.ReplicaList;
import io.kvpool.protocol.msg.Replica;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * GET_REPLICA_LIST: where to read each object, the master's answer to the lookup every read starts with. Unlike the
 * {@link Probes}, it counts as a read for eviction: it stamps each object found with the access tick.
 */
final class Locations {

    private Locations() {
    }

    /** Per key its copies (tier, segment, offset), value length and generation, or NOT_FOUND; touched at {@code tick}. */
    static List<ReplicaList> of(ObjectIndex index, int tick, List<byte[]> keys) {
        ReplicaList[] out = new ReplicaList[keys.size()];
        @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
        ObjectIndex.SlotVisitor locate = (shard, i, slot) -> {
            if (slot < 0) {
                out[i] = ReplicaList.NOT_FOUND;
                return;
            }
            ObjectTable objects = shard.objects;
            objects.touch(slot, tick);
            int n = objects.replicas(slot);
            List<Replica> reps = new ArrayList<>(n);
            for (int r = 0; r < n; r++) {
                int stored = objects.segment(slot, r);
                reps.add(new Replica(StoredSegment.id(stored), StoredSegment.onDisk(stored) ? Tier.DISK : Tier.MEMORY,
                        objects.offset(slot, r)));
            }
            out[i] = new ReplicaList(ResultCode.OK, objects.valueLength(slot), objects.generation(slot), reps);
        };
        index.lookupEach(keys, locate);
        return new ArrayList<>(Arrays.asList(out));
    }
}
