package io.kvpool.engine;

import io.kvpool.connector.hash.BlockHash;

import java.util.ArrayDeque;
import java.util.HashMap;
import java.util.LinkedHashSet;
import java.util.Map;

/**
 * The engine's KV block allocator and its local prefix cache, in one structure (as in vLLM):
 *
 * <pre>
 *   block states        refs   in prefix cache   where
 *   free                 0          no           free list
 *   cached, idle         0          yes          evictable (LRU order) - reused when free runs out
 *   in use               >0         yes or no    some sequence's block table
 * </pre>
 *
 * A full block whose KV is computed (or loaded) is registered under its chained block hash; a later
 * sequence with the same prefix takes it (refs + 1) instead of computing it. Only full blocks are
 * cached, and a cached block is never written again (its tokens are fixed), so sharing it is safe.
 * {@link #reset()} forgets every hash (a weight update: cached KV is stale) without touching blocks
 * in use. Single-threaded: the engine's step thread owns it.
 */
final class BlockPool {

    private final int numBlocks;
    private final int[] refs;
    private final BlockHash[] hashOf;
    private final ArrayDeque<Integer> free = new ArrayDeque<>();
    private final Map<BlockHash, Integer> cached = new HashMap<>();
    /** Cached blocks with no reference, least recently released first. */
    private final LinkedHashSet<Integer> evictable = new LinkedHashSet<>();
    private long hitBlocks;
    private long queriedBlocks;

    BlockPool(int numBlocks) {
        if (numBlocks < 1) {
            throw new IllegalArgumentException("the KV cache needs at least one block, got " + numBlocks);
        }
        this.numBlocks = numBlocks;
        this.refs = new int[numBlocks];
        this.hashOf = new BlockHash[numBlocks];
        for (int i = 0; i < numBlocks; i++) {
            free.add(i);
        }
    }

    int numBlocks() {
        return numBlocks;
    }

    /** Blocks that can be handed out now (free, or cached and idle). */
    int available() {
        return free.size() + evictable.size();
    }

    /** The cached block holding this hash, taken (refs + 1), or -1. Counts toward the hit rate. */
    int take(BlockHash h) {
        queriedBlocks++;
        Integer b = cached.get(h);
        if (b == null) {
            return -1;
        }
        hitBlocks++;
        if (refs[b]++ == 0) {
            evictable.remove(b);
        }
        return b;
    }

    /** Whether this hash is cached (no side effects). */
    boolean contains(BlockHash h) {
        return cached.containsKey(h);
    }

    /** A fresh block (refs 1), evicting the least recently released cached block if none is free; -1 if none. */
    int allocate() {
        Integer b = free.poll();
        if (b == null) {
            var it = evictable.iterator();
            if (!it.hasNext()) {
                return -1;
            }
            b = it.next();
            it.remove();
            cached.remove(hashOf[b]);
            hashOf[b] = null;
        }
        refs[b] = 1;
        return b;
    }

    /** Registers a full, computed block under its hash (if no other block holds that hash yet). */
    void register(int block, BlockHash h) {
        if (hashOf[block] != null || cached.containsKey(h)) {
            return;
        }
        hashOf[block] = h;
        cached.put(h, block);
    }

    /** Drops one reference; an unreferenced block becomes evictable if cached, else free. */
    void release(int block) {
        if (refs[block] <= 0) {
            throw new IllegalStateException("block " + block + " released more often than taken");
        }
        if (--refs[block] == 0) {
            if (hashOf[block] != null) {
                evictable.add(block);
            } else {
                free.add(block);
            }
        }
    }

    /** Forgets every cached hash; idle cached blocks become free. Blocks in use stay with their owners. */
    int reset() {
        int n = cached.size();
        for (int b : evictable) {
            free.add(b);
        }
        evictable.clear();
        cached.clear();
        java.util.Arrays.fill(hashOf, null);
        return n;
    }

    int cachedBlocks() {
        return cached.size();
    }

    long hitBlocks() {
        return hitBlocks;
    }

    long queriedBlocks() {
        return queriedBlocks;
    }

    int refs(int block) {
        return refs[block];
    }
}
