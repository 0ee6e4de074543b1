package io.kvpool.master;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.config.Size;
import io.kvpool.master.events.KvEventPublisher;
import io.kvpool.protocol.FrameServer;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.MasterMessages.SegmentInfo;
import io.kvpool.protocol.msg.MasterMessages.TierStats;
import io.prometheus.metrics.core.metrics.CounterWithCallback;
import io.prometheus.metrics.core.metrics.GaugeWithCallback;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import io.kvpool.web.Series;

import java.util.List;
import java.util.Locale;
import java.util.concurrent.atomic.LongAdder;
import java.util.function.BooleanSupplier;
import java.util.function.DoubleSupplier;
import java.util.function.LongSupplier;
import java.util.function.ObjIntConsumer;
import java.util.function.ToDoubleFunction;

/**
 * The master's metrics: request counters per operation, kept in {@link LongAdder}s indexed by
 * opcode (no label lookup on the hot path), and gauges read from the {@link MasterService} when
 * scraped. Exposed in Prometheus text format at {@code /metrics}, and summarized in one log line
 * every summary interval by {@link #summaryLine}.
 */
public final class MasterMetrics {

    private final MasterService service;
    private final PrometheusRegistry registry = new PrometheusRegistry();
    private final LongAdder[] requests = adders();
    private final LongAdder[] failures = adders();
    private final LongAdder[] items = adders();
    private final LongAdder[] failedItems = adders();
    private final LongAdder[] misses = adders();

    // the previous summary's totals, to print rates (summaryLine is synchronized)
    @GuardedBy("this")
    private final long[] lastRequests = new long[256];
    @GuardedBy("this")
    private final long[] lastFailures = new long[256];
    @GuardedBy("this")
    private long lastEvictedKeys;
    @GuardedBy("this")
    private long lastEvictedBytes;
    @GuardedBy("this")
    private long lastSummaryNanos = System.nanoTime();

    private static LongAdder[] adders() {
        LongAdder[] a = new LongAdder[256];
        for (int i = 0; i < a.length; i++) {
            a[i] = new LongAdder();
        }
        return a;
    }

    MasterMetrics(MasterService service) {
        this.service = service;
        gauge("master_objects", "Complete objects in the pool (was master_key_count)", service::keyCount);
        gauge("master_allocated_bytes", "Bytes reserved in active segments, headers included", service::allocated);
        gauge("master_free_ranges", "Free ranges in active segments: many short ones mean fragmentation",
                service::freeRanges);
        gauge("master_longest_free_bytes", "The longest free range of any active segment (the longest write lease"
                + " placeable without evicting)", service::longestFree);
        gauge("master_total_capacity_bytes", "Bytes contributed by active segments", service::capacity);
        gauge("master_active_clients", "Clients seen within the client TTL", service::activeClients);
        gauge("master_frees_undelivered", "Frees owed to nodes that could not be reached; their copies are refused"
                + " if those nodes come back", service::undeliveredFrees);
        gauge("master_lost_copies", "Objects whose only copy was on a dropped node, taken back if that node returns"
                + " before their key is removed or stored again", service::lostCopies);
        gauge("master_cluster_epoch", "Current cluster epoch (moves on every removeAll(force))", service::epoch);
        gauge("master_segments", "Registered segments, joining ones included", () -> service.segmentInfos().size());
        GaugeWithCallback.builder().name("segment_allocated_bytes").help("Bytes reserved in a segment")
                .labelNames("segment").callback(cb -> {
                    for (SegmentInfo s : service.segmentInfos()) {
                        cb.call(s.used(), s.name());
                    }
                }).register(registry);
        GaugeWithCallback.builder().name("segment_total_capacity_bytes").help("Bytes a segment contributes")
                .labelNames("segment").callback(cb -> {
                    for (SegmentInfo s : service.segmentInfos()) {
                        cb.call(s.capacity(), s.name());
                    }
                }).register(registry);
        GaugeWithCallback.builder().name("segment_objects").help("Objects stored in a segment (was segment_object_count)")
                .labelNames("segment").callback(cb -> {
                    for (SegmentInfo s : service.segmentInfos()) {
                        cb.call(s.objects(), s.name());
                    }
                }).register(registry);
        // per node and tier, from the nodes' heartbeats
        tierGauge("node_tier_capacity_bytes", "Capacity of a node's tier (memory: its segment; disk: its SSD tier)",
                (s, t) -> t == Tier.MEMORY ? s.capacity() : s.tiers().diskCapacity());
        tierGauge("node_tier_used_bytes", "Bytes in use in a node's tier",
                (s, t) -> t == Tier.MEMORY ? s.used() : s.tiers().diskUsed());
        tierGauge("node_tier_objects", "Objects in a node's tier",
                (s, t) -> t == Tier.MEMORY ? s.objects() : s.tiers().diskObjects());
        tierCounter("node_tier_read_bytes_total", "Value bytes a node served from a tier over TCP (same-machine reads of"
                + " memory bypass the node and are not counted)",
                (s, t) -> t == Tier.MEMORY ? s.tiers().memoryReadBytes() : s.tiers().diskReadBytes());
        tierCounter("node_tier_written_bytes_total", "Value bytes a node wrote into a tier",
                (s, t) -> t == Tier.MEMORY ? s.tiers().memoryWrittenBytes() : s.tiers().diskWrittenBytes());
        tierCounter("node_tier_hits_total", "Objects a node served from a tier",
                (s, t) -> t == Tier.MEMORY ? s.tiers().memoryReads() : s.tiers().diskHits());
        diskGauge("node_disk_queue_bytes", "Bytes waiting in a node's spill queue", m -> m.diskQueueBytes());
        diskCounter("node_disk_drops_total", "Spills dropped because the queue was full or the object did not fit",
                m -> m.diskDrops());
        diskCounter("node_disk_evictions_total", "Objects the SSD tier let go at its watermark", m -> m.diskEvictions());
        diskCounter("node_disk_promotions_total", "Objects moved back to memory after repeated disk hits",
                m -> m.diskPromotions());
        diskCounter("node_disk_checksum_failures_total", "Disk reads whose checksum did not match (served as misses)",
                m -> m.diskChecksumFailures());
        perOp("master_requests_total", "Requests received, by operation", requests, false);
        perOp("master_request_failures_total",
                "Requests that failed: an error reply, or a single-item write whose item was not stored", failures, false);
        perOp("master_request_items_total", "Items carried by batch requests, by operation", items, true);
        perOp("master_request_failed_items_total", "Items of batch requests that were not carried out", failedItems, true);
        perOp("master_request_misses_total", "Keys looked up or removed that were not present", misses, false);
        counter("master_eviction_attempts_total", "Eviction rounds started", service.eviction().attempts::get);
        counter("master_eviction_successes_total", "Eviction rounds that freed something", service.eviction().successes::get);
        counter("master_evicted_keys_total", "Objects evicted", service.eviction().evictedKeys::get);
        counter("master_evicted_bytes_total", "Bytes freed by eviction", service.eviction().evictedBytes::get);
        counter("master_pinned_evictions_total", "Eviction rounds that had to take pinned objects (nothing unpinned left)",
                service.eviction().pinnedEvictions::get);
        gauge("master_pinned_bytes", "Region bytes held by pinned objects (times their copies wanted)",
                service::pinnedBytes);
        counter("master_pins_refused_total", "Pins asked for and refused at the cap (the objects were stored unpinned)",
                service.pinsRefused::get);
        gauge("master_objects_under_replicated", "Objects with fewer copies than their put asked for (at the last repair"
                + " scan)", service.repair().underReplicated::get);
        counter("master_repair_copies_total", "Copies made by the background repair", service.repair().copiesMade::get);
        counter("master_repair_failures_total", "Repair copies that did not land or were dropped at commit",
                service.repair().copiesFailed::get);
        counter("master_repair_waits_total", "Times an object below its copies waited for a segment with room",
                service.repair().noRoom::get);
        counter("master_expired_puts_total", "Puts reclaimed because their writer never completed them",
                service.expiredPuts::get);
        counter("master_dropped_segments_total", "Segments dropped for silence or replaced by a re-registration",
                service.membership().droppedSegments::get);
        counter("master_registrations_refused_total", "REGISTER_NODE refused because a live node holds that segment and"
                + " the registration did not prove it is that node (a forged registration, or two nodes given one"
                + " address)", service.membership().refusedRegistrations::get);
        counter("master_node_drains_total", "Nodes that said they stop for a restart (NODE_DRAIN): nothing more was placed"
                + " on them", service.membership().drains::get);
        gauge("master_segments_draining", "Segments whose node stops for a restart and has not registered again",
                () -> service.segmentInfos().stream()
                        .filter(i -> i.state() == io.kvpool.protocol.msg.MasterMessages.SegmentInfo.STATE_DRAINING).count());
        // write leases: ranges writers fill without asking, made visible by COMMIT
        gauge("master_write_leases", "Write leases open", service.writeLeases::size);
        gauge("master_write_lease_unused_bytes", "Bytes of open write leases not committed yet (allocated, not objects)",
                service.writeLeases::unusedBytes);
        counter("master_write_leases_granted_total", "Write leases granted", service.writeLeases.granted::get);
        counter("master_write_leases_expired_total", "Write leases reclaimed because their writer went idle or away",
                service.writeLeases.expired::get);
        counter("master_write_lease_commits_total", "Objects made visible by COMMIT", service.writeLeases.committed::get);
        // read leases: removals, resets and upserts wait until every client dropped what they invalidate
        gauge("master_read_lease_sessions", "Clients holding a read lease (reading from remembered locations)",
                service::leaseSessions);
        counter("master_invalidations_total", "Invalidations published (removals, resets, upserts)",
                service.leases.invalidations::get);
        counter("master_read_leases_waited_out_total",
                "Times an invalidation waited for a client's read lease to run out instead of an acknowledgement"
                        + " (a frozen, partitioned or dead client)", service.leases.leasesWaitedOut::get);
        GaugeWithCallback.builder().name("master_invalidation_wait_seconds_max")
                .help("Longest wait of an invalidation for clients to apply it, since start")
                .callback(cb -> cb.call(service.leases.waitNanosMax.get() / 1e9)).register(registry);
        CounterWithCallback.builder().name("master_invalidation_wait_seconds_total")
                .help("Time invalidations spent waiting for clients to apply them")
                .callback(cb -> cb.call(service.leases.waitNanosTotal.get() / 1e9)).register(registry);
    }

    public PrometheusRegistry registry() {
        return registry;
    }

    private interface TierValue {
        double of(SegmentInfo segment, Tier tier);
    }

    private void tierGauge(String name, String help, TierValue value) {
        GaugeWithCallback.builder().name(name).help(help).labelNames("segment", "tier").callback(cb -> {
            for (SegmentInfo s : service.segmentInfos()) {
                for (Tier t : Tier.values()) {
                    if (t == Tier.MEMORY || s.tiers().hasDisk()) {
                        cb.call(value.of(s, t), s.name(), t.label());
                    }
                }
            }
        }).register(registry);
    }

    private void tierCounter(String name, String help, TierValue value) {
        CounterWithCallback.builder().name(name).help(help).labelNames("segment", "tier").callback(cb -> {
            for (SegmentInfo s : service.segmentInfos()) {
                for (Tier t : Tier.values()) {
                    if (t == Tier.MEMORY || s.tiers().hasDisk()) {
                        cb.call(value.of(s, t), s.name(), t.label());
                    }
                }
            }
        }).register(registry);
    }

    private void diskGauge(String name, String help, ToDoubleFunction<TierStats> value) {
        GaugeWithCallback.builder().name(name).help(help).labelNames("segment").callback(cb -> {
            for (SegmentInfo s : service.segmentInfos()) {
                if (s.tiers().hasDisk()) {
                    cb.call(value.applyAsDouble(s.tiers()), s.name());
                }
            }
        }).register(registry);
    }

    private void diskCounter(String name, String help, ToDoubleFunction<TierStats> value) {
        CounterWithCallback.builder().name(name).help(help).labelNames("segment").callback(cb -> {
            for (SegmentInfo s : service.segmentInfos()) {
                if (s.tiers().hasDisk()) {
                    cb.call(value.applyAsDouble(s.tiers()), s.name());
                }
            }
        }).register(registry);
    }

    /** What peers make the master's port hold, and what its limits refused (see {@link FrameServer}). */
    void connections(FrameServer rpc) {
        gauge("master_connections_open", "Connections open to the master's port", rpc::connectionCount);
        gauge("master_loop_connections", "Connections whose last frame was a node's heartbeat, waiting for the next in"
                + " the frame loop rather than on a thread of their own (kvpool.frameLoop)", rpc::loopConnections);
        counter("master_loop_frames_total", "Frames (heartbeats and beacons) the frame loop served", rpc::loopFrames);
        counter("master_loop_reads_total", "Reads the frame loop made from its connections (frames over reads: how"
                + " many frames one read brought in)", rpc::loopReads);
        counter("master_busy_polls_total", "Waits for a connection's next frame that polled the socket and found it"
                + " (kvpool.busyPoll)", rpc::busyPollHits);
        counter("master_busy_polls_missed_total", "Waits for a connection's next frame that polled the socket for the"
                + " whole budget, then blocked", rpc::busyPollMisses);
        counter("master_busy_polls_yielded_total", "Waits for a connection's next frame whose poll stopped early because"
                + " the CPU was busy (a yield ran another thread)", rpc::busyPollsYielded);
        Series.counter(registry, "master_busy_poll_seconds_total", "Time the master's connection threads spent"
                + " polling for frames: about the CPU that polling costs", () -> rpc.busyPollNanos() / 1e9);
        counter("master_connections_refused_total", "Connections refused at the connection limits (in all, per host)",
                rpc::refusedConnections);
        counter("master_frames_timed_out_total", "Connections closed because a frame (or a new connection's first"
                + " frame) did not arrive within the frame timeout", rpc::timedOutFrames);
        counter("master_auth_refused_total", "Connections closed because their authentication failed or a request"
                + " needed a secret they had not proven", rpc::refusedAuth);
        counter("master_tls_handshake_failures_total", "Connections refused for TLS: a failed or timed-out handshake"
                + " (no client certificate, one of another CA), a plain-TCP client of a TLS port or the reverse",
                rpc::tlsHandshakeFailures);
        counter("master_large_bodies_refused_total", "Frames refused because their body could not reserve its size from"
                + " the process's body budget within half the frame timeout, or was larger than the whole budget (the name"
                + " predates the budget covering every body)", rpc::refusedBodies);
        gauge("master_body_reservations_waiting", "Frame bodies waiting now, in the order they asked, for their"
                + " reservation from the process's body budget (shared with any other server in the process)",
                rpc::bodiesWaiting);
        gauge("master_body_bytes_buffered", "Bytes of the process's body budget taken now by frame bodies being received"
                + " or handled (shared with any other server in the process)", rpc::bodyBytesBuffered);
        gauge("master_body_budget_bytes", "The process's body budget: an eighth of the heap, within 64 MiB and 1 GiB",
                rpc::bodyBudgetBytes);
    }

    /**
     * KV events for routers ({@code io.kvpool.master.events}): what the publisher sent and dropped, and
     * where its stream is. Zero (and -1) with events off ({@code p} null).
     */
    void kvEvents(KvEventPublisher p) {
        counter("master_kv_events_published_total", "KV events sent to routers, in vLLM's format (docs/operations.md,"
                + " \"KV events\")", () -> p == null ? 0 : p.publishedEvents());
        counter("master_kv_events_batches_total", "KV event batches sent (one ZMQ message each)",
                () -> p == null ? 0 : p.publishedBatches());
        counter("master_kv_events_dropped_total", "KV events dropped because the publisher's queue was full: routers'"
                + " view of the pool is behind (--kv-events-queue-size)", () -> p == null ? 0 : p.droppedEvents());
        gauge("master_kv_events_sequence", "Sequence number of the last KV event batch sent (-1: none yet); a new"
                + " leadership starts its stream at term << 32", () -> p == null ? -1 : p.lastSequence());
        gauge("master_kv_events_block_infos", "Block infos (tokens, parent hash, ...) connectors sent that the master"
                + " keeps for the events' BlockStored", () -> p == null ? 0 : p.blockInfos());
        gauge("master_kv_events_block_info_bytes", "Estimated memory of the block infos kept (--kv-events-info-bytes)",
                () -> p == null ? 0 : p.blockInfoBytes());
        counter("master_kv_events_block_infos_let_go_total", "Block infos let go for room: their keys' later stores go"
                + " out without tokens (raise --kv-events-info-bytes)", () -> p == null ? 0 : p.blockInfosLetGo());
    }

    /** The change feed standby masters follow ({@link FeedSource}): its size, what it dropped, who is in sync. */
    void standbyFeed(FeedSource f) {
        gauge("master_feed_position", "Records appended to the change feed standby masters follow (0 until one asks)",
                () -> f.feed().end());
        gauge("master_feed_bytes", "Bytes of change feed records kept for standbys", () -> f.feed().bytes());
        counter("master_feed_dropped_total", "Change feed records dropped unread for room: a standby behind them takes"
                + " a new snapshot", () -> f.feed().dropped());
        gauge("master_standbys_in_sync", "Standby masters every acknowledged write waits for",
                () -> f.sync().published().size());
        counter("master_standbys_dropped_total", "Standby masters dropped from the sync set for not reading a write"
                + " in time", () -> f.sync().dropped());
    }

    /**
     * Tenants ({@link Tenants}): per namespace, what it holds in each tier and its quota there (-1: none), puts
     * refused over quota and objects it evicted for its own quota. Nothing without tenants.
     */
    void tenants(Tenants t) {
        GaugeWithCallback.builder().name("master_tenant_bytes").help("Bytes a tenant's objects hold, by tier (every"
                + " copy's region)").labelNames("tenant", "tier").callback(cb -> eachTenant(t, (x, ns) -> {
                    cb.call(t.memoryUsed(ns), x.name(), Tier.MEMORY.label());
                    cb.call(t.diskUsed(ns), x.name(), Tier.DISK.label());
                })).register(registry);
        GaugeWithCallback.builder().name("master_tenant_quota_bytes").help("A tenant's quota by tier (-1: none)")
                .labelNames("tenant", "tier").callback(cb -> eachTenant(t, (x, ns) -> {
                    cb.call(x.memoryBytes(), x.name(), Tier.MEMORY.label());
                    cb.call(x.diskBytes(), x.name(), Tier.DISK.label());
                })).register(registry);
        CounterWithCallback.builder().name("master_tenant_refused_puts_total").help("Puts refused QUOTA_EXCEEDED")
                .labelNames("tenant").callback(cb -> eachTenant(t, (x, ns) -> cb.call(t.refusedPuts(ns), x.name())))
                .register(registry);
        CounterWithCallback.builder().name("master_tenant_own_evictions_total").help("Objects a tenant set to evict lost"
                + " to make room for its own puts at its quota").labelNames("tenant")
                .callback(cb -> eachTenant(t, (x, ns) -> cb.call(t.ownEvictions(ns), x.name()))).register(registry);
    }

    private static void eachTenant(Tenants t, ObjIntConsumer<Tenant> body) {
        List<Tenant> ts = t.tenants();
        for (int i = 0; i < ts.size(); i++) {
            body.accept(ts.get(i), i + 1);
        }
    }

    /**
     * The leadership this master serves: {@code master_term} (0 for a single master; moves on every
     * failover) and {@code master_leader} (1 while it serves as leader).
     */
    void leadership(long term, BooleanSupplier leading) {
        gauge("master_term", "The leadership term this master serves (0 for a single master; moves on every failover)",
                () -> term);
        gauge("master_leader", "1 while this master serves as the elected leader (or is the only master), else 0",
                () -> leading.getAsBoolean() ? 1 : 0);
    }

    private void gauge(String name, String help, DoubleSupplier value) {
        Series.gauge(registry, name, help, value);
    }

    private void counter(String name, String help, LongSupplier value) {
        Series.counter(registry, name, help, value::getAsLong);
    }

    private void perOp(String name, String help, LongAdder[] values, boolean batchOnly) {
        CounterWithCallback.builder().name(name).help(help).labelNames("op").callback(cb -> {
            for (Opcode op : Opcode.values()) {
                if (op.isNodeOp() || (batchOnly && !op.isBatch())) {
                    continue;
                }
                cb.call(values[op.code].sum(), op.metricName);
            }
        }).register(registry);
    }

    /** Counts one request: its items, how many were not carried out, how many keys were misses. */
    void record(Opcode op, int itemCount, int failed, int missed, boolean requestFailed) {
        requests[op.code].increment();
        if (requestFailed) {
            failures[op.code].increment();
        }
        if (op.isBatch()) {
            items[op.code].add(itemCount);
            if (failed > 0) {
                failedItems[op.code].add(failed);
            }
        }
        if (missed > 0) {
            misses[op.code].add(missed);
        }
    }

    /** Counts a request that was answered with an error. */
    void recordError(Opcode op) {
        requests[op.code].increment();
        failures[op.code].increment();
    }

    long requests(Opcode op) {
        return requests[op.code].sum();
    }

    /** Objects looked up for reading (GET_REPLICA_LIST and its batch form's items). */
    long lookups() {
        return requests[Opcode.GET_REPLICA_LIST.code].sum() + items[Opcode.BATCH_GET_REPLICA_LIST.code].sum();
    }

    /** Objects looked up for reading that were not present. */
    long lookupMisses() {
        return misses[Opcode.GET_REPLICA_LIST.code].sum() + misses[Opcode.BATCH_GET_REPLICA_LIST.code].sum();
    }

    /** Puts begun with space granted (PUT_START and batch items not refused) plus objects committed under write leases. */
    long putsAdmitted() {
        return requests[Opcode.PUT_START.code].sum() - failures[Opcode.PUT_START.code].sum()
                + items[Opcode.BATCH_PUT_START.code].sum() - failedItems[Opcode.BATCH_PUT_START.code].sum()
                + service.writeLeases.committed.get();
    }

    long failures(Opcode op) {
        return failures[op.code].sum();
    }

    /**
     * The periodic one-line summary: memory, keys, clients, per-operation successes/total per second
     * since the previous line (operations without traffic omitted), and evictions since then.
     */
    public synchronized String summaryLine() {
        long now = System.nanoTime();
        double secs = Math.max(1e-3, (now - lastSummaryNanos) / 1e9);
        lastSummaryNanos = now;
        long cap = service.capacity();
        long used = service.allocated();
        StringBuilder sb = new StringBuilder(256);
        sb.append(String.format(Locale.ROOT, "mem %s/%s (%.1f%%), keys %d, clients %d, segments %d |",
                Size.human(used), Size.human(cap), cap == 0 ? 0.0 : 100.0 * used / cap, service.keyCount(),
                service.activeClients(), service.segmentInfos().size()));
        boolean any = false;
        for (Opcode op : Opcode.values()) {
            if (op.isNodeOp()) {
                continue;
            }
            long r = requests[op.code].sum();
            long f = failures[op.code].sum();
            long dr = r - lastRequests[op.code];
            long df = f - lastFailures[op.code];
            lastRequests[op.code] = r;
            lastFailures[op.code] = f;
            if (dr > 0) {
                sb.append(String.format(Locale.ROOT, " %s %.1f/%.1f", op.metricName, (dr - df) / secs, dr / secs));
                any = true;
            }
        }
        if (!any) {
            sb.append(" no requests");
        }
        sb.append(" ops/s ok/total | ");
        long ek = service.eviction().evictedKeys.get();
        long eb = service.eviction().evictedBytes.get();
        sb.append("evicted ").append(ek - lastEvictedKeys).append(" keys (").append(Size.human(eb - lastEvictedBytes))
                .append(")");
        lastEvictedKeys = ek;
        lastEvictedBytes = eb;
        return sb.toString();
    }
}
