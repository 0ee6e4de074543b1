package io.kvpool.connector;

import java.util.List;
import java.util.Objects;

/**
 * A request as a connector sees it: its id, its tokens so far (prompt, then generated ones) and the
 * extra keys that make its KV differ for the same tokens (a cache salt, a LoRA adapter; null for
 * none). {@code tokens} may be a growing buffer: only the first {@code numTokens} count.
 */
public record ConnectorRequest(String id, int[] tokens, int numTokens, List<?> extraKeys) {

    public ConnectorRequest {
        Objects.requireNonNull(id, "request id");
        Objects.requireNonNull(tokens, "tokens");
        if (numTokens < 0 || numTokens > tokens.length) {
            throw new IllegalArgumentException("request " + id + ": numTokens " + numTokens + " outside 0.."
                    + tokens.length);
        }
    }

    public ConnectorRequest(String id, int[] tokens) {
        this(id, tokens, tokens.length, null);
    }
}
