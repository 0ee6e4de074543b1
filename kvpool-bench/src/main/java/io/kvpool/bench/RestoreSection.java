package io.kvpool.bench;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.engine.llama.ModelConfig;
import me.tongfei.progressbar.ProgressBar;

import java.time.Duration;
import java.util.Locale;

/**
 * KV restore through the connector, in tokens per second: the reference engine's geometry (with
 * its prefill, the recompute it replaces, measured in the same run) and a Llama-3-8B-shaped one
 * (32 layers x 8 KV heads x 128 x K and V x bf16 = 128 KiB per token); and KV saved through the
 * connector at both ({@link SaveBench}), measured in slices alternating with the restore's so
 * that both see the same share of a noisy machine. {@code targetWarmup}: the untimed traffic before a geometry's
 * first restore and save slices (the store targets' own).
 */
record RestoreSection(Results results, ProgressBar bar, boolean quick, Duration targetWarmup) {

    /** Runs the section, adding its rows and ratios to {@code results}. */
    static void run(Results results, ProgressBar bar, boolean quick, Duration targetWarmup) throws Exception {
        new RestoreSection(results, bar, quick, targetWarmup).measure();
    }

    private void measure() throws Exception {
        ModelConfig ref = ModelConfig.defaults();
        int prompt = 2048;
        double seconds = quick ? 1 : 3;
        bar.setExtraMessage(" restore: prefill baseline");
        double prefill = RestoreBench.prefill(ref, prompt, quick ? 1 : 2);
        results.add(new Results.Row("restore", "engine", "prefill (recompute)", ref.kvBytesPerToken() * 16, 1, Double.NaN,
                prefill, Double.NaN, Double.NaN, String.format(Locale.ROOT,
                "%.0f tokens/s: the reference engine computing a %d-token prompt (%d layers, dim %d)", prefill, prompt,
                ref.nLayers(), ref.dim())));
        bar.step();
        try (PoolProcess pool = PoolProcess.start("3GiB", "1g");
             KvPoolClient c = KvPoolClient.connect(pool.masterAddress())) {
            restoreAndSave(c, pool, "reference", "engine geometry", ref.kvBytesPerToken(), ref.nLayers(), 8, 64, prompt, seconds);
            restoreAndSave(c, pool, "llama3-8b", "Llama-3-8B geometry", 128 * 1024, 32, 4, 8, prompt, seconds);
            layerTiming(c, pool, ref);
            bar.setExtraMessage(" save: putBatch alone");
            double raw = SaveBench.rawPutBatch(c, "llama3-8b", 128 * 1024, 4, prompt, seconds / 2);
            results.add(new Results.Row("restore", "kvpool", "putBatch llama3-8b", 128 * 1024 * 16, 1, raw / 1e9,
                    Double.NaN, Double.NaN, Double.NaN, "the save's blocks stored by the client alone: putBatch of "
                    + SaveBench.STEP_TOKENS / 16 + " blocks a call, one call at a time, no connector"));
            bar.step();
        }
        results.ratioOps("KV restore vs prefill (reference engine, 2048-token prompts)",
                results.find("restore", "kvpool", "restore reference", ref.kvBytesPerToken() * 16, 1),
                results.find("restore", "engine", "prefill (recompute)", ref.kvBytesPerToken() * 16, 1), 1.0, "tokens/s");
        results.ratioOps("KV save vs restore, reference engine geometry",
                results.find("restore", "kvpool", "save reference", ref.kvBytesPerToken() * 16, 1),
                results.find("restore", "kvpool", "restore reference", ref.kvBytesPerToken() * 16, 1), 0.5, "tokens/s");
        results.ratioOps("KV save vs restore, Llama-3-8B geometry",
                results.find("restore", "kvpool", "save llama3-8b", 128 * 1024 * 16, 1),
                results.find("restore", "kvpool", "restore llama3-8b", 128 * 1024 * 16, 1), 0.5, "tokens/s");
    }

    /**
     * Whole blocks against layer by layer ({@link LayerTimingBench}): when layer 0 and when every layer
     * of a step's loads is in, at both geometries, and the reference engine's time to first token.
     */
    private void layerTiming(KvPoolClient c, PoolProcess pool, ModelConfig ref) throws Exception {
        // even: each mode goes first in half of the rounds (LayerTimingBench.order)
        int rounds = quick ? 4 : 6;
        int ttftRounds = quick ? 6 : 10;
        for (Object[] g : new Object[][]{{"reference", ref.kvBytesPerToken(), ref.nLayers(), 8},
                {"llama3-8b", 128L * 1024, 32, 2}}) {
            bar.setExtraMessage(" layers: loads, " + g[0]);
            LayerTimingBench.loadRows(c, pool, (String) g[0], (Long) g[1], (Integer) g[2], (Integer) g[3], rounds)
                    .forEach(results::add);
            bar.step();
        }
        bar.setExtraMessage(" layers: time to first token");
        LayerTimingBench.ttftRows(c, ref, quick ? 4 : 8, 16, ttftRounds, "").forEach(results::add);
        bar.step();
        // one new token, every KV byte over TCP: a layer's compute about as long as its load, where overlapping should
        // pay (on this 2-vCPU machine it does not: the loads take the CPUs the compute needs; docs/benchmarks.md)
        bar.setExtraMessage(" layers: time to first token, one new token over TCP");
        try (KvPoolClient tcp = KvPoolClient.connect(ClientConfig.forMaster(pool.masterAddress()).withSharedMemory(false))) {
            LayerTimingBench.ttftRows(tcp, ref, quick ? 4 : 8, 1, ttftRounds, " tcp").forEach(results::add);
        }
        bar.step();
    }

    /** Restore and save slices, alternating. */
    private static final int RESTORE_SLICES = 3;

    /**
     * Restore and save slices of one geometry, alternating; before the first of each, the same untimed traffic every
     * store target gets ({@code Bench.targetWarmup}). Both paths run in this JVM and are compiled only after seconds of
     * traffic: with one second of warm-up a quick run's slices (a third of a second each) measured the save at 2.4 to
     * 2.6M tokens/s where it ran 4.4 to 5.5M a few seconds later, and the restore at 4.5 to 5.2M where it ran 5.1 to
     * 6.9M (docs/benchmarks.md, 2026-11-30).
     */
    private void restoreAndSave(KvPoolClient c, PoolProcess pool, String geometry, String label, long bytesPerToken,
                                int layers, int restorePrompts, int savePrompts, int prompt, double seconds) {
        RestoreBench.Result restored = null;
        SaveBench.Result saved = null;
        try (SaveBench engine = new SaveBench(c, geometry, bytesPerToken, layers, prompt)) {
            for (int i = 0; i < RESTORE_SLICES; i++) {
                bar.setExtraMessage(" restore: " + label);
                double warmUp = i == 0 ? targetWarmup.toMillis() / 1e3 : 0;
                RestoreBench.Result r = RestoreBench.restore(c, pool, geometry, bytesPerToken, restorePrompts, prompt,
                        seconds / RESTORE_SLICES, warmUp);
                restored = restored == null ? r : restored.plus(r);
                bar.setExtraMessage(" save: " + label);
                SaveBench.Result s = engine.save(savePrompts, seconds / RESTORE_SLICES, warmUp);
                saved = saved == null ? s : saved.plus(s);
            }
        }
        results.add(row(restored));
        bar.step();
        results.add(saveRow(saved, restored));
        bar.step();
    }

    private Results.Row saveRow(SaveBench.Result r, RestoreBench.Result restore) {
        String store = results.find("store", "kvpool-shm", "put x" + Bench.PUT_BATCH, 1 << 20, 1)
                .map(s -> String.format(Locale.ROOT, "; store section's same-machine 1 MiB put x%d, 1 client: %.2f GB/s",
                        Bench.PUT_BATCH, s.gbPerSec())).orElse("");
        return new Results.Row("restore", "kvpool", "save " + r.geometry(), r.bytesPerToken() * r.blockSize(), 1,
                r.gbPerSecond(), r.tokensPerSecond(), Double.NaN, Double.NaN, String.format(Locale.ROOT,
                "%.0f tokens/s (%.2fx restore), %d-token prompts through PoolConnector (%d-token steps, engine cache of"
                        + " %d prompts), %d prompts in %d rounds, every block checked present (skipped %d, dropped %d)%s",
                r.tokensPerSecond(), r.tokensPerSecond() / restore.tokensPerSecond(), r.promptTokens(),
                SaveBench.STEP_TOKENS, r.cachePrompts(), r.promptsSaved(), r.rounds(), r.skipped(), r.dropped(), store));
    }

    private static Results.Row row(RestoreBench.Result r) {
        return new Results.Row("restore", "kvpool", "restore " + r.geometry(), r.bytesPerToken() * r.blockSize(), 1,
                r.gbPerSecond(), r.tokensPerSecond(), Double.NaN, Double.NaN, String.format(Locale.ROOT,
                "%.0f tokens/s, %d KiB of KV per token, blocks of %d tokens; prefixMatch + getIntoBatch of %d-token"
                        + " prompts into a paged cache", r.tokensPerSecond(), r.bytesPerToken() / 1024, r.blockSize(),
                r.promptTokens()));
    }
}
