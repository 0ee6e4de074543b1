package io.kvpool.client;

import io.kvpool.config.HostPort;
import io.kvpool.config.LocalHost;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The client's copy of the segment table (id to name and address), refreshed from the master when
 * a reply names a segment it does not know, and cleared when the master restarts (segment ids are
 * per master incarnation). Also answers which segments live on this host.
 */
final class SegmentDirectory {

    record Entry(int id, String name, HostPort address, boolean local, boolean active, long capacity, long freeBytes,
                 String shmPath) {
    }

    private final Set<String> localAddresses = LocalHost.addresses();
    private volatile Map<Integer, Entry> byId = Map.of();
    private volatile long refreshedAtNanos;

    Entry get(int id) {
        return byId.get(id);
    }

    long ageNanos() {
        return refreshedAtNanos == 0 ? Long.MAX_VALUE : System.nanoTime() - refreshedAtNanos;
    }

    void replace(List<PoolStats.SegmentStats> segments) {
        Map<Integer, Entry> m = new ConcurrentHashMap<>();
        for (PoolStats.SegmentStats s : segments) {
            m.put(s.id(), new Entry(s.id(), s.name(), new HostPort(s.host(), s.port()),
                    LocalHost.isLocal(s.host(), localAddresses), s.active(), s.capacityBytes(),
                    s.capacityBytes() - s.usedBytes(), s.shmPath()));
        }
        byId = m;
        refreshedAtNanos = System.nanoTime();
    }

    /** The shared-memory files of the segments in the table (those that advertise one). */
    Set<String> shmPaths() {
        Set<String> out = new java.util.HashSet<>();
        for (Entry e : byId.values()) {
            if (!e.shmPath().isEmpty()) {
                out.add(e.shmPath());
            }
        }
        return out;
    }

    void clear() {
        byId = Map.of();
        refreshedAtNanos = 0;
    }

    /** Active segments on this host, by id. */
    List<Entry> localSegments() {
        List<Entry> out = new ArrayList<>();
        for (Entry e : byId.values()) {
            if (e.local && e.active) {
                out.add(e);
            }
        }
        out.sort((a, b) -> Integer.compare(a.id, b.id));
        return out;
    }
}
