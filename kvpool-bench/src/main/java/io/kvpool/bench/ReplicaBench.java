package io.kvpool.bench;

import me.tongfei.progressbar.ProgressBar;

import java.time.Duration;
import java.util.List;

/**
 * The {@code replicas} section: what a second copy costs. Puts of one copy (under write leases, and
 * two-phase, the path every multi-copy put takes) against puts of two copies on two nodes, over
 * TCP, at 64 KiB and 1 MiB with 1 and 2 clients; the pool runs in its own process.
 */
final class ReplicaBench {

    private ReplicaBench() {
    }

    static void run(Results results, Duration warmup, Duration duration, Duration targetWarmup, ProgressBar bar)
            throws Exception {
        try (PoolProcess pool = PoolProcess.start("3GiB", "1g", 2)) {
            for (int r = 1; r <= 2; r++) {
                // the first rows measured would otherwise measure the JIT (of this JVM and the pool's)
                KvpoolTarget t = new KvpoolTarget(pool.masterAddress(), false, r == 1, r);
                t.put(64 << 10, 2, Duration.ZERO, targetWarmup.dividedBy(2));
                t.clear();
            }
            for (int size : new int[]{64 << 10, 1 << 20}) {
                for (int clients : new int[]{1, 2}) {
                    for (KvpoolTarget t : List.of(new KvpoolTarget(pool.masterAddress(), false, true, 1),
                            new KvpoolTarget(pool.masterAddress(), false, false, 1),
                            new KvpoolTarget(pool.masterAddress(), false, false, 2))) {
                        bar.setExtraMessage(" replicas " + t.name() + " " + size + " x" + clients);
                        Measurement m = t.put(size, clients, warmup, duration);
                        results.add(Results.Row.of("replicas", t.name(), "put", size, clients, m,
                                "two nodes; -x2: each put writes two copies, on distinct segments"));
                        t.clear();
                    }
                }
            }
        }
    }
}
