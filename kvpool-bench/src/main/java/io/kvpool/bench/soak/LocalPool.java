package io.kvpool.bench.soak;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.config.Ports;
import io.kvpool.etcd.EtcdTarget;
import io.kvpool.etcd.LeaderRecord;
import io.kvpool.etcd.LeaderWatch;

import java.io.IOException;
import java.net.InetAddress;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The pool a soak runs against when it starts its own: elected masters and nodes, each a child
 * process running the real {@code kvpool} command (the main class it is given) on loopback, every
 * node behind a {@link Relay}. Node {@code i} listens on 127.0.1.i and advertises 127.0.0.1 on the
 * same port, where its relay listens; the relay survives the node's restarts, so a restarted node
 * keeps its name and adopts its shared-memory segment (unless the soak restarts nodes empty). The
 * segments live in a directory of the soak's own under /dev/shm. Every child is stopped by its PID on
 * {@link #close()} (which a shutdown hook also runs on an interrupt); their output goes to the log
 * directory, one file per start.
 */
final class LocalPool implements AutoCloseable {

    /** How long a child may take to print its ready line (JVM start on a loaded machine). */
    private static final Duration START_TIMEOUT = Duration.ofSeconds(90);

    /** One node: its relay (fixed for the soak) and its current process, if running. */
    static final class Node {
        final int index;
        final Relay relay;
        volatile Process process;

        Node(int index, Relay relay) {
            this.index = index;
            this.relay = relay;
        }

        /** The segment name the master and clients know it by. */
        String name() {
            return "127.0.0.1:" + relay.port();
        }

        boolean running() {
            Process p = process;
            return p != null && p.isAlive();
        }
    }

    /** One master: its fixed ports and its current process, if running. */
    static final class Master {
        final String id;
        final int port;
        final int httpPort;
        volatile Process process;

        Master(String id, int port, int httpPort) {
            this.id = id;
            this.port = port;
            this.httpPort = httpPort;
        }

        boolean running() {
            Process p = process;
            return p != null && p.isAlive();
        }
    }

    private final String mainClass;
    private final String etcdUrl;
    private final Path logDir;
    private final SoakConfig config;
    @GuardedBy("children")
    private final List<Process> children = new ArrayList<>();
    final Map<String, Master> masters = new LinkedHashMap<>();
    final List<Node> nodes = new ArrayList<>();
    private final LeaderWatch watch;
    private final Path shmDir;
    private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(2)).build();
    private int started;
    private volatile boolean closed;

    LocalPool(SoakConfig config, String etcdUrl, String mainClass, Path logDir) throws IOException {
        this.config = config;
        this.etcdUrl = etcdUrl;
        this.mainClass = mainClass;
        this.logDir = logDir;
        Files.createDirectories(logDir);
        // a directory of its own: a node started elsewhere on this machine reclaims the orphaned segment
        // files it finds in its --shm-dir, which would take a killed node's file before its restart adopts it
        Path shm = Path.of("/dev/shm");
        this.shmDir = Files.isDirectory(shm) ? Files.createTempDirectory(shm, "kvpool-soak-") : null;
        this.watch = new LeaderWatch(EtcdTarget.parse(etcdUrl), Duration.ofSeconds(2)).start();
        for (int i = 1; i <= config.masters(); i++) {
            masters.put("m" + i, new Master("m" + i, freePort(), freePort()));
        }
        for (int i = 1; i <= config.nodes(); i++) {
            nodes.add(new Node(i, Relay.onLoopback(InetAddress.getByName("127.0.1." + i))));
        }
    }

    String etcdUrl() {
        return etcdUrl;
    }

    /** Starts every master (the first awaited as leader) and node. */
    void start() throws Exception {
        boolean first = true;
        for (Master m : masters.values()) {
            startMaster(m);
            if (first) {
                awaitLeader(r -> r.ready(), Duration.ofSeconds(60));
                first = false;
            }
        }
        for (Node n : nodes) {
            startNode(n);
        }
    }

    void startMaster(Master m) throws Exception {
        m.process = launch(m.id, List.of("master", "--host", "127.0.0.1", "--port", "" + m.port, "--http-port",
                "" + m.httpPort, "--summary-interval", "10s", "--etcd", etcdUrl, "--id", m.id, "--node-ttl",
                config.nodeTtl().toMillis() + "ms", "--replicas", "" + config.replicas()),
                line -> line.startsWith("kvpool master " + m.id + " standing for election"));
    }

    void startNode(Node n) throws Exception {
        List<String> args = new ArrayList<>(List.of("node", "--master", etcdUrl, "--host", "127.0.1." + n.index,
                "--port", "" + n.relay.port(), "--advertise-host", "127.0.0.1", "--segment-size",
                config.segmentSize().toString(), "--shm-dir", shmDir == null ? "none" : shmDir.toString(),
                "--heartbeat-interval", "250ms"));
        if (config.restartEmpty()) {
            args.add("--no-adopt-segment");
        }
        n.process = launch("node" + n.index, args, line -> line.startsWith("kvpool node "));
    }

    /** SIGKILL, and waits for the process to be gone. */
    static void kill9(Process p) throws InterruptedException {
        if (p != null) {
            p.destroyForcibly();
            p.waitFor(30, TimeUnit.SECONDS);
        }
    }

    LeaderRecord leader() throws Exception {
        return watch.refresh();
    }

    LeaderRecord awaitLeader(java.util.function.Predicate<LeaderRecord> wanted, Duration timeout) throws Exception {
        return watch.await(wanted, timeout);
    }

    /** A metric without labels from the leading master's /metrics; NaN when it cannot be read now. */
    double metric(String name) {
        try {
            LeaderRecord r = watch.latest();
            if (r == null || !r.ready() || r.http().isEmpty()) {
                return Double.NaN;
            }
            String body = http.send(HttpRequest.newBuilder(URI.create("http://" + r.http() + "/metrics"))
                    .timeout(Duration.ofSeconds(5)).build(), HttpResponse.BodyHandlers.ofString()).body();
            Matcher m = Pattern.compile("(?m)^" + Pattern.quote(name) + " (\\S+)$").matcher(body);
            return m.find() ? Double.parseDouble(m.group(1)) : Double.NaN;
        } catch (IOException | RuntimeException e) {
            return Double.NaN;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return Double.NaN;
        }
    }

    private Process launch(String role, List<String> args, java.util.function.Predicate<String> ready)
            throws Exception {
        if (closed) {
            throw new IllegalStateException("the soak's pool is stopping");
        }
        Path log = logDir.resolve(role + "-" + (++started) + ".log");
        List<String> cmd = new ArrayList<>(List.of(Path.of(System.getProperty("java.home"), "bin", "java").toString(),
                "-Xmx" + config.childHeap(), "-XX:+UseSerialGC", "--enable-native-access=ALL-UNNAMED", "-cp",
                System.getProperty("java.class.path"), mainClass));
        cmd.addAll(args);
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        synchronized (children) {
            children.add(p);
        }
        CompletableFuture<String> up = ProcessOutput.follow(p, log, ready, role);
        try {
            up.get(START_TIMEOUT.toSeconds(), TimeUnit.SECONDS);
        } catch (java.util.concurrent.ExecutionException e) {
            throw new IllegalStateException(e.getCause().getMessage(), e.getCause());
        } catch (java.util.concurrent.TimeoutException e) {
            kill9(p);
            throw new IllegalStateException(role + " did not start within " + START_TIMEOUT.toSeconds() + " s; see "
                    + log.toAbsolutePath());
        }
        return p;
    }

    private static int freePort() throws IOException {
        return Ports.reservable(); // below the ephemeral range: no client connection takes it meanwhile
    }

    /** Stops every child this pool started, by PID (SIGKILL: the soak's verdict is already taken). */
    @Override
    public synchronized void close() {
        if (closed) {
            return; // the soak's end and a shutdown hook may both close
        }
        closed = true;
        List<Process> all;
        synchronized (children) {
            all = new ArrayList<>(children);
        }
        for (Process p : all) {
            p.destroyForcibly();
        }
        for (Process p : all) {
            try {
                p.waitFor(30, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        for (Node n : nodes) {
            n.relay.close();
        }
        watch.close();
        if (shmDir != null) {
            try (var files = Files.list(shmDir)) {
                for (Path f : files.toList()) {
                    Files.deleteIfExists(f);
                }
                Files.deleteIfExists(shmDir);
            } catch (IOException e) {
                System.err.println("kvpool soak: could not remove " + shmDir + ": " + e.getMessage());
            }
        }
    }
}
