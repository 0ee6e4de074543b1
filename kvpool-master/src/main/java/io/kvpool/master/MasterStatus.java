package io.kvpool.master;

import io.kvpool.config.Size;
import io.kvpool.protocol.msg.MasterMessages.SegmentInfo;
import io.kvpool.web.History;
import io.kvpool.web.StatusView;
import io.kvpool.web.Unit;

import java.time.InstantSource;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.function.BooleanSupplier;
import java.util.function.ToLongFunction;

/**
 * What the master's status page shows ({@code http://MASTER:9003/}): the pool's totals as cards,
 * the segments with their tiers and health, the recent resets, and charts of the last ten minutes
 * (requests, memory and SSD use, evictions, disk traffic). Everything is read from the
 * {@link MasterService} and {@link MasterMetrics} when asked: the page costs nothing while nobody
 * looks, but for the history's one sample a second.
 *
 * <p>Card ids are part of the page's contract with its tests (StatusPageIT): {@code objects},
 * {@code segments}, {@code capacity}, {@code used}, {@code puts_per_s}, {@code gets_per_s},
 * {@code hit_rate}, {@code evicted_per_s}, {@code epoch}, {@code leadership}; table {@code segments}
 * with columns {@code name, state, capacity, used, objects, disk_used, ...}; table {@code resets}.
 */
final class MasterStatus {

    /** A segment whose last heartbeat is older than this is shown as late. */
    private static final long LATE_MILLIS = 3_000;

    private final MasterService service;
    private final MasterMetrics metrics;
    private final MasterConfig config;
    private final BooleanSupplier leading;
    private final InstantSource clock;
    private final long startMillis;
    private final List<String[]> links = new CopyOnWriteArrayList<>();
    final History history;

    MasterStatus(MasterService service, MasterMetrics metrics, MasterConfig config, BooleanSupplier leading,
                 InstantSource clock) {
        this.service = service;
        this.metrics = metrics;
        this.config = config;
        this.leading = leading;
        this.clock = clock;
        this.startMillis = clock.millis();
        this.history = History.builder()
                .chart("requests", "Objects per second", Unit.PER_SECOND)
                .rate("puts", "puts", metrics::putsAdmitted)
                .rate("gets", "lookups", metrics::lookups)
                .rate("misses", "misses", metrics::lookupMisses)
                .rate("evicted", "evicted", () -> service.eviction().evictedKeys.get())
                .chart("memory", "Memory tier", Unit.BYTES)
                .gauge("memory_used", "used", service::allocated)
                .gauge("memory_capacity", "capacity", service::capacity)
                .chart("disk", "SSD tier", Unit.BYTES)
                .gauge("disk_used", "used", () -> sum(s -> s.tiers().diskUsed()))
                .gauge("disk_capacity", "capacity", () -> sum(s -> s.tiers().diskCapacity()))
                .chart("disk_traffic", "SSD traffic", Unit.BYTES_PER_SECOND)
                .rate("spilled", "spilled", () -> sum(s -> s.tiers().diskWrittenBytes()))
                .rate("disk_read", "read", () -> sum(s -> s.tiers().diskReadBytes()))
                .chart("objects", "Objects", Unit.COUNT)
                .gauge("objects", "objects", service::keyCount)
                .build();
    }

    private long sum(ToLongFunction<SegmentInfo> f) {
        long n = 0;
        for (SegmentInfo s : service.segmentInfos()) {
            n += f.applyAsLong(s);
        }
        return n;
    }

    /** A link in the page's header, e.g. to the embedded node's page. */
    void link(String label, String href) {
        links.add(new String[] {label, href});
    }

    StatusView view(String address) {
        List<SegmentInfo> segs = service.segmentInfos();
        long cap = service.capacity();
        long used = service.allocated();
        long active = segs.stream().filter(s -> s.state() == SegmentInfo.STATE_ACTIVE).count();
        long draining = segs.stream().filter(s -> s.state() == SegmentInfo.STATE_DRAINING).count();
        String leadership = config.term() == 0 ? "single master"
                : (leading.getAsBoolean() ? "leader" : "not leading") + ", term " + config.term();
        StatusView v = new StatusView("master", "kvpool master", clock.millis())
                .subtitle(address + " · " + leadership + " · " + StatusView.upSince(startMillis));
        v.card("objects", "Objects", service.keyCount(), Unit.COUNT);
        v.card("segments", "Segments", segs.size(), Unit.COUNT,
                segs.size() == active ? "all active" : active + " active, " + (segs.size() - active - draining)
                        + " joining" + (draining > 0 ? ", " + draining + " draining" : ""));
        v.card("capacity", "Memory capacity", cap, Unit.BYTES);
        v.card("used", "Memory used", used, Unit.BYTES, cap == 0 ? "no segment" : String.format(Locale.ROOT,
                "%.1f%% of capacity; evicts at %d%%", 100.0 * used / cap, Math.round(config.highWatermark() * 100)));
        long diskCap = sum(s -> s.tiers().diskCapacity());
        if (diskCap > 0) {
            v.card("disk_used", "SSD used", sum(s -> s.tiers().diskUsed()), Unit.BYTES, "of " + Size.human(diskCap));
        }
        v.card("puts_per_s", "Puts", history.latest("puts"), Unit.PER_SECOND);
        v.card("gets_per_s", "Lookups", history.latest("gets"), Unit.PER_SECOND);
        long lookups = metrics.lookups();
        v.card("hit_rate", "Hit rate", lookups == 0 ? Double.NaN : 1.0 - (double) metrics.lookupMisses() / lookups,
                Unit.RATIO, lookups + " lookups since start");
        v.card("evicted_per_s", "Evictions", history.latest("evicted"), Unit.PER_SECOND,
                service.eviction().evictedKeys.get() + " objects since start");
        v.card("clients", "Clients", service.activeClients(), Unit.COUNT);
        v.card("epoch", "Cluster epoch", service.epoch(), Unit.COUNT, "moves on removeAll(force)");
        v.card("leadership", "Leadership", leadership, config.term() == 0 ? null : "elected through etcd");
        long pinned = service.pinnedBytes();
        if (pinned > 0) {
            v.card("pinned", "Pinned", pinned, Unit.BYTES);
        }
        StatusView.Table t = v.table("segments", "Segments").empty("no node has registered yet")
                .column("name", "Segment", Unit.TEXT).column("state", "State", Unit.TEXT)
                .column("capacity", "Capacity", Unit.BYTES).column("used", "Used", Unit.BYTES)
                .column("used_ratio", "Use", Unit.RATIO).column("objects", "Objects", Unit.COUNT)
                .column("heartbeat", "Heartbeat age", Unit.SECONDS).column("disk_capacity", "SSD capacity", Unit.BYTES)
                .column("disk_used", "SSD used", Unit.BYTES).column("disk_queue", "Spill queue", Unit.BYTES)
                .column("disk_drops", "Spills dropped", Unit.COUNT);
        for (SegmentInfo s : segs) {
            boolean disk = s.tiers().hasDisk();
            t.row(s.name(), state(s), s.capacity(), s.used(), s.capacity() == 0 ? null : (double) s.used() / s.capacity(),
                    s.objects(), s.heartbeatAgeMillis() / 1000.0, disk ? s.tiers().diskCapacity() : null,
                    disk ? s.tiers().diskUsed() : null, disk ? s.tiers().diskQueueBytes() : null,
                    disk ? s.tiers().diskDrops() : null);
        }
        Tenants tenants = service.tenants();
        if (tenants.active()) {
            StatusView.Table tt = v.table("tenants", "Tenants").column("name", "Tenant", Unit.TEXT)
                    .column("memory", "Memory", Unit.BYTES).column("memory_quota", "Memory quota", Unit.BYTES)
                    .column("disk", "SSD", Unit.BYTES).column("disk_quota", "SSD quota", Unit.BYTES)
                    .column("over_quota", "Over quota", Unit.TEXT).column("refused", "Puts refused", Unit.COUNT)
                    .column("own_evictions", "Own evictions", Unit.COUNT);
            List<Tenant> ts = tenants.tenants();
            for (int i = 0; i < ts.size(); i++) {
                Tenant x = ts.get(i);
                tt.row(x.name(), tenants.memoryUsed(i + 1), x.memoryBytes() < 0 ? null : x.memoryBytes(),
                        tenants.diskUsed(i + 1), x.diskBytes() < 0 ? null : x.diskBytes(), x.overQuota().spelling(),
                        tenants.refusedPuts(i + 1), tenants.ownEvictions(i + 1));
            }
        }
        StatusView.Table r = v.table("resets", "Recent resets").empty("no reset since this master started")
                .column("time", "Time", Unit.TIME).column("what", "What", Unit.TEXT)
                .column("removed", "Objects removed", Unit.COUNT).column("epoch", "Epoch after", Unit.COUNT);
        for (RecentResets.Reset x : service.resets.newestFirst()) {
            r.row(x.epochMillis(), x.what(), x.removed(), x.epoch());
        }
        for (String[] l : links) {
            v.link(l[0], l[1]);
        }
        v.link("metrics", "metrics");
        return v;
    }

    private static String state(SegmentInfo s) {
        if (s.state() == SegmentInfo.STATE_JOINING) {
            return "joining";
        }
        if (s.state() == SegmentInfo.STATE_DRAINING) {
            return "draining";
        }
        return s.heartbeatAgeMillis() > LATE_MILLIS ? "late" : "active";
    }
}
