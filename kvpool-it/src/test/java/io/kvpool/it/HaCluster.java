package io.kvpool.it;

import io.kvpool.etcd.EtcdGateway;
import io.kvpool.etcd.EtcdTarget;
import io.kvpool.etcd.LeaderRecord;
import io.kvpool.etcd.LeaderWatch;
import io.kvpool.etcd.StandbysInSync;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeoutException;
import java.util.function.Predicate;

/**
 * Several masters elected through a real etcd, and nodes, each an OS process on loopback (the real
 * CLI): what the failover tests run against. Skips the test, saying why, only when etcd cannot be
 * installed here; an etcd that is installed but does not start fails it ({@link EtcdProcess#start()}).
 */
final class HaCluster implements AutoCloseable {

    final EtcdProcess etcd;
    final String url;
    final EtcdTarget target;
    final Map<String, ProcessCluster.Managed> masters = new LinkedHashMap<>();
    final Map<String, Integer> masterPorts = new LinkedHashMap<>();
    final List<ProcessCluster.Managed> nodes = new ArrayList<>();
    private final Path logDir;
    private final LeaderWatch watch;
    private int started;

    HaCluster(String testName, int masterCount, String... masterArgs) throws Exception {
        this.logDir = Path.of("target", "it-logs", testName);
        Files.createDirectories(logDir);
        this.etcd = new EtcdProcess(logDir.resolve("etcd").toAbsolutePath());
        etcd.start();
        this.url = etcd.url("it-" + testName);
        this.target = EtcdTarget.parse(url);
        this.watch = new LeaderWatch(target, Duration.ofSeconds(2)).start();
        for (int i = 1; i <= masterCount; i++) {
            startMaster("m" + i, masterArgs);
            if (i == 1) {
                awaitLeader(r -> r.ready(), "the first master to lead");
            }
        }
    }

    ProcessCluster.Managed startMaster(String id, String... extra) throws Exception {
        int port = masterPorts.computeIfAbsent(id, k -> freePort());
        List<String> args = new ArrayList<>(List.of("master", "--host", "127.0.0.1", "--port", "" + port,
                "--summary-interval", "0s", "--etcd", url, "--id", id));
        if (!List.of(extra).contains("--http-port")) {
            args.addAll(List.of("--http-port", "-1"));
        }
        args.addAll(List.of(extra));
        ProcessCluster.Managed m = ProcessCluster.launch(logDir.resolve(id + "-" + (++started) + ".log"), id, args,
                line -> line.startsWith("kvpool master " + id + " standing for election"));
        masters.put(id, m);
        return m;
    }

    ProcessCluster.Managed startNode(String segmentSize) throws Exception {
        return startNode(segmentSize, "none", 0);
    }

    /** A node whose segment lives in {@code shmDir}, on {@code port} (restarted there, it adopts its segment). */
    ProcessCluster.Managed startNode(String segmentSize, String shmDir, int port) throws Exception {
        ProcessCluster.Managed n = ProcessCluster.launch(logDir.resolve("node-" + (++started) + ".log"), "node",
                List.of("node", "--master", url, "--host", "127.0.0.1", "--port", "" + port, "--segment-size",
                        segmentSize, "--shm-dir", shmDir, "--heartbeat-interval", "250ms"),
                line -> line.startsWith("kvpool node "));
        nodes.add(n);
        return n;
    }

    /** The leader record now (read from etcd). */
    LeaderRecord leader() throws Exception {
        return watch.refresh();
    }

    /** Waits (up to 60 s) for a leader record that satisfies {@code wanted}. */
    LeaderRecord awaitLeader(Predicate<LeaderRecord> wanted, String what) throws Exception {
        try {
            return watch.await(wanted, Duration.ofSeconds(60));
        } catch (TimeoutException e) {
            throw new AssertionError("timed out waiting for " + what + ": " + e.getMessage(), e);
        }
    }

    /** Waits until the leader has published {@code n} registered nodes in etcd (what a next leader waits for). */
    void awaitNodesListed(int n) throws Exception {
        try (EtcdGateway g = new EtcdGateway(target.endpoints(), Duration.ofSeconds(5))) {
            long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
            while (g.rangePrefix(target.nodesPrefix()).kvs().size() != n) {
                if (System.nanoTime() > deadline) {
                    throw new AssertionError("the leader did not list " + n + " nodes in etcd");
                }
                Thread.sleep(50);
            }
        }
    }

    /** Waits until the leader names standby {@code id} in sync in etcd (hot standby: it may serve from its copy). */
    void awaitStandbyInSync(String id) throws Exception {
        try (EtcdGateway g = new EtcdGateway(target.endpoints(), Duration.ofSeconds(5))) {
            long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
            while (true) {
                StandbysInSync named = StandbysInSync.read(g, target);
                if (named != null && named.ids().contains(id)) {
                    return;
                }
                if (System.nanoTime() > deadline) {
                    throw new AssertionError("the leader did not name standby " + id + " in sync in etcd");
                }
                Thread.sleep(20);
            }
        }
    }

    /** Everything master or node {@code id} printed, over its restarts (their log files here). */
    String log(String id) throws IOException {
        StringBuilder out = new StringBuilder();
        try (var files = Files.list(logDir)) {
            for (Path f : files.filter(f -> f.getFileName().toString().startsWith(id + "-")).sorted().toList()) {
                out.append(Files.readString(f));
            }
        }
        return out.toString();
    }

    /** Waits until the leader lists at least one segment it owes frees to in etcd. */
    void awaitOwedListed() throws Exception {
        awaitOwed(true);
    }

    /** Waits until the leader lists no segment it owes frees to in etcd. */
    void awaitOwedCleared() throws Exception {
        awaitOwed(false);
    }

    private void awaitOwed(boolean listed) throws Exception {
        try (EtcdGateway g = new EtcdGateway(target.endpoints(), Duration.ofSeconds(5))) {
            long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
            while (g.rangePrefix(target.owedPrefix()).kvs().isEmpty() == listed) {
                if (System.nanoTime() > deadline) {
                    throw new AssertionError(listed ? "the leader listed no segment it owes frees to in etcd"
                            : "the leader still lists segments it owes frees to in etcd");
                }
                Thread.sleep(50);
            }
        }
    }

    ProcessCluster.Managed master(String id) {
        return masters.get(id);
    }

    /** The client port of master {@code id}. */
    int port(String id) {
        return masterPorts.get(id);
    }

    private static int freePort() {
        try {
            return ProcessCluster.freePort();
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    @Override
    public void close() throws Exception {
        watch.close();
        // SIGKILL ends a stopped (frozen) process too
        for (ProcessCluster.Managed n : nodes) {
            n.kill9AndRemoveSegment();
        }
        for (ProcessCluster.Managed m : masters.values()) {
            m.kill9();
        }
        etcd.close();
    }
}
