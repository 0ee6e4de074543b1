package io.kvpool.protocol;

import org.junit.jupiter.api.Test;

import java.lang.foreign.MemorySegment;
import java.util.Random;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

class Crc32cCombineTest {

    private static int crc(byte[] b, int from, int to) {
        return ObjectLayout.valueCrc(MemorySegment.ofArray(b).asSlice(from, to - from));
    }

    @Test
    void combiningThePiecesGivesTheChecksumOfTheWhole() {
        long seed = new Random().nextLong();
        Random r = new Random(seed);
        for (int round = 0; round < 200; round++) {
            byte[] b = new byte[r.nextInt(5000)];
            r.nextBytes(b);
            int cut = b.length == 0 ? 0 : r.nextInt(b.length + 1);
            assertThat(Crc32cCombine.combine(crc(b, 0, cut), crc(b, cut, b.length), b.length - cut))
                    .as("seed %d, %d bytes cut at %d", seed, b.length, cut).isEqualTo(crc(b, 0, b.length));
        }
    }

    @Test
    void manyPiecesFoldInOrder() {
        byte[] b = new byte[1 << 16];
        new Random(7).nextBytes(b);
        int acc = 0;
        for (int at = 0; at < b.length; at += 4096) {
            acc = Crc32cCombine.combine(acc, crc(b, at, at + 4096), 4096);
        }
        assertThat(acc).isEqualTo(crc(b, 0, b.length));
    }

    @Test
    void anEmptyPieceChangesNothingAndHugeLengthsAssociate() {
        assertThat(Crc32cCombine.combine(0x12345678, 0, 0)).isEqualTo(0x12345678);
        // (A || B) || C = A || (B || C), with lengths that use the high powers of x
        int a = 0xCAFEBABE;
        int b = 0x01234567;
        int c = 0x89ABCDEF;
        long lb = (1L << 40) + 12345;
        long lc = (1L << 61) + 3;
        assertThat(Crc32cCombine.combine(Crc32cCombine.combine(a, b, lb), c, lc))
                .isEqualTo(Crc32cCombine.combine(a, Crc32cCombine.combine(b, c, lc), lb + lc));
        assertThatThrownBy(() -> Crc32cCombine.combine(0, 0, -1)).isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("-1");
    }
}
