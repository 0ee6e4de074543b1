package io.kvpool.node.disk;

import com.code_intelligence.jazzer.junit.FuzzTest;
import io.kvpool.protocol.ObjectLayout;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.stream.Stream;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * Fuzz target for the SSD tier's log scanner and record reader (Jazzer): whatever a log file holds
 * (torn writes, garbage, forged headers), the scan reports only records that lie wholly inside the
 * file, on 64-byte boundaries, in order and without overlap, never reads past the file, and ends
 * its valid prefix inside it. Regression mode runs the seeds in
 * {@code src/test/resources/io/kvpool/node/disk/LogScannerFuzzTestInputs/} (a real log of a few
 * records, written by {@link #writeSeeds()}); {@code scripts/fuzz.sh} runs a campaign.
 */
class LogScannerFuzzTest {

    private static final MemorySegment BUF = Arena.global().allocate(1 << 20, 4096);

    @FuzzTest(maxDuration = "10m")
    void aScanReportsOnlyWholeRecordsInsideTheFile(byte[] data) throws IOException {
        Path dir = Files.createTempDirectory("kvpool-fuzz-log");
        Path file = dir.resolve("kvpool-disk-000000.log");
        Files.write(file, data);
        DataFile f = DataFile.open(file, 0);
        try {
            long size = f.channelSize();
            long[] end = {0};
            LogScanner.Visitor check = new LogScanner.Visitor() {
                @Override
                public void live(long offset, ObjectLayout.Header h) {
                    inside(offset, h);
                }

                @Override
                public void dead(long offset, ObjectLayout.Header h) {
                    inside(offset, h);
                }

                private void inside(long offset, ObjectLayout.Header h) {
                    if (offset % ObjectLayout.ALIGNMENT != 0 || offset < end[0] || h.valueLength() < 0
                            || offset + h.regionLength() > size) {
                        throw new AssertionError("record at " + offset + " (" + h.regionLength() + " bytes) after "
                                + end[0] + " in a file of " + size);
                    }
                    end[0] = offset + h.regionLength();
                }
            };
            LogScanner.Result r = new LogScanner(BUF).scan(f, size, check);
            if (r.validEnd() < 0 || r.validEnd() > size || r.skipped() < 0) {
                throw new AssertionError("scan result " + r + " for a file of " + size);
            }
        } finally {
            f.close();
            try (Stream<Path> s = Files.walk(dir)) {
                s.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
            }
        }
    }

    /** Writes the seed: a log of a few live records and a tombstone, as a store leaves it. Run by hand. */
    @Test
    void writeSeeds() throws Exception {
        String out = System.getProperty("kvpool.fuzz.writeSeeds");
        if (out == null) {
            return;
        }
        Path dir = Files.createTempDirectory("kvpool-seed");
        DiskStore s = new DiskStore(DiskStore.Config.defaults(dir, 8L << 20).withStagingBytes(1 << 20),
                new DiskStoreTest.Recorder());
        try (Arena a = Arena.ofConfined()) {
            for (int i = 0; i < 4; i++) {
                MemorySegment v = a.allocate(100 + 300 * i);
                v.fill((byte) i);
                s.offer(("seed-" + i).getBytes(), 10 + i, 1, v, ObjectLayout.valueCrc(v));
            }
            s.flush();
            s.remove(11);
            s.flush();
        } finally {
            s.close();
        }
        try (Stream<Path> files = Files.list(dir)) {
            Path log = files.filter(p -> p.getFileName().toString().endsWith(".log")).findFirst().orElseThrow();
            Files.createDirectories(Path.of(out));
            Files.copy(log, Path.of(out, "seed-four-records-one-removed"));
        }
        assertThat(Path.of(out, "seed-four-records-one-removed")).exists();
    }
}
