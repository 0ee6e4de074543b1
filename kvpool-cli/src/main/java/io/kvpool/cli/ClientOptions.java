package io.kvpool.cli;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.config.HostPort;
import io.kvpool.etcd.MasterAddress;
import io.kvpool.master.MasterConfig;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

/**
 * {@code --master} for the client commands, defaulting to env {@code KVPOOL_MASTER}, then 127.0.0.1:50051;
 * {@code --no-shm} to force TCP; the TLS flags ({@link TlsOptions}).
 */
final class ClientOptions {

    static final String MASTER_ENV = "KVPOOL_MASTER";

    @Option(names = "--master", paramLabel = "HOST:PORT|etcd://HOST:PORT,...[/CLUSTER]",
            description = "Master address, or the etcd that elects the masters (default: env KVPOOL_MASTER, else 127.0.0.1:50051).")
    MasterAddress master;

    @Option(names = "--no-shm", description = "Move bytes over TCP even to a node on this machine (default: the"
            + " same-machine shared-memory path where it is available).")
    boolean noSharedMemory;

    @Mixin
    TlsOptions tls;

    MasterAddress master() {
        if (master != null) {
            return master;
        }
        String env = System.getenv(MASTER_ENV);
        if (env != null && !env.isBlank()) {
            try {
                return MasterAddress.parse(env);
            } catch (IllegalArgumentException e) {
                throw new IllegalArgumentException("env " + MASTER_ENV + ": " + e.getMessage());
            }
        }
        return MasterAddress.of(new HostPort("127.0.0.1", MasterConfig.DEFAULT_PORT));
    }

    KvPoolClient connect() {
        return KvPoolClient.connect(ClientConfig.forMaster(master()).withSharedMemory(!noSharedMemory)
                .withTls(tls.tls()));
    }
}
