package io.kvpool.bench;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.connector.ConnectorMeta;
import io.kvpool.connector.ConnectorRequest;
import io.kvpool.connector.Match;
import io.kvpool.connector.PagedKv;
import io.kvpool.connector.PoolConnector;
import io.kvpool.connector.hash.BlockHash;
import io.kvpool.connector.hash.BlockHasher;
import io.kvpool.connector.hash.KeyFormat;
import io.kvpool.engine.llama.KvBlocks;
import io.kvpool.engine.llama.LayerHook;
import io.kvpool.engine.llama.ModelConfig;
import io.kvpool.engine.llama.Transformer;
import io.kvpool.engine.llama.Weights;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;

/**
 * How fast KV comes back from the pool through the engine's connector, in tokens per second, for
 * a block geometry: prompts of {@code promptTokens} are saved block by block, then restored the way
 * an engine restores them (one prefixMatch, one getIntoBatch into its paged cache) over and over.
 * For the reference engine's own geometry the same run measures its prefill (recomputing the same
 * tokens), so the ratio says how much faster a hit is than a miss.
 */
final class RestoreBench {

    /** What one geometry measured: {@code tokens} restored in {@code seconds}. */
    record Result(String geometry, long bytesPerToken, int blockSize, long tokens, double seconds, int prompts,
                  int promptTokens) implements Rate {

        /** This measurement and a later slice of the same one, as one. */
        Result plus(Result o) {
            return new Result(o.geometry, o.bytesPerToken, o.blockSize, tokens + o.tokens, seconds + o.seconds,
                    o.prompts, o.promptTokens);
        }
    }

    /** Tokens moved in some seconds, at some bytes a token. */
    interface Rate {
        long tokens();

        double seconds();

        long bytesPerToken();

        default double tokensPerSecond() {
            return tokens() / seconds();
        }

        default double gbPerSecond() {
            return tokens() * bytesPerToken() / seconds() / 1e9;
        }
    }

    private RestoreBench() {
    }

    /** An engine's paged KV memory as one contiguous region of {@code blockBytes}-byte blocks. */
    static PagedKv contiguous(MemorySegment cache, int blockSize, int layers, long blockBytes) {
        return new PagedKv() {
            @Override
            public int blockSize() {
                return blockSize;
            }

            @Override
            public int numLayers() {
                return layers;
            }

            @Override
            public long blockBytes() {
                return blockBytes;
            }

            @Override
            public MemorySegment block(int id) {
                return cache.asSlice(id * blockBytes, blockBytes);
            }
        };
    }

    /**
     * A geometry's prompts, stored in the pool: {@code prompts} prompts of {@code promptTokens} random
     * tokens, each block's value the same {@code blockBytes} of random bytes. Holds the memory of the
     * engine cache the restore loads into.
     */
    static final class Stored implements AutoCloseable {
        final String geometry;
        final long bytesPerToken;
        final int promptTokens;
        final BlockHasher hasher = new BlockHasher(BlockHasher.DEFAULT_BLOCK_SIZE, "0");
        final KeyFormat keys;
        final List<int[]> prompts = new ArrayList<>();
        private final Arena arena = Arena.ofShared();
        private final MemorySegment cache;

        private Stored(String geometry, long bytesPerToken, int promptTokens) {
            this.geometry = geometry;
            this.bytesPerToken = bytesPerToken;
            this.promptTokens = promptTokens;
            this.keys = KeyFormat.of("bench-" + geometry, "w", "f32");
            this.cache = arena.allocate(blockBytes() * blocks(), 4096);
        }

        long blockBytes() {
            return bytesPerToken * hasher.blockSize();
        }

        /** The engine cache the prompts were written from (and are loaded into). */
        MemorySegment cache() {
            return cache;
        }

        int blocks() {
            return promptTokens / hasher.blockSize();
        }

        /** The pool keys of prompt {@code p}'s blocks. */
        List<String> keysOf(int p) {
            List<String> k = new ArrayList<>();
            for (BlockHash h : hasher.hashes(prompts.get(p))) {
                k.add(keys.keyString(h));
            }
            return k;
        }

        @Override
        public void close() {
            arena.close();
        }
    }

    /** Stores {@code prompts} prompts of {@code promptTokens} with {@code bytesPerToken} of KV per token. */
    static Stored store(KvPoolClient client, String geometry, long bytesPerToken, int prompts, int promptTokens) {
        Stored s = new Stored(geometry, bytesPerToken, promptTokens);
        try {
            SplittableRandom r = new SplittableRandom(geometry.hashCode());
            MemorySegment src = s.arena.allocate(s.blockBytes(), 64);
            for (long o = 0; o + 8 <= s.blockBytes(); o += 8) {
                src.set(java.lang.foreign.ValueLayout.JAVA_LONG_UNALIGNED, o, r.nextLong());
            }
            for (int p = 0; p < prompts; p++) {
                int[] t = new int[promptTokens];
                for (int i = 0; i < t.length; i++) {
                    t[i] = r.nextInt(128_000);
                }
                s.prompts.add(t);
                List<String> k = s.keysOf(p);
                for (PutStatus st : client.putBatch(k, java.util.Collections.nCopies(k.size(), src))) {
                    if (st != PutStatus.OK && st != PutStatus.ALREADY_EXISTS) {
                        throw new IllegalStateException("storing the restore bench's blocks: " + st);
                    }
                }
            }
            return s;
        } catch (RuntimeException e) {
            s.close();
            throw e;
        }
    }

    /**
     * Restores the stored prompts over and over for about {@code seconds}, the way an engine does
     * (one prefixMatch, one getIntoBatch into its paged cache); every prompt must be found whole in
     * {@code pool}, which {@code client} talks to.
     */
    static Result measure(KvPoolClient client, PoolProcess pool, Stored s, double seconds) {
        int bs = s.hasher.blockSize();
        int blocks = s.blocks();
        PagedKv kv = contiguous(s.cache, bs, 1, s.blockBytes());
        try (PoolConnector conn = new PoolConnector(client, s.hasher, s.keys, PoolConnector.ResetScope.MODEL)) {
            int[] table = new int[blocks];
            for (int i = 0; i < blocks; i++) {
                table[i] = i;
            }
            long tokens = 0;
            long t0 = System.nanoTime();
            long deadline = t0 + (long) (seconds * 1e9);
            int round = 0;
            do {
                int p = round++ % s.prompts.size();
                ConnectorRequest req = new ConnectorRequest("r" + round, s.prompts.get(p));
                Match m = conn.getNumNewMatchedTokens(req, 0);
                if (m.tokens() != blocks * bs) {
                    // a lookup that fails reads as a miss in the connector: say what really happened
                    throw new IllegalStateException("restore bench: the connector found " + m.tokens() + " of "
                            + blocks * bs + " tokens of a prompt stored in the pool: " + pool.whyMissing(client,
                            s.keysOf(p)));
                }
                conn.updateStateAfterAlloc(req, table, m.tokens());
                ConnectorMeta meta = conn.buildConnectorMeta(List.of());
                conn.startLoadKv(meta, kv);
                conn.waitForLayerLoad(0);
                if (!conn.blockIdsWithLoadErrors().isEmpty()) {
                    throw new IllegalStateException("restore bench: loads failed");
                }
                conn.requestFinished(req, table);
                tokens += m.tokens();
            } while (System.nanoTime() < deadline);
            double secs = (System.nanoTime() - t0) / 1e9;
            return new Result(s.geometry, s.bytesPerToken, bs, tokens, secs, s.prompts.size(), s.promptTokens);
        }
    }

    /**
     * Stores, measures and removes {@code prompts} prompts of {@code promptTokens} ({@link #store}, {@link #measure}),
     * after {@code warmUpSeconds} of untimed restores (none if 0).
     */
    static Result restore(KvPoolClient client, PoolProcess pool, String geometry, long bytesPerToken, int prompts,
                          int promptTokens, double seconds, double warmUpSeconds) {
        try (Stored s = store(client, geometry, bytesPerToken, prompts, promptTokens)) {
            if (warmUpSeconds > 0) {
                measure(client, pool, s, warmUpSeconds);
            }
            Result r = measure(client, pool, s, seconds);
            client.removeByPrefix(KeyFormat.modelPrefix("bench-" + geometry));
            return r;
        }
    }

    /** The reference engine's prefill rate (tokens per second) for a {@code promptTokens}-token prompt, best of {@code reps}. */
    static double prefill(ModelConfig c, int promptTokens, int reps) {
        Transformer m = new Transformer(c, Weights.random(c, 1));
        int bs = BlockHasher.DEFAULT_BLOCK_SIZE;
        int[] tok = new int[promptTokens];
        SplittableRandom r = new SplittableRandom(3);
        for (int i = 0; i < tok.length; i++) {
            tok[i] = r.nextInt(256);
        }
        int[] table = new int[(promptTokens + bs - 1) / bs];
        for (int i = 0; i < table.length; i++) {
            table[i] = i;
        }
        double best = 0;
        try (KvBlocks kv = new KvBlocks(c, table.length, bs)) {
            for (int rep = 0; rep < reps; rep++) {
                long t0 = System.nanoTime();
                for (int s = 0; s < promptTokens; s += 512) {
                    m.forward(tok, s, Math.min(512, promptTokens - s), table, kv, LayerHook.NONE, false);
                }
                best = Math.max(best, promptTokens / ((System.nanoTime() - t0) / 1e9));
            }
        }
        return best;
    }
}
