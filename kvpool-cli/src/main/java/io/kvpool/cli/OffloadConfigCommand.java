package io.kvpool.cli;

import io.kvpool.connector.config.ConnectorFactory;
import io.kvpool.connector.config.OffloadConfig;
import io.kvpool.connector.config.OffloadConfigs;
import io.kvpool.engine.EngineConfig;
import io.kvpool.engine.llama.ModelConfig;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;
import picocli.CommandLine.Parameters;

import java.nio.file.Path;
import java.util.concurrent.Callable;

/** {@code kvpool offload-config FILE}: checks an offload config and prints it as vLLM's kv_transfer_config. */
@Command(name = "offload-config", mixinStandardHelpOptions = true,
        description = "Check an offload config (YAML or JSON) and print it in the shape of vLLM's kv_transfer_config.")
final class OffloadConfigCommand implements Callable<Integer> {

    @Parameters(paramLabel = "FILE", description = "The config; default: the file named by KVPOOL_CONFIG_PATH.", arity = "0..1")
    Path file;

    @Option(names = "--model", paramLabel = "NAME", description = "Model name used in keys (default: ${DEFAULT-VALUE}).")
    String model = "kvpool-ref-default";

    @Option(names = "--weights-version", paramLabel = "NAME", description = "Weight version in keys (default: ${DEFAULT-VALUE}).")
    String weights = "v1";

    @Option(names = "--block-size", paramLabel = "TOKENS", description = "Engine block size (default: ${DEFAULT-VALUE}).")
    int blockSize = EngineConfig.defaults().blockSize();

    @Option(names = "--hash-seed", paramLabel = "TEXT", description = "Block hash seed (default: ${DEFAULT-VALUE}).")
    String hashSeed = EngineConfig.defaults().hashSeed();

    @Override
    public Integer call() throws Exception {
        Bounds.range("--block-size", blockSize, 1, ModelConfig.defaults().maxSeqLen(), "a block is at most the"
                + " reference model's context");
        Path f = file != null ? file : System.getenv("KVPOOL_CONFIG_PATH") != null
                ? Path.of(System.getenv("KVPOOL_CONFIG_PATH")) : null;
        if (f == null) {
            throw new IllegalArgumentException("FILE: give a config file or set KVPOOL_CONFIG_PATH");
        }
        OffloadConfigs.Loaded l = OffloadConfigs.load(f);
        for (String w : l.warnings()) {
            System.err.println("warning: " + f + ": " + w);
        }
        OffloadConfig c = l.config();
        long blockBytes = ModelConfig.defaults().kvBytesPerToken() * blockSize;
        System.out.println(ConnectorFactory.toVllmJson(c, new ConnectorFactory.EngineSide(blockSize, hashSeed, model,
                weights, "f32", blockBytes)));
        return 0;
    }
}
