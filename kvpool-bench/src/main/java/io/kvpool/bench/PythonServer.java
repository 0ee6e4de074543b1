package io.kvpool.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.google.errorprone.annotations.concurrent.GuardedBy;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * A Python benchmark process in serve mode ({@code python/kvpool/bench.py}'s protocol): one JSON object a
 * line each way. It first writes a ready line ({@code {"ok": true, "ready": true, ...}}, kept as
 * {@link #hello()}), then answers each phase request with its measurement; {@code {"quit": true}} ends it.
 * Its stderr is kept (the last few kilobytes) for the error of a phase that fails.
 */
final class PythonServer implements AutoCloseable {

    private static final Duration REPLY_TIMEOUT = Duration.ofMinutes(5);
    private static final ObjectMapper JSON = new ObjectMapper();

    private final Process process;
    private final Writer in;
    private final BlockingQueue<String> lines = new LinkedBlockingQueue<>();
    @GuardedBy("stderr")
    private final StringBuilder stderr = new StringBuilder();
    private JsonNode hello;

    private PythonServer(Process process) {
        this.process = process;
        this.in = new OutputStreamWriter(process.getOutputStream(), StandardCharsets.UTF_8);
        Thread.ofVirtual().start(() -> pump(new BufferedReader(new InputStreamReader(process.getInputStream(),
                StandardCharsets.UTF_8)), true));
        Thread.ofVirtual().start(() -> pump(new BufferedReader(new InputStreamReader(process.getErrorStream(),
                StandardCharsets.UTF_8)), false));
    }

    /** Starts {@code command} with {@code env} added to this process's environment and waits for its ready line. */
    static PythonServer start(List<String> command, Map<String, String> env) throws Exception {
        ProcessBuilder pb = new ProcessBuilder(command);
        pb.environment().putAll(env);
        pb.environment().put("PYTHONUNBUFFERED", "1");
        PythonServer s = new PythonServer(pb.start());
        try {
            s.hello = s.reply();
        } catch (Exception e) {
            s.close();
            throw e;
        }
        return s;
    }

    /** The ready line: what the Python side runs with. */
    JsonNode hello() {
        return hello;
    }

    private void pump(BufferedReader r, boolean out) {
        try (r) {
            String line;
            while ((line = r.readLine()) != null) {
                if (out) {
                    lines.add(line);
                } else {
                    synchronized (stderr) {
                        stderr.append(line).append('\n');
                        if (stderr.length() > 16_000) {
                            stderr.delete(0, stderr.length() - 8_000);
                        }
                    }
                }
            }
        } catch (IOException ignored) {
            // the process ended
        } finally {
            if (out) {
                lines.add("");
            }
        }
    }

    private JsonNode reply() throws Exception {
        String line = lines.poll(REPLY_TIMEOUT.toSeconds(), TimeUnit.SECONDS);
        if (line == null || line.isEmpty()) {
            throw new IllegalStateException("the Python bench " + (line == null ? "did not answer within "
                    + REPLY_TIMEOUT.toMinutes() + " min" : "exited (" + exitStatus() + ")") + "; its stderr:\n" + tail());
        }
        JsonNode n = JSON.readTree(line);
        if (!n.path("ok").asBoolean()) {
            throw new IllegalStateException("the Python bench failed: " + n.path("error").asText() + "\nstderr:\n" + tail());
        }
        return n;
    }

    private String exitStatus() {
        try {
            return process.waitFor(5, TimeUnit.SECONDS) ? "exit " + process.exitValue() : "still running";
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return "unknown";
        }
    }

    private String tail() {
        synchronized (stderr) {
            return stderr.length() > 4000 ? stderr.substring(stderr.length() - 4000) : stderr.toString();
        }
    }

    /** Runs one phase on {@code clients} Python processes; the measurement as the Java side's. */
    Measurement phase(String phase, int clients, Duration warmup, Duration duration, List<String> keys)
            throws Exception {
        ObjectNode req = JSON.createObjectNode().put("phase", phase).put("clients", clients)
                .put("warmup", warmup.toMillis() / 1e3).put("duration", duration.toMillis() / 1e3);
        if (keys != null) {
            keys.forEach(req.putArray("keys")::add);
        }
        in.write(JSON.writeValueAsString(req) + "\n");
        in.flush();
        JsonNode r = reply();
        JsonNode l = r.path("lat_ns");
        long[] lat = new long[l.size()];
        for (int i = 0; i < lat.length; i++) {
            lat[i] = l.get(i).asLong();
        }
        return new Measurement(r.path("ops").asLong(), r.path("bytes").asLong(), r.path("wall_ns").asLong(), lat);
    }

    @Override
    public void close() throws Exception {
        try {
            in.write("{\"quit\": true}\n");
            in.flush();
        } catch (IOException ignored) {
            // already gone
        }
        if (!process.waitFor(30, TimeUnit.SECONDS)) {
            process.descendants().forEach(ProcessHandle::destroy);
            process.destroy();
            process.waitFor(10, TimeUnit.SECONDS);
        }
    }
}
