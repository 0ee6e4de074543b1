package io.kvpool.engine;

/**
 * A finished request.
 *
 * @param finishReason     why it ended (see {@link FinishReason}; {@code ERROR}: see {@code error})
 * @param weightsVersion   the weights every token of this output was computed with
 * @param localHitTokens   prompt tokens found in the engine's own prefix cache
 * @param externalHitTokens prompt tokens loaded from the external cache (the pool); blocks whose
 *                         load failed are not counted (they were computed instead)
 * @param recomputedTokens tokens computed in steps whose loads failed: work thrown away and redone
 * @param ttftNanos        from arrival to the first output token
 * @param firstLogits      the logits the first output token was chosen from
 * @param logitsDigest     a CRC-32C over the raw bits of every logits vector a token was chosen from:
 *                         two runs with equal digests computed bit-identical logits throughout
 */
public record Completion(String requestId, int[] promptTokens, int[] outputTokens, FinishReason finishReason, String error,
                         String weightsVersion, int localHitTokens, int externalHitTokens, int recomputedTokens,
                         long ttftNanos, long totalNanos, float[] firstLogits, long logitsDigest) {

    public boolean ok() {
        return error == null && finishReason != FinishReason.ABORT;
    }
}
