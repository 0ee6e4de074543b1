package io.kvpool.it;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.config.HostPort;
import io.kvpool.config.Size;
import io.kvpool.master.MasterConfig;
import io.kvpool.master.MasterServer;
import io.kvpool.node.NodeConfig;
import io.kvpool.node.StorageNode;
import org.junit.jupiter.api.Test;

import java.time.Duration;

import static org.assertj.core.api.Assertions.assertThat;

class SmokeTest {
    @Test
    void putGet() throws Exception {
        try (MasterServer m = new MasterServer(MasterConfig.defaults().withListen("127.0.0.1", 0, 0));
             StorageNode n = new StorageNode(NodeConfig.defaults(new HostPort("127.0.0.1", m.port()), Size.ofMiB(64))
                     .withListen("127.0.0.1", 0))) {
            assertThat(n.awaitRegistered(Duration.ofSeconds(5))).isTrue();
            try (KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster("127.0.0.1:" + m.port()))) {
                assertThat(c.put("a", "hello".getBytes())).isEqualTo(PutStatus.OK);
                assertThat(c.put("a", "hello".getBytes())).isEqualTo(PutStatus.ALREADY_EXISTS);
                assertThat(new String(c.get("a").orElseThrow())).isEqualTo("hello");
                assertThat(c.get("b")).isEmpty();
                assertThat(c.exists("a")).isTrue();
                assertThat(c.stats().keys()).isEqualTo(1);
            }
        }
    }
}
