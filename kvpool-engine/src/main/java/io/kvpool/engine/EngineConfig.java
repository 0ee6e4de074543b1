package io.kvpool.engine;

import io.kvpool.connector.LoadFailurePolicy;
import io.kvpool.connector.hash.BlockHasher;

import java.util.Objects;

/**
 * The engine's scheduling and cache settings (the model's shape is {@code ModelConfig}).
 *
 * @param blockSize       tokens per KV block (and per hashed block: the connector uses the same)
 * @param numBlocks       KV blocks in the paged cache; bounds the tokens of all running requests
 * @param maxRunning      requests computed in one step at most
 * @param maxStepTokens   tokens computed in one step at most (prefills are chunked to fit)
 * @param loadFailure     what to do with a block whose external load failed
 * @param hashSeed        the block hash seed (vLLM: PYTHONHASHSEED); engines sharing a pool agree on it
 * @param modelName       names the model in pool keys
 * @param versionedKeys   weight updates switch the key version (remedy b) instead of resetting the
 *                        external cache (remedy a)
 */
public record EngineConfig(int blockSize, int numBlocks, int maxRunning, int maxStepTokens,
                           LoadFailurePolicy loadFailure, String hashSeed, String modelName, boolean versionedKeys) {

    public EngineConfig {
        if (blockSize < 1) {
            throw new IllegalArgumentException("engine: blockSize must be at least 1, got " + blockSize);
        }
        if (numBlocks < 2) {
            throw new IllegalArgumentException("engine: numBlocks must be at least 2, got " + numBlocks);
        }
        if (maxRunning < 1) {
            throw new IllegalArgumentException("engine: maxRunning must be at least 1, got " + maxRunning);
        }
        if (maxStepTokens < blockSize) {
            throw new IllegalArgumentException("engine: maxStepTokens (" + maxStepTokens
                    + ") must be at least one block (" + blockSize + ")");
        }
        Objects.requireNonNull(loadFailure, "loadFailure");
        Objects.requireNonNull(hashSeed, "hashSeed");
        Objects.requireNonNull(modelName, "modelName");
    }

    /** KV blocks by default: 65536 tokens of 16 (128 MiB with the default model). */
    public static final int DEFAULT_BLOCKS = 4096;

    public static EngineConfig defaults() {
        return new EngineConfig(BlockHasher.DEFAULT_BLOCK_SIZE, DEFAULT_BLOCKS, 8, 512, LoadFailurePolicy.RECOMPUTE, "0",
                "kvpool-ref", false);
    }

    public EngineConfig withNumBlocks(int n) {
        return new EngineConfig(blockSize, n, maxRunning, maxStepTokens, loadFailure, hashSeed, modelName, versionedKeys);
    }

    public EngineConfig withLoadFailure(LoadFailurePolicy p) {
        return new EngineConfig(blockSize, numBlocks, maxRunning, maxStepTokens, p, hashSeed, modelName, versionedKeys);
    }

    public EngineConfig withVersionedKeys(boolean v) {
        return new EngineConfig(blockSize, numBlocks, maxRunning, maxStepTokens, loadFailure, hashSeed, modelName, v);
    }

    public EngineConfig withMaxRunning(int n) {
        return new EngineConfig(blockSize, numBlocks, n, maxStepTokens, loadFailure, hashSeed, modelName, versionedKeys);
    }

    public EngineConfig withMaxStepTokens(int n) {
        return new EngineConfig(blockSize, numBlocks, maxRunning, n, loadFailure, hashSeed, modelName, versionedKeys);
    }

    public EngineConfig withModelName(String name) {
        return new EngineConfig(blockSize, numBlocks, maxRunning, maxStepTokens, loadFailure, hashSeed, name, versionedKeys);
    }
}
