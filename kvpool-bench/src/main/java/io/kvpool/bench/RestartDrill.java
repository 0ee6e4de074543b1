package io.kvpool.bench;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutOptions;
import io.kvpool.client.PutStatus;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The {@code restarts} section (issue 32): rolling restarts back to back under writers of every kind,
 * and a count of every acknowledged put afterwards.
 *
 * <p>{@code kvpool launch --local 3 --masters 2} (its own processes, etcd started by the launcher);
 * four writers put new objects throughout, each alternating one copy and two: a Java client on the
 * same-machine path, a Java client over TCP only, and the same two in Python
 * ({@code scripts/restart-writer.py}, each its own process). Meanwhile {@code kvpool rolling-restart}
 * runs {@code restarts} times in a row (each restarts both masters, then the three nodes, one at a
 * time). Then the writers stop, and a client started then reads every put that was acknowledged OK.
 * The nodes have room for everything the writers put (each stops once it wrote its share of 60% of
 * the pool), so nothing is evicted.
 * A put that failed is a failure its writer saw (and may retry); an acknowledged put that is missing or
 * differs afterwards is a loss, which must not happen. Every value is derived from its key
 * (SHA-256 of the key, repeated), so any read can be checked alone.
 */
public final class RestartDrill {

    /** Each writer puts a new object at most this often. */
    private static final long PACE_MILLIS = 25;
    /** Memory of each of the three nodes (a sparse /dev/shm file: only what is written takes memory). */
    private static final long NODE_BYTES = 1L << 30;
    /** The writers together write at most this share of the pool, so nothing is evicted: a missing object is a loss. */
    private static final double FILL = 0.6;

    /** What one writer did: puts tried, acknowledged, failed (a status other than OK), failed with an exception. */
    public record Writer(String name, long puts, long ok, long failed, long errors, Map<String, Long> reasons) {
    }

    /** What the drill measured. */
    public record Outcome(int restarts, List<Writer> writers, long acknowledged, long lost, long wrong,
                          List<String> lostSamples, double seconds) {
        public long puts() {
            return writers.stream().mapToLong(Writer::puts).sum();
        }

        public long notOk() {
            return writers.stream().mapToLong(w -> w.failed() + w.errors()).sum();
        }
    }

    private RestartDrill() {
    }

    static void run(Results results, boolean quick, Runnable step) throws Exception {
        int restarts = quick ? 3 : 10;
        Path dir = Files.createTempDirectory("kvpool-bench-restarts");
        Outcome o = drill(restarts, 16 << 10, dir);
        step.run();
        double failedShare = o.puts() == 0 ? 100 : 100.0 * o.notOk() / o.puts();
        StringBuilder per = new StringBuilder();
        for (Writer w : o.writers()) {
            per.append(String.format(Locale.ROOT, "%s %d of %d ok%s; ", w.name(), w.ok(), w.puts(),
                    w.reasons().isEmpty() ? "" : " " + w.reasons()));
        }
        String basis = String.format(Locale.ROOT, "%d rolling restarts of 2 masters and 3 nodes in %.0f s; %s(dir %s)",
                o.restarts(), o.seconds(), per, dir);
        results.checks.add(new Results.Check("restarts: acknowledged puts lost or wrong afterwards", o.lost() + o.wrong(),
                "", "0", o.lost() + o.wrong() == 0, o.lost() + " lost and " + o.wrong() + " wrong of " + o.acknowledged()
                + " acknowledged; " + basis));
        results.checks.add(new Results.Check("restarts: puts that failed during the restarts", failedShare, "%", "< 1%",
                failedShare < 1, o.notOk() + " of " + o.puts()));
    }

    /** Starts the pool in {@code dir}, runs the writers through {@code restarts} rolling restarts, checks every acknowledged put. */
    public static Outcome drill(int restarts, int valueBytes, Path dir) throws Exception {
        Path logs = dir.resolve("logs");
        Path config = dir.resolve("pool.yaml");
        Files.writeString(config, "type: pool\ncpu: " + (NODE_BYTES >> 20) + "MiB\n");
        // every writer stops putting once it wrote its share of FILL of the pool (objects alternate one copy and
        // two: 1.5 regions each on average), so no object is ever evicted and one missing afterwards is lost
        long region = io.kvpool.protocol.ObjectLayout.regionLength(24, valueBytes);
        int maxPuts = (int) (FILL * 3 * NODE_BYTES / (4 * 1.5 * region));
        ProcessBuilder lb = new ProcessBuilder(RollingRestartBench.cli("launch", "--local", "3", "--masters", "2",
                "--master-port", "0", "--config", config.toString(), "--log-dir", logs.toString(), "--out",
                dir.resolve("client.json").toString())).redirectErrorStream(true)
                .redirectOutput(dir.resolve("launch.log").toFile());
        lb.environment().put("KVPOOL_HOME", RollingRestartBench.home().toString());
        Process launcher = lb.start();
        List<Process> python = new ArrayList<>();
        Path stop = dir.resolve("stop");
        try {
            String master = RollingRestartBench.awaitReady(launcher, dir.resolve("launch.log"));
            JavaWriters java = new JavaWriters(master, valueBytes, maxPuts);
            for (boolean shm : new boolean[]{true, false}) {
                String name = "python-" + (shm ? "shm" : "tcp");
                ProcessBuilder pb = new ProcessBuilder(PythonBench.python(),
                        RollingRestartBench.home().resolve("scripts").resolve("restart-writer.py").toString(),
                        "--master", master, "--prefix", name, "--out", dir.resolve(name + ".keys").toString(),
                        "--stop", stop.toString(), "--shared-memory", shm ? "1" : "0", "--size",
                        Integer.toString(valueBytes), "--pace-ms", Long.toString(PACE_MILLIS), "--max-puts",
                        Integer.toString(maxPuts))
                        .redirectError(dir.resolve(name + ".log").toFile()).redirectOutput(dir.resolve(name + ".out").toFile());
                python.add(pb.start());
            }
            long t0 = System.nanoTime();
            for (int r = 0; r < restarts; r++) {
                Process restart = new ProcessBuilder(RollingRestartBench.cli("rolling-restart", "--log-dir",
                        logs.toString(), "--timeout", "10m")).redirectErrorStream(true).start();
                String said = new String(restart.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
                Files.writeString(dir.resolve("rolling-restart-" + r + ".txt"), said);
                if (restart.waitFor() != 0) {
                    throw new IllegalStateException("rolling restart " + (r + 1) + " of " + restarts + " failed:\n" + said
                            + "\nlauncher log " + dir.resolve("launch.log"));
                }
            }
            double seconds = (System.nanoTime() - t0) / 1e9;
            Files.writeString(stop, "stop\n");
            List<Writer> writers = new ArrayList<>(java.stop());
            List<String> acked = new ArrayList<>(java.acknowledged);
            for (int i = 0; i < python.size(); i++) {
                String name = "python-" + (i == 0 ? "shm" : "tcp");
                Process p = python.get(i);
                if (!p.waitFor(120, TimeUnit.SECONDS)) {
                    p.destroyForcibly();
                    throw new IllegalStateException(name + " did not stop; see " + dir.resolve(name + ".log"));
                }
                writers.add(pythonSummary(name, dir.resolve(name + ".out")));
                acked.addAll(Files.readAllLines(dir.resolve(name + ".keys")));
            }
            long lost = 0;
            long wrong = 0;
            List<String> samples = new ArrayList<>();
            try (KvPoolClient fresh = KvPoolClient.connect(ClientConfig.forMaster(master).withSharedMemory(false))) {
                for (String k : acked) {
                    Optional<byte[]> got = fresh.get(k);
                    if (got.isEmpty()) {
                        lost++;
                        samples.add(k + ": missing");
                    } else if (!Arrays.equals(got.get(), value(k, valueBytes))) {
                        wrong++;
                        samples.add(k + ": wrong bytes");
                    }
                }
            }
            if (!samples.isEmpty()) {
                Files.write(dir.resolve("not-exact.txt"), samples);
            }
            return new Outcome(restarts, writers, acked.size(), lost, wrong,
                    samples.subList(0, Math.min(20, samples.size())), seconds);
        } finally {
            Files.writeString(stop, "stop\n");
            for (Process p : python) {
                p.destroy();
            }
            launcher.destroy();
            if (!launcher.waitFor(60, TimeUnit.SECONDS)) {
                launcher.destroyForcibly();
            }
        }
    }

    /** The value of {@code key}: SHA-256 of the key repeated to {@code length} bytes (as restart-writer.py makes it). */
    static byte[] value(String key, int length) {
        byte[] seed;
        try {
            seed = MessageDigest.getInstance("SHA-256").digest(key.getBytes(StandardCharsets.UTF_8));
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
        byte[] v = new byte[length];
        for (int i = 0; i < length; i++) {
            v[i] = seed[i % seed.length];
        }
        return v;
    }

    private static final Pattern COUNT = Pattern.compile("\"(puts|ok|failed|errors)\": (\\d+)");

    private static Writer pythonSummary(String name, Path out) throws IOException {
        String line = Files.readString(out).strip();
        Map<String, Long> n = new LinkedHashMap<>();
        Matcher m = COUNT.matcher(line);
        while (m.find()) {
            n.put(m.group(1), Long.parseLong(m.group(2)));
        }
        if (n.size() != 4) {
            throw new IllegalStateException(name + " printed no summary: '" + line + "'");
        }
        int at = line.indexOf("\"reasons\": ");
        Map<String, Long> reasons = at < 0 || line.startsWith("{}", at + 11) ? Map.of()
                : Map.of(line.substring(at + 11, line.length() - 1), 1L);
        return new Writer(name, n.get("puts"), n.get("ok"), n.get("failed"), n.get("errors"), reasons);
    }

    /** The two Java writers: one on the same-machine path, one over TCP only. */
    private static final class JavaWriters {
        final ConcurrentLinkedQueue<String> acknowledged = new ConcurrentLinkedQueue<>();
        private final AtomicBoolean stop = new AtomicBoolean();
        private final List<Thread> threads = new ArrayList<>();
        private final List<Writer> done = new ArrayList<>();

        JavaWriters(String master, int valueBytes, int maxPuts) {
            for (boolean shm : new boolean[]{true, false}) {
                String name = "java-" + (shm ? "shm" : "tcp");
                KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster(master).withSharedMemory(shm));
                threads.add(Thread.ofPlatform().name("restart-writer-" + name).start(() -> {
                    long puts = 0;
                    long ok = 0;
                    long failed = 0;
                    long errors = 0;
                    Map<String, Long> reasons = new ConcurrentHashMap<>();
                    try (c) {
                        for (int i = 0; !stop.get(); i++) {
                            long t0 = System.nanoTime();
                            if (i >= maxPuts) {
                                try {
                                    Thread.sleep(PACE_MILLIS); // its share of the pool is written: idle until stopped
                                } catch (InterruptedException e) {
                                    return;
                                }
                                continue;
                            }
                            String k = name + "/" + i;
                            puts++;
                            try {
                                PutStatus st = c.putDetailed(k, value(k, valueBytes),
                                        PutOptions.DEFAULT.withReplicas(i % 2 == 0 ? 1 : 2)).status();
                                if (st == PutStatus.OK) {
                                    ok++;
                                    acknowledged.add(k);
                                } else {
                                    failed++;
                                    reasons.merge(st.toString(), 1L, Long::sum);
                                }
                            } catch (RuntimeException e) {
                                errors++;
                                String why = e.getClass().getSimpleName() + ": " + e.getMessage();
                                reasons.merge(why.substring(0, Math.min(120, why.length())), 1L, Long::sum);
                            }
                            long left = TimeUnit.MILLISECONDS.toNanos(PACE_MILLIS) - (System.nanoTime() - t0);
                            if (left > 0) {
                                try {
                                    TimeUnit.NANOSECONDS.sleep(left);
                                } catch (InterruptedException e) {
                                    return;
                                }
                            }
                        }
                    }
                    synchronized (done) {
                        done.add(new Writer(name, puts, ok, failed, errors, Map.copyOf(reasons)));
                    }
                }));
            }
        }

        List<Writer> stop() throws InterruptedException {
            stop.set(true);
            for (Thread t : threads) {
                t.join();
            }
            synchronized (done) {
                return List.copyOf(done);
            }
        }
    }

    /** Where the counts of a run go when the drill is run on its own (for the note). */
    public static String describe(Outcome o) {
        StringBuilder b = new StringBuilder(String.format(Locale.ROOT,
                "%d restarts in %.0f s: %d puts, %d acknowledged, %d failed, %d lost, %d wrong%n", o.restarts(),
                o.seconds(), o.puts(), o.acknowledged(), o.notOk(), o.lost(), o.wrong()));
        for (Writer w : o.writers()) {
            b.append(String.format(Locale.ROOT, "  %-10s %6d puts %6d ok %4d failed %4d errors %s%n", w.name(), w.puts(),
                    w.ok(), w.failed(), w.errors(), w.reasons()));
        }
        for (String s : o.lostSamples()) {
            b.append("  ").append(s).append('\n');
        }
        return b.toString();
    }

    /** Runs the drill alone: {@code RestartDrill RESTARTS [DIR]}. */
    public static void main(String[] args) throws Exception {
        int restarts = args.length > 0 ? Integer.parseInt(args[0]) : 10;
        Path dir = args.length > 1 ? Files.createDirectories(Path.of(args[1]))
                : Files.createTempDirectory("kvpool-restart-drill");
        System.out.print(describe(drill(restarts, 16 << 10, dir)));
        System.out.println("logs in " + dir);
        System.exit(0);
    }
}
