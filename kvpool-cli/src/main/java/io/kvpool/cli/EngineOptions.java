package io.kvpool.cli;

import io.kvpool.connector.LoadFailurePolicy;
import io.kvpool.engine.EngineConfig;
import io.kvpool.engine.llama.ModelConfig;
import io.kvpool.engine.llama.Weights;
import picocli.CommandLine.Option;

import java.io.IOException;
import java.nio.file.Path;

/** Flags shared by the commands that run the reference engine. */
final class EngineOptions {

    @Option(names = "--model", paramLabel = "SIZE|DIR",
            description = "default, tiny, or a directory with a Llama config.json and model.safetensors (F32/BF16)"
                    + " (default: ${DEFAULT-VALUE}).")
    String model = "default";

    @Option(names = "--weights-seed", paramLabel = "N",
            description = "Seed of the generated weights when --model is a size (default: ${DEFAULT-VALUE}).")
    long weightsSeed = 1;

    @Option(names = "--weights-version", paramLabel = "NAME",
            description = "Names the weights in pool keys and outputs (default: ${DEFAULT-VALUE}).")
    String weightsVersion = "v1";

    @Option(names = "--block-size", paramLabel = "TOKENS", description = "Tokens per KV block (default: ${DEFAULT-VALUE}).")
    int blockSize = EngineConfig.defaults().blockSize();

    @Option(names = "--kv-blocks", paramLabel = "N",
            description = "KV blocks in the engine's cache (default: " + EngineConfig.DEFAULT_BLOCKS + "; demo: 160, so"
                    + " that conversations do not all fit and the pool has something to restore).")
    Integer kvBlocks;

    @Option(names = "--max-running", paramLabel = "N", description = "Requests per step at most (default: ${DEFAULT-VALUE}).")
    int maxRunning = EngineConfig.defaults().maxRunning();

    @Option(names = "--max-step-tokens", paramLabel = "N",
            description = "Tokens computed per step at most; prefills are chunked to fit (default: ${DEFAULT-VALUE}).")
    int maxStepTokens = EngineConfig.defaults().maxStepTokens();

    @Option(names = "--load-failure", paramLabel = "POLICY",
            description = "recompute or fail: what to do when a block's load from the pool fails (default: recompute).")
    String loadFailure = "recompute";

    @Option(names = "--hash-seed", paramLabel = "TEXT",
            description = "Block hash seed (vLLM: PYTHONHASHSEED); engines sharing a pool must agree (default: ${DEFAULT-VALUE}).")
    String hashSeed = EngineConfig.defaults().hashSeed();

    @Option(names = "--kv-granularity", paramLabel = "block|layer",
            description = "How KV moves to and from the pool: block (a step's blocks whole, one batch) or layer (a"
                    + " layer of every block at a time, so loading layer i+1 overlaps computing layer i and each layer"
                    + " is saved as soon as it is computed). Keys and bytes are the same either way (default: ${DEFAULT-VALUE}).")
    String kvGranularity = "block";

    @Option(names = "--versioned-keys",
            description = "On a weight update, switch the key version (and reclaim the old one) instead of resetting the pool.")
    boolean versionedKeys;

    /** The connector granularity the flag names; a bad value is a bad flag (exit 2). */
    io.kvpool.connector.PoolConnector.Granularity granularity() {
        return switch (kvGranularity) {
            case "block" -> io.kvpool.connector.PoolConnector.Granularity.BLOCK;
            case "layer" -> io.kvpool.connector.PoolConnector.Granularity.LAYER;
            default -> throw new IllegalArgumentException("--kv-granularity must be block or layer, got '"
                    + kvGranularity + "'");
        };
    }

    ModelConfig modelConfig() throws IOException {
        return switch (model) {
            case "default" -> ModelConfig.defaults();
            case "tiny" -> ModelConfig.tiny();
            default -> Weights.readConfig(Path.of(model));
        };
    }

    Weights weights(ModelConfig cfg) throws IOException {
        return switch (model) {
            case "default", "tiny" -> Weights.random(cfg, weightsSeed);
            default -> Weights.load(Path.of(model));
        };
    }

    String modelName() {
        return switch (model) {
            case "default", "tiny" -> "kvpool-ref-" + model;
            default -> Path.of(model).getFileName().toString();
        };
    }

    /**
     * The engine's config for the model {@code mc}: a block no longer than the model's context, and a
     * KV cache ({@code --kv-blocks} of {@code --block-size} tokens) that fits this machine's memory.
     */
    EngineConfig engineConfig(ModelConfig mc, int defaultBlocks) {
        Bounds.range("--block-size", blockSize, 1, mc.maxSeqLen(), "a block is at most the model's context");
        int blocks = kvBlocks == null ? defaultBlocks : kvBlocks;
        Bounds.atLeast("--kv-blocks", blocks, 2);
        Bounds.fitsMemory("--kv-blocks " + blocks + " of --block-size " + blockSize + " tokens at "
                + mc.kvBytesPerToken() + " bytes of KV a token", Bounds.times(Bounds.times(blocks, blockSize),
                mc.kvBytesPerToken()));
        Bounds.atLeast("--max-running", maxRunning, 1);
        if (maxStepTokens < blockSize) {
            throw new IllegalArgumentException("--max-step-tokens " + maxStepTokens + " is less than one block"
                    + " (--block-size " + blockSize + ")");
        }
        LoadFailurePolicy p = switch (loadFailure) {
            case "recompute" -> LoadFailurePolicy.RECOMPUTE;
            case "fail" -> LoadFailurePolicy.FAIL;
            default -> throw new IllegalArgumentException("--load-failure must be recompute or fail, got " + loadFailure);
        };
        return new EngineConfig(blockSize, blocks, maxRunning, maxStepTokens, p, hashSeed, modelName(), versionedKeys);
    }
}
