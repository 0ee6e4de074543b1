package io.kvpool.connector.config;

import com.code_intelligence.jazzer.junit.FuzzTest;

import java.nio.charset.StandardCharsets;

/**
 * Fuzz target for the offload config parser (Jazzer): whatever a config file holds, YAML or JSON,
 * {@link OffloadConfigs#parse} returns a config or refuses with an IllegalArgumentException (which
 * the CLI prints naming the file and the field); anything else, or a hang, is a finding. The input's
 * first byte picks YAML or JSON. Seeds: the example configs, in
 * {@code src/test/resources/io/kvpool/connector/config/OffloadConfigsFuzzTestInputs/}.
 */
class OffloadConfigsFuzzTest {

    @FuzzTest(maxDuration = "10m")
    void anyConfigTextIsParsedOrRefusedWithAMessage(byte[] data) {
        if (data.length == 0) {
            return;
        }
        String text = new String(data, 1, data.length - 1, StandardCharsets.UTF_8);
        try {
            OffloadConfigs.Loaded loaded = OffloadConfigs.parse(text, (data[0] & 1) == 1);
            if (loaded.config() == null) {
                throw new AssertionError("a parse returned no config for: " + text);
            }
        } catch (IllegalArgumentException refused) {
            if (refused.getMessage() == null || refused.getMessage().isBlank()) {
                throw new AssertionError("a refusal without a message for: " + text, refused);
            }
        }
    }
}
