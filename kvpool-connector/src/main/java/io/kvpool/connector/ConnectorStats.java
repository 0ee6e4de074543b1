package io.kvpool.connector;

/**
 * A connector's counters (they only grow).
 *
 * @param lookups          {@code getNumNewMatchedTokens} calls
 * @param matchedTokens    tokens those calls said the cache could supply
 * @param loadedBlocks     blocks loaded into the engine
 * @param loadedBytes      bytes of those blocks
 * @param failedLoads      blocks whose load failed (reported to the engine)
 * @param savedBlocks      blocks stored
 * @param savedBytes       bytes of those blocks
 * @param skippedSaves     blocks not stored because the cache already held them, or it was full
 * @param droppedSaves     saves planned but never stored: a reset or weight switch in between, a fenced
 *                         or failed put, or blocks computed over a failed load
 * @param resets           successful resets
 */
public record ConnectorStats(long lookups, long matchedTokens, long loadedBlocks, long loadedBytes, long failedLoads,
                             long savedBlocks, long savedBytes, long skippedSaves, long droppedSaves, long resets) {

    public static final ConnectorStats ZERO = new ConnectorStats(0, 0, 0, 0, 0, 0, 0, 0, 0, 0);

    public ConnectorStats plus(ConnectorStats o) {
        return new ConnectorStats(lookups + o.lookups, matchedTokens + o.matchedTokens, loadedBlocks + o.loadedBlocks,
                loadedBytes + o.loadedBytes, failedLoads + o.failedLoads, savedBlocks + o.savedBlocks,
                savedBytes + o.savedBytes, skippedSaves + o.skippedSaves, droppedSaves + o.droppedSaves,
                resets + o.resets);
    }
}
