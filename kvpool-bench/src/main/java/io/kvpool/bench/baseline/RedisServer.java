package io.kvpool.bench.baseline;

import io.kvpool.config.Ports;

import java.io.IOException;
import java.io.InputStream;
import java.io.InterruptedIOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;

/**
 * A private Redis 7 on loopback for one benchmark run, started and stopped through
 * {@code scripts/redis.sh} (which installs Debian's {@code redis-server} if it is missing). The
 * server runs in a fresh temporary directory on a free port, with no persistence, and is stopped by
 * PID on {@link #close()} (or when the JVM exits, if nobody closed it).
 */
public final class RedisServer implements AutoCloseable {

    /** System property naming the kvpool checkout or install that holds {@code scripts/redis.sh}. */
    public static final String HOME_PROPERTY = "kvpool.home";

    static final String SCRIPT = "scripts/redis.sh";

    /** Exit status of {@code redis.sh} when Redis is missing and cannot be installed. */
    private static final int EXIT_UNAVAILABLE = 3;

    private static final String HOST = "127.0.0.1";
    private static final long START_TIMEOUT_SECONDS = 600; // an apt-get install may run first
    private static final long STOP_TIMEOUT_SECONDS = 30;
    private static final int START_ATTEMPTS = 3;
    private static final Pattern VERSION = Pattern.compile("v=(\\S+)");

    /** Redis is not installed and {@code redis.sh} could not install it (not root, no apt, offline). */
    public static final class UnavailableException extends IOException {
        private static final long serialVersionUID = 1L;

        UnavailableException(String message) {
            super(message);
        }
    }

    private final Path script;
    private final Path dir;
    private final int port;
    private final long pid;
    private final String versionLine;
    private final Thread shutdownHook;
    private boolean closed;

    private RedisServer(Path script, Path dir, int port, long pid, String versionLine) {
        this.script = script;
        this.dir = dir;
        this.port = port;
        this.pid = pid;
        this.versionLine = versionLine;
        this.shutdownHook = new Thread(this::stopQuietly, "redis-server-stop-" + port);
        Runtime.getRuntime().addShutdownHook(shutdownHook);
    }

    /** Starts Redis on a free loopback port in a new temporary directory. */
    public static RedisServer start() throws IOException, InterruptedException {
        return start(locateScript(), null);
    }

    /**
     * Starts Redis with the given script (null: {@link #locateScript()}) and {@code maxmemory}
     * (e.g. {@code "6gb"}; null: the script's default).
     */
    public static RedisServer start(Path script, String maxMemory) throws IOException, InterruptedException {
        Path s = script != null ? script : locateScript();
        IOException last = null;
        for (int attempt = 0; attempt < START_ATTEMPTS; attempt++) {
            Path dir = Files.createTempDirectory("kvpool-redis-");
            int port = freePort();
            List<String> env = maxMemory == null ? List.of() : List.of("REDIS_MAXMEMORY=" + maxMemory);
            Result r;
            try {
                r = runScript(s, env, START_TIMEOUT_SECONDS, "start", Integer.toString(port), dir.toString());
            } catch (InterruptedException | IOException e) {
                // the script may have got as far as starting a daemon: stop it before giving up
                boolean interrupted = Thread.interrupted();
                try {
                    runScript(s, List.of(), STOP_TIMEOUT_SECONDS, "stop", dir.toString());
                    deleteTree(dir);
                } catch (IOException | InterruptedException suppressed) {
                    e.addSuppressed(suppressed);
                }
                if (interrupted) {
                    Thread.currentThread().interrupt();
                }
                throw e;
            }
            if (r.exit == 0) {
                try {
                    long pid = parsePid(r.stdout, r);
                    String version = runScript(s, List.of(), 30, "version").stdout.strip();
                    return new RedisServer(s, dir, port, pid, version);
                } catch (IOException | RuntimeException e) {
                    runScript(s, List.of(), STOP_TIMEOUT_SECONDS, "stop", dir.toString());
                    deleteTree(dir);
                    throw e;
                }
            }
            deleteTree(dir);
            if (r.exit == EXIT_UNAVAILABLE) {
                throw new UnavailableException("Redis is not available: " + r.describe());
            }
            // most likely someone took the port between our probe and Redis's bind: try another
            last = new IOException("starting Redis on port " + port + " failed: " + r.describe());
        }
        throw last;
    }

    /**
     * Finds {@code scripts/redis.sh}: under {@code -Dkvpool.home}, then {@code $KVPOOL_HOME}, then in
     * the working directory or any of its parents (so it works from the root or from a module).
     */
    public static Path locateScript() throws IOException {
        return locateScript(Paths.get(SCRIPT).getFileName().toString());
    }

    /** Finds {@code scripts/<name>} the same way as {@link #locateScript()}. */
    public static Path locateScript(String name) throws IOException {
        String script = "scripts/" + name;
        List<Path> tried = new ArrayList<>();
        for (String home : new String[] {System.getProperty(HOME_PROPERTY), System.getenv("KVPOOL_HOME")}) {
            if (home != null && !home.isBlank()) {
                Path p = Paths.get(home).resolve(script).toAbsolutePath().normalize();
                if (Files.isRegularFile(p)) {
                    return p;
                }
                tried.add(p);
            }
        }
        for (Path d = Paths.get("").toAbsolutePath(); d != null; d = d.getParent()) {
            Path p = d.resolve(script);
            if (Files.isRegularFile(p)) {
                return p;
            }
            tried.add(p);
        }
        throw new IOException("cannot find " + script + " (set -D" + HOME_PROPERTY
                + "=<kvpool directory>); looked at " + tried);
    }

    /** What {@code redis.sh version} prints: the installed redis-server's version line, or {@code not installed}. */
    public static String installedVersion() throws IOException, InterruptedException {
        Result r = runScript(locateScript(), List.of(), 30, "version");
        if (r.exit != 0) {
            throw new IOException("redis.sh version failed: " + r.describe());
        }
        return r.stdout.strip();
    }

    public String host() {
        return HOST;
    }

    public int port() {
        return port;
    }

    /** The redis-server process id. */
    public long pid() {
        return pid;
    }

    /** The version number, e.g. {@code 7.0.15}. */
    public String version() {
        Matcher m = VERSION.matcher(versionLine);
        return m.find() ? m.group(1) : versionLine;
    }

    /** The whole {@code redis-server --version} line. */
    public String versionLine() {
        return versionLine;
    }

    /** The directory holding the pidfile and {@code redis.log}; deleted on close. */
    public Path directory() {
        return dir;
    }

    /** Stops Redis (TERM, then KILL after 10 s) and deletes its directory. Idempotent. */
    @Override
    public synchronized void close() throws IOException {
        if (closed) {
            return;
        }
        try {
            Runtime.getRuntime().removeShutdownHook(shutdownHook);
        } catch (IllegalStateException shuttingDown) {
            // the hook is running or will run; stopping twice is harmless
        }
        stop();
    }

    private synchronized void stop() throws IOException {
        if (closed) {
            return;
        }
        Result r;
        try {
            r = runScript(script, List.of(), STOP_TIMEOUT_SECONDS, "stop", dir.toString());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("interrupted while stopping Redis (PID " + pid + ")");
        }
        if (r.exit != 0) {
            // leave the directory: its pidfile and log are what someone needs to clean up by hand
            throw new IOException("stopping Redis (PID " + pid + ") failed: " + r.describe());
        }
        closed = true;
        deleteTree(dir);
    }

    private void stopQuietly() {
        try {
            stop();
        } catch (Exception e) {
            System.err.println("kvpool: could not stop Redis PID " + pid + ": " + e.getMessage());
        }
    }

    @Override
    public String toString() {
        return "Redis " + version() + " at " + HOST + ":" + port + " (PID " + pid + ")";
    }

    private static int freePort() throws IOException {
        return Ports.reservable(); // below the ephemeral range: no client connection takes it before Redis binds it
    }

    private static long parsePid(String stdout, Result r) throws IOException {
        String[] lines = stdout.strip().split("\\R");
        String last = lines[lines.length - 1].strip();
        try {
            return Long.parseLong(last);
        } catch (NumberFormatException e) {
            throw new IOException("redis.sh start did not print a PID: " + r.describe(), e);
        }
    }

    private record Result(List<String> command, int exit, String stdout, String stderr) {
        String describe() {
            String err = stderr.strip();
            if (err.length() > 4000) {
                err = "..." + err.substring(err.length() - 4000);
            }
            return String.join(" ", command) + " exited with " + exit
                    + (err.isEmpty() ? "" : ":\n" + err);
        }
    }

    private static Result runScript(Path script, List<String> env, long timeoutSeconds, String... args)
            throws IOException, InterruptedException {
        List<String> cmd = new ArrayList<>();
        cmd.add("bash");
        cmd.add(script.toString());
        cmd.addAll(List.of(args));
        ProcessBuilder pb = new ProcessBuilder(cmd);
        for (String kv : env) {
            int eq = kv.indexOf('=');
            pb.environment().put(kv.substring(0, eq), kv.substring(eq + 1));
        }
        Process p = pb.start();
        p.getOutputStream().close();
        CompletableFuture<String> out = drain(p.getInputStream());
        CompletableFuture<String> err = drain(p.getErrorStream());
        if (!p.waitFor(timeoutSeconds, TimeUnit.SECONDS)) {
            p.descendants().forEach(ProcessHandle::destroyForcibly);
            p.destroyForcibly();
            throw new IOException(String.join(" ", cmd) + " did not finish within " + timeoutSeconds + " s");
        }
        try {
            // A daemonized redis-server detaches from our pipes at once; do not wait on it forever.
            return new Result(cmd, p.exitValue(), out.get(10, TimeUnit.SECONDS), err.get(10, TimeUnit.SECONDS));
        } catch (ExecutionException | TimeoutException e) {
            throw new IOException("reading the output of " + String.join(" ", cmd) + " failed", e);
        }
    }

    private static CompletableFuture<String> drain(InputStream in) {
        CompletableFuture<String> f = new CompletableFuture<>();
        Thread.ofVirtual().start(() -> {
            try (in) {
                f.complete(new String(in.readAllBytes(), StandardCharsets.UTF_8));
            } catch (IOException e) {
                f.completeExceptionally(e);
            }
        });
        return f;
    }

    private static void deleteTree(Path dir) throws IOException {
        if (!Files.exists(dir)) {
            return;
        }
        try (Stream<Path> s = Files.walk(dir)) {
            s.sorted(Comparator.reverseOrder()).forEach(p -> {
                try {
                    Files.deleteIfExists(p);
                } catch (IOException e) {
                    throw new UncheckedIOException(e);
                }
            });
        } catch (UncheckedIOException e) {
            throw e.getCause();
        }
    }
}
