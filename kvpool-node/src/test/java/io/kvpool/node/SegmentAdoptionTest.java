package io.kvpool.node;

import io.kvpool.protocol.ObjectLayout;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.TreeMap;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * A restarted node takes over its previous run's segment file and keeps exactly the objects that
 * verify: written the way the node writes them, then damaged in the ways a crash or a bug can leave
 * them, then scanned into a fresh ledger.
 */
class SegmentAdoptionTest {

    private static final long SIZE = 8L << 20;

    @TempDir
    Path dir;

    /** Writes one object as the node does (admission, header, value, completion); returns its offset. */
    private static long write(RegionLedger ledger, MemorySegment seg, long offset, String key, byte[] value, long gen)
            throws InterruptedException {
        byte[] k = key.getBytes(StandardCharsets.UTF_8);
        long len = ObjectLayout.regionLength(k.length, value.length);
        RegionLedger.WriteAdmission adm = ledger.beginWrite(offset, len, gen, 3, k, value.length, Duration.ZERO);
        assertThat(adm.region()).isNotNull();
        int crc = ObjectLayout.valueCrc(MemorySegment.ofArray(value));
        ObjectLayout.writeHeader(seg, offset, ObjectLayout.STATE_WRITING, k, value.length, gen, 3, crc);
        MemorySegment.copy(MemorySegment.ofArray(value), 0, seg, adm.region().valueOffset(), value.length);
        assertThat(ledger.endWrite(adm.region(), true)).isTrue();
        return offset;
    }

    private static byte[] value(Random rnd, int n) {
        byte[] v = new byte[n];
        rnd.nextBytes(v);
        return v;
    }

    @Test
    void onlyObjectsThatVerifyAreKeptWithTheirBytesAndGenerations() throws Exception {
        Random rnd = new Random(7);
        Map<Long, byte[]> intact = new HashMap<>();
        try (SegmentMemory m = SegmentMemory.allocate(SIZE, dir, "127.0.0.1:1", false)) {
            MemorySegment seg = m.segment();
            RegionLedger before = new RegionLedger(seg);
            long at = 0;
            List<Long> offsets = new ArrayList<>();
            for (int i = 0; i < 40; i++) {
                byte[] v = value(rnd, 1 + rnd.nextInt(20_000));
                long off = write(before, seg, at, "key-" + i, v, 100 + i);
                offsets.add(off);
                intact.put(off, v);
                at += ObjectLayout.regionLength(("key-" + i).length(), v.length) + 64L * rnd.nextInt(4); // gaps
            }
            // a value byte flipped: its checksum fails
            long flipped = offsets.get(3);
            long vo = flipped + ObjectLayout.valueOffset("key-3".length());
            seg.set(ValueLayout.JAVA_BYTE, vo, (byte) ~seg.get(ValueLayout.JAVA_BYTE, vo));
            intact.remove(flipped);
            // a torn header (a byte of the key changed: the header checksum fails)
            long torn = offsets.get(10);
            seg.set(ValueLayout.JAVA_BYTE, torn + ObjectLayout.KEY_OFFSET, (byte) (seg.get(ValueLayout.JAVA_BYTE, torn + ObjectLayout.KEY_OFFSET) ^ 1));
            intact.remove(torn);
            // a write that never completed, and an object that was freed
            long writing = offsets.get(20);
            ObjectLayout.setState(seg, writing, ObjectLayout.STATE_WRITING);
            intact.remove(writing);
            long freed = offsets.get(30);
            assertThat(before.free(freed, 130)).isTrue();
            intact.remove(freed);

            RegionLedger after = new RegionLedger(seg);
            SegmentAdoption.Result r = SegmentAdoption.scan(m.channel(), seg, after);
            assertThat(r.kept()).isEqualTo(intact.size());
            assertThat(r.skipped()).as("WRITING and DEAD headers").isEqualTo(2);
            assertThat(r.corrupt()).as("a value and a header that do not verify").isEqualTo(2);
            assertThat(r.epoch()).isEqualTo(3);
            Map<Long, RegionLedger.Region> found = new TreeMap<>();
            for (RegionLedger.Region reg : after.completeRegions()) {
                found.put(reg.offset, reg);
            }
            assertThat(found.keySet()).containsExactlyInAnyOrderElementsOf(intact.keySet());
            for (Map.Entry<Long, byte[]> e : intact.entrySet()) {
                RegionLedger.Region reg = found.get(e.getKey());
                int i = offsets.indexOf(e.getKey());
                assertThat(reg.generation).isEqualTo(100 + i);
                assertThat(new String(reg.key, StandardCharsets.UTF_8)).isEqualTo("key-" + i);
                assertThat(seg.asSlice(reg.valueOffset(), reg.valueLength).toArray(ValueLayout.JAVA_BYTE))
                        .isEqualTo(e.getValue());
                // readable through the ledger's own rule
                assertThat(after.beginRead(reg.offset, reg.generation)).isNotNull();
            }
        }
    }

    @Test
    void anObjectWrittenInsideAFreedRegionIsFound() throws Exception {
        Random rnd = new Random(11);
        try (SegmentMemory m = SegmentMemory.allocate(SIZE, dir, "127.0.0.1:2", false)) {
            MemorySegment seg = m.segment();
            RegionLedger ledger = new RegionLedger(seg);
            byte[] big = value(rnd, 200_000);
            write(ledger, seg, 0, "big", big, 1);
            assertThat(ledger.free(0, 1)).isTrue(); // header marked dead, value bytes stay
            byte[] small = value(rnd, 1000);
            long inside = 64L * 1000; // inside the old value
            write(ledger, seg, inside, "small", small, 2);
            RegionLedger after = new RegionLedger(seg);
            SegmentAdoption.Result r = SegmentAdoption.scan(m.channel(), seg, after);
            assertThat(r.kept()).isEqualTo(1);
            assertThat(after.completeRegions()).singleElement().satisfies(reg -> {
                assertThat(reg.offset).isEqualTo(inside);
                assertThat(reg.generation).isEqualTo(2);
            });
        }
    }

    @Test
    void aRestartedNodeAdoptsItsPreviousRunsFileAndReclaimsOlderOnes() throws Exception {
        String name = "127.0.0.1:3";
        long deadPid = deadPid();
        Path previous = dir.resolve("kvpool-127.0.0.1_3-" + deadPid + ".seg");
        Path other = dir.resolve("kvpool-10.0.0.9_3-" + deadPid + ".seg");
        byte[] v = value(new Random(3), 5000);
        try (SegmentMemory m = SegmentMemory.allocate(SIZE, dir, name, false)) {
            write(new RegionLedger(m.segment()), m.segment(), 4096, "kept", v, 42);
            Files.copy(m.file(), previous); // what the previous run left: same name, same size, dead pid
            Files.copy(m.file(), other); // another node's orphan: never adopted, kept for its node through its grace
        }
        try (SegmentMemory m = SegmentMemory.allocate(SIZE, dir, name, false, true)) {
            assertThat(m.adopted()).isTrue();
            assertThat(m.file().getFileName().toString()).isEqualTo("kvpool-127.0.0.1_3-" + ProcessHandle.current().pid() + ".seg");
            assertThat(previous).doesNotExist();
            assertThat(other).exists();
            RegionLedger ledger = new RegionLedger(m.segment());
            assertThat(SegmentAdoption.scan(m.channel(), m.segment(), ledger).kept()).isEqualTo(1);
            RegionLedger.Region r = ledger.beginRead(4096, 42);
            assertThat(m.segment().asSlice(r.valueOffset(), r.valueLength).toArray(ValueLayout.JAVA_BYTE)).isEqualTo(v);
        }
        // another size, or adoption off: a fresh, empty segment and the file reclaimed
        try (SegmentMemory m = SegmentMemory.allocate(SIZE, dir, name, false)) {
            Files.copy(m.file(), previous);
        }
        try (SegmentMemory m = SegmentMemory.allocate(SIZE * 2, dir, name, false, true)) {
            assertThat(m.adopted()).isFalse();
            assertThat(previous).doesNotExist();
        }
        try (var files = Files.list(dir)) {
            assertThat(files.toList()).as("closed segments delete their files; the other node's orphan waits for it")
                    .containsExactly(other);
        }
    }

    @Test
    void theLedgerAdoptsOnlyAlignedNonOverlappingRegionsInsideTheSegment() {
        Random rnd = new Random(5);
        MemorySegment seg = MemorySegment.ofArray(new byte[1 << 16]);
        RegionLedger ledger = new RegionLedger(seg);
        TreeMap<Long, Long> model = new TreeMap<>(); // offset -> end of the regions adopted
        for (int i = 0; i < 2000; i++) {
            long offset = rnd.nextInt(4) == 0 ? rnd.nextInt(1 << 16) : 64L * rnd.nextInt(1 << 10);
            long length = 64L * (1 + rnd.nextInt(20)) - (rnd.nextInt(8) == 0 ? 1 : 0);
            boolean fits = offset % 64 == 0 && offset + length <= seg.byteSize() && length > 0;
            var below = model.floorEntry(offset);
            var above = model.ceilingEntry(offset);
            boolean free = (below == null || below.getValue() <= offset) && (above == null || above.getKey() >= offset + length);
            boolean expected = fits && free;
            assertThat(ledger.adopt(offset, length, i, rnd.nextInt(3), new byte[]{1}, 0))
                    .as("adopt [%d, %d)", offset, offset + length).isEqualTo(expected);
            if (expected) {
                model.put(offset, offset + length);
            }
        }
        assertThat(ledger.objectCount()).isEqualTo(model.size());
        assertThat(ledger.completeRegions()).extracting(r -> r.offset).containsExactlyElementsOf(model.keySet());
    }

    /** The pid of a process that has exited and been reaped. */
    private static long deadPid() throws Exception {
        Process p = new ProcessBuilder("true").start();
        p.waitFor();
        return p.pid();
    }
}
