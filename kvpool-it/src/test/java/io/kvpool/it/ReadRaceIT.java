package io.kvpool.it;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.config.Size;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.SplittableRandom;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReferenceArray;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * Reads race eviction, removal and in-place replacement on a pool far too small for what is written,
 * so regions are reused constantly while readers stream from them. Every byte of every hit is
 * checked: a reader must get exactly the object it asked for, or a miss.
 */
class ReadRaceIT {

    private static final int WRITERS = 2;
    private static final int READERS = 3;
    private static final int PUTS_PER_WRITER = 400;

    /** Both data paths: TCP, where the node pins what it streams, and shared memory, where it does not. */
    @ParameterizedTest(name = "shared memory: {0}")
    @ValueSource(booleans = {false, true})
    void readersNeverSeeForeignOrPartialBytes(boolean sharedMemory) throws Exception {
        long seed = Long.getLong("kvpool.seed", System.nanoTime());
        try (InProcessCluster cluster = new InProcessCluster(2, Size.ofMiB(12))) {
            AtomicReferenceArray<String> recent = new AtomicReferenceArray<>(48);
            ConcurrentHashMap<String, Integer> maxVersion = new ConcurrentHashMap<>();
            ConcurrentLinkedQueue<String> errors = new ConcurrentLinkedQueue<>();
            AtomicLong hits = new AtomicLong();
            AtomicLong misses = new AtomicLong();
            AtomicLong removals = new AtomicLong();
            AtomicLong upserts = new AtomicLong();
            AtomicLong writersLeft = new AtomicLong(WRITERS);
            List<Thread> threads = new ArrayList<>();

            for (int w = 0; w < WRITERS; w++) {
                int id = w;
                threads.add(Thread.ofPlatform().start(() -> {
                    SplittableRandom rnd = new SplittableRandom(seed + id);
                    try (KvPoolClient c = cluster.client(cfg -> cfg.withSharedMemory(sharedMemory))) {
                        for (int i = 0; i < PUTS_PER_WRITER; i++) {
                            String key = "race/w" + id + "/" + i;
                            maxVersion.put(key, 1);
                            PutStatus st = c.put(key, Payloads.make(key, 1, 100_000 + rnd.nextInt(900_000)));
                            if (st == PutStatus.OK) {
                                recent.set(rnd.nextInt(recent.length()), key);
                            }
                        }
                    } catch (RuntimeException e) {
                        errors.add("writer " + id + ": " + e);
                    } finally {
                        writersLeft.decrementAndGet();
                    }
                }));
            }
            // removes and replaces recent objects while they are being read
            threads.add(Thread.ofPlatform().start(() -> {
                SplittableRandom rnd = new SplittableRandom(seed + 100);
                try (KvPoolClient c = cluster.client(cfg -> cfg.withSharedMemory(sharedMemory))) {
                    while (writersLeft.get() > 0) {
                        String key = recent.get(rnd.nextInt(recent.length()));
                        if (key == null) {
                            continue;
                        }
                        if (rnd.nextBoolean()) {
                            removals.addAndGet(c.remove(key) ? 1 : 0);
                        } else {
                            int v = maxVersion.merge(key, 1, Integer::sum);
                            if (c.upsert(key, Payloads.make(key, v, 100_000 + rnd.nextInt(900_000))) == PutStatus.OK) {
                                upserts.incrementAndGet();
                            }
                        }
                    }
                } catch (RuntimeException e) {
                    errors.add("remover: " + e);
                }
            }));
            for (int r = 0; r < READERS; r++) {
                int id = r;
                threads.add(Thread.ofPlatform().start(() -> {
                    SplittableRandom rnd = new SplittableRandom(seed + 200 + id);
                    try (KvPoolClient c = cluster.client(cfg -> cfg.withSharedMemory(sharedMemory)); Arena arena = Arena.ofConfined()) {
                        List<MemorySegment> buffers = new ArrayList<>();
                        for (int i = 0; i < 4; i++) {
                            buffers.add(arena.allocate(1 << 20));
                        }
                        while (writersLeft.get() > 0) {
                            List<String> keys = new ArrayList<>();
                            for (int i = 0; i < 4; i++) {
                                String k = recent.get(rnd.nextInt(recent.length()));
                                keys.add(k == null ? "race/none" : k);
                            }
                            if (rnd.nextBoolean()) {
                                List<Optional<byte[]>> got = c.getBatch(keys);
                                for (int i = 0; i < keys.size(); i++) {
                                    if (got.get(i).isPresent()) {
                                        check(keys.get(i), Payloads.decode(got.get(i).get()), maxVersion, errors, seed);
                                        hits.incrementAndGet();
                                    } else {
                                        misses.incrementAndGet();
                                    }
                                }
                            } else {
                                long[] lens = c.getIntoBatch(keys, buffers);
                                for (int i = 0; i < keys.size(); i++) {
                                    if (lens[i] >= 0) {
                                        check(keys.get(i), Payloads.decode(buffers.get(i).asSlice(0, lens[i])), maxVersion,
                                                errors, seed);
                                        hits.incrementAndGet();
                                    } else {
                                        misses.incrementAndGet();
                                    }
                                }
                            }
                        }
                    } catch (RuntimeException e) {
                        errors.add("reader " + id + ": " + e);
                    }
                }));
            }
            for (Thread t : threads) {
                t.join();
            }
            String ctx = "seed=" + seed + " hits=" + hits + " misses=" + misses + " removals=" + removals + " upserts="
                    + upserts + " evicted=" + cluster.master.service().eviction().evictedKeyCount();
            assertThat(errors).as(ctx).isEmpty();
            assertThat(hits.get()).as("the race must have read something: " + ctx).isPositive();
            assertThat(cluster.master.service().eviction().evictedKeyCount()).as("eviction must have reused space: " + ctx).isPositive();
            assertThat(removals.get() + upserts.get()).as("removal and replacement must have happened: " + ctx).isPositive();
        }
    }

    private static void check(String asked, Payloads.Decoded got, ConcurrentHashMap<String, Integer> maxVersion,
                              ConcurrentLinkedQueue<String> errors, long seed) {
        Integer max = maxVersion.get(asked);
        if (!got.intact() || !asked.equals(got.key()) || max == null || got.version() < 1 || got.version() > max) {
            errors.add("seed=" + seed + ": asked for " + asked + " (versions 1.." + max + ") and got " + got);
        }
    }
}
