package io.kvpool.it;

import org.junit.jupiter.api.Assumptions;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * A real etcd on loopback for one test, started and stopped through the project's script
 * ({@code scripts/etcd.sh}: installs Debian's etcd-server when missing, stops by PID). Its data
 * directory survives {@link #stop()}, so {@link #start()} again is an etcd restart, on the same ports.
 *
 * <p>What a start that does not succeed means, from the script's exit status:
 * <ul>
 *   <li>3, etcd is missing and cannot be installed here (no package, no root, no network): the test is
 *       skipped (aborted), saying why. The only skip.</li>
 *   <li>4, a port turned out taken between choosing it and etcd binding it: not a fault of etcd nor of
 *       the code under test. The first start picks two new ports (and empties the data directory, whose
 *       member names its peer URL) and tries again, up to {@value #PORT_ATTEMPTS} times; a restart keeps
 *       its ports, so there it fails.</li>
 *   <li>anything else (etcd crashed, never answered, answered as another etcd, a bad exit): an
 *       AssertionError with the script's reason and the tail of etcd's log, which the script prints.</li>
 * </ul>
 */
final class EtcdProcess implements AutoCloseable {

    static final Path SCRIPT = Path.of("..", "scripts", "etcd.sh").toAbsolutePath().normalize();
    /** scripts/etcd.sh's exit status for "etcd is missing and cannot be installed here". */
    static final int UNAVAILABLE = 3;
    /** scripts/etcd.sh's exit status for "a port is in use". */
    static final int PORT_IN_USE = 4;
    static final int PORT_ATTEMPTS = 5;
    private static final long SCRIPT_TIMEOUT_SECONDS = 600; // an install may wait for apt's lock

    /** Where ports come from: free ones, or (in the tests of this class) taken ones. */
    @FunctionalInterface
    interface Ports {
        int next() throws IOException;
    }

    final Path dir;
    private final Path script;
    private final Map<String, String> env;
    private final Ports ports;
    private int clientPort;
    private int peerPort;

    /** An etcd whose data lives in {@code dir}, emptied first (an earlier run's member used other ports). */
    EtcdProcess(Path dir) throws IOException {
        this(dir, SCRIPT, Map.of(), ProcessCluster::freePort);
    }

    /** The same, started by {@code script} with {@code env} added to its environment, on ports from {@code ports}. */
    EtcdProcess(Path dir, Path script, Map<String, String> env, Ports ports) throws IOException {
        this.dir = dir;
        this.script = script;
        this.env = Map.copyOf(env);
        this.ports = ports;
        deleteTree(dir);
    }

    /** The client port; 0 before the first start. */
    int clientPort() {
        return clientPort;
    }

    /** The etcd:// address of this etcd for {@code cluster}. */
    String url(String cluster) {
        if (clientPort == 0) {
            throw new IllegalStateException("etcd in " + dir + " was never started");
        }
        return "etcd://127.0.0.1:" + clientPort + "/" + cluster;
    }

    /**
     * Starts etcd, or restarts it on its data and ports after {@link #stop()}. Aborts the test when etcd
     * cannot be installed here; throws an AssertionError naming the cause and the tail of etcd's log
     * when it is present and fails.
     */
    void start() throws Exception {
        Files.createDirectories(dir);
        if (clientPort != 0) {
            Result r = run("start", "" + clientPort, "" + peerPort);
            if (r.status != 0) {
                throw failure(r);
            }
            return;
        }
        List<String> clashes = new ArrayList<>();
        for (int attempt = 1; attempt <= PORT_ATTEMPTS; attempt++) {
            int client = ports.next();
            int peer = ports.next();
            if (peer == client) {
                clashes.add("port " + client + " chosen twice");
                continue;
            }
            deleteTree(dir.resolve("data")); // a member made on other ports would keep their peer URL
            Result r = run("start", "" + client, "" + peer);
            switch (r.status) {
                case 0 -> {
                    clientPort = client;
                    peerPort = peer;
                    return;
                }
                case UNAVAILABLE -> Assumptions.abort("etcd cannot be installed here: " + r.output);
                case PORT_IN_USE -> clashes.add("ports " + client + "/" + peer + ": " + lastLine(r.output));
                default -> throw failure(r);
            }
        }
        throw new AssertionError("etcd did not start: its ports were taken " + PORT_ATTEMPTS + " times in a row ("
                + String.join("; ", clashes) + ")");
    }

    /** Stops etcd by its PID (kept data). */
    void stop() throws Exception {
        Result r = run("stop");
        if (r.status != 0) {
            throw new AssertionError("scripts/etcd.sh stop " + dir + " failed (exit " + r.status + "): " + r.output);
        }
    }

    @Override
    public void close() throws Exception {
        stop();
    }

    /** The script's exit status and everything it printed (the etcd log's tail among it, on a failure). */
    private record Result(int status, String output) {
    }

    private Result run(String command, String... ports) throws Exception {
        List<String> cmd = new ArrayList<>(List.of("bash", script.toString(), command, dir.toString()));
        cmd.addAll(List.of(ports));
        Path out = Files.createTempFile("etcd-script", ".out");
        try {
            ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(out.toFile());
            pb.environment().putAll(env);
            Process p = pb.start();
            if (!p.waitFor(SCRIPT_TIMEOUT_SECONDS, TimeUnit.SECONDS)) {
                p.destroyForcibly();
                throw new AssertionError("scripts/etcd.sh " + command + " " + dir + " did not finish in "
                        + SCRIPT_TIMEOUT_SECONDS + " s: " + Files.readString(out));
            }
            return new Result(p.exitValue(), Files.readString(out, StandardCharsets.UTF_8).strip());
        } finally {
            Files.deleteIfExists(out);
        }
    }

    private AssertionError failure(Result r) {
        return new AssertionError("etcd did not start, and not for want of an install (scripts/etcd.sh exit "
                + r.status + "): " + r.output);
    }

    private static String lastLine(String text) {
        return text.substring(text.lastIndexOf('\n') + 1);
    }

    private static void deleteTree(Path root) throws IOException {
        if (!Files.exists(root)) {
            return;
        }
        try (var files = Files.walk(root)) {
            for (Path p : files.sorted(Comparator.reverseOrder()).toList()) {
                Files.delete(p);
            }
        }
    }
}
