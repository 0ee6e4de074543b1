package io.kvpool.it;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * A real etcd on loopback for one test, started and stopped through the project's script
 * ({@code scripts/etcd.sh}: installs Debian's etcd-server when missing, stops by PID). Its data
 * directory survives {@link #stop()}, so {@link #start()} again is an etcd restart.
 */
final class EtcdProcess implements AutoCloseable {

    private static final Path SCRIPT = Path.of("..", "scripts", "etcd.sh").toAbsolutePath().normalize();

    final Path dir;
    final int clientPort;
    final int peerPort;

    /** An etcd whose data lives in {@code dir}, emptied first (an earlier run's member used other ports). */
    EtcdProcess(Path dir) throws IOException {
        this.dir = dir;
        if (Files.exists(dir)) {
            try (var files = Files.walk(dir)) {
                for (Path p : files.sorted(Comparator.reverseOrder()).toList()) {
                    Files.delete(p);
                }
            }
        }
        this.clientPort = ProcessCluster.freePort();
        this.peerPort = ProcessCluster.freePort();
    }

    /** The etcd:// address of this etcd for {@code cluster}. */
    String url(String cluster) {
        return "etcd://127.0.0.1:" + clientPort + "/" + cluster;
    }

    /** Starts etcd; null when it started, else why it could not (etcd not installable here). */
    String start() throws Exception {
        Files.createDirectories(dir);
        Process p = new ProcessBuilder(List.of("bash", SCRIPT.toString(), "start", dir.toString(), "" + clientPort,
                "" + peerPort)).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        if (!p.waitFor(120, TimeUnit.SECONDS)) {
            p.destroyForcibly();
            return "scripts/etcd.sh start did not finish: " + out;
        }
        return p.exitValue() == 0 ? null : "scripts/etcd.sh start failed (exit " + p.exitValue() + "): " + out.strip();
    }

    /** Stops etcd by its PID (kept data). */
    void stop() throws Exception {
        Process p = new ProcessBuilder(List.of("bash", SCRIPT.toString(), "stop", dir.toString()))
                .redirectErrorStream(true).redirectOutput(ProcessBuilder.Redirect.DISCARD).start();
        if (!p.waitFor(60, TimeUnit.SECONDS)) {
            p.destroyForcibly();
            throw new AssertionError("scripts/etcd.sh stop did not finish");
        }
    }

    @Override
    public void close() throws Exception {
        stop();
    }
}
