package io.kvpool.client;

import io.kvpool.protocol.Keys;
import io.kvpool.protocol.msg.MasterMessages;

import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * Ranged reads: {@link #locate} looks a batch of keys up once (remembered locations under the read
 * lease, the rest in one master round trip), and {@link #read} copies a byte range of each located
 * object, as often as the caller likes, without asking the master again. A layer-by-layer load reads
 * layer l of every block as the range {@code [l * layerBytes, (l + 1) * layerBytes)} of its object.
 *
 * <p>The bytes move as whole-object reads move them ({@link ObjectReads#readRound}): from a segment
 * on this host by a memory copy between two checks of the object's header, otherwise NODE_READ_RANGE,
 * one frame per node and payload limit, the node pinning each object while it sends the range. So a
 * range is of the version located, or a miss.
 *
 * <h2>Misses</h2>
 * A location from the cache counts only if the read lease still runs after the copy and no
 * invalidation since the lookup covers the key ({@link LocationCache#confirm}). An item that missed,
 * or whose cached location is not confirmed, is asked of the master once more: if the key still
 * holds the same version (the same generation), somewhere else now (moved to the SSD tier, another
 * replica), it is read from there and the {@link Located} remembers the new place; if it holds
 * another version or nothing, or it misses again, it is a miss for good. So a node that cannot be
 * reached costs one extra lookup per item, not one per layer.
 */
final class RangeReads {

    private final ObjectReads reads;
    private final LocationCache locations;

    RangeReads(ObjectReads reads, LocationCache locations) {
        this.reads = reads;
        this.locations = locations;
    }

    Located locate(List<String> keys) {
        MasterMessages.ReplicaList[] where = new MasterMessages.ReplicaList[keys.size()];
        boolean[] cached = new boolean[keys.size()];
        long snapshot = reads.locate(keys, Keys.encodeAll(keys), true, where, cached);
        return new Located(keys, where, cached, snapshot);
    }

    /**
     * Reads {@code dsts[i].byteSize()} bytes from {@code offsets[i]} of located object i into
     * {@code dsts[i]}; element i of the result is the bytes read, or {@link KvPoolClient#MISS}.
     */
    long[] read(Located at, long[] offsets, List<MemorySegment> dstList) {
        int n = at.size();
        if (offsets.length != n || dstList.size() != n) {
            throw new IllegalArgumentException(n + " located objects but " + offsets.length + " range offsets and "
                    + dstList.size() + " destinations");
        }
        long[] got = new long[n];
        Arrays.fill(got, KvPoolClient.MISS);
        MasterMessages.ReplicaList[] where = at.where();
        MemorySegment[] dsts = dstList.toArray(MemorySegment[]::new);
        List<Integer> items = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            if (!Located.present(where[i])) {
                continue;
            }
            long length = where[i].valueLength();
            long size = dsts[i].byteSize();
            if (offsets[i] < 0 || offsets[i] > length - size) {
                throw new IllegalArgumentException("range [" + offsets[i] + ", " + offsets[i] + " + " + size
                        + ") of key '" + Keys.abbreviate(at.key(i)) + "' is outside its value of " + length + " bytes");
            }
            items.add(i);
        }
        if (items.isEmpty()) {
            return got;
        }
        reads.readRound(where, offsets, dsts, got, items);
        long now = System.nanoTime();
        List<Integer> recheck = new ArrayList<>();
        for (int i : items) {
            boolean confirmed = !at.cached(i) || got[i] == KvPoolClient.MISS
                    || locations.confirm(at.key(i), at.snapshot(), now);
            if (got[i] != KvPoolClient.MISS && confirmed) {
                if (at.cached(i)) {
                    locations.touched(at.key(i));
                }
                continue;
            }
            got[i] = KvPoolClient.MISS;
            if (at.cached(i)) {
                locations.invalidate(at.key(i));
            }
            if (at.recheck(i)) {
                recheck.add(i);
            } else {
                at.gone(i);
            }
        }
        if (!recheck.isEmpty()) {
            retry(at, recheck, offsets, dsts, got);
        }
        return got;
    }

    /** Asks the master where the items are now and reads those still of the version located. */
    private void retry(Located at, List<Integer> items, long[] offsets, MemorySegment[] dsts, long[] got) {
        MasterMessages.ReplicaList[] now = new MasterMessages.ReplicaList[at.size()];
        reads.lookup(at.keys(), Keys.encodeAll(at.keys()), items, true, now, locations.snapshot());
        List<Integer> again = new ArrayList<>(items.size());
        for (int i : items) {
            if (at.relocated(i, now[i])) {
                again.add(i);
            }
        }
        if (again.isEmpty()) {
            return;
        }
        reads.readRound(now, offsets, dsts, got, again);
        for (int i : again) {
            if (got[i] == KvPoolClient.MISS) {
                at.gone(i);
            }
        }
    }
}
