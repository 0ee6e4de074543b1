package io.kvpool.it;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.config.Size;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.OptionalLong;
import java.util.SplittableRandom;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicLong;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The pool against a reference model (a plain map), under random operations. Set -Dkvpool.seed=N to
 * replay a failure; every failure message starts with the seed.
 *
 * <ul>
 *   <li>Sequential, no eviction: after every operation the pool must equal the model exactly.</li>
 *   <li>Concurrent, with eviction and resets: exact equality is impossible (eviction may drop
 *       anything), so each thread checks what must still hold: a hit on one of its own keys is exactly
 *       the version it last stored (never an older one, never after its own remove, never after a
 *       reset that began after the store completed); a hit on a shared key is intact and is a version
 *       somebody tried to store.</li>
 * </ul>
 */
class ReferenceModelIT {

    private static long seed() {
        return Long.getLong("kvpool.seed", System.nanoTime());
    }

    @Test
    void sequentialOperationsMatchTheModelExactly() throws Exception {
        long seed = seed();
        SplittableRandom rnd = new SplittableRandom(seed);
        Map<String, byte[]> model = new HashMap<>();
        Map<String, Integer> versions = new HashMap<>();
        try (InProcessCluster cluster = new InProcessCluster(2, Size.ofMiB(64));
             KvPoolClient c = cluster.client()) {
            for (int op = 0; op < 2500; op++) {
                String key = "m/" + (rnd.nextInt(4)) + "/" + rnd.nextInt(60);
                String ctx = "seed=" + seed + " op=" + op + " key=" + key;
                int choice = rnd.nextInt(100);
                if (choice < 25) {
                    int v = versions.merge(key, 1, Integer::sum);
                    byte[] value = Payloads.make(key, v, Payloads.minSize(key) + rnd.nextInt(20_000));
                    PutStatus st = c.put(key, value);
                    assertThat(st).as(ctx).isEqualTo(model.containsKey(key) ? PutStatus.ALREADY_EXISTS : PutStatus.OK);
                    model.putIfAbsent(key, value);
                } else if (choice < 35) {
                    int v = versions.merge(key, 1, Integer::sum);
                    byte[] value = Payloads.make(key, v, Payloads.minSize(key) + rnd.nextInt(20_000));
                    assertThat(c.upsert(key, value)).as(ctx).isEqualTo(PutStatus.OK);
                    model.put(key, value);
                } else if (choice < 55) {
                    Optional<byte[]> got = c.get(key);
                    assertThat(got.orElse(null)).as(ctx).isEqualTo(model.get(key));
                } else if (choice < 62) {
                    assertThat(c.remove(key)).as(ctx).isEqualTo(model.remove(key) != null);
                } else if (choice < 70) {
                    assertThat(c.exists(key)).as(ctx).isEqualTo(model.containsKey(key));
                    OptionalLong size = c.size(key);
                    assertThat(size.isPresent() ? size.getAsLong() : -1).as(ctx)
                            .isEqualTo(model.containsKey(key) ? model.get(key).length : -1L);
                } else if (choice < 80) {
                    List<String> keys = new ArrayList<>();
                    for (int i = 0; i < 1 + rnd.nextInt(20); i++) {
                        keys.add("m/" + rnd.nextInt(4) + "/" + rnd.nextInt(60));
                    }
                    List<Optional<byte[]>> got = c.getBatch(keys);
                    boolean[] present = c.batchExists(keys);
                    int expectedPrefix = 0;
                    while (expectedPrefix < keys.size() && model.containsKey(keys.get(expectedPrefix))) {
                        expectedPrefix++;
                    }
                    assertThat(c.prefixMatch(keys)).as(ctx).isEqualTo(expectedPrefix);
                    for (int i = 0; i < keys.size(); i++) {
                        assertThat(got.get(i).orElse(null)).as(ctx + " batch item " + keys.get(i)).isEqualTo(model.get(keys.get(i)));
                        assertThat(present[i]).as(ctx).isEqualTo(model.containsKey(keys.get(i)));
                    }
                } else if (choice < 90) {
                    List<String> keys = new ArrayList<>();
                    List<MemorySegment> values = new ArrayList<>();
                    for (int i = 0; i < 1 + rnd.nextInt(10); i++) {
                        String k = "m/" + rnd.nextInt(4) + "/" + rnd.nextInt(60);
                        if (keys.contains(k)) {
                            continue;
                        }
                        int v = versions.merge(k, 1, Integer::sum);
                        keys.add(k);
                        values.add(MemorySegment.ofArray(Payloads.make(k, v, Payloads.minSize(k) + rnd.nextInt(8000))));
                    }
                    List<PutStatus> st = c.putBatch(keys, values);
                    for (int i = 0; i < keys.size(); i++) {
                        assertThat(st.get(i)).as(ctx + " batch put " + keys.get(i))
                                .isEqualTo(model.containsKey(keys.get(i)) ? PutStatus.ALREADY_EXISTS : PutStatus.OK);
                        model.putIfAbsent(keys.get(i), values.get(i).toArray(java.lang.foreign.ValueLayout.JAVA_BYTE));
                    }
                } else if (choice < 95) {
                    String prefix = "m/" + rnd.nextInt(4) + "/";
                    long expected = model.keySet().stream().filter(k -> k.startsWith(prefix)).count();
                    assertThat(c.removeByPrefix(prefix)).as(ctx).isEqualTo(expected);
                    model.keySet().removeIf(k -> k.startsWith(prefix));
                } else {
                    assertThat(c.removeAll(rnd.nextBoolean())).as(ctx).isEqualTo(model.size());
                    model.clear();
                }
                if (op % 250 == 0) {
                    assertThat(c.stats().keys()).as(ctx).isEqualTo(model.size());
                }
            }
            assertThat(c.stats().keys()).as("seed=" + seed).isEqualTo(model.size());
            for (Map.Entry<String, byte[]> e : model.entrySet()) {
                assertThat(c.get(e.getKey()).orElse(null)).as("seed=" + seed + " final " + e.getKey()).isEqualTo(e.getValue());
            }
        }
    }

    @ParameterizedTest(name = "shared memory: {0}")
    @ValueSource(booleans = {false, true})
    void concurrentOperationsWithEvictionKeepTheirGuarantees(boolean sharedMemory) throws Exception {
        long seed = seed();
        int threads = 4;
        AtomicLong clock = new AtomicLong();
        // [start, end] stamps of completed resets
        ConcurrentLinkedQueue<long[]> resets = new ConcurrentLinkedQueue<>();
        ConcurrentHashMap<String, Integer> sharedAttempted = new ConcurrentHashMap<>();
        ConcurrentLinkedQueue<String> errors = new ConcurrentLinkedQueue<>();
        AtomicLong ownHits = new AtomicLong();
        AtomicLong sharedHits = new AtomicLong();
        try (InProcessCluster cluster = new InProcessCluster(2, Size.ofMiB(4))) {
            List<Thread> workers = new ArrayList<>();
            for (int t = 0; t < threads; t++) {
                int id = t;
                workers.add(Thread.ofPlatform().start(() -> {
                    SplittableRandom rnd = new SplittableRandom(seed * 31 + id);
                    // own keys: the version this thread last stored and the stamp when that store completed
                    Map<String, int[]> own = new HashMap<>();
                    Map<String, Long> storedAt = new HashMap<>();
                    try (KvPoolClient c = cluster.client(cfg -> cfg.withSharedMemory(sharedMemory))) {
                        for (int op = 0; op < 1200 && errors.isEmpty(); op++) {
                            String ctx = "seed=" + seed + " thread=" + id + " op=" + op;
                            int choice = rnd.nextInt(100);
                            boolean shared = rnd.nextInt(4) == 0;
                            String key = shared ? "s/" + rnd.nextInt(30) : "t" + id + "/" + rnd.nextInt(40);
                            if (choice < 35) {
                                int v;
                                if (shared) {
                                    v = sharedAttempted.merge(key, 1, Integer::sum);
                                } else {
                                    v = (own.containsKey(key) ? own.get(key)[0] : 0) + 1;
                                }
                                byte[] value = Payloads.make(key, v, Payloads.minSize(key) + rnd.nextInt(300_000));
                                boolean up = rnd.nextBoolean();
                                PutStatus st = up ? c.upsert(key, value) : c.put(key, value);
                                long done = clock.incrementAndGet();
                                if (!shared && st == PutStatus.OK) {
                                    own.put(key, new int[]{v});
                                    storedAt.put(key, done);
                                }
                                if (!shared && st == PutStatus.ALREADY_EXISTS && (!own.containsKey(key) || own.get(key)[0] == 0)) {
                                    errors.add(ctx + ": put of " + key + " says ALREADY_EXISTS but this thread never stored it"
                                            + " or removed it");
                                }
                            } else if (choice < 75) {
                                long start = clock.incrementAndGet();
                                Optional<byte[]> got = c.get(key);
                                if (got.isEmpty()) {
                                    continue;
                                }
                                Payloads.Decoded d = Payloads.decode(got.get());
                                if (!d.intact() || !key.equals(d.key())) {
                                    errors.add(ctx + ": " + key + " returned " + d);
                                } else if (shared) {
                                    sharedHits.incrementAndGet();
                                    Integer max = sharedAttempted.get(key);
                                    if (max == null || d.version() < 1 || d.version() > max) {
                                        errors.add(ctx + ": shared " + key + " returned version " + d.version() + " of 1.." + max);
                                    }
                                } else {
                                    ownHits.incrementAndGet();
                                    int[] mine = own.get(key);
                                    if (mine == null || mine[0] == 0) {
                                        errors.add(ctx + ": " + key + " hit but this thread removed it or never stored it: " + d);
                                    } else if (d.version() != mine[0]) {
                                        errors.add(ctx + ": " + key + " returned version " + d.version() + ", last stored " + mine[0]);
                                    } else {
                                        Long at = storedAt.get(key);
                                        for (long[] r : resets) {
                                            if (at != null && at < r[0] && r[1] < start) {
                                                errors.add(ctx + ": " + key + " stored at " + at + " survived the reset " + r[0] + ".." + r[1]);
                                            }
                                        }
                                    }
                                }
                            } else if (choice < 88) {
                                boolean removed = c.remove(key);
                                if (!shared) {
                                    if (removed && (own.get(key) == null || own.get(key)[0] == 0)) {
                                        errors.add(ctx + ": removed " + key + " which this thread never stored");
                                    }
                                    own.computeIfPresent(key, (k, v) -> new int[]{0});
                                    storedAt.remove(key);
                                }
                            } else if (choice < 98) {
                                List<String> keys = new ArrayList<>();
                                for (int i = 0; i < 8; i++) {
                                    keys.add("t" + id + "/" + rnd.nextInt(40));
                                }
                                int m = c.prefixMatch(keys);
                                boolean[] present = c.batchExists(keys);
                                if (m < 0 || m > keys.size()) {
                                    errors.add(ctx + ": prefixMatch returned " + m);
                                }
                                for (int i = 0; i < keys.size(); i++) {
                                    int[] mine = own.get(keys.get(i));
                                    if (present[i] && (mine == null || mine[0] == 0)) {
                                        errors.add(ctx + ": " + keys.get(i) + " exists but this thread never stored it or removed it");
                                    }
                                }
                            } else if (rnd.nextInt(8) == 0) {
                                long s = clock.incrementAndGet();
                                c.removeAll(true);
                                long e = clock.incrementAndGet();
                                resets.add(new long[]{s, e});
                            }
                        }
                    } catch (RuntimeException e) {
                        errors.add("seed=" + seed + " thread " + id + ": " + e);
                    }
                }));
            }
            for (Thread w : workers) {
                w.join();
            }
            String summary = "seed=" + seed + " own hits=" + ownHits + " shared hits=" + sharedHits + " resets="
                    + resets.size() + " evicted=" + cluster.master.service().eviction().evictedKeyCount();
            assertThat(errors).as(summary).isEmpty();
            assertThat(ownHits.get() + sharedHits.get()).as(summary).isPositive();
            assertThat(cluster.master.service().eviction().evictedKeyCount()).as("eviction must have run: " + summary).isPositive();
        }
    }
}
