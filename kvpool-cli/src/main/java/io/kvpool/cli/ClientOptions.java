package io.kvpool.cli;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.config.HostPort;
import picocli.CommandLine.Option;

/** {@code --master} for the client commands, defaulting to env {@code KVPOOL_MASTER}, then 127.0.0.1:50051. */
final class ClientOptions {

    static final String MASTER_ENV = "KVPOOL_MASTER";

    @Option(names = "--master", paramLabel = "HOST:PORT",
            description = "Master address (default: env KVPOOL_MASTER, else 127.0.0.1:50051).")
    HostPort master;

    HostPort master() {
        if (master != null) {
            return master;
        }
        String env = System.getenv(MASTER_ENV);
        if (env != null && !env.isBlank()) {
            try {
                return HostPort.parse(env);
            } catch (IllegalArgumentException e) {
                throw new IllegalArgumentException("env " + MASTER_ENV + ": " + e.getMessage());
            }
        }
        return new HostPort("127.0.0.1", io.kvpool.master.MasterConfig.DEFAULT_PORT);
    }

    KvPoolClient connect() {
        return KvPoolClient.connect(ClientConfig.forMaster(master()));
    }
}
