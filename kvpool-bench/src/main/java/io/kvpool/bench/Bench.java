package io.kvpool.bench;

import io.kvpool.bench.baseline.MemcpyTarget;
import io.kvpool.bench.baseline.RawTcpTarget;
import io.kvpool.bench.baseline.RedisLookup;
import io.kvpool.bench.baseline.RedisServer;
import io.kvpool.bench.baseline.RedisTarget;
import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.config.Size;
import io.kvpool.protocol.KeyDigest;
import io.kvpool.protocol.Keys;
import me.tongfei.progressbar.ProgressBar;
import me.tongfei.progressbar.ProgressBarBuilder;
import me.tongfei.progressbar.ProgressBarStyle;

import java.io.PrintStream;
import java.lang.foreign.MemorySegment;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.time.LocalDateTime;
import java.time.format.DateTimeFormatter;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.function.Supplier;
import java.util.function.ToIntFunction;

/**
 * {@code kvpool bench}: kvpool measured against this machine's ceilings and Redis, every figure
 * next to its baseline from the same run.
 *
 * <ul>
 *   <li><b>store</b>: put and get throughput and latency for 64 KiB, 1 MiB and 4 MiB values with 1,
 *       2 and 8 clients: kvpool over TCP and over the same-machine path, Redis 7 through Jedis, raw
 *       loopback TCP between two JVMs, raw memory copy.</li>
 *   <li><b>lookup</b>: batchExists and prefixMatch over 1024 keys (a 16K-token prompt at 16 tokens a
 *       block) against Redis pipelined EXISTS of the same keys.</li>
 *   <li><b>metadata</b>: one master holding 10 million objects: heap per object, batched put and
 *       existence-check rates.</li>
 *   <li><b>reset</b>: removeAll(force) of 1 million objects.</li>
 *   <li><b>python</b>: the Python client against the Java client, numpy and redis-py ({@link PythonBench}).</li>
 *   <li><b>rolling</b>: a rolling restart of 2 elected masters and 3 nodes under traffic
 *       ({@link RollingRestartBench}).</li>
 *   <li><b>mooncake</b>: the real Mooncake Store against kvpool's Mooncake-compatible module, one workload
 *       through both ({@link MooncakeBench}).</li>
 *   <li><b>degraded</b>: the reference engine's TTFT with a frozen node, a partitioned master and a slow link,
 *       against no pool ({@link DegradedDrill}).</li>
 *   <li><b>scale</b>: one master against 1,000 simulated nodes: heap per object, lookups and commits per master
 *       core, heartbeat cost, eviction, node loss, a standby's catch-up and failover at size ({@link ScaleBench}).</li>
 * </ul>
 * The pool under test, Redis and the raw TCP server each run in their own process.
 */
public final class Bench {

    /** What to run and where to write it. */
    public record Options(boolean quick, Set<String> sections, Path outDir, PrintStream out, Path diskDir) {
        public static final Set<String> ALL = Set.of("store", "lookup", "metadata", "reset", "disk", "restore", "python",
                "failover", "replicas", "tls", "mooncake", "rolling", "restarts", "degraded", "scale");

        public Options {
            for (String s : sections) {
                if (!ALL.contains(s)) {
                    throw new IllegalArgumentException("unknown bench section '" + s + "'; sections are " + ALL);
                }
            }
        }
    }

    private final Options o;
    private final Results results = new Results();
    private ProgressBar bar;

    private Bench(Options o) {
        this.o = o;
    }

    /** Runs the benchmark and returns the directory holding results.json, results.csv and the charts. */
    public static Path run(Options options) throws Exception {
        return new Bench(options).runAll();
    }

    private List<Integer> clientCounts() {
        return o.quick ? List.of(1, 2) : List.of(1, 2, 8);
    }

    private List<Integer> sizes() {
        return o.quick ? List.of(1 << 20) : List.of(64 << 10, 1 << 20, 4 << 20);
    }

    private Duration warmup() {
        return Duration.ofMillis(o.quick ? 300 : 500);
    }

    private Duration duration() {
        return Duration.ofMillis(o.quick ? 700 : 2000);
    }

    /**
     * Untimed traffic each target gets before its first measurement: the pool and the raw TCP server
     * are JVMs whose hot paths are compiled only after a few seconds of traffic; Redis is native and
     * does not need it, but gets it too.
     */
    private Duration targetWarmup() {
        return Duration.ofSeconds(o.quick ? 3 : 6);
    }

    private long metadataObjects() {
        return o.quick ? 1_000_000 : 10_000_000;
    }

    private long resetObjects() {
        return o.quick ? 200_000 : 1_000_000;
    }

    private Path runAll() throws Exception {
        Path dir = o.outDir.resolve(LocalDateTime.now().format(DateTimeFormatter.ofPattern("yyyyMMdd-HHmmss")));
        Files.createDirectories(dir);
        results.environment.put("mode", o.quick ? "quick" : "full");
        results.environment.put("java", Runtime.version().toString());
        results.environment.put("cpus", Runtime.getRuntime().availableProcessors());
        results.environment.put("os", System.getProperty("os.name") + " " + System.getProperty("os.version"));
        int targets = 5;
        Map<String, Long> perSection = Map.ofEntries(Map.entry("store", (long) sizes().size() * clientCounts().size()
                * targets * 2 + 3L * clientCounts().size() + 2 + SmallObjectBench.steps() + 1), Map.entry("lookup", 4L),
                Map.entry("metadata", 4L), Map.entry("reset", 2L), Map.entry("disk", 1L), Map.entry("restore", 6L + 4),
                Map.entry("python", (long) PythonBench.steps()), Map.entry("mooncake", (long) MooncakeBench.steps()),
                Map.entry("failover", (long) FailoverBench.steps(o.quick)), Map.entry("replicas", 1L),
                Map.entry("rolling", 1L), Map.entry("restarts", 1L), Map.entry("degraded", 1L),
                Map.entry("tls", (long) TlsBench.steps()), Map.entry("scale", (long) ScaleBench.steps(o.quick)));
        long steps = o.sections.stream().mapToLong(x -> perSection.getOrDefault(x, 0L)).sum();
        try (ProgressBar pb = new ProgressBarBuilder().setTaskName("bench").setInitialMax(steps)
                .setStyle(ProgressBarStyle.ASCII).setUpdateIntervalMillis(500).continuousUpdate().build()) {
            bar = pb;
            if (o.sections.contains("store") || o.sections.contains("lookup")) {
                section("store and lookup", () -> {
                    try (PoolProcess pool = PoolProcess.start("6GiB", "1g"); RedisServer redis = RedisServer.start()) {
                        results.environment.put("redis", redis.version());
                        if (o.sections.contains("store")) {
                            store(pool, redis);
                        }
                        if (o.sections.contains("lookup")) {
                            lookup(pool, redis);
                        }
                    }
                });
            }
            sectionIf("metadata", () -> MetadataBench.run(results, metadataObjects(), o.quick ? "2g" : "6g", warmup(),
                    duration(), this::step));
            sectionIf("reset", this::reset);
            sectionIf("disk", this::disk);
            sectionIf("restore", () -> RestoreSection.run(results, bar, o.quick, targetWarmup()));
            sectionIf("python", () -> PythonBench.run(results, warmup(), duration(), targetWarmup(), bar));
            sectionIf("mooncake", () -> MooncakeBench.run(results, warmup(), duration(), bar));
            sectionIf("replicas", () -> {
                ReplicaBench.run(results, warmup(), duration(), targetWarmup(), bar);
                step("replicas");
            });
            sectionIf("tls", () -> TlsBench.run(results, warmup(), duration(), targetWarmup(), bar));
            sectionIf("failover", () -> {
                bar.setExtraMessage(" failover");
                FailoverBench.run(results, o.quick, () -> step("failover"));
            });
            sectionIf("rolling", () -> {
                bar.setExtraMessage(" rolling restart");
                RollingRestartBench.run(results, o.quick, () -> step("rolling"));
            });
            sectionIf("degraded", () -> {
                bar.setExtraMessage(" a frozen node, a partitioned master, a slow link");
                DegradedDrill.run(results, o.quick);
                step("degraded");
            });
            sectionIf("scale", () -> {
                bar.setExtraMessage(" one master, " + ScaleBench.NODES + " simulated nodes");
                ScaleBench.run(results, o.quick, () -> step("scale"));
            });
            sectionIf("restarts", () -> {
                bar.setExtraMessage(" rolling restarts under every kind of writer");
                RestartDrill.run(results, o.quick, () -> step("restarts"));
            });
        }
        evaluate();
        results.print(o.out);
        results.writeJson(dir.resolve("results.json"));
        results.writeCsv(dir.resolve("results.csv"));
        for (String op : List.of("get", "put")) {
            for (int size : sizes()) {
                results.chart(dir, op, size);
            }
        }
        PythonBench.charts(results, dir);
        o.out.println();
        o.out.println("results: " + dir.resolve("results.json") + ", " + dir.resolve("results.csv") + ", charts in " + dir);
        if (!failedSections.isEmpty()) {
            throw new IllegalStateException(failedSections.size() + " section(s) failed (the others' results are in "
                    + dir + "): " + String.join("; ", failedSections));
        }
        return dir;
    }

    /** A section's body: anything it throws fails that section only. */
    private interface Section {
        void run() throws Exception;
    }

    /** Sections that failed in this run (the command then exits non-zero, after writing what the others measured). */
    final List<String> failedSections = new ArrayList<>();

    private void sectionIf(String name, Section body) {
        if (o.sections.contains(name)) {
            section(name, body);
        }
    }

    /**
     * Runs one section; if it fails, says so in the results (a failed check naming the section and why)
     * and goes on with the next, so a late failure does not lose what the earlier sections measured.
     */
    private void section(String name, Section body) {
        try {
            body.run();
        } catch (Exception | AssertionError e) {
            String why = e.getMessage() == null ? e.toString() : e.getMessage();
            failedSections.add(name + ": " + why);
            results.checks.add(new Results.Check("section " + name + " ran", 0, "", "ran", false, "FAILED: " + why));
            o.out.println();
            o.out.println("kvpool bench: section " + name + " failed: " + why);
        }
    }

    private void step(String what) {
        bar.setExtraMessage(" " + what);
        bar.step();
    }

    // ------------------------------------------------------------------ store

    private void store(PoolProcess pool, RedisServer redis) throws Exception {
        List<Supplier<StoreTarget>> targets = List.of(
                () -> new KvpoolTarget(pool.masterAddress(), false),
                () -> new KvpoolTarget(pool.masterAddress(), true),
                () -> new RedisTarget(redis),
                () -> {
                    try {
                        return RawTcpTarget.start();
                    } catch (Exception e) {
                        throw new IllegalStateException("cannot start the raw TCP baseline: " + e.getMessage(), e);
                    }
                },
                MemcpyTarget::new);
        // small objects against the wire, pipelined alike and measured interleaved (SmallObjectBench)
        try (KvpoolTarget kv = new KvpoolTarget(pool.masterAddress(), false); RawTcpTarget raw = RawTcpTarget.start()) {
            warm(kv);
            warm(raw);
            bar.setExtraMessage(" small objects: kvpool-tcp and raw-tcp interleaved");
            SmallObjectBench.run(results, kv, raw, o.quick ? 3 : 5, warmup(), duration(), bar::step);
        }
        try (PoolProcess small = PoolProcess.start(SmallObjectBench.FULL_POOL, "1g");
             KvpoolTarget full = new KvpoolTarget(small.masterAddress(), false)) {
            bar.setExtraMessage(" small objects: 4 KiB puts on a full pool");
            SmallObjectBench.fullPool(results, full, warmup(), duration());
            bar.step();
        }
        // engines load a prompt's cached blocks together: batched gets, one master round trip per batch
        for (boolean shm : new boolean[]{false, true}) {
            KvpoolTarget t = new KvpoolTarget(pool.masterAddress(), shm);
            warm(t);
            for (int clients : clientCounts()) {
                bar.setExtraMessage(" " + t.name() + " get x" + GET_BATCH + " x" + clients);
                Measurement m = t.getBatched(1 << 20, GET_BATCH, clients, warmup(), duration());
                results.add(Results.Row.of("store", t.name(), "get x" + GET_BATCH, 1 << 20, clients, m,
                        "getIntoBatch of " + GET_BATCH + " values a call; latency is per call"));
                t.clear();
                Measurement p = t.putBatched(1 << 20, PUT_BATCH, clients, warmup(), duration());
                results.add(Results.Row.of("store", t.name(), "put x" + PUT_BATCH, 1 << 20, clients, p,
                        "putBatch of " + PUT_BATCH + " values a call; latency is per call"));
                t.clear();
                bar.step();
            }
        }
        // the same puts through the two-phase path (PUT_START, write, PUT_END), for the write leases' gain in this run
        for (boolean shm : new boolean[]{false, true}) {
            try (KvpoolTarget t = new KvpoolTarget(pool.masterAddress(), shm, false)) {
                warm(t);
                for (int size : sizes()) {
                    for (int clients : clientCounts()) {
                        bar.setExtraMessage(" " + t.name() + " put " + Size.ofBytes(size) + " x" + clients);
                        results.add(Results.Row.of("store", t.name(), "put", size, clients,
                                t.put(size, clients, warmup(), duration()), "two-phase put (no write lease)"));
                        t.clear();
                    }
                }
            }
            bar.step();
        }
        for (Supplier<StoreTarget> make : targets) {
            try (StoreTarget t = make.get()) {
                warm(t);
                if (t instanceof MemcpyTarget mc) {
                    for (int clients : clientCounts()) {
                        Measurement m = mc.getBatched(1 << 20, GET_BATCH, clients, warmup(), duration());
                        results.add(Results.Row.of("store", t.name(), "get x" + GET_BATCH, 1 << 20, clients, m,
                                GET_BATCH + " copies a call into " + GET_BATCH + " distinct destinations"));
                        bar.step();
                    }
                }
                for (int size : sizes()) {
                    for (int clients : clientCounts()) {
                        for (String op : List.of("put", "get")) {
                            bar.setExtraMessage(" " + t.name() + " " + op + " " + Size.ofBytes(size) + " x" + clients);
                            Measurement m = op.equals("put") ? t.put(size, clients, warmup(), duration())
                                    : t.get(size, clients, warmup(), duration());
                            results.add(Results.Row.of("store", t.name(), op, size, clients, m, null));
                            t.clear();
                            bar.step();
                        }
                    }
                }
            }
        }
    }

    /**
     * Values per batched get: the cached blocks of a prompt loaded together (64 blocks of 16 tokens is
     * a 1024-token prefix; a 16K-token prompt has 1024 such blocks).
     */
    static final int GET_BATCH = 64;

    /** Values per batched put: an engine saving the new blocks of a request after its prefill. */
    static final int PUT_BATCH = 16;

    private void warm(StoreTarget t) throws Exception {
        bar.setExtraMessage(" warming " + t.name());
        Duration half = targetWarmup().dividedBy(2);
        t.put(1 << 20, 2, Duration.ZERO, half);
        t.clear();
        t.get(1 << 20, 2, Duration.ZERO, half);
        t.clear();
        if (t instanceof KvpoolTarget k) {
            // the batched forms run other code (frames cut into lanes, parallel reads): warm them too,
            // or the rows measured first measure the JIT
            k.putBatched(1 << 20, PUT_BATCH, 2, Duration.ZERO, half);
            k.clear();
            k.getBatched(1 << 20, GET_BATCH, 2, Duration.ZERO, half);
            k.clear();
        }
    }

    // ------------------------------------------------------------------ lookup

    private static final int LOOKUP_KEYS = 1024;
    /** Rounds of prefixMatch, prefixMatchDigests and Redis's EXISTS, one after another in each. */
    private static final int LOOKUP_ROUNDS = 3;

    private void lookup(PoolProcess pool, RedisServer redis) throws Exception {
        List<String> keys = new ArrayList<>(LOOKUP_KEYS);
        for (int i = 0; i < LOOKUP_KEYS; i++) {
            keys.add(new String(MetadataBench.key(i), StandardCharsets.US_ASCII));
        }
        try (KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster(pool.masterAddress()))) {
            c.removeAll(true);
            List<MemorySegment> values = new ArrayList<>();
            for (int i = 0; i < LOOKUP_KEYS; i++) {
                values.add(MemorySegment.ofArray(new byte[64]));
            }
            for (PutStatus st : c.putBatch(keys, values)) {
                if (st != PutStatus.OK) {
                    throw new IllegalStateException("storing lookup keys: " + st);
                }
            }
        }
        Measurement exists = KvpoolTarget.batchExists(pool.masterAddress(), keys, 1, warmup(), duration().multipliedBy(2));
        results.add(lookupRow("kvpool", "batchExists", exists, 1));
        step("lookup batchExists");
        // what the connector calls: it digests a request's keys once and asks with the digests each step
        long[] digests = new long[2 * LOOKUP_KEYS];
        for (int i = 0; i < LOOKUP_KEYS; i++) {
            byte[] k = Keys.encode(keys.get(i));
            KeyDigest.digest(k, 0, k.length, digests, 2 * i);
        }
        RedisLookup rl = new RedisLookup(redis);
        rl.store(keys);
        // the three in rounds, one after another in each: a latency of ~100 us swings 2-3x between stretches of
        // this machine (which CPUs the scheduler puts the two ends on), so each gets the same share of them
        Measurement[] prefix = new Measurement[LOOKUP_ROUNDS];
        Measurement[] byDigest = new Measurement[LOOKUP_ROUNDS];
        Measurement[] redisExists = new Measurement[LOOKUP_ROUNDS];
        Duration slice = duration().multipliedBy(2).dividedBy(LOOKUP_ROUNDS);
        int redisCalls = (int) Math.max(200, exists.ops() / LOOKUP_ROUNDS);
        for (int r = 0; r < LOOKUP_ROUNDS; r++) {
            Duration warm = r == 0 ? warmup() : warmup().dividedBy(4);
            prefix[r] = prefixMatches(pool, c -> c.prefixMatch(keys), warm, slice);
            byDigest[r] = prefixMatches(pool, c -> c.prefixMatchDigests(digests, 0, LOOKUP_KEYS), warm, slice);
            redisExists[r] = rl.pipelinedExists(keys, redisCalls, warm);
        }
        results.add(lookupRow("kvpool", "prefixMatch", SmallObjectBench.sum(prefix)));
        step("lookup prefixMatch");
        results.add(lookupRow("kvpool", "prefixMatchDigests", SmallObjectBench.sum(byDigest)));
        step("lookup prefixMatchDigests");
        results.add(lookupRow("redis", "pipelined EXISTS", SmallObjectBench.sum(redisExists)));
        step("lookup redis");
    }

    /** One client calling {@code match} over and over; each call must find every lookup key. */
    private static Measurement prefixMatches(PoolProcess pool, ToIntFunction<KvPoolClient> match, Duration warmup,
                                             Duration duration) throws Exception {
        return Load.run(1, warmup, duration, id -> new Load.Client() {
            final KvPoolClient c = KvPoolClient.connect(pool.masterAddress());

            @Override
            public Load.Op op() {
                return i -> {
                    if (match.applyAsInt(c) != LOOKUP_KEYS) {
                        throw new IllegalStateException("a prefix match did not match every stored key");
                    }
                    return 0;
                };
            }

            @Override
            public void close() {
                c.close();
            }
        });
    }

    private static Results.Row lookupRow(String target, String op, Measurement m) {
        return lookupRow(target, op, m, LOOKUP_ROUNDS);
    }

    private static Results.Row lookupRow(String target, String op, Measurement m, int rounds) {
        return new Results.Row("lookup", target, op, 0, 1, Double.NaN, m.opsPerSecond() * LOOKUP_KEYS,
                m.percentileMicros(0.50), m.percentileMicros(0.99), LOOKUP_KEYS + " keys a call; ops/s = keys/s"
                + (rounds > 1 ? "; " + rounds + " rounds interleaved with the other lookup rows" : ""));
    }

    // ------------------------------------------------------------------ reset

    private void reset() throws Exception {
        long n = resetObjects();
        try (PoolProcess pool = PoolProcess.start("1GiB", "2g");
             KvPoolClient c = KvPoolClient.connect(pool.masterAddress())) {
            bar.setExtraMessage(" reset: storing " + n + " objects");
            MemorySegment v = MemorySegment.ofArray(new byte[64]);
            int batch = 8192;
            for (long from = 0; from < n; from += batch) {
                int k = (int) Math.min(batch, n - from);
                List<String> keys = new ArrayList<>(k);
                List<MemorySegment> values = new ArrayList<>(k);
                for (long i = from; i < from + k; i++) {
                    keys.add(new String(MetadataBench.key(i), StandardCharsets.US_ASCII));
                    values.add(v);
                }
                for (PutStatus st : c.putBatch(keys, values)) {
                    if (st != PutStatus.OK) {
                        throw new IllegalStateException("storing objects for the reset: " + st);
                    }
                }
            }
            // healthy readers that remember where objects are: the reset must reach each of them (read
            // leases) before it returns, so their acknowledgements are part of what is measured
            List<KvPoolClient> readers = new ArrayList<>();
            try {
                for (int r = 0; r < RESET_READERS; r++) {
                    KvPoolClient reader = KvPoolClient.connect(pool.masterAddress());
                    readers.add(reader);
                    List<String> keys = new ArrayList<>(4096);
                    for (long i = r * 4096L; i < (r + 1) * 4096L && i < n; i++) {
                        keys.add(new String(MetadataBench.key(i), StandardCharsets.US_ASCII));
                    }
                    reader.getBatch(keys);
                }
                step("reset: filled");
                long t0 = System.nanoTime();
                long removed = c.removeAll(true);
                double ms = (System.nanoTime() - t0) / 1e6;
                if (removed != n || c.stats().keys() != 0) {
                    throw new IllegalStateException("removeAll removed " + removed + " of " + n);
                }
                results.add(new Results.Row("reset", "kvpool", "removeAll(force)", 64, 1, Double.NaN, Double.NaN, ms * 1000,
                        Double.NaN, String.format(Locale.ROOT, "%.0f ms for %d objects (node reset and %d leased clients'"
                                + " acknowledgements included)", ms, n, RESET_READERS + 1)));
            } finally {
                for (KvPoolClient reader : readers) {
                    reader.close();
                }
            }
            step("reset: done");
        }
    }

    /** Clients holding read leases (and remembered locations) during the reset. */
    private static final int RESET_READERS = 4;

    // ------------------------------------------------------------------ disk

    private void disk() throws Exception {
        bar.setExtraMessage(" disk: fio, spill, read-back");
        long bytes = o.quick ? 512L << 20 : 2L << 30;
        DiskBench.Result r = DiskBench.run(o.diskDir, bytes, o.quick ? 1 : 3);
        String note = DiskBench.describe(r) + "; in " + o.diskDir;
        results.add(new Results.Row("disk", "fio", "sequential write", 1 << 20, 16, r.fioWrite() / 1e9, Double.NaN,
                Double.NaN, Double.NaN, "O_DIRECT, libaio, queue depth 16"));
        results.add(new Results.Row("disk", "fio", "sequential read", 1 << 20, 16, r.fioRead() / 1e9, Double.NaN,
                Double.NaN, Double.NaN, "O_DIRECT, libaio, queue depth 16"));
        results.add(new Results.Row("disk", "kvpool", "spill write", 1 << 20, 1, r.spill() / 1e9, Double.NaN,
                Double.NaN, Double.NaN, note));
        results.add(new Results.Row("disk", "kvpool", "read-back", 1 << 20, 1, r.readBack() / 1e9, Double.NaN,
                Double.NaN, Double.NaN, note + "; every checksum verified"));
        bar.step();
    }

    // ------------------------------------------------------------------ targets

    private void evaluate() {
        long mib = 1 << 20;
        long kib64 = 64 << 10;
        for (String op : List.of("get", "put")) {
            results.ratio("1 MiB " + op + " over TCP, 2 clients, vs Redis",
                    results.find("store", "kvpool-tcp", op, mib, 2), results.find("store", "redis", op, mib, 2), 1.5);
            results.ratio("1 MiB " + op + " over TCP, 2 clients, vs raw loopback TCP",
                    results.find("store", "kvpool-tcp", op, mib, 2), results.find("store", "raw-tcp", op, mib, 2),
                    op.equals("put") ? 0.9 : 0.8);
            results.ratio("64 KiB " + op + " over TCP, 2 clients, vs raw loopback TCP",
                    results.find("store", "kvpool-tcp", op, kib64, 2), results.find("store", "raw-tcp", op, kib64, 2), 0.7);
            results.ratio("64 KiB " + op + " over TCP, 2 clients, vs Redis",
                    results.find("store", "kvpool-tcp", op, kib64, 2), results.find("store", "redis", op, kib64, 2), 3);
        }
        results.ratio("1 MiB put x" + PUT_BATCH + " (putBatch) over TCP, 2 clients, vs raw loopback TCP put",
                results.find("store", "kvpool-tcp", "put x" + PUT_BATCH, mib, 2), results.find("store", "raw-tcp", "put", mib, 2),
                0.8);
        results.ratio("1 MiB put x" + PUT_BATCH + " (putBatch) over TCP, 2 clients, vs the same puts one by one",
                results.find("store", "kvpool-tcp", "put x" + PUT_BATCH, mib, 2), results.find("store", "kvpool-tcp", "put", mib, 2),
                1.0);
        for (int clients : clientCounts()) {
            results.ratio("1 MiB get x" + GET_BATCH + ", same machine, " + clients + " client(s), vs memory copy",
                    results.find("store", "kvpool-shm", "get x" + GET_BATCH, mib, clients),
                    results.find("store", "memcpy", "get x" + GET_BATCH, mib, clients), 0.7);
            results.ratio("1 MiB single get, same machine, " + clients + " client(s), vs memory copy",
                    results.find("store", "kvpool-shm", "get", mib, clients),
                    results.find("store", "memcpy", "get", mib, clients), 0.7);
            results.ratio("1 MiB put, same machine, " + clients + " client(s), vs memory copy",
                    results.find("store", "kvpool-shm", "put", mib, clients),
                    results.find("store", "memcpy", "put", mib, clients), 0.5);
        }
        for (String op : List.of("put", "get")) {
            for (int size : TlsBench.SIZES) {
                for (int clients : TlsBench.CLIENTS) {
                    // a plain 1 MiB get is a gathering write from the segment at memory speed; in TLS every
                    // byte is encrypted by the node and decrypted by the client, on the same two vCPUs
                    double goal = op.equals("get") && size >= 1 << 20 ? 0.15 : 0.3;
                    results.ratio(Size.human(size) + " " + op + ", " + clients + " client(s), in mutual TLS vs plain TCP",
                            results.find("tls", "kvpool-tls", op, size, clients),
                            results.find("tls", "kvpool-tcp", op, size, clients), goal);
                }
            }
        }
        results.ratio("SSD spill write vs fio sequential write", results.find("disk", "kvpool", "spill write", mib, 1),
                results.find("disk", "fio", "sequential write", mib, 16), 0.7);
        results.ratio("SSD read-back vs fio sequential read", results.find("disk", "kvpool", "read-back", mib, 1),
                results.find("disk", "fio", "sequential read", mib, 16), 0.7);
        var prefix = results.rows.stream().filter(r -> r.section().equals("lookup") && r.op().equals("prefixMatch")).findFirst();
        var redis = results.rows.stream().filter(r -> r.section().equals("lookup") && r.target().equals("redis")).findFirst();
        prefix.ifPresent(p -> results.checks.add(new Results.Check("prefixMatch over 1024 keys: p50 latency",
                p.p50Micros(), "us", "<= 100 us", p.p50Micros() <= 100, "p99 " + fmt(p.p99Micros()) + " us")));
        prefix.ifPresent(p -> results.checks.add(new Results.Check("prefixMatch over 1024 keys: p99 latency",
                p.p99Micros(), "us", "<= 300 us", p.p99Micros() <= 300, "p50 " + fmt(p.p50Micros()) + " us")));
        if (prefix.isPresent() && redis.isPresent()) {
            double r = redis.get().p50Micros() / prefix.get().p50Micros();
            results.checks.add(new Results.Check("prefixMatch over 1024 keys vs Redis pipelined EXISTS (p50)", r, "x",
                    ">= 5x", r >= 5, "redis p50 " + fmt(redis.get().p50Micros()) + " us, kvpool p50 "
                    + fmt(prefix.get().p50Micros()) + " us"));
        }
        var byDigest = results.rows.stream().filter(r -> r.section().equals("lookup")
                && r.op().equals("prefixMatchDigests")).findFirst();
        if (byDigest.isPresent() && redis.isPresent()) {
            double r = redis.get().p50Micros() / byDigest.get().p50Micros();
            results.checks.add(new Results.Check("prefixMatchDigests (the connector's lookup) vs Redis pipelined"
                    + " EXISTS (p50)", r, "x", ">= 5x", r >= 5, "redis p50 " + fmt(redis.get().p50Micros())
                    + " us, kvpool p50 " + fmt(byDigest.get().p50Micros()) + " us"));
        }
        Object perObject = results.environment.get("metadata_heap_bytes_per_object");
        if (perObject instanceof Double d) {
            results.checks.add(new Results.Check("master heap per object", d, "B", "<= 200 B at 10M", d <= 200,
                    results.environment.get("metadata_objects") + " objects"));
        }
        results.rows.stream().filter(r -> r.section().equals("metadata") && r.op().equals("batchExists"))
                .max((a, b) -> Double.compare(a.opsPerSec(), b.opsPerSec()))
                .ifPresent(r -> results.checks.add(new Results.Check("batched existence checks", r.opsPerSec() / 1e6,
                        "M keys/s", ">= 1 M keys/s", r.opsPerSec() >= 1e6, r.clients() + " client(s), 1024 keys a call")));
    }

    private static String fmt(double v) {
        return String.format(Locale.ROOT, "%.1f", v);
    }
}
