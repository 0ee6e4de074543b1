package io.kvpool.client;

import io.kvpool.config.HostPort;
import io.kvpool.protocol.ObjectLayout;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Set;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * What the same-machine read accepts (only a complete object of the expected generation and length),
 * and which file a segment id reaches (the one its current table entry names).
 */
class SharedSegmentsTest {

    private static final int SIZE = 1 << 16;

    /** A segment file of {@link #SIZE} bytes whose first byte is {@code mark}. */
    private static Path segmentFile(Path dir, String name, byte mark) throws IOException {
        byte[] bytes = new byte[SIZE];
        bytes[0] = mark;
        return Files.write(dir.resolve(name), bytes);
    }

    private static SegmentDirectory.Entry entry(int id, String name, Path file) {
        return new SegmentDirectory.Entry(id, name, new HostPort("127.0.0.1", 7000 + id), true, true, SIZE, SIZE,
                file.toString());
    }

    /**
     * A new master numbers the segments in the order their nodes register again: id 2, node A's a
     * moment ago, is node B's now, and both stay in the table. The id must reach B's file. (Mappings
     * were kept by id, so every copy for "segment 2" kept going into A's file: the wrong bytes and lost
     * objects of issue 25's rolling-restart drill.)
     */
    @Test
    void anIdThatNamesAnotherNodeAfterAMasterChangeReachesThatNodesFile(@TempDir Path dir) throws IOException {
        Path a = segmentFile(dir, "kvpool-127.0.0.1_7001-100.seg", (byte) 'A');
        Path b = segmentFile(dir, "kvpool-127.0.0.1_7002-200.seg", (byte) 'B');
        SharedSegments shared = new SharedSegments(true);
        try {
            // the old master: A is 2, B is 3
            assertThat(shared.mapping(entry(2, "node-a", a)).get(ValueLayout.JAVA_BYTE, 0)).isEqualTo((byte) 'A');
            assertThat(shared.mapping(entry(3, "node-b", b)).get(ValueLayout.JAVA_BYTE, 0)).isEqualTo((byte) 'B');

            // the new master: B registered first and is 2, A is 3 (both ids and files still in the table,
            // so the refresh lets go of no mapping)
            MemorySegment two = shared.mapping(entry(2, "node-b", b));
            assertThat(two.get(ValueLayout.JAVA_BYTE, 0)).as("segment 2 is node B's now").isEqualTo((byte) 'B');
            assertThat(shared.mapping(entry(3, "node-a", a)).get(ValueLayout.JAVA_BYTE, 0)).isEqualTo((byte) 'A');

            // a write through segment 2 lands in B's file, and A's bytes stay as they were
            SharedSegments.write(two, 0, MemorySegment.ofArray(new byte[]{'b'}));
            assertThat(Files.readAllBytes(b)[0]).isEqualTo((byte) 'b');
            assertThat(Files.readAllBytes(a)[0]).isEqualTo((byte) 'A');
        } finally {
            shared.close();
        }
    }

    /** A file no entry of the table names any more is let go, and mapped afresh if it comes back. */
    @Test
    void retainLetsGoOfFilesNoLongerInTheTable(@TempDir Path dir) throws IOException {
        Path a = segmentFile(dir, "kvpool-127.0.0.1_7001-100.seg", (byte) 'A');
        SharedSegments shared = new SharedSegments(true);
        try {
            MemorySegment first = shared.mapping(entry(1, "node-a", a));
            shared.retain(Set.of());
            MemorySegment again = shared.mapping(entry(4, "node-a", a));
            assertThat(again).isNotNull();
            assertThat(again.address()).as("a fresh mapping").isNotEqualTo(first.address());
        } finally {
            shared.close();
        }
    }

    /** Clients of one process share a file's mapping (and its populated windows) until the last lets go. */
    @Test
    void clientsOfOneProcessShareAMappingUntilTheLastDropsIt(@TempDir Path dir) throws IOException {
        Path a = segmentFile(dir, "kvpool-127.0.0.1_7001-100.seg", (byte) 'A');
        SharedSegments one = new SharedSegments(true);
        SharedSegments two = new SharedSegments(true);
        try {
            MemorySegment first = one.mapping(entry(1, "node-a", a));
            MemorySegment second = two.mapping(entry(1, "node-a", a));
            assertThat(second.address()).as("one mapping for both clients").isEqualTo(first.address());
            assertThat(SharedSegments.windows(first)).isNotNull();

            one.close();
            assertThat(SharedSegments.windows(second)).as("still held by the second client").isNotNull();
            two.retain(Set.of());
            assertThat(SharedSegments.windows(second)).as("let go by the last client").isNull();
            MemorySegment again = one.mapping(entry(1, "node-a", a));
            assertThat(again.address()).as("mapped afresh").isNotEqualTo(first.address());
            assertThat(SharedSegments.windows(again)).isNotNull();
        } finally {
            one.close();
            two.close();
        }
    }

    /**
     * A node restarted in the same process on the same port makes a new file under the old name: a client
     * that maps it then gets the new file, not the mapping another client kept of the replaced one.
     */
    @Test
    void aFileReplacedUnderTheSameNameIsMappedAfresh(@TempDir Path dir) throws IOException {
        Path a = segmentFile(dir, "kvpool-127.0.0.1_7001-100.seg", (byte) 'A');
        SharedSegments old = new SharedSegments(true);
        SharedSegments fresh = new SharedSegments(true);
        try {
            MemorySegment first = old.mapping(entry(1, "node-a", a));
            Files.delete(a);
            segmentFile(dir, "kvpool-127.0.0.1_7001-100.seg", (byte) 'N');
            MemorySegment second = fresh.mapping(entry(1, "node-a", a));
            assertThat(second.address()).isNotEqualTo(first.address());
            assertThat(second.get(ValueLayout.JAVA_BYTE, 0)).as("the new file's bytes").isEqualTo((byte) 'N');
            assertThat(first.get(ValueLayout.JAVA_BYTE, 0)).as("the old client keeps its own").isEqualTo((byte) 'A');
        } finally {
            old.close();
            fresh.close();
        }
    }

    @Test
    void readsOnlyTheCompleteObjectItWasToldAbout() {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment seg = arena.allocate(1 << 16, 64);
            byte[] key = "model/v1/block-7".getBytes(StandardCharsets.UTF_8);
            byte[] value = new byte[1000];
            for (int i = 0; i < value.length; i++) {
                value[i] = (byte) (i * 31);
            }
            long base = 4096;
            ObjectLayout.writeHeader(seg, base, ObjectLayout.STATE_WRITING, key, value.length, 77, 3,
                    ObjectLayout.valueCrc(MemorySegment.ofArray(value)));
            MemorySegment.copy(MemorySegment.ofArray(value), 0, seg, base + ObjectLayout.valueOffset(key.length), value.length);
            MemorySegment dst = arena.allocate(value.length);

            assertThat(SharedSegments.read(seg, base, 77, value.length, dst)).as("still being written").isFalse();
            ObjectLayout.setState(seg, base, ObjectLayout.STATE_COMPLETE);
            assertThat(SharedSegments.read(seg, base, 77, value.length, dst)).isTrue();
            assertThat(dst.toArray(ValueLayout.JAVA_BYTE)).isEqualTo(value);

            assertThat(SharedSegments.read(seg, base, 78, value.length, dst)).as("another generation").isFalse();
            assertThat(SharedSegments.read(seg, base, 77, value.length - 1, dst)).as("another length").isFalse();
            assertThat(SharedSegments.read(seg, base + 64, 77, value.length, dst)).as("no header there").isFalse();
            assertThat(SharedSegments.read(seg, (1 << 16) - 32, 77, value.length, dst)).as("past the end").isFalse();
            ObjectLayout.setState(seg, base, ObjectLayout.STATE_DEAD);
            assertThat(SharedSegments.read(seg, base, 77, value.length, dst)).as("freed").isFalse();
        }
    }
}
