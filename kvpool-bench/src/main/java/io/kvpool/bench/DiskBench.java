package io.kvpool.bench;

import io.kvpool.node.disk.DiskStore;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Locale;
import java.util.SplittableRandom;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;

/**
 * The SSD tier's data path against fio on the same directory, in the same run: spilling 1 MiB values
 * (the node's {@link DiskStore}: staged, appended to its log files, forced) and reading them back
 * (checksum verified), against fio's sequential write and read with O_DIRECT at queue depth 16.
 * The page cache is dropped before the read-back when this process may (as root), so reads come
 * from the device, as fio's do; the row says when it could not. fio and kvpool alternate over a few
 * rounds and each side's median is reported (see {@link #run}).
 */
final class DiskBench {

    /** One round: fio, then kvpool, back to back. */
    record Round(double fioWrite, double fioRead, double spill, double readBack, boolean cacheDropped) {
    }

    /** The medians over the rounds of each figure, and the rounds themselves. */
    record Result(double fioWrite, double fioRead, double spill, double readBack, boolean cacheDropped, long bytes,
                  List<Round> rounds) {
    }

    /**
     * Runs {@code rounds} rounds of fio then kvpool. The device's speed moves a lot from one run to the
     * next on a shared VM (fio's own write figure spread from 1.7 to 3.3 GB/s within minutes here), so
     * the two sides alternate and each figure is the median of its rounds.
     */
    static Result run(Path dir, long totalBytes, int rounds) throws Exception {
        Files.createDirectories(dir);
        List<Round> all = new ArrayList<>();
        for (int i = 0; i < rounds; i++) {
            all.add(round(dir, totalBytes));
        }
        return new Result(median(all, Round::fioWrite), median(all, Round::fioRead), median(all, Round::spill),
                median(all, Round::readBack), all.stream().allMatch(Round::cacheDropped), totalBytes, all);
    }

    private static double median(List<Round> rounds, java.util.function.ToDoubleFunction<Round> f) {
        double[] v = rounds.stream().mapToDouble(f).sorted().toArray();
        return v.length % 2 == 1 ? v[v.length / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
    }

    private static Round round(Path dir, long totalBytes) throws Exception {
        long[] fio = fio(dir, totalBytes);
        Path store = dir.resolve("kvpool-bench-disk");
        deleteTree(store);
        int value = 1 << 20;
        int n = (int) (totalBytes / value);
        List<Long> generations = new ArrayList<>(n);
        double spill;
        double readBack;
        boolean dropped;
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment v = arena.allocate(value, 64);
            SplittableRandom rnd = new SplittableRandom(7);
            for (long i = 0; i + 8 <= value; i += 8) {
                v.set(java.lang.foreign.ValueLayout.JAVA_LONG_UNALIGNED, i, rnd.nextLong());
            }
            int crc = io.kvpool.protocol.ObjectLayout.valueCrc(v);
            DiskStore.Config cfg = DiskStore.Config.defaults(store, totalBytes * 2 + (256L << 20));
            try (DiskStore ds = new DiskStore(cfg, new DiskStore.Listener() {
                @Override
                public void stored(List<DiskStore.Entry> entries) {
                }

                @Override
                public void dropped(List<DiskStore.Entry> entries) {
                }
            })) {
                long t0 = System.nanoTime();
                for (int i = 0; i < n; i++) {
                    long g = 1_000_000L + i;
                    byte[] key = ("bench/disk/" + i).getBytes(StandardCharsets.US_ASCII);
                    // staging is bounded: a full queue refuses the spill; the benchmark waits for room instead
                    while (!ds.offer(key, g, 0, v, crc)) {
                        Thread.onSpinWait();
                        Thread.yield();
                    }
                    generations.add(g);
                }
                ds.flush();
                spill = totalBytes / ((System.nanoTime() - t0) / 1e9);
                long drops = ds.stats().drops();
                dropped = dropCaches();
                MemorySegment dst = arena.allocate(value, 64);
                long t1 = System.nanoTime();
                long read = 0;
                for (long g : generations) {
                    if (ds.read(g, dst) == DiskStore.ReadStatus.OK) {
                        read += value;
                    }
                }
                readBack = read / ((System.nanoTime() - t1) / 1e9);
                if (read != totalBytes) {
                    throw new IllegalStateException("read back " + read + " of " + totalBytes + " bytes (" + drops
                            + " spills dropped)");
                }
            }
        } finally {
            deleteTree(store);
        }
        return new Round(fio[0], fio[1], spill, readBack, dropped);
    }

    /** fio's sequential write and read, bytes per second, via scripts/fio.sh (which installs fio if needed). */
    private static long[] fio(Path dir, long bytes) throws Exception {
        Path script = io.kvpool.bench.baseline.RedisServer.locateScript("fio.sh");
        Process p = new ProcessBuilder("bash", script.toString(), dir.toString(), (bytes >> 20) + "M")
                .redirectErrorStream(true).start();
        long[] out = new long[2];
        StringBuilder all = new StringBuilder();
        try (BufferedReader r = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8))) {
            String line;
            while ((line = r.readLine()) != null) {
                all.append(line).append('\n');
                String[] f = line.trim().split(" ");
                if (f.length == 2 && f[0].equals("write")) {
                    out[0] = Long.parseLong(f[1]);
                } else if (f.length == 2 && f[0].equals("read")) {
                    out[1] = Long.parseLong(f[1]);
                }
            }
        }
        if (!p.waitFor(10, TimeUnit.MINUTES) || p.exitValue() != 0 || out[0] == 0 || out[1] == 0) {
            throw new IllegalStateException("fio baseline failed:\n" + all);
        }
        return out;
    }

    /** Drops the page cache (root only); false when not permitted. */
    private static boolean dropCaches() {
        try {
            Process p = new ProcessBuilder("sh", "-c", "sync && echo 1 > /proc/sys/vm/drop_caches")
                    .redirectErrorStream(true).redirectOutput(ProcessBuilder.Redirect.DISCARD).start();
            return p.waitFor(60, TimeUnit.SECONDS) && p.exitValue() == 0;
        } catch (Exception e) {
            return false;
        }
    }

    /** Deletes {@code p} and everything under it, if it exists. */
    static void deleteTree(Path p) throws Exception {
        if (!Files.exists(p)) {
            return;
        }
        try (Stream<Path> s = Files.walk(p)) {
            for (Path f : s.sorted(Comparator.reverseOrder()).toList()) {
                Files.deleteIfExists(f);
            }
        }
    }

    static String describe(Result r) {
        StringBuilder b = new StringBuilder(String.format(Locale.ROOT,
                "%d MiB; median of %d rounds (fio write/read, spill/read-back GB/s:", r.bytes() >> 20, r.rounds().size()));
        for (Round x : r.rounds()) {
            b.append(String.format(Locale.ROOT, " %.2f/%.2f %.2f/%.2f;", x.fioWrite() / 1e9, x.fioRead() / 1e9,
                    x.spill() / 1e9, x.readBack() / 1e9));
        }
        b.setLength(b.length() - 1);
        return b.append(String.format(Locale.ROOT, "); page cache %s before read-back",
                r.cacheDropped() ? "dropped" : "NOT dropped (not root)")).toString();
    }
}
