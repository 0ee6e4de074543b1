package io.kvpool.connector;

import java.util.List;
import java.util.Set;

/**
 * What an engine calls to use an external KV cache, in the shape of vLLM's v1 KV connector, so that
 * people who know that contract know this one. One object serves both sides (an engine here is one
 * process); the methods are grouped by the side that calls them.
 *
 * <h2>A step</h2>
 * <pre>
 *   scheduler                                   worker (forward pass)
 *   ---------                                   ---------------------
 *   for each waiting request:
 *     m = getNumNewMatchedTokens(r, computed)   (no side effects: a lookup only)
 *     allocate blocks for computed + m + new
 *     updateStateAfterAlloc(r, blocks, m)
 *   meta = buildConnectorMeta(scheduled)  ----> startLoadKv(meta, kv)
 *                                               for each layer l:
 *                                                 waitForLayerLoad(l)
 *                                                 compute layer l
 *                                                 saveKvLayer(l, kv)
 *                                               waitForSave()  (only where buffers are reused at once)
 *                                               blockIdsWithLoadErrors()  -> recompute or fail
 *   on preemption, before reusing blocks:       waitForRequestSaves(ids)
 *   on finish: requestFinished(r, blocks)       getFinished(ids): whose saves are done
 *     true: keep the blocks until getFinished
 *     reports the request
 *   weight update: resetCache()
 * </pre>
 *
 * <h2>Correctness contract</h2>
 * <ul>
 *   <li>A load fills a block with exactly the bytes saved under its key, or reports the block in
 *       {@link #blockIdsWithLoadErrors()}; it never leaves a block half-filled without reporting it.</li>
 *   <li>After {@link #resetCache()} returns success, no lookup finds anything saved before it, and
 *       no save planned or started before it lands after it; tokens the engine was offered or
 *       accepted before it come back as load errors, never as blocks left unfilled.</li>
 *   <li>A save never stores a block computed over a failed load (its KV depends on the failed
 *       block's).</li>
 * </ul>
 * The scenarios both Java connectors and the Python one run are in the contract vectors
 * ({@code kvpool-connector/src/test/resources/connector-contract-vectors.json}; docs/architecture.md).
 * Misses, failures and back-pressure are values (a zero match, an error set, a failed
 * {@link ResetResult}), not exceptions; exceptions mean misuse.
 */
public interface KvConnector extends AutoCloseable {

    // ---------------------------------------------------------------- scheduler side

    /**
     * How many tokens past {@code numComputedTokens} (what the engine has locally) this cache can
     * supply for {@code request}: whole blocks only. Has no side effects (a probe: it does not
     * refresh anything's eviction order and plans nothing).
     */
    Match getNumNewMatchedTokens(ConnectorRequest request, int numComputedTokens);

    /**
     * The engine allocated {@code blockIds} (the request's whole block table) and will take
     * {@code numExternalTokens} tokens from this cache (0 if it decided not to): plan their loads.
     */
    void updateStateAfterAlloc(ConnectorRequest request, int[] blockIds, int numExternalTokens);

    /** This step's work: the loads planned since the last call, and saves of blocks that fill this step. */
    ConnectorMeta buildConnectorMeta(List<ScheduledRequest> scheduled);

    /**
     * The request is done. True if saves of its blocks are still in flight: the engine must keep
     * those blocks until {@link #getFinished} reports the request.
     */
    boolean requestFinished(ConnectorRequest request, int[] blockIds);

    /** Drops everything this cache holds for this engine's keys (a weight update); see the contract above. */
    ResetResult resetCache();

    // ---------------------------------------------------------------- worker side

    /** Starts the step's loads into {@code kv}. */
    void startLoadKv(ConnectorMeta meta, PagedKv kv);

    /** Returns once layer {@code layer}'s KV of the step's loads is in place (or has failed). */
    void waitForLayerLoad(int layer);

    /** Layer {@code layer} of the step was computed; after the last layer the step's saves start. */
    void saveKvLayer(int layer, PagedKv kv);

    /** Waits for every save started so far. */
    void waitForSave();

    /**
     * Returns once no save of these requests is queued or running: the engine preempted them and is
     * about to reuse their blocks (vLLM's {@code handle_preemptions}).
     */
    default void waitForRequestSaves(Set<String> requestIds) {
        waitForSave();
    }

    /**
     * Of the requests finished so far, those whose saves have all completed since the last call (the
     * engine may now free their blocks). {@code finishedRequestIds}: requests that finished this step.
     */
    Set<String> getFinished(Set<String> finishedRequestIds);

    /** Blocks whose load in the last step failed (their contents are undefined); the set is then cleared. */
    Set<Integer> blockIdsWithLoadErrors();

    /** Counters for metrics. */
    ConnectorStats stats();

    /**
     * Blocks whose saves are queued or running now (a gauge: what a pause or a reset finds in flight).
     * 0 for a connector whose saves finish within the step.
     */
    default int savesInFlight() {
        return 0;
    }

    @Override
    void close();
}
