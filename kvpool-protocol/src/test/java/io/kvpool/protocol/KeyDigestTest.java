package io.kvpool.protocol;

import io.kvpool.protocol.msg.DigestList;
import io.kvpool.protocol.msg.KeyList;
import org.junit.jupiter.api.Test;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.assertj.core.api.Assertions.catchThrowableOfType;

class KeyDigestTest {

    private static long[] d(String k) {
        return KeyDigest.of(k.getBytes(StandardCharsets.UTF_8));
    }

    /** Fixed values of the function docs/protocol.md section 4.26 specifies: any change breaks every other client. */
    @Test
    void knownValues() {
        assertThat(d("a")).containsExactly(0x7846d57d4aa3da94L, 0x3cfbe60faba552f8L);
        assertThat(d("12345678")).containsExactly(0x0d290f7cecd1617aL, 0x4c4595384ed5a7ccL);
        assertThat(d("123456789")).containsExactly(0x4b8007e84f6e687dL, 0x350a9534e031e0f1L);
        assertThat(d("kvp1/llama/v1/tp0of1-pp0of1/bf16/" + "0123456789abcdef".repeat(4)))
                .containsExactly(0x437e0ece9c7aafdbL, 0xca7a2aa8ddb4522fL);
    }

    @Test
    void aSliceDigestsLikeTheWholeKeyAndLoIsTheFirstHalf() {
        byte[] k = "xxkvp1/model/v1/abcdefx".getBytes(StandardCharsets.UTF_8);
        long[] out = new long[4];
        KeyDigest.digest(k, 2, k.length - 3, out, 2);
        assertThat(new long[] {out[2], out[3]}).containsExactly(d("kvp1/model/v1/abcdef"));
        assertThat(KeyDigest.lo(k, 2, k.length - 3)).isEqualTo(out[2]);
    }

    @Test
    void everyLengthAndEverySingleBitFlipGivesADistinctDigest() {
        java.util.Map<String, String> byDigest = new java.util.HashMap<>();
        byte[] base = "kvp1/llama-3-8b/v1/tp0of1-pp0of1/bf16/00000000000000000000000000000000".getBytes();
        for (int len = 1; len <= base.length; len++) {
            for (int bit = -1; bit < 8 * len; bit++) {
                byte[] k = java.util.Arrays.copyOf(base, len);
                if (bit >= 0) {
                    k[bit / 8] ^= (byte) (1 << (bit % 8));
                }
                long[] x = KeyDigest.of(k);
                String input = new String(k, StandardCharsets.ISO_8859_1);
                String before = byDigest.putIfAbsent(x[0] + ":" + x[1], input);
                assertThat(before == null || before.equals(input)).as("digest collision: %s / %s", before, input).isTrue();
            }
        }
        assertThat(byDigest).hasSizeGreaterThan(19_000);
    }

    @Test
    void digestListWritesLoThenHiLittleEndian() {
        List<byte[]> keys = List.of("a".getBytes(StandardCharsets.UTF_8));
        BodyWriter w = new BodyWriter();
        DigestList.of(keys, 0, 1).write(w);
        ByteBuffer b = w.buffer().order(ByteOrder.LITTLE_ENDIAN);
        assertThat(b.remaining()).isEqualTo(4 + KeyDigest.BYTES);
        assertThat(b.getInt()).isEqualTo(1);
        assertThat(b.getLong()).isEqualTo(0x7846d57d4aa3da94L);
        assertThat(b.getLong()).isEqualTo(0x3cfbe60faba552f8L);
        DigestList back = DigestList.read(new BodyReader(w.buffer()));
        assertThat(back.count()).isEqualTo(1);
        assertThat(back.digests()).containsExactly(0x7846d57d4aa3da94L, 0x3cfbe60faba552f8L);
    }

    /** A key list read as digests in place (how the master answers PREFIX_MATCH) gives each key's digest, at every
     * length and alignment, and refuses the keys KeyList.read refuses, with the same message. */
    @Test
    void aKeyListReadAsDigestsInPlaceMatchesTheKeysDigests() {
        java.util.Random rnd = new java.util.Random(7);
        List<byte[]> keys = new java.util.ArrayList<>();
        for (int len = 1; len <= 200; len++) {
            byte[] k = new byte[len];
            rnd.nextBytes(k);
            keys.add(k);
        }
        BodyWriter w = new BodyWriter();
        new KeyList(keys).write(w);
        DigestList read = KeyList.readDigests(new BodyReader(w.buffer()));
        assertThat(read.count()).isEqualTo(keys.size());
        assertThat(read.digests()).containsExactly(DigestList.of(keys, 0, keys.size()).digests());

        for (int bad : new int[] {0, Keys.MAX_KEY_BYTES + 1}) {
            BodyWriter bw = new BodyWriter();
            new KeyList(List.of("ok".getBytes(StandardCharsets.UTF_8), new byte[bad])).write(bw);
            String byKey = catchThrowableOfType(BadRequestException.class,
                    () -> KeyList.read(new BodyReader(bw.buffer()))).getMessage();
            assertThatThrownBy(() -> KeyList.readDigests(new BodyReader(bw.buffer())))
                    .isInstanceOf(BadRequestException.class).hasMessage(byKey);
        }
    }
}
