package io.kvpool.node;

import io.kvpool.protocol.FrameServer;
import io.kvpool.node.disk.DiskStore;
import io.prometheus.metrics.core.metrics.CounterWithCallback;
import io.prometheus.metrics.core.metrics.GaugeWithCallback;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import io.kvpool.web.Series;

import java.util.function.Function;

/**
 * The series only a node can export, on its own {@code /metrics} ({@code kvpool node --http-port},
 * 9004) or, for the node inside {@code kvpool serve}, on the master's: what its port refused
 * (connection limits, stalled frames, failed authentication or TLS, writes without a grant), whether
 * it is connected to the master, and its SSD tier's writer. Its segment's and tiers' sizes and
 * traffic are not here: the master exports them once for every node, from the heartbeats.
 */
final class NodeMetrics {

    private NodeMetrics() {
    }

    static void register(FrameServer server, LocalSegment local, MasterLink link, DiskTier disk,
                         ForwardedCommits commits, PrometheusRegistry registry) {
        Series.gauge(registry, "node_connections_open", "Connections open to the node's port", server::connectionCount);
        Series.counter(registry, "node_connections_refused_total", "Connections refused at the connection limits (in all,"
                + " per host)", server::refusedConnections);
        Series.counter(registry, "node_busy_polls_total", "Waits for a connection's next frame that polled the socket and"
                + " found it (kvpool.busyPoll)", server::busyPollHits);
        Series.counter(registry, "node_busy_polls_missed_total", "Waits for a connection's next frame that polled the"
                + " socket for the whole budget, then blocked", server::busyPollMisses);
        Series.counter(registry, "node_busy_polls_yielded_total", "Waits for a connection's next frame whose poll stopped"
                + " early because the CPU was busy (a yield ran another thread)", server::busyPollsYielded);
        Series.counter(registry, "node_busy_poll_seconds_total", "Time the node's connection threads spent polling for"
                + " frames: about the CPU that polling costs", () -> server.busyPollNanos() / 1e9);
        Series.counter(registry, "node_frames_timed_out_total", "Connections closed because a frame did not arrive within"
                + " the frame timeout", server::timedOutFrames);
        Series.counter(registry, "node_auth_refused_total", "Connections closed because their authentication failed or a"
                + " request needed a secret they had not proven", server::refusedAuth);
        Series.counter(registry, "node_tls_handshake_failures_total", "Connections refused for TLS: a failed or timed-out"
                + " handshake, a plain-TCP client of a TLS node or the reverse", server::tlsHandshakeFailures);
        Series.counter(registry, "node_large_bodies_refused_total", "Frames refused because their body could not reserve"
                + " its size from the process's body budget within half the frame timeout, or was larger than the whole"
                + " budget (the name predates the budget covering every body)", server::refusedBodies);
        Series.gauge(registry, "node_body_reservations_waiting", "Frame bodies waiting now, in the order they asked, for"
                + " their reservation from the process's body budget (shared with any other server in the process)",
                server::bodiesWaiting);
        Series.gauge(registry, "node_body_bytes_buffered", "Bytes of the process's body budget taken now by frame bodies"
                + " being received or handled (shared with any other server in the process)", server::bodyBytesBuffered);
        Series.gauge(registry, "node_body_budget_bytes", "The process's body budget: an eighth of the heap, within 64 MiB"
                + " and 1 GiB", server::bodyBudgetBytes);
        Series.counter(registry, "node_write_grants_refused_total", "Writes refused because a connection without the admin"
                + " secret held no write grant of the master covering them", local::refusedGrants);
        Series.counter(registry, "node_writes_refused_total", "Writes refused for any reason: no grant, an older master"
                + " term, a fenced epoch, a checksum mismatch", local::refusedWrites);
        Series.counter(registry, "node_admin_refused_total", "Frees, resets and copies refused because they did not come"
                + " from the master the node registered with (no control token of that registration) or came from a"
                + " master of an older term", local::refusedAdmin);
        Series.counter(registry, "node_ranged_reads_total", "Items of NODE_READ_RANGE frames answered (hits and misses):"
                + " ranges of objects read, as a layer-by-layer load reads one layer of a block", local::rangedReads);
        Series.counter(registry, "node_parts_written_total", "Items of NODE_PART_WRITE frames received: parts of values"
                + " written over TCP, as a layer-by-layer save writes one layer of a block", local::partsWritten);
        Series.counter(registry, "node_part_bytes_written_total", "Bytes of NODE_PART_WRITE parts stored (refused parts"
                + " not counted)", local::partBytes);
        Series.counter(registry, "node_part_objects_total", "Objects written in parts (NODE_PART_BEGIN to NODE_PART_END)"
                + " that became readable, over TCP and the same-machine path", local::partObjects);
        Series.counter(registry, "node_stamped_objects_total", "Objects a same-machine writer stamped in its lease range and"
                + " told only the master of, which the node settled from their headers when something first asked for"
                + " them (protocol version 16)", () -> local.ledger().stampedObjects());
        Series.counter(registry, "node_forwarded_commits_total", "Objects written over TCP with NODE_WRITE_COMMIT that"
                + " the node committed at its master for the writer (protocol version 17)", commits.forwarded::get);
        Series.counter(registry, "node_commits_left_to_writers_total", "NODE_WRITE_COMMIT frames whose COMMIT the node"
                + " left to the writer: not registered, another segment or term, or the master unreachable",
                commits.leftToWriter::get);
        Series.gauge(registry, "node_master_connected", "1 while the node is registered with the master and its heartbeats"
                + " are answered, else 0", () -> link.isRegistered() ? 1 : 0);
        Series.gauge(registry, "node_taking_writes", "1 while the node admits writes; 0 before its registration is done,"
                + " while a registration lists its objects, and once it drains for a restart (writes are then answered"
                + " NO_SEGMENT)", () -> local.gate().state() == WriteGate.State.OPEN ? 1 : 0);
        if (disk != null) {
            diskGauge(registry, local.name(), disk, "node_disk_writer_up", "1 while the SSD tier's writer runs; 0 once an error"
                    + " stopped it (spills are refused, reads go on) or the node is closing", s -> s.writerRunning() ? 1.0 : 0.0);
            diskCounter(registry, local.name(), disk, "node_disk_write_errors_total", "SSD tier write batches that failed with an"
                    + " I/O error (their records are dropped and counted as drops)", s -> (double) s.writeErrors());
        }
    }

    private static void diskGauge(PrometheusRegistry r, String segment, DiskTier disk, String name, String help,
                                  Function<DiskStore.Stats, Double> v) {
        GaugeWithCallback.builder().name(name).help(help).labelNames("segment")
                .callback(cb -> cb.call(v.apply(disk.store().stats()), segment)).register(r);
    }

    private static void diskCounter(PrometheusRegistry r, String segment, DiskTier disk, String name, String help,
                                    Function<DiskStore.Stats, Double> v) {
        CounterWithCallback.builder().name(name).help(help).labelNames("segment")
                .callback(cb -> cb.call(v.apply(disk.store().stats()), segment)).register(r);
    }
}
