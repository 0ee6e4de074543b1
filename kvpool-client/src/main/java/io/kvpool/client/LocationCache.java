package io.kvpool.client;

import io.kvpool.protocol.msg.MasterMessages.ReplicaList;

import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Where recently read objects live (value length, generation, replicas), so a repeated read can go
 * straight to the node or the shared segment without asking the master first.
 *
 * <h2>Why a stale entry is harmless</h2>
 * Every read names the generation it expects, and is checked where the bytes are: the node admits a
 * read only of a complete region with that generation, and a same-machine copy is checked against
 * the object's header before and after. So a cached location can only yield exactly the object
 * version it names, or a miss; on a miss the client drops the entry and asks the master. The master
 * makes removals and replacements reach the nodes before it answers (the regions' headers are dead
 * by then), so a read through a stale entry after a remove, an upsert or a removeAll returned is a
 * miss, as it would be through the master. Only an object evicted in the last moments may still be
 * read this way: its bytes are still exactly that key's.
 *
 * <h2>Eviction stays LRU</h2>
 * Reads served from the cache are reported to the master in the background (a batched
 * GET_REPLICA_LIST, which also refreshes the entries), so the master's LRU still sees them.
 *
 * <p>Bounded (least recently used entries leave first); thread-safe.
 */
final class LocationCache {

    /** Most reads remembered for the next touch report; beyond this they are dropped (LRU is approximate). */
    static final int MAX_PENDING_TOUCHES = 1 << 16;

    private final int capacity;
    private final LinkedHashMap<String, ReplicaList> map;
    private final Set<String> touched = ConcurrentHashMap.newKeySet();

    LocationCache(int capacity) {
        this.capacity = capacity;
        this.map = new LinkedHashMap<>(Math.min(capacity, 1 << 12), 0.75f, true) {
            @Override
            protected boolean removeEldestEntry(Map.Entry<String, ReplicaList> eldest) {
                return size() > LocationCache.this.capacity;
            }
        };
    }

    boolean enabled() {
        return capacity > 0;
    }

    synchronized ReplicaList get(String key) {
        return capacity > 0 ? map.get(key) : null;
    }

    synchronized void put(String key, ReplicaList where) {
        if (capacity > 0) {
            map.put(key, where);
        }
    }

    synchronized void invalidate(String key) {
        map.remove(key);
    }

    synchronized void invalidatePrefix(String prefix) {
        map.keySet().removeIf(k -> k.startsWith(prefix));
    }

    synchronized void clear() {
        map.clear();
    }

    synchronized int size() {
        return map.size();
    }

    /** Notes a read served from the cache, for the next report to the master. */
    void touched(String key) {
        if (touched.size() < MAX_PENDING_TOUCHES) {
            touched.add(key);
        }
    }

    /** Takes up to {@code max} keys read from the cache since the last report. */
    List<String> drainTouched(int max) {
        List<String> out = new ArrayList<>(Math.min(max, touched.size()));
        Iterator<String> it = touched.iterator();
        while (it.hasNext() && out.size() < max) {
            out.add(it.next());
            it.remove();
        }
        return out;
    }
}
