package io.kvpool.cli;

import io.kvpool.protocol.Limits;
import picocli.CommandLine.Option;

/** How many connections a master's or node's port keeps open; one mixin per command (serve shares it). */
final class ConnectionLimitOptions {

    @Option(names = "--max-connections", paramLabel = "N",
            description = "Most connections the port keeps open; one more is told so and closed (default: ${DEFAULT-VALUE}).")
    int maxConnections = Limits.DEFAULT_MAX_CONNECTIONS;

    @Option(names = "--max-connections-per-host", paramLabel = "N",
            description = "Most connections from one peer address (default: ${DEFAULT-VALUE}).")
    int maxConnectionsPerHost = Limits.DEFAULT_MAX_CONNECTIONS_PER_HOST;

    /** {@code base} with these connection limits; IllegalArgumentException naming the flag when they are bad. */
    Limits apply(Limits base) {
        if (maxConnections < 1) {
            throw new IllegalArgumentException("--max-connections must be at least 1, got " + maxConnections);
        }
        if (maxConnectionsPerHost < 1 || maxConnectionsPerHost > maxConnections) {
            throw new IllegalArgumentException("--max-connections-per-host must be between 1 and --max-connections ("
                    + maxConnections + "), got " + maxConnectionsPerHost);
        }
        return base.withConnections(maxConnections, maxConnectionsPerHost);
    }
}
