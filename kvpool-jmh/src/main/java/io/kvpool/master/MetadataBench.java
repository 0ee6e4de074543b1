package io.kvpool.master;

import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.MasterMessages.Inventory;
import io.kvpool.protocol.msg.MasterMessages.PutEndItem;
import io.kvpool.protocol.msg.MasterMessages.PutStart;
import io.kvpool.protocol.msg.MasterMessages.PutStartItem;
import io.kvpool.protocol.msg.MasterMessages.PutStartReply;
import io.kvpool.protocol.msg.MasterMessages.PutStartResult;
import io.kvpool.protocol.msg.MasterMessages.RegisterNode;
import io.kvpool.protocol.msg.MasterMessages.RegisterReply;
import io.kvpool.protocol.msg.MasterMessages.ReplicaList;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Fork;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Measurement;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OperationsPerInvocation;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;
import org.openjdk.jmh.annotations.Warmup;

import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.time.InstantSource;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.SplittableRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The master's metadata operations, through {@link MasterService}'s public API (no sockets, no
 * codec): a master with one 4 TiB segment holding {@code objects} complete objects (2 MiB KV blocks
 * under 81-byte keys), queried with batches of 1024 keys, the size of a long prompt's block list.
 *
 * <ul>
 *   <li>{@link #existsAllPresent}, {@link #existsHalfPresent}: EXIST_KEY / BATCH_EXIST.</li>
 *   <li>{@link #prefixMatchAllPresent}, {@link #prefixMatchHalfPresent}: PREFIX_MATCH, the probe an
 *       engine makes before prefill. "Half present" batches have their first 512 keys stored and the
 *       last 512 not (a prompt whose first half is cached), so prefixMatch stops after 513 lookups
 *       while exists looks up all 1024.</li>
 *   <li>{@link #getReplicaList}: GET_REPLICA_LIST of 1024 stored keys (also stamps LRU ticks).</li>
 *   <li>{@link #putThenRemove}: PUT_START + PUT_END of 1024 keys not in the pool, then REMOVE of the
 *       same keys, so the index and the allocator stay the same size; one operation is a key's whole
 *       put-and-remove cycle (allocate, pending entry, complete entry, free).</li>
 * </ul>
 *
 * <p>Why it matters: the master is the one shared component every engine talks to; these calls
 * bound how many keys per second the whole pool can look up and store, and how that changes with
 * the index size (100 thousand vs 1 million objects: hash-table cache misses).
 *
 * <p>Results are throughput in <b>keys per second</b> (JMH's ops/s, with
 * {@code @OperationsPerInvocation(1024)}: one operation is one key of a batch). Query batches are
 * drawn from 256 pre-built random samples of the stored keys so that successive calls do not hit the
 * same cache lines. The clock is fixed, so no put expires and no timer runs.
 */
@BenchmarkMode(Mode.Throughput)
@OutputTimeUnit(TimeUnit.SECONDS)
@Warmup(iterations = 3, time = 1)
@Measurement(iterations = 5, time = 1)
@Fork(value = 1, jvmArgsAppend = {"-Xms4g", "-Xmx4g"})
public class MetadataBench {

    static final int BATCH = 1024;
    /** A KV block of llama3-8b for 16 tokens in bf16: 16 * 32 layers * 2 (K, V) * 8 heads * 128 dims * 2 bytes. */
    static final long VALUE = 2L << 20;
    static final long SEGMENT = 4L << 40;
    static final int SAMPLES = 256;

    static byte[] key(SplittableRandom rnd) {
        byte[] hash = new byte[32];
        rnd.nextBytes(hash);
        return ("llama3-8b@v7/tp0/" + HexFormat.of().formatHex(hash)).getBytes(StandardCharsets.UTF_8);
    }

    static List<byte[]> freshKeys(SplittableRandom rnd, int n) {
        List<byte[]> keys = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            keys.add(key(rnd));
        }
        return keys;
    }

    /** Puts each key as a complete object; fails loudly on anything but OK. */
    static void put(MasterService svc, List<byte[]> keys) {
        List<PutStartItem> items = new ArrayList<>(keys.size());
        for (byte[] k : keys) {
            items.add(new PutStartItem(k, VALUE));
        }
        PutStartReply reply = svc.putStart(new PutStart(false, 1, "", items));
        List<PutEndItem> ends = new ArrayList<>(keys.size());
        for (int i = 0; i < keys.size(); i++) {
            PutStartResult r = reply.results().get(i);
            if (r.code() != ResultCode.OK) {
                throw new IllegalStateException("putStart: " + r.code());
            }
            ends.add(new PutEndItem(keys.get(i), r.generation(), 0));
        }
        for (ResultCode c : svc.putEnd(ends)) {
            if (c != ResultCode.OK) {
                throw new IllegalStateException("putEnd: " + c);
            }
        }
    }

    /** The master, preloaded, and pre-built query batches. Shared by all benchmark threads. */
    @State(Scope.Benchmark)
    public static class Master {

        @Param({"100000", "1000000"})
        public int objects;

        MasterService svc;
        /** Batches of 1024 stored keys. */
        List<List<byte[]>> present;
        /** Batches whose first 512 keys are stored and last 512 are not. */
        List<List<byte[]>> half;

        @Setup(Level.Trial)
        public void setUp() {
            InstantSource clock = InstantSource.fixed(Instant.ofEpochMilli(1_700_000_000_000L));
            svc = new MasterService(MasterConfig.defaults(), clock, new SplittableRandom(7), NodeNotifier.NONE);
            RegisterReply reg = svc.membership().registerNode(new RegisterNode("bench:1", "10.0.0.1", 50052, SEGMENT, svc.epoch(),
                    1, 0, "", ControlToken.random()));
            svc.membership().inventory(new Inventory(reg.segmentId(), 1, true, List.of()));

            SplittableRandom rnd = new SplittableRandom(1);
            byte[][] stored = new byte[objects][];
            for (int i = 0; i < objects; i += BATCH) {
                List<byte[]> batch = freshKeys(rnd, Math.min(BATCH, objects - i));
                put(svc, batch);
                for (int j = 0; j < batch.size(); j++) {
                    stored[i + j] = batch.get(j);
                }
            }
            if (svc.keyCount() != objects) {
                throw new IllegalStateException("preloaded " + svc.keyCount() + " objects, wanted " + objects);
            }

            present = new ArrayList<>(SAMPLES);
            half = new ArrayList<>(SAMPLES);
            for (int b = 0; b < SAMPLES; b++) {
                List<byte[]> p = new ArrayList<>(BATCH);
                List<byte[]> h = new ArrayList<>(BATCH);
                for (int i = 0; i < BATCH; i++) {
                    p.add(stored[rnd.nextInt(objects)]);
                    h.add(i < BATCH / 2 ? stored[rnd.nextInt(objects)] : key(rnd));
                }
                present.add(List.copyOf(p));
                half.add(List.copyOf(h));
            }
            if (svc.probes().prefixMatch(present.getFirst()) != BATCH || svc.probes().prefixMatch(half.getFirst()) != BATCH / 2) {
                throw new IllegalStateException("query batches are not what they claim");
            }
        }

        @TearDown(Level.Trial)
        public void check() {
            if (svc.keyCount() != objects) {
                throw new IllegalStateException("index drifted to " + svc.keyCount() + " objects from " + objects);
            }
        }
    }

    /** Per thread: which pre-built batch comes next, and this thread's own keys for putThenRemove. */
    @State(Scope.Thread)
    public static class Cursor {

        private static final AtomicInteger THREADS = new AtomicInteger();

        int next;
        /** Keys never stored in the preload, distinct per thread; each batch is put and removed in one call. */
        List<List<byte[]>> fresh;
        int nextFresh;

        @Setup(Level.Trial)
        public void setUp() {
            SplittableRandom rnd = new SplittableRandom(1000 + THREADS.incrementAndGet());
            fresh = new ArrayList<>(64);
            for (int i = 0; i < 64; i++) {
                fresh.add(List.copyOf(freshKeys(rnd, BATCH)));
            }
        }

        int nextSample() {
            int i = next;
            next = (i + 1) & (SAMPLES - 1);
            return i;
        }

        List<byte[]> nextFresh() {
            List<byte[]> b = fresh.get(nextFresh);
            nextFresh = (nextFresh + 1) & 63;
            return b;
        }
    }

    @Benchmark
    @OperationsPerInvocation(BATCH)
    public boolean[] existsAllPresent(Master m, Cursor c) {
        return m.svc.probes().exists(m.present.get(c.nextSample()));
    }

    @Benchmark
    @OperationsPerInvocation(BATCH)
    public boolean[] existsHalfPresent(Master m, Cursor c) {
        return m.svc.probes().exists(m.half.get(c.nextSample()));
    }

    @Benchmark
    @OperationsPerInvocation(BATCH)
    public int prefixMatchAllPresent(Master m, Cursor c) {
        return m.svc.probes().prefixMatch(m.present.get(c.nextSample()));
    }

    /** Stops at the first miss (key 513); the rate is still per key submitted. */
    @Benchmark
    @OperationsPerInvocation(BATCH)
    public int prefixMatchHalfPresent(Master m, Cursor c) {
        return m.svc.probes().prefixMatch(m.half.get(c.nextSample()));
    }

    @Benchmark
    @OperationsPerInvocation(BATCH)
    public List<ReplicaList> getReplicaList(Master m, Cursor c) {
        return m.svc.getReplicaList(m.present.get(c.nextSample()));
    }

    @Benchmark
    @OperationsPerInvocation(BATCH)
    public List<ResultCode> putThenRemove(Master m, Cursor c) {
        List<byte[]> keys = c.nextFresh();
        put(m.svc, keys);
        return m.svc.remove(keys);
    }
}
