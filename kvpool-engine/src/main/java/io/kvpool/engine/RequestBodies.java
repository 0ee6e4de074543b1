package io.kvpool.engine;

import com.fasterxml.jackson.core.ErrorReportConfiguration;
import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.core.StreamReadFeature;
import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.ObjectReader;
import io.kvpool.engine.llama.ByteTokenizer;

import java.io.IOException;
import java.nio.file.InvalidPathException;
import java.nio.file.Path;

/**
 * The JSON bodies of the engine's HTTP API, parsed apart from the exchange so that a test (and a
 * fuzzer, {@code RequestBodiesFuzzTest}) can drive them with any bytes.
 *
 * <p>Contract: whatever the bytes, a parse returns a request whose fields are all valid by themselves
 * (the checks that need the model, such as token ids inside the vocabulary and the context length,
 * stay with {@link Engine#generate}), or throws an {@link IllegalArgumentException} whose message
 * names the field that was wrong, which {@link EngineServer} answers 400. No other exception escapes.
 *
 * <p>Strictness: a body is one JSON object (an empty body counts as {@code {}}); content after it and
 * a field given twice are refused rather than silently resolved; a field of the wrong type is
 * refused rather than coerced ({@code "seed": "7"} or {@code "max_tokens": 2.5} is an error, not 7
 * or 2, and {@code "stream": "yes"} is not false). Unknown fields are ignored, as OpenAI-style
 * servers do. Jackson's stream limits (nesting depth 1,000, numbers of 1,000 digits) bound the work a
 * body can cause, and its messages quote at most {@value #QUOTED_TOKEN_CHARS} characters of it; the
 * server bounds the body's size before this runs.
 */
public final class RequestBodies {

    /** Jackson quotes at most this much of a bad token in its messages (its default: 256 characters). */
    private static final int QUOTED_TOKEN_CHARS = 40;
    private static final ObjectReader READER = new ObjectMapper(JsonFactory.builder()
            .errorReportConfiguration(ErrorReportConfiguration.builder().maxErrorTokenLength(QUOTED_TOKEN_CHARS)
                    .maxRawContentLength(QUOTED_TOKEN_CHARS).build())
            .enable(StreamReadFeature.STRICT_DUPLICATE_DETECTION)
            .build())
            .enable(DeserializationFeature.FAIL_ON_TRAILING_TOKENS)
            .reader();
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
        return new CompletionRequest(prompt, params, salt, booleanField(b, "stream", false));
    }

    public static WeightUpdateRequest weightUpdate(byte[] body) {
        JsonNode b = object(body);
        String version = stringField(b, "version", "names the new weights in keys and outputs");
        if (version == null) {
            throw new IllegalArgumentException("version is required (names the new weights in keys and outputs)");
        }
        String path = stringField(b, "path", "a directory of weights");
        if (path != null) {
            try {
                return new WeightUpdateRequest(version, Path.of(path), null);
            } catch (InvalidPathException err) {
                throw new IllegalArgumentException("path is not a valid path (" + err.getReason() + "), got "
                        + shown(b.get("path")));
            }
        }
        JsonNode seed = b.get("seed");
        if (seed != null && !seed.isNull()) {
            if (!seed.isIntegralNumber() || !seed.canConvertToLong()) {
                throw new IllegalArgumentException("seed must be a 64-bit integer, got " + shown(seed));
            }
            return new WeightUpdateRequest(version, null, seed.longValue());
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
        } catch (JsonProcessingException err) {
            throw new IllegalArgumentException("the request body is not valid JSON: " + err.getOriginalMessage());
        } catch (IOException err) {
            // CharConversionException: bytes that are not text in the encoding Jackson detected (UTF-32
            // when the body starts with zero bytes); no other IOException comes from reading a byte array
            throw new IllegalArgumentException("the request body is not valid JSON: " + err.getMessage());
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
                if (!id.isIntegralNumber() || !id.canConvertToInt()) {
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
        if (!n.isIntegralNumber()) {
            throw new IllegalArgumentException(name + " must be an integer, got " + shown(n));
        }
        if (!n.canConvertToInt()) {
            throw new IllegalArgumentException(name + " must be at most " + Integer.MAX_VALUE + " (and at least "
                    + Integer.MIN_VALUE + "), got " + shown(n));
        }
        return n.intValue();
    }

    private static double doubleField(JsonNode b, String name, double dflt) {
        JsonNode n = b.get(name);
        if (n == null || n.isNull()) {
            return dflt;
        }
        if (!n.isNumber() || !Double.isFinite(n.doubleValue())) {
            throw new IllegalArgumentException(name + " must be a finite number, got " + shown(n));
        }
        return n.doubleValue();
    }

    private static boolean booleanField(JsonNode b, String name, boolean dflt) {
        JsonNode n = b.get(name);
        if (n == null || n.isNull()) {
            return dflt;
        }
        if (!n.isBoolean()) {
            throw new IllegalArgumentException(name + " must be true or false, got " + shown(n));
        }
        return n.booleanValue();
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
