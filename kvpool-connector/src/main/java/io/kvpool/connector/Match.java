package io.kvpool.connector;

/**
 * How many tokens past those already computed an external cache can supply for a request
 * ({@code tokens}, a multiple of the block size minus what the engine has), and whether it loads
 * them asynchronously across steps ({@code async}; kvpool's loads complete within the step).
 */
public record Match(int tokens, boolean async) {

    public static final Match NONE = new Match(0, false);

    public Match {
        if (tokens < 0) {
            throw new IllegalArgumentException("matched tokens must not be negative, got " + tokens);
        }
    }
}
