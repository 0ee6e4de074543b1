package io.kvpool.connector;

import java.util.ArrayList;
import java.util.List;
import java.util.Objects;

/**
 * A request as a connector sees it: its id, its tokens so far (prompt, then generated ones), the
 * extra keys that make its KV differ for the same tokens (a LoRA adapter, multimodal inputs; null
 * for none) and its cache salt (null for none). {@code tokens} may be a growing buffer: only the
 * first {@code numTokens} count.
 *
 * <p>The cache salt is vLLM's per-request {@code cache_salt}: it joins the extra keys of the first
 * block only ({@link #extraKeysFor}), so every block hash of the request differs from those of the
 * same tokens unsalted (block i's hash covers block 0's) and the request shares KV only with
 * requests carrying the same salt.
 */
public record ConnectorRequest(String id, int[] tokens, int numTokens, List<?> extraKeys, String cacheSalt) {

    public ConnectorRequest {
        Objects.requireNonNull(id, "request id");
        Objects.requireNonNull(tokens, "tokens");
        if (numTokens < 0 || numTokens > tokens.length) {
            throw new IllegalArgumentException("request " + id + ": numTokens " + numTokens + " outside 0.."
                    + tokens.length);
        }
        if (cacheSalt != null && cacheSalt.isEmpty()) {
            throw new IllegalArgumentException("request " + id + ": cache_salt must not be empty (null for none)");
        }
    }

    public ConnectorRequest(String id, int[] tokens, int numTokens, List<?> extraKeys) {
        this(id, tokens, numTokens, extraKeys, null);
    }

    public ConnectorRequest(String id, int[] tokens) {
        this(id, tokens, tokens.length, null, null);
    }

    /**
     * The extra keys hashed with block {@code block}: the request's extra keys, plus the cache salt
     * appended for block 0 only (vLLM's {@code generate_block_hash_extra_keys}); null when there are
     * none.
     */
    public List<?> extraKeysFor(int block) {
        return extraKeysFor(extraKeys, cacheSalt, block);
    }

    /** {@link #extraKeysFor(int)} for any extra keys and salt, for engines hashing their own blocks. */
    public static List<?> extraKeysFor(List<?> extraKeys, String cacheSalt, int block) {
        if (cacheSalt == null || block != 0) {
            return extraKeys == null || extraKeys.isEmpty() ? null : extraKeys;
        }
        List<Object> keys = new ArrayList<>(extraKeys == null ? 1 : extraKeys.size() + 1);
        if (extraKeys != null) {
            keys.addAll(extraKeys);
        }
        keys.add(cacheSalt);
        return keys;
    }
}
