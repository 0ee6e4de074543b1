package io.kvpool.connector;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.Located;
import io.kvpool.client.PutInParts;
import io.kvpool.client.PutOptions;
import io.kvpool.client.PutStatus;

import java.lang.foreign.MemorySegment;
import java.util.List;

/**
 * The pool calls {@link PoolConnector} makes, and nothing else: what the connector needs of a pool.
 * {@link #of} adapts a {@link KvPoolClient} (what engines use); the contract tests give an in-memory
 * store that can also be told to fail, so the connector under test is the real one. Each method means
 * what the client method of the same name means; {@link #locate} and {@link #beginPut} are the
 * layer-by-layer forms ({@link KvPoolClient#locate} with {@link KvPoolClient#getRangesInto}, and
 * {@link KvPoolClient#beginPut}).
 */
interface PoolStore {

    /** Objects located once and read in ranges, a layer of every block per call. */
    interface Ranges {
        /** Item {@code i}'s value length, or {@link KvPoolClient#MISS}. */
        long valueLength(int i);

        /** Reads {@code dsts.get(i).byteSize()} bytes from {@code offsets[i]} of item i: bytes read, or MISS. */
        long[] read(long[] offsets, List<MemorySegment> dsts);
    }

    /** Objects reserved once and written in ranges, a layer of every block per call. */
    interface Parts {
        /** Writes {@code srcs.get(k)} at {@code offsets[k]} of item {@code items[k]}: whether it landed. */
        boolean[] write(int[] items, long[] offsets, List<MemorySegment> srcs);

        /** Makes every fully written item visible: a status per item. */
        List<PutStatus> finish();

        /** Drops everything: nothing becomes visible. */
        void abandon();
    }

    /** Locates {@code keys} for ranged reads. */
    Ranges locate(List<String> keys);

    /** Reserves an object of {@code valueLengths[i]} bytes under each key, to be written in ranges. */
    Parts beginPut(List<String> keys, long[] valueLengths);

    /** How many of the keys {@code [from, to)}, given as digests (lo, hi), are present, in order. */
    int prefixMatchDigests(long[] digests, int from, int to);

    /** Reads each key into its destination: the length read, or {@link KvPoolClient#MISS}. */
    long[] getIntoBatch(List<String> keys, List<MemorySegment> dsts);

    /** Stores each value under its key: a status per key. */
    List<PutStatus> putBatch(List<String> keys, List<MemorySegment> values);

    /** Empties the pool; {@code force} fences puts in flight. The count removed. */
    long removeAll(boolean force);

    /** Removes every key starting with {@code prefix}; the count removed. */
    long removeByPrefix(String prefix);

    static PoolStore of(KvPoolClient client) {
        return new PoolStore() {
            @Override
            public int prefixMatchDigests(long[] digests, int from, int to) {
                return client.prefixMatchDigests(digests, from, to);
            }

            @Override
            public long[] getIntoBatch(List<String> keys, List<MemorySegment> dsts) {
                return client.getIntoBatch(keys, dsts);
            }

            @Override
            public List<PutStatus> putBatch(List<String> keys, List<MemorySegment> values) {
                return client.putBatch(keys, values);
            }

            @Override
            public Ranges locate(List<String> keys) {
                Located located = client.locate(keys);
                return new Ranges() {
                    @Override
                    public long valueLength(int i) {
                        return located.valueLength(i);
                    }

                    @Override
                    public long[] read(long[] offsets, List<MemorySegment> dsts) {
                        return client.getRangesInto(located, offsets, dsts);
                    }
                };
            }

            @Override
            public Parts beginPut(List<String> keys, long[] valueLengths) {
                PutInParts parts = client.beginPut(keys, valueLengths, PutOptions.DEFAULT);
                return new Parts() {
                    @Override
                    public boolean[] write(int[] items, long[] offsets, List<MemorySegment> srcs) {
                        return parts.write(items, offsets, srcs);
                    }

                    @Override
                    public List<PutStatus> finish() {
                        return parts.finish();
                    }

                    @Override
                    public void abandon() {
                        parts.abandon();
                    }
                };
            }

            @Override
            public long removeAll(boolean force) {
                return client.removeAll(force);
            }

            @Override
            public long removeByPrefix(String prefix) {
                return client.removeByPrefix(prefix);
            }
        };
    }
}
