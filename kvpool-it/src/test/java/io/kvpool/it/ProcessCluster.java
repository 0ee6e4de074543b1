package io.kvpool.it;

import io.kvpool.bench.soak.ProcessOutput;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.config.Ports;

import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.function.Predicate;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * A master and nodes as separate OS processes (the real {@code kvpool} CLI on this test's
 * classpath), on loopback. Each process's output goes to target/it-logs. Processes can be killed
 * with SIGKILL and restarted; everything is killed on close.
 */
final class ProcessCluster implements AutoCloseable {

    private static final Pattern NODE_LINE = Pattern.compile("kvpool node (\\S+): ");
    private final Path logDir;
    final int masterPort;
    final int httpPort;
    private final List<String> masterArgs;
    private Managed master;
    final List<Managed> nodes = new ArrayList<>();
    private int started;

    /** A started process and the segment name it printed (nodes). */
    static final class Managed {
        final Process process;
        final String name;
        /** Where a node keeps its segment file; null for a master, or a node on anonymous memory. */
        final Path shmDir;

        Managed(Process process, String name, Path shmDir) {
            this.process = process;
            this.name = name;
            this.shmDir = shmDir;
        }

        long pid() {
            return process.pid();
        }

        /** SIGSTOP: the process stays, holding its sockets and shared memory, but does nothing. */
        void freeze() {
            signal(process, "STOP");
        }

        /** SIGCONT after {@link #freeze()}. */
        void thaw() {
            signal(process, "CONT");
        }

        void kill9() {
            process.destroyForcibly();
            try {
                process.waitFor(30, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }

        /** SIGKILL, and the segment file it leaves removed: for a node that will not be restarted. */
        void kill9AndRemoveSegment() {
            kill9();
            if (shmDir != null && !process.isAlive()) {
                SegmentFiles.remove(shmDir, pid());
            }
        }
    }

    ProcessCluster(String testName, String... extraMasterArgs) throws Exception {
        this.logDir = Path.of("target", "it-logs", testName);
        Files.createDirectories(logDir);
        this.masterPort = freePort();
        this.httpPort = freePort();
        this.masterArgs = List.of(extraMasterArgs);
        startMaster();
    }

    static int freePort() throws IOException {
        return Ports.reservable(); // below the ephemeral range: no client connection takes it meanwhile
    }

    String masterAddress() {
        return "127.0.0.1:" + masterPort;
    }

    void startMaster() throws Exception {
        List<String> args = new ArrayList<>(List.of("master", "--host", "127.0.0.1", "--port", "" + masterPort,
                "--http-port", "" + httpPort, "--summary-interval", "0s"));
        args.addAll(masterArgs);
        master = start("master", args, line -> line.startsWith("kvpool master listening"));
    }

    void killMaster() {
        master.kill9();
    }

    long masterPid() {
        return master.pid();
    }

    /** A series from the master's /metrics, by its name and labels as printed ({@code a{b="c"}}). */
    double metric(String name) throws Exception {
        String body = HttpClient.newHttpClient().send(HttpRequest.newBuilder(URI.create(
                "http://127.0.0.1:" + httpPort + "/metrics")).build(), HttpResponse.BodyHandlers.ofString()).body();
        Matcher m = Pattern.compile("(?m)^" + Pattern.quote(name) + " (\\S+)$").matcher(body);
        if (!m.find()) {
            throw new AssertionError(name + " not exported; metrics:\n" + body);
        }
        return Double.parseDouble(m.group(1));
    }

    Managed startNode(String segmentSize) throws Exception {
        return startNode(segmentSize, "none");
    }

    /** A node whose segment lives in {@code shmDir} ("none": anonymous memory, no same-machine path). */
    Managed startNode(String segmentSize, String shmDir) throws Exception {
        return startNode(segmentSize, shmDir, 0);
    }

    /** The same on a fixed port (a node restarted on its port keeps its name, and its segment file). */
    Managed startNode(String segmentSize, String shmDir, int port) throws Exception {
        return startNode(segmentSize, shmDir, port, List.of());
    }

    /** The same with {@code extra} flags (secrets, TLS). */
    Managed startNode(String segmentSize, String shmDir, int port, List<String> extra) throws Exception {
        List<String> args = new ArrayList<>(List.of("node", "--master", masterAddress(), "--host", "127.0.0.1", "--port",
                "" + port, "--segment-size", segmentSize, "--shm-dir", shmDir, "--heartbeat-interval", "250ms"));
        args.addAll(extra);
        Managed n = start("node", args, line -> NODE_LINE.matcher(line).find());
        nodes.add(n);
        return n;
    }

    /** Sends a signal (STOP, CONT, ...) to a process. */
    static void signal(Process p, String signal) {
        try {
            Process k = new ProcessBuilder("kill", "-" + signal, Long.toString(p.pid())).inheritIO().start();
            if (!k.waitFor(10, TimeUnit.SECONDS) || k.exitValue() != 0) {
                throw new AssertionError("kill -" + signal + " " + p.pid() + " failed");
            }
        } catch (IOException e) {
            throw new AssertionError("cannot run kill: " + e, e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new AssertionError("interrupted", e);
        }
    }

    private static List<String> javaCommand(List<String> args) {
        return javaCommand("io.kvpool.cli.Main", args);
    }

    /** A JVM running {@code mainClass} from this test's classpath (the CLI, or a test program). */
    static List<String> javaCommand(String mainClass, List<String> args) {
        List<String> cmd = new ArrayList<>();
        cmd.add(Path.of(System.getProperty("java.home"), "bin", "java").toString());
        cmd.addAll(List.of("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "--enable-native-access=ALL-UNNAMED",
                "-cp", System.getProperty("java.class.path"), mainClass));
        cmd.addAll(args);
        return cmd;
    }

    /** Runs a one-shot kvpool command in its own process with extra environment; returns its exit code. */
    static int runCli(Map<String, String> env, String... args) throws Exception {
        ProcessBuilder pb = new ProcessBuilder(javaCommand(List.of(args))).redirectErrorStream(true)
                .redirectOutput(ProcessBuilder.Redirect.DISCARD);
        pb.environment().putAll(env);
        Process p = pb.start();
        if (!p.waitFor(60, TimeUnit.SECONDS)) {
            p.destroyForcibly();
            throw new AssertionError("kvpool " + String.join(" ", args) + " did not finish");
        }
        return p.exitValue();
    }

    /** Where the {@code n}-th process started (1 for the master) writes its output. */
    Path log(String role, int n) {
        return logDir.resolve(role + "-" + n + ".log");
    }

    private Managed start(String role, List<String> args, Predicate<String> ready) throws Exception {
        return launch(logDir.resolve(role + "-" + (++started) + ".log"), role, args, ready);
    }

    /**
     * Starts the kvpool CLI with {@code args} in its own process, its output copied to {@code log}, and
     * waits (up to 60 s) for the line {@code ready} accepts; a node's printed segment name becomes the
     * result's name.
     */
    static Managed launch(Path log, String role, List<String> args, Predicate<String> ready) throws Exception {
        ProcessBuilder pb = new ProcessBuilder(javaCommand(args)).redirectErrorStream(true);
        Process p = pb.start();
        String line = ProcessOutput.follow(p, log, ready, role).get(60, TimeUnit.SECONDS);
        Matcher m = NODE_LINE.matcher(line);
        return new Managed(p, m.find() ? m.group(1) : role, "node".equals(role) ? SegmentFiles.dirOf(args) : null);
    }

    /** Polls the cluster's stats until {@code condition} holds (a condition, not a timing assumption). */
    /**
     * Waits until the master lists exactly {@code n} segments and takes puts on every one of them. A
     * node that has registered is first "joining" (listing its inventory), and a put then is refused
     * NO_SEGMENT or placed on the other nodes only: a test that puts after a registration waits for this,
     * never for the registration alone.
     */
    static PoolStats awaitActive(KvPoolClient c, int n, String what) throws InterruptedException {
        return awaitStats(c, s -> s.segments().size() == n
                && s.segments().stream().allMatch(x -> x.active() && !x.draining()), what + " (active)");
    }

    static PoolStats awaitStats(KvPoolClient c, Predicate<PoolStats> condition, String what) throws InterruptedException {
        long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
        PoolStats last = null;
        while (System.nanoTime() < deadline) {
            try {
                last = c.stats();
                if (condition.test(last)) {
                    return last;
                }
            } catch (RuntimeException e) {
                // the master may be restarting
            }
            Thread.sleep(100);
        }
        throw new AssertionError("timed out waiting until " + what + "; last stats: " + last);
    }

    /** Kills everything; the segment files of every node ever started (restarts adopt their file, keeping its name) go too. */
    @Override
    public void close() {
        for (Managed n : nodes) {
            n.kill9AndRemoveSegment();
        }
        if (master != null) {
            master.kill9();
        }
    }
}
