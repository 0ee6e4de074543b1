package io.kvpool.it;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.dataformat.yaml.YAMLFactory;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.config.Size;
import io.kvpool.connector.PoolConnector;
import io.kvpool.connector.hash.BlockHasher;
import io.kvpool.connector.hash.KeyFormat;
import io.kvpool.engine.Engine;
import io.kvpool.engine.EngineConfig;
import io.kvpool.engine.EngineServer;
import io.kvpool.engine.llama.ModelConfig;
import io.kvpool.engine.llama.Weights;
import io.kvpool.node.StorageNode;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The monitoring files in {@code deploy/} checked with {@code promtool} (Debian's prometheus package,
 * found or installed by {@code scripts/prometheus.sh}): the scrape configuration, the alert rules and
 * their unit tests, every PromQL expression of the Grafana dashboard, and {@code promtool check
 * metrics} on the real {@code /metrics} output of a master, its nodes and a reference engine after
 * some traffic. The metric names the alerts and the dashboard use must all be exported by those
 * endpoints, except the few in {@link #NOT_EXPORTED} (each with its reason): a renamed metric breaks
 * this test, not an operator's dashboard.
 *
 * <p>PromQL has no metric-name extractor in promtool 2.42, so {@link #metricNames} strips strings,
 * label matchers, ranges and grouping clauses and keeps the identifiers that are not functions or
 * keywords; the expressions were already parsed by promtool, so this only has to work on valid PromQL.
 */
class PromtoolIT {

    private static final Path ROOT = Path.of("..").toAbsolutePath().normalize();
    private static final Path PROMETHEUS = ROOT.resolve("deploy/prometheus");
    private static final Path DASHBOARD = ROOT.resolve("deploy/grafana/kvpool-dashboard.json");
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final ObjectMapper YAML = new ObjectMapper(new YAMLFactory());

    /** Names used by the rules or the dashboard that no kvpool endpoint exports, and why. */
    private static final Map<String, String> NOT_EXPORTED = Map.of(
            "up", "made by Prometheus for every scrape target (1 when the scrape succeeded)",
            "ALERTS", "made by Prometheus for its alerting rules (the dashboard's alert annotations)");

    /** What the nodes' own endpoint (job kvpool-node) exports; the master exports the nodes' tiers. */
    private static final Set<String> NODE_ENDPOINT = Set.of("node_connections_open", "node_connections_refused_total",
            "node_frames_timed_out_total", "node_auth_refused_total", "node_tls_handshake_failures_total",
            "node_large_bodies_refused_total", "node_write_grants_refused_total", "node_writes_refused_total",
            "node_master_connected", "node_disk_write_errors_total", "node_disk_writer_up");

    /** JVM and process series every process exports (the Prometheus client's JVM instrumentation). */
    private static final List<String> JVM = List.of("jvm_memory_used_bytes", "jvm_memory_max_bytes",
            "jvm_gc_collection_seconds_count", "jvm_gc_collection_seconds_sum", "jvm_threads_current",
            "jvm_buffer_pool_used_bytes", "process_cpu_seconds_total", "process_resident_memory_bytes",
            "process_open_fds", "process_max_fds");

    private static final String FUNCTION_OR_KEYWORD = "and|or|unless|by|without|on|ignoring|group_left|group_right"
            + "|offset|bool|inf|nan|atan2";

    @TempDir
    static Path tmp;

    private static String promtool;
    private static InProcessCluster cluster;
    private static KvPoolClient engineClient;
    private static Engine engine;
    private static EngineServer engineServer;
    /** Endpoint ("master", "engine", "node host:port") to the /metrics text it served after the traffic. */
    private static final Map<String, String> scraped = new LinkedHashMap<>();
    /** The nodes' own endpoints ({@link #nodeMetricsUrl}), by node. */
    private static final Map<String, String> nodeScraped = new LinkedHashMap<>();

    /** The nodes' HTTP servers, as `kvpool node --http-port` runs one per node. */
    private static final List<com.sun.net.httpserver.HttpServer> nodeHttp = new java.util.ArrayList<>();

    /** Serves a node's own /metrics (job kvpool-node) on a free port, as `kvpool node` does; its URL. */
    private static String nodeMetricsUrl(StorageNode node) throws IOException {
        com.sun.net.httpserver.HttpServer h = io.kvpool.web.StatusPages.listen("node", "127.0.0.1", 0);
        io.prometheus.metrics.model.registry.PrometheusRegistry registry =
                new io.prometheus.metrics.model.registry.PrometheusRegistry();
        node.registerMetrics(registry);
        node.mountStatus(h, "/", registry);
        h.start();
        nodeHttp.add(h);
        return "http://127.0.0.1:" + h.getAddress().getPort() + "/metrics";
    }

    @BeforeAll
    static void startPoolAndScrape() throws Exception {
        promtool = findPromtool();
        // one plain node and one with an SSD tier, so the disk series exist; 8 MiB each, so that
        // 20 puts of 1 MiB evict (and spill to the disk tier)
        Path disk = tmp.resolve("disk");
        cluster = new InProcessCluster(1, Size.ofMiB(8), c -> c, n -> n);
        cluster.addNode(Size.ofMiB(8), n -> n.withDisk(disk, Size.ofMiB(64)).withPromoteAfter(0));
        try (KvPoolClient c = cluster.client()) {
            for (int i = 0; i < 20; i++) {
                assertThat(c.put("fill/" + i, new byte[1 << 20])).as("put %d", i).isEqualTo(PutStatus.OK);
            }
            assertThat(c.put("fill/19", new byte[1 << 20])).isEqualTo(PutStatus.ALREADY_EXISTS);
            c.get("fill/19");
            c.get("absent");
        }
        ModelConfig model = ModelConfig.tiny();
        EngineConfig config = EngineConfig.defaults().withNumBlocks(64).withModelName("tiny");
        engineClient = cluster.client();
        engine = new Engine(config, model, Weights.random(model, 1), "w1", new PoolConnector(engineClient,
                new BlockHasher(config.blockSize(), config.hashSeed()), KeyFormat.of("tiny", "w1", "f32"),
                PoolConnector.ResetScope.ALL_FENCED));
        engineServer = new EngineServer(engine, "127.0.0.1", 0);
        String prompt = "{\"prompt\": [" + "7, ".repeat(40) + "7], \"max_tokens\": 3}";
        for (int i = 0; i < 2; i++) {
            HttpResponse<String> r = HttpClient.newHttpClient().send(HttpRequest.newBuilder(
                            URI.create("http://127.0.0.1:" + engineServer.port() + "/v1/completions"))
                    .POST(HttpRequest.BodyPublishers.ofString(prompt)).build(), HttpResponse.BodyHandlers.ofString());
            assertThat(r.statusCode()).as("completion: %s", r.body()).isEqualTo(200);
        }
        engine.connector().waitForSave();

        scraped.put("master", get("http://127.0.0.1:" + cluster.master.httpPort() + "/metrics"));
        scraped.put("engine", get("http://127.0.0.1:" + engineServer.port() + "/metrics"));
        for (StorageNode n : cluster.nodes) {
            nodeScraped.put("node " + n.name(), get(nodeMetricsUrl(n)));
        }
    }

    @AfterAll
    static void stop() {
        nodeHttp.forEach(h -> h.stop(0));
        if (engineServer != null) {
            engineServer.close();
        }
        if (engine != null) {
            engine.close();
        }
        if (engineClient != null) {
            engineClient.close();
        }
        if (cluster != null) {
            cluster.close();
        }
    }

    @Test
    void scrapeConfigAndAlertRulesPassPromtool() throws Exception {
        Run config = promtool(null, "check", "config", PROMETHEUS.resolve("prometheus.yml").toString());
        assertThat(config.exit).as("promtool check config:\n%s", config.out).isZero();
        assertThat(config.out).as("promtool check config warns:\n%s", config.out).doesNotContain("WARNING");
        Run rules = promtool(null, "check", "rules", PROMETHEUS.resolve("kvpool-alerts.yml").toString());
        assertThat(rules.exit).as("promtool check rules:\n%s", rules.out).isZero();
        assertThat(rules.out).doesNotContain("WARNING");

        // every rule is an alert with a severity and annotations saying what happened and what to do
        for (JsonNode rule : alertRules()) {
            String name = rule.path("alert").asText();
            assertThat(name).as("a rule without 'alert': %s", rule).isNotEmpty();
            assertThat(rule.path("labels").path("severity").asText()).as("severity of %s", name)
                    .isIn("critical", "warning");
            assertThat(rule.path("annotations").path("summary").asText()).as("summary of %s", name).isNotBlank();
            assertThat(rule.path("annotations").path("description").asText().length())
                    .as("description of %s (what it means and what to do)", name).isGreaterThan(100);
        }
    }

    @Test
    void alertRuleUnitTestsPassAndCoverEveryAlertBothWays() throws Exception {
        Path tests = PROMETHEUS.resolve("kvpool-alerts.test.yml");
        Run run = promtool(null, "test", "rules", tests.toString());
        assertThat(run.exit).as("promtool test rules:\n%s", run.out).isZero();

        Set<String> fires = new TreeSet<>();
        Set<String> staysQuiet = new TreeSet<>();
        for (JsonNode test : YAML.readTree(tests.toFile()).path("tests")) {
            for (JsonNode a : test.path("alert_rule_test")) {
                (a.path("exp_alerts").isEmpty() ? staysQuiet : fires).add(a.path("alertname").asText());
            }
        }
        for (JsonNode rule : alertRules()) {
            String name = rule.path("alert").asText();
            assertThat(fires).as("a case of kvpool-alerts.test.yml where %s fires", name).contains(name);
            assertThat(staysQuiet).as("a healthy case of kvpool-alerts.test.yml where %s does not fire", name)
                    .contains(name);
        }
    }

    @Test
    void dashboardIsWellFormedAndEveryExpressionIsValidPromql() throws Exception {
        JsonNode dash = JSON.readTree(DASHBOARD.toFile());
        assertThat(dash.path("schemaVersion").asInt()).isGreaterThanOrEqualTo(36);
        List<String> variables = new ArrayList<>();
        dash.path("templating").path("list").forEach(v -> variables.add(v.path("name").asText()));
        assertThat(variables).contains("DS_PROMETHEUS", "instance", "segment");
        List<String> rows = new ArrayList<>();
        for (JsonNode p : dash.path("panels")) {
            if (p.path("type").asText().equals("row")) {
                rows.add(p.path("title").asText());
                continue;
            }
            String title = p.path("title").asText();
            assertThat(p.path("datasource").path("uid").asText()).as("datasource of panel '%s'", title)
                    .isEqualTo("${DS_PROMETHEUS}");
            assertThat(p.path("fieldConfig").path("defaults").path("unit").asText()).as("unit of panel '%s'", title)
                    .isNotEmpty();
            assertThat(p.path("targets")).as("queries of panel '%s'", title).isNotEmpty();
        }
        assertThat(rows).hasSize(5);

        // each expression becomes a recording rule, so promtool parses it; Grafana's variables get values first
        Map<String, String> exprs = dashboardExprs(dash);
        StringBuilder rules = new StringBuilder("groups:\n  - name: dashboard\n    rules:\n");
        Map<String, String> recordToWhere = new LinkedHashMap<>();
        int i = 0;
        for (Map.Entry<String, String> e : exprs.entrySet()) {
            String record = "dashboard:expr_" + i++;
            recordToWhere.put(record, e.getKey() + ": " + e.getValue());
            rules.append("      - record: ").append(record).append('\n')
                    .append("        expr: ").append(JSON.writeValueAsString(withGrafanaVariables(e.getValue())))
                    .append('\n');
        }
        Path file = tmp.resolve("dashboard-rules.yml");
        Files.writeString(file, rules);
        Run run = promtool(null, "check", "rules", file.toString());
        if (run.exit != 0) {
            StringBuilder which = new StringBuilder();
            recordToWhere.forEach((record, where) -> {
                if (run.out.contains(record + "\"") || run.out.contains(record + " ") || run.out.contains(record + ":")) {
                    which.append("  ").append(where).append('\n');
                }
            });
            throw new AssertionError("dashboard expressions that are not valid PromQL:\n" + which + "promtool said:\n"
                    + run.out + "\nall expressions by rule:\n" + recordToWhere);
        }
        assertThat(run.out).contains("SUCCESS: " + exprs.size() + " rules found");
    }

    @Test
    void everyEndpointPassesPromtoolCheckMetricsAndExportsJvmMetrics() throws Exception {
        Map<String, String> problems = new TreeMap<>();
        Map<String, String> all = new LinkedHashMap<>(scraped);
        all.putAll(nodeScraped);
        for (Map.Entry<String, String> e : all.entrySet()) {
            Run run = promtool(e.getValue(), "check", "metrics");
            if (run.exit != 0 || !run.out.isBlank()) {
                problems.put(e.getKey(), "exit " + run.exit + ":\n" + run.out);
            }
            Set<String> names = exportedNames(e.getValue());
            for (String jvm : JVM) {
                if (!names.contains(jvm)) {
                    problems.merge(e.getKey(), "does not export " + jvm, (a, b) -> a + "\n" + b);
                }
            }
        }
        assertThat(problems).as("promtool check metrics and JVM metrics, by endpoint").isEmpty();
    }

    @Test
    void alertsAndDashboardUseOnlyMetricsTheEndpointsExport() throws Exception {
        Set<String> exported = new TreeSet<>();
        scraped.values().forEach(body -> exported.addAll(exportedNames(body)));
        nodeScraped.values().forEach(body -> exported.addAll(exportedNames(body)));
        Map<String, String> used = usedMetrics();
        Map<String, String> missing = new TreeMap<>();
        used.forEach((name, where) -> {
            if (!exported.contains(name) && !NOT_EXPORTED.containsKey(name)) {
                missing.put(name, where);
            }
        });
        assertThat(missing).as("metrics used by alerts or dashboard (metric -> where) that no endpoint exports;"
                + " exported:\n%s", exported).isEmpty();
        assertThat(used.keySet()).as("sanity: the extractor finds names").contains("master_objects",
                "engine_time_to_first_token_seconds_bucket", "node_disk_writer_up", "jvm_threads_current");
    }

    @Test
    void nodeEndpointExportsWhatTheAlertsAndDashboardUse() throws Exception {
        assertThat(nodeScraped).as("both nodes' own /metrics were scraped").hasSize(2);
        Set<String> exported = new TreeSet<>();
        nodeScraped.values().forEach(body -> exported.addAll(exportedNames(body)));
        Set<String> used = new TreeSet<>(usedMetrics().keySet());
        used.retainAll(NODE_ENDPOINT);
        assertThat(exported).as("the nodes' endpoints").containsAll(used).containsAll(NODE_ENDPOINT);
    }

    // ---- helpers ----------------------------------------------------------------------------------

    private record Run(int exit, String out) {
    }

    private static String findPromtool() throws Exception {
        Process p = new ProcessBuilder("bash", ROOT.resolve("scripts/prometheus.sh").toString())
                .redirectErrorStream(false).start();
        // the script's progress goes to stderr; drain it so a long apt-get cannot block on a full pipe
        Thread drain = Thread.ofVirtual().start(() -> {
            try {
                p.getErrorStream().transferTo(System.err);
            } catch (IOException ignored) {
                // the process ended
            }
        });
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8).strip();
        if (!p.waitFor(600, TimeUnit.SECONDS)) {
            p.destroyForcibly();
            throw new AssertionError("scripts/prometheus.sh did not finish within 10 minutes");
        }
        drain.join();
        if (p.exitValue() != 0 || out.isEmpty()) {
            throw new AssertionError("scripts/prometheus.sh could not provide promtool (exit " + p.exitValue()
                    + "); install Debian's prometheus package. Its output: " + out);
        }
        return out.lines().reduce((a, b) -> b).orElseThrow();
    }

    /** Runs promtool with {@code stdin} (or nothing) as its input; its stdout and stderr together. */
    private static Run promtool(String stdin, String... args) throws Exception {
        List<String> cmd = new ArrayList<>(List.of(promtool));
        cmd.addAll(List.of(args));
        Process p = new ProcessBuilder(cmd).directory(ROOT.toFile()).redirectErrorStream(true).start();
        Thread feed = Thread.ofVirtual().start(() -> {
            try (var in = p.getOutputStream()) {
                if (stdin != null) {
                    in.write(stdin.getBytes(StandardCharsets.UTF_8));
                }
            } catch (IOException ignored) {
                // promtool stopped reading: its output says why
            }
        });
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        if (!p.waitFor(120, TimeUnit.SECONDS)) {
            p.destroyForcibly();
            throw new AssertionError("promtool " + String.join(" ", args) + " did not finish: " + out);
        }
        feed.join();
        return new Run(p.exitValue(), out);
    }

    private static String get(String url) throws Exception {
        HttpResponse<String> r = HttpClient.newHttpClient().send(HttpRequest.newBuilder(URI.create(url)).build(),
                HttpResponse.BodyHandlers.ofString());
        assertThat(r.statusCode()).as(url).isEqualTo(200);
        return r.body();
    }

    /** Sample names in Prometheus text format (histograms' _bucket, _sum and _count included). */
    static Set<String> exportedNames(String body) {
        Set<String> names = new TreeSet<>();
        for (String line : body.split("\n")) {
            if (line.isBlank() || line.startsWith("#")) {
                continue;
            }
            Matcher m = Pattern.compile("^([a-zA-Z_:][a-zA-Z0-9_:]*)").matcher(line);
            if (m.find()) {
                names.add(m.group(1));
            }
        }
        return names;
    }

    private static List<JsonNode> alertRules() throws IOException {
        List<JsonNode> rules = new ArrayList<>();
        for (JsonNode group : YAML.readTree(PROMETHEUS.resolve("kvpool-alerts.yml").toFile()).path("groups")) {
            group.path("rules").forEach(rules::add);
        }
        assertThat(rules).as("rules in kvpool-alerts.yml").isNotEmpty();
        return rules;
    }

    /** "panel title [refId]" (or "annotation NAME") to its expression, for every expr in the dashboard. */
    private static Map<String, String> dashboardExprs(JsonNode dash) {
        Map<String, String> out = new LinkedHashMap<>();
        collectExprs(dash, "dashboard", out);
        assertThat(out).as("expressions in the dashboard").hasSizeGreaterThan(50);
        return out;
    }

    private static void collectExprs(JsonNode node, String where, Map<String, String> out) {
        if (node.isObject()) {
            String here = node.has("title") ? "panel '" + node.get("title").asText() + "'"
                    : node.has("name") ? "'" + node.get("name").asText() + "'" : where;
            if (node.path("expr").isTextual()) {
                out.put(here + (node.has("refId") ? " [" + node.get("refId").asText() + "]" : ""),
                        node.get("expr").asText());
            }
            node.properties().forEach(e -> collectExprs(e.getValue(), here, out));
        } else if (node.isArray()) {
            node.forEach(n -> collectExprs(n, where, out));
        }
    }

    /** Grafana's variables replaced by values of the right kind, for promtool. */
    static String withGrafanaVariables(String expr) {
        return expr.replace("$__rate_interval", "5m").replace("$__interval", "1m").replace("$__range", "1h")
                .replaceAll("\\$\\{(\\w+)(:\\w+)?}|\\$(\\w+)", "x");
    }

    /** Metric name to where it is used ("alert X", "dashboard panel 'Y' [A]"), over the rules and the dashboard. */
    private static Map<String, String> usedMetrics() throws IOException {
        Map<String, String> used = new TreeMap<>();
        for (JsonNode rule : alertRules()) {
            for (String name : metricNames(rule.path("expr").asText())) {
                used.merge(name, "alert " + rule.path("alert").asText(), (a, b) -> a);
            }
        }
        dashboardExprs(JSON.readTree(DASHBOARD.toFile())).forEach((where, expr) -> {
            for (String name : metricNames(withGrafanaVariables(expr))) {
                used.merge(name, "dashboard " + where, (a, b) -> a);
            }
        });
        return used;
    }

    /** The metric names a valid PromQL expression selects (see the class comment). */
    static Set<String> metricNames(String expr) {
        String s = expr.replaceAll("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`", "\"\"")
                .replaceAll("\\{[^}]*}", " ")
                .replaceAll("\\[[^]]*]", " ")
                .replaceAll("\\b(?:by|without|on|ignoring|group_left|group_right)\\s*\\([^)]*\\)", " ");
        Set<String> names = new TreeSet<>();
        Matcher m = Pattern.compile("(?<![\\w:.])([a-zA-Z_:][\\w:]*)(?![\\w:]|\\s*\\()").matcher(s);
        while (m.find()) {
            String id = m.group(1);
            if (!id.matches("(?i)" + FUNCTION_OR_KEYWORD)) {
                names.add(id);
            }
        }
        return names;
    }
}
