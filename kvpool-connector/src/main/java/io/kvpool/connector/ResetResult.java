package io.kvpool.connector;

/**
 * The outcome of {@link KvConnector#resetCache()}: whether the external cache is now empty of
 * everything saved before, how many objects were removed, and why not if it failed.
 */
public record ResetResult(boolean success, long removed, String message) {

    public static ResetResult ok(long removed) {
        return new ResetResult(true, removed, "");
    }

    public static ResetResult failed(String message) {
        return new ResetResult(false, 0, message);
    }
}
