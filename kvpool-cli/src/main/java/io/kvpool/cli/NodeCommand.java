package io.kvpool.cli;

import io.kvpool.config.HostPort;
import io.kvpool.config.Size;
import io.kvpool.etcd.MasterAddress;
import io.kvpool.node.NodeConfig;
import io.kvpool.node.StorageNode;
import com.sun.net.httpserver.HttpServer;
import io.kvpool.web.StatusPages;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import picocli.CommandLine;
import picocli.CommandLine.Command;
import picocli.CommandLine.Model.CommandSpec;
import picocli.CommandLine.Spec;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

import java.io.IOException;
import java.util.concurrent.Callable;
import java.util.concurrent.CountDownLatch;

/** {@code kvpool node}: one storage node. */
@Command(name = "node", mixinStandardHelpOptions = true,
        description = "Run a storage node that contributes an off-heap memory segment to the pool.")
final class NodeCommand implements Callable<Integer> {

    @Spec
    CommandSpec spec;

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

    @Option(names = "--http-port", paramLabel = "PORT",
            description = "HTTP port of the node's status page and /metrics; 0 picks one, -1 turns HTTP off"
                    + " (default: ${DEFAULT-VALUE}).")
    int httpPort = DEFAULT_HTTP_PORT;

    /** Default HTTP port of a node's status page and metrics (the master's is 9003). */
    static final int DEFAULT_HTTP_PORT = 9004;

    @Mixin
    NodeOptions options;

    @Mixin
    ExposureOptions exposure;

    @Override
    public Integer call() throws Exception {
        if (httpPort < -1 || httpPort > 65535) {
            throw new CommandLine.ParameterException(spec.commandLine(), "--http-port " + httpPort
                    + " is out of range: 0..65535, or -1 for no HTTP");
        }
        CountDownLatch stop = new CountDownLatch(1);
        StorageNode node = new StorageNode(options.toConfig(master, host, port, advertiseHost, exposure));
        HttpServer http = null;
        if (httpPort >= 0) {
            try {
                http = StatusPages.listen("node", host, httpPort);
            } catch (IOException e) {
                node.close();
                throw e;
            }
            PrometheusRegistry registry = new PrometheusRegistry();
            node.registerMetrics(registry);
            node.mountStatus(http, "/", registry);
            http.start();
        }
        HttpServer web = http;
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            if (web != null) {
                web.stop(0);
            }
            node.close();
            stop.countDown();
        }, "kvpool-shutdown"));
        System.out.printf("kvpool node %s: %s segment, master %s%s%n", node.name(), Size.human(node.capacity()), master,
                web == null ? "" : ", status page http://" + node.advertiseHost() + ":" + web.getAddress().getPort() + "/");
        System.out.flush();
        stop.await();
        return 0;
    }
}
