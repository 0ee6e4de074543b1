package io.kvpool.it;

import io.kvpool.bench.soak.Relay;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.client.PutStatus;
import io.kvpool.config.HostPort;
import io.kvpool.config.Size;
import io.kvpool.master.MasterConfig;
import io.kvpool.master.MasterServer;
import io.kvpool.node.NodeConfig;
import io.kvpool.node.StorageNode;
import org.junit.jupiter.api.Test;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * A node cut off from the master (a network partition, not a crash) is dropped after the TTL, its
 * objects become misses, and when the network heals it registers again with everything it still
 * holds.
 */
class MembershipIT {

    @Test
    void partitionedNodeIsDroppedAndComesBackWithItsObjects() throws Exception {
        MasterConfig mc = MasterConfig.defaults().withListen("127.0.0.1", 0, -1)
                .withNodeTtl(Duration.ofSeconds(1)).withSummaryInterval(Duration.ZERO);
        try (MasterServer master = new MasterServer(mc);
             Relay net = new Relay(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0),
                     new InetSocketAddress("127.0.0.1", master.port()));
             StorageNode node = new StorageNode(NodeConfig.defaults(new HostPort("127.0.0.1", net.port()), Size.ofMiB(32))
                     .withListen("127.0.0.1", 0).withHeartbeatInterval(Duration.ofMillis(200)));
             KvPoolClient c = KvPoolClient.connect("127.0.0.1:" + master.port())) {
            assertThat(node.awaitRegistered(Duration.ofSeconds(30))).isTrue();
            Map<String, byte[]> stored = new HashMap<>();
            for (int i = 0; i < 30; i++) {
                String k = "part/" + i;
                byte[] v = Payloads.make(k, 1, 10_000 + i * 1000);
                assertThat(c.put(k, v)).isEqualTo(PutStatus.OK);
                stored.put(k, v);
            }

            net.cut(Relay.Mode.RESET);
            ProcessCluster.awaitStats(c, s -> s.segments().isEmpty(), "the silent node is dropped");
            for (String k : stored.keySet()) {
                assertThat(c.get(k)).as("objects on a dropped node are misses").isEmpty();
            }
            assertThat(c.put("part/while-cut", new byte[10])).isEqualTo(PutStatus.NO_SEGMENT);

            net.heal();
            PoolStats s = ProcessCluster.awaitStats(c, st -> st.keys() == stored.size() && st.segments().size() == 1
                    && st.segments().getFirst().active(), "the node is back with its objects");
            assertThat(s.segments().getFirst().name()).isEqualTo(node.name());
            for (Map.Entry<String, byte[]> e : stored.entrySet()) {
                assertThat(c.get(e.getKey())).as(e.getKey()).hasValueSatisfying(b -> assertThat(b).isEqualTo(e.getValue()));
            }
            assertThat(c.put("part/after", new byte[10])).isEqualTo(PutStatus.OK);
        }
    }
}
