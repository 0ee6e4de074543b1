package io.kvpool.bench;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.connector.ConnectorMeta;
import io.kvpool.connector.ConnectorRequest;
import io.kvpool.connector.ConnectorStats;
import io.kvpool.connector.PagedKv;
import io.kvpool.connector.PoolConnector;
import io.kvpool.connector.ScheduledRequest;
import io.kvpool.connector.hash.BlockHash;
import io.kvpool.connector.hash.BlockHasher;
import io.kvpool.connector.hash.KeyFormat;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.SplittableRandom;
import java.util.concurrent.locks.LockSupport;

/**
 * How fast an engine's KV goes into the pool through its connector, in tokens per second, for a block
 * geometry: prompts of {@code promptTokens} are "prefilled" the way the reference engine runs them
 * (admission lookup, chunks of {@link #STEP_TOKENS} tokens a step, {@code buildConnectorMeta},
 * {@code startLoadKv}, {@code saveKvLayer} for every layer, {@code requestFinished}, blocks held until
 * {@code getFinished} reports their saves done), with the model's compute left out, so the engine
 * plans saves as fast as the connector takes them. The engine's paged cache is the reference
 * engine's default ({@link #ENGINE_BLOCKS} blocks) or {@link #ENGINE_CACHE_BYTES}, whichever is
 * smaller: a new prompt waits for blocks whose saves are still running (polling every millisecond,
 * as the engine's idle loop does), which is the back-pressure a real engine puts on its saves.
 *
 * <p>A round saves {@code prompts} fresh prompts into an emptied pool; its time runs from the first
 * save planned to the connector reporting the last one finished ({@code waitForSave}, then
 * {@code getFinished}). Then one {@code prefixMatch} per prompt counts what landed: only blocks the
 * pool holds (and a prompt's later blocks only behind present earlier ones) count as saved tokens.
 * The pool is emptied between rounds (untimed), so eviction never interferes.
 */
final class SaveBench implements AutoCloseable {

    /** Tokens a step computes at most: the reference engine's default {@code maxStepTokens}. */
    static final int STEP_TOKENS = 512;

    /** The reference engine's default cache: {@code EngineConfig.DEFAULT_BLOCKS}. */
    static final int ENGINE_BLOCKS = 4096;

    /** The most memory the engine's cache takes here (the Llama-3-8B geometry would want 8 GiB). */
    static final long ENGINE_CACHE_BYTES = 512L << 20;

    /**
     * What one geometry measured: {@code tokens} saved (and found present) in {@code seconds}, over
     * {@code rounds} rounds of {@code promptsSaved} prompts in all, with an engine cache of
     * {@code cachePrompts} prompts; saves the connector counted as skipped (already present, pool
     * full) or dropped (failed).
     */
    record Result(String geometry, long bytesPerToken, int blockSize, long tokens, double seconds, long promptsSaved,
                  int promptTokens, int cachePrompts, int rounds, long skipped, long dropped)
            implements RestoreBench.Rate {

        /** This measurement and a later slice of the same one, as one. */
        Result plus(Result o) {
            return new Result(o.geometry, o.bytesPerToken, o.blockSize, tokens + o.tokens, seconds + o.seconds,
                    promptsSaved + o.promptsSaved, o.promptTokens, o.cachePrompts, rounds + o.rounds,
                    skipped + o.skipped, dropped + o.dropped);
        }
    }

    private final KvPoolClient client;
    private final String geometry;
    private final long bytesPerToken;
    private final int promptTokens;
    private final String model;
    private final BlockHasher hasher;
    private final KeyFormat keys;
    private final Arena arena = Arena.ofShared();
    private final PoolConnector conn;
    private final PagedKv kv;
    private final int[][] tables;
    private final SplittableRandom r;
    private int calls;

    /**
     * An engine with {@code bytesPerToken} of KV per token over {@code layers} layers, saving prompts
     * of {@code promptTokens} tokens through a {@link PoolConnector} over {@code client}.
     */
    SaveBench(KvPoolClient client, String geometry, long bytesPerToken, int layers, int promptTokens) {
        this.client = client;
        this.geometry = geometry;
        this.bytesPerToken = bytesPerToken;
        this.promptTokens = promptTokens;
        int bs = BlockHasher.DEFAULT_BLOCK_SIZE;
        long blockBytes = bytesPerToken * bs;
        int blocks = promptTokens / bs;
        this.model = "bench-save-" + geometry;
        this.hasher = new BlockHasher(bs, "0");
        this.keys = KeyFormat.of(model, "w", "f32");
        this.r = new SplittableRandom(geometry.hashCode() * 31L + 7);
        int cachePrompts = (int) Math.max(1, Math.min(ENGINE_BLOCKS / blocks, ENGINE_CACHE_BYTES / (blockBytes * blocks)));
        MemorySegment cache = arena.allocate(blockBytes * blocks * cachePrompts, 4096);
        fill(cache, blockBytes, r);
        this.kv = RestoreBench.contiguous(cache, bs, layers, blockBytes);
        this.tables = new int[cachePrompts][blocks];
        for (int p = 0; p < cachePrompts; p++) {
            for (int b = 0; b < blocks; b++) {
                tables[p][b] = p * blocks + b;
            }
        }
        this.conn = new PoolConnector(client, hasher, keys, PoolConnector.ResetScope.MODEL);
    }

    /**
     * Saves rounds of {@code prompts} prompts for about {@code seconds} (at least one round), after
     * untimed rounds for about {@code warmUpSeconds} (none if 0).
     */
    Result save(int prompts, double seconds, double warmUpSeconds) {
        client.removeByPrefix(KeyFormat.modelPrefix(model));
        long warm = 0;
        for (int w = 0; warm < warmUpSeconds * 1e9; w++) {
            warm += round(prompts, "w" + calls + "r" + w + "-")[0];
            client.removeByPrefix(KeyFormat.modelPrefix(model));
        }
        ConnectorStats before = conn.stats();
        long nanos = 0;
        long tokens = 0;
        int rounds = 0;
        do {
            long[] t = round(prompts, "c" + calls + "r" + rounds + "-");
            nanos += t[0];
            tokens += t[1];
            rounds++;
            client.removeByPrefix(KeyFormat.modelPrefix(model));
        } while (nanos < seconds * 1e9);
        calls++;
        ConnectorStats after = conn.stats();
        return new Result(geometry, bytesPerToken, hasher.blockSize(), tokens, nanos / 1e9, (long) rounds * prompts,
                promptTokens, tables.length, rounds, after.skippedSaves() - before.skippedSaves(),
                after.droppedSaves() - before.droppedSaves());
    }

    @Override
    public void close() {
        conn.close();
        arena.close();
    }

    /** One round: {nanos, tokens verified present}. */
    private long[] round(int prompts, String idPrefix) {
        List<int[]> all = new ArrayList<>(prompts);
        for (int p = 0; p < prompts; p++) {
            int[] t = new int[promptTokens];
            for (int i = 0; i < t.length; i++) {
                t[i] = r.nextInt(128_000);
            }
            all.add(t);
        }
        ArrayDeque<Integer> free = new ArrayDeque<>();
        for (int s = 0; s < tables.length; s++) {
            free.add(s);
        }
        Map<String, Integer> holding = new HashMap<>(); // finished requests whose saves still run -> cache slot
        long t0 = System.nanoTime();
        for (int p = 0; p < prompts; p++) {
            while (free.isEmpty()) {
                if (!collect(holding, free)) {
                    LockSupport.parkNanos(1_000_000); // the engine's idle loop, while saves hold its blocks
                }
            }
            int slot = free.poll();
            int[] table = tables[slot];
            ConnectorRequest req = new ConnectorRequest(idPrefix + p, all.get(p));
            // admission: the external-cache lookup (a miss), then the block allocation
            int hit = conn.getNumNewMatchedTokens(req, 0).tokens();
            if (hit != 0) {
                throw new IllegalStateException("save bench: a fresh prompt matched " + hit + " tokens");
            }
            conn.updateStateAfterAlloc(req, table, 0);
            for (int s = 0; s < promptTokens; s += STEP_TOKENS) {
                int n = Math.min(STEP_TOKENS, promptTokens - s);
                ConnectorMeta meta = conn.buildConnectorMeta(List.of(new ScheduledRequest(req, table, s, s + n)));
                conn.startLoadKv(meta, kv);
                conn.waitForLayerLoad(0);
                for (int l = 0; l < kv.numLayers(); l++) {
                    conn.saveKvLayer(l, kv);
                }
                collect(holding, free);
            }
            if (conn.requestFinished(req, table)) {
                holding.put(req.id(), slot);
            } else {
                free.add(slot);
            }
        }
        conn.waitForSave();
        collect(holding, free);
        long nanos = System.nanoTime() - t0;
        if (!holding.isEmpty()) {
            throw new IllegalStateException("save bench: the connector did not report " + holding.keySet()
                    + " finished after waitForSave");
        }
        long tokens = 0;
        int bs = hasher.blockSize();
        for (int[] t : all) {
            List<String> k = new ArrayList<>(t.length / bs);
            for (BlockHash h : hasher.hashes(t)) {
                k.add(keys.keyString(h));
            }
            tokens += (long) client.prefixMatch(k) * bs;
        }
        return new long[]{nanos, tokens};
    }

    /** The engine's per-step poll: frees the blocks of requests whose saves finished. */
    private boolean collect(Map<String, Integer> holding, ArrayDeque<Integer> free) {
        Set<String> done = conn.getFinished(Set.of());
        for (String id : done) {
            Integer slot = holding.remove(id);
            if (slot != null) {
                free.add(slot);
            }
        }
        return !done.isEmpty();
    }

    /** Random bytes in every block (distinct per block, so no two blocks are the same memory pattern). */
    private static void fill(MemorySegment cache, long blockBytes, SplittableRandom r) {
        MemorySegment first = cache.asSlice(0, blockBytes);
        for (long o = 0; o + 8 <= blockBytes; o += 8) {
            first.set(ValueLayout.JAVA_LONG_UNALIGNED, o, r.nextLong());
        }
        for (long b = 1; b < cache.byteSize() / blockBytes; b++) {
            MemorySegment.copy(first, 0, cache, b * blockBytes, blockBytes);
            cache.set(ValueLayout.JAVA_LONG_UNALIGNED, b * blockBytes, r.nextLong());
        }
    }

    /**
     * The client alone, for comparison: the same blocks stored with one {@code putBatch} per step's
     * worth of blocks, one call at a time, no connector ({bytes per second}).
     */
    static double rawPutBatch(KvPoolClient client, String geometry, long bytesPerToken, int prompts, int promptTokens,
                              double seconds) {
        int bs = BlockHasher.DEFAULT_BLOCK_SIZE;
        long blockBytes = bytesPerToken * bs;
        int perCall = STEP_TOKENS / bs;
        String model = "bench-raw-" + geometry;
        BlockHasher hasher = new BlockHasher(bs, "0");
        KeyFormat keys = KeyFormat.of(model, "w", "f32");
        SplittableRandom r = new SplittableRandom(geometry.hashCode() * 17L + 3);
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment cache = arena.allocate(blockBytes * perCall, 4096);
            fill(cache, blockBytes, r);
            List<MemorySegment> src = new ArrayList<>(perCall);
            for (int b = 0; b < perCall; b++) {
                src.add(cache.asSlice(b * blockBytes, blockBytes));
            }
            client.removeByPrefix(KeyFormat.modelPrefix(model));
            long nanos = 0;
            long bytes = 0;
            int round = 0;
            do {
                List<String> k = new ArrayList<>();
                for (int p = 0; p < prompts; p++) {
                    int[] t = new int[promptTokens];
                    for (int i = 0; i < t.length; i++) {
                        t[i] = r.nextInt(128_000);
                    }
                    for (BlockHash h : hasher.hashes(t)) {
                        k.add(keys.keyString(h));
                    }
                }
                long t0 = System.nanoTime();
                for (int from = 0; from < k.size(); from += perCall) {
                    int to = Math.min(k.size(), from + perCall);
                    for (PutStatus st : client.putBatch(k.subList(from, to), src.subList(0, to - from))) {
                        if (st != PutStatus.OK) {
                            throw new IllegalStateException("raw putBatch: " + st);
                        }
                    }
                }
                if (round++ > 0) { // the first round warms up
                    nanos += System.nanoTime() - t0;
                    bytes += k.size() * blockBytes;
                }
                client.removeByPrefix(KeyFormat.modelPrefix(model));
            } while (nanos < seconds * 1e9);
            return bytes / (nanos / 1e9);
        }
    }
}
