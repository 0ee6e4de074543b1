package io.kvpool.master;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import io.kvpool.config.HostPort;
import io.kvpool.web.StatusPages;
import io.kvpool.config.Durations;
import io.kvpool.master.events.KvEventPublisher;
import io.kvpool.protocol.FrameServer;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.WriteLeaseMessages;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.InstantSource;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Set;
import java.util.function.BooleanSupplier;
import java.util.random.RandomGenerator;

/**
 * The running master: the RPC port (a {@link FrameServer} over {@link MasterHandler}), the HTTP port
 * ({@code /metrics} in Prometheus text format, {@code /health}), the timer thread that calls
 * {@link MasterService#tick()}, and the periodic summary line. Constructed = serving; {@link #close()}
 * stops everything it started.
 */
public final class MasterServer implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(MasterServer.class);
    private static final Logger summaryLog = LoggerFactory.getLogger("io.kvpool.master.summary");

    private final MasterConfig config;
    private final MasterService service;
    private final MasterMetrics metrics;
    private final NodeControl nodes;
    /** Whether heartbeat connections are served by the frame loop (system property {@code kvpool.frameLoop}, on by default). */
    static final boolean FRAME_LOOP = !"false".equalsIgnoreCase(System.getProperty("kvpool.frameLoop", "true"));
    private final FrameServer rpc;
    private final HttpServer http;
    /** False when the HTTP server is an elected master's, which outlives this server. */
    private final boolean ownsHttp;
    private final MasterStatus status;
    /** GET and PUT /api/tenants. */
    private final TenantsPage tenantsPage;
    /** KV events for routers, or null when they are off. */
    private final KvEventPublisher events;
    private final StatusPages pages;
    private final Thread timer;
    private final Thread repairer;
    private final BooleanSupplier leading;
    private volatile boolean closed;

    public MasterServer(MasterConfig config) throws IOException {
        this(config, InstantSource.system(), RandomGenerator.getDefault());
    }

    public MasterServer(MasterConfig config, InstantSource clock, RandomGenerator random) throws IOException {
        this(config, clock, random, () -> true);
    }

    /**
     * A master that serves only while {@code leading} holds (an elected master: its leadership is
     * valid): once it does not, every request closes its connection unanswered, so clients and nodes
     * look for the leader again. See {@code ElectedMaster}.
     */
    public MasterServer(MasterConfig config, InstantSource clock, RandomGenerator random, BooleanSupplier leading)
            throws IOException {
        this(config, clock, random, leading, Set.of());
    }

    /**
     * An elected master: {@code owedBefore} names the segments the previous leader could not deliver
     * frees to; they come back empty (set before the first request is served).
     */
    public MasterServer(MasterConfig config, InstantSource clock, RandomGenerator random, BooleanSupplier leading,
                        Set<String> owedBefore) throws IOException {
        this(config, clock, random, leading, owedBefore, null);
    }

    /**
     * With {@code sharedHttp} non-null, the status page, {@code /metrics} and {@code /health} are
     * mounted on that server (an elected master's, which outlives its leaderships and shows a standby
     * page between them) and taken off it again at {@link #close()}.
     */
    public MasterServer(MasterConfig config, InstantSource clock, RandomGenerator random, BooleanSupplier leading,
                        Set<String> owedBefore, HttpServer sharedHttp) throws IOException {
        this(config, clock, random, leading, owedBefore, sharedHttp, null);
    }

    /** A promoted standby's: serves from {@code copy}, its copy of the previous leader's metadata, at once. */
    MasterServer(MasterConfig config, InstantSource clock, RandomGenerator random, BooleanSupplier leading,
                 Set<String> owedBefore, HttpServer sharedHttp, StandbyCopy copy) throws IOException {
        this.config = config;
        this.leading = leading;
        // nodes get as long to acknowledge a removal or reset as a frozen client can make it wait
        this.nodes = new NodeControl(config.limits(), config.readLease(), config.term(), config.secrets());
        nodes.owedBefore(owedBefore);
        this.service = MasterService.serving(config, clock, random, nodes, copy);
        try {
            // before the first request: a restarted or newly elected master announces what it rebuilds
            this.events = config.kvEvents().enabled() ? new KvEventPublisher(config.kvEvents(),
                    KvEventPublisher.firstSequence(config.term()), clock) : null;
        } catch (IOException e) {
            nodes.close();
            throw e;
        }
        if (events != null) {
            service.publishEvents(events.sink());
        }
        this.metrics = new MasterMetrics(service);
        metrics.kvEvents(events);
        metrics.tenants(service.tenants());
        metrics.standbyFeed(service.feed);
        this.tenantsPage = new TenantsPage(service, config.secrets());
        try {
            this.rpc = new FrameServer("master", new InetSocketAddress(config.listenHost(), config.port()),
                    config.limits(), config.frameTimeout(), op -> !op.isNodeOp(), new MasterHandler(service, metrics, leading, events),
                    config.secrets(), Opcode::access);
        } catch (IOException | RuntimeException e) {
            nodes.close();
            if (events != null) {
                events.close();
            }
            throw e;
        }
        if (FRAME_LOOP) {
            // a node's heartbeat (a map lookup and a few stores) waits in one selector loop, not on a thread of its
            // own: no thread wake-up per heartbeat (docs/architecture.md, "Threads and locks")
            try {
                rpc.serveInLoop(op -> op == Opcode.NODE_HEARTBEAT || op == Opcode.NODE_BEACON);
            } catch (IOException e) {
                log.warn("master: no frame loop ({}); nodes' heartbeats are served on their connections' threads",
                        e.getMessage());
            }
        }
        metrics.connections(rpc);
        metrics.leadership(config.term(), leading);
        this.status = new MasterStatus(service, metrics, config, leading, clock);
        HttpServer h = sharedHttp;
        StatusPages p = null;
        if (h == null && config.httpPort() >= 0) {
            try {
                h = StatusPages.listen("master", config.listenHost(), config.httpPort());
            } catch (IOException e) {
                rpc.close();
                nodes.close();
                if (events != null) {
                    events.close();
                }
                throw e;
            }
        }
        if (h != null) {
            String address = new HostPort(config.listenHost(), rpc.port()).toString();
            p = StatusPages.mount(h, "/", metrics.registry(), () -> status.view(address), status.history);
            p.context("/health", this::health);
            p.context("/api/tiers", new TierLookupPage(service.probes(), config.secrets()));
            p.context("/api/tenants", tenantsPage);
            if (sharedHttp == null) {
                h.start();
            }
        }
        this.ownsHttp = sharedHttp == null;
        this.http = h;
        this.pages = p;
        this.timer = Thread.ofPlatform().daemon().name("kvpool-master-timer").start(this::timerLoop);
        this.repairer = Thread.ofPlatform().daemon().name("kvpool-master-repair").start(this::repairLoop);
        log.info("master listening on {}:{} (metrics on {}), node TTL {}, eviction at {}% freeing {}%",
                config.listenHost(), rpc.port(), http == null ? "nothing" : "http port " + httpPort(),
                Durations.format(config.nodeTtl()), Math.round(config.highWatermark() * 100),
                Math.round(config.evictionRatio() * 100));
    }

    public int port() {
        return rpc.port();
    }

    /** The HTTP port, or -1 when HTTP is off. */
    public int httpPort() {
        return http == null ? -1 : http.getAddress().getPort();
    }

    public MasterService service() {
        return service;
    }

    public MasterMetrics metrics() {
        return metrics;
    }

    /**
     * The HTTP server (status page, /metrics, /health), to mount more pages on (the embedded node's in
     * {@code kvpool serve}); null when HTTP is off.
     */
    public HttpServer http() {
        return http;
    }

    /** The KV events publisher (its endpoints, its counts), or null when events are off. */
    /** Where a tenant list PUT at run time is kept before it is applied (etcd, for an elected master). */
    void keepTenantsIn(TenantsPage.Store store) {
        tenantsPage.keepIn(store);
    }

    public KvEventPublisher kvEvents() {
        return events;
    }

    /** Adds a link to the master's status page header. */
    public void statusLink(String label, String href) {
        status.link(label, href);
    }

    /**
     * A COMMIT that a node in this process sends for one of its writers (NODE_WRITE_COMMIT, protocol version
     * 17), taken as a call: checked and counted as a COMMIT frame is. Throws while this master does not lead
     * or is stopping; the writer then commits itself.
     */
    public List<ResultCode> commitInProcess(WriteLeaseMessages.Commit commit) throws IOException {
        if (closed || !leading.getAsBoolean()) {
            throw new IOException("the master in this process is " + (closed ? "stopping" : "not leading"));
        }
        List<ResultCode> codes = service.commit(commit);
        metrics.record(Opcode.COMMIT, codes.size(), MasterHandler.countNot(codes, ResultCode.OK), 0, false);
        return codes;
    }

    /** Delivers queued frees to nodes now instead of at the next flush. */
    public void flushNodeFrees() {
        nodes.flushAll();
    }

    private void health(HttpExchange ex) throws IOException {
        String body = String.format(Locale.ROOT,
                "{\"status\":\"ok\",\"epoch\":%d,\"segments\":%d,\"keys\":%d,\"capacity_bytes\":%d,\"allocated_bytes\":%d}\n",
                service.epoch(), service.segmentInfos().size(), service.keyCount(), service.capacity(),
                service.allocated());
        byte[] b = body.getBytes(StandardCharsets.UTF_8);
        ex.getResponseHeaders().set("Content-Type", "application/json");
        ex.sendResponseHeaders(200, b.length);
        try (OutputStream os = ex.getResponseBody()) {
            os.write(b);
        }
    }

    private void timerLoop() {
        long tickNanos = config.tickInterval().toNanos();
        long summaryNanos = config.summaryInterval().toNanos();
        long nextSummary = System.nanoTime() + summaryNanos;
        while (!closed) {
            try {
                Thread.sleep(Duration.ofNanos(tickNanos));
            } catch (InterruptedException e) {
                return;
            }
            try {
                service.tick();
                if (summaryNanos > 0 && System.nanoTime() >= nextSummary) {
                    nextSummary = System.nanoTime() + summaryNanos;
                    summaryLog.info(metrics.summaryLine());
                }
            } catch (RuntimeException e) {
                log.error("master timer failed", e);
            }
        }
    }

    /** Runs repair rounds ({@link Repair}) one after another while they find work, else every tick; only while leading. */
    private void repairLoop() {
        while (!closed) {
            int made = 0;
            try {
                if (leading.getAsBoolean()) {
                    made = service.repair().runOnce();
                }
            } catch (RuntimeException e) {
                log.error("master repair round failed", e);
            }
            if (made == 0) {
                try {
                    Thread.sleep(config.tickInterval());
                } catch (InterruptedException e) {
                    return;
                }
            }
        }
    }

    /** Requests counted for an operation (for tests and the summary). */
    public long requests(Opcode op) {
        return metrics.requests(op);
    }

    @Override
    public void close() {
        if (closed) {
            return;
        }
        closed = true;
        timer.interrupt();
        repairer.interrupt();
        service.shutdown();
        try {
            rpc.close();
        } catch (IOException e) {
            log.warn("master: error closing RPC port: {}", e.toString());
        }
        if (http != null) {
            if (ownsHttp) {
                pages.close();
                http.stop(0);
            } else {
                pages.unmount();
            }
        }
        nodes.close();
        if (events != null) {
            events.close();
        }
        log.info("master stopped");
    }

    /**
     * Names of the segments this master owes frees to, or whose lost objects it remembers (an elected leader lists
     * them in etcd for the next, which makes them come back empty).
     */
    public Set<String> owedSegments() {
        Set<String> out = new HashSet<>(nodes.owed());
        out.addAll(service.lostOn());
        return out;
    }
}
