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
 *
 * <h2>Master runs</h2>
 * Segment ids are per master run: a new master (a restart, a failover between elected masters)
 * numbers the segments in the order their nodes register again, so id 2 of the old run may be
 * another node's id 3 now. A master's answer naming segments (a write lease, a PUT_START's regions)
 * may still be in a thread's hands when this client meets the new master; resolved in the new table,
 * it would send the old master's offsets to another node, where the bytes land on live objects (on
 * the same-machine path before any node sees them). So every such answer carries the master run of
 * the connection that brought it ({@link MasterChannel#callInRun}), the segment table carries the run
 * it came from, and {@link #resolve(int, int)} answers null unless both are the run met last.
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

    /**
     * Asks the master for the cluster's state (CLUSTER_STATS) and takes its segment table, unless a
     * newer master answered meanwhile (then it asks once more: the answer was the old master's).
     */
    PoolStats refresh() {
        for (int attempt = 0; ; attempt++) {
            MasterChannel.Answer<MasterMessages.ClusterStats> a = master.callInRun(Opcode.CLUSTER_STATS,
                    new BodyWriter(0), MasterMessages.ClusterStats::read);
            MasterMessages.ClusterStats s = a.value();
            List<PoolStats.SegmentStats> segs = new ArrayList<>(s.segments().size());
            for (MasterMessages.SegmentInfo i : s.segments()) {
                segs.add(new PoolStats.SegmentStats(i.id(), i.name(), i.host(), i.port(), i.capacity(), i.used(),
                        i.objects(), i.state() == MasterMessages.SegmentInfo.STATE_ACTIVE, i.heartbeatAgeMillis(),
                        i.shmPath(), i.tiers().diskCapacity(), i.tiers().diskUsed(), i.tiers().diskObjects(),
                        i.state() == MasterMessages.SegmentInfo.STATE_DRAINING));
            }
            PoolStats stats = new PoolStats(s.epoch(), s.keys(), s.pendingPuts(), s.allocatedBytes(),
                    s.capacityBytes(), s.activeClients(), List.copyOf(segs));
            if (a.run() == master.run()) {
                directory.replace(segs, a.run());
                shared.retain(directory.shmPaths());
                return stats;
            }
            if (attempt > 0) {
                return stats; // the master keeps changing: the caller gets its answer, the table stays as it was
            }
        }
    }

    /** The master changed (restarted, or another one leads now): its segment ids are void. */
    void clear() {
        directory.clear(master.run());
    }

    /** How many master changes this client has met ({@link MasterChannel#run}). */
    int run() {
        return master.run();
    }

    /**
     * The segment with this id in master run {@code run}'s table (refreshed once if it is not there):
     * null once the master changed since (the id may name another node now), or if still unknown.
     */
    SegmentDirectory.Entry resolve(int segmentId, int run) {
        if (run != master.run()) {
            return null;
        }
        SegmentDirectory.Entry e = directory.get(segmentId, run);
        if (e == null) {
            try {
                refresh();
            } catch (KvPoolException ex) {
                return null;
            }
            e = directory.get(segmentId, run);
        }
        return e;
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
                config.limits(), config.secrets(), config.busyPoll(), null));
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
