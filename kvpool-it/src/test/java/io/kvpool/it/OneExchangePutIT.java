package io.kvpool.it;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutOptions;
import io.kvpool.client.PutStatus;
import io.kvpool.config.HostPort;
import io.kvpool.config.Size;
import io.kvpool.node.StorageNode;
import io.kvpool.protocol.Opcode;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * Issue 36, item 1, over TCP (protocol version 17): a put under a write lease is one exchange with the
 * node (NODE_WRITE_COMMIT), whose node sends the COMMIT for the client: as a frame to a master elsewhere,
 * as a call to a master in its own process ({@code kvpool serve}). A node that cannot commit leaves it to
 * the client, and a batch too large for one frame keeps its parallel NODE_WRITEs and the client's COMMIT.
 * Every object is read back byte for byte.
 */
class OneExchangePutIT {

    private static final Size SEGMENT = Size.ofMiB(64);

    /** Puts {@code n} single objects and one batch of {@code batch}; checks every one reads back. */
    private static void putAndRead(KvPoolClient client, String prefix, int n, int batch, int bytes) {
        for (int i = 0; i < n; i++) {
            String key = prefix + "-" + i;
            assertThat(client.put(key, Payloads.make(key, 1, bytes))).as(key).isEqualTo(PutStatus.OK);
        }
        List<String> keys = new ArrayList<>();
        List<MemorySegment> values = new ArrayList<>();
        for (int i = 0; i < batch; i++) {
            String key = prefix + "-b" + i;
            keys.add(key);
            values.add(MemorySegment.ofArray(Payloads.make(key, 1, bytes)));
        }
        if (batch > 0) {
            assertThat(client.putBatch(keys, values, PutOptions.DEFAULT)).containsOnly(PutStatus.OK);
        }
        for (int i = 0; i < n; i++) {
            String key = prefix + "-" + i;
            assertThat(client.get(key)).as(key).contains(Payloads.make(key, 1, bytes));
        }
        for (int i = 0; i < batch; i++) {
            String key = prefix + "-b" + i;
            assertThat(client.get(key)).as(key).contains(Payloads.make(key, 1, bytes));
        }
    }

    @Test
    void overTcpTheNodeCommitsForTheClientAndTheMasterAnswersThroughIt() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, SEGMENT);
             KvPoolClient client = cluster.client(c -> c.withSharedMemory(false))) {
            StorageNode node = cluster.nodes.getFirst();
            putAndRead(client, "tcp", 40, 20, 3000);
            assertThat(node.forwardedCommits()).isEqualTo(60);
            assertThat(node.commitsLeftToWriters()).isZero();
            // 40 single puts and one batch: one COMMIT frame each, every one from the node
            assertThat(cluster.master.requests(Opcode.COMMIT)).isEqualTo(41);

            // an upsert goes the same way and replaces; a plain put of a taken key answers ALREADY_EXISTS through the node
            byte[] second = Payloads.make("tcp-0", 2, 5000);
            assertThat(client.upsert("tcp-0", second)).isEqualTo(PutStatus.OK);
            assertThat(client.get("tcp-0")).contains(second);
            assertThat(client.put("tcp-1", Payloads.make("tcp-1", 3, 100))).isEqualTo(PutStatus.ALREADY_EXISTS);
            assertThat(client.get("tcp-1")).contains(Payloads.make("tcp-1", 1, 3000));
            assertThat(node.forwardedCommits()).isEqualTo(61);
        }
    }

    @Test
    void aMasterInTheNodesProcessTakesTheCommitAsACall() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, SEGMENT);
             KvPoolClient client = cluster.client(c -> c.withSharedMemory(false))) {
            StorageNode node = cluster.nodes.getFirst();
            AtomicInteger calls = new AtomicInteger();
            node.commitInProcess(new HostPort("127.0.0.1", cluster.master.port()), commit -> {
                calls.incrementAndGet();
                return cluster.master.commitInProcess(commit);
            });
            putAndRead(client, "call", 30, 10, 2000);
            assertThat(node.forwardedCommits()).isEqualTo(40);
            assertThat(calls.get()).as("30 single puts and one batch, each committed by a call").isEqualTo(31);
            // counted by the master as COMMITs all the same
            assertThat(cluster.master.requests(Opcode.COMMIT)).isEqualTo(31);
            assertThat(cluster.master.service().keyCount()).isEqualTo(40);
        }
    }

    @Test
    void aNodeThatCannotCommitLeavesItToTheClient() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, SEGMENT);
             KvPoolClient client = cluster.client(c -> c.withSharedMemory(false))) {
            StorageNode node = cluster.nodes.getFirst();
            // the master in the node's process is stopping, say: the node cannot ask it
            node.commitInProcess(new HostPort("127.0.0.1", cluster.master.port()), commit -> {
                throw new IOException("the master in this process is stopping");
            });
            putAndRead(client, "left", 12, 8, 1000);
            assertThat(node.forwardedCommits()).isZero();
            assertThat(node.commitsLeftToWriters()).isEqualTo(13);
            assertThat(cluster.master.requests(Opcode.COMMIT)).as("the client's own COMMITs").isEqualTo(13);
        }
    }

    @Test
    void aBatchTooLargeForOneFrameKeepsItsLanesAndTheClientsCommit() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, SEGMENT);
             KvPoolClient client = cluster.client(c -> c.withSharedMemory(false))) {
            StorageNode node = cluster.nodes.getFirst();
            // 6 MiB in one call: cut into 1 MiB frames sent in parallel lanes, then one COMMIT from the client
            putAndRead(client, "big", 0, 6, 1 << 20);
            assertThat(node.forwardedCommits()).isZero();
            assertThat(cluster.master.requests(Opcode.COMMIT)).isEqualTo(1);
        }
    }
}
