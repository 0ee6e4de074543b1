package io.kvpool.node;

import io.kvpool.config.Size;
import io.kvpool.node.disk.DiskStore;
import io.kvpool.protocol.FrameServer;
import io.kvpool.web.History;
import io.kvpool.web.StatusView;
import io.kvpool.web.Unit;

import java.util.Locale;

/**
 * What a node's status page shows ({@code http://NODE:9004/}, or {@code /node/} on the master's port
 * in {@code kvpool serve}): its segment and the master it serves, each tier's size and traffic, the
 * SSD tier's spill queue, what its port refused, and charts of the last minutes. Read when asked.
 *
 * <p>Card ids (the page's contract with tests): {@code segment}, {@code master}, {@code objects},
 * {@code capacity}, {@code used}, {@code read_per_s}, {@code written_per_s}, {@code disk_used},
 * {@code disk_queue}, {@code refused}; tables {@code tiers} and {@code refusals}.
 */
final class NodeStatus {

    private final FrameServer server;
    private final LocalSegment local;
    private final MasterLink link;
    private final DiskTier disk;
    private final long startMillis = System.currentTimeMillis();
    final History history;

    NodeStatus(FrameServer server, LocalSegment local, MasterLink link, DiskTier disk) {
        this.server = server;
        this.local = local;
        this.link = link;
        this.disk = disk;
        History.Builder b = History.builder()
                .chart("traffic", "Memory traffic", Unit.BYTES_PER_SECOND)
                .rate("read", "served", local::bytesRead)
                .rate("written", "written", local::bytesWritten)
                .chart("objects", "Objects in memory", Unit.COUNT)
                .gauge("objects", "objects", () -> local.ledger().objectCount());
        if (disk != null) {
            b.chart("disk_traffic", "SSD traffic", Unit.BYTES_PER_SECOND)
                    .rate("spilled", "spilled", () -> disk.store().stats().bytesWritten())
                    .rate("disk_read", "read", () -> disk.store().stats().bytesRead())
                    .chart("disk_queue", "Spill queue", Unit.BYTES)
                    .gauge("disk_queue", "queued", () -> disk.store().stats().queueDepthBytes());
        }
        this.history = b.build();
    }

    StatusView view() {
        long cap = local.capacity();
        long used = local.ledger().objectBytes();
        long hb = link.lastHeartbeatMillis();
        String linkState = link.isRegistered() ? "registered as segment " + local.segmentId() : "not registered";
        StatusView v = new StatusView("node", "kvpool node " + local.name(), System.currentTimeMillis())
                .subtitle("master " + link.masterName() + " · " + linkState + " · "
                        + StatusView.upSince(startMillis));
        // the name is the page's title; the card says which segment the master knows it as, and where it lives
        v.card("segment", "Segment", local.segmentId() < 0 ? "not registered" : "#" + local.segmentId(),
                local.shmPath().isEmpty() ? "anonymous memory" : local.shmPath());
        v.card("master", "Master", link.isRegistered() ? "connected" : "not connected",
                hb == 0 ? "no heartbeat answered yet" : "last heartbeat answered "
                        + String.format(Locale.ROOT, "%.1f s ago", (System.currentTimeMillis() - hb) / 1000.0)
                        + " (one in " + MasterLink.HEARTBEAT_EVERY + " is answered; beacons between)");
        v.card("objects", "Objects in memory", local.ledger().objectCount(), Unit.COUNT);
        v.card("capacity", "Memory capacity", cap, Unit.BYTES);
        v.card("used", "Memory used", used, Unit.BYTES, cap == 0 ? null : String.format(Locale.ROOT,
                "%.1f%% of the segment in objects", 100.0 * used / cap));
        v.card("read_per_s", "Served", history.latest("read"), Unit.BYTES_PER_SECOND, "over TCP; same-machine reads"
                + " map the segment and are not counted");
        v.card("written_per_s", "Written", history.latest("written"), Unit.BYTES_PER_SECOND);
        v.card("epoch", "Epoch", local.ledger().epoch(), Unit.COUNT, "term " + local.term());
        DiskStore.Stats d = disk == null ? null : disk.store().stats();
        if (d != null) {
            v.card("disk_used", "SSD used", d.usedBytes(), Unit.BYTES, "of " + Size.human(d.capacityBytes()) + ", "
                    + d.objects() + " objects");
            v.card("disk_queue", "Spill queue", d.queueDepthBytes(), Unit.BYTES, d.queuedItems() + " records waiting;"
                    + (d.writerRunning() ? " writer running" : " WRITER STOPPED: spills are refused"));
        }
        long refused = server.refusedConnections() + server.timedOutFrames() + server.refusedAuth()
                + server.tlsHandshakeFailures() + server.refusedBodies() + local.refusedWrites();
        v.card("refused", "Refused", refused, Unit.COUNT, server.connectionCount() + " connections open");

        StatusView.Table t = v.table("tiers", "Tiers").column("tier", "Tier", Unit.TEXT)
                .column("capacity", "Capacity", Unit.BYTES).column("used", "Used", Unit.BYTES)
                .column("objects", "Objects", Unit.COUNT).column("hits", "Objects served", Unit.COUNT)
                .column("read", "Bytes served", Unit.BYTES).column("written", "Bytes written", Unit.BYTES);
        t.row("memory", cap, used, local.ledger().objectCount(), local.memoryReads(), local.bytesRead(),
                local.bytesWritten());
        if (d != null) {
            t.row("disk", d.capacityBytes(), d.usedBytes(), d.objects(), d.hits(), d.bytesRead(), d.bytesWritten());
            StatusView.Table dt = v.table("disk", "SSD tier").column("what", "", Unit.TEXT)
                    .column("count", "Count", Unit.COUNT);
            dt.row("spills dropped (queue full, no room, I/O error)", d.drops());
            dt.row("write errors", d.writeErrors());
            dt.row("evictions", d.evictions());
            dt.row("compactions", d.compactions());
            dt.row("checksum failures (served as misses)", d.checksumFailures());
        }
        StatusView.Table r = v.table("refusals", "Refused at the port").column("what", "", Unit.TEXT)
                .column("count", "Count", Unit.COUNT);
        r.row("connections over the limits", server.refusedConnections());
        r.row("frames that did not arrive in time", server.timedOutFrames());
        r.row("failed authentication", server.refusedAuth());
        r.row("failed TLS handshakes", server.tlsHandshakeFailures());
        r.row("bodies over the body budget", server.refusedBodies());
        r.row("writes without a write grant", local.refusedGrants());
        r.row("writes refused (all reasons)", local.refusedWrites());
        r.row("administration not from its master", local.refusedAdmin());
        v.link("metrics", "/metrics");
        return v;
    }
}
