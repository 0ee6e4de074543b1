package io.kvpool.bench;

import io.kvpool.protocol.Tls;
import me.tongfei.progressbar.ProgressBar;

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * The {@code tls} section: what mutual TLS costs. Two pools in their own processes, one in plain
 * TCP and one in TLS 1.3 (certificates from scripts/tls-certs.sh in a temporary directory), each
 * with one node; puts and gets over TCP at 64 KiB and 1 MiB with 1 and 2 clients, the plain and the
 * TLS row of each pair measured back to back so both see the same machine.
 */
final class TlsBench {

    static final List<Integer> SIZES = List.of(64 << 10, 1 << 20);
    static final List<Integer> CLIENTS = List.of(1, 2);

    private TlsBench() {
    }

    static int steps() {
        return SIZES.size() * CLIENTS.size() * 2;
    }

    static void run(Results results, Duration warmup, Duration duration, Duration targetWarmup, ProgressBar bar)
            throws Exception {
        Path dir = Files.createTempDirectory("kvpool-bench-tls");
        Tls server = certificates(dir);
        Tls client = Tls.load(dir.resolve("client.pem"), dir.resolve("client.key"), dir.resolve("ca.pem"));
        try (PoolProcess plainPool = PoolProcess.start("1GiB", "1g", 1);
             PoolProcess tlsPool = PoolProcess.start("1GiB", "1g", 1, server)) {
            KvpoolTarget plain = new KvpoolTarget(plainPool.masterAddress(), false);
            KvpoolTarget tls = new KvpoolTarget(tlsPool.masterAddress(), client);
            for (KvpoolTarget t : List.of(plain, tls)) {
                // the first rows measured would otherwise measure the JIT (of this JVM and the pools'):
                // until the AES-GCM intrinsics are compiled, TLS runs at a few MB/s
                t.put(1 << 20, 2, Duration.ZERO, targetWarmup);
                t.clear();
                t.get(1 << 20, 2, Duration.ZERO, targetWarmup);
                t.clear();
            }
            String note = "one node, over TCP; kvpool-tls: mutual TLS 1.3 (EC P-256 certificates)";
            for (String op : List.of("put", "get")) {
                for (int size : SIZES) {
                    for (int clients : CLIENTS) {
                        for (KvpoolTarget t : List.of(plain, tls)) {
                            bar.setExtraMessage(" tls " + t.name() + " " + op + " " + size + " x" + clients);
                            Measurement m = op.equals("put") ? t.put(size, clients, warmup, duration)
                                    : t.get(size, clients, warmup, duration);
                            results.add(Results.Row.of("tls", t.name(), op, size, clients, m, note));
                            t.clear();
                        }
                        bar.step();
                    }
                }
            }
        } finally {
            try (var files = Files.list(dir)) {
                for (Path f : files.toList()) {
                    Files.delete(f);
                }
            }
            Files.delete(dir);
        }
    }

    /** Makes the certificates into {@code dir} with scripts/tls-certs.sh; the server's identity. */
    private static Tls certificates(Path dir) throws Exception {
        String home = System.getenv("KVPOOL_HOME"); // the checkout, as the other sections find it
        Path here = home != null ? Path.of(home).toAbsolutePath() : Path.of("").toAbsolutePath();
        while (here != null && !Files.exists(here.resolve("scripts/tls-certs.sh"))) {
            here = here.getParent();
        }
        if (here == null) {
            throw new IllegalStateException("the tls section needs scripts/tls-certs.sh (and openssl): run kvpool bench"
                    + " from the kvpool checkout, or set KVPOOL_HOME to it");
        }
        Process p = new ProcessBuilder(here.resolve("scripts/tls-certs.sh").toString(), dir.toString())
                .redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes());
        if (!p.waitFor(60, TimeUnit.SECONDS) || p.exitValue() != 0) {
            throw new IllegalStateException("scripts/tls-certs.sh failed: " + out);
        }
        return Tls.load(dir.resolve("server.pem"), dir.resolve("server.key"), dir.resolve("ca.pem"));
    }
}
