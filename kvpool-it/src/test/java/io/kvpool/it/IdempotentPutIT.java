package io.kvpool.it;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.config.HostPort;
import io.kvpool.config.Ports;
import io.kvpool.config.Size;
import io.kvpool.master.MasterConfig;
import io.kvpool.master.MasterServer;
import io.kvpool.node.NodeConfig;
import io.kvpool.node.StorageNode;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.msg.MasterMessages;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * Issue 32, item 3: a put whose COMMIT the master carried out and then went away before answering
 * (here: it restarted; a failover is the same to the client) is retried by the client on the new
 * master, which rebuilt the object from its node under the generation the client gave it. The put
 * answers OK, not ALREADY_EXISTS: the stored object is this client's own.
 *
 * <p>On the same machine the client sends the COMMIT; over TCP its node sends it for the client
 * (NODE_WRITE_COMMIT, version 17), and when the master goes away unanswered the node leaves the COMMIT
 * to the client, which sends it to the new master. Node and client both reach the master through the
 * proxy, which holds whichever COMMIT comes first.
 */
class IdempotentPutIT {

    private static MasterServer master(int port) throws Exception {
        return new MasterServer(MasterConfig.defaults().withListen("127.0.0.1", port, 0).withSummaryInterval(Duration.ZERO));
    }

    @ParameterizedTest(name = "same machine: {0}")
    @ValueSource(booleans = {false, true})
    void aPutWhoseCommitTheMasterTookBeforeItWentAwayAnswersOk(boolean sameMachine) throws Exception {
        int port = Ports.reservable();
        MasterServer m1 = master(port);
        MasterServer m2 = null;
        try (FrameProxy proxy = new FrameProxy(port);
             StorageNode node = new StorageNode(NodeConfig.defaults(new HostPort("127.0.0.1", proxy.port()),
                     Size.ofBytes(16 << 20)).withListen("127.0.0.1", 0).withHeartbeatInterval(Duration.ofMillis(100)))) {
            assertThat(node.awaitRegistered(Duration.ofSeconds(30))).isTrue();
            try (KvPoolClient client = KvPoolClient.connect(ClientConfig.forMaster("127.0.0.1:" + proxy.port())
                    .withSharedMemory(sameMachine).withRequestTimeout(Duration.ofSeconds(60)))) {
                assertThat(client.put("warm", Payloads.make("warm", 1, 3000))).isEqualTo(PutStatus.OK);
                byte[] value = Payloads.make("taken", 1, 6000);
                proxy.holdReplyTo(Opcode.COMMIT.code);
                CompletableFuture<PutStatus> put = CompletableFuture.supplyAsync(() -> client.put("taken", value));
                assertThat(proxy.awaitHeld(30)).as("the COMMIT reached the master, its reply is held").isTrue();
                m1.close();
                m2 = master(port);
                MasterServer now = m2;
                Await.until("the node registered with the new master", Duration.ofSeconds(30), () -> now.service()
                        .segmentInfos().stream().anyMatch(s -> s.state() == MasterMessages.SegmentInfo.STATE_ACTIVE));
                proxy.dropHeld(); // the client hears nothing and asks the new master again
                assertThat(put.get(60, TimeUnit.SECONDS)).isEqualTo(PutStatus.OK);
                assertThat(client.get("taken")).contains(value);
                // over TCP the node committed the first put for the client, and left the held one to it
                assertThat(node.forwardedCommits()).isEqualTo(sameMachine ? 0 : 1);
                assertThat(node.commitsLeftToWriters()).isEqualTo(sameMachine ? 0 : 1);
            }
        } finally {
            m1.close();
            if (m2 != null) {
                m2.close();
            }
        }
    }
}
