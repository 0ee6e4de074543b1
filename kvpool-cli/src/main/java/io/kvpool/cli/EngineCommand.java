package io.kvpool.cli;

import io.kvpool.client.ClientConfig;
import io.kvpool.config.Durations;
import io.kvpool.client.KvPoolClient;
import io.kvpool.connector.KvConnector;
import io.kvpool.connector.PoolConnector;
import io.kvpool.connector.config.ConnectorFactory;
import io.kvpool.connector.config.OffloadConfig;
import io.kvpool.connector.hash.BlockHasher;
import io.kvpool.connector.hash.KeyFormat;
import io.kvpool.engine.ApiToken;
import io.kvpool.engine.Engine;
import io.kvpool.engine.EngineConfig;
import io.kvpool.engine.EngineServer;
import io.kvpool.engine.llama.ModelConfig;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

import java.time.Duration;
import java.util.concurrent.Callable;
import java.util.concurrent.CountDownLatch;

/** {@code kvpool engine}: the reference engine over HTTP, with or without a pool behind it. */
@Command(name = "engine", mixinStandardHelpOptions = true,
        description = "Run the reference engine (OpenAI-style /v1/completions, control endpoints, /metrics).")
final class EngineCommand implements Callable<Integer> {

    @Option(names = "--host", paramLabel = "ADDRESS", description = "Address to listen on (default: ${DEFAULT-VALUE}).")
    String host = "127.0.0.1";

    @Option(names = "--port", paramLabel = "PORT", description = "HTTP port (default: ${DEFAULT-VALUE}).")
    int port = 8000;

    @Option(names = "--master", paramLabel = "HOST:PORT",
            description = "The kvpool master to use as external KV cache; none: the engine's own prefix cache only.")
    String master;

    @Option(names = "--offload-config", paramLabel = "FILE",
            description = "Offload config (YAML or JSON, type native or pool); default: the file named by"
                    + " KVPOOL_CONFIG_PATH, which kvpool launch writes. Ignored with --master.")
    java.nio.file.Path offloadConfig;

    @Option(names = "--reset-scope", paramLabel = "SCOPE",
            description = "all (removeAll with fencing: the RL default) or model (this model's keys only) (default: ${DEFAULT-VALUE}).")
    String resetScope = "all";

    @Option(names = "--request-timeout", paramLabel = "DURATION",
            description = "Bound on one exchange with the pool (master or node); past it a load is a miss (recomputed)"
                    + " and a save is dropped (default: the client's, 30s). Short values suit fault drills.")
    Duration requestTimeout;

    @Option(names = "--kv-load-deadline", paramLabel = "DURATION",
            description = "Most a step's loads from the pool may take; past it they are abandoned and their blocks"
                    + " recomputed, so a pool that is down, frozen or slow never stalls a request longer (default: no"
                    + " limit).")
    Duration loadDeadline;

    @Option(names = "--kv-load-deadline-prefill", paramLabel = "FACTOR",
            description = "Gives lookups and loads at most FACTOR times what recomputing their tokens takes, by the"
                    + " prefill rate the connector measures on this engine's steps (e.g. 1.0; with --kv-load-deadline"
                    + " too the shorter holds). A pool that missed a deadline is left alone for a while (1 s, doubling"
                    + " to 30 s), then probed (default: off).")
    Double loadDeadlinePrefill;

    @Mixin
    EngineOptions engine;

    @Mixin
    TlsOptions tls;

    @Option(names = "--api-token-file", paramLabel = "FILE",
            description = "File holding the bearer token every POST must carry (default: env KVPOOL_ENGINE_TOKEN_FILE or"
                    + " KVPOOL_ENGINE_TOKEN; none: an open API, loopback only).")
    java.nio.file.Path apiTokenFile;

    @Option(names = "--insecure", description = "Listen on a non-loopback address without an API token: anyone who"
            + " reaches the port can pause the engine, swap its weights and reset its caches.")
    boolean insecure;

    /** The pool client's config: the defaults, with --request-timeout and the TLS flags if given. */
    private ClientConfig clientConfig(String master) {
        return adjust(ClientConfig.forMaster(master));
    }

    private ClientConfig adjust(ClientConfig c) {
        ClientConfig t = c.withTls(tls.tls());
        return requestTimeout == null ? t : t.withRequestTimeout(requestTimeout);
    }

    @Override
    public Integer call() throws Exception {
        Bounds.port("--port", port, false);
        engine.granularity(); // a bad --kv-granularity before anything starts
        if (requestTimeout != null) {
            Durations.requirePositive("--request-timeout", requestTimeout);
        }
        if (loadDeadline != null) {
            Durations.requirePositive("--kv-load-deadline", loadDeadline);
        }
        if (loadDeadlinePrefill != null && !(loadDeadlinePrefill > 0 && loadDeadlinePrefill <= 100)) {
            throw new IllegalArgumentException("--kv-load-deadline-prefill must be in (0, 100], got " + loadDeadlinePrefill);
        }
        ApiToken token = ApiToken.load(apiTokenFile);
        if (token == null && !insecure && !ExposureOptions.loopback(host)) {
            throw new IllegalArgumentException("refusing to serve the engine API on " + host + " without a token: anyone"
                    + " who can reach it could pause the engine, load other weights or reset its caches. Give it"
                    + " --api-token-file FILE (or KVPOOL_ENGINE_TOKEN_FILE; make it with: head -c 32 /dev/urandom | base64"
                    + " > FILE; chmod 600 FILE) and give the trainer the same file, or listen on 127.0.0.1, or say --insecure.");
        }
        ModelConfig mc = engine.modelConfig();
        EngineConfig ec = engine.engineConfig(mc, EngineConfig.DEFAULT_BLOCKS);
        PoolConnector.ResetScope scope = switch (resetScope) {
            case "all" -> PoolConnector.ResetScope.ALL_FENCED;
            case "model" -> PoolConnector.ResetScope.MODEL;
            default -> throw new IllegalArgumentException("--reset-scope must be all or model, got " + resetScope);
        };
        KvPoolClient client = null;
        KvConnector connector = null;
        String external = "none";
        java.nio.file.Path cfgFile = offloadConfig != null ? offloadConfig
                : System.getenv("KVPOOL_CONFIG_PATH") != null ? java.nio.file.Path.of(System.getenv("KVPOOL_CONFIG_PATH"))
                : null;
        if (master != null) {
            client = KvPoolClient.connect(clientConfig(master));
            connector = new PoolConnector(client, new BlockHasher(ec.blockSize(), ec.hashSeed()),
                    KeyFormat.of(ec.modelName(), engine.weightsVersion, "f32"), scope, engine.granularity());
            external = "kvpool at " + master;
        } else if (cfgFile != null) {
            var loaded = io.kvpool.connector.config.OffloadConfigs.load(cfgFile);
            loaded.warnings().forEach(w -> System.out.println("warning: " + cfgFile + ": " + w));
            long blockBytes = mc.kvBytesPerToken() * ec.blockSize();
            var side = new ConnectorFactory.EngineSide(ec.blockSize(), ec.hashSeed(), ec.modelName(), engine.weightsVersion,
                    "f32", blockBytes);
            var built = ConnectorFactory.build(loaded.config(), side, this::adjust);
            client = built.client();
            connector = built.connector();
            if (loaded.config().versionedKeys() && !ec.versionedKeys()) {
                ec = ec.withVersionedKeys(true);
            }
            external = loaded.config() instanceof OffloadConfig.Pool p
                    ? "kvpool at " + p.master() + " (" + cfgFile + ")" : "native offload (" + cfgFile + ")";
        }
        if (loadDeadline != null || loadDeadlinePrefill != null) {
            if (connector instanceof PoolConnector pc) {
                pc.loadDeadline(loadDeadline).loadDeadlineFromPrefill(loadDeadlinePrefill == null ? Double.NaN : loadDeadlinePrefill);
            } else {
                System.out.println("warning: --kv-load-deadline(-prefill): ignored, the engine has no pool connector ("
                        + external + ")");
            }
        }
        if (requestTimeout != null && client == null) {
            System.out.println("warning: --request-timeout: ignored, the engine has no pool client (" + external + ")");
        }
        KvPoolClient ownedClient = client;
        Engine e = new Engine(ec, mc, engine.weights(mc), engine.weightsVersion, connector);
        EngineServer server = new EngineServer(e, host, port, token);
        CountDownLatch stop = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            server.close();
            e.close();
            if (ownedClient != null) {
                ownedClient.close();
            }
            stop.countDown();
        }, "kvpool-engine-shutdown"));
        System.out.printf("kvpool engine: %s (%d layers, dim %d, %d KV bytes/token), %d KV blocks of %d tokens,"
                        + " external cache %s; http://%s:%d/v1/completions%n", ec.modelName(), mc.nLayers(), mc.dim(),
                e.kvBytesPerToken(), ec.numBlocks(), ec.blockSize(), external, host, server.port());
        System.out.flush();
        stop.await();
        return 0;
    }
}
