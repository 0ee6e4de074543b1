package io.kvpool.bench;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.bench.soak.Relay;
import io.kvpool.client.PutStatus;
import io.kvpool.config.Ports;
import io.kvpool.etcd.EtcdGateway;
import io.kvpool.etcd.EtcdTarget;
import io.kvpool.etcd.LeaderRecord;
import io.kvpool.etcd.LeaderWatch;
import io.kvpool.etcd.StandbysInSync;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.net.InetSocketAddress;
import java.lang.foreign.MemorySegment;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicLongArray;

/**
 * The {@code failover} section: the leader of two elected masters fails while clients put and get, with a pool
 * of 100K and of 1M objects, in four ways in the same run: masters that rebuild from the nodes (the leader
 * killed), and masters with a hot standby whose leader is killed (its port refuses, the standby takes its key at
 * once), frozen with SIGSTOP, or partitioned (every link to it and from it to etcd stalls while it runs on; the
 * standby waits out the leader's lease in both). Every role is its own process (a real etcd started by
 * scripts/etcd.sh, two {@link FailoverMain} masters, one node); the clients run here.
 *
 * <p>Before the fault, the puts' latency for 2 s: with a hot standby in sync every put waits for its
 * acknowledgement, so the rebuild rows are the baseline of the same run.
 *
 * <p>Measured from the kill: the first successful get and put through the new leader, and the moment
 * every client has done both (reattached). Then, with traffic stopped: how many of the objects
 * stored before the kill read back byte-exact, how many reads during the run returned wrong bytes,
 * and whether any put that failed across the failover left part of a value visible.
 */
final class FailoverBench {

    private static final int CLIENTS = 4;
    private static final int VALUE = 1024;

    private FailoverBench() {
    }

    /** How the leader fails and what replaces it. */
    enum Mode {
        REBUILD("leader killed, new leader rebuilds from the node"),
        HOT_KILL("leader killed, hot standby"),
        HOT_FREEZE("leader frozen (SIGSTOP), hot standby"),
        /**
         * Every way to the leader and from it to etcd stalls, the leader running on: it listens on 127.0.0.2
         * behind a relay at the address it advertises, and reaches etcd through another.
         */
        HOT_PARTITION("leader partitioned (its links stall), hot standby");

        final String label;

        Mode(String label) {
            this.label = label;
        }

        boolean hot() {
            return this != REBUILD;
        }
    }

    static int steps(boolean quick) {
        return quick ? 2 : 2 * Mode.values().length;
    }

    static void run(Results results, boolean quick, Runnable step) throws Exception {
        for (int objects : quick ? new int[]{100_000} : new int[]{100_000, 1_000_000}) {
            for (Mode mode : quick ? new Mode[]{Mode.REBUILD, Mode.HOT_KILL} : Mode.values()) {
                once(results, objects, mode);
                step.run();
            }
        }
    }

    /** The value of {@code key}: derived from the key, so a wrong byte shows. */
    static byte[] valueOf(String key) {
        byte[] v = new byte[VALUE];
        long s = key.hashCode() * 0x9E3779B97F4A7C15L;
        for (int i = 0; i < v.length; i += 8) {
            s = s * 6364136223846793005L + 1442695040888963407L;
            for (int b = 0; b < 8; b++) {
                v[i + b] = (byte) (s >>> (8 * b));
            }
        }
        return v;
    }

    private static void once(Results results, int objects, Mode mode) throws Exception {
        withCluster("kvpool-failover-bench", (processes, script, dir) -> once(results, objects, mode, processes, script, dir));
    }

    /** What runs in a cluster directory: its processes are stopped and its etcd with them at the end. */
    interface ClusterWork {
        void run(List<Process> processes, Path etcdScript, Path dir) throws Exception;
    }

    /**
     * Runs {@code work} in a fresh temporary directory, then stops the processes it added to the list, stops
     * its etcd (scripts/etcd.sh in the directory's {@code etcd}) and deletes the directory, also when the
     * bench itself is stopped (SIGTERM) before the end: etcd is a daemon, not our child.
     */
    static void withCluster(String prefix, ClusterWork work) throws Exception {
        Path dir = Files.createTempDirectory(prefix);
        List<Process> processes = java.util.Collections.synchronizedList(new ArrayList<>());
        Path script = Path.of(System.getenv().getOrDefault("KVPOOL_HOME", "."), "scripts", "etcd.sh").toAbsolutePath();
        Thread cleanUp = new Thread(() -> cleanUp(processes, script, dir), prefix + "-clean-up");
        Runtime.getRuntime().addShutdownHook(cleanUp);
        try {
            work.run(processes, script, dir);
        } finally {
            try {
                Runtime.getRuntime().removeShutdownHook(cleanUp);
                cleanUp(processes, script, dir);
            } catch (IllegalStateException shuttingDown) {
                // the hook runs it
            }
        }
    }

    /** Stops the section's processes and its etcd, and deletes its directory; never throws. */
    private static void cleanUp(List<Process> processes, Path script, Path dir) {
        try {
            synchronized (processes) {
                stop(processes);
                processes.clear();
            }
            if (Files.isDirectory(dir.resolve("etcd"))) {
                run(List.of("bash", script.toString(), "stop", dir.resolve("etcd").toString()));
            }
            DiskBench.deleteTree(dir);
        } catch (Exception e) {
            System.err.println("failover bench: cleaning up " + dir + ": " + e);
        }
    }

    private static void once(Results results, int objects, Mode mode, List<Process> processes, Path script, Path dir)
            throws Exception {
        List<Relay> relays = new ArrayList<>();
        try {
            once(results, objects, mode, processes, script, dir, relays);
        } finally {
            relays.forEach(Relay::close);
        }
    }

    private static void once(Results results, int objects, Mode mode, List<Process> processes, Path script, Path dir,
                             List<Relay> relays) throws Exception {
        int etcdPort = freePort();
        run(List.of("bash", script.toString(), "start", dir.resolve("etcd").toString(), "" + etcdPort, "" + freePort()));
        String url = "etcd://127.0.0.1:" + etcdPort + "/bench";
        try (LeaderWatch watch = new LeaderWatch(EtcdTarget.parse(url), Duration.ofSeconds(2)).start()) {
            String hot = mode.hot() ? "hot" : "cold";
            int leaderPort = freePort();
            if (mode == Mode.HOT_PARTITION) {
                // clients, nodes and the standby reach the leader only through toLeader; it reaches etcd only
                // through toEtcd
                Relay toLeader = new Relay(new InetSocketAddress("127.0.0.1", leaderPort),
                        new InetSocketAddress("127.0.0.2", leaderPort));
                Relay toEtcd = new Relay(new InetSocketAddress("127.0.0.1", 0), new InetSocketAddress("127.0.0.1", etcdPort));
                relays.add(toLeader);
                relays.add(toEtcd);
                processes.add(start("master", "etcd://127.0.0.1:" + toEtcd.port() + "/bench", "m1", "" + leaderPort, hot,
                        "-1", "127.0.0.2"));
            } else {
                processes.add(start("master", url, "m1", "" + leaderPort, hot));
            }
            LeaderRecord first = watch.await(LeaderRecord::ready, Duration.ofSeconds(60));
            processes.add(start("master", url, "m2", "" + freePort(), hot));
            processes.add(start("node", url, objects > 200_000 ? "2GiB" : "512MiB"));
            try (KvPoolClient loader = KvPoolClient.connect(ClientConfig.forMaster(url))) {
                long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
                while (loader.stats().segments().isEmpty() && System.nanoTime() < deadline) {
                    Thread.sleep(50);
                }
                for (int i = 0; i < objects; i += 4096) {
                    List<String> keys = new ArrayList<>();
                    List<MemorySegment> values = new ArrayList<>();
                    for (int k = i; k < Math.min(objects, i + 4096); k++) {
                        keys.add("o/" + k);
                        values.add(MemorySegment.ofArray(valueOf("o/" + k)));
                    }
                    for (PutStatus s : loader.putBatch(keys, values)) {
                        if (s != PutStatus.OK) {
                            throw new IllegalStateException("loading the pool: " + s);
                        }
                    }
                }
                Thread.sleep(500); // the leader publishes its node list within 200 ms
            }
            if (mode.hot()) {
                awaitInSync(url, "m2");
            }
            Traffic t = new Traffic(url, objects);
            t.awaitWarm();
            double[] putMicros = t.putLatency(Duration.ofSeconds(2));
            long killedAt = System.nanoTime();
            Process leader = processes.getFirst(); // m1 leads: it started first and was awaited
            if (mode == Mode.HOT_FREEZE) {
                run(List.of("kill", "-STOP", "" + leader.pid()));
                killedAt = System.nanoTime(); // the leader answered calls until kill(1) ran, milliseconds after the fork
            } else if (mode == Mode.HOT_PARTITION) {
                relays.forEach(r -> r.cut(Relay.Mode.STALL));
            } else {
                leader.destroyForcibly();
                leader.waitFor(30, TimeUnit.SECONDS);
            }
            t.killedAt(killedAt);
            LeaderRecord next = watch.await(r -> r.ready() && r.term() > first.term(), Duration.ofSeconds(60));
            t.awaitReattached(Duration.ofSeconds(60));
            if (mode == Mode.HOT_PARTITION) {
                // the old leader hears again from etcd and its clients: it must serve nothing stale or lost
                relays.forEach(Relay::heal);
                Thread.sleep(1000);
            }
            t.stop();
            Verdict v = t.verify();
            if (mode == Mode.HOT_FREEZE) {
                leader.destroyForcibly(); // SIGKILL ends a stopped process too
            }
            String n = String.format(Locale.ROOT, "%dK objects, %s", objects / 1000, mode.label);
            double firstOk = t.firstOkMillis();
            double all = t.allReattachedMillis();
            results.add(new Results.Row("failover", "kvpool", "first get+put after the fault", VALUE, CLIENTS,
                    Double.NaN, Double.NaN, firstOk * 1000, Double.NaN, n + "; new leader " + next.id() + " at term "
                    + next.term() + " (was " + first.term() + "); figure in the p50 column, in us"));
            results.add(new Results.Row("failover", "kvpool", "every client reattached", VALUE, CLIENTS, Double.NaN,
                    Double.NaN, all * 1000, Double.NaN, n));
            results.add(new Results.Row("failover", "kvpool", "put before the fault", VALUE, CLIENTS, Double.NaN,
                    Double.NaN, putMicros[0], putMicros[1], n + (mode.hot() ? "; put_end waits for the standby in sync"
                    : "; no standby") + " (" + (long) putMicros[2] + " puts in 2 s)"));
            // issue 35: a hot standby within 1 s of a kill; a frozen leader is waited for its lease (2 s); the
            // rebuild path keeps its earlier goals (3 s at 100K, 5 s at 1M)
            double goal = switch (mode) {
                case HOT_KILL -> 1000;
                case HOT_FREEZE, HOT_PARTITION -> 3000;
                case REBUILD -> objects > 200_000 ? 5000 : 3000;
            };
            results.checks.add(new Results.Check("failover with " + n + ": until every client got and put again",
                    all, "ms", "< " + (long) goal + " ms", all < goal, String.format(Locale.ROOT,
                    "first success %.0f ms after the fault", firstOk)));
            double readable = 100.0 * v.readable / objects;
            results.checks.add(new Results.Check("failover with " + n + ": objects readable byte-exact afterwards",
                    readable, "%", ">= 99.9%", readable >= 99.9, v.readable + " of " + objects));
            results.checks.add(new Results.Check("failover with " + n + ": wrong bytes and partly visible puts",
                    v.wrong + v.partial, "", "0", v.wrong + v.partial == 0, v.wrong + " wrong reads, " + v.partial
                    + " partly visible puts of " + v.attempted + " attempted (" + v.acknowledged + " acknowledged, "
                    + v.lostAcknowledged + " acknowledged and gone)"));
        }
    }

    /** Waits until the leader names {@code standby} in sync in etcd: from then on it may serve from its copy. */
    static void awaitInSync(String url, String standby) throws Exception {
        EtcdTarget target = EtcdTarget.parse(url);
        try (EtcdGateway g = new EtcdGateway(target.endpoints(), Duration.ofSeconds(5))) {
            long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
            while (true) {
                StandbysInSync named = StandbysInSync.read(g, target);
                if (named != null && named.ids().contains(standby)) {
                    return;
                }
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException("the leader did not name " + standby + " in sync within 60 s");
                }
                Thread.sleep(20);
            }
        }
    }

    record Verdict(long readable, long wrong, long partial, long attempted, long acknowledged, long lostAcknowledged) {
    }

    /** The clients: each gets an object stored before the kill and puts a new one, in a loop. */
    private static final class Traffic {
        final int objects;
        final List<KvPoolClient> clients = new ArrayList<>();
        final List<Thread> threads = new ArrayList<>();
        final AtomicBoolean stop = new AtomicBoolean();
        final AtomicLong wrong = new AtomicLong();
        final AtomicLong warm = new AtomicLong();
        final ConcurrentLinkedQueue<String> attempted = new ConcurrentLinkedQueue<>();
        final ConcurrentLinkedQueue<String> acknowledged = new ConcurrentLinkedQueue<>();
        /** Per client: when it first got and put successfully after the kill (0: not yet). */
        final AtomicLongArray reattached = new AtomicLongArray(CLIENTS);
        volatile long killedAt;
        /** Latencies of puts acknowledged while {@link #measuring}. */
        final ConcurrentLinkedQueue<Long> putNanos = new ConcurrentLinkedQueue<>();
        volatile boolean measuring;

        Traffic(String url, int objects) {
            this.objects = objects;
            for (int c = 0; c < CLIENTS; c++) {
                KvPoolClient k = KvPoolClient.connect(ClientConfig.forMaster(url));
                clients.add(k);
                int id = c;
                threads.add(Thread.ofPlatform().start(() -> loop(id, k)));
            }
        }

        private void loop(int id, KvPoolClient k) {
            for (long i = 0; !stop.get(); i++) {
                String orig = "o/" + Math.floorMod((i * 7919 + id * 104729), objects);
                String live = "live/" + id + "/" + i;
                try {
                    long before = System.nanoTime();
                    Optional<byte[]> got = k.get(orig);
                    if (got.isPresent() && !Arrays.equals(got.get(), valueOf(orig))) {
                        wrong.incrementAndGet();
                    }
                    attempted.add(live);
                    long p0 = System.nanoTime();
                    PutStatus s = k.put(live, valueOf(live));
                    if (s == PutStatus.OK) {
                        if (measuring) {
                            putNanos.add(System.nanoTime() - p0);
                        }
                        acknowledged.add(live);
                        warm.incrementAndGet();
                        long killed = killedAt;
                        if (killed != 0 && before > killed && got.isPresent()) {
                            reattached.compareAndSet(id, 0, System.nanoTime());
                        }
                    }
                } catch (RuntimeException e) {
                    // a call spanning the failover may fail; what it left behind is verified at the end
                }
            }
        }

        /** The puts' latency over {@code window} from now: p50 and p99 in microseconds, and how many. */
        double[] putLatency(Duration window) throws InterruptedException {
            measuring = true;
            Thread.sleep(window);
            measuring = false;
            long[] ns = putNanos.stream().mapToLong(Long::longValue).sorted().toArray();
            if (ns.length == 0) {
                return new double[]{Double.NaN, Double.NaN, 0};
            }
            return new double[]{ns[ns.length / 2] / 1e3, ns[(int) (ns.length * 0.99)] / 1e3, ns.length};
        }

        void awaitWarm() throws InterruptedException {
            while (warm.get() < 200 * CLIENTS) {
                Thread.sleep(10);
            }
        }

        void killedAt(long t) {
            killedAt = t;
        }

        void awaitReattached(Duration timeout) throws InterruptedException {
            long deadline = System.nanoTime() + timeout.toNanos();
            while (System.nanoTime() < deadline) {
                boolean all = true;
                for (int c = 0; c < CLIENTS; c++) {
                    all &= reattached.get(c) != 0;
                }
                if (all) {
                    return;
                }
                Thread.sleep(5);
            }
            throw new IllegalStateException("not every client reattached within " + timeout);
        }

        double firstOkMillis() {
            long first = Long.MAX_VALUE;
            for (int c = 0; c < CLIENTS; c++) {
                first = Math.min(first, reattached.get(c));
            }
            return (first - killedAt) / 1e6;
        }

        double allReattachedMillis() {
            long last = 0;
            for (int c = 0; c < CLIENTS; c++) {
                last = Math.max(last, reattached.get(c));
            }
            return (last - killedAt) / 1e6;
        }

        void stop() throws InterruptedException {
            stop.set(true);
            for (Thread t : threads) {
                t.join();
            }
        }

        Verdict verify() {
            KvPoolClient k = clients.getFirst();
            long readable = 0;
            List<String> keys = new ArrayList<>();
            for (int i = 0; i < objects; i++) {
                keys.add("o/" + i);
                if (keys.size() == 1024 || i == objects - 1) {
                    List<Optional<byte[]>> got = k.getBatch(keys);
                    for (int j = 0; j < keys.size(); j++) {
                        if (got.get(j).isPresent() && Arrays.equals(got.get(j).get(), valueOf(keys.get(j)))) {
                            readable++;
                        }
                    }
                    keys.clear();
                }
            }
            long partial = 0;
            long lost = 0;
            Set<String> acked = new HashSet<>(acknowledged);
            for (String key : attempted) {
                Optional<byte[]> got = k.get(key);
                if (got.isPresent() && !Arrays.equals(got.get(), valueOf(key))) {
                    partial++;
                } else if (got.isEmpty() && acked.contains(key)) {
                    lost++;
                }
            }
            clients.forEach(KvPoolClient::close);
            return new Verdict(readable, wrong.get(), partial, attempted.size(), acked.size(), lost);
        }
    }

    /**
     * Stops the section's processes (masters, node) at its end: SIGTERM, so that the node deletes its
     * segment file (a SIGKILL here left the node's 512 MiB file in /dev/shm after every run).
     */
    static void stop(List<Process> processes) throws InterruptedException {
        for (Process p : processes) {
            Children.stop(p);
        }
    }

    /** Starts a {@link FailoverMain} with {@code args} and waits for its ready line. */
    static Process start(String... args) throws Exception {
        return start(FailoverMain.class, args);
    }

    /** Starts {@code main} in a JVM of its own with {@code args} and waits for its {@code ready} line. */
    static Process start(Class<?> main, String... args) throws Exception {
        return start("1g", main, args);
    }

    /** The same with a heap of at most {@code maxHeap} (e.g. "4g"). */
    static Process start(String maxHeap, Class<?> main, String... args) throws Exception {
        List<String> cmd = new ArrayList<>(List.of(Path.of(System.getProperty("java.home"), "bin", "java").toString(),
                "-Xmx" + maxHeap, "-XX:+UseParallelGC", "--enable-native-access=ALL-UNNAMED", "-cp",
                System.getProperty("java.class.path"), main.getName()));
        // e.g. KVPOOL_BENCH_MASTER_JAVA_OPTS="-Xlog:gc:file=/tmp/master-%p.gc" to see a master's collections
        String extra = System.getenv("KVPOOL_BENCH_MASTER_JAVA_OPTS");
        if (extra != null && !extra.isBlank()) {
            cmd.addAll(4, List.of(extra.trim().split("\\s+")));
        }
        cmd.addAll(List.of(args));
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        CompletableFuture<Void> ready = new CompletableFuture<>();
        StringBuilder out = new StringBuilder();
        Thread.ofVirtual().start(() -> {
            try (BufferedReader r = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8))) {
                String line;
                while ((line = r.readLine()) != null) {
                    if (line.startsWith("ready ")) {
                        ready.complete(null);
                    } else if (!ready.isDone() && out.length() < 20_000) {
                        out.append(line).append('\n');
                    } else if ((line.contains(" WARN ") && !line.contains("unreachable")) || line.contains("TakeOver")) {
                        System.err.println("  " + args[0] + (args.length > 2 ? " " + args[2] : "") + ": " + line);
                    }
                }
            } catch (IOException ignored) {
                // the process ended
            }
            ready.completeExceptionally(new IllegalStateException(args[0] + " exited:\n" + out));
        });
        ready.get(60, TimeUnit.SECONDS);
        return p;
    }

    static void run(List<String> cmd) throws Exception {
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        if (!p.waitFor(120, TimeUnit.SECONDS) || p.exitValue() != 0) {
            throw new IllegalStateException(String.join(" ", cmd) + " failed:\n" + out);
        }
    }

    static int freePort() throws IOException {
        return Ports.reservable(); // below the ephemeral range: no client connection takes it meanwhile
    }
}
