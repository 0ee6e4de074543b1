package io.kvpool.connector;

/** What an engine does with a block whose load failed (vLLM's {@code kv_load_failure_policy}). */
public enum LoadFailurePolicy {
    /** Compute the block's tokens again, and everything after them: the output is still correct. */
    RECOMPUTE,
    /** Fail the request with an error naming the blocks; other requests are unaffected. */
    FAIL
}
