package io.kvpool.bench;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.protocol.Tls;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.SplittableRandom;

/**
 * kvpool as a {@link StoreTarget}: one {@link KvPoolClient} per benchmark client, values in native
 * memory (what an engine's KV blocks are), puts of fresh keys and {@code getInto} reads, over TCP
 * or over the same-machine shared-memory path.
 */
final class KvpoolTarget implements StoreTarget {

    /** Keys each client stores for its get phase: small enough to stay resident, big enough not to be one hot key. */
    private static final long WORKING_SET_BYTES_PER_CLIENT = 128L << 20;

    private final String masterAddress;
    private final boolean sharedMemory;
    private final boolean writeLeases;
    /** Copies per put (0: the master's default). */
    private final int replicas;
    private final Tls tls;
    private int run;

    KvpoolTarget(String masterAddress, boolean sharedMemory) {
        this(masterAddress, sharedMemory, true);
    }

    /** With {@code writeLeases} false, puts take the two-phase path (the put of protocol version 4). */
    KvpoolTarget(String masterAddress, boolean sharedMemory, boolean writeLeases) {
        this(masterAddress, sharedMemory, writeLeases, 0);
    }

    /** Puts of {@code replicas} copies each (on distinct segments). */
    KvpoolTarget(String masterAddress, boolean sharedMemory, boolean writeLeases, int replicas) {
        this(masterAddress, sharedMemory, writeLeases, replicas, Tls.NONE);
    }

    /** Over TCP in mutual TLS with {@code tls} (the pool must use the same CA). */
    KvpoolTarget(String masterAddress, Tls tls) {
        this(masterAddress, false, true, 0, tls);
    }

    private KvpoolTarget(String masterAddress, boolean sharedMemory, boolean writeLeases, int replicas, Tls tls) {
        this.masterAddress = masterAddress;
        this.sharedMemory = sharedMemory;
        this.writeLeases = writeLeases;
        this.replicas = replicas;
        this.tls = tls;
    }

    @Override
    public String name() {
        return (sharedMemory ? "kvpool-shm" : tls.enabled() ? "kvpool-tls" : "kvpool-tcp") + (writeLeases ? "" : "-2phase")
                + (replicas > 0 ? "-x" + replicas : "");
    }

    private KvPoolClient connect() {
        return KvPoolClient.connect(ClientConfig.forMaster(masterAddress).withSharedMemory(sharedMemory)
                .withWriteLeases(writeLeases).withReplicas(replicas).withTls(tls));
    }

    private static MemorySegment value(Arena arena, int size, long seed) {
        MemorySegment v = arena.allocate(size, 64);
        SplittableRandom rnd = new SplittableRandom(seed);
        for (long i = 0; i + 8 <= size; i += 8) {
            v.set(ValueLayout.JAVA_LONG_UNALIGNED, i, rnd.nextLong());
        }
        return v;
    }

    /** Stores {@code count} copies of {@code v} under fresh keys for a get phase; returns the keys. */
    private static List<String> storeWorkingSet(KvPoolClient c, MemorySegment v, String prefix, int count) {
        List<String> keys = new ArrayList<>(count);
        for (int k = 0; k < count; k++) {
            String key = prefix + "/" + k;
            PutStatus st = c.put(key, v);
            if (st != PutStatus.OK) {
                throw new IllegalStateException("storing the working set: " + key + " returned " + st);
            }
            keys.add(key);
        }
        return keys;
    }

    @Override
    public Measurement put(int valueSize, int clients, Duration warmup, Duration duration) throws Exception {
        int r = ++run;
        return Load.run(clients, warmup, duration, id -> new Load.Client() {
            final KvPoolClient c = connect();
            final Arena arena = Arena.ofShared();
            final MemorySegment v = value(arena, valueSize, id);

            @Override
            public Load.Op op() {
                return i -> {
                    String key = name() + "/put/" + r + "/" + valueSize + "/" + id + "/" + i;
                    PutStatus st = c.put(key, v);
                    if (st != PutStatus.OK) {
                        throw new IllegalStateException("put of " + key + " returned " + st);
                    }
                    return valueSize;
                };
            }

            @Override
            public void close() {
                c.close();
                arena.close();
            }
        });
    }

    @Override
    public Measurement get(int valueSize, int clients, Duration warmup, Duration duration) throws Exception {
        int r = ++run;
        int keysPerClient = (int) Math.max(4, Math.min(256, WORKING_SET_BYTES_PER_CLIENT / valueSize));
        return Load.run(clients, warmup, duration, id -> new Load.Client() {
            final KvPoolClient c = connect();
            final Arena arena = Arena.ofShared();
            final MemorySegment dst = arena.allocate(valueSize, 64);
            final List<String> keys = new ArrayList<>();
            final SplittableRandom rnd = new SplittableRandom(id * 31L + r);

            {
                keys.addAll(storeWorkingSet(c, value(arena, valueSize, id), name() + "/get/" + r + "/" + id, keysPerClient));
            }

            @Override
            public Load.Op op() {
                return i -> {
                    String key = keys.get(rnd.nextInt(keys.size()));
                    long n = c.getInto(key, dst);
                    if (n != valueSize) {
                        throw new IllegalStateException("get of " + key + " returned " + n + " bytes, expected " + valueSize);
                    }
                    return n;
                };
            }

            @Override
            public void close() {
                c.close();
                arena.close();
            }
        });
    }

    /**
     * Gets of {@code batch} values per call ({@code getIntoBatch}), as an engine loads the cached
     * blocks of one prompt: one master round trip per batch instead of per block.
     */
    Measurement getBatched(int valueSize, int batch, int clients, Duration warmup, Duration duration) throws Exception {
        int r = ++run;
        int keysPerClient = (int) Math.max(batch, Math.min(256, WORKING_SET_BYTES_PER_CLIENT / valueSize));
        return Load.run(clients, warmup, duration, id -> new Load.Client() {
            final KvPoolClient c = connect();
            final Arena arena = Arena.ofShared();
            final List<MemorySegment> dsts = new ArrayList<>();
            final List<String> keys = new ArrayList<>();
            final SplittableRandom rnd = new SplittableRandom(id * 37L + r);

            {
                keys.addAll(storeWorkingSet(c, value(arena, valueSize, id), name() + "/getb/" + r + "/" + id, keysPerClient));
                for (int b = 0; b < batch; b++) {
                    dsts.add(arena.allocate(valueSize, 64));
                }
            }

            @Override
            public Load.Op op() {
                return i -> {
                    int start = rnd.nextInt(keys.size() - batch + 1);
                    long[] got = c.getIntoBatch(keys.subList(start, start + batch), dsts);
                    long n = 0;
                    for (long g : got) {
                        if (g != valueSize) {
                            throw new IllegalStateException("a batched get returned " + g + " bytes, expected " + valueSize);
                        }
                        n += g;
                    }
                    return n;
                };
            }

            @Override
            public void close() {
                c.close();
                arena.close();
            }
        });
    }

    /** Puts of {@code batch} fresh values per call ({@code putBatch}): one reserve and one complete per batch. */
    Measurement putBatched(int valueSize, int batch, int clients, Duration warmup, Duration duration) throws Exception {
        int r = ++run;
        return Load.run(clients, warmup, duration, id -> new Load.Client() {
            final KvPoolClient c = connect();
            final Arena arena = Arena.ofShared();
            final MemorySegment v = value(arena, valueSize, id);
            final List<MemorySegment> values = Collections.nCopies(batch, v);

            @Override
            public Load.Op op() {
                return i -> {
                    List<String> keys = new ArrayList<>(batch);
                    for (int b = 0; b < batch; b++) {
                        keys.add(name() + "/putb/" + r + "/" + id + "/" + i + "/" + b);
                    }
                    for (PutStatus st : c.putBatch(keys, values)) {
                        if (st != PutStatus.OK) {
                            throw new IllegalStateException("a batched put returned " + st);
                        }
                    }
                    return (long) valueSize * batch;
                };
            }

            @Override
            public void close() {
                c.close();
                arena.close();
            }
        });
    }

    @Override
    public void clear() {
        try (KvPoolClient c = connect()) {
            c.removeAll(true);
        }
    }

    /**
     * {@code clients} threads, each with its own client, calling {@code batchExists(keys)} on keys
     * that must all be present (a missing one fails the run).
     */
    static Measurement batchExists(String master, List<String> keys, int clients, Duration warmup, Duration duration)
            throws Exception {
        return Load.run(clients, warmup, duration, id -> new Load.Client() {
            final KvPoolClient own = KvPoolClient.connect(master);

            @Override
            public Load.Op op() {
                return i -> {
                    for (boolean p : own.batchExists(keys)) {
                        if (!p) {
                            throw new IllegalStateException("a stored key was reported missing");
                        }
                    }
                    return 0;
                };
            }

            @Override
            public void close() {
                own.close();
            }
        });
    }
}
