package io.kvpool.node.disk;

import io.kvpool.protocol.ObjectLayout;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.SplittableRandom;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicLong;
import java.util.stream.Stream;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

@Timeout(180) // a guard against hangs only; no assertion depends on timing
class DiskStoreTest {

    private static final long KiB = 1024;
    private static final long MiB = 1024 * KiB;

    @TempDir
    Path dir;

    private final List<DiskStore> open = new ArrayList<>();

    @AfterEach
    void closeAll() {
        open.forEach(DiskStore::close);
    }

    /** Records what the store reports, and checks the capacity bound every time it is called. */
    static class Recorder implements DiskStore.Listener {
        final Set<Long> stored = ConcurrentHashMap.newKeySet();
        final List<Long> storedInOrder = Collections.synchronizedList(new ArrayList<>());
        final Set<Long> dropped = ConcurrentHashMap.newKeySet();
        final Map<Long, DiskStore.Entry> storedEntries = new ConcurrentHashMap<>();
        final AtomicLong overCapacity = new AtomicLong();
        volatile DiskStore store;

        @Override
        public void stored(List<DiskStore.Entry> entries) {
            for (DiskStore.Entry e : entries) {
                stored.add(e.generation());
                storedInOrder.add(e.generation());
                storedEntries.put(e.generation(), e);
            }
            checkCapacity();
        }

        @Override
        public void dropped(List<DiskStore.Entry> entries) {
            entries.forEach(e -> dropped.add(e.generation()));
            checkCapacity();
        }

        private void checkCapacity() {
            DiskStore s = store;
            if (s != null && s.stats().usedBytes() > s.stats().capacityBytes()) {
                overCapacity.incrementAndGet();
            }
        }
    }

    /** A recorder that holds the writer in its first {@code stored} call until {@code gate} opens: nothing more is drained. */
    static class HeldWriter extends Recorder {
        final CountDownLatch entered = new CountDownLatch(1);
        final CountDownLatch gate = new CountDownLatch(1);

        @Override
        public void stored(List<DiskStore.Entry> entries) {
            super.stored(entries);
            entered.countDown();
            try {
                gate.await();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }

    private DiskStore openStore(DiskStore.Config config, Recorder rec) throws IOException {
        DiskStore s = new DiskStore(config, rec);
        rec.store = s;
        open.add(s);
        return s;
    }

    private void close(DiskStore s) {
        s.close();
        open.remove(s);
    }

    private static long seed(String test) {
        long seed = System.nanoTime();
        System.out.println(test + " seed=" + seed);
        return seed;
    }

    static byte[] key(long generation) {
        return ("model-a/layer-all/block-" + generation).getBytes(StandardCharsets.UTF_8);
    }

    static byte[] value(long seed, long generation, int size) {
        byte[] b = new byte[size];
        new SplittableRandom(seed * 1_000_003 + generation).nextBytes(b);
        return b;
    }

    static int crc(byte[] v) {
        return ObjectLayout.valueCrc(MemorySegment.ofArray(v));
    }

    private static boolean offer(DiskStore s, long generation, long epoch, byte[] v) {
        return s.offer(key(generation), generation, epoch, MemorySegment.ofArray(v), crc(v));
    }

    /** Offers; if staging is full, waits for the writer to drain it and offers again (must then succeed). */
    private static void spill(DiskStore s, long generation, long epoch, byte[] v) throws InterruptedException {
        if (!offer(s, generation, epoch, v)) {
            s.flush();
            assertThat(offer(s, generation, epoch, v)).as("offer of gen %d after a flush", generation).isTrue();
        }
    }

    /** Reads a generation into a fresh native or heap segment; returns the status and the bytes. */
    private static Map.Entry<DiskStore.ReadStatus, byte[]> read(DiskStore s, long generation, int length, boolean heap)
            throws IOException {
        if (heap) {
            byte[] b = new byte[length];
            DiskStore.ReadStatus st = s.read(generation, MemorySegment.ofArray(b));
            return Map.entry(st, b);
        }
        try (Arena a = Arena.ofConfined()) {
            MemorySegment dst = a.allocate(Math.max(1, length)).asSlice(0, length);
            DiskStore.ReadStatus st = s.read(generation, dst);
            return Map.entry(st, dst.toArray(ValueLayout.JAVA_BYTE));
        }
    }

    private List<Path> logFiles() throws IOException {
        try (Stream<Path> s = Files.list(dir)) {
            return s.filter(p -> DataFile.idOf(p) >= 0).sorted().toList();
        }
    }

    private static void flipByte(Path file, long offset) throws IOException {
        try (FileChannel ch = FileChannel.open(file, StandardOpenOption.READ, StandardOpenOption.WRITE)) {
            ByteBuffer b = ByteBuffer.allocate(1);
            ch.read(b, offset);
            b.put(0, (byte) (b.get(0) ^ 0x5A));
            b.rewind();
            ch.write(b, offset);
        }
    }

    // --------------------------------------------------------------------------------------------

    @Test
    void configValidatesAndNamesTheBadField() {
        assertThatThrownBy(() -> new DiskStore.Config(null, 8 * MiB, MiB, MiB, 0.9, 0.8))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("dir");
        assertThatThrownBy(() -> new DiskStore.Config(dir, MiB, 64 * KiB, MiB, 0.9, 0.8))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("capacityBytes");
        assertThatThrownBy(() -> new DiskStore.Config(dir, 8 * MiB, 4 * MiB, MiB, 0.9, 0.8))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("fileBytes");
        assertThatThrownBy(() -> new DiskStore.Config(dir, 8 * MiB, 1000, MiB, 0.9, 0.8))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("fileBytes");
        assertThatThrownBy(() -> new DiskStore.Config(dir, 8 * MiB, MiB, 10, 0.9, 0.8))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("stagingBytes");
        assertThatThrownBy(() -> new DiskStore.Config(dir, 8 * MiB, MiB, MiB, 1.5, 0.8))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("highWatermark");
        assertThatThrownBy(() -> new DiskStore.Config(dir, 8 * MiB, MiB, MiB, 0.9, 0.95))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("lowWatermark");
        assertThatThrownBy(() -> new DiskStore.Config(dir, 8 * MiB, MiB, MiB, 0.9, Double.NaN))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("lowWatermark");

        DiskStore.Config big = DiskStore.Config.defaults(dir, 100L << 30);
        assertThat(big.fileBytes()).isEqualTo(256 * MiB);
        assertThat(big.stagingBytes()).isEqualTo(64 * MiB);
        assertThat(big.highWatermark()).isEqualTo(0.90);
        assertThat(big.lowWatermark()).isEqualTo(0.80);
        assertThat(DiskStore.Config.defaults(dir, 64 * MiB).fileBytes()).isEqualTo(8 * MiB);
        assertThat(DiskStore.Config.defaults(dir, 4 * MiB).fileBytes()).isEqualTo(MiB);
    }

    @Test
    void nothingIsCreatedBeforeTheStoreAndTheDirectoryIsCreatedByIt() throws Exception {
        Path sub = dir.resolve("a/b");
        DiskStore.Config.defaults(sub, 8 * MiB);
        assertThat(sub).doesNotExist();
        DiskStore s = openStore(DiskStore.Config.defaults(sub, 8 * MiB).withStagingBytes(MiB), new Recorder());
        assertThat(sub).isDirectory();
        assertThatThrownBy(() -> new DiskStore(DiskStore.Config.defaults(sub, 8 * MiB), new Recorder()))
                .isInstanceOf(IOException.class).hasMessageContaining("in use");
        assertThat(Thread.getAllStackTraces().keySet()).anyMatch(t -> t.getName().equals("kvpool-disk-writer")
                && t.isDaemon());
        close(s);
    }

    /** Test 1: many objects of varied sizes over several files, all read back byte-exact. */
    @Test
    void spillsManyObjectsAcrossFilesAndReadsThemBackExactly() throws Exception {
        long seed = seed("spillsManyObjectsAcrossFilesAndReadsThemBackExactly");
        SplittableRandom rnd = new SplittableRandom(seed);
        Recorder rec = new Recorder();
        DiskStore s = openStore(new DiskStore.Config(dir, 512 * MiB, 4 * MiB, 8 * MiB, 0.9, 0.8), rec);
        Map<Long, Integer> sizes = new HashMap<>();
        long total = 0;
        for (long g = 1; g <= 80; g++) {
            int size = rnd.nextInt((int) KiB, (int) (2 * MiB) + 1);
            sizes.put(g, size);
            total += size;
            spill(s, g, 7, value(seed, g, size));
        }
        s.flush();

        assertThat(rec.stored).containsExactlyInAnyOrderElementsOf(sizes.keySet());
        assertThat(rec.dropped).isEmpty();
        assertThat(logFiles()).hasSizeGreaterThan(1);
        DiskStore.Stats st = s.stats();
        assertThat(st.objects()).isEqualTo(80);
        assertThat(st.queuedItems()).isZero();
        assertThat(st.queueDepthBytes()).isZero();
        // appends are padded to whole blocks: at most a block of padding per record
        assertThat(st.usedBytes()).isBetween(st.liveBytes(), st.liveBytes() + 80L * DiskStore.MIN_IO_BLOCK);
        assertThat(st.bytesWritten()).isEqualTo(st.usedBytes());
        long onDisk = 0;
        for (Path p : logFiles()) {
            onDisk += Files.size(p);
        }
        assertThat(onDisk).isEqualTo(st.usedBytes());

        for (long g = 1; g <= 80; g++) {
            int size = sizes.get(g);
            var r = read(s, g, size, g % 2 == 0);
            assertThat(r.getKey()).as("gen %d", g).isEqualTo(DiskStore.ReadStatus.OK);
            assertThat(r.getValue()).as("gen %d", g).isEqualTo(value(seed, g, size));
            DiskStore.Entry e = s.lookup(g);
            assertThat(e.key()).isEqualTo(key(g));
            assertThat(e.epoch()).isEqualTo(7);
            assertThat(e.valueLength()).isEqualTo(size);
            assertThat(e.valueCrc()).isEqualTo(crc(value(seed, g, size)));
            assertThat(e.hits()).isEqualTo(1);
        }
        st = s.stats();
        assertThat(st.hits()).isEqualTo(80);
        assertThat(st.bytesRead()).isEqualTo(total);
        assertThat(st.checksumFailures()).isZero();

        assertThatThrownBy(() -> s.read(1, MemorySegment.ofArray(new byte[sizes.get(1L) + 1])))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("generation 1");
        assertThat(s.read(12345, MemorySegment.ofArray(new byte[3]))).isEqualTo(DiskStore.ReadStatus.NOT_FOUND);
        assertThat(s.lookup(12345)).isNull();
        assertThat(rec.overCapacity).hasValue(0);
    }

    /** Test 2: close and reopen; everything is still there and readable, with the same metadata. */
    @Test
    void everythingSurvivesARestart() throws Exception {
        long seed = seed("everythingSurvivesARestart");
        SplittableRandom rnd = new SplittableRandom(seed);
        DiskStore.Config cfg = new DiskStore.Config(dir, 256 * MiB, MiB, 4 * MiB, 0.9, 0.8);
        DiskStore s = openStore(cfg, new Recorder());
        Map<Long, Integer> sizes = new HashMap<>();
        for (long g = 100; g < 150; g++) {
            int size = rnd.nextInt(1, (int) (300 * KiB));
            sizes.put(g, size);
            spill(s, g, g % 3, value(seed, g, size));
        }
        s.flush();
        read(s, 100, sizes.get(100L), false);
        DiskStore.Stats before = s.stats();
        List<DiskStore.Entry> entriesBefore = s.entries();
        close(s);

        Recorder rec2 = new Recorder();
        DiskStore s2 = openStore(cfg, rec2);
        DiskStore.Stats after = s2.stats();
        assertThat(after.objects()).isEqualTo(50);
        assertThat(after.liveBytes()).isEqualTo(before.liveBytes());
        assertThat(after.usedBytes()).isEqualTo(before.usedBytes());
        assertThat(after.skippedRecords()).isZero();
        assertThat(after.hits()).isZero();
        assertThat(after.drops()).isZero();
        List<DiskStore.Entry> entries = s2.entries();
        assertThat(entries).hasSize(50);
        Map<Long, DiskStore.Entry> byGen = new HashMap<>();
        entriesBefore.forEach(e -> byGen.put(e.generation(), e));
        for (DiskStore.Entry e : entries) {
            long g = e.generation();
            assertThat(sizes).containsKey(g);
            assertThat(e.key()).isEqualTo(key(g));
            assertThat(e.epoch()).isEqualTo(g % 3);
            assertThat(e.valueLength()).isEqualTo(sizes.get(g).longValue());
            assertThat(e.valueCrc()).isEqualTo(byGen.get(g).valueCrc());
        }
        for (var en : sizes.entrySet()) {
            var r = read(s2, en.getKey(), en.getValue(), true);
            assertThat(r.getKey()).isEqualTo(DiskStore.ReadStatus.OK);
            assertThat(r.getValue()).isEqualTo(value(seed, en.getKey(), en.getValue()));
        }
        // appends continue after a restart, and survive the next one
        for (long g = 200; g < 210; g++) {
            spill(s2, g, 5, value(seed, g, 10_000));
        }
        s2.flush();
        assertThat(rec2.stored).hasSize(10);
        close(s2);
        DiskStore s3 = openStore(cfg, new Recorder());
        assertThat(s3.stats().objects()).isEqualTo(60);
        assertThat(s3.stats().skippedRecords()).isZero();
        for (long g = 200; g < 210; g++) {
            assertThat(read(s3, g, 10_000, false).getValue()).isEqualTo(value(seed, g, 10_000));
        }
    }

    /** Test 3a: a flipped value byte gives CORRUPT, never the bytes; after a restart the record is skipped. */
    @Test
    void aCorruptValueIsReportedDroppedAndSkippedAfterARestart() throws Exception {
        long seed = seed("aCorruptValueIsReportedDroppedAndSkippedAfterARestart");
        DiskStore.Config cfg = new DiskStore.Config(dir, 64 * MiB, MiB, 4 * MiB, 0.9, 0.8);
        Recorder rec = new Recorder();
        DiskStore s = openStore(cfg, rec);
        int size = 50_000;
        for (long g = 1; g <= 30; g++) {
            spill(s, g, 1, value(seed, g, size));
        }
        s.flush();
        DiskStore.Location x = s.locate(10);
        DiskStore.Location y = s.locate(20);
        flipByte(x.file(), x.valueOffset() + 1234);
        flipByte(y.file(), y.valueOffset() + size - 1);

        var r = read(s, 10, size, false);
        assertThat(r.getKey()).isEqualTo(DiskStore.ReadStatus.CORRUPT);
        assertThat(r.getValue()).isNotEqualTo(value(seed, 10, size));
        assertThat(s.lookup(10)).isNull();
        assertThat(s.stats().checksumFailures()).isEqualTo(1);
        assertThat(s.read(10, MemorySegment.ofArray(new byte[size]))).isEqualTo(DiskStore.ReadStatus.NOT_FOUND);
        s.flush();
        assertThat(rec.dropped).containsExactly(10L);
        assertThat(s.stats().objects()).isEqualTo(29);
        close(s);

        DiskStore s2 = openStore(cfg, new Recorder());
        // 10 was marked dead when it was dropped; 20 was never read, so the scan finds its checksum wrong
        assertThat(s2.stats().skippedRecords()).isEqualTo(1);
        assertThat(s2.lookup(10)).isNull();
        assertThat(s2.lookup(20)).isNull();
        assertThat(s2.stats().objects()).isEqualTo(28);
        for (long g = 1; g <= 30; g++) {
            if (g != 10 && g != 20) {
                var ok = read(s2, g, size, true);
                assertThat(ok.getKey()).isEqualTo(DiskStore.ReadStatus.OK);
                assertThat(ok.getValue()).isEqualTo(value(seed, g, size));
            }
        }
    }

    /** Test 3b: a damaged header is garbage; the scan resynchronises on the next record. */
    @Test
    void aDamagedHeaderIsSkippedAndTheRecordsAfterItSurvive() throws Exception {
        long seed = seed("aDamagedHeaderIsSkippedAndTheRecordsAfterItSurvive");
        DiskStore.Config cfg = new DiskStore.Config(dir, 64 * MiB, 4 * MiB, 4 * MiB, 0.9, 0.8);
        DiskStore s = openStore(cfg, new Recorder());
        for (long g = 1; g <= 20; g++) {
            spill(s, g, 1, value(seed, g, 5000 + (int) g));
        }
        s.flush();
        DiskStore.Location z = s.locate(7);
        assertThat(s.locate(8).file()).isEqualTo(z.file());
        close(s);
        flipByte(z.file(), z.recordOffset() + ObjectLayout.GENERATION_OFFSET);

        DiskStore s2 = openStore(cfg, new Recorder());
        assertThat(s2.stats().skippedRecords()).isEqualTo(1);
        assertThat(s2.lookup(7)).isNull();
        for (long g = 1; g <= 20; g++) {
            if (g != 7) {
                var r = read(s2, g, 5000 + (int) g, false);
                assertThat(r.getKey()).as("gen %d", g).isEqualTo(DiskStore.ReadStatus.OK);
                assertThat(r.getValue()).isEqualTo(value(seed, g, 5000 + (int) g));
            }
        }
    }

    /**
     * Appends through the page cache (where O_DIRECT is refused) keep the same on-disk layout: spilled
     * buffered, reopened with direct I/O allowed, appended to, reopened buffered, all read back.
     */
    @Test
    void bufferedAndDirectAppendsShareOneLayout() throws Exception {
        long seed = seed("bufferedAndDirectAppendsShareOneLayout");
        DiskStore.Config cfg = new DiskStore.Config(dir, 16 * MiB, MiB, 4 * MiB, 0.9, 0.8);
        DiskStore s = new DiskStore(cfg, new Recorder(), false);
        open.add(s);
        assertThat(s.directIo()).isFalse();
        assertThat(s.ioBlock() % DiskStore.MIN_IO_BLOCK).isZero();
        for (long g = 1; g <= 30; g++) {
            spill(s, g, 1, value(seed, g, 3000 + (int) g * 100));
        }
        s.flush();
        close(s);
        DiskStore s2 = openStore(cfg, new Recorder());
        for (long g = 31; g <= 40; g++) {
            spill(s2, g, 1, value(seed, g, 3000 + (int) g * 100));
        }
        s2.flush();
        close(s2);
        DiskStore s3 = new DiskStore(cfg, new Recorder(), false);
        open.add(s3);
        assertThat(s3.stats().objects()).isEqualTo(40);
        assertThat(s3.stats().skippedRecords()).isZero();
        for (long g = 1; g <= 40; g++) {
            assertThat(read(s3, g, 3000 + (int) g * 100, g % 2 == 0).getValue()).as("gen %d", g)
                    .isEqualTo(value(seed, g, 3000 + (int) g * 100));
        }
    }

    /** Test 3c: a file ending mid-record is truncated to its last whole record; appends then work. */
    @Test
    void aTornTailIsSkippedAndTruncatedAndAppendsContinue() throws Exception {
        long seed = seed("aTornTailIsSkippedAndTruncatedAndAppendsContinue");
        DiskStore.Config cfg = new DiskStore.Config(dir, 64 * MiB, MiB, 4 * MiB, 0.9, 0.8);
        DiskStore s = openStore(cfg, new Recorder());
        int size = 10_000;
        for (long g = 1; g <= 20; g++) {
            spill(s, g, 1, value(seed, g, size));
        }
        s.flush();
        DiskStore.Location last = s.locate(20);
        close(s);
        assertThat(Files.size(last.file())).isEqualTo(blockUp(last.recordOffset() + last.recordLength()));
        try (FileChannel ch = FileChannel.open(last.file(), StandardOpenOption.WRITE)) {
            ch.truncate(last.recordOffset() + 1000);
        }

        Recorder rec2 = new Recorder();
        DiskStore s2 = openStore(cfg, rec2);
        assertThat(s2.stats().skippedRecords()).isEqualTo(1);
        assertThat(Files.size(last.file())).isEqualTo(last.recordOffset());
        assertThat(s2.lookup(20)).isNull();
        assertThat(s2.stats().objects()).isEqualTo(19);
        for (long g = 21; g <= 25; g++) {
            spill(s2, g, 1, value(seed, g, size));
        }
        s2.flush();
        assertThat(rec2.stored).hasSize(5);
        assertThat(s2.locate(21).file()).isEqualTo(last.file());
        assertThat(s2.locate(21).recordOffset()).isEqualTo(blockUp(last.recordOffset())); // a new run: block-aligned
        close(s2);

        DiskStore s3 = openStore(cfg, new Recorder());
        assertThat(s3.stats().skippedRecords()).isZero();
        assertThat(s3.stats().objects()).isEqualTo(24);
        for (long g = 1; g <= 25; g++) {
            if (g != 20) {
                assertThat(read(s3, g, size, false).getValue()).as("gen %d", g).isEqualTo(value(seed, g, size));
            }
        }
    }

    /** Test 4: past the high watermark the least recently read objects go first; files are compacted away. */
    @Test
    void theWatermarkEvictsTheColdestAndCompactionGivesSpaceBack() throws Exception {
        long seed = seed("theWatermarkEvictsTheColdestAndCompactionGivesSpaceBack");
        SplittableRandom rnd = new SplittableRandom(seed);
        long capacity = 8 * MiB;
        Recorder rec = new Recorder();
        DiskStore s = openStore(new DiskStore.Config(dir, capacity, MiB, 2 * MiB, 0.9, 0.8), rec);
        Map<Long, Integer> sizes = new HashMap<>();
        List<Long> hot = new ArrayList<>();
        long g = 0;
        for (int i = 0; i < 8; i++) {
            g++;
            sizes.put(g, 64 * (int) KiB);
            hot.add(g);
            spill(s, g, 1, value(seed, g, 64 * (int) KiB));
        }
        s.flush();
        for (long h : hot) {
            assertThat(read(s, h, sizes.get(h), false).getKey()).isEqualTo(DiskStore.ReadStatus.OK);
        }
        int maxFileId = 0;
        for (int round = 0; round < 40; round++) {
            for (int i = 0; i < 10; i++) {
                g++;
                int size = rnd.nextInt((int) (8 * KiB), (int) (120 * KiB));
                sizes.put(g, size);
                spill(s, g, 1, value(seed, g, size));
            }
            s.flush();
            DiskStore.Stats st = s.stats();
            assertThat(st.usedBytes()).as("round %d", round).isLessThanOrEqualTo(capacity);
            for (Path p : logFiles()) {
                maxFileId = Math.max(maxFileId, DataFile.idOf(p));
            }
            for (long h : hot) { // keep them warm
                var r = read(s, h, sizes.get(h), round % 2 == 0);
                assertThat(r.getKey()).as("hot gen %d in round %d", h, round).isEqualTo(DiskStore.ReadStatus.OK);
                assertThat(r.getValue()).isEqualTo(value(seed, h, sizes.get(h)));
            }
        }
        DiskStore.Stats st = s.stats();
        System.out.println("watermark: " + st);
        assertThat(rec.overCapacity).hasValue(0);
        assertThat(st.evictions()).isPositive();
        assertThat(st.compactions()).isPositive();
        assertThat(rec.dropped).hasSize((int) st.evictions());
        // every stored object is either live or was reported dropped, never both
        Set<Long> live = new HashSet<>();
        s.entries().forEach(e -> live.add(e.generation()));
        assertThat(rec.stored).hasSize(sizes.size());
        assertThat(Collections.disjoint(live, rec.dropped)).isTrue();
        Set<Long> union = new HashSet<>(live);
        union.addAll(rec.dropped);
        assertThat(union).isEqualTo(rec.stored);
        // the hot ones survived; the cold ones went strictly oldest first
        assertThat(live).containsAll(hot);
        long newestDropped = rec.dropped.stream().mapToLong(Long::longValue).max().orElseThrow();
        long oldestLiveCold = live.stream().filter(x -> !hot.contains(x)).mapToLong(Long::longValue).min().orElseThrow();
        assertThat(newestDropped).isLessThan(oldestLiveCold);
        for (long d : rec.dropped) {
            assertThat(s.lookup(d)).isNull();
        }
        // compaction deleted files: many more were created than are left
        List<Path> files = logFiles();
        assertThat(maxFileId).isGreaterThan(2 * files.size());
        long onDisk = 0;
        for (Path p : files) {
            onDisk += Files.size(p);
        }
        assertThat(onDisk).isEqualTo(st.usedBytes());
        for (long x : live) {
            assertThat(read(s, x, sizes.get(x), true).getValue()).isEqualTo(value(seed, x, sizes.get(x)));
        }
    }

    /** Test 5: staging full refuses at once (and counts), it never blocks. */
    @Test
    void aFullStagingAreaRefusesOffersWithoutBlocking() throws Exception {
        long seed = seed("aFullStagingAreaRefusesOffersWithoutBlocking");
        HeldWriter rec = new HeldWriter();
        long staging = 64 * KiB;
        DiskStore s = openStore(new DiskStore.Config(dir, 64 * MiB, MiB, staging, 0.9, 0.8), rec);
        // larger than staging: refused
        assertThat(offer(s, 1, 1, value(seed, 1, (int) MiB))).isFalse();
        assertThat(s.stats().drops()).isEqualTo(1);

        int size = 16 * (int) KiB;
        long record = ObjectLayout.regionLength(key(2).length, size);
        assertThat(offer(s, 2, 1, value(seed, 2, size))).isTrue();
        rec.entered.await(); // the writer is now inside the listener, staging is empty again
        int fits = (int) (staging / record);
        for (long g = 3; g < 3 + fits; g++) {
            assertThat(offer(s, g, 1, value(seed, g, size))).as("gen %d", g).isTrue();
        }
        assertThat(s.stats().queuedItems()).isEqualTo(fits);
        assertThat(s.stats().queueDepthBytes()).isEqualTo(fits * record);
        assertThat(offer(s, 99, 1, value(seed, 99, size))).isFalse();
        assertThat(s.stats().drops()).isEqualTo(2);

        rec.gate.countDown();
        s.flush();
        assertThat(rec.stored).hasSize(1 + fits).doesNotContain(1L, 99L);
        assertThat(s.stats().queuedItems()).isZero();
        assertThat(s.stats().queueDepthBytes()).isZero();
        assertThat(offer(s, 99, 1, value(seed, 99, size))).isTrue();
        s.flush();
        assertThat(read(s, 99, size, false).getValue()).isEqualTo(value(seed, 99, size));
        close(s);
        assertThat(offer(s, 100, 1, value(seed, 100, size))).isFalse();
        assertThat(s.read(99, MemorySegment.ofArray(new byte[size]))).isEqualTo(DiskStore.ReadStatus.NOT_FOUND);
    }

    /**
     * A spill is readable from the moment it is offered: while the writer has not taken it, a read copies it
     * out of staging (byte-exact, checked) and lookup lists it; a removal cancels it and the read misses; once
     * written it is read from the file. The master lists a spill as a disk copy from its eviction on, so a miss
     * here would be an object lost for the time the disk takes.
     */
    @Test
    void aQueuedSpillIsReadFromStagingUntilItIsWritten() throws Exception {
        long seed = seed("aQueuedSpillIsReadFromStagingUntilItIsWritten");
        HeldWriter rec = new HeldWriter();
        DiskStore s = openStore(new DiskStore.Config(dir, 64 * MiB, MiB, 4 * MiB, 0.9, 0.8), rec);
        int size = 200 * (int) KiB;
        assertThat(offer(s, 1, 1, value(seed, 1, size))).isTrue();
        rec.entered.await();
        for (long g = 2; g <= 4; g++) {
            assertThat(offer(s, g, 1, value(seed, g, size))).isTrue();
        }
        assertThat(rec.stored).containsExactly(1L);
        for (boolean heap : new boolean[]{true, false}) {
            var got = read(s, 3, size, heap);
            assertThat(got.getKey()).isEqualTo(DiskStore.ReadStatus.OK);
            assertThat(got.getValue()).isEqualTo(value(seed, 3, size));
        }
        assertThat(s.lookup(3)).isNotNull().satisfies(e -> {
            assertThat(e.valueLength()).isEqualTo(size);
            assertThat(e.hits()).isZero();
            assertThat(e.key()).isEqualTo(key(3));
        });
        assertThatThrownBy(() -> s.read(3, MemorySegment.ofArray(new byte[size - 1])))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("generation 3");
        assertThat(s.remove(4)).isTrue(); // cancels the queued spill
        assertThat(read(s, 4, size, true).getKey()).isEqualTo(DiskStore.ReadStatus.NOT_FOUND);
        assertThat(s.lookup(4)).isNull();

        rec.gate.countDown();
        s.flush();
        assertThat(rec.stored).containsExactlyInAnyOrder(1L, 2L, 3L);
        assertThat(s.stats().queuedItems()).isZero();
        assertThat(read(s, 3, size, false).getValue()).isEqualTo(value(seed, 3, size));
        assertThat(s.lookup(3).hits()).isEqualTo(1); // only the read from the file counts
    }

    /** Test 6: remove and reset(epoch), durable across a restart. */
    @Test
    void removeAndResetDropObjectsAndEmptiedFilesGo() throws Exception {
        long seed = seed("removeAndResetDropObjectsAndEmptiedFilesGo");
        DiskStore.Config cfg = new DiskStore.Config(dir, 64 * MiB, 256 * KiB, 4 * MiB, 0.9, 0.8);
        Recorder rec = new Recorder();
        DiskStore s = openStore(cfg, rec);
        int size = 32 * (int) KiB;
        long g = 0;
        for (int epoch = 1; epoch <= 3; epoch++) {
            for (int i = 0; i < (epoch == 1 ? 20 : 10); i++) {
                g++;
                spill(s, g, epoch, value(seed, g, size));
            }
        }
        s.flush();
        assertThat(s.stats().objects()).isEqualTo(40);
        Path firstFile = s.locate(1).file();

        assertThat(s.remove(1)).isTrue();
        assertThat(s.lookup(1)).isNull();
        assertThat(s.read(1, MemorySegment.ofArray(new byte[size]))).isEqualTo(DiskStore.ReadStatus.NOT_FOUND);
        assertThat(s.remove(1)).isFalse();
        assertThat(s.remove(999)).isFalse();
        assertThat(s.remove(35)).isTrue(); // an epoch-3 object

        assertThat(s.reset(3)).isEqualTo(29); // 19 of epoch 1, 10 of epoch 2
        Set<Long> live = new HashSet<>();
        s.entries().forEach(e -> live.add(e.generation()));
        assertThat(live).containsExactlyInAnyOrder(31L, 32L, 33L, 34L, 36L, 37L, 38L, 39L, 40L);
        assertThat(s.read(2, MemorySegment.ofArray(new byte[size]))).isEqualTo(DiskStore.ReadStatus.NOT_FOUND);
        assertThat(offer(s, 41, 2, value(seed, 41, size))).as("an older epoch is fenced").isFalse();
        assertThat(offer(s, 42, 3, value(seed, 42, size))).isTrue();
        s.flush();
        assertThat(rec.dropped).as("remove and reset are not reported").isEmpty();
        live.add(42L);
        // files left: only ones holding live records
        Set<Path> holding = new HashSet<>();
        for (long x : live) {
            holding.add(s.locate(x).file());
        }
        assertThat(logFiles()).containsExactlyInAnyOrderElementsOf(holding);
        assertThat(logFiles()).doesNotContain(firstFile);
        DiskStore.Stats st = s.stats();
        assertThat(st.objects()).isEqualTo(10);
        assertThat(st.compactions()).isPositive();
        close(s);

        DiskStore s2 = openStore(cfg, new Recorder());
        Set<Long> after = new HashSet<>();
        s2.entries().forEach(e -> after.add(e.generation()));
        assertThat(after).isEqualTo(live);
        assertThat(s2.stats().skippedRecords()).isZero();
        for (long x : live) {
            assertThat(read(s2, x, size, false).getValue()).isEqualTo(value(seed, x, size));
        }
    }

    @Test
    void aNewerGenerationOfAKeyReplacesTheOlderOne() throws Exception {
        long seed = seed("aNewerGenerationOfAKeyReplacesTheOlderOne");
        DiskStore.Config cfg = new DiskStore.Config(dir, 64 * MiB, MiB, 4 * MiB, 0.9, 0.8);
        Recorder rec = new Recorder();
        DiskStore s = openStore(cfg, rec);
        byte[] k = "same-key".getBytes(StandardCharsets.UTF_8);
        byte[] v1 = value(seed, 1, 1000);
        byte[] v2 = value(seed, 2, 2000);
        assertThat(s.offer(k, 10, 1, MemorySegment.ofArray(v1), crc(v1))).isTrue();
        assertThat(s.offer(k, 10, 1, MemorySegment.ofArray(v1), crc(v1))).as("same generation again").isTrue();
        s.flush();
        assertThat(s.offer(k, 20, 1, MemorySegment.ofArray(v2), crc(v2))).isTrue();
        s.flush();
        assertThat(rec.dropped).containsExactly(10L);
        assertThat(s.lookup(10)).isNull();
        assertThat(s.entries()).extracting(DiskStore.Entry::generation).containsExactly(20L);
        assertThat(s.offer(k, 15, 1, MemorySegment.ofArray(v1), crc(v1))).as("older than what is here").isFalse();
        close(s);
        DiskStore s2 = openStore(cfg, new Recorder());
        assertThat(s2.entries()).extracting(DiskStore.Entry::generation).containsExactly(20L);
        assertThat(read(s2, 20, 2000, false).getValue()).isEqualTo(v2);
    }

    /** The last record of a generation decides: one spilled again after its removal survives a restart. */
    @Test
    void aGenerationSpilledAgainAfterItsRemovalSurvivesARestart() throws Exception {
        long seed = seed("aGenerationSpilledAgainAfterItsRemovalSurvivesARestart");
        DiskStore.Config cfg = new DiskStore.Config(dir, 64 * MiB, MiB, 4 * MiB, 0.9, 0.8);
        DiskStore s = openStore(cfg, new Recorder());
        byte[] v5 = value(seed, 5, 3000);
        byte[] v6 = value(seed, 6, 3000);
        spill(s, 5, 1, v5);
        spill(s, 6, 1, v6);
        s.flush();
        assertThat(s.remove(5)).isTrue();
        assertThat(s.remove(6)).isTrue();
        s.flush(); // both tombstones written
        spill(s, 5, 1, v5); // e.g. promoted to memory, then evicted again
        s.flush();
        close(s);

        DiskStore s2 = openStore(cfg, new Recorder());
        assertThat(s2.entries()).extracting(DiskStore.Entry::generation).containsExactly(5L);
        assertThat(read(s2, 5, 3000, false).getValue()).isEqualTo(v5);
        assertThat(s2.remove(5)).isTrue();
        s2.flush();
        close(s2);
        assertThat(openStore(cfg, new Recorder()).entries()).isEmpty();
    }

    /** A crash between a compaction's copies and the deletion of its source leaves two copies; the later one wins. */
    @Test
    void duplicateCopiesLeftByAnInterruptedCompactionResolveToOne() throws Exception {
        long seed = seed("duplicateCopiesLeftByAnInterruptedCompactionResolveToOne");
        DiskStore.Config cfg = new DiskStore.Config(dir, 64 * MiB, 4 * MiB, 4 * MiB, 0.9, 0.8);
        DiskStore s = openStore(cfg, new Recorder());
        for (long g = 1; g <= 10; g++) {
            spill(s, g, 1, value(seed, g, 20_000));
        }
        s.flush();
        Path first = s.locate(1).file();
        close(s);
        Path second = dir.resolve(DataFile.fileName(DataFile.idOf(first) + 1));
        Files.copy(first, second);

        Recorder rec = new Recorder();
        DiskStore s2 = openStore(cfg, rec);
        assertThat(s2.stats().objects()).isEqualTo(10);
        assertThat(s2.stats().skippedRecords()).isZero();
        for (long g = 1; g <= 10; g++) {
            assertThat(s2.locate(g).file()).isEqualTo(second);
            assertThat(read(s2, g, 20_000, g % 2 == 0).getValue()).isEqualTo(value(seed, g, 20_000));
        }
        s2.flush(); // the earlier copies are marked dead and their file, with nothing live left, deleted
        assertThat(logFiles()).containsExactly(second);
        assertThat(s2.stats().usedBytes())
                .isBetween(s2.stats().liveBytes(), s2.stats().liveBytes() + 10L * DiskStore.MIN_IO_BLOCK);
        assertThat(s2.remove(3)).isTrue();
        s2.flush();
        close(s2);

        DiskStore s3 = openStore(cfg, new Recorder());
        assertThat(s3.entries()).extracting(DiskStore.Entry::generation)
                .containsExactlyInAnyOrder(1L, 2L, 4L, 5L, 6L, 7L, 8L, 9L, 10L);
        assertThat(s3.stats().skippedRecords()).isZero();
    }

    /** An interrupt closes a FileChannel for every thread; the store reopens it, so only that read fails. */
    @Test
    void anInterruptedReaderDoesNotBreakTheStoreForOthers() throws Exception {
        long seed = seed("anInterruptedReaderDoesNotBreakTheStoreForOthers");
        DiskStore s = openStore(new DiskStore.Config(dir, 64 * MiB, MiB, 4 * MiB, 0.9, 0.8), new Recorder());
        byte[] v = value(seed, 1, 100_000);
        spill(s, 1, 1, v);
        s.flush();
        Thread.currentThread().interrupt();
        try {
            assertThatThrownBy(() -> s.read(1, MemorySegment.ofArray(new byte[100_000])))
                    .isInstanceOf(java.nio.channels.ClosedByInterruptException.class);
        } finally {
            Thread.interrupted();
        }
        assertThat(read(s, 1, 100_000, false).getValue()).isEqualTo(v);
        spill(s, 2, 1, value(seed, 2, 5000)); // the writer appends through the same file
        s.flush();
        assertThat(read(s, 2, 5000, true).getValue()).isEqualTo(value(seed, 2, 5000));
        assertThat(s.stats().checksumFailures()).isZero();
    }

    /** Test 7: readers on random generations while the writer appends, evicts and compacts. */
    @Test
    void concurrentReadsDuringAppendsAndCompactionAreExact() throws Exception {
        long seed = seed("concurrentReadsDuringAppendsAndCompactionAreExact");
        DiskStore.Config cfg = new DiskStore.Config(dir, 24 * MiB, 512 * KiB, 4 * MiB, 0.9, 0.8);
        Recorder rec = new Recorder();
        DiskStore s = openStore(cfg, rec);
        int objects = 1500;
        int readers = 4;
        int minReadsPerReader = 2000;
        java.util.concurrent.atomic.AtomicBoolean writing = new java.util.concurrent.atomic.AtomicBoolean(true);
        AtomicLong okReads = new AtomicLong();
        AtomicLong notFound = new AtomicLong();
        Map<DiskStore.ReadStatus, Long> bad = new ConcurrentHashMap<>();
        List<String> mismatches = Collections.synchronizedList(new ArrayList<>());
        ExecutorService pool = Executors.newFixedThreadPool(readers + 1);
        try {
            Future<?> writerTask = pool.submit(() -> {
                SplittableRandom rnd = new SplittableRandom(seed);
                try {
                    for (long g = 1; g <= objects; g++) {
                        spill(s, g, 1, value(seed, g, sizeOf(seed, g)));
                        if (g % 3 == 0) {
                            s.remove(1 + rnd.nextLong(g)); // garbage for compaction
                        }
                        if (g % 100 == 0) {
                            s.flush();
                        }
                    }
                    s.flush();
                } finally {
                    writing.set(false);
                }
                return null;
            });
            List<Future<?>> readerTasks = new ArrayList<>();
            for (int r = 0; r < readers; r++) {
                long readerSeed = seed + 17 * (r + 1);
                readerTasks.add(pool.submit(() -> {
                    SplittableRandom rnd = new SplittableRandom(readerSeed);
                    try (Arena a = Arena.ofConfined()) {
                        MemorySegment buf = a.allocate(128 * KiB);
                        // until the writer is done (and at least a minimum): no timing, only an end condition
                        for (int i = 0; writing.get() || i < minReadsPerReader; i++) {
                            int known = rec.storedInOrder.size();
                            if (known == 0) {
                                Thread.onSpinWait();
                                continue;
                            }
                            long g = rec.storedInOrder.get(rnd.nextInt(known));
                            int size = sizeOf(seed, g);
                            MemorySegment dst = buf.asSlice(0, size);
                            DiskStore.ReadStatus st = s.read(g, dst);
                            switch (st) {
                                case OK -> {
                                    okReads.incrementAndGet();
                                    if (!java.util.Arrays.equals(dst.toArray(ValueLayout.JAVA_BYTE), value(seed, g, size))) {
                                        mismatches.add("gen " + g);
                                    }
                                }
                                case NOT_FOUND -> notFound.incrementAndGet();
                                case CORRUPT -> bad.merge(st, 1L, Long::sum);
                            }
                        }
                    }
                    return null;
                }));
            }
            writerTask.get();
            for (Future<?> f : readerTasks) {
                f.get();
            }
        } finally {
            pool.shutdownNow();
        }
        DiskStore.Stats st = s.stats();
        System.out.println("concurrent: ok=" + okReads + " notFound=" + notFound + " " + st);
        assertThat(mismatches).isEmpty();
        assertThat(bad).isEmpty();
        assertThat(st.checksumFailures()).isZero();
        assertThat(st.compactions()).isPositive();
        assertThat(st.usedBytes()).isLessThanOrEqualTo(cfg.capacityBytes());
        assertThat(rec.overCapacity).hasValue(0);
        assertThat(st.hits()).isEqualTo(okReads.get());
        assertThat(okReads.get()).isPositive();
        // everything still live reads back exactly, now and after a restart
        List<DiskStore.Entry> live = s.entries();
        assertThat(live).isNotEmpty();
        for (DiskStore.Entry e : live) {
            int size = (int) e.valueLength();
            assertThat(read(s, e.generation(), size, false).getValue()).isEqualTo(value(seed, e.generation(), size));
        }
        close(s);
        DiskStore s2 = openStore(cfg, new Recorder());
        assertThat(s2.stats().skippedRecords()).isZero();
        assertThat(s2.entries()).extracting(DiskStore.Entry::generation)
                .containsExactlyInAnyOrderElementsOf(live.stream().map(DiskStore.Entry::generation).toList());
    }

    private static int sizeOf(long seed, long generation) {
        return 1 + new SplittableRandom(seed ^ (generation * 0x9E3779B97F4A7C15L)).nextInt((int) (96 * KiB));
    }

    private static long blockUp(long x) {
        return (x + DiskStore.MIN_IO_BLOCK - 1) / DiskStore.MIN_IO_BLOCK * DiskStore.MIN_IO_BLOCK;
    }
}
