package io.kvpool.web;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import io.prometheus.metrics.exporter.httpserver.MetricsHandler;
import io.prometheus.metrics.instrumentation.jvm.JvmMetrics;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.InstantSource;
import java.util.Map;
import java.util.concurrent.Executors;
import java.util.function.Supplier;

/**
 * A process's status page, mounted on its HTTP server under a prefix ({@code /} for the process,
 * {@code /node/} for the node embedded in {@code kvpool serve}):
 *
 * <pre>
 *   GET P                 the page (HTML; its script and styles, and uPlot for the charts, come from
 *                         P/assets/, served from this jar: no internet access needed)
 *   GET P api/status      {@link StatusView} as JSON: what the page shows now
 *   GET P api/history     {@link History} as JSON: the last minutes the charts draw
 *   GET /metrics          Prometheus text, the process's series plus the JVM's (heap, GC, threads,
 *                         direct and mapped buffers), when a registry is given
 * </pre>
 * Every route is read-only and answers GET or HEAD only. The history is sampled once a second by a
 * daemon thread this object owns; {@link #close()} stops it (the HTTP server belongs to the caller).
 */
public final class StatusPages implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(StatusPages.class);
    private static final ObjectMapper JSON = new ObjectMapper();

    /** Files the page loads, by the name it asks for: nothing else is served from the classpath. */
    private static final Map<String, Asset> ASSETS = Map.of(
            "status.js", new Asset("/io/kvpool/web/assets/status.js", "text/javascript; charset=utf-8"),
            "status.css", new Asset("/io/kvpool/web/assets/status.css", "text/css; charset=utf-8"),
            "uPlot.min.js", new Asset("/META-INF/resources/webjars/uplot/" + uplotVersion() + "/dist/uPlot.iife.min.js",
                    "text/javascript; charset=utf-8"),
            "uPlot.min.css", new Asset("/META-INF/resources/webjars/uplot/" + uplotVersion() + "/dist/uPlot.min.css",
                    "text/css; charset=utf-8"));
    private static final String PAGE = "/io/kvpool/web/assets/status.html";

    private record Asset(String resource, String contentType) {
    }

    private final String prefix;
    private final HttpServer http;
    /** The paths this mount created, for {@link #unmount()}. */
    private final java.util.List<String> contexts = new java.util.ArrayList<>();
    private final Supplier<StatusView> status;
    private final History history;
    private final Thread sampler;
    private volatile boolean closed;

    private StatusPages(HttpServer http, String prefix, Supplier<StatusView> status, History history,
                        InstantSource clock, Duration interval) {
        this.http = http;
        this.prefix = prefix;
        this.status = status;
        this.history = history;
        this.sampler = Thread.ofPlatform().daemon().name("kvpool-status-history" + prefix.replace('/', '-'))
                .start(() -> sampleLoop(clock, interval));
    }

    /**
     * An HTTP server on {@code host:port} (0 picks a free port) with virtual-thread handlers, not
     * started; {@code who} names the process in the error when the port cannot be had.
     */
    public static HttpServer listen(String who, String host, int port) throws IOException {
        try {
            HttpServer h = HttpServer.create(new InetSocketAddress(host, port), 64);
            h.setExecutor(Executors.newVirtualThreadPerTaskExecutor());
            return h;
        } catch (IOException e) {
            throw new IOException(who + ": cannot listen for HTTP on " + host + ":" + port + ": " + e.getMessage(), e);
        }
    }

    /**
     * Mounts the page under {@code prefix} (starting and ending with '/'), and {@code /metrics} with
     * JVM metrics added to {@code registry} unless it is null. Samples {@code history} every second.
     */
    public static StatusPages mount(HttpServer http, String prefix, PrometheusRegistry registry,
                                    Supplier<StatusView> status, History history) {
        return mount(http, prefix, registry, status, history, InstantSource.system(), Duration.ofSeconds(1));
    }

    public static StatusPages mount(HttpServer http, String prefix, PrometheusRegistry registry,
                                    Supplier<StatusView> status, History history, InstantSource clock,
                                    Duration interval) {
        if (!prefix.startsWith("/") || !prefix.endsWith("/")) {
            throw new IllegalArgumentException("status page prefix must start and end with '/', got '" + prefix + "'");
        }
        StatusPages p = new StatusPages(http, prefix, status, history, clock, interval);
        if (registry != null) {
            withJvmMetrics(registry);
            p.context("/metrics", new MetricsHandler(registry));
        }
        p.context(prefix, p::page);
        p.context(prefix + "api/status", ex -> p.json(ex, () -> p.status.get().toJson()));
        p.context(prefix + "api/history", ex -> p.json(ex, p.history::toJson));
        p.context(prefix + "assets/", p::asset);
        return p;
    }

    /** Adds a route to the server, removed again by {@link #unmount()} (a page's neighbours: /health). */
    public void context(String path, com.sun.net.httpserver.HttpHandler handler) {
        http.createContext(path, handler);
        contexts.add(path);
    }

    /**
     * Takes this page's routes off the server (which goes on serving others) and stops its sampler:
     * for a server that outlives the page, as an elected master's outlives each of its leaderships.
     */
    public void unmount() {
        close();
        for (String c : contexts) {
            try {
                http.removeContext(c);
            } catch (IllegalArgumentException ignored) {
                // already gone
            }
        }
        contexts.clear();
    }

    /** Adds the Prometheus client's JVM metrics to a registry (once per registry). */
    public static void withJvmMetrics(PrometheusRegistry registry) {
        JvmMetrics.builder().register(registry);
    }

    public History history() {
        return history;
    }

    private void sampleLoop(InstantSource clock, Duration interval) {
        while (!closed) {
            try {
                history.sample(clock.millis());
            } catch (RuntimeException e) {
                log.warn("status history sample failed: {}", e.toString());
            }
            try {
                Thread.sleep(interval);
            } catch (InterruptedException e) {
                return;
            }
        }
    }

    private boolean readOnly(HttpExchange ex) throws IOException {
        String m = ex.getRequestMethod();
        if ("GET".equals(m) || "HEAD".equals(m)) {
            return true;
        }
        ex.getResponseHeaders().set("Allow", "GET, HEAD");
        send(ex, 405, "text/plain; charset=utf-8", (ex.getRequestURI().getPath() + " is read-only: GET or HEAD\n")
                .getBytes(StandardCharsets.UTF_8), false);
        return false;
    }

    private void page(HttpExchange ex) throws IOException {
        try (ex) {
            if (!readOnly(ex)) {
                return;
            }
            String path = ex.getRequestURI().getPath();
            if (!path.equals(prefix) && !path.equals(prefix + "index.html")) {
                send(ex, 404, "text/plain; charset=utf-8", ("no page at " + path + "; the status page is at " + prefix
                        + ", metrics at /metrics\n").getBytes(StandardCharsets.UTF_8), false);
                return;
            }
            send(ex, 200, "text/html; charset=utf-8", resource(PAGE), false);
        }
    }

    private void asset(HttpExchange ex) throws IOException {
        try (ex) {
            if (!readOnly(ex)) {
                return;
            }
            String name = ex.getRequestURI().getPath().substring((prefix + "assets/").length());
            Asset a = ASSETS.get(name);
            if (a == null) {
                send(ex, 404, "text/plain; charset=utf-8", ("no asset '" + name + "'\n").getBytes(StandardCharsets.UTF_8),
                        false);
                return;
            }
            send(ex, 200, a.contentType(), resource(a.resource()), true);
        }
    }

    private void json(HttpExchange ex, Supplier<ObjectNode> body) throws IOException {
        try (ex) {
            if (!readOnly(ex)) {
                return;
            }
            byte[] b;
            try {
                b = JSON.writeValueAsBytes(body.get());
            } catch (RuntimeException e) {
                log.warn("status page: {} failed", ex.getRequestURI().getPath(), e);
                send(ex, 500, "application/json", JSON.writeValueAsBytes(JSON.createObjectNode()
                        .put("error", String.valueOf(e.getMessage()))), false);
                return;
            }
            send(ex, 200, "application/json", b, false);
        }
    }

    private static void send(HttpExchange ex, int status, String type, byte[] body, boolean cacheable)
            throws IOException {
        ex.getResponseHeaders().set("Content-Type", type);
        ex.getResponseHeaders().set("X-Content-Type-Options", "nosniff");
        ex.getResponseHeaders().set("Cache-Control", cacheable ? "max-age=3600" : "no-store");
        boolean head = "HEAD".equals(ex.getRequestMethod());
        ex.sendResponseHeaders(status, head ? -1 : body.length);
        if (!head) {
            try (OutputStream os = ex.getResponseBody()) {
                os.write(body);
            }
        }
    }

    private static byte[] resource(String name) throws IOException {
        try (InputStream in = StatusPages.class.getResourceAsStream(name)) {
            if (in == null) {
                throw new IOException("status page: resource " + name + " is missing from the jar");
            }
            return in.readAllBytes();
        }
    }

    private static String uplotVersion() {
        try (InputStream in = StatusPages.class.getResourceAsStream("/io/kvpool/web/web.properties")) {
            if (in == null) {
                return "missing";
            }
            java.util.Properties p = new java.util.Properties();
            p.load(in);
            return p.getProperty("uplot.version", "missing");
        } catch (IOException e) {
            return "missing";
        }
    }

    @Override
    public void close() {
        closed = true;
        sampler.interrupt();
    }
}
