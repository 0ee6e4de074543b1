package io.kvpool.master;

import io.kvpool.protocol.msg.NodeMessages;

import java.util.ArrayList;
import java.util.Collection;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Frees the master could not deliver to a node, kept by segment name until that node's copies can
 * no longer come back.
 *
 * <h2>Why</h2>
 * A removal (or eviction) drops the object from the index at once and tells its nodes with
 * NODE_FREE. A node that is down or cut off at that moment still holds the copy; the index no longer
 * names it, so no reader finds it, but when the node restarts and re-adopts its segment, or comes
 * back after being dropped, it lists the copy in its inventory, and the master would take it back:
 * a removed value readable again (found by {@code kvpool soak}). So undelivered frees are not
 * dropped: they are kept here under the segment's name (its node's {@code host:port}, stable across
 * restarts), re-sent when the channel works again, and the node's next inventory has every copy of
 * a recorded generation refused (ALREADY_EXISTS, and the node drops it). A segment whose record
 * overflowed {@link #MAX_PER_SEGMENT} comes back empty instead: its node lists its inventory and has every
 * item refused, so it drops them all ({@link Segment#comesBackEmpty}; a node only told to skip its inventory
 * kept them, and the next master to rebuild from it took removed objects back). A
 * segment the master dropped for silence (past the node TTL) left the index with its copies, so a
 * removal after that cannot be recorded against it: the generations of its objects that kept copies
 * elsewhere are remembered, and when it comes back such a copy is taken only if its object still
 * lives at that generation. An object whose only copy it held is {@link LostCopies}' concern: taken back
 * only if its key was neither removed nor stored since.
 *
 * <p>Across a change of leader: an elected leader lists the names it owes frees to in etcd (with
 * its node list, every 200 ms), and the next leader makes those segments come back empty
 * ({@link #forceEmpty}) before it accepts a registration. A single master that restarts forgets the
 * record (it lives in memory), so a copy on a node that was unreachable across both a removal and
 * that restart can come back. Thread-safe.
 */
final class UndeliveredFrees {

    /** Most frees remembered for one segment; past it the segment must come back empty. */
    static final int MAX_PER_SEGMENT = 1 << 20;

    private final Map<String, Map<Long, NodeMessages.FreeItem>> bySegment = new ConcurrentHashMap<>();
    private final Set<String> overflowed = ConcurrentHashMap.newKeySet();
    /** For segments dropped for silence: generations of their objects that kept copies elsewhere. */
    private final Map<String, Set<Long>> elsewhere = new ConcurrentHashMap<>();

    /** Remembers frees that did not reach the node of segment {@code name}. */
    void record(String name, List<NodeMessages.FreeItem> items) {
        if (items.isEmpty()) {
            return;
        }
        Map<Long, NodeMessages.FreeItem> m = bySegment.computeIfAbsent(name, n -> new LinkedHashMap<>());
        synchronized (m) {
            for (NodeMessages.FreeItem it : items) {
                if (m.size() >= MAX_PER_SEGMENT) {
                    overflowed.add(name);
                    return;
                }
                m.put(it.generation(), it);
            }
        }
    }

    /** Takes what is recorded for {@code name}, to send again (the channel works). */
    List<NodeMessages.FreeItem> drain(String name) {
        Map<Long, NodeMessages.FreeItem> m = bySegment.get(name);
        if (m == null) {
            return List.of();
        }
        synchronized (m) {
            List<NodeMessages.FreeItem> out = new ArrayList<>(m.values());
            m.clear();
            return out;
        }
    }

    /** Whether a free of {@code generation} on segment {@code name} was not delivered. */
    boolean covers(String name, long generation) {
        Map<Long, NodeMessages.FreeItem> m = bySegment.get(name);
        if (m == null) {
            return false;
        }
        synchronized (m) {
            return m.containsKey(generation);
        }
    }

    /** Whether so many frees were lost that segment {@code name} must come back empty. */
    boolean overflowed(String name) {
        return overflowed.contains(name);
    }

    /** Segment {@code name} was dropped for silence; {@code generations} kept copies elsewhere. */
    void silenced(String name, Collection<Long> generations) {
        if (generations.size() > MAX_PER_SEGMENT) {
            overflowed.add(name);
            return;
        }
        Set<Long> s = elsewhere.computeIfAbsent(name, n -> ConcurrentHashMap.newKeySet());
        s.addAll(generations);
    }

    /** Whether {@code generation} kept copies elsewhere when segment {@code name} was dropped for silence. */
    boolean copiedElsewhere(String name, long generation) {
        Set<Long> s = elsewhere.get(name);
        return s != null && s.contains(generation);
    }

    /** Segments a previous leader owed frees to: they come back empty, whatever they missed. */
    void forceEmpty(Collection<String> names) {
        overflowed.addAll(names);
    }

    /** The names of the segments something is owed to (for the next leader). */
    Set<String> owed() {
        Set<String> out = new HashSet<>(overflowed);
        out.addAll(elsewhere.keySet());
        for (Map.Entry<String, Map<Long, NodeMessages.FreeItem>> e : bySegment.entrySet()) {
            synchronized (e.getValue()) {
                if (!e.getValue().isEmpty()) {
                    out.add(e.getKey());
                }
            }
        }
        return out;
    }

    /** The node of {@code name} listed its whole inventory (or came back empty): nothing is owed to it any more. */
    void settled(String name) {
        bySegment.remove(name);
        overflowed.remove(name);
        elsewhere.remove(name);
    }

    /** Frees recorded, over all segments (a gauge). */
    long size() {
        long n = 0;
        for (Map<Long, NodeMessages.FreeItem> m : bySegment.values()) {
            synchronized (m) {
                n += m.size();
            }
        }
        return n;
    }
}
