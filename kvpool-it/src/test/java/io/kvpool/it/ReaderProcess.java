package io.kvpool.it;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;

import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.TimeUnit;

/**
 * A client in a process of its own, for tests that need a reader other than the test's JVM (its own
 * location cache, its own read lease, and a process that can be frozen). Driven line by line:
 *
 * <pre>
 *   args: MASTER shm|tcp REQUEST_TIMEOUT_MS
 *   prints "ready" once connected
 *   "get K1 K2 ..."  -> "got V1 V2 ..." (the version each value carries, -1 for a miss, -2 for
 *                       bytes that are not exactly a written object), read with one getBatch
 *   "quit"           -> exits
 * </pre>
 */
public final class ReaderProcess {

    private ReaderProcess() {
    }

    public static void main(String[] args) throws IOException {
        ClientConfig cfg = ClientConfig.forMaster(args[0]).withSharedMemory(args[1].equals("shm"))
                .withRequestTimeout(Duration.ofMillis(Long.parseLong(args[2])));
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        BufferedWriter out = new BufferedWriter(new OutputStreamWriter(System.out, StandardCharsets.UTF_8));
        try (KvPoolClient c = KvPoolClient.connect(cfg)) {
            say(out, "ready");
            String line;
            while ((line = in.readLine()) != null) {
                if (line.equals("quit")) {
                    break;
                }
                if (line.startsWith("get ")) {
                    List<String> keys = Arrays.asList(line.substring(4).trim().split(" "));
                    StringBuilder sb = new StringBuilder("got");
                    for (Optional<byte[]> v : c.getBatch(keys)) {
                        sb.append(' ').append(version(v));
                    }
                    say(out, sb.toString());
                }
            }
        }
    }

    /** The version a read value carries: -1 for a miss, -2 for bytes that are not exactly a written object. */
    static int version(Optional<byte[]> v) {
        if (v.isEmpty()) {
            return -1;
        }
        Payloads.Decoded d = Payloads.decode(v.get());
        return d.intact() ? d.version() : -2;
    }

    private static void say(BufferedWriter out, String s) throws IOException {
        out.write(s);
        out.newLine();
        out.flush();
    }

    /** The test's handle on a running ReaderProcess. */
    static final class Handle implements AutoCloseable {
        final Process process;
        private final BufferedWriter to;
        private final BufferedReader from;

        Handle(String master, boolean sharedMemory, Duration requestTimeout) throws IOException {
            this.process = new ProcessBuilder(ProcessCluster.javaCommand(ReaderProcess.class.getName(),
                    List.of(master, sharedMemory ? "shm" : "tcp", Long.toString(requestTimeout.toMillis()))))
                    .redirectError(ProcessBuilder.Redirect.DISCARD).start();
            this.to = new BufferedWriter(new OutputStreamWriter(process.getOutputStream(), StandardCharsets.UTF_8));
            this.from = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8));
            String first = readLine();
            if (!"ready".equals(first)) {
                throw new IllegalStateException("reader process did not start: " + first);
            }
        }

        private String readLine() throws IOException {
            String l;
            while ((l = from.readLine()) != null) {
                if (l.equals("ready") || l.startsWith("got")) {
                    return l; // anything else is the client's log output
                }
            }
            return null;
        }

        /** Reads the keys in the other process; the version each carries (-1 miss, -2 not exactly an object). */
        List<Integer> get(List<String> keys) throws IOException {
            to.write("get " + String.join(" ", keys));
            to.newLine();
            to.flush();
            String l = readLine();
            if (l == null) {
                throw new IllegalStateException("reader process exited");
            }
            List<Integer> out = new ArrayList<>(keys.size());
            for (String v : l.substring(3).trim().split(" ")) {
                out.add(Integer.parseInt(v));
            }
            return out;
        }

        void freeze() {
            ProcessCluster.signal(process, "STOP");
        }

        void thaw() {
            ProcessCluster.signal(process, "CONT");
        }

        @Override
        public void close() {
            process.destroyForcibly();
            try {
                process.waitFor(30, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }
}
