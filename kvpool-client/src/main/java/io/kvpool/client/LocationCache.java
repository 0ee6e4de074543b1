package io.kvpool.client;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.protocol.Keys;
import io.kvpool.protocol.msg.LeaseMessages.Invalidation;
import io.kvpool.protocol.msg.LeaseMessages.Kind;
import io.kvpool.protocol.msg.LeaseMessages.LeaseReply;
import io.kvpool.protocol.msg.MasterMessages.ReplicaList;

import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;

/**
 * Where recently read objects live (value length, generation, replicas), so a repeated read can go
 * straight to the node or the shared segment without asking the master first; and the read lease
 * that makes using them safe.
 *
 * <h2>What the bytes' own checks cannot do</h2>
 * Every read names the generation it expects and is checked where the bytes are: a node admits a
 * read only of a complete region with that generation, and a same-machine copy is checked against
 * the object's header before and after. So a remembered location yields exactly the version it
 * names, or a miss. But a removal or a reset makes a node mark the old objects dead only if the node
 * is alive: a frozen or killed node's shared segment still holds intact headers, and a client
 * copying out of it would serve an object the pool has removed (a weight update's old KV).
 *
 * <h2>The read lease</h2>
 * So a remembered location is used only under a lease from the master (the master's side is
 * {@code ReadLeases}; docs/architecture.md, "Read leases"):
 * <ul>
 *   <li>The lease runs {@code leaseMillis} from when this client <em>sent</em> the renewal that
 *       granted it; {@link LeaseKeeper} renews it by a long poll. Every removal, reset and upsert
 *       reaches this client as an invalidation, which {@link #apply} applies (matching entries leave
 *       the cache) before the lease it came with is extended and before the client acknowledges it.
 *       The master does not complete the removal until this client acknowledged it or its lease
 *       ran out.</li>
 *   <li>A read notes {@link #snapshot()} (a count of applied invalidations) before it looks
 *       anything up. After copying from a remembered location it calls {@link #confirm}: the lease
 *       must still run, and no invalidation applied since the snapshot may cover the key. A failed
 *       confirmation turns the read into a miss (the caller asks the master again).</li>
 *   <li>A location learned from the master is remembered ({@link #remember}) only if no
 *       invalidation applied since the read's snapshot covers it, so an answer that raced a removal
 *       never enters the cache.</li>
 * </ul>
 * Hence: once a removal returned, either this client applied it (the entry is gone, and a copy in
 * flight fails its confirmation) or its lease has run out (every confirmation fails until a renewal
 * brings the removal with it).
 *
 * <h2>Not covered</h2>
 * Eviction and node loss are not invalidations: an object evicted from a frozen or dead node may
 * still be read, byte-exact, from a remembered location until the location is refreshed (reads from
 * the cache are reported every ping interval, which refreshes or drops their entries). Keys name
 * content, so its bytes are what the key means; only a plain put of different bytes under a key that
 * was evicted meanwhile could be shadowed that long (an upsert invalidates).
 *
 * <h2>Eviction stays LRU</h2>
 * Reads served from the cache are reported to the master in the background (a batched
 * GET_REPLICA_LIST, which also refreshes the entries), so the master's LRU still sees them.
 *
 * <p>Bounded (least recently used entries leave first); thread-safe: one monitor guards the map,
 * the history of applied invalidations and the master's sequence; the lease end and the applied
 * count are volatile so that {@link #confirm} needs no lock when nothing was applied.
 */
final class LocationCache {

    /** Most reads remembered for the next touch report; beyond this they are dropped (LRU is approximate). */
    static final int MAX_PENDING_TOUCHES = 1 << 16;
    /** Applied invalidations kept to check reads in flight against; an older snapshot fails confirmation. */
    static final int MAX_RECENT = 1024;

    /** One applied invalidation, numbered locally. */
    private record Applied(long local, Kind kind, Set<String> keys, byte[] prefix) {
        boolean covers(String key) {
            return switch (kind) {
                case KEYS -> keys.contains(key);
                case PREFIX -> Keys.hasPrefix(key.getBytes(StandardCharsets.UTF_8), prefix);
                case ALL -> true;
            };
        }
    }

    private final int capacity;
    @GuardedBy("this")
    private final LinkedHashMap<String, ReplicaList> map;
    private final Set<String> touched = ConcurrentHashMap.newKeySet();

    @GuardedBy("this")
    private final ArrayDeque<Applied> recent = new ArrayDeque<>();
    /** {@link #recent} holds every invalidation numbered above this. */
    @GuardedBy("this")
    private long floor;
    @GuardedBy("this")
    private long masterIncarnation;
    @GuardedBy("this")
    private long masterSeq;

    /** Invalidations applied so far (local numbering, including whole drops). */
    private volatile long applied;
    /** Whether {@link #validUntil} means anything yet. */
    private volatile boolean leased;
    /** When the lease ends, on {@link System#nanoTime()}'s scale. Written after {@link #applied}. */
    private volatile long validUntil;

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

    // ================================================================== the lease

    /** The count of applied invalidations: take it before looking anything up for a read. */
    long snapshot() {
        return applied;
    }

    /** Whether the lease runs at {@code nowNanos}. */
    boolean leaseValid(long nowNanos) {
        return leased && nowNanos - validUntil < 0;
    }

    /**
     * After copying {@code key} from a remembered location: true if the copy may be served, that is
     * the lease still runs at {@code nowNanos} (taken after the copy) and no invalidation applied
     * since {@code snapshot} covers the key.
     */
    boolean confirm(String key, long snapshot, long nowNanos) {
        if (!leaseValid(nowNanos)) { // the lease end first: a newer one comes with a newer applied count
            return false;
        }
        if (applied == snapshot) {
            return true;
        }
        synchronized (this) {
            return !coveredSince(key, snapshot);
        }
    }

    /** The master incarnation and sequence this client has applied, for the next renewal. */
    synchronized long[] position() {
        return new long[]{masterIncarnation, masterSeq};
    }

    /**
     * Applies a renewal's answer: its invalidations (or a resync) first, then the lease it grants,
     * counted from {@code sentNanos}, when the renewal was sent.
     */
    synchronized void apply(LeaseReply reply, long sentNanos) {
        if (reply.incarnation() != masterIncarnation || reply.resync()) {
            dropAll();
            masterIncarnation = reply.incarnation();
            masterSeq = reply.seq();
        } else {
            for (Invalidation inv : reply.records()) {
                if (inv.seq() <= masterSeq) {
                    continue; // a second answer to the same position (a renewal raced the long poll)
                }
                if (inv.seq() != masterSeq + 1) {
                    dropAll(); // a gap: cannot know what was missed
                } else {
                    applyOne(inv);
                }
                masterSeq = inv.seq();
            }
            masterSeq = Math.max(masterSeq, reply.seq());
        }
        if (reply.leaseMillis() > 0) {
            long until = sentNanos + TimeUnit.MILLISECONDS.toNanos(reply.leaseMillis());
            if (!leased || until - validUntil > 0) {
                validUntil = until;
            }
            leased = true;
        }
    }

    /** The master restarted (seen at HELLO): nothing remembered can be trusted, and the lease is void. */
    synchronized void masterRestarted() {
        leased = false;
        dropAll();
    }

    /** Gives the lease up (the client is closing). */
    synchronized void release() {
        leased = false;
    }

    @GuardedBy("this")
    private Runnable dropAllListener;

    @GuardedBy("this")
    private void applyOne(Invalidation inv) {
        switch (inv.kind()) {
            case KEYS -> {
                Set<String> keys = new HashSet<>(inv.keys().size() * 2);
                for (byte[] k : inv.keys()) {
                    String s = new String(k, StandardCharsets.UTF_8);
                    keys.add(s);
                    map.remove(s);
                }
                record(new Applied(applied + 1, Kind.KEYS, keys, null));
            }
            case PREFIX -> {
                Applied a = new Applied(applied + 1, Kind.PREFIX, null, inv.prefix());
                map.keySet().removeIf(a::covers);
                record(a);
            }
            case ALL -> dropAll();
        }
    }

    /**
     * Runs {@code r} whenever everything remembered is dropped (an ALL invalidation, which every
     * removeAll publishes, a resync, a master restart): the write leases use it to stop placing new
     * puts in leases granted before a reset. {@code r} must not block.
     */
    synchronized void onDropAll(Runnable r) {
        dropAllListener = r;
    }

    @GuardedBy("this")
    private void dropAll() {
        if (dropAllListener != null) {
            dropAllListener.run();
        }
        map.clear();
        touched.clear();
        recent.clear();
        floor = applied + 1;
        applied = floor; // volatile write last: a reader seeing it sees the cleared map
    }

    @GuardedBy("this")
    private void record(Applied a) {
        recent.addLast(a);
        while (recent.size() > MAX_RECENT) {
            floor = recent.removeFirst().local();
        }
        applied = a.local(); // volatile write last
    }

    /** True if an invalidation applied after {@code snapshot} covers {@code key}, or if that cannot be told. */
    @GuardedBy("this")
    private boolean coveredSince(String key, long snapshot) {
        if (snapshot < floor) {
            return true;
        }
        for (Iterator<Applied> it = recent.descendingIterator(); it.hasNext(); ) {
            Applied a = it.next();
            if (a.local() <= snapshot) {
                break;
            }
            if (a.covers(key)) {
                return true;
            }
        }
        return false;
    }

    // ================================================================== locations

    /** The remembered location of {@code key}, or null. Use it only under a lease, and confirm after. */
    synchronized ReplicaList get(String key) {
        return capacity > 0 ? map.get(key) : null;
    }

    /**
     * Remembers where the master said {@code key} is, unless an invalidation applied since
     * {@code snapshot} (taken before the master was asked) covers it.
     */
    synchronized void remember(String key, ReplicaList where, long snapshot) {
        if (capacity > 0 && !coveredSince(key, snapshot)) {
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
