package io.kvpool.engine;

import org.junit.jupiter.api.Test;

import java.nio.charset.StandardCharsets;
import java.nio.file.Path;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * The engine's HTTP JSON bodies: what the trainer and the tests send parses to the request it means;
 * what a fuzzing campaign and a review found wrong is refused with a short message naming the field.
 */
class RequestBodiesTest {

    private static byte[] utf8(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    private static void refusedCompletion(String body, String message) {
        assertThatThrownBy(() -> RequestBodies.completion(utf8(body))).as(body)
                .isExactlyInstanceOf(IllegalArgumentException.class).hasMessageContaining(message);
    }

    private static void refusedUpdate(String body, String message) {
        assertThatThrownBy(() -> RequestBodies.weightUpdate(utf8(body))).as(body)
                .isExactlyInstanceOf(IllegalArgumentException.class).hasMessageContaining(message);
    }

    @Test
    void theBodiesTheTrainerAndTheTestsSendMeanWhatTheySay() {
        RequestBodies.CompletionRequest c = RequestBodies.completion(utf8(
                "{\"prompt\":\"hi\",\"max_tokens\":16,\"temperature\":0,\"cache_salt\":\"recompute-v3\"}"));
        assertThat(c.prompt()).containsExactly(256, 'h', 'i');
        assertThat(c.params()).isEqualTo(new SamplingParams(16, 0, 1, 0, true));
        assertThat(c.cacheSalt()).isEqualTo("recompute-v3");
        assertThat(c.stream()).isFalse();
        RequestBodies.CompletionRequest s = RequestBodies.completion(utf8(
                "{\"prompt\": [256, 1, 2], \"max_tokens\": 4, \"stream\": true, \"temperature\": 0.5, \"top_p\": 0.9,"
                        + " \"seed\": 42, \"cache_salt\": null, \"user\": \"ignored\"}"));
        assertThat(s.prompt()).containsExactly(256, 1, 2);
        assertThat(s.params()).isEqualTo(new SamplingParams(4, 0.5, 0.9, 42, true));
        assertThat(s.stream()).isTrue();
        assertThat(RequestBodies.weightUpdate(utf8("{\"seed\":3,\"version\":\"v3\"}")))
                .isEqualTo(new RequestBodies.WeightUpdateRequest("v3", null, 3L));
        assertThat(RequestBodies.weightUpdate(utf8("{\"path\": \"/models/dir\", \"seed\": 1, \"version\": \"step-12\"}")))
                .isEqualTo(new RequestBodies.WeightUpdateRequest("step-12", Path.of("/models/dir"), null));
        assertThat(RequestBodies.weightUpdate(utf8("{\"seed\": -9223372036854775808, \"version\": \"v\"}")).seed())
                .isEqualTo(Long.MIN_VALUE);
    }

    @Test
    void campaignFindingsAreRefusedAs400s() {
        // found: a body starting with zero bytes is read as UTF-32, and an invalid code point threw
        // CharConversionException, a plain IOException, which the server answered 500
        byte[] utf32 = {0, 0, 0, 0, 0, 'T', 'T', 'T', 'T', 0, 0, 0};
        assertThatThrownBy(() -> RequestBodies.completion(utf32)).isExactlyInstanceOf(IllegalArgumentException.class)
                .hasMessageStartingWith("the request body is not valid JSON: Invalid UTF-32 character");
        // found: Jackson's message quoted up to 256 characters of a bad token, echoing the body back
        String longToken = "_" + "x".repeat(4000);
        assertThatThrownBy(() -> RequestBodies.weightUpdate(utf8(longToken)))
                .isExactlyInstanceOf(IllegalArgumentException.class)
                .hasMessageStartingWith("the request body is not valid JSON: Unrecognized token '_xxx")
                .satisfies(e -> assertThat(e.getMessage()).hasSizeLessThan(200));
    }

    @Test
    void valuesOfTheWrongTypeAreRefusedNotCoerced() {
        refusedCompletion("{\"prompt\": \"x\", \"max_tokens\": 2.5}", "max_tokens must be an integer, got 2.5");
        refusedCompletion("{\"prompt\": \"x\", \"max_tokens\": \"4\"}", "max_tokens must be an integer");
        refusedCompletion("{\"prompt\": \"x\", \"max_tokens\": 1099511627776}",
                "max_tokens must be at most 2147483647 (and at least -2147483648), got 1099511627776");
        refusedCompletion("{\"prompt\": [1.5]}", "prompt[0] is not a token id: 1.5");
        refusedCompletion("{\"prompt\": \"x\", \"stream\": \"yes\"}", "stream must be true or false, got \"yes\"");
        refusedCompletion("{\"prompt\": \"x\", \"stream\": 1}", "stream must be true or false");
        refusedCompletion("{\"prompt\": \"x\", \"temperature\": 1e999}", "temperature must be a finite number");
        refusedCompletion("{\"prompt\": \"x\", \"top_p\": -1e999}", "top_p must be a finite number");
        refusedCompletion("{\"prompt\": {\"text\": \"x\"}}", "prompt must be a string or an array of token ids");
        refusedUpdate("{\"seed\": \"7\", \"version\": \"v\"}", "seed must be a 64-bit integer, got \"7\"");
        refusedUpdate("{\"seed\": 1.5, \"version\": \"v\"}", "seed must be a 64-bit integer");
        refusedUpdate("{\"seed\": 9223372036854775808, \"version\": \"v\"}", "seed must be a 64-bit integer");
        refusedUpdate("{\"seed\": 1, \"version\": 7}", "version must be a non-empty string");
        refusedUpdate("{\"seed\": 1, \"version\": {}}", "version must be a non-empty string");
        refusedUpdate("{\"seed\": 1}", "version is required");
        refusedUpdate("{\"path\": [], \"version\": \"v\"}", "path must be a non-empty string");
        refusedUpdate("{\"path\": \"/models/\\u0000x\", \"version\": \"v\"}", "path is not a valid path");
        refusedUpdate("{\"version\": \"v\"}", "update_weights needs \"seed\" or \"path\"");
    }

    @Test
    void aBodyIsOneObjectWithEachFieldOnce() {
        refusedCompletion("{\"prompt\": \"x\"} {\"prompt\": \"y\"}", "not valid JSON: Trailing token");
        refusedCompletion("{\"prompt\": \"x\", \"prompt\": [1]}", "Duplicate field 'prompt'");
        refusedCompletion("[{\"prompt\": \"x\"}]", "the request body must be a JSON object");
        refusedCompletion("   ", "the request body must be a JSON object");
        refusedCompletion("", "prompt is required");
        refusedCompletion("[".repeat(5000), "not valid JSON");
        refusedCompletion("{\"prompt\": \"x\", \"max_tokens\": " + "9".repeat(5000) + "}", "not valid JSON");
    }

    @Test
    void aRefusalQuotesOnlyTheStartOfABadValue() {
        String big = "\"" + "y".repeat(100_000) + "\"";
        assertThatThrownBy(() -> RequestBodies.completion(utf8("{\"prompt\": \"x\", \"top_p\": " + big + "}")))
                .hasMessageStartingWith("top_p must be a finite number, got \"yyy")
                .hasMessageEndingWith("(100002 characters)");
    }
}
