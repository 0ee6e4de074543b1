package io.kvpool.bench;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.protocol.Tls;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * A {@link PoolMain} in a child JVM, so the pool under test does not share a heap, a garbage
 * collector or JIT threads with the benchmark's clients: like a real deployment, and like Redis and
 * the raw TCP baseline, which also run in their own processes.
 *
 * <p>The pool binds its ports itself (port 0) and reports them, with its pid and its nodes' names,
 * on its ready line, so no other process can hold them in between. A section that finds fewer
 * objects than it stored asks {@link #whyMissing}: a pool that died (the kernel's OOM killer, on a
 * machine short of memory) must not pass for eviction, as it did when the connector's failed
 * lookup read as a miss (issue 25).
 */
final class PoolProcess implements AutoCloseable {

    final int masterPort;
    final int httpPort;
    final long pid;
    /** The names of the pool's nodes ({@code host:port}), as the pool printed them. */
    final List<String> nodes;
    private final Process process;
    /** What the pool printed after its ready line (the first 20,000 characters). */
    private final StringBuilder output;

    private PoolProcess(Process process, int masterPort, int httpPort, long pid, List<String> nodes,
                        StringBuilder output) {
        this.process = process;
        this.masterPort = masterPort;
        this.httpPort = httpPort;
        this.pid = pid;
        this.nodes = nodes;
        this.output = output;
    }

    /** Starts a pool whose node has {@code segmentSize} (e.g. "4GiB"), or a master alone for "0". */
    static PoolProcess start(String segmentSize, String maxHeap) throws Exception {
        return start(segmentSize, maxHeap, 1);
    }

    /** A pool of {@code nodes} nodes of {@code segmentSize} each. */
    static PoolProcess start(String segmentSize, String maxHeap, int nodes) throws Exception {
        return start(segmentSize, maxHeap, nodes, Tls.NONE);
    }

    /** The same in mutual TLS with {@code tls}'s files ({@link Tls#NONE}: plain TCP). */
    static PoolProcess start(String segmentSize, String maxHeap, int nodes, Tls tls) throws Exception {
        List<String> cmd = new ArrayList<>();
        cmd.add(Path.of(System.getProperty("java.home"), "bin", "java").toString());
        cmd.addAll(List.of("-Xmx" + maxHeap, "-XX:+UseParallelGC", "--enable-native-access=ALL-UNNAMED"));
        // e.g. KVPOOL_BENCH_POOL_JAVA_OPTS="-XX:StartFlightRecording=filename=pool.jfr" to profile the pool
        String extra = System.getenv("KVPOOL_BENCH_POOL_JAVA_OPTS");
        if (extra != null && !extra.isBlank()) {
            cmd.addAll(List.of(extra.trim().split("\\s+")));
        }
        cmd.addAll(List.of("-cp", System.getProperty("java.class.path"), PoolMain.class.getName(), segmentSize,
                Integer.toString(nodes)));
        if (tls.enabled()) {
            cmd.addAll(List.of(tls.certFile().toString(), tls.keyFile().toString(), tls.caFile().toString()));
        }
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        CompletableFuture<String> ready = new CompletableFuture<>();
        StringBuilder out = new StringBuilder();
        Thread.ofVirtual().start(() -> {
            try (BufferedReader r = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8))) {
                String line;
                while ((line = r.readLine()) != null) {
                    if (!ready.isDone() && line.startsWith("ready ")) {
                        ready.complete(line);
                    } else {
                        synchronized (out) {
                            if (out.length() < 20_000) {
                                out.append(line).append('\n');
                            }
                        }
                    }
                }
            } catch (Exception e) {
                ready.completeExceptionally(e);
            }
            ready.completeExceptionally(new IllegalStateException("the pool process exited:\n" + out));
        });
        String[] f;
        try {
            f = ready.get(60, TimeUnit.SECONDS).split(" ");
        } catch (TimeoutException e) {
            p.destroyForcibly();
            throw new IllegalStateException("the pool process (segment " + segmentSize + ") was not ready within 60 s"
                    + " (a loaded machine commits a large segment slowly); its output:\n" + out, e);
        }
        List<String> names = f.length > 4 && !f[4].equals("-") ? List.of(f[4].split(",")) : List.of();
        return new PoolProcess(p, Integer.parseInt(f[1]), Integer.parseInt(f[2]), Long.parseLong(f[3]), names, out);
    }

    /**
     * Why the pool does not hold the blocks of {@code keys} that were just stored in it, for the
     * message of a section that found fewer: the pool process ended (and how), the pool does not
     * answer, the master answering is another pool's (its segments are not this pool's), the
     * connector's lookup failed though the pool holds them, or the pool evicted or dropped them.
     * Asked once something is already wrong; never throws.
     */
    String whyMissing(KvPoolClient client, List<String> keys) {
        if (!process.isAlive()) {
            return died();
        }
        int held;
        PoolStats stats;
        try {
            held = client.prefixMatch(keys);
            stats = client.stats();
        } catch (RuntimeException e) {
            return process.isAlive() ? "the pool (pid " + pid + ") does not answer: " + e.getMessage() : died();
        }
        List<String> answering = stats.segments().stream().map(PoolStats.SegmentStats::name).toList();
        if (!nodes.isEmpty() && !answering.containsAll(nodes)) {
            return "the master at " + masterAddress() + " is not this pool's: its segments are " + answering
                    + ", this pool's nodes " + nodes;
        }
        if (held == keys.size()) {
            return "the pool holds all " + keys.size() + " blocks; the connector's lookup failed (its warning says why)";
        }
        String evicted;
        try {
            evicted = String.format(java.util.Locale.ROOT, "%.0f objects evicted and %.0f segments dropped so far",
                    metric("master_evicted_keys_total"), metric("master_dropped_segments_total"));
        } catch (Exception e) {
            evicted = "its metrics unreadable (" + e.getMessage() + ")";
        }
        return "the pool holds the first " + held + " of " + keys.size() + " blocks; it has " + stats.keys()
                + " objects in " + io.kvpool.config.Size.human(stats.allocatedBytes()) + " of "
                + io.kvpool.config.Size.human(stats.capacityBytes()) + ", " + evicted;
    }

    /** The pool process's end, and what it printed last. */
    private String died() {
        try {
            process.waitFor(5, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        String printed;
        synchronized (output) {
            printed = output.toString().strip();
        }
        return "the pool process (pid " + pid + ") is gone, " + (process.isAlive() ? "its exit code unknown"
                : Children.describeExit(process.exitValue())) + (printed.isEmpty() ? "" : "; it printed:\n" + printed);
    }

    String masterAddress() {
        return "127.0.0.1:" + masterPort;
    }

    /** Asks the pool's JVM for a full collection (jcmd GC.run) so heap readings are comparable. */
    void collectGarbage() throws Exception {
        collectGarbage(pid);
    }

    /** A full collection in the JVM of {@code pid}, through jcmd. */
    static void collectGarbage(long pid) throws Exception {
        Path jcmd = Path.of(System.getProperty("java.home"), "bin", "jcmd");
        Process p = new ProcessBuilder(jcmd.toString(), Long.toString(pid), "GC.run")
                .redirectErrorStream(true).redirectOutput(ProcessBuilder.Redirect.DISCARD).start();
        if (!p.waitFor(60, TimeUnit.SECONDS) || p.exitValue() != 0) {
            throw new IllegalStateException("jcmd " + pid + " GC.run failed");
        }
    }

    /** A gauge from the master's /metrics, e.g. {@code master_objects} or {@code jvm_memory_used_bytes{area="heap"}}. */
    double metric(String name) throws Exception {
        return metric(httpPort, name);
    }

    /** The same from the master whose HTTP port is {@code httpPort}. */
    static double metric(int httpPort, String name) throws Exception {
        HttpResponse<String> r = HttpClient.newHttpClient().send(
                HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + httpPort + "/metrics")).build(),
                HttpResponse.BodyHandlers.ofString());
        Matcher m = Pattern.compile("^" + Pattern.quote(name) + " (\\S+)$", Pattern.MULTILINE).matcher(r.body());
        if (!m.find()) {
            throw new IllegalStateException("metric " + name + " not exported by the master");
        }
        return Double.parseDouble(m.group(1));
    }

    /** Stops the pool (SIGTERM, then SIGKILL) and removes any segment file it could not ({@link Children#stop}). */
    @Override
    public void close() throws Exception {
        Children.stop(process);
    }
}
