package io.kvpool.connector;

/**
 * The engine's measured prefill cost, nanoseconds a token, from the steps it computed without loads: what
 * recomputing a number of tokens would cost, so that a load that would take longer can be given up on.
 *
 * <p>A step is timed from {@code startLoadKv} to its last layer's save call (the forward pass and nothing of the
 * engine's idle time between steps); steps with loads are left out, since their time includes the waits. The
 * estimate is an exponentially weighted average over steps (weight 1/8 a step, by tokens: a step of 8 tokens
 * counts less than a prefill of 2,000), unknown until {@link #MIN_TOKENS} tokens were timed. Engine thread only.
 */
final class PrefillRate {

    /** Tokens timed before the estimate is used. */
    static final int MIN_TOKENS = 256;
    /** The shortest deadline given: a load of a block or two still gets time for one round trip. */
    static final long FLOOR_NANOS = 1_000_000L;

    private double nanosPerToken = Double.NaN;
    private long timedTokens;

    /** One step of {@code tokens} tokens took {@code nanos}. */
    void observe(long tokens, long nanos) {
        if (tokens <= 0 || nanos <= 0) {
            return;
        }
        double perToken = (double) nanos / tokens;
        double w = Math.min(1.0, tokens / 2048.0) / 8 + 1.0 / 64;
        nanosPerToken = Double.isNaN(nanosPerToken) ? perToken : nanosPerToken + w * (perToken - nanosPerToken);
        timedTokens += tokens;
    }

    /** How long recomputing {@code tokens} tokens would take, times {@code factor}; -1 while unknown. */
    long deadlineNanos(long tokens, double factor) {
        if (timedTokens < MIN_TOKENS || Double.isNaN(nanosPerToken)) {
            return -1;
        }
        return Math.max(FLOOR_NANOS, (long) (tokens * nanosPerToken * factor));
    }

    /** The estimate, nanoseconds a token (NaN while unknown). */
    double nanosPerToken() {
        return timedTokens < MIN_TOKENS ? Double.NaN : nanosPerToken;
    }
}
