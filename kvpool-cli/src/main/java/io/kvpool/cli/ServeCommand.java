package io.kvpool.cli;

import io.kvpool.client.ClientConfig;
import io.kvpool.config.Size;
import io.kvpool.etcd.MasterAddress;
import io.kvpool.master.MasterConfig;
import io.kvpool.node.NodeConfig;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

import java.time.Duration;
import java.util.concurrent.Callable;
import java.util.concurrent.CountDownLatch;

/** {@code kvpool serve}: master and one node in one process, the embedded default for one machine. */
@Command(name = "serve", mixinStandardHelpOptions = true,
        description = "Run a master and one storage node in one process (the single-machine default).")
final class ServeCommand implements Callable<Integer> {

    @Option(names = "--host", paramLabel = "ADDRESS",
            description = "Address to listen on and advertise to clients (default: ${DEFAULT-VALUE}; use this"
                    + " machine's LAN address to serve other machines).")
    String host = "127.0.0.1";

    @Option(names = "--node-port", paramLabel = "PORT", description = "Port of the node (default: ${DEFAULT-VALUE}).")
    int nodePort = NodeConfig.DEFAULT_PORT;

    @Mixin
    MasterOptions masterOptions;

    @Mixin
    NodeOptions nodeOptions;

    /** The same limits for the master's port and the node's. */
    @Mixin
    ExposureOptions exposure;

    @Override
    public Integer call() throws Exception {
        Bounds.port("--node-port", nodePort, false);
        CountDownLatch stop = new CountDownLatch(1);
        // installed before the pool starts: a SIGTERM while it starts leaves nothing behind either
        try (OnExit exit = OnExit.start("serve", nodeOptions.shmPath())) {
            exit.add(stop::countDown);
            MasterConfig config = masterOptions.toConfig(host, exposure);
            EmbeddedPool pool = exit.add(new EmbeddedPool(config,
                    master -> nodeOptions.toConfig(MasterAddress.of(master), host, nodePort, host, exposure)));
            // serving means usable: a put went through (a registered node alone was not enough)
            ReadyCheck.awaitPut(ClientConfig.forMaster(pool.masterAddress()).withSecrets(config.secrets()),
                    Duration.ofSeconds(60));
            serve(pool);
            stop.await();
        }
        return 0;
    }

    /** Says where the pool serves. */
    private void serve(EmbeddedPool pool) {
        String web = "http://" + ("0.0.0.0".equals(host) ? "127.0.0.1" : host) + ":" + pool.master().httpPort() + "/";
        System.out.printf("kvpool serving: master %s, segment %s of %s, metrics %smetrics%n",
                pool.masterAddress(), pool.node().name(), Size.human(pool.node().capacity()), web);
        if (pool.master().httpPort() >= 0) {
            System.out.println("status page: " + web + " (the node's: " + web + "node/)");
        }
        System.out.println("clients: KvPoolClient.connect(\"" + pool.masterAddress() + "\"); stop with Ctrl-C");
        System.out.flush();
    }
}
