package io.kvpool.connector;

import java.util.concurrent.CompletableFuture;

/**
 * A connector whose keys carry the weight version (remedy 2 of the weight-update hazard): switching
 * the version makes all older KV unreachable at once; with {@code reclaim} the old version's objects
 * are removed in the background (the future gives how many).
 */
public interface VersionedKeys {

    CompletableFuture<Long> switchWeights(String weightsVersion, boolean reclaim);
}
