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

    /** The node's status page server, on --http-port, or on a free port when the default one is taken. */
    private HttpServer listen(StorageNode node) throws IOException {
        try {
            return StatusPages.listen("node", host, httpPort);
        } catch (IOException e) {
            if (spec.commandLine().getParseResult().hasMatchedOption("--http-port")) {
                throw e;
            }
            // the default port is taken (several nodes on one machine): the page moves, the node runs
            HttpServer http = StatusPages.listen("node", host, 0);
            System.out.printf("kvpool node %s: HTTP port %d is in use (another node on this machine?); the status"
                    + " page and /metrics are on port %d instead (give --http-port to choose)%n", node.name(),
                    httpPort, http.getAddress().getPort());
            return http;
        }
    }

    @Override
    public Integer call() throws Exception {
        if (httpPort < -1 || httpPort > 65535) {
            throw new CommandLine.ParameterException(spec.commandLine(), "--http-port " + httpPort
                    + " is out of range: 0..65535, or -1 for no HTTP");
        }
        CountDownLatch stop = new CountDownLatch(1);
        // installed before the node starts: a SIGTERM while it starts leaves no segment file either
        try (OnExit exit = OnExit.start("node", options.shmPath())) {
            exit.add(stop::countDown);
            StorageNode node = exit.add(new StorageNode(options.toConfig(master, host, port, advertiseHost, exposure)));
            // first the line that names the node (scripts wait for it), then its page
            System.out.printf("kvpool node %s: %s segment, master %s%n", node.name(), Size.human(node.capacity()), master);
            System.out.flush();
            // SIGUSR1: stop for a restart, keeping the segment file for the next start on this address to
            // adopt (kvpool rolling-restart sends it); SIGTERM stops and removes the file
            RestartSignal.onRestart(() -> {
                System.out.printf("kvpool node %s: stopping for a restart; the segment file is kept for the next"
                        + " start on this address%n", node.name());
                System.out.flush();
                exit.keepSegmentFiles();
                node.closeForRestart();
                System.exit(0);
            });
            if (httpPort >= 0) {
                HttpServer web = listen(node);
                exit.add(() -> web.stop(0));
                PrometheusRegistry registry = new PrometheusRegistry();
                node.registerMetrics(registry);
                node.mountStatus(web, "/", registry);
                web.start();
                System.out.printf("kvpool node %s: status page http://%s:%d/%n", node.name(), node.advertiseHost(),
                        web.getAddress().getPort());
                System.out.flush();
            }
            stop.await();
        }
        return 0;
    }
}
