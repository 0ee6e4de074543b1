package io.kvpool.engine;

/**
 * How a request's tokens are chosen: greedy when {@code temperature} is 0, else sampled from the
 * softmax at that temperature restricted to the top-p mass, from a generator seeded with {@code seed}
 * (so a request's output depends only on its prompt, the weights and these parameters).
 */
public record SamplingParams(int maxTokens, double temperature, double topP, long seed, boolean stopAtEos) {

    public SamplingParams {
        if (maxTokens < 1) {
            throw new IllegalArgumentException("max_tokens must be at least 1, got " + maxTokens);
        }
        if (!(temperature >= 0 && Double.isFinite(temperature))) {
            throw new IllegalArgumentException("temperature must be a finite number >= 0, got " + temperature);
        }
        if (!(topP > 0 && topP <= 1)) {
            throw new IllegalArgumentException("top_p must be in (0, 1], got " + topP);
        }
    }

    public static SamplingParams greedy(int maxTokens) {
        return new SamplingParams(maxTokens, 0, 1, 0, true);
    }
}
