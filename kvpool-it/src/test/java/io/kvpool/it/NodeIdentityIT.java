package io.kvpool.it;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.client.PutOptions;
import io.kvpool.client.PutStatus;
import io.kvpool.config.HostPort;
import io.kvpool.config.Ports;
import io.kvpool.config.Size;
import io.kvpool.master.MasterConfig;
import io.kvpool.master.MasterServer;
import io.kvpool.node.NodeConfig;
import io.kvpool.node.StorageNode;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.FrameStatus;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.RemoteException;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.NodeMessages;
import io.kvpool.protocol.msg.WriteGrant;
import org.junit.jupiter.api.Test;

import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Optional;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * Issue 32 on real sockets: a node takes no writes before it is registered; a node stopping for a
 * restart drains (the master places nothing more on it, puts go to the other nodes); and a
 * registration naming a live node's segment, forged or misconfigured, destroys nothing.
 */
class NodeIdentityIT {

    private static final Duration T = Duration.ofSeconds(10);

    private static ResultCode nodeWrite(HostPort node, long offset, long generation, String key, byte[] value)
            throws Exception {
        byte[] k = key.getBytes(StandardCharsets.UTF_8);
        try (FrameConnection c = FrameConnection.connect(node, T, Limits.DEFAULT)) {
            BodyWriter w = new BodyWriter();
            new NodeMessages.Write(0, 0, List.of(new NodeMessages.WriteItem(offset, generation, k, value.length,
                    ObjectLayout.valueCrc(MemorySegment.ofArray(value)), WriteGrant.none()))).write(w);
            return MasterMessages.Codes.read(c.call(Opcode.NODE_WRITE, w, T, ByteBuffer.wrap(value)).body())
                    .codes().getFirst();
        }
    }

    @Test
    void aNodeTakesNoWriteUntilItIsRegistered() throws Exception {
        int masterPort = Ports.reservable();
        byte[] value = Payloads.make("early", 1, 4000);
        try (StorageNode node = new StorageNode(NodeConfig.defaults(new HostPort("127.0.0.1", masterPort),
                Size.ofBytes(8 << 20)).withListen("127.0.0.1", 0))) {
            HostPort at = new HostPort("127.0.0.1", node.port());
            // no master yet: whatever a writer still holds (a placement from before a restart), it lands nowhere
            assertThat(nodeWrite(at, 0, 77, "early", value)).isEqualTo(ResultCode.NO_SEGMENT);
            assertThat(node.objectCount()).isZero();
            try (MasterServer master = new MasterServer(MasterConfig.defaults().withListen("127.0.0.1", masterPort, 0)
                    .withSummaryInterval(Duration.ZERO))) {
                assertThat(node.awaitRegistered(Duration.ofSeconds(30))).isTrue();
                assertThat(nodeWrite(at, 0, 78, "later", value)).as("registered: writes are taken")
                        .isEqualTo(ResultCode.OK);
            }
        }
    }

    @Test
    void aNodeStoppingForARestartIsPlacedOnNoMoreAndPutsGoToTheOtherNode() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(2, Size.ofBytes(32 << 20));
             KvPoolClient client = cluster.client()) {
            for (int i = 0; i < 40; i++) {
                assertThat(client.put("before/" + i, Payloads.make("before/" + i, 1, 8000))).isEqualTo(PutStatus.OK);
            }
            StorageNode stopping = cluster.nodes.get(0);
            StorageNode staying = cluster.nodes.get(1);
            stopping.closeForRestart();
            PoolStats.SegmentStats left = client.stats().segments().stream()
                    .filter(s -> s.name().equals(stopping.name())).findFirst().orElseThrow();
            assertThat(left.state()).as("the master lists the stopped node's registration as draining").isEqualTo("draining");
            long before = staying.objectCount();
            int ok = 0;
            for (int i = 0; i < 200; i++) {
                String key = "during/" + i;
                if (client.putDetailed(key, Payloads.make(key, 1, 8000), PutOptions.DEFAULT).status() == PutStatus.OK) {
                    ok++;
                }
            }
            assertThat(ok).as("puts while a node is away for a restart all go to the node that stays").isEqualTo(200);
            assertThat(staying.objectCount() - before).isEqualTo(200);
            for (int i = 0; i < 200; i++) {
                Optional<byte[]> got = client.get("during/" + i);
                assertThat(got).isPresent();
                assertThat(got.get()).isEqualTo(Payloads.make("during/" + i, 1, 8000));
            }
        }
    }

    @Test
    void aForgedRegistrationOfALiveNodesSegmentIsRefusedAndDestroysNothing() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofBytes(16 << 20));
             KvPoolClient client = cluster.client()) {
            StorageNode live = cluster.nodes.getFirst();
            putAll(client, "live/", 10);
            try (FrameConnection m = FrameConnection.connect(HostPort.parse(cluster.masterAddress()), T, Limits.DEFAULT)) {
                BodyWriter w = new BodyWriter();
                new MasterMessages.RegisterNode(live.name(), "127.0.0.1", live.port(), 16 << 20, live.epoch(), 42, 0, "",
                        ControlToken.random()).write(w);
                assertThatThrownBy(() -> m.call(Opcode.REGISTER_NODE, w, T))
                        .isInstanceOfSatisfying(RemoteException.class, e -> {
                            assertThat(e.status()).isEqualTo(FrameStatus.BAD_REQUEST);
                            assertThat(e.getMessage()).contains("register_node of segment " + live.name());
                        });
            }
            assertThat(live.isRegistered()).isTrue();
            putAll(client, "next/", 40);
            assertAllThere(client, "live/", 10);
        }
    }

    @Test
    void aSecondNodeConfiguredWithALiveNodesAddressIsRefusedAndDestroysNothing() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofBytes(16 << 20));
             KvPoolClient client = cluster.client()) {
            StorageNode live = cluster.nodes.getFirst();
            putAll(client, "live/", 10);
            // the same advertised address and port, listening on another loopback address of this machine
            try (StorageNode twin = new StorageNode(NodeConfig.defaults(HostPort.parse(cluster.masterAddress()),
                    Size.ofBytes(16 << 20)).withListen("127.0.0.2", live.port()).withAdvertiseHost("127.0.0.1")
                    .withHeartbeatInterval(Duration.ofMillis(100)))) {
                assertThat(twin.name()).isEqualTo(live.name());
                assertThat(twin.awaitRegistered(Duration.ofSeconds(2))).as("the twin is refused").isFalse();
                assertThat(live.isRegistered()).isTrue();
                assertAllThere(client, "live/", 10);
            }
        }
    }

    private static void putAll(KvPoolClient client, String prefix, int n) {
        for (int i = 0; i < n; i++) {
            assertThat(client.put(prefix + i, Payloads.make(prefix + i, 1, 5000))).isEqualTo(PutStatus.OK);
        }
    }

    private static void assertAllThere(KvPoolClient client, String prefix, int n) {
        for (int i = 0; i < n; i++) {
            assertThat(client.get(prefix + i)).as(prefix + i).contains(Payloads.make(prefix + i, 1, 5000));
        }
    }
}
