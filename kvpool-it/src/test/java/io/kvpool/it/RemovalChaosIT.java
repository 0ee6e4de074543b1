package io.kvpool.it;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.KvPoolException;
import io.kvpool.client.PoolStats;
import io.kvpool.client.PutOptions;
import io.kvpool.client.PutStatus;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;

import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Queue;
import java.util.Random;
import java.util.SplittableRandom;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The randomized form of {@link AbsoluteRemovalIT}: readers hammer keys they remember while one
 * writer upserts, puts, removes by key and by prefix and resets, and nodes are frozen and thawed or
 * killed and replaced, all at random. Every value names its key and version; every removal or
 * replacement records when it returned. A read that began after the operation that made its version
 * stale returned is a stale read, and there must be none. Prints its seed; replay with
 * {@code -Dkvpool.chaos.seed=N} (and {@code -Dkvpool.chaos.seconds=N} to run longer).
 */
class RemovalChaosIT {

    private static final int GROUPS = 3;
    private static final int KEYS_PER_GROUP = 8;
    private static final int SIZE = 32 << 10;
    private static final Duration TIMEOUT = Duration.ofSeconds(2);

    /** One read: which key, which version came back (-1 miss, -2 not exactly an object), when it began. */
    private record Read(String key, int version, long startNanos, String reader) {
    }

    /** What the writer knows: each key's current version (-1 absent) and when each old one became stale. */
    private static final class Model {
        final List<String> keys = new ArrayList<>();
        final Map<String, Integer> current = new ConcurrentHashMap<>();
        final Map<String, Map<Integer, Long>> staleSince = new ConcurrentHashMap<>();
        int nextVersion = 1;

        Model() {
            for (int g = 0; g < GROUPS; g++) {
                for (int i = 0; i < KEYS_PER_GROUP; i++) {
                    String k = "chaos/g" + g + "/k" + i;
                    keys.add(k);
                    current.put(k, -1);
                    staleSince.put(k, new ConcurrentHashMap<>());
                }
            }
        }

        /** The key's current version is stale from now on (the operation that made it so has returned). */
        void invalidate(String key, long returnedAt) {
            int v = current.get(key);
            if (v >= 0) {
                staleSince.get(key).put(v, returnedAt);
                current.put(key, -1);
            }
        }
    }

    @Test
    void noReadReturnsAVersionStaleBeforeItBegan() throws Exception {
        Assumptions.assumeTrue(Files.isDirectory(Path.of("/dev/shm")), "no /dev/shm");
        long seed = Long.getLong("kvpool.chaos.seed", System.nanoTime());
        long seconds = Long.getLong("kvpool.chaos.seconds", 20);
        System.out.println("RemovalChaosIT: seed " + seed + " (replay with -Dkvpool.chaos.seed=" + seed + "), "
                + seconds + " s");
        SplittableRandom rnd = new SplittableRandom(seed);
        Model model = new Model();
        Queue<Read> reads = new ConcurrentLinkedQueue<>();
        AtomicBoolean stop = new AtomicBoolean();
        AtomicLong errors = new AtomicLong();
        Map<String, Long> ops = new ConcurrentHashMap<>();
        ScheduledExecutorService thawer = Executors.newSingleThreadScheduledExecutor();
        try (ProcessCluster cluster = new ProcessCluster("removal-chaos", "--read-lease", "1s", "--node-ttl", "60s");
             KvPoolClient writer = KvPoolClient.connect(ClientConfig.forMaster(cluster.masterAddress())
                     .withRequestTimeout(Duration.ofSeconds(10)))) {
            List<ProcessCluster.Managed> live = new CopyOnWriteArrayList<>();
            live.add(cluster.startNode("64MiB", "/dev/shm"));
            live.add(cluster.startNode("64MiB", "/dev/shm"));
            ProcessCluster.awaitStats(writer, s -> s.segments().stream().filter(PoolStats.SegmentStats::active).count() == 2,
                    "both nodes active");
            Map<ProcessCluster.Managed, Boolean> frozen = new ConcurrentHashMap<>();
            for (String k : model.keys) {
                put(writer, model, k, live.get(rnd.nextInt(live.size())).name, false);
            }

            List<Thread> readers = new ArrayList<>();
            List<AutoCloseable> closers = new ArrayList<>();
            for (boolean shm : new boolean[]{true, false}) {
                KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster(cluster.masterAddress())
                        .withSharedMemory(shm).withRequestTimeout(TIMEOUT));
                closers.add(c);
                String name = shm ? "same-machine" : "tcp";
                long readerSeed = rnd.nextLong();
                readers.add(Thread.ofPlatform().name("chaos-reader-" + name).start(() ->
                        readLoop(name, new SplittableRandom(readerSeed), model, reads, stop, errors,
                                keys -> versions(c.getBatch(keys)))));
            }
            ReaderProcess.Handle other = new ReaderProcess.Handle(cluster.masterAddress(), true, TIMEOUT);
            closers.add(other);
            long otherSeed = rnd.nextLong();
            readers.add(Thread.ofPlatform().name("chaos-reader-process").start(() ->
                    readLoop("other process", new SplittableRandom(otherSeed), model, reads, stop, errors, other::get)));

            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(seconds);
            try {
                while (System.nanoTime() < deadline) {
                    List<ProcessCluster.Managed> awake = new ArrayList<>();
                    for (ProcessCluster.Managed n : live) {
                        if (!frozen.containsKey(n)) {
                            awake.add(n);
                        }
                    }
                    String target = awake.isEmpty() ? null : awake.get(rnd.nextInt(awake.size())).name;
                    int dice = rnd.nextInt(100);
                    String key = model.keys.get(rnd.nextInt(model.keys.size()));
                    if (dice < 77) {
                        try {
                            step(writer, model, rnd, ops, dice, key, target);
                        } catch (KvPoolException e) {
                            count(ops, "writer errors"); // outcome unknown: the model marks nothing stale for it
                        }
                    } else if (dice < 92) {
                        if (frozen.isEmpty() && !awake.isEmpty()) {
                            count(ops, "freeze");
                            ProcessCluster.Managed n = awake.get(rnd.nextInt(awake.size()));
                            frozen.put(n, true);
                            n.freeze();
                            thawer.schedule(() -> {
                                n.thaw();
                                frozen.remove(n);
                            }, 200 + rnd.nextInt(1300), TimeUnit.MILLISECONDS);
                        }
                    } else if (!awake.isEmpty() && ops.getOrDefault("kill", 0L) < 3) {
                        count(ops, "kill");
                        ProcessCluster.Managed n = awake.get(rnd.nextInt(awake.size()));
                        n.kill9(); // its shared-memory file stays until a node starts and reclaims it
                        live.remove(n);
                        live.add(cluster.startNode("64MiB", "/dev/shm"));
                    }
                    Thread.sleep(rnd.nextInt(20)); // paces the chaos (random gaps between steps); nothing waits on it
                }
            } finally {
                stop.set(true);
                for (Thread t : readers) {
                    t.join(TimeUnit.SECONDS.toMillis(30));
                }
                thawer.shutdown();
                thawer.awaitTermination(10, TimeUnit.SECONDS);
                for (ProcessCluster.Managed n : frozen.keySet()) {
                    n.thaw();
                }
                for (AutoCloseable c : closers) {
                    c.close();
                }
            }
        } finally {
            thawer.shutdownNow();
        }

        long hits = 0;
        long misses = 0;
        List<String> stale = new ArrayList<>();
        List<String> corrupt = new ArrayList<>();
        for (Read r : reads) {
            if (r.version == -1) {
                misses++;
                continue;
            }
            if (r.version == -2) {
                corrupt.add(r.reader + " read " + r.key + " as bytes that are no written object");
                continue;
            }
            hits++;
            Long since = model.staleSince.get(r.key).get(r.version);
            if (since != null && since - r.startNanos < 0) {
                stale.add(r.reader + " read " + r.key + " v" + r.version + ", stale " + (r.startNanos - since) / 1_000
                        + " us before the read began");
            }
        }
        System.out.printf("RemovalChaosIT: seed %d, operations %s, reads %d (hits %d, misses %d), reader errors %d,"
                        + " stale reads %d, corrupt reads %d%n", seed, ops, reads.size(), hits, misses, errors.get(),
                stale.size(), corrupt.size());
        assertThat(corrupt).as("seed %d", seed).isEmpty();
        assertThat(stale).as("reads of versions made stale before the read began (seed %d)", seed).isEmpty();
        assertThat(hits).as("the readers read something (seed %d)", seed).isPositive();
        assertThat(ops.getOrDefault("removeAll(force)", 0L) + ops.getOrDefault("remove", 0L))
                .as("removals happened (seed %d)", seed).isPositive();
    }

    /** One pool operation of the writer (dice below 77); the model follows what the pool answered. */
    private static void step(KvPoolClient writer, Model model, SplittableRandom rnd, Map<String, Long> ops, int dice,
                             String key, String target) {
        if (dice < 30) {
            count(ops, "upsert");
            put(writer, model, key, target, true);
        } else if (dice < 52) {
            // a plain put of a key that is gone: what an engine does after a reset
            List<String> absent = model.keys.stream().filter(k -> model.current.get(k) < 0).toList();
            if (!absent.isEmpty()) {
                count(ops, "put");
                put(writer, model, absent.get(rnd.nextInt(absent.size())), target, false);
            }
        } else if (dice < 64) {
            count(ops, "remove");
            List<String> some = new ArrayList<>(model.keys);
            Collections.shuffle(some, new Random(rnd.nextLong()));
            some = some.subList(0, 1 + rnd.nextInt(4));
            writer.removeBatch(some);
            long at = System.nanoTime();
            some.forEach(k -> model.invalidate(k, at));
        } else if (dice < 72) {
            count(ops, "removeByPrefix");
            String prefix = "chaos/g" + rnd.nextInt(GROUPS) + "/";
            writer.removeByPrefix(prefix);
            long at = System.nanoTime();
            model.keys.stream().filter(k -> k.startsWith(prefix)).forEach(k -> model.invalidate(k, at));
        } else if (dice < 77) {
            count(ops, "removeAll(force)");
            writer.removeAll(true);
            long at = System.nanoTime();
            model.keys.forEach(k -> model.invalidate(k, at));
        }
    }

    private interface BatchRead {
        List<Integer> get(List<String> keys) throws Exception;
    }

    private static void readLoop(String name, SplittableRandom rnd, Model model, Queue<Read> reads, AtomicBoolean stop,
                                 AtomicLong errors, BatchRead read) {
        while (!stop.get()) {
            List<String> keys = new ArrayList<>();
            int n = 1 + rnd.nextInt(6);
            for (int i = 0; i < n; i++) {
                String k = model.keys.get(rnd.nextInt(model.keys.size()));
                if (!keys.contains(k)) {
                    keys.add(k);
                }
            }
            long t0 = System.nanoTime();
            try {
                List<Integer> got = read.get(keys);
                for (int i = 0; i < keys.size(); i++) {
                    reads.add(new Read(keys.get(i), got.get(i), t0, name));
                }
            } catch (Exception e) {
                errors.incrementAndGet(); // the master or a node was unreachable: an error, never a wrong value
            }
        }
    }

    private static void count(Map<String, Long> ops, String op) {
        ops.merge(op, 1L, Long::sum);
    }

    /** A put or upsert of the key's next version; the model follows what the pool answered. */
    private static void put(KvPoolClient c, Model model, String key, String segment, boolean upsert) {
        int v = model.nextVersion++;
        byte[] value = Payloads.make(key, v, SIZE);
        PutOptions on = segment == null ? PutOptions.DEFAULT : PutOptions.preferring(segment);
        PutStatus st = upsert ? c.upsert(key, MemorySegment.ofArray(value), on) : c.put(key, value, on);
        long at = System.nanoTime();
        if (st == PutStatus.OK) {
            if (upsert) {
                model.invalidate(key, at);
            }
            model.current.put(key, v);
        }
    }

    private static List<Integer> versions(List<Optional<byte[]>> values) {
        List<Integer> out = new ArrayList<>(values.size());
        for (Optional<byte[]> v : values) {
            out.add(ReaderProcess.version(v));
        }
        return out;
    }
}
