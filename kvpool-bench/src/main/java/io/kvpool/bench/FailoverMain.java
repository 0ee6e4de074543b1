package io.kvpool.bench;

import io.kvpool.config.Size;
import io.kvpool.etcd.EtcdTarget;
import io.kvpool.etcd.MasterAddress;
import io.kvpool.master.ElectedMaster;
import io.kvpool.master.MasterConfig;
import io.kvpool.node.NodeConfig;
import io.kvpool.node.StorageNode;

import java.time.Duration;

/**
 * One process of the failover benchmark's cluster ({@link FailoverBench}): an elected master, or a
 * node following the elected master. Prints {@code ready PID} once started and runs until stopped or
 * until its parent is gone ({@link Children#exitWithParent}).
 *
 * <pre>
 *   java -cp ... io.kvpool.bench.FailoverMain master ETCD_URL ID PORT [hot|cold [HTTP_PORT [LISTEN_HOST]]]
 *   java -cp ... io.kvpool.bench.FailoverMain node ETCD_URL SEGMENT_SIZE
 * </pre>
 * A master advertises 127.0.0.1; with LISTEN_HOST (another loopback address, e.g. 127.0.0.2) it listens
 * there instead, so that a relay on 127.0.0.1 at the same port is the only way to it (the partitioned
 * leader of {@link FailoverBench}). HTTP_PORT -1 (the default) serves no metrics.
 */
public final class FailoverMain {

    private FailoverMain() {
    }

    public static void main(String[] args) throws Exception {
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        System.setProperty("org.slf4j.simpleLogger.log.io.kvpool.master.TakeOver", "info"); // what the bench prints
        AutoCloseable running;
        if (args[0].equals("master")) {
            int http = args.length > 5 ? Integer.parseInt(args[5]) : -1;
            String listen = args.length > 6 ? args[6] : "127.0.0.1";
            MasterConfig mc = MasterConfig.defaults().withListen(listen, Integer.parseInt(args[3]), http)
                    .withSummaryInterval(Duration.ZERO);
            running = new ElectedMaster(mc, new ElectedMaster.Options(EtcdTarget.parse(args[1]), args[2], "127.0.0.1",
                    ElectedMaster.Options.DEFAULT_LEASE_TTL, ElectedMaster.Options.DEFAULT_REBUILD_GRACE,
                    args.length > 4 && args[4].equals("hot")));
        } else {
            running = new StorageNode(NodeConfig.defaults(MasterAddress.parse(args[1]), Size.parse(args[2]))
                    .withListen("127.0.0.1", 0));
        }
        Children.serve(running);
    }
}
