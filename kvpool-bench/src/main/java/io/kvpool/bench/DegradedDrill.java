package io.kvpool.bench;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.config.HostPort;
import io.kvpool.config.Ports;
import io.kvpool.config.Size;
import io.kvpool.connector.PoolConnector;
import io.kvpool.connector.hash.BlockHasher;
import io.kvpool.connector.hash.KeyFormat;
import io.kvpool.engine.Completion;
import io.kvpool.engine.Engine;
import io.kvpool.engine.EngineConfig;
import io.kvpool.engine.SamplingParams;
import io.kvpool.engine.llama.ModelConfig;
import io.kvpool.engine.llama.Weights;
import io.kvpool.master.MasterConfig;
import io.kvpool.master.MasterServer;
import io.kvpool.node.NodeConfig;
import io.kvpool.node.StorageNode;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.SplittableRandom;
import java.util.concurrent.TimeUnit;

/**
 * The {@code degraded} section (issue 34): a pool that is frozen, partitioned or slow must cost a request no more
 * than recomputing its prompt, and come back into use by itself once it is well.
 *
 * <h2>What runs</h2>
 * The drill runs in a network namespace of its own ({@code unshare -n}, when the bench runs as root with {@code ip}
 * and {@code tc}): its loopback is its only link, so the faults it sets touch nothing else on the machine. One master
 * and one node, each in a JVM of its own; the reference engine in the drill's JVM with a {@link PoolConnector} over
 * TCP (a client on another machine: the same-machine path reads the node's shared memory and would not notice a
 * frozen node), its deadlines from its own measured prefill rate (factor 1: a lookup or load that would take longer
 * than recomputing is given up), and the same prompts (a prefix in the pool, 16 new tokens) in every scenario:
 * <ol>
 *   <li>no pool: the engine without a connector, the baseline;</li>
 *   <li>healthy: the prefixes load from the pool;</li>
 *   <li>frozen node: the node SIGSTOPped;</li>
 *   <li>master partition: htb holds the master's port to 8 bit/s both ways (nothing gets through, nothing is
 *       refused: connections hang as behind a dead switch);</li>
 *   <li>slow link: htb holds what the node sends to {@link #SLOW_RATE} (netem, to add delay, is not in this
 *       machine's kernel: the link is slow by bandwidth).</li>
 * </ol>
 * Each scenario starts a fresh engine (empty local cache), computes one warm-up prompt of new tokens (its prefill
 * rate), then asks for one token of each prompt. Once the fault is lifted, the same engine asks again (its local
 * cache cleared each time) until a request loads from the pool: how long the pool took to come back into use.
 * Without a namespace, only the frozen node runs.
 *
 * <pre>
 *   java -cp ... io.kvpool.bench.DegradedDrill drill QUICK NETNS     (prints one line a scenario)
 *   java -cp ... io.kvpool.bench.DegradedDrill master PORT
 *   java -cp ... io.kvpool.bench.DegradedDrill node MASTER_PORT PORT SEGMENT_SIZE
 * </pre>
 */
public final class DegradedDrill {

    /** What the node may send on the slow link. */
    static final String SLOW_RATE = "8mbit";
    /** The longest a pool may take to come back into use after a fault is lifted (the backoff tops at 30 s). */
    static final Duration RECOVERY_LIMIT = Duration.ofSeconds(60);
    /** How many times longer than without a pool a degraded request may take, at the median. */
    static final double GOAL = 1.10;

    /** One scenario's figures: TTFT in milliseconds. */
    record Outcome(String scenario, double p50, double mean, double max, int hits, int prompts, double recoverySeconds,
                   long abandoned, long skipped) {

        String line() {
            return String.join("\t", "degraded", scenario, fmt(p50), fmt(mean), fmt(max), Integer.toString(hits),
                    Integer.toString(prompts), fmt(recoverySeconds), Long.toString(abandoned), Long.toString(skipped));
        }

        static Outcome parse(String line) {
            String[] f = line.split("\t");
            return new Outcome(f[1], Double.parseDouble(f[2]), Double.parseDouble(f[3]), Double.parseDouble(f[4]),
                    Integer.parseInt(f[5]), Integer.parseInt(f[6]), Double.parseDouble(f[7]), Long.parseLong(f[8]),
                    Long.parseLong(f[9]));
        }

        private static String fmt(double v) {
            return String.format(Locale.ROOT, "%.3f", v);
        }
    }

    private DegradedDrill() {
    }

    public static void main(String[] args) throws Exception {
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        switch (args[0]) {
            case "master" -> Children.serve(new MasterServer(MasterConfig.defaults().withListen("127.0.0.1",
                    Integer.parseInt(args[1]), -1).withSummaryInterval(Duration.ZERO)));
            case "node" -> {
                StorageNode node = new StorageNode(NodeConfig.defaults(new HostPort("127.0.0.1", Integer.parseInt(args[1])),
                        Size.parse(args[3])).withListen("127.0.0.1", Integer.parseInt(args[2])));
                if (!node.awaitRegistered(Duration.ofSeconds(30))) {
                    throw new IllegalStateException("node " + node.name() + " did not register");
                }
                Children.serve(node);
            }
            case "drill" -> drill(Boolean.parseBoolean(args[1]), Boolean.parseBoolean(args[2]), System.out);
            default -> throw new IllegalArgumentException("degraded drill: unknown role " + args[0]);
        }
    }

    // ------------------------------------------------------------------------------------ the drill (in the namespace)

    private static void drill(boolean quick, boolean netns, PrintStream out) throws Exception {
        if (netns) {
            sh("ip", "link", "set", "lo", "up");
        }
        int masterPort = Ports.reservable();
        int nodePort = Ports.reservable();
        List<Process> procs = new ArrayList<>();
        procs.add(FailoverBench.start(DegradedDrill.class, "master", "" + masterPort));
        Process node = FailoverBench.start(DegradedDrill.class, "node", "" + masterPort, "" + nodePort, "1GiB");
        procs.add(node);
        ClientConfig cc = ClientConfig.forMaster("127.0.0.1:" + masterPort).withAutoDetectLocal(false).withSharedMemory(false)
                .withRequestTimeout(Duration.ofSeconds(5));
        try (KvPoolClient client = KvPoolClient.connect(cc)) {
            Prompts p = Prompts.make(quick ? 512 : 1024, quick ? 9 : 15);
            ModelConfig mc = ModelConfig.defaults();
            Weights w = Weights.random(mc, 1);
            EngineConfig ec = EngineConfig.defaults().withNumBlocks(p.cached() / BlockHasher.DEFAULT_BLOCK_SIZE * 4 + 64)
                    .withModelName("bench-degraded");
            try (Engine writer = new Engine(ec, mc, w, "w", connector(client, ec))) {
                for (int[] base : p.bases()) {
                    require(writer.generate(base, SamplingParams.greedy(1), null).get());
                }
                writer.connector().waitForSave();
            }
            Scenario s = new Scenario(client, p, ec, mc, w);
            s.run("no pool", false, () -> { }, () -> { }); // the JIT's warm-up: not reported
            out.println(s.run("no pool", false, () -> { }, () -> { }).line());
            out.println(s.run("healthy", true, () -> { }, () -> { }).line());
            out.println(s.run("frozen node", true, () -> sh("kill", "-STOP", "" + node.pid()),
                    () -> sh("kill", "-CONT", "" + node.pid())).line());
            if (netns) {
                out.println(s.run("master partition", true, () -> throttle(masterPort, "8bit", true),
                        DegradedDrill::unthrottle).line());
                out.println(s.run("slow link", true, () -> throttle(nodePort, SLOW_RATE, false),
                        DegradedDrill::unthrottle).line());
            }
            out.flush();
        } finally {
            new ProcessBuilder("kill", "-CONT", "" + node.pid()).start().waitFor();
            FailoverBench.stop(procs);
        }
    }

    /** Every scenario's prompts: {@code bases} prefixes saved to the pool, each with 16 new tokens after it. */
    private record Prompts(int cached, List<int[]> bases, List<int[]> prompts) {

        static Prompts make(int cached, int count) {
            SplittableRandom r = new SplittableRandom(34);
            List<int[]> bases = new ArrayList<>();
            List<int[]> prompts = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                int[] t = random(r, cached);
                bases.add(t);
                int[] full = Arrays.copyOf(t, cached + 16);
                System.arraycopy(random(r, 16), 0, full, cached, 16);
                prompts.add(full);
            }
            return new Prompts(cached, bases, prompts);
        }

        static int[] random(SplittableRandom r, int n) {
            int[] t = new int[n];
            for (int i = 0; i < n; i++) {
                t[i] = r.nextInt(ModelConfig.defaults().vocabSize() - 2);
            }
            return t;
        }
    }

    /** One scenario: a fresh engine, the fault, every prompt, the fault lifted, then until the pool is in use. */
    private record Scenario(KvPoolClient client, Prompts p, EngineConfig ec, ModelConfig mc, Weights w) {

        interface Step {
            void run() throws Exception;
        }

        Outcome run(String name, boolean pool, Step fault, Step lift) throws Exception {
            PoolConnector pc = pool ? connector(client, ec).loadDeadlineFromPrefill(1.0) : null;
            List<Long> ttft = new ArrayList<>();
            int hits = 0;
            double recovery = Double.NaN;
            try (Engine e = new Engine(ec, mc, w, "w", pc)) {
                require(e.generate(Prompts.random(new SplittableRandom(name.hashCode()), p.cached() + 16),
                        SamplingParams.greedy(1), null).get()); // the prefill rate, measured
                fault.run();
                try {
                    for (int[] prompt : p.prompts()) {
                        Completion c = require(e.generate(prompt, SamplingParams.greedy(1), null).get());
                        ttft.add(c.ttftNanos());
                        hits += c.externalHitTokens() > 0 ? 1 : 0;
                    }
                } finally {
                    lift.run();
                }
                if (pool) {
                    recovery = recover(e, p.prompts().getFirst());
                }
            }
            long[] t = ttft.stream().mapToLong(Long::longValue).sorted().toArray();
            double p50 = t.length % 2 == 1 ? t[t.length / 2] : (t[t.length / 2 - 1] + t[t.length / 2]) / 2.0;
            return new Outcome(name, p50 / 1e6, Arrays.stream(t).average().orElse(Double.NaN) / 1e6,
                    t[t.length - 1] / 1e6, hits, t.length, recovery, pc == null ? 0 : pc.abandonedLoads(),
                    pc == null ? 0 : pc.skippedLookups());
        }

        /** Seconds until a request loads from the pool again (its local cache cleared before each), NaN past the limit. */
        private static double recover(Engine e, int[] prompt) throws Exception {
            long t0 = System.nanoTime();
            while (System.nanoTime() - t0 < RECOVERY_LIMIT.toNanos()) {
                e.resetPrefixCache(false);
                if (require(e.generate(prompt, SamplingParams.greedy(1), null).get()).externalHitTokens() > 0) {
                    return (System.nanoTime() - t0) / 1e9;
                }
                Thread.sleep(100);
            }
            return Double.NaN;
        }
    }

    private static Completion require(Completion c) {
        if (!c.ok()) {
            throw new IllegalStateException("degraded drill: a request failed: " + c.error());
        }
        return c;
    }

    private static PoolConnector connector(KvPoolClient client, EngineConfig ec) {
        return new PoolConnector(client, new BlockHasher(ec.blockSize(), ec.hashSeed()),
                KeyFormat.of(ec.modelName(), "w", "f32"), PoolConnector.ResetScope.MODEL);
    }

    /** Holds what leaves {@code port} (and, {@code bothWays}, what goes to it) on loopback to {@code rate}. */
    private static void throttle(int port, String rate, boolean bothWays) throws Exception {
        sh("tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "10", "r2q", "1000");
        sh("tc", "class", "add", "dev", "lo", "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit");
        sh("tc", "class", "add", "dev", "lo", "parent", "1:", "classid", "1:20", "htb", "rate", rate, "ceil", rate);
        sh("tc", "filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match", "ip",
                "sport", "" + port, "0xffff", "flowid", "1:20");
        if (bothWays) {
            sh("tc", "filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match", "ip",
                    "dport", "" + port, "0xffff", "flowid", "1:20");
        }
    }

    private static void unthrottle() throws Exception {
        sh("tc", "qdisc", "del", "dev", "lo", "root");
    }

    private static void sh(String... cmd) throws Exception {
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        if (!p.waitFor(30, TimeUnit.SECONDS) || p.exitValue() != 0) {
            throw new IllegalStateException(String.join(" ", cmd) + " failed: " + out.strip());
        }
    }

    // ------------------------------------------------------------------------------------ the bench's side

    /** Whether this machine lets the drill make its own network namespace with htb and u32 on its loopback. */
    static boolean namespaces() {
        try {
            Process p = new ProcessBuilder("unshare", "-n", "--", "sh", "-c",
                    "ip link set lo up && tc qdisc add dev lo root handle 1: htb default 10 && tc filter add dev lo"
                            + " parent 1: protocol ip prio 1 u32 match ip sport 9 0xffff flowid 1:10")
                    .redirectErrorStream(true).start();
            p.getInputStream().readAllBytes();
            return p.waitFor(30, TimeUnit.SECONDS) && p.exitValue() == 0;
        } catch (Exception e) {
            return false;
        }
    }

    /** Runs the drill (in a namespace when the machine allows) and records its rows and checks. */
    static void run(Results results, boolean quick) throws Exception {
        boolean netns = namespaces();
        List<String> cmd = new ArrayList<>();
        if (netns) {
            cmd.addAll(List.of("unshare", "-n", "--"));
        }
        cmd.addAll(List.of(Path.of(System.getProperty("java.home"), "bin", "java").toString(), "-Xmx2g",
                "--enable-native-access=ALL-UNNAMED", "-cp", System.getProperty("java.class.path"),
                DegradedDrill.class.getName(), "drill", "" + quick, "" + netns));
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        List<Outcome> got = new ArrayList<>();
        StringBuilder log = new StringBuilder();
        try (BufferedReader r = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8))) {
            String line;
            while ((line = r.readLine()) != null) {
                if (line.startsWith("degraded\t")) {
                    got.add(Outcome.parse(line));
                } else if (log.length() < 20_000) {
                    log.append(line).append('\n');
                }
            }
        }
        if (!p.waitFor(20, TimeUnit.MINUTES) || p.exitValue() != 0 || got.isEmpty()) {
            p.destroyForcibly();
            throw new IllegalStateException("degraded drill failed:\n" + log);
        }
        record(results, got, netns);
    }

    private static boolean faulted(Outcome o) {
        return !o.scenario().equals("no pool") && !o.scenario().equals("healthy");
    }

    private static String back(Outcome o) {
        return Double.isNaN(o.recoverySeconds()) ? "never (within 60 s of the fault's end)"
                : String.format(Locale.ROOT, "%.1f s after the fault's end", o.recoverySeconds());
    }

    private static void record(Results results, List<Outcome> got, boolean netns) {
        Outcome base = got.getFirst();
        for (Outcome o : got) {
            results.add(new Results.Row("degraded", "engine", "TTFT " + o.scenario(), 0, 1, Double.NaN, Double.NaN,
                    o.p50() * 1e3, o.max() * 1e3, String.format(Locale.ROOT,
                    "reference engine over TCP: median %.1f ms, mean %.1f ms, worst %.1f ms; %d of %d prompts loaded"
                            + " from the pool; %d block loads abandoned, %d lookups skipped%s", o.p50(), o.mean(), o.max(),
                    o.hits(), o.prompts(), o.abandoned(), o.skipped(), faulted(o) ? "; back in use " + back(o) : "")));
            if (faulted(o)) {
                double r = o.p50() / base.p50();
                results.checks.add(new Results.Check("degraded, " + o.scenario() + ": median TTFT vs no pool", r, "x",
                        "<= " + GOAL + "x, and the pool back in use", r <= GOAL && !Double.isNaN(o.recoverySeconds()),
                        String.format(Locale.ROOT, "%.1f ms vs %.1f ms without a pool; back in use %s", o.p50(),
                                base.p50(), back(o))));
            }
        }
        if (!netns) {
            results.checks.add(new Results.Check("degraded: master partition and slow link", 0, "", "ran", false,
                    "not run: this machine gave the drill no network namespace with htb (needs root, unshare, ip, tc)"));
        }
    }
}
