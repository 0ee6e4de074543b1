package io.kvpool.client;

import io.kvpool.protocol.ObjectLayout;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.charset.StandardCharsets;

import static org.assertj.core.api.Assertions.assertThat;

/** What the same-machine read accepts: only a complete object of the expected generation and length. */
class SharedSegmentsTest {

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
