package io.kvpool.master;

import io.kvpool.protocol.TierCounts;

import java.util.List;

/**
 * The master's probes: whether keys are present and how large their values are, asked by key or by
 * {@link io.kvpool.protocol.KeyDigest digest}. They only read the index (shard by shard, each
 * shard's lock taken once per batch) and never count as reads for eviction, so a probe never keeps
 * an object alive.
 */
public final class Probes {

    /** Looks up positions {@code [from, to)} of a batch and sets {@code present[i - from]}. */
    private interface Chunk {
        void lookup(int from, int to, boolean[] present);
    }

    private final ObjectIndex index;

    Probes(ObjectIndex index) {
        this.index = index;
    }

    /** EXIST_KEY: presence of complete objects. */
    public boolean[] exists(List<byte[]> keys) {
        boolean[] out = new boolean[keys.size()];
        index.lookupEach(keys, (shard, i, slot) -> out[i] = slot >= 0);
        return out;
    }

    /** BATCH_EXIST_DIGEST: presence of complete objects, keys given by digest. */
    public boolean[] existsDigests(long[] digests, int count) {
        boolean[] out = new boolean[count];
        index.lookupDigests(digests, 0, count, (shard, i, slot) -> out[i] = slot >= 0);
        return out;
    }

    /** PREFIX_MATCH: how many leading keys are present. */
    public int prefixMatch(List<byte[]> keys) {
        return leading(keys.size(), (from, to, present) -> {
            boolean[] p = exists(keys.subList(from, to));
            System.arraycopy(p, 0, present, 0, p.length);
        });
    }

    /** PREFIX_MATCH_DIGEST: {@link #prefixMatch} with keys given by digest. */
    public int prefixMatchDigests(long[] digests, int count) {
        return leading(count, (from, to, present) ->
                index.lookupDigests(digests, from, to, (shard, i, slot) -> present[i] = slot >= 0));
    }

    /**
     * TIER_LOOKUP: per key {@link TierCounts#MEMORY} (a copy in memory), {@link TierCounts#STORAGE} (copies on the
     * SSD tier only) or {@link TierCounts#ABSENT}.
     */
    public byte[] tiers(List<byte[]> keys) {
        byte[] out = new byte[keys.size()];
        @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
        ObjectIndex.SlotVisitor tier = (shard, i, slot) -> {
            if (slot < 0) {
                return;
            }
            out[i] = TierCounts.STORAGE;
            for (int r = 0; r < shard.objects.replicas(slot); r++) {
                if (!StoredSegment.onDisk(shard.objects.segment(slot, r))) {
                    out[i] = TierCounts.MEMORY;
                }
            }
        };
        index.lookupEach(keys, tier);
        return out;
    }

    /** OBJECT_SIZE: value length per key, or -1. */
    public long[] sizes(List<byte[]> keys) {
        long[] out = new long[keys.size()];
        @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
        ObjectIndex.SlotVisitor size = (shard, i, slot) -> out[i] = slot < 0 ? -1 : shard.objects.valueLength(slot);
        index.lookupEach(keys, size);
        return out;
    }

    /**
     * The number of leading present keys of {@code n}, looked up in chunks that grow fourfold (32,
     * 128, 512 ... 4096), stopping after the chunk with the first miss: a cold chain costs a few
     * lookups, a long warm one few lock rounds (1,024 keys take four).
     */
    private static int leading(int n, Chunk chunkLookup) {
        for (int from = 0, chunk = 32; from < n; from += chunk, chunk = Math.min(chunk * 4, 4096)) {
            int to = Math.min(n, from + chunk);
            boolean[] present = new boolean[to - from];
            chunkLookup.lookup(from, to, present);
            for (int j = 0; j < present.length; j++) {
                if (!present[j]) {
                    return from + j;
                }
            }
        }
        return n;
    }
}
