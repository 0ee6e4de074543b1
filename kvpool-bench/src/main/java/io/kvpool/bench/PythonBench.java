package io.kvpool.bench;

import io.kvpool.bench.baseline.RedisServer;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import me.tongfei.progressbar.ProgressBar;
import org.knowm.xchart.BitmapEncoder;
import org.knowm.xchart.CategoryChart;
import org.knowm.xchart.CategoryChartBuilder;
import org.knowm.xchart.style.Styler;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.TimeUnit;

/**
 * The {@code python} section: the Python client ({@code python/kvpool}) against the Java client, numpy's
 * own copy and redis-py, on the same pool, the same Redis and the same shapes, in one run: 1 MiB
 * values in batches of 64 ({@code get_into_batch} into 64 numpy rows, {@code put_batch}), over the
 * same-machine path and over TCP, 1 and 2 clients; {@code batch_exists} of 1024 keys.
 *
 * <p>The Python side is {@code python3 -m kvpool.bench --serve} ({@code python/kvpool/bench.py}): it
 * takes one phase at a time, so each Python figure is measured right after the Java figure it is
 * compared with. Python clients are processes (each its own {@code Client}: no GIL between them);
 * Java clients are threads of this JVM, each its own {@link KvPoolClient}.
 *
 * <p>Then single small operations from one Python process, one call at a time (4 KiB values: {@code put_from}
 * of fresh keys, {@code get_into} and {@code exists} of one of 1,000 stored keys), over the same-machine path
 * and over TCP, each followed at once by redis-py's SET, GET and EXISTS of the same value against the section's
 * Redis; what counts is the p50 latency per call.
 */
final class PythonBench {

    static final int VALUE = 1 << 20;
    static final int BATCH = 64;
    static final int EXISTS_KEYS = 1024;
    /** Single small operations: the value size. */
    static final int SMALL = 4096;
    /** Single small operations: the Python client's call and redis-py's command for each. */
    static final List<String[]> SMALL_OPS = List.of(new String[]{"put", "put_from", "SET"},
            new String[]{"get", "get_into", "GET"}, new String[]{"exists", "exists", "EXISTS"});
    private static final List<Integer> CLIENTS = List.of(1, 2);

    private PythonBench() {
    }

    /** Progress-bar steps the section takes (see {@link #run}). */
    static long steps() {
        return 1 + CLIENTS.size() * 7L + SMALL_OPS.size() + 3;
    }

    /** The interpreter: $KVPOOL_BENCH_PYTHON, else Debian's /usr/bin/python3 (where python3-redis goes). */
    static String python() {
        String p = System.getenv("KVPOOL_BENCH_PYTHON");
        if (p != null && !p.isBlank()) {
            return p;
        }
        return Files.isExecutable(Path.of("/usr/bin/python3")) ? "/usr/bin/python3" : "python3";
    }

    /** The checkout's {@code python} directory (holding {@code kvpool/bench.py}), found like scripts/redis.sh. */
    static Path pythonRoot() throws IOException {
        Path script = RedisServer.locateScript("redis.sh"); // <home>/scripts/redis.sh
        Path root = script.getParent().getParent().resolve("python");
        if (!Files.isRegularFile(root.resolve("kvpool").resolve("bench.py"))) {
            throw new IOException("cannot find python/kvpool/bench.py next to " + script.getParent());
        }
        return root;
    }

    /** Why the Python side cannot run here, or empty if it can. */
    static Optional<String> unavailable() {
        try {
            Path root = pythonRoot();
            ProcessBuilder pb = new ProcessBuilder(python(), "-c", "import numpy, redis, kvpool")
                    .redirectErrorStream(true);
            pb.environment().put("PYTHONPATH", root.toString());
            Process p = pb.start();
            String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8).strip();
            if (!p.waitFor(60, TimeUnit.SECONDS) || p.exitValue() != 0) {
                return Optional.of(python() + " cannot import numpy, redis and kvpool (scripts/python-deps.sh"
                        + " installs them): " + out.substring(Math.max(0, out.length() - 300)));
            }
            return Optional.empty();
        } catch (IOException e) {
            return Optional.of(e.getMessage());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return Optional.of("interrupted");
        }
    }

    private static PythonServer start(String master, RedisServer redis) throws Exception {
        return PythonServer.start(List.of(python(), "-m", "kvpool.bench", "--serve", "--master", master,
                "--redis", redis.host() + ":" + redis.port()), Map.of("PYTHONPATH", pythonRoot().toString()));
    }

    // ------------------------------------------------------------------------------------ the section

    /**
     * Runs the section: its own pool and Redis, a warm-up of both kvpool paths, then for 1 and 2
     * clients each Java figure followed at once by the Python one of the same shape (pool emptied after
     * every phase), numpy's copy, redis-py; then the lookups; then the section's targets.
     */
    static void run(Results results, Duration warmup, Duration duration, Duration targetWarmup, ProgressBar bar)
            throws Exception {
        Optional<String> why = unavailable();
        if (why.isPresent()) {
            results.environment.put("python", "section skipped: " + why.get());
            System.err.println("kvpool bench: skipping the python section: " + why.get());
            return;
        }
        try (PoolProcess pool = PoolProcess.start("6GiB", "1g"); RedisServer redis = RedisServer.start();
             PythonServer py = start(pool.masterAddress(), redis)) {
            results.environment.putIfAbsent("redis", redis.version());
            results.environment.put("python", python() + " " + py.hello().path("python").asText("?"));
            KvpoolTarget tcp = new KvpoolTarget(pool.masterAddress(), false);
            KvpoolTarget shm = new KvpoolTarget(pool.masterAddress(), true);
            // the pool is a JVM: its paths are compiled only after some seconds of traffic
            Duration quarter = targetWarmup.dividedBy(4);
            for (KvpoolTarget t : List.of(shm, tcp)) {
                bar.setExtraMessage(" python: warming the pool (" + t.name() + ")");
                t.putBatched(VALUE, BATCH, 2, Duration.ZERO, quarter);
                t.clear();
                t.getBatched(VALUE, BATCH, 2, Duration.ZERO, quarter);
                t.clear();
            }
            bar.step();
            for (int clients : CLIENTS) {
                String jnote = clients == 1 ? "Java KvPoolClient" : clients + " threads, each its own KvPoolClient";
                String pnote = clients == 1 ? "1 Python process" : clients + " Python processes";
                for (String op : List.of("get", "put")) {
                    for (KvpoolTarget t : List.of(shm, tcp)) {
                        String path = t == shm ? "shm" : "tcp";
                        String what = op.equals("get") ? "getIntoBatch/get_into_batch of " + BATCH + " into "
                                + BATCH + " buffers" : "putBatch/put_batch of " + BATCH + " fresh keys";
                        bar.setExtraMessage(" python: java-" + path + " " + op + " x" + clients);
                        Measurement j = op.equals("get") ? t.getBatched(VALUE, BATCH, clients, warmup, duration)
                                : t.putBatched(VALUE, BATCH, clients, warmup, duration);
                        t.clear();
                        add(results, "java-" + path, op, clients, j, what + "; " + jnote);
                        bar.setExtraMessage(" python: python-" + path + " " + op + " x" + clients);
                        Measurement p = py.phase(op + "-" + path, clients, warmup, duration, null);
                        add(results, "python-" + path, op, clients, p,
                                what + "; " + pnote + (clients == 1 ? "" : ", each its own Client"));
                        bar.step();
                    }
                }
                bar.setExtraMessage(" python: numpy copy x" + clients);
                add(results, "numpy", "get", clients, py.phase("numpy", clients, warmup, duration, null),
                        BATCH + " np.copyto a call from random offsets of a 1 GiB region into the same " + BATCH
                                + " rows; " + pnote);
                bar.step();
                for (String op : List.of("get", "put")) {
                    bar.setExtraMessage(" python: redis-py " + op + " x" + clients);
                    add(results, "redis-py", op, clients, py.phase("redis-" + op, clients, warmup, duration, null),
                            "pipelined " + (op.equals("get") ? "GET of " + BATCH + " of 128 stored keys"
                                    : "SET of " + BATCH + " fresh keys") + "; " + pnote
                                    + (clients == 1 ? "" : ", each its own connection"));
                    bar.step();
                }
            }
            small(results, py, warmup, duration, bar);
            lookups(results, pool, py, warmup, duration, targetWarmup, bar);
        }
        evaluate(results);
    }

    /** Single small operations from one Python process: kvpool over shared memory, over TCP, then redis-py. */
    private static void small(Results results, PythonServer py, Duration warmup, Duration duration, ProgressBar bar)
            throws Exception {
        for (String[] op : SMALL_OPS) {
            String what = op[0].equals("put") ? "fresh keys" : "one of 1,000 stored keys";
            for (String path : List.of("shm", "tcp")) {
                bar.setExtraMessage(" python: " + op[1] + " 4KiB " + path);
                results.add(Results.Row.of("python", "python-" + path, op[1], SMALL, 1,
                        py.phase("small-" + op[0] + "-" + path, 1, warmup, duration, null),
                        op[1] + " of " + what + ", one call at a time; 1 Python process; latency per call"));
            }
            bar.setExtraMessage(" python: redis-py " + op[2] + " 4KiB");
            results.add(Results.Row.of("python", "redis-py", op[2], SMALL, 1,
                    py.phase("redis-small-" + op[2].toLowerCase(Locale.ROOT), 1, warmup, duration, null),
                    op[2] + " of " + what + ", one call at a time, not pipelined; redis-py's defaults; latency per call"));
            bar.step();
        }
    }

    private static void add(Results results, String target, String op, int clients, Measurement m, String note) {
        results.add(Results.Row.of("python", target, op + " x" + BATCH, VALUE, clients, m, note + "; latency per call"));
    }

    private static void lookups(Results results, PoolProcess pool, PythonServer py, Duration warmup, Duration duration,
                                Duration targetWarmup, ProgressBar bar) throws Exception {
        List<String> keys = new ArrayList<>(EXISTS_KEYS);
        List<MemorySegment> values = new ArrayList<>(EXISTS_KEYS);
        for (int i = 0; i < EXISTS_KEYS; i++) {
            keys.add(new String(MetadataBench.key(i), StandardCharsets.US_ASCII));
            values.add(MemorySegment.ofArray(new byte[64]));
        }
        Duration d = duration.multipliedBy(2);
        try (KvPoolClient c = KvPoolClient.connect(pool.masterAddress())) {
            c.removeAll(true);
            for (PutStatus st : c.putBatch(keys, values)) {
                if (st != PutStatus.OK) {
                    throw new IllegalStateException("storing lookup keys: " + st);
                }
            }
            // this JVM's batchExists path has not run yet: compile it before the first measurement
            bar.setExtraMessage(" python: warming batchExists");
            KvpoolTarget.batchExists(pool.masterAddress(), keys, 2, Duration.ZERO, targetWarmup.dividedBy(2));
            bar.step();
            for (int clients : CLIENTS) {
                bar.setExtraMessage(" python: batchExists x" + clients);
                results.add(lookupRow("java", "batchExists", clients, KvpoolTarget.batchExists(pool.masterAddress(), keys, clients, warmup, d)));
                // the Python side empties the pool and stores the same keys again for itself
                Measurement p = py.phase("exists", clients, warmup, d, keys);
                results.add(lookupRow("python", "batch_exists", clients, p));
                Measurement r = py.phase("redis-exists", clients, warmup, d, keys);
                results.add(lookupRow("redis-py", "pipelined EXISTS", clients, r));
                if (clients != CLIENTS.getLast()) {
                    c.putBatch(keys, values);
                }
                bar.step();
            }
        }
    }

    private static Results.Row lookupRow(String target, String op, int clients, Measurement m) {
        return new Results.Row("python", target, op, 0, clients, Double.NaN, m.opsPerSecond() * EXISTS_KEYS,
                m.percentileMicros(0.50), m.percentileMicros(0.99), EXISTS_KEYS + " keys a call (81-byte keys);"
                        + " ops/s = keys/s; " + (target.equals("java") ? "threads" : "processes"));
    }

    // ------------------------------------------------------------------------------------ targets

    private static Optional<Results.Row> find(Results r, String target, String op, int clients) {
        return r.find("python", target, op, op.startsWith("get") || op.startsWith("put") ? VALUE : 0, clients);
    }

    /**
     * Single small operations: each kvpool path's p50 at most redis-py's for the same command, and the
     * same-machine path's p50 at most TCP's for the calls that move bytes (an {@code exists} asks the master
     * either way).
     */
    static void evaluateSmall(Results r) {
        for (String[] op : SMALL_OPS) {
            Optional<Results.Row> redis = r.find("python", "redis-py", op[2], SMALL, 1);
            for (String path : List.of("shm", "tcp")) {
                Optional<Results.Row> kv = r.find("python", "python-" + path, op[1], SMALL, 1);
                atMost(r, "py " + op[1] + " 4KiB " + path.toUpperCase(Locale.ROOT) + " p50 vs redis-py " + op[2],
                        kv, redis);
            }
            if (!op[0].equals("exists")) {
                atMost(r, "py " + op[1] + " 4KiB p50: SHM vs TCP", r.find("python", "python-shm", op[1], SMALL, 1),
                        r.find("python", "python-tcp", op[1], SMALL, 1));
            }
        }
    }

    /** {@code num} p50 / {@code den} p50, met when at most 1. */
    private static void atMost(Results r, String name, Optional<Results.Row> num, Optional<Results.Row> den) {
        if (num.isPresent() && den.isPresent()) {
            double x = num.get().p50Micros() / den.get().p50Micros();
            r.checks.add(new Results.Check(name, x, "x", "<= 1.0x", x <= 1, String.format(Locale.ROOT,
                    "%s p50 %.1f us (p99 %.0f), %s p50 %.1f us (p99 %.0f)", num.get().target(), num.get().p50Micros(),
                    num.get().p99Micros(), den.get().target(), den.get().p50Micros(), den.get().p99Micros())));
        }
    }

    static void evaluate(Results r) {
        String g = "get x" + BATCH;
        String p = "put x" + BATCH;
        for (int c : CLIENTS) {
            String n = ", " + c + " client" + (c == 1 ? "" : "s");
            r.ratio("py get_into_batch shm" + n + " vs numpy copy", find(r, "python-shm", g, c),
                    find(r, "numpy", g, c), 0.7);
            r.ratio("py get_into_batch TCP" + n + " vs Java client", find(r, "python-tcp", g, c),
                    find(r, "java-tcp", g, c), 0.7);
            r.ratio("py put_batch shm" + n + " vs Java client", find(r, "python-shm", p, c),
                    find(r, "java-shm", p, c), 0.8);
            r.ratio("py put_batch TCP" + n + " vs Java client", find(r, "python-tcp", p, c),
                    find(r, "java-tcp", p, c), 0.7);
            latency(r, "py batch_exists p50" + n + " vs Java client", find(r, "python", "batch_exists", c),
                    find(r, "java", "batchExists", c));
            for (String path : List.of("shm", "tcp")) {
                r.ratio("py get_into_batch " + path.toUpperCase(Locale.ROOT) + n + " vs redis-py",
                        find(r, "python-" + path, g, c), find(r, "redis-py", g, c), 2.0);
                r.ratio("py put_batch " + path.toUpperCase(Locale.ROOT) + n + " vs redis-py",
                        find(r, "python-" + path, p, c), find(r, "redis-py", p, c), 2.0);
            }
            var py = find(r, "python", "batch_exists", c);
            var redis = find(r, "redis-py", "pipelined EXISTS", c);
            if (py.isPresent() && redis.isPresent()) {
                double x = redis.get().p50Micros() / py.get().p50Micros();
                r.checks.add(new Results.Check("py batch_exists p50" + n + " vs redis-py EXISTS", x, "x", ">= 2.0x",
                        x >= 2, String.format(Locale.ROOT, "redis-py p50 %.0f us, python p50 %.0f us",
                        redis.get().p50Micros(), py.get().p50Micros())));
            }
        }
        evaluateSmall(r);
    }

    /** python p50 / java p50, met when within 2x. */
    private static void latency(Results r, String name, Optional<Results.Row> py, Optional<Results.Row> java) {
        if (py.isPresent() && java.isPresent()) {
            double x = py.get().p50Micros() / java.get().p50Micros();
            r.checks.add(new Results.Check(name, x, "x", "<= 2.0x", x <= 2, String.format(Locale.ROOT,
                    "python p50 %.0f us (p99 %.0f), java p50 %.0f us (p99 %.0f)", py.get().p50Micros(),
                    py.get().p99Micros(), java.get().p50Micros(), java.get().p99Micros())));
        }
    }

    /** One chart per op (GB/s by client count, a bar per target), if the section ran. */
    static void charts(Results results, Path dir) throws IOException {
        for (String op : List.of("get x" + BATCH, "put x" + BATCH)) {
            List<Results.Row> sel = results.rows.stream().filter(r -> r.section().equals("python") && r.op().equals(op))
                    .toList();
            if (sel.isEmpty()) {
                continue;
            }
            List<String> targets = sel.stream().map(Results.Row::target).distinct().toList();
            List<String> xs = CLIENTS.stream().map(String::valueOf).toList();
            CategoryChart chart = new CategoryChartBuilder().width(900).height(480)
                    .title("Python client: " + op + " of 1 MiB values (this machine, one run)")
                    .xAxisTitle("concurrent clients").yAxisTitle("GB/s").build();
            chart.getStyler().setLegendPosition(Styler.LegendPosition.OutsideE);
            chart.getStyler().setAvailableSpaceFill(0.85);
            chart.getStyler().setOverlapped(false);
            for (String t : targets) {
                List<Double> ys = new ArrayList<>();
                for (int c : CLIENTS) {
                    ys.add(sel.stream().filter(r -> r.target().equals(t) && r.clients() == c)
                            .map(Results.Row::gbPerSec).findFirst().orElse(0.0));
                }
                chart.addSeries(t, xs, ys);
            }
            BitmapEncoder.saveBitmap(chart, dir.resolve("python-" + op.replace(" ", "") + "-1MiB.png").toString(),
                    BitmapEncoder.BitmapFormat.PNG);
        }
    }
}
