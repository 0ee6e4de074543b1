package io.kvpool.engine;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.ObjectReader;
import io.kvpool.engine.llama.ByteTokenizer;

import java.io.IOException;
import java.nio.file.Path;

/**
 * The JSON bodies of the engine's HTTP API, parsed apart from the exchange so that a test (and a
 * fuzzer, {@code RequestBodiesFuzzTest}) can drive them with any bytes.
 *
 * <p>Contract: whatever the bytes, a parse returns a request whose fields are all valid by themselves
 * (the checks that need the model, such as token ids inside the vocabulary and the context length,
 * stay with {@link Engine#generate}), or throws an {@link IllegalArgumentException} whose message
 * names the field that was wrong, which {@link EngineServer} answers 400. No other exception escapes.
 */
public final class RequestBodies {

    private static final ObjectReader READER = new ObjectMapper().reader();
    private static final ByteTokenizer TOKENIZER = new ByteTokenizer();
    /** How much of a bad value an error message quotes. */
    private static final int SHOWN_CHARS = 80;

    private RequestBodies() {
    }

    /** {@code POST /v1/completions}: the prompt as token ids (a string is tokenized, with BOS). */
    public record CompletionRequest(int[] prompt, SamplingParams params, String cacheSalt, boolean stream) {
    }

    /**
     * {@code POST /update_weights}: the new weights' version and where they come from, a directory
     * ({@code path}, preferred when both are given) or a seed for random weights; exactly one of
     * {@code path} and {@code seed} is non-null.
     */
    public record WeightUpdateRequest(String version, Path path, Long seed) {
    }

    public static CompletionRequest completion(byte[] body) {
        JsonNode b = object(body);
        int[] prompt = prompt(b);
        SamplingParams params = new SamplingParams(intField(b, "max_tokens", 16), doubleField(b, "temperature", 0),
                doubleField(b, "top_p", 1), intField(b, "seed", 0), true);
        String salt = stringField(b, "cache_salt", "omit it for no salt");
        return new CompletionRequest(prompt, params, salt, b.path("stream").asBoolean(false));
    }

    public static WeightUpdateRequest weightUpdate(byte[] body) {
        JsonNode b = object(body);
        String version = b.path("version").asText(null);
        if (version == null || version.isEmpty()) {
            throw new IllegalArgumentException("version is required (names the new weights in keys and outputs)");
        }
        if (b.hasNonNull("path")) {
            return new WeightUpdateRequest(version, Path.of(b.get("path").asText()), null);
        }
        if (b.hasNonNull("seed")) {
            return new WeightUpdateRequest(version, null, b.get("seed").asLong());
        }
        throw new IllegalArgumentException("update_weights needs \"seed\" or \"path\"");
    }

    /** The body as a JSON object: empty means {@code {}}. */
    static JsonNode object(byte[] body) {
        if (body.length == 0) {
            return READER.createObjectNode();
        }
        JsonNode n;
        try {
            n = READER.readTree(body);
        } catch (com.fasterxml.jackson.core.JsonProcessingException err) {
            throw new IllegalArgumentException("the request body is not valid JSON: " + err.getOriginalMessage());
        } catch (IOException err) {
            throw new java.io.UncheckedIOException(err);
        }
        if (n == null || !n.isObject()) {
            throw new IllegalArgumentException("the request body must be a JSON object");
        }
        return n;
    }

    private static int[] prompt(JsonNode b) {
        JsonNode p = b.get("prompt");
        if (p == null || p.isNull()) {
            throw new IllegalArgumentException("prompt is required (a string or an array of token ids)");
        }
        if (p.isTextual()) {
            return TOKENIZER.encode(p.textValue(), true);
        }
        if (p.isArray()) {
            int[] t = new int[p.size()];
            for (int i = 0; i < t.length; i++) {
                JsonNode id = p.get(i);
                if (!id.canConvertToInt()) {
                    throw new IllegalArgumentException("prompt[" + i + "] is not a token id: " + shown(id));
                }
                t[i] = id.intValue();
            }
            return t;
        }
        throw new IllegalArgumentException("prompt must be a string or an array of token ids, got " + shown(p));
    }

    private static int intField(JsonNode b, String name, int dflt) {
        JsonNode n = b.get(name);
        if (n == null || n.isNull()) {
            return dflt;
        }
        if (!n.canConvertToInt()) {
            throw new IllegalArgumentException(name + " must be an integer, got " + shown(n));
        }
        return n.intValue();
    }

    private static double doubleField(JsonNode b, String name, double dflt) {
        JsonNode n = b.get(name);
        if (n == null || n.isNull()) {
            return dflt;
        }
        if (!n.isNumber()) {
            throw new IllegalArgumentException(name + " must be a number, got " + shown(n));
        }
        return n.doubleValue();
    }

    /** An optional string field: absent or null gives null; present, it must be a non-empty string. */
    private static String stringField(JsonNode b, String name, String meaning) {
        JsonNode n = b.get(name);
        if (n == null || n.isNull()) {
            return null;
        }
        if (!n.isTextual() || n.textValue().isEmpty()) {
            throw new IllegalArgumentException(name + " must be a non-empty string (" + meaning + "), got " + shown(n));
        }
        return n.textValue();
    }

    /** A bad value for an error message, cut short: a body can be megabytes. */
    private static String shown(JsonNode n) {
        String s = n.toString();
        return s.length() <= SHOWN_CHARS ? s : s.substring(0, SHOWN_CHARS) + "... (" + s.length() + " characters)";
    }
}
