package io.kvpool.bench;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.Located;
import io.kvpool.client.PutInParts;
import io.kvpool.client.PutOptions;
import io.kvpool.client.PutStatus;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.function.LongSupplier;

/**
 * What the object layout of a layer-by-layer load and save costs (issue 26, item 1): a step's blocks
 * moved whole, as a range per layer of each block object (ranged reads, puts in parts), or as one
 * object per (block, layer) with the batch calls, over the same-machine path and over TCP, at the
 * Llama-3-8B geometry (2 MiB blocks: 32 layers of 64 KiB) and the reference engine's (32 KiB blocks:
 * 4 layers of 8 KiB). The pool runs in its own JVM ({@link PoolProcess}); the three layouts are
 * measured interleaved, rep after rep, and compared by their medians, so a noisy machine moves them
 * together.
 *
 * <pre>
 *   java -cp kvpool-cli/target/kvpool.jar io.kvpool.bench.LayerwiseBench [REPS [BLOCKS]]
 * </pre>
 *
 * Loads: whole = one getIntoBatch of every block; ranged = one locate, then per layer one
 * getRangesInto of that layer of every block; per-layer objects = per layer one getIntoBatch of that
 * layer's objects. Saves: whole = one putBatch; parts = one beginPut, per layer one write of that
 * layer of every block, one finish; per-layer objects = per layer one putBatch. Every save stores new
 * keys and removes them afterwards (not timed).
 */
public final class LayerwiseBench {

    private LayerwiseBench() {
    }

    record Geometry(String name, int layers, int layerBytes) {
        long blockBytes() {
            return (long) layers * layerBytes;
        }
    }

    /** Reps run first and not counted: the JIT compiles each layout's path (a cold path cost 4x in a first try). */
    static final int WARMUP = 10;

    static final List<Geometry> GEOMETRIES = List.of(new Geometry("llama-3-8b", 32, 64 << 10),
            new Geometry("reference", 4, 8 << 10));

    public static void main(String[] args) throws Exception {
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        int reps = args.length > 0 ? Integer.parseInt(args[0]) : 21;
        int blocks = args.length > 1 ? Integer.parseInt(args[1]) : 64;
        try (PoolProcess pool = PoolProcess.start("2GiB", "1g")) {
            String master = "127.0.0.1:" + pool.masterPort;
            System.out.printf(Locale.ROOT, "%-11s %-4s %-5s %10s %10s %10s %8s %8s%n", "geometry", "path", "op",
                    "whole ms", "ranged ms", "per-layer", "ranged/", "layer/");
            for (boolean shm : new boolean[]{true, false}) {
                try (KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster(master).withSharedMemory(shm))) {
                    for (Geometry g : GEOMETRIES) {
                        run(c, g, blocks, reps, shm ? "shm" : "tcp");
                    }
                }
            }
        }
    }

    private static void run(KvPoolClient c, Geometry g, int blocks, int reps, String path) {
        try (Arena arena = Arena.ofShared()) {
            MemorySegment src = arena.allocate(blocks * g.blockBytes(), 64);
            for (long i = 0; i < src.byteSize(); i += 8) {
                src.set(java.lang.foreign.ValueLayout.JAVA_LONG, i, i * 0x9E3779B97F4A7C15L);
            }
            MemorySegment dst = arena.allocate(blocks * g.blockBytes(), 64);
            String base = "lw/" + path + "/" + g.name() + "/";
            List<String> whole = keys(base + "whole/", blocks, -1);
            List<List<String>> byLayer = new ArrayList<>();
            for (int l = 0; l < g.layers(); l++) {
                byLayer.add(keys(base + "layer/", blocks, l));
            }
            check(c.putBatch(whole, blockSlices(src, g, blocks)), "whole blocks");
            for (int l = 0; l < g.layers(); l++) {
                check(c.putBatch(byLayer.get(l), layerSlices(src, g, blocks, l)), "layer objects");
            }
            long[][] load = new long[3][reps];
            long[][] save = new long[3][reps];
            for (int r = -WARMUP; r < reps; r++) {
                long[] t = new long[6];
                t[0] = time(() -> loadWhole(c, whole, dst, g, blocks));
                t[1] = time(() -> loadRanged(c, whole, dst, g, blocks));
                t[2] = time(() -> loadLayers(c, byLayer, dst, g, blocks));
                List<String> w = keys(base + "s/w" + (r + WARMUP) + "/", blocks, -1);
                List<String> p = keys(base + "s/p" + (r + WARMUP) + "/", blocks, -1);
                String lp = base + "s/l" + (r + WARMUP) + "/";
                t[3] = time(() -> saveWhole(c, w, src, g, blocks));
                t[4] = time(() -> saveParts(c, p, src, g, blocks));
                t[5] = time(() -> saveLayers(c, lp, src, g, blocks));
                c.removeByPrefix(base + "s/");
                if (r >= 0) {
                    for (int k = 0; k < 3; k++) {
                        load[k][r] = t[k];
                        save[k][r] = t[3 + k];
                    }
                }
            }
            print(g, path, "load", load);
            print(g, path, "save", save);
            c.removeByPrefix(base);
        }
    }

    private static void print(Geometry g, String path, String op, long[][] t) {
        double[] m = new double[3];
        for (int k = 0; k < 3; k++) {
            long[] s = t[k].clone();
            Arrays.sort(s);
            m[k] = s[s.length / 2] / 1e6;
        }
        System.out.printf(Locale.ROOT, "%-11s %-4s %-5s %10.2f %10.2f %10.2f %7.2fx %7.2fx%n", g.name(), path, op, m[0],
                m[1], m[2], m[1] / m[0], m[2] / m[0]);
    }

    private static long time(LongSupplier run) {
        long t0 = System.nanoTime();
        run.getAsLong();
        return System.nanoTime() - t0;
    }

    private static List<String> keys(String prefix, int blocks, int layer) {
        List<String> out = new ArrayList<>(blocks);
        for (int i = 0; i < blocks; i++) {
            out.add(prefix + i + (layer < 0 ? "" : "/" + layer));
        }
        return out;
    }

    private static List<MemorySegment> blockSlices(MemorySegment all, Geometry g, int blocks) {
        List<MemorySegment> out = new ArrayList<>(blocks);
        for (int i = 0; i < blocks; i++) {
            out.add(all.asSlice(i * g.blockBytes(), g.blockBytes()));
        }
        return out;
    }

    private static List<MemorySegment> layerSlices(MemorySegment all, Geometry g, int blocks, int layer) {
        List<MemorySegment> out = new ArrayList<>(blocks);
        for (int i = 0; i < blocks; i++) {
            out.add(all.asSlice(i * g.blockBytes() + (long) layer * g.layerBytes(), g.layerBytes()));
        }
        return out;
    }

    private static long loadWhole(KvPoolClient c, List<String> keys, MemorySegment dst, Geometry g, int blocks) {
        return hits(c.getIntoBatch(keys, blockSlices(dst, g, blocks)), keys.size(), "whole load");
    }

    private static long loadRanged(KvPoolClient c, List<String> keys, MemorySegment dst, Geometry g, int blocks) {
        Located at = c.locate(keys);
        long n = 0;
        for (int l = 0; l < g.layers(); l++) {
            long[] offsets = new long[blocks];
            Arrays.fill(offsets, (long) l * g.layerBytes());
            n += hits(c.getRangesInto(at, offsets, layerSlices(dst, g, blocks, l)), blocks, "ranged load");
        }
        return n;
    }

    private static long loadLayers(KvPoolClient c, List<List<String>> byLayer, MemorySegment dst, Geometry g,
                                   int blocks) {
        long n = 0;
        for (int l = 0; l < g.layers(); l++) {
            n += hits(c.getIntoBatch(byLayer.get(l), layerSlices(dst, g, blocks, l)), blocks, "per-layer load");
        }
        return n;
    }

    private static long saveWhole(KvPoolClient c, List<String> keys, MemorySegment src, Geometry g, int blocks) {
        check(c.putBatch(keys, blockSlices(src, g, blocks)), "whole save");
        return blocks;
    }

    private static long saveParts(KvPoolClient c, List<String> keys, MemorySegment src, Geometry g, int blocks) {
        long[] lengths = new long[blocks];
        Arrays.fill(lengths, g.blockBytes());
        int[] items = new int[blocks];
        Arrays.setAll(items, i -> i);
        try (PutInParts parts = c.beginPut(keys, lengths, PutOptions.DEFAULT)) {
            for (int l = 0; l < g.layers(); l++) {
                long[] offsets = new long[blocks];
                Arrays.fill(offsets, (long) l * g.layerBytes());
                parts.write(items, offsets, layerSlices(src, g, blocks, l));
            }
            check(parts.finish(), "parts save");
        }
        return blocks;
    }

    private static long saveLayers(KvPoolClient c, String prefix, MemorySegment src, Geometry g, int blocks) {
        for (int l = 0; l < g.layers(); l++) {
            check(c.putBatch(keys(prefix, blocks, l), layerSlices(src, g, blocks, l)), "per-layer save");
        }
        return blocks;
    }

    private static long hits(long[] got, int expected, String what) {
        long n = 0;
        for (long x : got) {
            if (x < 0) {
                throw new IllegalStateException(what + ": a miss");
            }
            n += x;
        }
        if (got.length != expected) {
            throw new IllegalStateException(what + ": " + got.length + " results");
        }
        return n;
    }

    private static void check(List<PutStatus> st, String what) {
        for (PutStatus s : st) {
            if (s != PutStatus.OK) {
                throw new IllegalStateException(what + ": " + s);
            }
        }
    }
}
