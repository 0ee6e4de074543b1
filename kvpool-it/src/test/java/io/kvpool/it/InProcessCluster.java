package io.kvpool.it;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.config.HostPort;
import io.kvpool.config.Size;
import io.kvpool.master.MasterConfig;
import io.kvpool.master.MasterServer;
import io.kvpool.node.NodeConfig;
import io.kvpool.node.StorageNode;

import java.io.IOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.function.UnaryOperator;

/** A master and N nodes in this JVM, on loopback with free ports: fast to start, real sockets. */
final class InProcessCluster implements AutoCloseable {

    final MasterServer master;
    final List<StorageNode> nodes = new ArrayList<>();

    InProcessCluster(int nodeCount, Size segmentSize) throws Exception {
        this(nodeCount, segmentSize, c -> c, n -> n);
    }

    InProcessCluster(int nodeCount, Size segmentSize, UnaryOperator<MasterConfig> masterTweak,
                     UnaryOperator<NodeConfig> nodeTweak) throws Exception {
        master = new MasterServer(masterTweak.apply(MasterConfig.defaults().withListen("127.0.0.1", 0, 0)
                .withSummaryInterval(Duration.ZERO)));
        try {
            for (int i = 0; i < nodeCount; i++) {
                addNode(segmentSize, nodeTweak);
            }
        } catch (Exception e) {
            close();
            throw e;
        }
    }

    StorageNode addNode(Size segmentSize, UnaryOperator<NodeConfig> nodeTweak) throws IOException, InterruptedException {
        StorageNode n = new StorageNode(nodeTweak.apply(
                NodeConfig.defaults(new HostPort("127.0.0.1", master.port()), segmentSize).withListen("127.0.0.1", 0)));
        nodes.add(n);
        if (!n.awaitRegistered(Duration.ofSeconds(30))) {
            throw new IllegalStateException("node " + n.name() + " did not register");
        }
        return n;
    }

    String masterAddress() {
        return "127.0.0.1:" + master.port();
    }

    KvPoolClient client() {
        return client(c -> c);
    }

    KvPoolClient client(UnaryOperator<ClientConfig> tweak) {
        return KvPoolClient.connect(tweak.apply(ClientConfig.forMaster(masterAddress())));
    }

    @Override
    public void close() {
        for (StorageNode n : nodes) {
            n.close();
        }
        master.close();
    }
}
