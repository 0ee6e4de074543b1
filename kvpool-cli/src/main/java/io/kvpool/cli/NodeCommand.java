package io.kvpool.cli;

import io.kvpool.config.HostPort;
import io.kvpool.config.Size;
import io.kvpool.etcd.MasterAddress;
import io.kvpool.node.NodeConfig;
import io.kvpool.node.StorageNode;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

import java.util.concurrent.Callable;
import java.util.concurrent.CountDownLatch;

/** {@code kvpool node}: one storage node. */
@Command(name = "node", mixinStandardHelpOptions = true,
        description = "Run a storage node that contributes an off-heap memory segment to the pool.")
final class NodeCommand implements Callable<Integer> {

    @Option(names = "--master", required = true, paramLabel = "HOST:PORT|etcd://HOST:PORT,...[/CLUSTER]",
            description = "The master's address, or the etcd endpoints (and cluster name) that elect the masters.")
    MasterAddress master;

    @Option(names = "--host", paramLabel = "ADDRESS", description = "Address to listen on (default: ${DEFAULT-VALUE}).")
    String host = "0.0.0.0";

    @Option(names = "--port", paramLabel = "PORT", description = "Port to listen on; 0 picks one (default: ${DEFAULT-VALUE}).")
    int port = NodeConfig.DEFAULT_PORT;

    @Option(names = "--advertise-host", paramLabel = "ADDRESS",
            description = "Address clients use to reach this node (default: --host if specific, else the first"
                    + " non-loopback IPv4 address).")
    String advertiseHost;

    @Mixin
    NodeOptions options;

    @Mixin
    ExposureOptions exposure;

    @Override
    public Integer call() throws Exception {
        CountDownLatch stop = new CountDownLatch(1);
        StorageNode node = new StorageNode(options.toConfig(master, host, port, advertiseHost, exposure));
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            node.close();
            stop.countDown();
        }, "kvpool-shutdown"));
        System.out.printf("kvpool node %s: %s segment, master %s%n", node.name(), Size.human(node.capacity()), master);
        System.out.flush();
        stop.await();
        return 0;
    }
}
