package io.kvpool.client;

import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.MasterMessages;

import java.util.List;

/**
 * Where a batch of objects was when {@link KvPoolClient#locate} looked them up: per key its value
 * length (or {@link KvPoolClient#MISS}), its generation and its copies. Ranged reads
 * ({@link KvPoolClient#getRangesInto}) use it again and again without asking the master: a
 * layer-by-layer load locates a step's blocks once and reads one layer of each per call.
 *
 * <p>It names object <em>versions</em>: a read through it yields bytes of exactly the version
 * located, or a miss. An object removed or replaced since is a miss, and so is one whose node cannot
 * be reached. A read that misses asks the master once where the same version is now (it may have
 * moved, to the SSD tier for one), and an item found gone then stays a miss
 * ({@link #valueLength} turns to {@link KvPoolClient#MISS}).
 *
 * <p>Thread-safe: ranged reads of one {@code Located} may run on several threads at once.
 */
public final class Located {

    private final List<String> keys;
    /** Where each item is (null or not OK: missing); replaced when a read found the version elsewhere. */
    private final MasterMessages.ReplicaList[] where;
    /** Which items came from the location cache (their reads are confirmed under the read lease). */
    private final boolean[] cached;
    /** The location cache's snapshot taken before the lookup. */
    private final long snapshot;
    /** Items already looked up again after a miss: a second miss leaves them gone. */
    private final boolean[] rechecked;

    Located(List<String> keys, MasterMessages.ReplicaList[] where, boolean[] cached, long snapshot) {
        this.keys = List.copyOf(keys);
        this.where = where;
        this.cached = cached;
        this.snapshot = snapshot;
        this.rechecked = new boolean[where.length];
    }

    /** How many keys were located. */
    public int size() {
        return keys.size();
    }

    /** Key {@code i}, as given to {@link KvPoolClient#locate}. */
    public String key(int i) {
        return keys.get(i);
    }

    public List<String> keys() {
        return keys;
    }

    /**
     * The value length of item {@code i}, or {@link KvPoolClient#MISS} if it was missing when located
     * or a read found it removed or replaced since.
     */
    public synchronized long valueLength(int i) {
        return present(where[i]) ? where[i].valueLength() : KvPoolClient.MISS;
    }

    /** {@link #valueLength} of every item. */
    public synchronized long[] valueLengths() {
        long[] out = new long[where.length];
        for (int i = 0; i < out.length; i++) {
            out[i] = present(where[i]) ? where[i].valueLength() : KvPoolClient.MISS;
        }
        return out;
    }

    /** How many items were present when located (and not found gone since). */
    public synchronized int present() {
        int n = 0;
        for (MasterMessages.ReplicaList w : where) {
            n += present(w) ? 1 : 0;
        }
        return n;
    }

    static boolean present(MasterMessages.ReplicaList w) {
        return w != null && w.code() == ResultCode.OK && !w.replicas().isEmpty();
    }

    /** A copy of where every item is now, for one read. */
    synchronized MasterMessages.ReplicaList[] where() {
        return where.clone();
    }

    synchronized boolean cached(int i) {
        return cached[i];
    }

    long snapshot() {
        return snapshot;
    }

    /**
     * Marks item {@code i} looked up again, returning false if it had been already (then it is not
     * looked up a second time: it stays as it is).
     */
    synchronized boolean recheck(int i) {
        if (rechecked[i]) {
            return false;
        }
        rechecked[i] = true;
        return true;
    }

    /**
     * The master's answer for item {@code i} after a miss: the same version elsewhere replaces the
     * old location (returns true); anything else (gone, another version) makes the item a miss for good.
     */
    synchronized boolean relocated(int i, MasterMessages.ReplicaList now) {
        MasterMessages.ReplicaList was = where[i];
        boolean same = present(now) && present(was) && now.generation() == was.generation()
                && now.valueLength() == was.valueLength();
        where[i] = same ? now : null;
        cached[i] = false;
        return same;
    }

    /** Item {@code i} missed after it was looked up again: it is a miss from now on. */
    synchronized void gone(int i) {
        where[i] = null;
    }
}
