package io.kvpool.connector.hash;

import org.junit.jupiter.api.Test;

import java.nio.charset.StandardCharsets;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

class KeyFormatTest {

    private static final BlockHash H = BlockHash.ofHex("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff");

    @Test
    void keysSpellEveryFieldAndEscapeTheModelName() {
        KeyFormat f = new KeyFormat("meta-llama/Llama-3.1-8B", "step-1200", 1, 2, 0, 1, "bf16");
        assertThat(f.keyString(H)).isEqualTo("kvp1/meta-llama%2FLlama-3.1-8B/step-1200/tp1of2-pp0of1/bf16/" + H.hex());
        assertThat(new String(f.key(H), StandardCharsets.US_ASCII)).isEqualTo(f.keyString(H));
        assertThat(f.keyString(H)).startsWith(f.versionPrefix()).startsWith(KeyFormat.modelPrefix(f.model()));
    }

    @Test
    void anotherWeightVersionChangesEveryKeyAndItsPrefixDoesNotCoverTheOld() {
        KeyFormat v1 = KeyFormat.of("m", "v1", "f32");
        KeyFormat v10 = v1.withWeights("v10");
        assertThat(v10.keyString(H)).isNotEqualTo(v1.keyString(H)).doesNotStartWith(v1.versionPrefix());
        assertThat(v1.keyString(H)).doesNotStartWith(v10.versionPrefix());
        assertThat(KeyFormat.of("a/b", "v", "f32").keyString(H)).doesNotStartWith(KeyFormat.modelPrefix("a"));
    }

    @Test
    void nonAsciiIsEscapedByteByByte() {
        assertThat(KeyFormat.escape("é ~x")).isEqualTo("%C3%A9%20~x");
    }

    @Test
    void badFormatsAreRefusedNamingTheField() {
        assertThatThrownBy(() -> KeyFormat.of("", "v", "f32")).hasMessageContaining("model");
        assertThatThrownBy(() -> new KeyFormat("m", "v", 2, 2, 0, 1, "f32")).hasMessageContaining("tensor-parallel rank 2 of 2");
        assertThatThrownBy(() -> new KeyFormat("m", "v", 0, 1, 0, 0, "f32")).hasMessageContaining("pipeline-parallel");
        assertThatThrownBy(() -> KeyFormat.of("m".repeat(440), "v", "f32")).hasMessageContaining("over the pool's 512");
    }
}
