package io.kvpool.bench;

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
 */
final class PoolProcess implements AutoCloseable {

    final int masterPort;
    final int httpPort;
    final long pid;
    private final Process process;

    private PoolProcess(Process process, int masterPort, int httpPort, long pid) {
        this.process = process;
        this.masterPort = masterPort;
        this.httpPort = httpPort;
        this.pid = pid;
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
                    } else if (out.length() < 20_000) {
                        out.append(line).append('\n');
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
        return new PoolProcess(p, Integer.parseInt(f[1]), Integer.parseInt(f[2]), Long.parseLong(f[3]));
    }

    String masterAddress() {
        return "127.0.0.1:" + masterPort;
    }

    /** Asks the pool's JVM for a full collection (jcmd GC.run) so heap readings are comparable. */
    void collectGarbage() throws Exception {
        Path jcmd = Path.of(System.getProperty("java.home"), "bin", "jcmd");
        Process p = new ProcessBuilder(jcmd.toString(), Long.toString(pid), "GC.run")
                .redirectErrorStream(true).redirectOutput(ProcessBuilder.Redirect.DISCARD).start();
        if (!p.waitFor(60, TimeUnit.SECONDS) || p.exitValue() != 0) {
            throw new IllegalStateException("jcmd " + pid + " GC.run failed");
        }
    }

    /** A gauge from the master's /metrics, e.g. {@code master_objects} or {@code jvm_memory_used_bytes{area="heap"}}. */
    double metric(String name) throws Exception {
        HttpResponse<String> r = HttpClient.newHttpClient().send(
                HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + httpPort + "/metrics")).build(),
                HttpResponse.BodyHandlers.ofString());
        Matcher m = Pattern.compile("^" + Pattern.quote(name) + " (\\S+)$", Pattern.MULTILINE).matcher(r.body());
        if (!m.find()) {
            throw new IllegalStateException("metric " + name + " not exported by the master");
        }
        return Double.parseDouble(m.group(1));
    }

    @Override
    public void close() throws Exception {
        process.destroy();
        if (!process.waitFor(10, TimeUnit.SECONDS)) {
            process.destroyForcibly();
            process.waitFor(10, TimeUnit.SECONDS);
        }
    }
}
