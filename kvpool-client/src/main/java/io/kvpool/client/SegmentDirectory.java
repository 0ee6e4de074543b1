package io.kvpool.client;

import io.kvpool.config.HostPort;
import io.kvpool.config.LocalHost;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * The client's copy of the segment table (id to name and address), refreshed from the master when
 * a reply names a segment it does not know, and cleared when the master restarts (segment ids are
 * per master incarnation). The table is tagged with the master run it came from, and never goes
 * back to an older run's. Also answers which segments live on this host.
 */
final class SegmentDirectory {

    record Entry(int id, String name, HostPort address, boolean local, boolean active, long capacity, long freeBytes,
                 String shmPath) {
    }

    /** One master's segment table: {@code run} is the master run it came from (MasterChannel). */
    private record Table(int run, Map<Integer, Entry> byId, long refreshedAtNanos) {
    }

    private final Set<String> localAddresses = LocalHost.addresses();
    private volatile Table table = new Table(-1, Map.of(), 0);

    /** The segment with this id in the table held now, whatever master run it came from. */
    Entry get(int id) {
        return table.byId.get(id);
    }

    /** The segment with this id in master run {@code run}'s table; null if the table held is another run's. */
    Entry get(int id, int run) {
        Table t = table;
        return t.run == run ? t.byId.get(id) : null;
    }

    long ageNanos() {
        long at = table.refreshedAtNanos;
        return at == 0 ? Long.MAX_VALUE : System.nanoTime() - at;
    }

    /** Takes the table master run {@code run} answered with, unless one of a later run is held already. */
    synchronized void replace(List<PoolStats.SegmentStats> segments, int run) {
        if (run < table.run) {
            return;
        }
        Map<Integer, Entry> m = new HashMap<>();
        for (PoolStats.SegmentStats s : segments) {
            m.put(s.id(), new Entry(s.id(), s.name(), new HostPort(s.host(), s.port()),
                    LocalHost.isLocal(s.host(), localAddresses), s.active(), s.capacityBytes(),
                    s.capacityBytes() - s.usedBytes(), s.shmPath()));
        }
        table = new Table(run, Map.copyOf(m), System.nanoTime());
    }

    /** The shared-memory files of the segments in the table (those that advertise one). */
    Set<String> shmPaths() {
        Set<String> out = new java.util.HashSet<>();
        for (Entry e : table.byId.values()) {
            if (!e.shmPath().isEmpty()) {
                out.add(e.shmPath());
            }
        }
        return out;
    }

    /** Master run {@code run} began: the table held is void (its ids may name other nodes now). */
    synchronized void clear(int run) {
        if (run >= table.run) {
            table = new Table(run, Map.of(), 0);
        }
    }

    /** Active segments on this host, by id. */
    List<Entry> localSegments() {
        List<Entry> out = new ArrayList<>();
        for (Entry e : table.byId.values()) {
            if (e.local && e.active) {
                out.add(e);
            }
        }
        out.sort((a, b) -> Integer.compare(a.id, b.id));
        return out;
    }
}
