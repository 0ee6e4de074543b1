package io.kvpool.engine;

import com.code_intelligence.jazzer.junit.FuzzTest;

import java.util.Arrays;

/**
 * Fuzz target for the engine's HTTP JSON bodies (Jazzer): whatever bytes a client POSTs to
 * {@code /v1/completions} or {@code /update_weights}, {@link RequestBodies} returns a request whose
 * fields are valid, or refuses with a plain {@link IllegalArgumentException} carrying a short message
 * (the server answers it 400). Anything else is a finding: another exception (even a subclass such as
 * NumberFormatException, whose message would not name the field), a request with an invalid field, a
 * message that echoes the whole body, or a hang. The input's first byte picks the endpoint (even:
 * completions, odd: weight update); the rest is the body. Seeds, in
 * {@code src/test/resources/io/kvpool/engine/RequestBodiesFuzzTestInputs/}, are the bodies the
 * trainer, the Python tests and EngineServerTest send.
 */
class RequestBodiesFuzzTest {

    /** Longer refusals quote too much of the body. */
    private static final int MAX_MESSAGE_CHARS = 300;

    @FuzzTest(maxDuration = "10m")
    void anyBodyIsARequestOrARefusalNamingTheField(byte[] data) {
        if (data.length == 0) {
            return;
        }
        byte[] body = Arrays.copyOfRange(data, 1, data.length);
        boolean completion = (data[0] & 1) == 0;
        try {
            if (completion) {
                check(RequestBodies.completion(body));
            } else {
                check(RequestBodies.weightUpdate(body));
            }
        } catch (IllegalArgumentException refused) {
            String m = refused.getMessage();
            if (refused.getClass() != IllegalArgumentException.class || m == null || m.isBlank()
                    || m.length() > MAX_MESSAGE_CHARS) {
                throw new AssertionError("a refusal that is not a short IllegalArgumentException for "
                        + (completion ? "completions" : "update_weights"), refused);
            }
        }
    }

    private static void check(RequestBodies.CompletionRequest r) {
        SamplingParams p = r.params();
        if (r.prompt() == null || p == null || p.maxTokens() < 1 || !Double.isFinite(p.temperature())
                || p.temperature() < 0 || !(p.topP() > 0 && p.topP() <= 1)
                || (r.cacheSalt() != null && r.cacheSalt().isEmpty())) {
            throw new AssertionError("an invalid completion request: " + r);
        }
    }

    private static void check(RequestBodies.WeightUpdateRequest r) {
        if (r.version() == null || r.version().isEmpty() || (r.path() == null) == (r.seed() == null)) {
            throw new AssertionError("an invalid weight update: " + r);
        }
    }
}
