package io.kvpool.cli;

import io.kvpool.config.Size;
import io.kvpool.master.MasterConfig;
import io.kvpool.protocol.Secrets;
import picocli.CommandLine.Option;

import java.time.Duration;

/** Master flags, shared by {@code kvpool master} and {@code kvpool serve}. */
final class MasterOptions {

    @Option(names = "--port", paramLabel = "PORT", description = "Master RPC port (default: ${DEFAULT-VALUE}).")
    int port = MasterConfig.DEFAULT_PORT;

    @Option(names = "--http-port", paramLabel = "PORT",
            description = "Port for /metrics and /health; -1 turns HTTP off (default: ${DEFAULT-VALUE}).")
    int httpPort = MasterConfig.DEFAULT_HTTP_PORT;

    @Option(names = "--node-ttl", paramLabel = "DURATION",
            description = "Drop a node after this long without a heartbeat (default: 10s).")
    Duration nodeTtl = MasterConfig.DEFAULT_NODE_TTL;

    @Option(names = "--read-lease", paramLabel = "DURATION",
            description = "How long a client may read from locations it remembers without hearing from the master;"
                    + " also the longest a removal or reset waits for a client that does not answer (default: 2s).")
    Duration readLease = MasterConfig.DEFAULT_READ_LEASE;

    @Option(names = "--put-timeout", paramLabel = "DURATION",
            description = "Reclaim a put not completed within this long (default: 30s).")
    Duration putTimeout = MasterConfig.DEFAULT_PUT_TIMEOUT;

    @Option(names = "--eviction-high-watermark", paramLabel = "FRACTION",
            description = "Start evicting when this fraction of capacity is used (default: ${DEFAULT-VALUE}).")
    double highWatermark = MasterConfig.DEFAULT_HIGH_WATERMARK;

    @Option(names = "--eviction-ratio", paramLabel = "FRACTION",
            description = "Each eviction round frees this fraction of capacity (default: ${DEFAULT-VALUE}).")
    double evictionRatio = MasterConfig.DEFAULT_EVICTION_RATIO;

    @Option(names = "--max-value-size", paramLabel = "SIZE", description = "Largest value accepted (default: 256MiB).")
    Size maxValueSize = MasterConfig.DEFAULT_MAX_VALUE_SIZE;

    @Option(names = "--replicas", paramLabel = "N",
            description = "Copies per object unless a client asks otherwise, best effort (default: ${DEFAULT-VALUE}).")
    int replicas = 1;

    @Option(names = "--max-pinned", paramLabel = "FRACTION",
            description = "Most of the memory capacity pinned objects may hold; a pin past it is refused and the"
                    + " object stored unpinned (default: ${DEFAULT-VALUE}).")
    double maxPinned = MasterConfig.DEFAULT_MAX_PINNED;

    @Option(names = "--summary-interval", paramLabel = "DURATION",
            description = "Log a one-line summary this often; 0s turns it off (default: 10s).")
    Duration summaryInterval = MasterConfig.DEFAULT_SUMMARY_INTERVAL;

    /** Builds the typed config; a bad combination raises IllegalArgumentException naming the field. */
    MasterConfig toConfig(String listenHost, ExposureOptions exposure) {
        MasterConfig d = MasterConfig.defaults();
        return new MasterConfig(listenHost, port, httpPort, nodeTtl, d.clientTtl(), readLease, putTimeout, highWatermark,
                evictionRatio, maxValueSize, replicas, d.tickInterval(), summaryInterval, d.frameTimeout(),
                exposure.apply(d.limits()), 0, maxPinned, Secrets.NONE)
                .withSecrets(exposure.secrets("master", listenHost)); // after the flags' own checks
    }
}
