package io.kvpool.client;

import io.kvpool.config.HostPort;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.Replica;

import java.lang.foreign.MemorySegment;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * How the client reaches segments: its copy of the segment table (refreshed from the master when a
 * reply names a segment it does not know), the shared-memory mappings of segments on this host,
 * and a connection pool per node for the rest.
 */
final class SegmentAccess implements AutoCloseable {

    /** Oldest segment table used to pick a local segment for placement. */
    private static final Duration LOCAL_TABLE_AGE = Duration.ofSeconds(10);

    private final ClientConfig config;
    private final MasterChannel master;
    private final SegmentDirectory directory = new SegmentDirectory();
    private final SharedSegments shared;
    private final Map<HostPort, ConnectionPool> nodes = new ConcurrentHashMap<>();

    SegmentAccess(ClientConfig config, MasterChannel master) {
        this.config = config;
        this.master = master;
        this.shared = new SharedSegments(config.sharedMemory());
    }

    /** Asks the master for the cluster's state (CLUSTER_STATS) and takes its segment table. */
    PoolStats refresh() {
        MasterMessages.ClusterStats s = master.call(Opcode.CLUSTER_STATS, new BodyWriter(0), MasterMessages.ClusterStats::read);
        List<PoolStats.SegmentStats> segs = new ArrayList<>(s.segments().size());
        for (MasterMessages.SegmentInfo i : s.segments()) {
            segs.add(new PoolStats.SegmentStats(i.id(), i.name(), i.host(), i.port(), i.capacity(), i.used(), i.objects(),
                    i.state() == MasterMessages.SegmentInfo.STATE_ACTIVE, i.heartbeatAgeMillis(), i.shmPath(),
                    i.tiers().diskCapacity(), i.tiers().diskUsed(), i.tiers().diskObjects()));
        }
        directory.replace(segs);
        shared.retain(directory.shmPaths());
        return new PoolStats(s.epoch(), s.keys(), s.pendingPuts(), s.allocatedBytes(), s.capacityBytes(),
                s.activeClients(), List.copyOf(segs));
    }

    /** Segment ids are per master run: after a restart the table is void. */
    void clear() {
        directory.clear();
    }

    /** The segment with this id, refreshing the table once if it is unknown; null if still unknown or unreachable. */
    SegmentDirectory.Entry resolve(int segmentId) {
        SegmentDirectory.Entry e = directory.get(segmentId);
        if (e == null) {
            try {
                refresh();
            } catch (KvPoolException ex) {
                return null;
            }
            e = directory.get(segmentId);
        }
        return e;
    }

    /** The segment mapped into this process, or null when it must be reached over TCP. */
    MemorySegment mapping(SegmentDirectory.Entry e) {
        return shared.mapping(e);
    }

    ConnectionPool pool(HostPort node) {
        return nodes.computeIfAbsent(node, a -> new ConnectionPool(a, config.maxConnections(), config.connectTimeout(),
                config.limits(), config.secrets(), null));
    }

    /** The replicas with those on this host first (a same-machine read is cheapest). */
    List<Replica> localFirst(List<Replica> replicas) {
        if (replicas.size() < 2) {
            return replicas;
        }
        List<Replica> out = new ArrayList<>(replicas.size());
        for (Replica r : replicas) {
            SegmentDirectory.Entry e = directory.get(r.segmentId());
            if (e != null && e.local()) {
                out.add(r);
            }
        }
        for (Replica r : replicas) {
            if (!out.contains(r)) {
                out.add(r);
            }
        }
        return out;
    }

    /** Names of active segments on this host, from a segment table at most 10 s old. */
    List<String> localSegmentNames() {
        if (directory.ageNanos() > LOCAL_TABLE_AGE.toNanos()) {
            try {
                refresh();
            } catch (KvPoolException e) {
                return List.of();
            }
        }
        List<String> names = new ArrayList<>();
        for (SegmentDirectory.Entry e : directory.localSegments()) {
            names.add(e.name());
        }
        return names;
    }

    @Override
    public void close() {
        for (ConnectionPool p : nodes.values()) {
            p.close();
        }
        shared.close();
    }
}
