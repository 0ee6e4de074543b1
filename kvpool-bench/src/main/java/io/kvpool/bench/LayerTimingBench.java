package io.kvpool.bench;

import io.kvpool.client.KvPoolClient;
import io.kvpool.connector.ConnectorMeta;
import io.kvpool.connector.ConnectorRequest;
import io.kvpool.connector.Match;
import io.kvpool.connector.PagedKv;
import io.kvpool.connector.PoolConnector;
import io.kvpool.connector.PoolConnector.Granularity;
import io.kvpool.connector.hash.BlockHasher;
import io.kvpool.connector.hash.KeyFormat;
import io.kvpool.engine.Completion;
import io.kvpool.engine.Engine;
import io.kvpool.engine.EngineConfig;
import io.kvpool.engine.SamplingParams;
import io.kvpool.engine.llama.ModelConfig;
import io.kvpool.engine.llama.Weights;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.EnumMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.SplittableRandom;

/**
 * Whole blocks against layer by layer (issue 26), measured interleaved in one run:
 * <ul>
 *   <li>{@link #loads}: for stored prompts of a geometry, the time from a step's {@code startLoadKv} until
 *       layer 0 is in (when the engine may start computing) and until every layer is in, per mode.
 *       Whole blocks: both are the whole load. Layer by layer: the first is one layer's reads.</li>
 *   <li>{@link #ttft}: the reference engine's time to first token for a prompt whose first
 *       {@code cached} tokens are in the pool and whose last block is new, per mode: the loads and the
 *       model's compute together, with layer l+1 arriving while layer l computes in layer mode.</li>
 * </ul>
 * Rounds alternate the order of the modes (whole blocks first, then layer by layer first, ...), so a drift of
 * the machine, and whatever one mode's run leaves behind for the next, hits both alike.
 */
final class LayerTimingBench {

    private LayerTimingBench() {
    }

    /** Medians, in microseconds, per mode: until layer 0 is in, and until every layer is in. */
    record Loads(String geometry, int layers, int blocks, Map<Granularity, double[]> micros) {
    }

    /** Median time to first token per mode, in milliseconds, and the prompt it was measured on. */
    record Ttft(int cachedTokens, int newTokens, Map<Granularity, Double> millis) {
    }

    static Loads loads(KvPoolClient client, PoolProcess pool, String geometry, long bytesPerToken, int layers,
                       int prompts, int promptTokens, int rounds) {
        try (RestoreBench.Stored s = RestoreBench.store(client, geometry, bytesPerToken, prompts, promptTokens)) {
            int bs = s.hasher.blockSize();
            int blocks = s.blocks();
            PagedKv kv = RestoreBench.contiguous(s.cache(), bs, layers, s.blockBytes());
            int[] table = new int[blocks];
            for (int i = 0; i < blocks; i++) {
                table[i] = i;
            }
            Map<Granularity, List<long[]>> got = new EnumMap<>(Granularity.class);
            int req = 0;
            for (int r = 0; r < rounds; r++) {
                for (Granularity g : order(r)) {
                    try (PoolConnector conn = new PoolConnector(client, s.hasher, s.keys, PoolConnector.ResetScope.MODEL, g)) {
                        for (int p = 0; p < s.prompts.size(); p++) {
                            ConnectorRequest request = new ConnectorRequest("t" + req++, s.prompts.get(p));
                            Match m = conn.getNumNewMatchedTokens(request, 0);
                            if (m.tokens() != blocks * bs) {
                                throw new IllegalStateException("layer timing: the pool has " + m.tokens() + " of "
                                        + blocks * bs + " tokens of a stored prompt: " + pool.whyMissing(client, s.keysOf(p)));
                            }
                            conn.updateStateAfterAlloc(request, table, m.tokens());
                            ConnectorMeta meta = conn.buildConnectorMeta(List.of());
                            long t0 = System.nanoTime();
                            conn.startLoadKv(meta, kv);
                            conn.waitForLayerLoad(0);
                            long first = System.nanoTime() - t0;
                            conn.waitForLayerLoad(layers - 1);
                            long all = System.nanoTime() - t0;
                            if (!conn.blockIdsWithLoadErrors().isEmpty()) {
                                throw new IllegalStateException("layer timing: loads failed in " + g + " mode");
                            }
                            conn.requestFinished(request, table);
                            got.computeIfAbsent(g, x -> new ArrayList<>()).add(new long[]{first, all});
                        }
                    }
                }
            }
            client.removeByPrefix(KeyFormat.modelPrefix("bench-" + geometry));
            Map<Granularity, double[]> out = new EnumMap<>(Granularity.class);
            got.forEach((g, l) -> out.put(g, new double[]{median(l, 0) / 1e3, median(l, 1) / 1e3}));
            return new Loads(geometry, layers, blocks, out);
        }
    }

    /**
     * The reference engine's time to first token: {@code prompts} prompts of {@code cached} tokens saved
     * to the pool by one engine, then, per round and mode, a fresh engine (an empty local cache) asked
     * for one token of each prompt with a new last block of {@code newTokens} tokens. Each prompt is asked
     * once the previous one's saves are over, in an engine with blocks for two prompts: a finished request
     * holds its blocks until its saves end, and with room for one prompt the next one waited for them in
     * admission, so its TTFT held the previous save's time (longer layer by layer: a reservation, a write a
     * layer and a finish, against one leased put), not its own load and compute.
     */
    static Ttft ttft(KvPoolClient client, ModelConfig mc, int prompts, int cached, int newTokens, int rounds)
            throws Exception {
        int bs = BlockHasher.DEFAULT_BLOCK_SIZE;
        EngineConfig ec = EngineConfig.defaults().withNumBlocks(2 * ((cached + newTokens) / bs + 2) + 8)
                .withModelName("bench-ttft");
        SplittableRandom r = new SplittableRandom(11);
        List<int[]> base = new ArrayList<>();
        for (int p = 0; p < prompts; p++) {
            int[] t = new int[cached];
            for (int i = 0; i < t.length; i++) {
                t[i] = r.nextInt(mc.vocabSize());
            }
            base.add(t);
        }
        Weights w = Weights.random(mc, 1);
        try (Engine writer = new Engine(ec, mc, w, "w", connector(client, ec, Granularity.BLOCK))) {
            for (int[] t : base) {
                writer.generate(t, SamplingParams.greedy(1), null).get();
            }
            writer.connector().waitForSave();
        }
        Map<Granularity, List<Long>> got = new EnumMap<>(Granularity.class);
        for (int round = 0; round < rounds; round++) {
            for (Granularity g : order(round)) {
                try (Engine reader = new Engine(ec, mc, w, "w", connector(client, ec, g))) {
                    for (int[] t : base) {
                        int[] prompt = Arrays.copyOf(t, cached + newTokens);
                        for (int i = cached; i < prompt.length; i++) {
                            prompt[i] = r.nextInt(mc.vocabSize());
                        }
                        Completion c = reader.generate(prompt, SamplingParams.greedy(1), null).get();
                        if (!c.ok() || c.externalHitTokens() != cached) {
                            throw new IllegalStateException("ttft: " + g + " loaded " + c.externalHitTokens() + " of "
                                    + cached + " cached tokens (" + c.error() + ")");
                        }
                        got.computeIfAbsent(g, x -> new ArrayList<>()).add(c.ttftNanos());
                        reader.connector().waitForSave();
                    }
                }
            }
        }
        client.removeByPrefix(KeyFormat.modelPrefix("bench-ttft"));
        Map<Granularity, Double> out = new EnumMap<>(Granularity.class);
        got.forEach((g, l) -> out.put(g, median(l.stream().map(x -> new long[]{x}).toList(), 0) / 1e6));
        return new Ttft(cached, newTokens, out);
    }

    /** {@link #loads} of 2,048-token prompts at one geometry as result rows, one per mode. */
    static List<Results.Row> loadRows(KvPoolClient client, PoolProcess pool, String geometry, long bytesPerToken,
                                      int layers, int prompts, int rounds) throws Exception {
        Loads l = loads(client, pool, geometry + "-layers", bytesPerToken, layers, prompts, 2048, rounds);
        List<Results.Row> rows = new ArrayList<>();
        for (var e : l.micros().entrySet()) {
            rows.add(new Results.Row("layers", "kvpool", "load " + e.getKey().name().toLowerCase(Locale.ROOT) + " "
                    + geometry, bytesPerToken * 16, 1, Double.NaN, Double.NaN, e.getValue()[0], e.getValue()[1],
                    String.format(Locale.ROOT, "2048-token prompts, %d layers, %d blocks: p50 column = median until"
                            + " layer 0 is in (%.0f us), p99 column = median until every layer is in (%.0f us)",
                            l.layers(), l.blocks(), e.getValue()[0], e.getValue()[1])));
        }
        return rows;
    }

    /**
     * {@link #ttft} of 2,048 cached tokens and {@code newTokens} new ones as result rows, one per mode, named
     * "TTFT block{suffix}" and "TTFT layer{suffix}", with the ratio of layer to block in the note.
     */
    static List<Results.Row> ttftRows(KvPoolClient client, ModelConfig mc, int prompts, int newTokens, int rounds,
                                      String suffix) throws Exception {
        Ttft t = ttft(client, mc, prompts, 2048, newTokens, rounds);
        double block = t.millis().get(Granularity.BLOCK);
        List<Results.Row> rows = new ArrayList<>();
        for (var e : t.millis().entrySet()) {
            rows.add(new Results.Row("layers", "engine", "TTFT " + e.getKey().name().toLowerCase(Locale.ROOT) + suffix,
                    mc.kvBytesPerToken() * 16, 1, Double.NaN, Double.NaN, e.getValue() * 1e3, Double.NaN,
                    String.format(Locale.ROOT, "reference engine, %d tokens in the pool + %d new%s: median TTFT %.2f ms"
                            + " (%.2fx whole blocks)", t.cachedTokens(), t.newTokens(),
                            suffix.isEmpty() ? "" : ", every KV byte over TCP", e.getValue(), e.getValue() / block)));
        }
        return rows;
    }

    private static PoolConnector connector(KvPoolClient client, EngineConfig ec, Granularity g) {
        return new PoolConnector(client, new BlockHasher(ec.blockSize(), ec.hashSeed()),
                KeyFormat.of(ec.modelName(), "w", "f32"), PoolConnector.ResetScope.MODEL, g);
    }

    /** The modes in round {@code round}'s order: each mode goes first in every other round. */
    static List<Granularity> order(int round) {
        List<Granularity> modes = Arrays.asList(Granularity.values());
        return round % 2 == 0 ? modes : modes.reversed();
    }

    private static double median(List<long[]> samples, int field) {
        long[] v = samples.stream().mapToLong(x -> x[field]).sorted().toArray();
        return v.length == 0 ? Double.NaN : v[v.length / 2];
    }
}
