package io.kvpool.bench.soak;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutOptions;
import io.kvpool.client.PutResult;
import io.kvpool.client.PutStatus;

import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Optional;
import java.util.Set;
import java.util.SplittableRandom;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Supplier;

/**
 * The soak's clients: each thread its own {@link KvPoolClient}, each iteration one operation on
 * random keys of the working set, a fifth of them on one hot group so removals, removals by prefix
 * and puts of the same key race. Every put writes a new version ({@link SoakValues}); every read's
 * bytes are checked as it returns, and its version is judged against the {@link History} a few
 * seconds later by {@link #judgeOlderThan(long)}.
 *
 * <p>The mix: 40% get, 10% get of 8 keys in one batch, 30% put, 5% put of 4 keys in one batch, 14%
 * remove, 1% remove by prefix (a group of {@link SoakConfig#GROUP} keys).
 */
final class Traffic {

    /** One read whose bytes were right, waiting to be judged. */
    private record Read(String key, long version, long start, long end) {
    }

    private final SoakConfig config;
    private final SoakValues values;
    private final History history;
    private final SoakStats stats;
    private final List<String> keys;
    private final Supplier<KvPoolClient> connect;
    private final PutOptions options;
    private final AtomicLong versions = new AtomicLong();
    private final ConcurrentLinkedQueue<Read> unjudged = new ConcurrentLinkedQueue<>();
    private final List<Thread> threads = new ArrayList<>();
    private final List<KvPoolClient> clients = new ArrayList<>();
    private volatile boolean stop;

    Traffic(SoakConfig config, SoakValues values, History history, SoakStats stats, List<String> keys,
            Supplier<KvPoolClient> connect) {
        this.config = config;
        this.values = values;
        this.history = history;
        this.stats = stats;
        this.keys = keys;
        this.connect = connect;
        this.options = PutOptions.DEFAULT.withReplicas(config.replicas());
    }

    /** The working set's keys: soak/gG/kI. */
    static List<String> keys(int n) {
        List<String> out = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            out.add("soak/g" + (i / SoakConfig.GROUP) + "/k" + (i % SoakConfig.GROUP));
        }
        return out;
    }

    void start() {
        stats.startNanos = System.nanoTime();
        SplittableRandom seeds = new SplittableRandom(config.seed());
        for (int t = 0; t < config.clients(); t++) {
            KvPoolClient c = connect.get();
            clients.add(c);
            SplittableRandom rnd = seeds.split();
            threads.add(Thread.ofPlatform().name("soak-client-" + t).start(() -> loop(c, rnd)));
        }
    }

    /** Stops the clients after their current operation and closes them. */
    void stop() throws InterruptedException {
        stop = true;
        for (Thread t : threads) {
            t.join();
        }
        for (KvPoolClient c : clients) {
            c.close();
        }
    }

    private void loop(KvPoolClient c, SplittableRandom rnd) {
        while (!stop) {
            double d = rnd.nextDouble();
            if (d < 0.40) {
                get(c, key(rnd));
            } else if (d < 0.50) {
                getBatch(c, distinctKeys(rnd, 8));
            } else if (d < 0.80) {
                put(c, List.of(key(rnd)), "put");
            } else if (d < 0.85) {
                put(c, distinctKeys(rnd, 4), "put_batch");
            } else if (d < 0.99) {
                remove(c, key(rnd));
            } else {
                removeGroup(c, hot(rnd) ? 0 : rnd.nextInt(keys.size() / SoakConfig.GROUP));
            }
        }
    }

    private static boolean hot(SplittableRandom rnd) {
        return rnd.nextInt(5) == 0;
    }

    private String key(SplittableRandom rnd) {
        return keys.get(hot(rnd) ? rnd.nextInt(SoakConfig.GROUP) : rnd.nextInt(keys.size()));
    }

    private List<String> distinctKeys(SplittableRandom rnd, int n) {
        Set<String> s = new LinkedHashSet<>();
        while (s.size() < n) {
            s.add(key(rnd));
        }
        return new ArrayList<>(s);
    }

    private void get(KvPoolClient c, String key) {
        long start = System.nanoTime();
        try {
            Optional<byte[]> got = c.get(key);
            long end = System.nanoTime();
            returned("get");
            read(key, got, start, end);
        } catch (RuntimeException e) {
            threw("get", e);
        }
    }

    private void getBatch(KvPoolClient c, List<String> batch) {
        long start = System.nanoTime();
        try {
            List<Optional<byte[]>> got = c.getBatch(batch);
            long end = System.nanoTime();
            returned("get_batch");
            for (int i = 0; i < batch.size(); i++) {
                read(batch.get(i), got.get(i), start, end);
            }
        } catch (RuntimeException e) {
            threw("get_batch", e);
        }
    }

    /** Checks a read's bytes now; queues its version to be judged. */
    private void read(String key, Optional<byte[]> got, long start, long end) {
        if (got.isEmpty()) {
            unjudged.add(new Read(key, -1, start, end));
            return;
        }
        byte[] v = got.get();
        stats.bytesChecked.add(v.length);
        SoakValues.Checked checked = values.check(key, v);
        if (checked.wrongBytes() > 0) {
            stats.wrongBytes.add(checked.wrongBytes());
            stats.readsWithWrongBytes.increment();
            if (stats.wrongSamples.size() < 20) {
                stats.wrongSamples.add("WRONG_BYTES " + key + " (" + checked.wrongBytes() + " of " + v.length
                        + " bytes, version " + checked.version() + ")");
            }
            return;
        }
        unjudged.add(new Read(key, checked.version(), start, end));
    }

    private void put(KvPoolClient c, List<String> batch, String kind) {
        List<MemorySegment> vals = new ArrayList<>(batch.size());
        List<History.Op> ops = new ArrayList<>(batch.size());
        for (String k : batch) {
            long version = versions.incrementAndGet();
            vals.add(MemorySegment.ofArray(values.valueOf(k, version)));
            ops.add(history.begin(k, History.Kind.PUT, version));
        }
        List<PutResult> results;
        try {
            results = batch.size() == 1 ? List.of(c.putDetailed(batch.getFirst(), vals.getFirst(), options))
                    : c.putBatchDetailed(batch, vals, options);
        } catch (RuntimeException e) {
            for (History.Op op : ops) {
                op.finish(History.Outcome.THREW, false);
            }
            threw(kind, e);
            return;
        }
        for (int i = 0; i < batch.size(); i++) {
            PutResult r = results.get(i);
            boolean full = r.status() == PutStatus.OK && r.copies() >= config.replicas();
            ops.get(i).finish(r.status() == PutStatus.OK ? History.Outcome.STORED : History.Outcome.NOT_STORED, full);
            switch (r.status()) {
                case OK -> {
                    if (full) {
                        stats.acknowledged.increment();
                    } else {
                        stats.shortCopies.increment();
                    }
                }
                case ALREADY_EXISTS -> stats.alreadyExists.increment();
                default -> stats.error(kind + ": " + r.status(), "put of " + batch.get(i) + " answered " + r.status());
            }
        }
        returned(kind);
    }

    private void remove(KvPoolClient c, String key) {
        History.Op op = history.begin(key, History.Kind.REMOVE, 0);
        try {
            c.remove(key);
            op.finish(History.Outcome.DONE, false);
            returned("remove");
        } catch (RuntimeException e) {
            op.finish(History.Outcome.THREW, false);
            threw("remove", e);
        }
    }

    private void removeGroup(KvPoolClient c, int group) {
        List<History.Op> ops = new ArrayList<>(SoakConfig.GROUP);
        for (int i = 0; i < SoakConfig.GROUP; i++) {
            ops.add(history.begin(keys.get(group * SoakConfig.GROUP + i), History.Kind.REMOVE, 0));
        }
        try {
            c.removeByPrefix("soak/g" + group + "/");
            for (History.Op op : ops) {
                op.finish(History.Outcome.DONE, false);
            }
            returned("remove_prefix");
        } catch (RuntimeException e) {
            for (History.Op op : ops) {
                op.finish(History.Outcome.THREW, false);
            }
            threw("remove_prefix", e);
        }
    }

    private void returned(String kind) {
        SoakStats.add(stats.ops, kind);
        stats.okCalls.increment();
    }

    private void threw(String kind, RuntimeException e) {
        SoakStats.add(stats.ops, kind);
        SoakStats.add(stats.opsFailed, kind);
        stats.error(kind + ": " + errorKind(e), String.valueOf(e.getMessage()));
    }

    /** An exception's kind: its class, and its root cause's class when that differs. */
    static String errorKind(Throwable e) {
        Throwable root = e;
        while (root.getCause() != null && root.getCause() != root) {
            root = root.getCause();
        }
        String s = e.getClass().getSimpleName();
        return root == e ? s : s + " (" + root.getClass().getSimpleName() + ")";
    }

    /** Judges the reads that returned more than {@code lagNanos} ago (every operation before them has finished). */
    void judgeOlderThan(long lagNanos) {
        long cutoff = System.nanoTime() - lagNanos;
        Read r;
        while ((r = unjudged.peek()) != null && r.end < cutoff) {
            unjudged.poll();
            judge(r);
        }
    }

    private void judge(Read r) {
        stats.verdict(history.judge(r.key, r.version, r.start, r.end),
                () -> history.explain(r.key, r.version, r.start, r.end, stats.startNanos));
    }

    /** Judges every read still waiting (call once traffic has stopped). */
    void judgeAll() {
        Read r;
        while ((r = unjudged.poll()) != null) {
            judge(r);
        }
    }
}
