package io.kvpool.bench;

import io.kvpool.config.HostPort;
import io.kvpool.config.Size;
import io.kvpool.master.MasterConfig;
import io.kvpool.master.MasterServer;
import io.kvpool.node.NodeConfig;
import io.kvpool.node.StorageNode;
import io.kvpool.protocol.Tls;

import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;

/**
 * The pool under test, in its own JVM: a master, and NODES nodes (default 1) unless the segment
 * size is 0 (then a master alone, for the metadata benchmark), in mutual TLS when given the three
 * PEM files. Prints {@code ready MASTER_PORT HTTP_PORT PID NODES} once serving (NODES: the nodes'
 * names, comma-separated, or {@code -}), and runs until stopped or until its parent is gone
 * ({@link Children#exitWithParent}); either way its nodes close and delete their segment files.
 * Started by {@link PoolProcess}.
 *
 * <pre>
 *   java -cp ... io.kvpool.bench.PoolMain SEGMENT_SIZE [NODES [CERT KEY CA]]
 * </pre>
 */
public final class PoolMain {

    private PoolMain() {
    }

    public static void main(String[] args) throws Exception {
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        long segment = Size.parse(args[0]).bytes();
        MasterConfig mc = MasterConfig.defaults().withListen("127.0.0.1", 0, 0).withSummaryInterval(Duration.ZERO)
                .withMaxValueSize(Size.ofMiB(64));
        Tls tls = args.length > 4 ? Tls.load(Path.of(args[2]), Path.of(args[3]), Path.of(args[4])) : Tls.NONE;
        mc = mc.withTls(tls);
        MasterServer master = new MasterServer(mc);
        int count = segment > 0 ? (args.length > 1 ? Integer.parseInt(args[1]) : 1) : 0;
        List<StorageNode> nodes = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            StorageNode node = new StorageNode(NodeConfig.defaults(new HostPort("127.0.0.1", master.port()),
                    Size.ofBytes(segment)).withListen("127.0.0.1", 0).withTls(tls));
            nodes.add(node);
            node.commitInProcess(new HostPort("127.0.0.1", master.port()), master::commitInProcess);
            if (!node.awaitRegistered(Duration.ofSeconds(30))) {
                throw new IllegalStateException("node " + node.name() + " did not register");
            }
        }
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            nodes.forEach(StorageNode::close);
            master.close();
        }));
        Children.exitWithParent();
        String names = nodes.isEmpty() ? "-" : String.join(",", nodes.stream().map(StorageNode::name).toList());
        System.out.println("ready " + master.port() + " " + master.httpPort() + " " + ProcessHandle.current().pid() + " "
                + names);
        System.out.flush();
        new CountDownLatch(1).await();
    }
}
