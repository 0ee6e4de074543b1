package io.kvpool.bench;

import io.kvpool.bench.baseline.RedisServer;
import io.kvpool.config.Size;
import me.tongfei.progressbar.ProgressBar;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * The {@code mooncake} section: one workload through the real Mooncake Store ({@code mooncake.store}, the
 * pinned wheel of {@code peers/mooncake}) and through {@code kvpool.mooncake}, in the same run.
 *
 * <p>The Python side is {@code python -m kvpool_peers.bench_mooncake --serve} run with the mooncake peer's
 * interpreter; it starts the wheel's {@code mooncake_master} and a {@code mooncake_client} store process
 * (4 GB) itself and stops them by PID. This section installs the peer first if it is missing
 * ({@code scripts/peers.sh install mooncake}: a failure fails the section, with the script's message) and
 * starts the kvpool pool (4 GiB). For every size, operation and client count it measures Mooncake, then
 * kvpool over its same-machine path, then kvpool over TCP (Mooncake's transport here), one right after the
 * other, and checks kvpool against the target of 2x Mooncake's objects per second.
 */
final class MooncakeBench {

    static final List<Integer> SIZES = List.of(4 << 10, 64 << 10, 1 << 20, 4 << 20);
    static final List<String> OPS = List.of("put", "get", "batch_put", "batch_get");
    static final List<String> TARGETS = List.of("mooncake", "kvpool", "kvpool-tcp");
    static final List<Integer> CLIENTS = List.of(1, 2);
    static final int BATCH = 16;
    static final double GOAL = 2.0;
    private static final long INSTALL_TIMEOUT_MINUTES = 20;

    private MooncakeBench() {
    }

    /** Progress-bar steps the section takes. */
    static long steps() {
        return 1 + (long) SIZES.size() * OPS.size() * CLIENTS.size();
    }

    /** The row's operation name: batches say their size. */
    static String op(String op) {
        return op.startsWith("batch") ? op + " x" + BATCH : op;
    }

    /** Installs the mooncake peer if needed and returns its interpreter; fails with the script's output. */
    static String peerPython() throws IOException, InterruptedException {
        Path script = RedisServer.locateScript("peers.sh");
        run(script, "install", "mooncake");
        return run(script, "python", "mooncake").strip();
    }

    private static String run(Path script, String... args) throws IOException, InterruptedException {
        ProcessBuilder pb = new ProcessBuilder(script.toString());
        pb.command().addAll(List.of(args));
        pb.redirectErrorStream(true);
        Process p = pb.start();
        byte[] out = p.getInputStream().readAllBytes();
        if (!p.waitFor(INSTALL_TIMEOUT_MINUTES, TimeUnit.MINUTES)) {
            p.destroyForcibly();
            throw new IOException(script + " " + String.join(" ", args) + " did not finish in "
                    + INSTALL_TIMEOUT_MINUTES + " min");
        }
        String text = new String(out, StandardCharsets.UTF_8);
        if (p.exitValue() != 0) {
            throw new IOException(script + " " + String.join(" ", args) + " failed (exit " + p.exitValue() + "):\n"
                    + text);
        }
        return text;
    }

    static void run(Results results, Duration warmup, Duration duration, ProgressBar bar) throws Exception {
        bar.setExtraMessage(" mooncake: installing the peer");
        String python = peerPython();
        bar.step();
        try (PoolProcess pool = PoolProcess.start("4GiB", "1g");
             PythonServer py = PythonServer.start(List.of(python, "-m", "kvpool_peers.bench_mooncake", "--serve",
                     "--kvpool-master", pool.masterAddress()), Map.of("PYTHONPATH",
                     PythonBench.pythonRoot().toString()))) {
            results.environment.put("mooncake", py.hello().path("mooncake").asText("?"));
            results.environment.put("mooncake python", python + " " + py.hello().path("python").asText("?"));
            for (int clients : CLIENTS) {
                for (String op : OPS) {
                    for (int size : SIZES) {
                        for (String target : TARGETS) {
                            bar.setExtraMessage(" mooncake: " + target + " " + op + " " + Size.ofBytes(size) + " x"
                                    + clients);
                            Measurement m = py.phase(target + ":" + op + ":" + size, clients, warmup, duration, null);
                            results.add(Results.Row.of("mooncake", target, op(op), size, clients, m, note(target,
                                    op, clients)));
                        }
                        bar.step();
                    }
                }
            }
        }
        evaluate(results);
    }

    private static String note(String target, String op, int clients) {
        String who = switch (target) {
            case "mooncake" -> "mooncake.store (the wheel) against mooncake_master and a mooncake_client store over TCP";
            case "kvpool" -> "kvpool.mooncake, same-machine path";
            default -> "kvpool.mooncake, every byte over TCP";
        };
        String what = switch (op) {
            case "put" -> "put_from of a fresh key from a registered buffer";
            case "get" -> "get_into a registered buffer";
            case "batch_put" -> "batch_put_from of " + BATCH + " fresh keys";
            default -> "batch_get_into of " + BATCH + " keys into registered slots";
        };
        return what + "; " + who + "; " + clients + (clients == 1 ? " process" : " processes")
                + "; latency per call";
    }

    /** kvpool (each path) against Mooncake per row, in objects per second (the same sizes: the GB/s ratio). */
    static void evaluate(Results r) {
        for (int clients : CLIENTS) {
            for (String op : OPS) {
                for (int size : SIZES) {
                    var base = r.find("mooncake", "mooncake", op(op), size, clients);
                    for (String target : List.of("kvpool", "kvpool-tcp")) {
                        r.ratioOps(String.format(Locale.ROOT, "%s %s %s x%d vs Mooncake", target, op(op),
                                        Size.ofBytes(size), clients), r.find("mooncake", target, op(op), size, clients),
                                base, GOAL, "calls/s");
                    }
                }
            }
        }
    }
}
