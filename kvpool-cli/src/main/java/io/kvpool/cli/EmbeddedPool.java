package io.kvpool.cli;

import io.kvpool.config.HostPort;
import io.kvpool.master.MasterConfig;
import io.kvpool.master.MasterServer;
import io.kvpool.node.NodeConfig;
import io.kvpool.node.StorageNode;

import java.io.IOException;
import java.time.Duration;

/**
 * A master and one node in one process: the single-machine default behind {@code kvpool serve} and
 * {@code kvpool demo}. The node registers with the master over loopback like any other node.
 */
public final class EmbeddedPool implements AutoCloseable {

    private final MasterServer master;
    private final StorageNode node;

    /**
     * Starts the master, then the node, and waits until the node is registered.
     *
     * @param nodeConfigFor builds the node's config once the master's port is known
     */
    public EmbeddedPool(MasterConfig masterConfig, java.util.function.Function<HostPort, NodeConfig> nodeConfigFor)
            throws IOException {
        this.master = new MasterServer(masterConfig);
        StorageNode n = null;
        try {
            String host = "0.0.0.0".equals(masterConfig.listenHost()) ? "127.0.0.1" : masterConfig.listenHost();
            HostPort at = new HostPort(host, master.port());
            n = new StorageNode(nodeConfigFor.apply(at));
            // the node's COMMITs for its writers (NODE_WRITE_COMMIT) are calls into this master, not frames
            n.commitInProcess(at, master::commitInProcess);
            if (!n.awaitRegistered(Duration.ofSeconds(30))) {
                throw new IOException("the embedded node did not register with the embedded master within 30s");
            }
        } catch (IOException | RuntimeException e) {
            if (n != null) {
                n.close();
            }
            master.close();
            throw e;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            n.close();
            master.close();
            throw new IOException("interrupted while starting", e);
        }
        this.node = n;
        // the node's own series and page live on the master's HTTP port: one port for the machine
        n.registerMetrics(master.metrics().registry());
        if (master.http() != null) {
            n.mountStatus(master.http(), "/node/", null);
            master.statusLink("node " + n.name(), "node/");
        }
    }

    public MasterServer master() {
        return master;
    }

    public StorageNode node() {
        return node;
    }

    /** The address clients use. */
    public String masterAddress() {
        String host = "0.0.0.0".equals(master.service().config().listenHost()) ? "127.0.0.1"
                : master.service().config().listenHost();
        return new HostPort(host, master.port()).toString();
    }

    /** Stops the master first, so it sends nothing more to the node, then the node. */
    @Override
    public void close() {
        master.close();
        node.close();
    }
}
