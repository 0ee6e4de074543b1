package io.kvpool.cli;

import io.kvpool.config.LocalHost;
import io.kvpool.etcd.EtcdTarget;
import io.kvpool.master.ElectedMaster;
import io.kvpool.master.MasterConfig;
import io.kvpool.master.MasterServer;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

import java.time.Duration;
import java.util.concurrent.Callable;
import java.util.concurrent.CountDownLatch;

/** {@code kvpool master}: the metadata service alone, or one of several elected through etcd. */
@Command(name = "master", mixinStandardHelpOptions = true,
        description = "Run the master: metadata, placement, eviction, membership, metrics. No object bytes pass through it."
                + " With --etcd, run one of several masters of which etcd elects one to lead; the others stand by.")
final class MasterCommand implements Callable<Integer> {

    @Option(names = "--host", paramLabel = "ADDRESS", description = "Address to listen on (default: ${DEFAULT-VALUE}).")
    String host = "0.0.0.0";

    @Option(names = "--etcd", paramLabel = "etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]",
            description = "Take part in the election of the cluster's master through these etcd endpoints."
                    + " Nodes and clients are then given the same etcd:// address instead of a master's.")
    String etcd;

    @Option(names = "--id", paramLabel = "NAME",
            description = "This master's name among the elected masters (default: host-port).")
    String id;

    @Option(names = "--advertise-host", paramLabel = "HOST",
            description = "The host nodes and clients reach this master at, published in etcd (default: --host, or this machine's address).")
    String advertiseHost;

    @Option(names = "--leader-lease", paramLabel = "DURATION",
            description = "How long a leader that died keeps the role before a standby takes over (default: 2s; etcd grants at least 2s).")
    Duration leaderLease = ElectedMaster.Options.DEFAULT_LEASE_TTL;

    @Option(names = "--rebuild-grace", paramLabel = "DURATION",
            description = "How long a new leader waits for the previous leader's nodes to register before it serves anyway (default: 3s).")
    Duration rebuildGrace = ElectedMaster.Options.DEFAULT_REBUILD_GRACE;

    @Option(names = "--hot-standby",
            description = "While standing by, keep a copy of the leader's metadata (its change feed) and, elected, serve"
                    + " from it at once instead of rebuilding from the nodes; a leader that is gone (its port refuses"
                    + " connections) is replaced without waiting for its lease (docs/architecture.md, \"Hot standby\").")
    boolean hotStandby;

    @Mixin
    MasterOptions options;

    @Mixin
    ExposureOptions exposure;

    @Override
    public Integer call() throws Exception {
        CountDownLatch stop = new CountDownLatch(1);
        MasterConfig config = options.toConfig(host, exposure);
        AutoCloseable running;
        if (etcd != null) {
            String advertise = advertiseHost != null ? advertiseHost
                    : ("0.0.0.0".equals(host) || "::".equals(host) ? LocalHost.defaultAdvertiseAddress() : host);
            String name = id != null ? id : (advertise + "-" + config.port()).replace(':', '-');
            ElectedMaster m = new ElectedMaster(config, new ElectedMaster.Options(EtcdTarget.parse(etcd), name,
                    advertise, leaderLease, rebuildGrace, hotStandby));
            running = m;
            System.out.printf("kvpool master %s standing for election in %s; will serve on %s:%d, metrics on port %d%n",
                    name, etcd, advertise, config.port(), config.httpPort());
        } else {
            MasterServer master = new MasterServer(config);
            running = master;
            System.out.printf("kvpool master listening on %s:%d, metrics on port %d%s%n", host, master.port(),
                    master.httpPort(), master.httpPort() < 0 ? "" : ", status page http://"
                            + ("0.0.0.0".equals(host) ? LocalHost.defaultAdvertiseAddress() : host) + ":"
                            + master.httpPort() + "/");
        }
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                running.close();
            } catch (Exception e) {
                System.err.println("kvpool master: error while stopping: " + e);
            }
            stop.countDown();
        }, "kvpool-shutdown"));
        System.out.flush();
        stop.await();
        return 0;
    }
}
