package io.kvpool.protocol;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;
import org.junit.jupiter.params.provider.ValueSource;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.charset.StandardCharsets;
import java.util.Random;
import java.util.zip.CRC32C;

import static org.assertj.core.api.Assertions.assertThat;

class ObjectLayoutTest {

    private Arena arena;
    private MemorySegment seg;

    @BeforeEach
    void setUp() {
        arena = Arena.ofConfined();
        seg = arena.allocate(1 << 16, 64);
    }

    @AfterEach
    void tearDown() {
        arena.close();
    }

    private static byte[] key(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    @Test
    void headerRoundTrip() {
        byte[] key = key("model/llama/layer-7/\u00e9");
        long base = 128;
        ObjectLayout.writeHeader(seg, base, ObjectLayout.STATE_WRITING, key, 1000, 0x1122334455667788L, 42,
                0xCAFEBABE);
        ObjectLayout.Header h = ObjectLayout.readHeader(seg, base, seg.byteSize());
        assertThat(h).isNotNull();
        assertThat(h.state()).isEqualTo(ObjectLayout.STATE_WRITING);
        assertThat(h.keyLength()).isEqualTo(key.length);
        assertThat(h.key()).isEqualTo(key);
        assertThat(h.valueLength()).isEqualTo(1000);
        assertThat(h.generation()).isEqualTo(0x1122334455667788L);
        assertThat(h.epoch()).isEqualTo(42);
        assertThat(h.valueCrc()).isEqualTo(0xCAFEBABE);
        assertThat(h.regionLength()).isEqualTo(ObjectLayout.regionLength(key.length, 1000));
        assertThat(ObjectLayout.state(seg, base)).isEqualTo(ObjectLayout.STATE_WRITING);
        assertThat(ObjectLayout.generation(seg, base)).isEqualTo(0x1122334455667788L);
        // the magic reads "KVOB" in memory
        assertThat(seg.asSlice(base, 4).toArray(ValueLayout.JAVA_BYTE)).isEqualTo("KVOB".getBytes(StandardCharsets.US_ASCII));
    }

    @Test
    void stateChangesDoNotInvalidateTheHeader() {
        byte[] key = key("k");
        ObjectLayout.writeHeader(seg, 0, ObjectLayout.STATE_WRITING, key, 10, 1, 1, 0);
        for (byte st : new byte[]{ObjectLayout.STATE_COMPLETE, ObjectLayout.STATE_DEAD, ObjectLayout.STATE_WRITING}) {
            ObjectLayout.setState(seg, 0, st);
            ObjectLayout.Header h = ObjectLayout.readHeader(seg, 0, seg.byteSize());
            assertThat(h).isNotNull();
            assertThat(h.state()).isEqualTo(st);
            assertThat(ObjectLayout.state(seg, 0)).isEqualTo(st);
        }
    }

    @Test
    void maxLengthKeyRoundTrips() {
        byte[] key = key("z".repeat(Keys.MAX_KEY_BYTES));
        ObjectLayout.writeHeader(seg, 64, ObjectLayout.STATE_COMPLETE, key, 0, 9, 9, 0);
        ObjectLayout.Header h = ObjectLayout.readHeader(seg, 64, seg.byteSize());
        assertThat(h).isNotNull();
        assertThat(h.key()).isEqualTo(key);
        assertThat(h.regionLength()).isEqualTo(576);
    }

    @Test
    void garbageIsNotAHeader() {
        long seed = 0x6A5BA6EL;
        Random rnd = new Random(seed);
        byte[] junk = new byte[(int) seg.byteSize()];
        for (int round = 0; round < 50; round++) {
            rnd.nextBytes(junk);
            MemorySegment.copy(junk, 0, seg, ValueLayout.JAVA_BYTE, 0, junk.length);
            for (long base = 0; base < seg.byteSize(); base += 64) {
                assertThat(ObjectLayout.readHeader(seg, base, seg.byteSize())).as("seed=%d round=%d base=%d", seed,
                        round, base).isNull();
            }
        }
        seg.fill((byte) 0);
        assertThat(ObjectLayout.readHeader(seg, 0, seg.byteSize())).isNull();
    }

    @Test
    void garbageWithTheRightMagicAndVersionIsNotAHeader() {
        long seed = 0x6A5BA6FL;
        Random rnd = new Random(seed);
        byte[] junk = new byte[256];
        for (int round = 0; round < 500; round++) {
            rnd.nextBytes(junk);
            MemorySegment.copy(junk, 0, seg, ValueLayout.JAVA_BYTE, 0, junk.length);
            seg.set(ValueLayout.JAVA_INT_UNALIGNED.withOrder(java.nio.ByteOrder.LITTLE_ENDIAN), 0, ObjectLayout.MAGIC);
            seg.set(ValueLayout.JAVA_BYTE, ObjectLayout.VERSION_OFFSET, ObjectLayout.VERSION);
            // a small plausible key and value length, so only the checksum can tell
            seg.set(ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(java.nio.ByteOrder.LITTLE_ENDIAN),
                    ObjectLayout.KEY_LENGTH_OFFSET, (short) (1 + rnd.nextInt(100)));
            seg.set(ValueLayout.JAVA_LONG_UNALIGNED.withOrder(java.nio.ByteOrder.LITTLE_ENDIAN),
                    ObjectLayout.VALUE_LENGTH_OFFSET, rnd.nextInt(1000));
            assertThat(ObjectLayout.readHeader(seg, 0, seg.byteSize())).as("seed=%d round=%d", seed, round).isNull();
        }
    }

    @ParameterizedTest
    @ValueSource(ints = {0, 3, 6, 8, 15, 16, 23, 24, 31, 32, 35, 36, 39, 48, 49, 52})
    void anyCorruptedCoveredByteInvalidatesTheHeader(int offset) {
        byte[] key = key("abcde");
        ObjectLayout.writeHeader(seg, 256, ObjectLayout.STATE_COMPLETE, key, 300, 77, 3, 0x12345678);
        assertThat(ObjectLayout.readHeader(seg, 256, seg.byteSize())).isNotNull();
        long at = 256 + offset;
        seg.set(ValueLayout.JAVA_BYTE, at, (byte) (seg.get(ValueLayout.JAVA_BYTE, at) ^ 0x01));
        assertThat(ObjectLayout.readHeader(seg, 256, seg.byteSize())).as("flipped byte %d", offset).isNull();
    }

    @Test
    void corruptedKeyByteInvalidatesTheHeader() {
        byte[] key = key("some/key");
        ObjectLayout.writeHeader(seg, 0, ObjectLayout.STATE_COMPLETE, key, 64, 1, 1, 0);
        seg.set(ValueLayout.JAVA_BYTE, ObjectLayout.KEY_OFFSET + 3, (byte) 'X');
        assertThat(ObjectLayout.readHeader(seg, 0, seg.byteSize())).isNull();
    }

    @Test
    void versionMismatchIsNotAHeader() {
        ObjectLayout.writeHeader(seg, 0, ObjectLayout.STATE_COMPLETE, key("k"), 64, 1, 1, 0);
        seg.set(ValueLayout.JAVA_BYTE, ObjectLayout.VERSION_OFFSET, (byte) 2);
        assertThat(ObjectLayout.readHeader(seg, 0, seg.byteSize())).isNull();
    }

    @Test
    void regionPastTheLimitIsNotAHeader() {
        byte[] key = key("key-1");
        long base = 1024;
        long valueLength = 1000;
        long region = ObjectLayout.regionLength(key.length, valueLength);
        ObjectLayout.writeHeader(seg, base, ObjectLayout.STATE_COMPLETE, key, valueLength, 1, 1, 0);
        assertThat(ObjectLayout.readHeader(seg, base, base + region)).isNotNull();
        assertThat(ObjectLayout.readHeader(seg, base, base + region - 1)).isNull();
        assertThat(ObjectLayout.readHeader(seg, base, base + ObjectLayout.KEY_OFFSET - 1)).isNull();
        assertThat(ObjectLayout.readHeader(seg, -64, seg.byteSize())).isNull();

        // a value length far beyond the segment
        ObjectLayout.writeHeader(seg, 0, ObjectLayout.STATE_COMPLETE, key, Long.MAX_VALUE / 2, 1, 1, 0);
        assertThat(ObjectLayout.readHeader(seg, 0, seg.byteSize())).isNull();
        ObjectLayout.writeHeader(seg, 0, ObjectLayout.STATE_COMPLETE, key, -1, 1, 1, 0);
        assertThat(ObjectLayout.readHeader(seg, 0, seg.byteSize())).isNull();
    }

    @ParameterizedTest
    @CsvSource({
            "1, 0, 64, 64",
            "1, 1, 64, 128",
            "16, 64, 64, 128",
            "17, 64, 128, 192",
            "80, 0, 128, 128",
            "81, 65, 192, 320",
            "512, 1, 576, 640",
    })
    void regionLengthAndValueOffset(int keyLength, long valueLength, long valueOffset, long regionLength) {
        assertThat(ObjectLayout.valueOffset(keyLength)).isEqualTo(valueOffset);
        assertThat(ObjectLayout.regionLength(keyLength, valueLength)).isEqualTo(regionLength);
    }

    @Test
    void alignmentProperties() {
        assertThat(ObjectLayout.align(0)).isZero();
        assertThat(ObjectLayout.align(1)).isEqualTo(64);
        assertThat(ObjectLayout.align(64)).isEqualTo(64);
        assertThat(ObjectLayout.align(65)).isEqualTo(128);
        long seed = 0xA119L;
        Random rnd = new Random(seed);
        for (int i = 0; i < 10_000; i++) {
            int k = 1 + rnd.nextInt(Keys.MAX_KEY_BYTES);
            long v = rnd.nextInt(4) == 0 ? rnd.nextInt(200) : rnd.nextLong(1L << 40);
            long vo = ObjectLayout.valueOffset(k);
            long rl = ObjectLayout.regionLength(k, v);
            String why = "seed=" + seed + " key=" + k + " value=" + v;
            assertThat(vo % 64).as(why).isZero();
            assertThat(rl % 64).as(why).isZero();
            assertThat(vo).as(why).isGreaterThanOrEqualTo(ObjectLayout.KEY_OFFSET + k).isLessThan(ObjectLayout.KEY_OFFSET + k + 64);
            assertThat(rl - vo).as(why).isGreaterThanOrEqualTo(v).isLessThan(v + 64);
        }
    }

    @Test
    void valueCrcIsCrc32c() {
        long seed = 0xC2C32CL;
        Random rnd = new Random(seed);
        for (int len : new int[]{0, 1, 7, 64, 1000, 65_536, (1 << 16) - 3}) {
            byte[] data = new byte[len];
            rnd.nextBytes(data);
            MemorySegment value = seg.asSlice(0, len);
            MemorySegment.copy(data, 0, value, ValueLayout.JAVA_BYTE, 0, len);
            CRC32C crc = new CRC32C();
            crc.update(data);
            assertThat(ObjectLayout.valueCrc(value)).as("seed=%d len=%d", seed, len).isEqualTo((int) crc.getValue());
            // and over a heap segment
            assertThat(ObjectLayout.valueCrc(MemorySegment.ofArray(data))).isEqualTo((int) crc.getValue());
        }
        // a known vector: CRC32C("123456789") = 0xE3069283
        assertThat(ObjectLayout.valueCrc(MemorySegment.ofArray("123456789".getBytes(StandardCharsets.US_ASCII))))
                .isEqualTo(0xE3069283);
    }

    @ParameterizedTest
    @ValueSource(longs = {0, 1, 65535, 65536, 65537, 3 * 65536 + 5, 2 << 20})
    void aCopySummedOnTheWayEqualsACopyAndItsChecksum(long size) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment src = a.allocate(Math.max(1, size)).asSlice(0, size);
            byte[] bytes = new byte[(int) size];
            new Random(size).nextBytes(bytes);
            MemorySegment.copy(MemorySegment.ofArray(bytes), 0, src, 0, size);
            MemorySegment dst = a.allocate(size + 16);
            dst.fill((byte) 0x5A);
            int crc = ObjectLayout.copyWithCrc(src, dst, 7);
            assertThat(crc).isEqualTo(ObjectLayout.valueCrc(src));
            assertThat(dst.asSlice(7, size).mismatch(src)).isEqualTo(-1L);
            assertThat(dst.get(ValueLayout.JAVA_BYTE, 6)).isEqualTo((byte) 0x5A);
            assertThat(dst.get(ValueLayout.JAVA_BYTE, 7 + size)).isEqualTo((byte) 0x5A);
        }
    }
}
