package io.kvpool.bench;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutOptions;
import io.kvpool.client.PutResult;
import io.kvpool.client.PutStatus;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.Optional;
import java.util.SplittableRandom;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The {@code rolling} section: {@code kvpool launch --local 3 --masters 2} (its own processes, etcd
 * started by the launcher), objects stored with one copy and with two, clients getting and putting
 * throughout, then {@code kvpool rolling-restart}: both masters and all three nodes restarted one at a
 * time. Measured after it: objects of each set read back byte-exact by a client started then, wrong
 * bytes read at any time, how long gets and puts failed (the longest stretch without a successful
 * get (put) across all clients, and the failed operations in all), and the misses of the client that
 * ran through the restart for objects the pool holds.
 *
 * <p>A get of a one-copy object whose node is restarting is a miss until the node is back: counted
 * as a failed get. Every value is derived from its key, so any read can be checked. The pool has
 * room for everything written (each client puts a new object every 50 ms, at most as many as one set
 * holds), so no object leaves by eviction.
 */
public final class RollingRestartBench {

    private static final int CLIENTS = 2;
    /** Each client puts a new object at most this often, up to as many as one set holds. */
    private static final long PUT_PACE_NANOS = 50_000_000L;

    /** What one drill measured. */
    public record Outcome(int objects, int exactOneCopy, int exactTwoCopies, long wrongReads, long gets, long failedGets,
                          long puts, long failedPuts, long acknowledgedLost, long staleClientMisses,
                          double longestGetGapMs,
                          double longestPutGapMs, List<String> steps, double restartSeconds) {
    }

    private RollingRestartBench() {
    }

    static void run(Results results, boolean quick, Runnable step) throws Exception {
        int objects = quick ? 2_000 : 20_000;
        Path dir = Files.createTempDirectory("kvpool-bench-rolling");
        Outcome o = drill(objects, 16 << 10, dir);
        step.run();
        String basis = String.format(Locale.ROOT, "%d objects of 16 KiB with 1 copy and %d with 2; 3 nodes, 2 elected masters;"
                + " restart took %.1f s: %s", objects, objects, o.restartSeconds(), String.join("; ", o.steps()));
        results.add(new Results.Row("rolling", "kvpool", "longest stretch without a successful get", 16 << 10, CLIENTS,
                Double.NaN, Double.NaN, o.longestGetGapMs() * 1000, Double.NaN, "figure in the p50 column, in us; "
                + o.failedGets() + " of " + o.gets() + " gets failed or missed"));
        results.add(new Results.Row("rolling", "kvpool", "longest stretch without a successful put", 16 << 10, CLIENTS,
                Double.NaN, Double.NaN, o.longestPutGapMs() * 1000, Double.NaN, "figure in the p50 column, in us; "
                + o.failedPuts() + " of " + o.puts() + " puts failed"));
        results.add(new Results.Row("rolling", "kvpool", "misses of a client that ran through the restart", 16 << 10, 1,
                Double.NaN, Double.NaN, Double.NaN, Double.NaN, o.staleClientMisses() + " of " + 2 * objects
                + " objects a fresh client read byte-exact, read right after the restart"));
        double one = 100.0 * o.exactOneCopy() / objects;
        double two = 100.0 * o.exactTwoCopies() / objects;
        results.checks.add(new Results.Check("rolling restart: one-copy objects byte-exact afterwards", one, "%",
                "100%", o.exactOneCopy() == objects, o.exactOneCopy() + " of " + objects + "; " + basis));
        results.checks.add(new Results.Check("rolling restart: two-copy objects byte-exact afterwards", two, "%",
                "100%", o.exactTwoCopies() == objects, o.exactTwoCopies() + " of " + objects));
        results.checks.add(new Results.Check("rolling restart: wrong bytes and acknowledged puts lost", o.wrongReads()
                + o.acknowledgedLost(), "", "0", o.wrongReads() + o.acknowledgedLost() == 0, o.wrongReads()
                + " wrong reads, " + o.acknowledgedLost() + " acknowledged puts unreadable afterwards"));
    }

    /**
     * Starts the pool in {@code dir}, stores {@code objects} objects of {@code valueBytes} with one copy
     * and as many with two, runs the clients, asks for a rolling restart, and checks everything.
     */
    public static Outcome drill(int objects, int valueBytes, Path dir) throws Exception {
        Path logs = dir.resolve("logs");
        Path config = dir.resolve("pool.yaml");
        // room for the three sets (one copy, two copies, the clients' new objects: four regions per index)
        // twice over on three nodes: nothing is evicted, so every object missing afterwards is a loss
        long segment = Math.max(64L << 20, 2L * (3 + CLIENTS) * objects * (valueBytes + 4096) / 3);
        Files.writeString(config, "type: pool\ncpu: " + (segment >> 20) + "MiB\n");
        ProcessBuilder lb = new ProcessBuilder(cli("launch", "--local", "3", "--masters", "2", "--master-port", "0",
                "--config", config.toString(), "--log-dir", logs.toString(), "--out", dir.resolve("client.json").toString()))
                .redirectErrorStream(true).redirectOutput(dir.resolve("launch.log").toFile());
        lb.environment().put("KVPOOL_HOME", home().toString()); // the launcher starts etcd with scripts/etcd.sh
        Process launcher = lb.start();
        try {
            String master = awaitReady(launcher, dir.resolve("launch.log"));
            try (KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster(master))) {
                for (int i = 0; i < objects; i++) {
                    requireStored(c.putDetailed(key("one", i), value(key("one", i), valueBytes), PutOptions.DEFAULT), key("one", i));
                    requireStored(c.putDetailed(key("two", i), value(key("two", i), valueBytes), PutOptions.DEFAULT.withReplicas(2)),
                            key("two", i));
                }
                Traffic t = new Traffic(master, objects, valueBytes);
                long t0 = System.nanoTime();
                Process restart = new ProcessBuilder(cli("rolling-restart", "--log-dir", logs.toString(), "--timeout", "10m"))
                        .redirectErrorStream(true).start();
                String said = new String(restart.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
                int code = restart.waitFor();
                double seconds = (System.nanoTime() - t0) / 1e9;
                t.stop();
                if (code != 0) {
                    throw new IllegalStateException("kvpool rolling-restart exited with " + code + ":\n" + said
                            + "\nlauncher log " + dir.resolve("launch.log"));
                }
                List<String> steps = said.lines().filter(l -> l.contains(" restarted in ")).toList();
                explainWrongReads(t, objects, valueBytes, dir);
                // what the pool holds, read by a client that starts now; then what the clients that ran
                // through the restart see (a stale view of theirs is a miss, not a loss: said apart)
                int one = 0;
                int two = 0;
                long lost = 0;
                long staleMisses = 0;
                List<String> notExact = new ArrayList<>();
                try (KvPoolClient fresh = KvPoolClient.connect(ClientConfig.forMaster(master))) {
                    for (int i = 0; i < objects; i++) {
                        one += exact(fresh, key("one", i), valueBytes) ? 1 : 0;
                        two += exact(fresh, key("two", i), valueBytes) ? 1 : 0;
                    }
                    for (String k : t.acknowledged) {
                        if (!exact(fresh, k, valueBytes)) {
                            lost++;
                            notExact.add(k + " acknowledged at " + t.ackedAt.get(k) + ": " + describe(fresh, k));
                        }
                    }
                    for (int i = 0; i < objects; i++) {
                        for (String k : List.of(key("one", i), key("two", i))) {
                            if (!exact(c, k, valueBytes) && exact(fresh, k, valueBytes)) {
                                staleMisses++;
                            }
                        }
                    }
                    for (int i = 0; i < objects; i++) {
                        if (!exact(fresh, key("one", i), valueBytes)) {
                            notExact.add(key("one", i) + ": " + describe(fresh, key("one", i)));
                        }
                    }
                }
                if (!notExact.isEmpty()) {
                    Files.write(dir.resolve("not-exact.txt"), notExact); // beside the launcher's log, for the diagnosis
                }
                return new Outcome(objects, one, two, t.wrong.get(), t.gets.get(), t.failedGets.get(), t.puts.get(),
                        t.failedPuts.get(), lost, staleMisses, Traffic.longestGap(t.getOk), Traffic.longestGap(t.putOk),
                        steps, seconds);
            }
        } finally {
            launcher.destroy();
            if (!launcher.waitFor(60, TimeUnit.SECONDS)) {
                launcher.destroyForcibly();
            }
        }
    }

    /** The checkout: $KVPOOL_HOME, or the nearest directory above this one holding scripts/etcd.sh. */
    static Path home() {
        String h = System.getenv("KVPOOL_HOME");
        if (h != null) {
            return Path.of(h);
        }
        for (Path p = Path.of("").toAbsolutePath(); p != null; p = p.getParent()) {
            if (Files.isRegularFile(p.resolve("scripts").resolve("etcd.sh"))) {
                return p;
            }
        }
        throw new IllegalStateException("cannot find the kvpool checkout (scripts/etcd.sh) above "
                + Path.of("").toAbsolutePath() + "; set KVPOOL_HOME");
    }

    private static void requireStored(PutResult r, String key) {
        if (r.status() != PutStatus.OK) {
            throw new IllegalStateException("storing " + key + " before the restart: " + r.status());
        }
    }

    /** This JVM running the kvpool CLI ({@code io.kvpool.cli.Main}) with {@code args}: the jar holds it, and so do the tests' class path. */
    static List<String> cli(String... args) {
        List<String> cmd = new ArrayList<>(List.of(ProcessHandle.current().info().command().orElse("java"),
                "--enable-native-access=ALL-UNNAMED", "-Xmx512m", "-cp", System.getProperty("java.class.path"),
                "io.kvpool.cli.Main"));
        cmd.addAll(Arrays.asList(args));
        return cmd;
    }

    static String awaitReady(Process launcher, Path log) throws Exception {
        Pattern ready = Pattern.compile("^ready: master (\\S+) ");
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(120);
        while (System.nanoTime() < deadline) {
            for (String l : Files.readAllLines(log, StandardCharsets.UTF_8)) {
                Matcher m = ready.matcher(l);
                if (m.find()) {
                    return m.group(1);
                }
            }
            if (!launcher.isAlive()) {
                throw new IllegalStateException("kvpool launch exited with " + launcher.exitValue() + ":\n"
                        + Files.readString(log));
            }
            Thread.sleep(100);
        }
        throw new IllegalStateException("kvpool launch was not ready within 120 s; see " + log);
    }

    static String key(String set, int i) {
        return "rolling/" + set + "/" + i;
    }

    /** The value of {@code key}: bytes from a generator seeded by the key, so a read can be checked alone. */
    static byte[] value(String key, int length) {
        byte[] v = new byte[length];
        new SplittableRandom(key.hashCode() * 0x9E3779B97F4A7C15L).nextBytes(v);
        return v;
    }

    private static String describe(KvPoolClient c, String key) {
        try {
            return c.get(key).isPresent() ? "present" : "miss";
        } catch (RuntimeException e) {
            return e.toString();
        }
    }

    private static boolean exact(KvPoolClient c, String key, int length) {
        try {
            Optional<byte[]> got = c.get(key);
            return got.isPresent() && Arrays.equals(got.get(), value(key, length));
        } catch (RuntimeException e) {
            return false;
        }
    }

    record WrongRead(String key, byte[] got, java.time.Instant at) {
    }

    /**
     * Writes {@code dir/wrong-reads.txt}: for each sampled wrong read, the key, when, the length read,
     * and whose value the bytes were (another stored key's, all zeros, or unknown).
     */
    private static void explainWrongReads(Traffic t, int objects, int valueBytes, Path dir) throws IOException {
        if (t.wrongSamples.isEmpty()) {
            return;
        }
        java.util.Map<Long, String> byPrefix = new java.util.HashMap<>();
        List<String> all = new ArrayList<>();
        for (int i = 0; i < objects; i++) {
            all.add(key("one", i));
            all.add(key("two", i));
            for (int c = 0; c < CLIENTS; c++) {
                all.add(key("live-" + c, i));
            }
        }
        for (String k : all) {
            byPrefix.put(java.nio.ByteBuffer.wrap(value(k, valueBytes)).getLong(), k);
        }
        List<String> lines = new ArrayList<>();
        for (WrongRead w : t.wrongSamples) {
            String whose;
            if (w.got().length < 8) {
                whose = "too short";
            } else {
                long prefix = java.nio.ByteBuffer.wrap(w.got()).getLong();
                String other = byPrefix.get(prefix);
                boolean zeros = true;
                for (byte b : w.got()) {
                    zeros &= b == 0;
                }
                whose = zeros ? "all zeros" : other == null ? "unknown bytes"
                        : "the value of " + other + (Arrays.equals(w.got(), value(other, valueBytes)) ? " (whole)" : " (start only)");
            }
            lines.add(w.at() + " " + w.key() + ": " + w.got().length + " bytes, " + whose);
        }
        Files.write(dir.resolve("wrong-reads.txt"), lines);
    }

    /** The clients: each gets a stored object and puts a new one, in a loop, until stopped. */
    private static final class Traffic {
        final AtomicLong gets = new AtomicLong();
        final AtomicLong failedGets = new AtomicLong();
        final AtomicLong puts = new AtomicLong();
        final AtomicLong failedPuts = new AtomicLong();
        final AtomicLong wrong = new AtomicLong();
        final ConcurrentLinkedQueue<Long> getOk = new ConcurrentLinkedQueue<>();
        final ConcurrentLinkedQueue<Long> putOk = new ConcurrentLinkedQueue<>();
        final ConcurrentLinkedQueue<String> acknowledged = new ConcurrentLinkedQueue<>();
        /** The first wrong reads: what was asked for and what came back. */
        final ConcurrentLinkedQueue<WrongRead> wrongSamples = new ConcurrentLinkedQueue<>();
        final java.util.Map<String, java.time.Instant> ackedAt = new java.util.concurrent.ConcurrentHashMap<>();
        private final AtomicBoolean stop = new AtomicBoolean();
        private final List<Thread> threads = new ArrayList<>();

        Traffic(String master, int objects, int valueBytes) throws IOException {
            for (int t = 0; t < CLIENTS; t++) {
                KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster(master));
                int id = t;
                threads.add(Thread.ofPlatform().name("rolling-client-" + t).start(() -> {
                    try (c) {
                        SplittableRandom r = new SplittableRandom(id);
                        int written = 0;
                        long lastPut = 0;
                        while (!stop.get()) {
                            String k = key(r.nextBoolean() ? "one" : "two", r.nextInt(objects));
                            gets.incrementAndGet();
                            try {
                                Optional<byte[]> got = c.get(k);
                                if (got.isEmpty()) {
                                    failedGets.incrementAndGet();
                                } else if (!Arrays.equals(got.get(), value(k, valueBytes))) {
                                    wrong.incrementAndGet();
                                    if (wrongSamples.size() < 100) {
                                        wrongSamples.add(new WrongRead(k, got.get(), java.time.Instant.now()));
                                    }
                                } else {
                                    getOk.add(System.nanoTime());
                                }
                            } catch (RuntimeException e) {
                                failedGets.incrementAndGet();
                            }
                            long now = System.nanoTime();
                            if (written >= objects || now - lastPut < PUT_PACE_NANOS) {
                                continue; // paced to last through the restart, and within the pool's room
                            }
                            lastPut = now;
                            String p = key("live-" + id, written++);
                            puts.incrementAndGet();
                            try {
                                if (c.putDetailed(p, value(p, valueBytes), PutOptions.DEFAULT).status() == PutStatus.OK) {
                                    putOk.add(System.nanoTime());
                                    acknowledged.add(p);
                                    ackedAt.put(p, java.time.Instant.now());
                                } else {
                                    failedPuts.incrementAndGet();
                                }
                            } catch (RuntimeException e) {
                                failedPuts.incrementAndGet();
                            }
                        }
                    }
                }));
            }
        }

        void stop() throws InterruptedException {
            stop.set(true);
            for (Thread t : threads) {
                t.join();
            }
        }

        /** The longest time between two successive successes, in ms. */
        static double longestGap(ConcurrentLinkedQueue<Long> times) {
            long[] t = times.stream().mapToLong(Long::longValue).sorted().toArray();
            long gap = 0;
            for (int i = 1; i < t.length; i++) {
                gap = Math.max(gap, t[i] - t[i - 1]);
            }
            return gap / 1e6;
        }
    }
}
