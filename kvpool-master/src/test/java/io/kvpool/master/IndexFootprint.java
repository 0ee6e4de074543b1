package io.kvpool.master;

import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.MasterMessages.Inventory;
import io.kvpool.protocol.msg.MasterMessages.PutEndItem;
import io.kvpool.protocol.msg.MasterMessages.PutStart;
import io.kvpool.protocol.msg.MasterMessages.PutStartItem;
import io.kvpool.protocol.msg.MasterMessages.PutStartReply;
import io.kvpool.protocol.msg.MasterMessages.RegisterNode;
import io.kvpool.protocol.msg.MasterMessages.RegisterReply;

import java.lang.management.ManagementFactory;
import java.lang.management.MemoryMXBean;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.SplittableRandom;

/**
 * A measurement, not a test: fills a {@link MasterService} with N objects under keys shaped like an
 * engine's ({@code "llama3-8b@v7/tp0/"} + 64 lowercase hex characters, 81 bytes), reports the heap
 * they take per object, then the single-thread throughput of batched {@code exists} and
 * {@code getReplicaList} over 1024-key batches.
 *
 * <pre>
 *   ./mvnw -o -q -pl kvpool-master dependency:build-classpath -Dmdep.outputFile=/tmp/cp.txt
 *   java -Xmx4g -cp kvpool-master/target/test-classes:kvpool-master/target/classes:$(cat /tmp/cp.txt) \
 *        io.kvpool.master.IndexFootprint [objects=10000000] [seconds per throughput run=5]
 * </pre>
 *
 * The heap figure is (heap used after full GCs with the objects in) minus (the same before the
 * first put), divided by N: it counts everything the index holds per object (key bytes, replica,
 * value length, generation, LRU tick, hash table), and nothing of the harness.
 */
public final class IndexFootprint {

    private static final String PREFIX = "llama3-8b@v7/tp0/";
    private static final long VALUE = 64 * 1024;
    private static final int PUT_BATCH = 4096;
    private static final int PROBE_BATCH = 1024;

    public static void main(String[] args) {
        int n = args.length > 0 ? Integer.parseInt(args[0]) : 10_000_000;
        double seconds = args.length > 1 ? Double.parseDouble(args[1]) : 5;
        MemoryMXBean mem = ManagementFactory.getMemoryMXBean();

        ManualClock clock = new ManualClock(1_700_000_000_000L);
        MasterService svc = new MasterService(MasterConfig.defaults(), clock, new SplittableRandom(7), NodeNotifier.NONE);
        RegisterReply r = svc.membership().registerNode(new RegisterNode("a:1", "10.0.0.1", 50052, 4L << 40, svc.epoch(), 1, 0, "", ControlToken.random()));
        svc.membership().inventory(new Inventory(r.segmentId(), 1, true, List.of()));
        long before = usedAfterGc(mem);

        long t0 = System.nanoTime();
        List<PutStartItem> items = new ArrayList<>(PUT_BATCH);
        List<PutEndItem> ends = new ArrayList<>(PUT_BATCH);
        for (int from = 0; from < n; from += PUT_BATCH) {
            int to = Math.min(n, from + PUT_BATCH);
            items.clear();
            for (int i = from; i < to; i++) {
                items.add(new PutStartItem(key(i), VALUE));
            }
            PutStartReply reply = svc.putStart(new PutStart(false, 1, "", items));
            ends.clear();
            for (int i = 0; i < items.size(); i++) {
                if (reply.results().get(i).code() != ResultCode.OK) {
                    throw new IllegalStateException("put " + (from + i) + ": " + reply.results().get(i).code());
                }
                ends.add(new PutEndItem(items.get(i).key(), reply.results().get(i).generation(), 0));
            }
            for (ResultCode c : svc.putEnd(ends)) {
                if (c != ResultCode.OK) {
                    throw new IllegalStateException("put end: " + c);
                }
            }
        }
        double fillSecs = (System.nanoTime() - t0) / 1e9;
        items.clear();
        ends.clear();
        long after = usedAfterGc(mem);
        if (svc.keyCount() != n) {
            throw new IllegalStateException("key count " + svc.keyCount() + " != " + n);
        }
        System.out.printf(Locale.ROOT, "objects %,d: filled in %.1f s (%.0f puts/s)%n", n, fillSecs, n / fillSecs);
        System.out.printf(Locale.ROOT, "heap before %,d B, after %,d B: %.1f B/object (committed %,d B)%n", before, after,
                (after - before) / (double) n, mem.getHeapMemoryUsage().getCommitted());

        // probe batches: half hits (random stored keys), half misses (never stored)
        SplittableRandom rnd = new SplittableRandom(42);
        List<List<byte[]>> hits = new ArrayList<>();
        List<List<byte[]>> misses = new ArrayList<>();
        for (int b = 0; b < 128; b++) {
            List<byte[]> h = new ArrayList<>(PROBE_BATCH);
            List<byte[]> m = new ArrayList<>(PROBE_BATCH);
            for (int i = 0; i < PROBE_BATCH; i++) {
                h.add(key(rnd.nextInt(n)));
                m.add(key(n + rnd.nextInt(Integer.MAX_VALUE - n)));
            }
            hits.add(h);
            misses.add(m);
        }
        for (int round = 0; round < 2; round++) {
            String tag = round == 0 ? "(warm-up) " : "";
            rate(tag + "exists, stored keys", seconds, hits, b -> {
                boolean[] out = svc.probes().exists(b);
                if (!out[0] || !out[out.length - 1]) {
                    throw new IllegalStateException("a stored key is missing");
                }
            });
            rate(tag + "exists, absent keys", seconds, misses, b -> {
                if (svc.probes().exists(b)[0]) {
                    throw new IllegalStateException("an absent key is present");
                }
            });
            rate(tag + "getReplicaList, stored keys", seconds, hits, b -> svc.getReplicaList(b));
        }
    }

    private static void rate(String what, double seconds, List<List<byte[]>> batches,
                             java.util.function.Consumer<List<byte[]>> op) {
        long keys = 0;
        long start = System.nanoTime();
        long end = start + (long) (seconds * 1e9);
        int i = 0;
        long now;
        do {
            List<byte[]> b = batches.get(i++ % batches.size());
            op.accept(b);
            keys += b.size();
        } while ((now = System.nanoTime()) < end);
        System.out.printf(Locale.ROOT, "%-40s %,12.0f keys/s (%d-key batches, one thread)%n", what,
                keys / ((now - start) / 1e9), PROBE_BATCH);
    }

    private static long usedAfterGc(MemoryMXBean mem) {
        long used = Long.MAX_VALUE;
        for (int i = 0; i < 4; i++) {
            System.gc();
            used = Math.min(used, mem.getHeapMemoryUsage().getUsed());
        }
        return used;
    }

    private static final byte[] HEX = "0123456789abcdef".getBytes(StandardCharsets.US_ASCII);

    /** Key number {@code i}: the prefix and 64 hex digits of four 64-bit mixes of i (like a SHA-256 in hex). */
    static byte[] key(int i) {
        byte[] p = PREFIX.getBytes(StandardCharsets.US_ASCII);
        byte[] k = new byte[p.length + 64];
        System.arraycopy(p, 0, k, 0, p.length);
        long x = i;
        for (int w = 0; w < 4; w++) {
            x = mix(x + 0x9E3779B97F4A7C15L * (w + 1));
            for (int d = 0; d < 16; d++) {
                k[p.length + w * 16 + d] = HEX[(int) (x >>> (60 - 4 * d)) & 15];
            }
        }
        return k;
    }

    private static long mix(long z) {
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
        z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
        return z ^ (z >>> 31);
    }
}
