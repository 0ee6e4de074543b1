package io.kvpool.engine;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.prometheus.metrics.core.metrics.GaugeWithCallback;
import io.prometheus.metrics.core.metrics.Histogram;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import io.kvpool.web.Series;

import java.util.Arrays;
import java.util.concurrent.atomic.LongAdder;
import java.util.function.DoubleSupplier;

/**
 * The engine's counters and its time-to-first-token samples. Counters only grow; {@link #ttftQuantile}
 * reads the samples kept so far (the most recent {@value #MAX_SAMPLES}).
 */
public final class EngineMetrics {

    static final int MAX_SAMPLES = 1 << 20;

    final LongAdder promptTokens = new LongAdder();
    final LongAdder localHitTokens = new LongAdder();
    final LongAdder externalHitTokens = new LongAdder();
    final LongAdder computedTokens = new LongAdder();
    final LongAdder generatedTokens = new LongAdder();
    final LongAdder stepNanos = new LongAdder();
    final LongAdder loadFailures = new LongAdder();
    final LongAdder aborted = new LongAdder();
    final LongAdder prefixCacheResets = new LongAdder();
    final LongAdder weightUpdates = new LongAdder();
    final LongAdder finished = new LongAdder();
    @GuardedBy("this")
    private final long[] ttft = new long[MAX_SAMPLES];
    @GuardedBy("this")
    private long ttftCount;
    @GuardedBy("this")
    private long ttftSumNanos;
    private final PrometheusRegistry registry = new PrometheusRegistry();
    private final Histogram ttftHistogram = Histogram.builder().name("engine_time_to_first_token_seconds")
            .help("From a request's arrival to its first output token")
            .classicUpperBounds(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60).register(registry);

    synchronized void ttft(long nanos) {
        ttft[(int) (ttftCount++ % MAX_SAMPLES)] = nanos;
        ttftSumNanos += nanos;
        ttftHistogram.observe(nanos / 1e9);
    }

    /**
     * The Prometheus registry with the engine's series; {@code connector} supplies the connector's
     * counters (load and save bytes), {@code prefixCache} the local prefix cache's block counts.
     */
    PrometheusRegistry registry(java.util.function.Supplier<io.kvpool.connector.ConnectorStats> connector,
                                java.util.function.Supplier<long[]> prefixCache) {
        counter("engine_prompt_tokens_total", "Prompt tokens of admitted requests", promptTokens::sum);
        counter("engine_prefix_cache_hit_tokens_total", "Prompt tokens found in the local prefix cache",
                localHitTokens::sum);
        counter("engine_external_hit_tokens_total", "Prompt tokens loaded from the external cache (kvpool)",
                externalHitTokens::sum);
        counter("engine_computed_tokens_total", "Tokens run through the model (recomputation included)",
                computedTokens::sum);
        counter("engine_generated_tokens_total", "Output tokens", generatedTokens::sum);
        counter("engine_load_failures_total", "Request steps whose external loads failed", loadFailures::sum);
        counter("engine_aborted_requests_total", "Requests aborted", aborted::sum);
        counter("engine_weight_updates_total", "Weight updates", weightUpdates::sum);
        counter("engine_prefix_cache_resets_total", "Local prefix cache resets", prefixCacheResets::sum);
        counter("engine_kv_load_bytes_total", "KV bytes loaded from the external cache", () -> connector.get().loadedBytes());
        counter("engine_kv_save_bytes_total", "KV bytes saved to the external cache", () -> connector.get().savedBytes());
        counter("engine_kv_saves_dropped_total", "Saves dropped (planned before a reset or weight switch, or failed)",
                () -> connector.get().droppedSaves());
        GaugeWithCallback.builder().name("engine_prefix_cache_blocks").help("Blocks in the local prefix cache")
                .callback(cb -> cb.call(prefixCache.get()[0])).register(registry);
        return registry;
    }

    private void counter(String name, String help, DoubleSupplier value) {
        Series.counter(registry, name, help, value);
    }

    /** The q-quantile (0..1) of the TTFT samples, in nanoseconds; NaN without samples. */
    public synchronized double ttftQuantile(double q) {
        int n = (int) Math.min(ttftCount, MAX_SAMPLES);
        if (n == 0) {
            return Double.NaN;
        }
        long[] s = Arrays.copyOf(ttft, n);
        Arrays.sort(s);
        return s[(int) Math.min(n - 1, Math.max(0, Math.ceil(q * n) - 1))];
    }

    /** Requests that produced a first token so far, and the sum of their TTFTs in nanoseconds. */
    public synchronized long[] ttftTotals() {
        return new long[] {ttftCount, ttftSumNanos};
    }

    /** TTFT samples recorded so far (copies). */
    public synchronized long[] ttftSamples() {
        return Arrays.copyOf(ttft, (int) Math.min(ttftCount, MAX_SAMPLES));
    }

    public long promptTokens() {
        return promptTokens.sum();
    }

    public long localHitTokens() {
        return localHitTokens.sum();
    }

    public long externalHitTokens() {
        return externalHitTokens.sum();
    }

    /** Tokens run through the model (prefill chunks and decode tokens, recomputation included). */
    public long computedTokens() {
        return computedTokens.sum();
    }

    public long generatedTokens() {
        return generatedTokens.sum();
    }

    public long loadFailures() {
        return loadFailures.sum();
    }

    public long aborted() {
        return aborted.sum();
    }

    public long weightUpdates() {
        return weightUpdates.sum();
    }

    public long prefixCacheResets() {
        return prefixCacheResets.sum();
    }

    public long stepNanos() {
        return stepNanos.sum();
    }
}
