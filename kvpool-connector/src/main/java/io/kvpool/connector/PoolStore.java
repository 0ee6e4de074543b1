package io.kvpool.connector;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;

import java.lang.foreign.MemorySegment;
import java.util.List;

/**
 * The five pool calls {@link PoolConnector} makes, and nothing else: what the connector needs of a
 * pool. {@link #of} adapts a {@link KvPoolClient} (what engines use); the contract tests give an
 * in-memory store that can also be told to fail, so the connector under test is the real one.
 * Each method means what the client method of the same name means.
 */
interface PoolStore {

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
