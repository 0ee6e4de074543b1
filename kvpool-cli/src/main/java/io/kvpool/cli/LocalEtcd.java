package io.kvpool.cli;

import io.kvpool.config.Ports;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * An etcd on this machine for {@code kvpool launch --masters N}, started and stopped through the
 * project's script {@code scripts/etcd.sh} (which installs Debian's etcd-server when it is missing,
 * runs etcd on loopback, and stops it by PID). Its data and log live under the launcher's log
 * directory. For masters on several hosts, run etcd where they can all reach it and pass
 * {@code --etcd} instead.
 */
final class LocalEtcd implements AutoCloseable {

    /** scripts/etcd.sh's exit status when a port is in use. */
    private static final int PORT_IN_USE = 4;
    private static final int PORT_ATTEMPTS = 5;

    private final Path script;
    private final Path dir;
    final int clientPort;

    private LocalEtcd(Path script, Path dir, int clientPort) {
        this.script = script;
        this.dir = dir;
        this.clientPort = clientPort;
    }

    /** Starts etcd with its data in {@code dir}; throws naming the script's output when it cannot. */
    static LocalEtcd start(Path dir) throws IOException, InterruptedException {
        String home = System.getenv("KVPOOL_HOME");
        Path script = Path.of(home == null ? "." : home, "scripts", "etcd.sh").toAbsolutePath().normalize();
        if (!Files.isRegularFile(script)) {
            throw new IOException("cannot start etcd: " + script + " not found (run kvpool from its checkout, or pass"
                    + " --etcd etcd://HOST:PORT of an etcd you run)");
        }
        Files.createDirectories(dir);
        // a port taken between choosing it and etcd binding it (the script's exit status 4) is tried
        // again on two new ones, a few times
        for (int attempt = 1; ; attempt++) {
            // a fresh member each start: its ports are new, and an old data directory would keep the old
            // member's peer address (etcd.sh then refuses it). The pool's records in it (leader, node and
            // owed lists) belong to masters that are gone too.
            deleteTree(dir.resolve("data"));
            int client = freePort();
            int peer = freePort();
            Process p = new ProcessBuilder(List.of("bash", script.toString(), "start", dir.toString(), "" + client,
                    "" + peer)).redirectErrorStream(true).start();
            String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
            boolean done = p.waitFor(120, TimeUnit.SECONDS);
            if (done && p.exitValue() == 0) {
                return new LocalEtcd(script, dir, client);
            }
            if (!done) {
                p.destroyForcibly();
            }
            if (!done || p.exitValue() != PORT_IN_USE || attempt == PORT_ATTEMPTS) {
                throw new IOException("cannot start etcd with " + script + ":\n" + out.strip());
            }
        }
    }

    String url(String cluster) {
        return "etcd://127.0.0.1:" + clientPort + "/" + cluster;
    }

    private static void deleteTree(Path root) throws IOException {
        if (!Files.exists(root)) {
            return;
        }
        try (var paths = Files.walk(root)) {
            for (Path p : paths.sorted(Comparator.reverseOrder()).toList()) {
                Files.delete(p);
            }
        }
    }

    private static int freePort() throws IOException {
        return Ports.reservable(); // below the ephemeral range: no client connection takes it meanwhile
    }

    /** Stops etcd by its PID (the script's stop). */
    @Override
    public void close() {
        try {
            Process p = new ProcessBuilder(List.of("bash", script.toString(), "stop", dir.toString()))
                    .redirectErrorStream(true).redirectOutput(ProcessBuilder.Redirect.DISCARD).start();
            p.waitFor(60, TimeUnit.SECONDS);
        } catch (IOException e) {
            System.err.println("kvpool launch: stopping etcd: " + e.getMessage());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
