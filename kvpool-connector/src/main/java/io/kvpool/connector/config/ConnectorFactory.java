package io.kvpool.connector.config;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.connector.KvConnector;
import io.kvpool.connector.LocalOffloadConnector;
import io.kvpool.connector.PoolConnector;
import io.kvpool.connector.hash.BlockHasher;
import io.kvpool.connector.hash.KeyFormat;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.Map;
import java.util.Objects;
import java.util.function.UnaryOperator;

/**
 * The one place an engine's connector comes from: an {@link OffloadConfig} plus what the engine
 * knows about its KV ({@link EngineSide}) gives a {@link KvConnector} ({@link #build}), or the same
 * description rendered in the shape of vLLM's {@code kv_transfer_config} ({@link #toVllmJson}), so
 * it reads familiar to people who configure vLLM.
 */
public final class ConnectorFactory {

    /** Name under which kvpool's connectors appear in vLLM-shaped configs. */
    public static final String POOL_CONNECTOR = "KvPoolConnector";
    public static final String NATIVE_CONNECTOR = "KvPoolNativeOffloadConnector";

    /**
     * What the engine contributes: block size and hash seed (shared with the pool's other users),
     * model, weight version, KV dtype, and the bytes of one block (all layers).
     */
    public record EngineSide(int blockSize, String hashSeed, String model, String weights, String kvDtype,
                             long blockBytes) {
    }

    /** A connector and the pool client it owns (null for native offload): close both. */
    public record Built(KvConnector connector, KvPoolClient client) implements AutoCloseable {
        @Override
        public void close() {
            connector.close();
            if (client != null) {
                client.close();
            }
        }
    }

    private ConnectorFactory() {
    }

    public static Built build(OffloadConfig config, EngineSide engine) {
        return build(config, engine, UnaryOperator.identity());
    }

    /**
     * Builds the connector; for a pool, its client is connected with the defaults changed by
     * {@code client} (a request timeout, say).
     */
    public static Built build(OffloadConfig config, EngineSide engine, UnaryOperator<ClientConfig> client) {
        Objects.requireNonNull(config, "config");
        if (config.transfer() != null) {
            throw new IllegalArgumentException("offload.transfer: the " + config.transfer().connector()
                    + " transfer connector runs inside vLLM, not the Java engine; render this config with"
                    + " toVllmJson for vLLM, or drop transfer for the reference engine");
        }
        BlockHasher hasher = new BlockHasher(engine.blockSize(), engine.hashSeed());
        KeyFormat keys = KeyFormat.of(engine.model(), engine.weights(), engine.kvDtype());
        return switch (config) {
            case OffloadConfig.Native n -> {
                try {
                    long disk = n.disk() == null ? 0
                            : n.disk().size() != null ? n.disk().size().bytes() : 4 * n.cpu().bytes();
                    yield new Built(new LocalOffloadConnector(hasher, keys, engine.blockBytes(), n.cpu().bytes(),
                            n.disk() == null ? null : n.disk().path(), disk), null);
                } catch (IOException e) {
                    throw new UncheckedIOException("native offload: cannot open the disk tier at " + n.disk().path(), e);
                }
            }
            case OffloadConfig.Pool p -> {
                if (p.master() == null) {
                    throw new IllegalArgumentException("offload.master: not set; start the pool with kvpool launch"
                            + " (which writes it into the config at $KVPOOL_CONFIG_PATH) or give master: host:port");
                }
                KvPoolClient pool = KvPoolClient.connect(client.apply(ClientConfig.forMaster(p.master())));
                yield new Built(new PoolConnector(pool, hasher, keys, p.reset().equals("model")
                        ? PoolConnector.ResetScope.MODEL : PoolConnector.ResetScope.ALL_FENCED), pool);
            }
        };
    }

    /**
     * The config as vLLM's kv_transfer_config: {@code kv_connector}, {@code kv_role},
     * {@code kv_connector_extra_config}; with a transfer connector, a MultiConnector over the
     * transfer connector and the offload one.
     */
    public static String toVllmJson(OffloadConfig config, EngineSide engine) {
        ObjectMapper m = new ObjectMapper();
        ObjectNode offload = m.createObjectNode();
        ObjectNode extra = m.createObjectNode();
        extra.put("cpu_bytes", config.cpu().bytes());
        if (config.disk() != null) {
            extra.put("disk_path", config.disk().path().toString());
            if (config.disk().size() != null) {
                extra.put("disk_bytes", config.disk().size().bytes());
            }
        }
        extra.put("block_size", engine.blockSize()).put("hash", "sha256_cbor").put("hash_seed", engine.hashSeed())
                .put("versioned_keys", config.versionedKeys());
        switch (config) {
            case OffloadConfig.Native n -> offload.put("kv_connector", NATIVE_CONNECTOR);
            case OffloadConfig.Pool p -> {
                offload.put("kv_connector", POOL_CONNECTOR);
                if (p.master() != null) {
                    extra.put("master", p.master());
                }
                extra.put("reset", p.reset()).put("promote_after", p.promoteAfter());
            }
        }
        offload.put("kv_role", "kv_both");
        offload.set("kv_connector_extra_config", extra);
        if (config.transfer() == null) {
            return pretty(m, offload);
        }
        ObjectNode transfer = m.createObjectNode();
        transfer.put("kv_connector", config.transfer().connector()).put("kv_role", config.transfer().role());
        transfer.set("kv_connector_extra_config", m.valueToTree(config.transfer().extra() == null ? Map.of()
                : config.transfer().extra()));
        ObjectNode multi = m.createObjectNode();
        multi.put("kv_connector", "MultiConnector").put("kv_role", config.transfer().role());
        ArrayNode list = multi.putObject("kv_connector_extra_config").putArray("connectors");
        list.add(transfer);
        list.add(offload);
        return pretty(m, multi);
    }

    private static String pretty(ObjectMapper m, ObjectNode n) {
        try {
            return m.writerWithDefaultPrettyPrinter().writeValueAsString(n);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }
}
