package io.kvpool.engine;

import io.kvpool.connector.ConnectorStats;
import io.kvpool.web.History;
import io.kvpool.web.StatusView;
import io.kvpool.web.Unit;


/**
 * The engine's summary page ({@code http://ENGINE:8000/}): time to first token, how much of the
 * prompts the local prefix cache and the pool served, KV loads and saves, and the weights it runs,
 * with charts of the last minutes. Read when asked, but for the history's one sample a second.
 *
 * <p>Card ids: {@code ttft_p50}, {@code ttft_p90}, {@code in_flight}, {@code state}, {@code weights},
 * {@code local_hit_rate}, {@code external_hit_rate}, {@code kv_loaded}, {@code kv_saved},
 * {@code saves_dropped}, {@code prefix_cache_blocks}.
 */
final class EngineStatus {

    private final Engine engine;
    private final long startMillis = System.currentTimeMillis();
    final History history;
    // the previous sample's TTFT totals, for the mean over each interval (only the sampler reads it)
    private long lastTtftCount;
    private long lastTtftNanos;

    EngineStatus(Engine engine) {
        this.engine = engine;
        EngineMetrics m = engine.metrics();
        this.history = History.builder()
                .chart("ttft", "Mean time to first token", Unit.SECONDS)
                .gauge("ttft_mean", "requests in the last second", this::intervalMeanTtft)
                .chart("tokens", "Prompt tokens per second", Unit.PER_SECOND)
                .rate("prompt", "prompt", m::promptTokens)
                .rate("local_hits", "local prefix cache", m::localHitTokens)
                .rate("external_hits", "kvpool", m::externalHitTokens)
                .rate("generated", "generated", m::generatedTokens)
                .chart("kv", "KV traffic with the pool", Unit.BYTES_PER_SECOND)
                .rate("loaded", "loaded", () -> engine.connectorStats().loadedBytes())
                .rate("saved", "saved", () -> engine.connectorStats().savedBytes())
                .build();
    }

    /** The mean TTFT of the requests that got their first token since the previous call; NaN if none did. */
    private double intervalMeanTtft() {
        long[] t = engine.metrics().ttftTotals();
        long n = t[0] - lastTtftCount;
        long nanos = t[1] - lastTtftNanos;
        lastTtftCount = t[0];
        lastTtftNanos = t[1];
        return n <= 0 ? Double.NaN : nanos / 1e9 / n;
    }

    StatusView view(String address) {
        EngineMetrics m = engine.metrics();
        ConnectorStats c = engine.connectorStats();
        StatusView v = new StatusView("engine", "kvpool reference engine", System.currentTimeMillis())
                .subtitle(address + " · model " + engine.config().modelName() + " · "
                        + StatusView.upSince(startMillis));
        v.card("ttft_p50", "TTFT p50", m.ttftQuantile(0.5) / 1e9, Unit.SECONDS, m.ttftTotals()[0] + " requests");
        v.card("ttft_p90", "TTFT p90", m.ttftQuantile(0.9) / 1e9, Unit.SECONDS);
        v.card("in_flight", "Requests in flight", engine.inFlight(), Unit.COUNT);
        v.card("state", "State", engine.isPaused() ? "paused" : "serving", m.weightUpdates() + " weight updates");
        v.card("weights", "Weights", engine.weightsVersion(), null);
        long prompt = m.promptTokens();
        v.card("local_hit_rate", "Local cache hits", prompt == 0 ? Double.NaN : (double) m.localHitTokens() / prompt,
                Unit.RATIO, "of " + prompt + " prompt tokens");
        v.card("external_hit_rate", "kvpool hits", prompt == 0 ? Double.NaN : (double) m.externalHitTokens() / prompt,
                Unit.RATIO, engine.connector() == null ? "no external cache configured" : "of prompt tokens");
        v.card("kv_loaded", "KV loaded", c.loadedBytes(), Unit.BYTES, c.loadedBlocks() + " blocks, " + c.failedLoads()
                + " failed");
        v.card("kv_saved", "KV saved", c.savedBytes(), Unit.BYTES, c.savedBlocks() + " blocks, " + c.skippedSaves()
                + " already there");
        v.card("saves_dropped", "Saves dropped", c.droppedSaves(), Unit.COUNT, "planned before a reset, or failed");
        v.card("prefix_cache_blocks", "Prefix cache blocks", engine.prefixCacheStats()[0], Unit.COUNT,
                m.prefixCacheResets() + " resets");
        v.link("metrics", "metrics");
        return v;
    }
}
