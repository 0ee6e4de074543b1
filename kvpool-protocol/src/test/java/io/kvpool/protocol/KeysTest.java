package io.kvpool.protocol;

import org.junit.jupiter.api.Test;

import java.nio.charset.StandardCharsets;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

class KeysTest {

    @Test
    void emptyAndNullKeysRejected() {
        assertThatThrownBy(() -> Keys.encode("")).isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("empty");
        assertThatThrownBy(() -> Keys.encode(null)).isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("empty");
        assertThatThrownBy(() -> Keys.validate(new byte[0], "")).isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("empty");
    }

    @Test
    void oneByteAndMaxLengthKeysAccepted() {
        assertThat(Keys.encode("k")).containsExactly('k');
        String max = "a".repeat(Keys.MAX_KEY_BYTES);
        byte[] b = Keys.encode(max);
        assertThat(b).hasSize(512);
        assertThat(Keys.decode(b)).isEqualTo(max);
    }

    @Test
    void keyOf513BytesRejectedNamingItsLength() {
        assertThatThrownBy(() -> Keys.encode("a".repeat(513)))
                .isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("513")
                .hasMessageContaining("512");
    }

    @Test
    void longKeysAreAbbreviatedInMessages() {
        String key = "x".repeat(1000);
        assertThatThrownBy(() -> Keys.encode(key))
                .isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("1000")
                .hasMessageContaining("940 more chars")
                .satisfies(e -> assertThat(e.getMessage().length()).isLessThan(300));
    }

    @Test
    void multibyteKeysCountUtf8BytesNotChars() {
        // U+00E9 is 2 bytes in UTF-8
        String twoByte = "\u00e9".repeat(256);
        assertThat(twoByte).hasSize(256);
        assertThat(Keys.encode(twoByte)).hasSize(512);
        assertThatThrownBy(() -> Keys.encode("\u00e9".repeat(257)))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("514");

        // U+20AC is 3 bytes: 170 chars = 510 bytes fits, 171 chars = 513 bytes does not
        assertThat(Keys.encode("\u20ac".repeat(170))).hasSize(510);
        assertThatThrownBy(() -> Keys.encode("\u20ac".repeat(171)))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("513");

        // U+1F600 is a surrogate pair (2 chars) and 4 bytes
        String emoji = new String(Character.toChars(0x1F600));
        assertThat(Keys.encode(emoji.repeat(128))).hasSize(512);
        assertThatThrownBy(() -> Keys.encode(emoji.repeat(128) + "a"))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("513");
        // 240 chars, 520 bytes
        assertThatThrownBy(() -> Keys.encode(emoji.repeat(100) + "\u20ac".repeat(40)))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("520");
    }

    @Test
    void encodeDecodeRoundTrip() {
        String k = "model/llama-70b/v3/rank\u00e9/\u20ac" + new String(Character.toChars(0x1F600));
        assertThat(Keys.decode(Keys.encode(k))).isEqualTo(k);
        assertThat(Keys.encode(k)).isEqualTo(k.getBytes(StandardCharsets.UTF_8));
    }

    @Test
    void loneSurrogateRejected() {
        assertThatThrownBy(() -> Keys.encode("a\uD800")).isInstanceOf(IllegalArgumentException.class);
    }

    /**
     * An unpaired surrogate in an otherwise ASCII key encodes to one '?' byte, which the eight-bytes-
     * at-a-time scan must find wherever it falls (inside a word, in the tail, at either end); a real
     * '?' anywhere is a valid key.
     */
    @Test
    void aLoneSurrogateIsFoundAtEveryPositionAndARealQuestionMarkIsKept() {
        for (int len = 1; len <= 40; len++) {
            for (int at = 0; at < len; at++) {
                String lone = "k".repeat(at) + '\uD800' + "k".repeat(len - at - 1);
                assertThatThrownBy(() -> Keys.encode(lone)).as("length %d, surrogate at %d", len, at)
                        .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("unpaired surrogate");
                String question = "k".repeat(at) + '?' + "k".repeat(len - at - 1);
                assertThat(Keys.encode(question)).as("length %d, '?' at %d", len, at)
                        .isEqualTo(question.getBytes(StandardCharsets.UTF_8));
            }
        }
    }

    /**
     * {@link Keys#digests} is {@code KeyDigest.of(Keys.encode(key))} for each key (ASCII of every length round a
     * word, '?' anywhere, multibyte, surrogate pairs), and refuses what encode refuses, with its message.
     */
    @Test
    void digestsAreTheDigestsOfTheEncodedKeysAndRefuseWhatEncodeRefuses() {
        java.util.List<String> keys = new java.util.ArrayList<>();
        java.util.Random r = new java.util.Random(36);
        for (int len = 1; len <= 40; len++) {
            for (int at = 0; at < len; at++) {
                keys.add("k".repeat(at) + '?' + "k".repeat(len - at - 1));
            }
            StringBuilder b = new StringBuilder();
            for (int i = 0; i < len; i++) {
                b.append((char) ('!' + r.nextInt(94)));
            }
            keys.add(b.toString());
        }
        keys.add("caf\u00e9/\u4e16\u754c/\uD83D\uDE00?");
        keys.add("x".repeat(Keys.MAX_KEY_BYTES));
        long[] d = Keys.digests(keys, 0, keys.size());
        for (int i = 0; i < keys.size(); i++) {
            assertThat(new long[]{d[2 * i], d[2 * i + 1]}).as(keys.get(i)).isEqualTo(KeyDigest.of(Keys.encode(keys.get(i))));
        }
        long[] part = Keys.digests(keys, 3, 7);
        assertThat(part).isEqualTo(java.util.Arrays.copyOfRange(d, 6, 14));
        for (String bad : new String[]{"", "ab\uD800cd", "?\uDC00", "x".repeat(Keys.MAX_KEY_BYTES + 1)}) {
            java.util.List<String> withBad = java.util.List.of("fine", bad);
            Throwable expected = org.assertj.core.api.Assertions.catchThrowable(() -> Keys.encode(bad));
            assertThatThrownBy(() -> Keys.digests(withBad, 0, 2)).isInstanceOf(IllegalArgumentException.class)
                    .hasMessage(expected.getMessage());
        }
    }

    @Test
    void hasPrefixIsByteWise() {
        byte[] key = Keys.encode("abc/def");
        assertThat(Keys.hasPrefix(key, Keys.encode("abc"))).isTrue();
        assertThat(Keys.hasPrefix(key, Keys.encode("abc/def"))).isTrue();
        assertThat(Keys.hasPrefix(key, new byte[0])).isTrue();
        assertThat(Keys.hasPrefix(key, Keys.encode("abd"))).isFalse();
        assertThat(Keys.hasPrefix(key, Keys.encode("abc/defg"))).isFalse();
        assertThat(Keys.hasPrefix(key, Keys.encode("b"))).isFalse();
        // a prefix may end inside a multibyte character
        byte[] e = Keys.encode("\u00e9t\u00e9");
        assertThat(Keys.hasPrefix(e, new byte[]{e[0]})).isTrue();
        assertThat(Keys.hasPrefix(e, new byte[]{e[1]})).isFalse();
    }

    @Test
    void abbreviate() {
        assertThat(Keys.abbreviate(null)).isEqualTo("null");
        assertThat(Keys.abbreviate("short")).isEqualTo("short");
        assertThat(Keys.abbreviate("y".repeat(80))).isEqualTo("y".repeat(80));
        assertThat(Keys.abbreviate("y".repeat(81))).isEqualTo("y".repeat(60) + "...(21 more chars)");
    }
}
