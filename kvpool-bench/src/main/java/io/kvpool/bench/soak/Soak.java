package io.kvpool.bench.soak;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.config.Durations;
import io.kvpool.config.Size;
import io.kvpool.etcd.MasterAddress;

import java.io.PrintStream;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Optional;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

/**
 * {@code kvpool soak}: verified traffic while the pool is hurt.
 *
 * <h2>Design</h2>
 * Clients ({@link Traffic}) put, get and remove keys of a working set; every value is derived from
 * its key and the version of its put ({@link SoakValues}), so every byte of every read is checked and
 * each read says which put it came from. Every put and removal is recorded with its interval
 * ({@link History}), and each read's version is judged against that record: a read may return
 * nothing or a version that was put and not removed since; anything else is a wrong read.
 * Meanwhile {@link Chaos} kills nodes, fails the leading master over and partitions nodes, one at a
 * time, waiting for repair before killing another node.
 *
 * <p>At the end, with every fault healed and traffic stopped, a final pass reads every key once.
 * An <b>acknowledged lost</b> object is one whose put was answered OK with its full replica count,
 * that no removal may have undone since (none overlapped or followed the put), and that this final
 * read cannot find. The working set is sized to stay under the pool's capacity with one node down,
 * and the master's eviction counter is read before and after: an eviction would make a miss
 * ambiguous, so a soak that saw one is failed as inconclusive.
 *
 * <p>When the soak starts the pool (the default), the pool is {@link LocalPool}: etcd (started by the
 * caller), two elected masters and three nodes, each a child process stopped by PID at the end, on
 * failure and on interrupt. Pointed at a running pool it runs traffic, races and the final pass but
 * no chaos.
 */
public final class Soak {

    /** How old a read must be before it is judged: every operation that ended before it began is recorded. */
    private static final long JUDGE_LAG_NANOS = 5_000_000_000L;

    private final SoakConfig config;
    private final String etcdUrl;
    private final String mainClass;
    private final PrintStream out;
    private final SoakStats stats = new SoakStats();
    private volatile LocalPool pool;

    /**
     * @param config    what to run
     * @param etcdUrl   etcd://HOST:PORT/CLUSTER of a running etcd for the pool this soak starts (unused for an
     *                  external pool)
     * @param mainClass the {@code kvpool} command's main class, run in each started master and node
     */
    public Soak(SoakConfig config, String etcdUrl, String mainClass) {
        this.config = config;
        this.etcdUrl = etcdUrl;
        this.mainClass = mainClass;
        this.out = config.out();
    }

    /** Stops every process this soak started (by PID); safe to call more than once and from a shutdown hook. */
    public void stopProcesses() {
        LocalPool p = pool;
        if (p != null) {
            p.close();
        }
    }

    /** Runs the soak; returns its report (whose {@link SoakReport#exitCode()} says whether it passed). */
    public SoakReport run() throws Exception {
        SoakValues values = new SoakValues((int) config.minValue().bytes(), (int) config.maxValue().bytes());
        List<String> keys = Traffic.keys(config.keys());
        History history = new History(keys);
        MasterAddress address;
        if (config.startsPool()) {
            out.printf("kvpool soak: starting %d masters (etcd %s) and %d nodes of %s; logs in %s%n", config.masters(),
                    etcdUrl, config.nodes(), config.segmentSize(), config.logDir().toAbsolutePath());
            pool = new LocalPool(config, etcdUrl, mainClass, config.logDir());
            pool.start();
            address = MasterAddress.parse(pool.etcdUrl());
        } else {
            address = config.external();
            out.println("kvpool soak: against the running pool at " + address + " (no chaos)");
        }
        try (KvPoolClient observer = connect(address)) {
            PoolStats s = awaitNodes(observer);
            checkCapacity(s);
            double evictedBefore = pool == null ? Double.NaN : pool.metric("master_evicted_keys_total");
            Traffic traffic = new Traffic(config, values, history, stats, keys, () -> connect(address));
            long start = System.nanoTime();
            long deadline = start + config.duration().toNanos();
            Chaos chaos = pool == null ? null : new Chaos(config, pool, observer, stats, deadline);
            out.printf("kvpool soak: seed %d, %s, %d clients, %d keys of %s to %s, %d copies; chaos: %s%n",
                    config.seed(), Durations.format(config.duration()), config.clients(), config.keys(),
                    config.minValue(), config.maxValue(), config.replicas(), chaosLine(chaos));
            traffic.start();
            Thread chaosThread = chaos != null && chaos.enabled() ? Thread.ofPlatform().name("soak-chaos").start(chaos) : null;
            Chaos c = chaos;
            ScheduledExecutorService ticker = Executors.newSingleThreadScheduledExecutor();
            long[] lastOps = {0};
            long[] lastTick = {start};
            long period = config.progressEvery().toNanos();
            ticker.scheduleWithFixedDelay(() -> {
                traffic.judgeOlderThan(JUDGE_LAG_NANOS);
                long nowNanos = System.nanoTime();
                if (nowNanos - lastTick[0] >= period) {
                    long ops = stats.totalOps();
                    out.println(progress(nowNanos - start, ops, (ops - lastOps[0]) * 1e9 / (nowNanos - lastTick[0]), c));
                    lastOps[0] = ops;
                    lastTick[0] = nowNanos;
                }
            }, 1, 1, TimeUnit.SECONDS);
            try {
                while (System.nanoTime() < deadline) {
                    Thread.sleep(Math.min(1000, Math.max(1, (deadline - System.nanoTime()) / 1_000_000)));
                }
                if (chaosThread != null) {
                    chaosThread.join();
                    // the pool back to whole before the final pass: nodes active, copies remade
                    if (!chaos.awaitWhole(config.repairDeadline())) {
                        stats.healthAtEnd = "not whole within " + config.repairDeadline().toSeconds()
                                + " s of the last event";
                    }
                }
            } finally {
                if (chaos != null) {
                    chaos.stop();
                }
                ticker.shutdownNow();
                ticker.awaitTermination(30, TimeUnit.SECONDS);
                traffic.stop();
            }
            long trafficNanos = System.nanoTime() - start;
            traffic.judgeAll();
            finalPass(observer, values, history, keys);
            if (pool != null) {
                stats.evictions = pool.metric("master_evicted_keys_total") - evictedBefore;
                stats.repairCopies = pool.metric("master_repair_copies_total");
                stats.underReplicatedAtEnd = pool.metric("master_objects_under_replicated");
            }
            SoakReport report = new SoakReport(config, stats, trafficNanos, chaos == null ? List.of()
                    : chaos.kinds().stream().map(k -> k.label).toList());
            report.print(out);
            return report;
        } finally {
            stopProcesses();
        }
    }

    private KvPoolClient connect(MasterAddress address) {
        return KvPoolClient.connect(ClientConfig.forMaster(address).withSharedMemory(false)
                .withRequestTimeout(config.requestTimeout()));
    }

    private PoolStats awaitNodes(KvPoolClient observer) throws InterruptedException {
        long end = System.nanoTime() + Duration.ofSeconds(90).toNanos();
        PoolStats s = null;
        int want = config.startsPool() ? config.nodes() : 1;
        while (System.nanoTime() < end) {
            try {
                s = observer.stats();
                if (s.segments().stream().filter(PoolStats.SegmentStats::active).count() >= want) {
                    return s;
                }
            } catch (RuntimeException e) {
                // the first leader may still be rebuilding
            }
            Thread.sleep(100);
        }
        throw new IllegalStateException("the pool did not have " + want + " active nodes within 90 s; last stats: " + s);
    }

    /**
     * Refuses a working set that would not fit with the largest node gone (eviction would then make
     * misses ambiguous). The bound is 3/4 of the eviction watermark (0.9) of what remains.
     */
    private void checkCapacity(PoolStats s) {
        long total = 0;
        long largest = 0;
        for (PoolStats.SegmentStats seg : s.segments()) {
            total += seg.capacityBytes();
            largest = Math.max(largest, seg.capacityBytes());
        }
        long afterLoss = s.segments().size() > config.replicas() ? total - largest : total;
        long bound = (long) (afterLoss * 0.9 * 0.75);
        if (config.workingSetBytes() > bound) {
            throw new IllegalArgumentException(String.format(Locale.ROOT, "the working set (%d keys of up to %s, %d"
                    + " copies: %s) does not fit under 3/4 of the eviction watermark of the pool with its largest node"
                    + " lost (%s): use fewer --keys, a smaller --max-value or a larger --segment-size", config.keys(),
                    config.maxValue(), config.replicas(), Size.human(config.workingSetBytes()), Size.human(bound)));
        }
    }

    /** Reads every key once, with nothing in flight and every fault healed: what is gone now is lost. */
    private void finalPass(KvPoolClient observer, SoakValues values, History history, List<String> keys) {
        long lost = 0;
        long mustExist = 0;
        for (int from = 0; from < keys.size(); from += 64) {
            List<String> batch = keys.subList(from, Math.min(keys.size(), from + 64));
            List<Optional<byte[]>> got = null;
            for (int attempt = 0; got == null; attempt++) {
                try {
                    got = observer.getBatch(batch);
                } catch (RuntimeException e) {
                    if (attempt >= 20) {
                        throw new IllegalStateException("the final pass cannot read from the pool: " + e.getMessage(), e);
                    }
                    sleepQuietly(500);
                }
            }
            for (int i = 0; i < batch.size(); i++) {
                String key = batch.get(i);
                long t = System.nanoTime();
                boolean must = history.mustExist(key);
                mustExist += must ? 1 : 0;
                if (got.get(i).isEmpty()) {
                    if (must) {
                        lost++;
                        if (stats.lostSamples.size() < 20) {
                            stats.lostSamples.add(key);
                        }
                    }
                    continue;
                }
                byte[] v = got.get(i).get();
                stats.bytesChecked.add(v.length);
                SoakValues.Checked c = values.check(key, v);
                if (c.wrongBytes() > 0) {
                    stats.wrongBytes.add(c.wrongBytes());
                    stats.readsWithWrongBytes.increment();
                    stats.wrongSamples.add("WRONG_BYTES " + key + " (final pass, " + c.wrongBytes() + " bytes)");
                    continue;
                }
                History.Verdict verdict = history.judge(key, c.version(), t, t);
                if (verdict != History.Verdict.HIT) {
                    stats.verdict(verdict, () -> history.explain(key, c.version(), t, t, stats.startNanos)
                            + " (final pass)");
                }
            }
        }
        stats.finalKeys = keys.size();
        stats.finalMustExist = mustExist;
        stats.lost = lost;
    }

    private String progress(long elapsedNanos, long ops, double rate, Chaos chaos) {
        StringBuilder b = new StringBuilder(String.format(Locale.ROOT,
                "soak %s/%s: %d ops (%.0f/s), %d errors, wrong reads %d, acknowledged misses %d",
                Durations.format(Duration.ofSeconds(elapsedNanos / 1_000_000_000L)), Durations.format(config.duration()),
                ops, rate, stats.totalErrors(), stats.wrongReads(), stats.verdict(History.Verdict.ACKNOWLEDGED_MISS)));
        if (chaos != null && chaos.enabled()) {
            List<SoakStats.ChaosEvent> ev = stats.events();
            b.append(" |");
            for (Chaos.Kind k : chaos.kinds()) {
                b.append(' ').append(k.label).append(' ').append(ev.stream().filter(e -> e.kind().equals(k.label)).count());
            }
            b.append(" | ").append(chaos.activity());
        }
        return b.toString();
    }

    private String chaosLine(Chaos chaos) {
        if (chaos == null || !chaos.enabled()) {
            return "none";
        }
        List<String> parts = new ArrayList<>();
        if (!config.nodeKillEvery().isZero()) {
            parts.add("node kill every ~" + Durations.format(config.nodeKillEvery()) + " (down "
                    + Durations.format(config.nodeDown()) + ")");
        }
        if (!config.failoverEvery().isZero()) {
            parts.add("failover every ~" + Durations.format(config.failoverEvery()));
        }
        if (!config.partitionEvery().isZero()) {
            parts.add("partition every ~" + Durations.format(config.partitionEvery()) + " for "
                    + Durations.format(config.partitionLength()));
        }
        return String.join(", ", parts);
    }

    private static void sleepQuietly(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
