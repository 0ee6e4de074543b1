package io.kvpool.protocol;

import org.junit.jupiter.api.Test;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Arrays;
import java.util.Random;
import java.util.function.Consumer;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** {@link BodyWriter} and {@link BodyReader}. */
class BodyCodecTest {

    private static BodyReader reader(BodyWriter w) {
        return new BodyReader(w.buffer());
    }

    private static BodyReader reader(byte... bytes) {
        return new BodyReader(ByteBuffer.wrap(bytes));
    }

    /** The bulk i64s are byte for byte the i64s one at a time, at any alignment, and read back the same. */
    @Test
    void bulkI64sAreTheSameBytesAsOneAtATime() {
        Random rnd = new Random(5);
        long[] a = new long[40];
        for (int i = 0; i < a.length; i++) {
            a[i] = rnd.nextLong();
        }
        for (int lead = 0; lead < 9; lead++) {
            BodyWriter bulk = new BodyWriter(4);
            BodyWriter one = new BodyWriter(4);
            for (int k = 0; k < lead; k++) {
                bulk.u8(k);
                one.u8(k);
            }
            bulk.i64s(a, 3, 30).i32(7);
            for (int i = 3; i < 33; i++) {
                one.i64(a[i]);
            }
            one.i32(7);
            ByteBuffer x = bulk.buffer();
            ByteBuffer y = one.buffer();
            assertThat(x).isEqualTo(y);
            BodyReader r = new BodyReader(x);
            for (int k = 0; k < lead; k++) {
                r.u8("lead");
            }
            long[] back = new long[30];
            r.i64s(back, 30, "longs");
            assertThat(back).containsExactly(Arrays.copyOfRange(a, 3, 33));
            assertThat(r.i32("tail")).isEqualTo(7);
            assertThatThrownBy(() -> r.i64s(new long[1], 1, "one more"))
                    .isInstanceOf(MalformedFrameException.class).hasMessageContaining("one more");
        }
    }

    @Test
    void roundTripsEveryPrimitive() {
        byte[] big = new byte[65535];
        new Random(7).nextBytes(big);
        BodyWriter w = new BodyWriter(1) // forces growth
                .u8(0).u8(255).u8(0x7F)
                .bool(true).bool(false)
                .u16(0).u16(0xFFFF).u16(0x1234)
                .i32(0).i32(-1).i32(Integer.MIN_VALUE).i32(Integer.MAX_VALUE)
                .i64(0).i64(-1).i64(Long.MIN_VALUE).i64(Long.MAX_VALUE).i64(0x0102030405060708L)
                .bytes(new byte[0]).bytes(new byte[]{1, 2, 3}).bytes(big)
                .string("").string("h\u00e9llo \u20ac");
        BodyReader r = reader(w);
        assertThat(r.u8("a")).isEqualTo(0);
        assertThat(r.u8("b")).isEqualTo(255);
        assertThat(r.u8("c")).isEqualTo(0x7F);
        assertThat(r.bool("d")).isTrue();
        assertThat(r.bool("e")).isFalse();
        assertThat(r.u16("f")).isEqualTo(0);
        assertThat(r.u16("g")).isEqualTo(0xFFFF);
        assertThat(r.u16("h")).isEqualTo(0x1234);
        assertThat(r.i32("i")).isEqualTo(0);
        assertThat(r.i32("j")).isEqualTo(-1);
        assertThat(r.i32("k")).isEqualTo(Integer.MIN_VALUE);
        assertThat(r.i32("l")).isEqualTo(Integer.MAX_VALUE);
        assertThat(r.i64("m")).isEqualTo(0);
        assertThat(r.i64("n")).isEqualTo(-1);
        assertThat(r.i64("o")).isEqualTo(Long.MIN_VALUE);
        assertThat(r.i64("p")).isEqualTo(Long.MAX_VALUE);
        assertThat(r.length("q")).isEqualTo(0x0102030405060708L);
        assertThat(r.bytes("r")).isEmpty();
        assertThat(r.bytes("s")).containsExactly(1, 2, 3);
        assertThat(r.bytes("t")).isEqualTo(big);
        assertThat(r.string("u")).isEmpty();
        assertThat(r.string("v")).isEqualTo("h\u00e9llo \u20ac");
        assertThat(r.remaining()).isZero();
        r.end("test");
    }

    @Test
    void lengthsAndPositions() {
        BodyWriter w = new BodyWriter();
        assertThat(w.length()).isZero();
        w.u8(1).u16(2).i32(3).i64(4).bytes(new byte[5]).string("\u00e9");
        assertThat(w.length()).isEqualTo(1 + 2 + 4 + 8 + 2 + 5 + 2 + 2);
        assertThat(w.position()).isEqualTo(w.length());
        ByteBuffer b = w.buffer();
        assertThat(b.position()).isZero();
        assertThat(b.remaining()).isEqualTo(w.length());
        assertThat(b.order()).isEqualTo(ByteOrder.LITTLE_ENDIAN);
        // the view is independent of further writes
        w.i64(99);
        assertThat(b.remaining()).isEqualTo(w.length() - 8);
    }

    @Test
    void writesLittleEndian() {
        BodyWriter w = new BodyWriter().u16(0x0102).i32(0x03040506).i64(0x0708090A0B0C0D0EL).bytes(new byte[]{9});
        byte[] out = new byte[w.length()];
        w.buffer().get(out);
        assertThat(out).containsExactly(0x02, 0x01, 0x06, 0x05, 0x04, 0x03,
                0x0E, 0x0D, 0x0C, 0x0B, 0x0A, 0x09, 0x08, 0x07, 0x01, 0x00, 0x09);
    }

    @Test
    void i32AtPatchesAnEarlierCount() {
        BodyWriter w = new BodyWriter(4);
        int at = w.position();
        w.i32(0);
        for (int i = 0; i < 100; i++) {
            w.i64(i); // grows the buffer past the patched position
        }
        w.i32At(at, 100);
        BodyReader r = reader(w);
        int n = r.count("n", 8);
        assertThat(n).isEqualTo(100);
        for (int i = 0; i < n; i++) {
            assertThat(r.i64("v")).isEqualTo(i);
        }
        r.end("patched");
    }

    @Test
    void byteStringsOver65535Rejected() {
        assertThatThrownBy(() -> new BodyWriter().bytes(new byte[65536]))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("65536");
    }

    @Test
    void readerStartsAtTheBuffersPositionAndReadsLittleEndianWhateverTheOrder() {
        ByteBuffer b = ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN);
        b.put((byte) 99).putInt(1).flip();
        b.position(1).order(ByteOrder.BIG_ENDIAN);
        BodyReader r = new BodyReader(b);
        assertThat(r.i32("x")).isEqualTo(1);
        r.end("x");
    }

    private static void assertTruncated(int available, Consumer<BodyReader> read, String field) {
        BodyReader r = reader(new byte[available]);
        assertThatThrownBy(() -> read.accept(r))
                .isInstanceOf(MalformedFrameException.class)
                .hasMessageContaining(field)
                .hasMessageContaining("ends early")
                .satisfies(e -> assertThat(((MalformedFrameException) e).status()).isEqualTo(FrameStatus.MALFORMED_FRAME));
    }

    @Test
    void truncatedBodiesNameTheField() {
        assertTruncated(0, r -> r.u8("the-u8"), "the-u8");
        assertTruncated(0, r -> r.bool("the-bool"), "the-bool");
        assertTruncated(1, r -> r.u16("the-u16"), "the-u16");
        assertTruncated(3, r -> r.i32("the-i32"), "the-i32");
        assertTruncated(7, r -> r.i64("the-i64"), "the-i64");
        assertTruncated(7, r -> r.length("the-length"), "the-length");
        assertTruncated(3, r -> r.count("the-count", 1), "the-count");
        assertTruncated(1, r -> r.bytes("the-bytes"), "the-bytes length");
        assertTruncated(1, r -> r.string("the-string"), "the-string length");
    }

    @Test
    void truncatedByteStringContentNamesTheField() {
        // declares 10 bytes, carries 3
        BodyReader r = reader(new byte[]{10, 0, 1, 2, 3});
        assertThatThrownBy(() -> r.bytes("segment name"))
                .isInstanceOf(MalformedFrameException.class)
                .hasMessageContaining("segment name")
                .hasMessageContaining("need 10")
                .hasMessageContaining("3 left");
    }

    @Test
    void everyPrefixOfAValidBodyFailsCleanly() {
        BodyWriter w = new BodyWriter().u8(1).bool(true).u16(2).i32(3).i64(4).bytes(new byte[]{5, 6}).string("x");
        byte[] all = new byte[w.length()];
        w.buffer().get(all);
        for (int cut = 0; cut < all.length; cut++) {
            BodyReader r = new BodyReader(ByteBuffer.wrap(Arrays.copyOf(all, cut)));
            int c = cut;
            assertThatThrownBy(() -> {
                r.u8("a");
                r.bool("b");
                r.u16("c");
                r.i32("d");
                r.i64("e");
                r.bytes("f");
                r.string("g");
            }).as("cut at %d", c).isInstanceOf(MalformedFrameException.class);
        }
    }

    @Test
    void boolRejectsValuesOtherThanZeroAndOne() {
        assertThatThrownBy(() -> reader(new byte[]{2}).bool("upsert"))
                .isInstanceOf(MalformedFrameException.class).hasMessageContaining("upsert").hasMessageContaining("2");
    }

    @Test
    void lengthRejectsNegative() {
        assertThatThrownBy(() -> reader(new BodyWriter().i64(-5)).length("offset"))
                .isInstanceOf(MalformedFrameException.class).hasMessageContaining("offset").hasMessageContaining("-5");
    }

    @Test
    void countRejectsNegativeAndImplausibleCounts() {
        assertThatThrownBy(() -> reader(new BodyWriter().i32(-1)).count("key count", 3))
                .isInstanceOf(MalformedFrameException.class).hasMessageContaining("key count").hasMessageContaining("-1");
        assertThatThrownBy(() -> reader(new BodyWriter().i32(Integer.MAX_VALUE).i64(0)).count("item count", 1))
                .isInstanceOf(MalformedFrameException.class).hasMessageContaining("item count")
                .hasMessageContaining(String.valueOf(Integer.MAX_VALUE));
        // 4 items of at least 3 bytes need 12 bytes; 11 are left
        assertThatThrownBy(() -> reader(new BodyWriter().i32(4).bytes(new byte[9])).count("key count", 3))
                .isInstanceOf(MalformedFrameException.class).hasMessageContaining("key count");
        // exactly enough is fine
        assertThat(reader(new BodyWriter().i32(4).bytes(new byte[10])).count("key count", 3)).isEqualTo(4);
        assertThat(reader(new BodyWriter().i32(0)).count("none", 100)).isZero();
        // minItemBytes below 1 still bounds by the bytes left
        assertThatThrownBy(() -> reader(new BodyWriter().i32(5).i32(0)).count("c", 0))
                .isInstanceOf(MalformedFrameException.class);
        assertThat(reader(new BodyWriter().i32(4).i32(0)).count("c", 0)).isEqualTo(4);
    }

    @Test
    void endRejectsTrailingBytes() {
        BodyReader r = reader(new BodyWriter().i32(1).u8(0).u8(0));
        r.i32("x");
        assertThatThrownBy(() -> r.end("put_start"))
                .isInstanceOf(MalformedFrameException.class)
                .hasMessageContaining("put_start")
                .hasMessageContaining("2 unexpected trailing bytes");
        r.u8("y");
        r.u8("z");
        r.end("put_start");
        reader().end("empty");
    }
}
