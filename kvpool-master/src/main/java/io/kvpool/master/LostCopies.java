package io.kvpool.master;

import java.util.Arrays;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Objects whose only copy was on a segment the master dropped, and which of them that segment's node
 * may still bring back.
 *
 * <h2>Why</h2>
 * A dropped segment's objects leave the index ({@link Membership}); one that had no other copy is a
 * miss from then on. Its node may come back (restarted on its segment file, or reachable again) and
 * list that copy in its inventory, and taking it back recovers the object. That is right only if nothing
 * happened to the key meanwhile:
 * <ul>
 *   <li>a removal of the key answered NOT_FOUND (the index no longer had it), and after a removal
 *       returns no reader may get the removed value;</li>
 *   <li>a put that stored another version must not be undone by the old one once that version is
 *       removed or evicted in its turn.</li>
 * </ul>
 * Found by the soak: a key removed while its only copy sat on a killed node read again, old value and
 * all, once the node was back. So each object lost with a segment is kept here by key, with the
 * segment's name and the generation lost. A removal of the key (by key, by prefix, remove_all, a reset)
 * or a store of any version of it revokes it, and the returning node's inventory has a lost generation
 * taken only while it is still here ({@link #revoked}). A key lost twice (on two segments, two
 * generations) keeps only the later: the older was already superseded by the put that made the later.
 *
 * <h2>Bounds and leaders</h2>
 * Past {@link #MAX_PER_SEGMENT} objects lost with one segment, the rest are not remembered and that
 * segment must come back empty ({@link #overflowed}), as with frees it missed ({@link UndeliveredFrees}).
 * A segment's record goes when its node's inventory has been taken ({@link #settled}). The record lives
 * in this master's memory only: an elected leader lists the names it holds with the ones it owes frees
 * to, and the next leader makes those segments come back empty.
 *
 * <p>Thread-safety: {@link #lost} and {@link #settled} run under the epoch write lock, revocations under
 * the epoch read lock and a shard's lock (several shards at once), lookups under either. The maps are
 * concurrent; {@link #any} changes only under the write lock, so a revocation never misses an entry
 * made before it. With nothing lost a hook costs one volatile read.
 */
final class LostCopies {

    /** Most objects remembered for one segment; past it the segment must come back empty. */
    static final int MAX_PER_SEGMENT = UndeliveredFrees.MAX_PER_SEGMENT;

    /** The copy a key may still take back. */
    private record Copy(String segment, long generation) {
    }

    /** Per segment name: every generation lost with it, revoked or not (an entry there and not here is refused). */
    private final Map<String, Set<Long>> lostOn = new ConcurrentHashMap<>();
    /** The lost copies still to be taken back, by key. */
    private final Map<Key, Copy> takeable = new ConcurrentHashMap<>();
    /** Segments that lost more than {@link #MAX_PER_SEGMENT}. */
    private final Set<String> overflowed = ConcurrentHashMap.newKeySet();
    /** Whether anything may be takeable (the hooks' fast path); changed under the epoch write lock only. */
    private volatile boolean any;

    /** The only copy of {@code key} at {@code generation} was on dropped segment {@code segment}. */
    void lost(String segment, byte[] key, int hash, long generation) {
        if (overflowed.contains(segment)) {
            return;
        }
        Set<Long> gens = lostOn.computeIfAbsent(segment, s -> new HashSet<>());
        if (gens.size() >= MAX_PER_SEGMENT) {
            overflowed.add(segment);
            return;
        }
        gens.add(generation);
        takeable.put(new Key(key, hash), new Copy(segment, generation));
        any = true;
    }

    /**
     * Whether segment {@code segment}'s copy of {@code key} at {@code generation} was lost with it and
     * revoked since (the key was removed, or another version stored): its node must drop it.
     */
    boolean revoked(String segment, byte[] key, int hash, long generation) {
        Set<Long> gens = lostOn.get(segment);
        if (gens == null || !gens.contains(generation)) {
            return false;
        }
        return !new Copy(segment, generation).equals(takeable.get(new Key(key, hash)));
    }

    /** Whether so many objects were lost with {@code segment} that it must come back empty. */
    boolean overflowed(String segment) {
        return overflowed.contains(segment);
    }

    /** Whether any lost copy may come back (the hooks test this before copying a key). */
    boolean any() {
        return any;
    }

    /** The key was removed, or a version of it stored: no lost copy of it may come back. */
    void revoke(byte[] key, int hash) {
        if (any) {
            takeable.remove(new Key(key, hash));
        }
    }

    /** Every key starting with {@code prefix} was removed (an empty prefix: all of them). */
    void revokePrefix(byte[] prefix) {
        if (!any) {
            return;
        }
        if (prefix.length == 0) {
            takeable.clear();
            return;
        }
        takeable.keySet().removeIf(k -> k.bytes.length >= prefix.length
                && Arrays.equals(k.bytes, 0, prefix.length, prefix, 0, prefix.length));
    }

    /** The node of {@code segment} listed its whole inventory: what it did not list is lost for good. */
    void settled(String segment) {
        if (lostOn.remove(segment) != null) {
            takeable.values().removeIf(c -> c.segment.equals(segment));
        }
        overflowed.remove(segment);
        any = !takeable.isEmpty();
    }

    /** Names of the segments whose lost copies are remembered (the next leader makes them come back empty). */
    Set<String> segments() {
        Set<String> out = new HashSet<>(lostOn.keySet());
        out.addAll(overflowed);
        return out;
    }

    /** Lost copies that may still come back (a gauge). */
    long size() {
        return takeable.size();
    }
}
