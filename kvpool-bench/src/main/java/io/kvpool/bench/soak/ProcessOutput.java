package io.kvpool.bench.soak;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.CompletableFuture;
import java.util.function.Predicate;

/**
 * A child process's output (stdout with stderr merged in), copied line by line to a log file by a
 * virtual thread, and the first line that shows it is ready. Used by the soak's pool and by the
 * integration tests' process clusters.
 */
public final class ProcessOutput {

    private ProcessOutput() {
    }

    /**
     * Copies {@code p}'s output to {@code log} until it ends. The result completes with the first line
     * {@code ready} accepts, or fails when the process exits before printing one ({@code who} names it
     * in that error, with the log's path).
     */
    public static CompletableFuture<String> follow(Process p, Path log, Predicate<String> ready, String who) {
        CompletableFuture<String> readyLine = new CompletableFuture<>();
        Thread.ofVirtual().start(() -> {
            try (BufferedReader r = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8));
                 PrintWriter w = new PrintWriter(Files.newBufferedWriter(log))) {
                String line;
                while ((line = r.readLine()) != null) {
                    w.println(line);
                    w.flush();
                    if (!readyLine.isDone() && ready.test(line)) {
                        readyLine.complete(line);
                    }
                }
            } catch (IOException e) {
                readyLine.completeExceptionally(e);
            }
            readyLine.completeExceptionally(new IllegalStateException(who + " (PID " + p.pid() + ") exited before it"
                    + " was ready; see " + log.toAbsolutePath()));
        });
        return readyLine;
    }
}
