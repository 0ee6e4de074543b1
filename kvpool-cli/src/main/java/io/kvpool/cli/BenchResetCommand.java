package io.kvpool.cli;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.config.Size;
import io.kvpool.master.MasterConfig;
import io.kvpool.node.NodeConfig;
import io.kvpool.protocol.ObjectLayout;
import me.tongfei.progressbar.ProgressBar;
import me.tongfei.progressbar.ProgressBarBuilder;
import me.tongfei.progressbar.ProgressBarStyle;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

import java.lang.foreign.MemorySegment;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.Callable;

/**
 * {@code kvpool bench reset}: how long removeAll takes on a full pool (the RL weight-update reset).
 * Loads N small objects into an embedded pool with batched puts, then times removeAll(force=true)
 * as a client sees it (including the reset reaching the node), and removeAll(force=false) on a
 * second fill, in the same run.
 */
@Command(name = "reset", mixinStandardHelpOptions = true,
        description = "Time removeAll(force) and removeAll on a pool holding --objects objects.")
final class BenchResetCommand implements Callable<Integer> {

    @Option(names = "--objects", paramLabel = "N", description = "Objects in the pool (default: ${DEFAULT-VALUE}).")
    int objects = 1_000_000;

    @Option(names = "--value-size", paramLabel = "SIZE", description = "Bytes per object (default: 64B).")
    Size valueSize = Size.ofBytes(64);

    @Option(names = "--batch", paramLabel = "N", description = "Objects per putBatch (default: ${DEFAULT-VALUE}).")
    int batch = 8192;

    @Override
    public Integer call() throws Exception {
        if (objects < 1 || batch < 1) {
            throw new IllegalArgumentException("--objects and --batch must be at least 1");
        }
        long region = ObjectLayout.regionLength(key(objects).length(), valueSize.bytes());
        long segment = Math.max(64L << 20, (long) (region * (long) objects / 0.85)) + (1 << 20);
        MasterConfig mc = MasterConfig.defaults().withListen("127.0.0.1", 0, -1).withSummaryInterval(Duration.ZERO);
        try (EmbeddedPool pool = new EmbeddedPool(mc, m -> NodeConfig.defaults(m, Size.ofBytes(segment & ~63L))
                .withListen("127.0.0.1", 0));
             KvPoolClient c = KvPoolClient.connect(pool.masterAddress())) {
            System.out.printf("kvpool bench reset: %d objects of %s in a %s segment%n", objects, valueSize,
                    Size.human(segment));
            long heapBefore = usedHeapAfterGc();
            double loadSecs = fill(c, "fill 1");
            long heapPerObject = (usedHeapAfterGc() - heapBefore) / objects;
            long t0 = System.nanoTime();
            long removed = c.removeAll(true);
            double forceMs = (System.nanoTime() - t0) / 1e6;
            check(removed, c);
            fill(c, "fill 2");
            t0 = System.nanoTime();
            long removed2 = c.removeAll(false);
            double plainMs = (System.nanoTime() - t0) / 1e6;
            check(removed2, c);
            Table t = new Table("measurement", "value").right(1);
            t.row("objects", objects);
            t.row("batched put rate (putBatch of " + batch + ")", String.format(Locale.ROOT, "%.0f objects/s", objects / loadSecs));
            t.row("removeAll(force=true)", String.format(Locale.ROOT, "%.1f ms", forceMs));
            t.row("removeAll(force=false)", String.format(Locale.ROOT, "%.1f ms", plainMs));
            t.row("heap per stored object (master and client in this JVM)", heapPerObject + " B");
            System.out.println();
            t.print(System.out);
        }
        return 0;
    }

    /** Heap in use after a full collection (approximate: System.gc is a request). */
    private static long usedHeapAfterGc() {
        for (int i = 0; i < 3; i++) {
            System.gc();
        }
        Runtime rt = Runtime.getRuntime();
        return rt.totalMemory() - rt.freeMemory();
    }

    private void check(long removed, KvPoolClient c) {
        if (removed != objects || c.stats().keys() != 0) {
            throw new IllegalStateException("removeAll removed " + removed + " of " + objects + " objects; "
                    + c.stats().keys() + " remain");
        }
    }

    private static String key(int i) {
        return String.format(Locale.ROOT, "bench/reset/llama-8b@v1/tp0/%016x", i * 0x9E3779B97F4A7C15L);
    }

    /** Loads every object with batched puts; returns the seconds it took. */
    private double fill(KvPoolClient c, String name) {
        MemorySegment value = MemorySegment.ofArray(new byte[(int) valueSize.bytes()]);
        long t0 = System.nanoTime();
        try (ProgressBar bar = new ProgressBarBuilder().setTaskName(name).setInitialMax(objects)
                .setStyle(ProgressBarStyle.ASCII).setUpdateIntervalMillis(250).build()) {
            for (int from = 0; from < objects; from += batch) {
                int to = Math.min(objects, from + batch);
                List<String> keys = new ArrayList<>(to - from);
                List<MemorySegment> values = new ArrayList<>(to - from);
                for (int i = from; i < to; i++) {
                    keys.add(key(i));
                    values.add(value);
                }
                List<PutStatus> st = c.putBatch(keys, values);
                for (PutStatus s : st) {
                    if (s != PutStatus.OK) {
                        throw new IllegalStateException("a put during the fill returned " + s);
                    }
                }
                bar.stepTo(to);
            }
        }
        return (System.nanoTime() - t0) / 1e9;
    }
}
