package io.kvpool.it;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.config.HostPort;
import io.kvpool.config.Size;
import io.kvpool.etcd.EtcdTarget;
import io.kvpool.etcd.MasterAddress;
import io.kvpool.master.ElectedMaster;
import io.kvpool.master.MasterConfig;
import io.kvpool.node.NodeConfig;
import io.kvpool.node.StorageNode;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.FrameStatus;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.RemoteException;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.KeyList;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.NodeMessages;
import org.junit.jupiter.api.Test;

import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.catchThrowableOfType;

/**
 * Node administration (NODE_FREE, NODE_RESET, NODE_REPLICATE) on an open pool, where every connection
 * counts as admin: only the master a node registered with frees or resets anything on it (it
 * presents the control token the node drew for that registration, protocol version 10), also after
 * a failover to a standby master. Anyone else's frame, whatever term it names, is refused and
 * changes nothing, so puts go on; and epochs only move forward, within a bound, even for the master.
 */
class NodeAdministrationIT {

    private static final Duration T = Duration.ofSeconds(10);

    /** The master's record of {@code key}: its generation and where its copy is. */
    private static MasterMessages.ReplicaList where(String master, String key) throws Exception {
        try (FrameConnection m = FrameConnection.connect(HostPort.parse(master), T, Limits.DEFAULT)) {
            BodyWriter w = new BodyWriter();
            new KeyList(List.of(key.getBytes(StandardCharsets.UTF_8))).write(w);
            MasterMessages.ReplicaList rl = MasterMessages.ReplicaListReply.read(
                    m.call(Opcode.GET_REPLICA_LIST, w, T).body()).items().getFirst();
            assertThat(rl.code()).isEqualTo(ResultCode.OK);
            return rl;
        }
    }

    /** Sends one administration frame to {@code node} from a connection of its own; the node's error, or null. */
    private static RemoteException send(StorageNode node, Opcode op, BodyWriter body) throws Exception {
        try (FrameConnection c = FrameConnection.connect(HostPort.parse(node.name()), T, Limits.DEFAULT)) {
            return catchThrowableOfType(RemoteException.class, () -> c.call(op, body, T));
        }
    }

    private static BodyWriter reset(long epoch, long term, ControlToken token) {
        BodyWriter w = new BodyWriter();
        new NodeMessages.Reset(epoch, term, token).write(w);
        return w;
    }

    @Test
    void aForgedResetOrFreeIsRefusedChangesNothingAndPutsKeepWorking() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(64)); KvPoolClient c = cluster.client()) {
            StorageNode node = cluster.nodes.getFirst();
            byte[] value = Payloads.make("adm/a", 1, 10_000);
            assertThat(c.put("adm/a", value)).isEqualTo(PutStatus.OK);
            long epoch = node.epoch();
            for (ControlToken guess : List.of(ControlToken.random(), ControlToken.NONE)) {
                RemoteException e = send(node, Opcode.NODE_RESET, reset(epoch + 1, 5, guess));
                assertThat(e).as("a reset from a connection that is not the master's").isNotNull();
                assertThat(e.status()).isEqualTo(FrameStatus.UNAUTHORIZED);
                assertThat(e.getMessage()).contains("node_reset of term 5 refused")
                        .contains("only from the master it registered with");
            }
            // a free of the stored object, by its offset and generation as the master hands them out
            MasterMessages.ReplicaList rl = where(cluster.masterAddress(), "adm/a");
            BodyWriter free = new BodyWriter();
            new NodeMessages.Free(0, ControlToken.random(), List.of(new NodeMessages.FreeItem(
                    rl.replicas().getFirst().offset(), rl.generation()))).write(free);
            assertThat(send(node, Opcode.NODE_FREE, free)).as("a forged free").isNotNull()
                    .satisfies(e -> assertThat(e.status()).isEqualTo(FrameStatus.UNAUTHORIZED));

            assertThat(node.refusedAdmin()).isEqualTo(3);
            assertThat(node.term()).as("no frame moves the node's term").isZero();
            assertThat(node.epoch()).isEqualTo(epoch);
            assertThat(node.objectCount()).isEqualTo(1);
            assertThat(c.get("adm/a")).hasValueSatisfying(v -> assertThat(v).isEqualTo(value));
            assertThat(c.put("adm/b", value)).as("a put after the forged frames").isEqualTo(PutStatus.OK);
            assertThat(c.get("adm/b")).hasValueSatisfying(v -> assertThat(v).isEqualTo(value));
        }
    }

    @Test
    void anEpochThatIsNegativeOrTooFarAheadIsRefusedEvenFromTheMaster() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(64)); KvPoolClient c = cluster.client()) {
            StorageNode node = cluster.nodes.getFirst();
            assertThat(c.put("adm/e", new byte[1000])).isEqualTo(PutStatus.OK);
            c.removeAll(true);
            assertThat(c.put("adm/e", new byte[1000])).isEqualTo(PutStatus.OK);
            long epoch = node.epoch();
            assertThat(epoch).isPositive();
            // with the master's own token and term: only the epoch is wrong
            ControlToken master = node.controlToken();
            assertThat(send(node, Opcode.NODE_RESET, reset(-1, 0, master))).isNotNull()
                    .satisfies(e -> assertThat(e.getMessage()).contains("node_reset to epoch -1 refused")
                            .contains("never negative").contains("stays at epoch " + epoch));
            assertThat(send(node, Opcode.NODE_RESET, reset(epoch + (1L << 32) + 1, 0, master))).isNotNull()
                    .satisfies(e -> assertThat(e.getMessage()).contains("is at epoch " + epoch));
            assertThat(node.epoch()).isEqualTo(epoch);
            assertThat(node.objectCount()).isEqualTo(1);
            // a late reset to an older epoch is answered, and drops nothing: epochs only move forward
            assertThat(send(node, Opcode.NODE_RESET, reset(epoch - 1, 0, master))).isNull();
            assertThat(node.epoch()).isEqualTo(epoch);
            assertThat(node.objectCount()).isEqualTo(1);
            assertThat(c.get("adm/e")).isPresent();
        }
    }

    @Test
    void theMastersFreesAndResetsStillReachTheNode() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(64)); KvPoolClient c = cluster.client()) {
            StorageNode node = cluster.nodes.getFirst();
            for (int i = 0; i < 10; i++) {
                assertThat(c.put("adm/m" + i, new byte[1000])).isEqualTo(PutStatus.OK);
            }
            assertThat(c.remove("adm/m0")).isTrue();
            Await.until("the node freed adm/m0", () -> node.objectCount() == 9);
            long epoch = node.epoch();
            c.removeAll(true);
            assertThat(node.epoch()).as("the reset reached the node before removeAll returned").isGreaterThan(epoch);
            assertThat(node.objectCount()).isZero();
            assertThat(node.refusedAdmin()).as("nothing the master sent was refused").isZero();
            assertThat(c.put("adm/after", new byte[1000])).isEqualTo(PutStatus.OK);
        }
    }

    @Test
    void afterAFailoverTheNewLeaderAdministersTheNodeAndTheOldLeadersTokenNoLonger() throws Exception {
        try (EtcdProcess etcd = new EtcdProcess(Path.of("target", "it-logs", "node-administration", "etcd")
                .toAbsolutePath())) {
            etcd.start(); // a skip only where etcd cannot be installed; a failing etcd fails the test
            String url = etcd.url("node-administration");
            EtcdTarget target = EtcdTarget.parse(url);
            MasterConfig base = MasterConfig.defaults().withSummaryInterval(Duration.ZERO);
            ElectedMaster.Options a = new ElectedMaster.Options(target, "a", "127.0.0.1", Duration.ofSeconds(2),
                    Duration.ZERO);
            ElectedMaster.Options b = new ElectedMaster.Options(target, "b", "127.0.0.1", Duration.ofSeconds(2),
                    Duration.ZERO);
            ElectedMaster first = new ElectedMaster(base.withListen("127.0.0.1", ProcessCluster.freePort(), -1), a);
            ElectedMaster second = null;
            StorageNode node = null;
            try {
                assertThat(first.awaitServing(T)).isTrue();
                second = new ElectedMaster(base.withListen("127.0.0.1", ProcessCluster.freePort(), -1), b);
                node = new StorageNode(NodeConfig.defaults(MasterAddress.parse(url), Size.ofMiB(64))
                        .withListen("127.0.0.1", 0).withShmDir(null).withHeartbeatInterval(Duration.ofMillis(100)));
                assertThat(node.awaitRegistered(T)).isTrue();
                StorageNode n = node;
                try (KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster(url).withRequestTimeout(T))) {
                    for (int i = 0; i < 10; i++) {
                        assertThat(c.put("ha/" + i, new byte[1000])).isEqualTo(PutStatus.OK);
                    }
                    ControlToken firstLeaders = node.controlToken();
                    long firstTerm = first.term();
                    assertThat(node.term()).isEqualTo(firstTerm);

                    first.close(); // steps down: the standby takes over and the node registers with it
                    assertThat(second.awaitServing(Duration.ofSeconds(30))).isTrue();
                    ElectedMaster leader = second;
                    Await.until("the node registered with the new leader", () -> n.isRegistered()
                            && n.term() == leader.term());
                    assertThat(node.term()).isGreaterThan(firstTerm);
                    assertThat(node.controlToken()).as("a new registration, a new token").isNotEqualTo(firstLeaders);

                    // the old leader's token (its term, or the new one) no longer administers the node
                    for (long term : new long[]{firstTerm, leader.term()}) {
                        assertThat(send(node, Opcode.NODE_RESET, reset(node.epoch() + 1, term, firstLeaders)))
                                .as("a reset with the old leader's token, term " + term).isNotNull();
                    }
                    long refused = node.refusedAdmin();
                    assertThat(refused).isEqualTo(2);
                    Await.until("the new leader rebuilt the objects", () -> c.exists("ha/9"));

                    // the new leader's frees and resets reach it
                    assertThat(c.remove("ha/0")).isTrue();
                    Await.until("the node freed ha/0", () -> n.objectCount() == 9);
                    long epoch = node.epoch();
                    c.removeAll(true);
                    assertThat(node.epoch()).as("the new leader's reset reached the node").isGreaterThan(epoch);
                    assertThat(node.objectCount()).isZero();
                    assertThat(node.refusedAdmin()).as("nothing the new leader sent was refused").isEqualTo(refused);
                    assertThat(c.put("ha/after", new byte[1000])).isEqualTo(PutStatus.OK);
                }
            } finally {
                if (node != null) {
                    node.close();
                }
                first.close();
                if (second != null) {
                    second.close();
                }
            }
        }
    }
}
