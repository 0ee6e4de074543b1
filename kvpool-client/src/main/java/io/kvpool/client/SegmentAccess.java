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
import java.util.concurrent.atomic.AtomicInteger;

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
 * the same-machine path before any node sees them). So the client counts the master runs it has met
 * ({@link #run}, moved by {@link #clear} when the master changed): a writer reads the count before
 * asking the master, and {@link #resolve(int, int)} answers null once it moved. A table fetched
 * across a change is not kept either (it may be the old master's).
 */
final class SegmentAccess implements AutoCloseable {

    /** Oldest segment table used to pick a local segment for placement. */
    private static final Duration LOCAL_TABLE_AGE = Duration.ofSeconds(10);

    private final ClientConfig config;
    private final MasterChannel master;
    private final SegmentDirectory directory = new SegmentDirectory();
    private final SharedSegments shared;
    private final Map<HostPort, ConnectionPool> nodes = new ConcurrentHashMap<>();
    /** Master runs met so far (see the class comment). */
    private final AtomicInteger run = new AtomicInteger();

    SegmentAccess(ClientConfig config, MasterChannel master) {
        this.config = config;
        this.master = master;
        this.shared = new SharedSegments(config.sharedMemory());
    }

    /**
     * Asks the master for the cluster's state (CLUSTER_STATS) and takes its segment table, unless the
     * master changed during the call (then it asks once more: the answer may be the old master's).
     */
    PoolStats refresh() {
        for (int attempt = 0; ; attempt++) {
            int before = run.get();
            MasterMessages.ClusterStats s = master.call(Opcode.CLUSTER_STATS, new BodyWriter(0),
                    MasterMessages.ClusterStats::read);
            List<PoolStats.SegmentStats> segs = new ArrayList<>(s.segments().size());
            for (MasterMessages.SegmentInfo i : s.segments()) {
                segs.add(new PoolStats.SegmentStats(i.id(), i.name(), i.host(), i.port(), i.capacity(), i.used(),
                        i.objects(), i.state() == MasterMessages.SegmentInfo.STATE_ACTIVE, i.heartbeatAgeMillis(),
                        i.shmPath(), i.tiers().diskCapacity(), i.tiers().diskUsed(), i.tiers().diskObjects()));
            }
            PoolStats stats = new PoolStats(s.epoch(), s.keys(), s.pendingPuts(), s.allocatedBytes(),
                    s.capacityBytes(), s.activeClients(), List.copyOf(segs));
            synchronized (this) {
                if (run.get() == before) {
                    directory.replace(segs);
                    shared.retain(directory.shmPaths());
                    return stats;
                }
            }
            if (attempt > 0) {
                return stats; // the master keeps changing: the caller gets its answer, the table stays empty
            }
        }
    }

    /** The master changed (restarted, or another one leads now): its segment ids are void. */
    synchronized void clear() {
        run.incrementAndGet();
        directory.clear();
    }

    /** How many master changes this client has met: read it before asking the master for regions. */
    int run() {
        return run.get();
    }

    /**
     * {@link #resolve(int)} for an id the master gave while {@link #run} was {@code run}: null once the
     * master changed since (the id may name another node now).
     */
    SegmentDirectory.Entry resolve(int segmentId, int run) {
        SegmentDirectory.Entry e = resolve(segmentId);
        return this.run.get() == run ? e : null;
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
