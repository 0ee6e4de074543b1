package io.kvpool.it;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutOptions;
import io.kvpool.client.PutStatus;
import io.kvpool.config.HostPort;
import io.kvpool.config.Size;
import io.kvpool.master.MasterConfig;
import io.kvpool.master.MasterServer;
import io.kvpool.node.NodeConfig;
import io.kvpool.node.StorageNode;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The same-machine path: with the node's segment in shared memory, a client on the same host moves
 * bytes with memory copies (the node serves no read traffic); where the segment cannot be mapped,
 * the client falls back to TCP by itself.
 */
class SameMachinePathIT {

    private static void roundTrip(KvPoolClient c, String prefix) {
        List<String> keys = new ArrayList<>();
        List<MemorySegment> values = new ArrayList<>();
        for (int i = 0; i < 20; i++) {
            keys.add(prefix + i);
            values.add(MemorySegment.ofArray(Payloads.make(prefix + i, 1, 10_000 + i * 4099)));
        }
        assertThat(c.putBatch(keys, values)).containsOnly(PutStatus.OK);
        assertThat(c.put(prefix + "single", Payloads.make(prefix + "single", 1, 70_000))).isEqualTo(PutStatus.OK);
        var got = c.getBatch(keys);
        for (int i = 0; i < keys.size(); i++) {
            assertThat(got.get(i)).as(keys.get(i)).hasValue(values.get(i).toArray(ValueLayout.JAVA_BYTE));
        }
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment dst = arena.allocate(100_000);
            assertThat(c.getInto(prefix + "single", dst)).isEqualTo(70_000);
            assertThat(Payloads.decode(dst.asSlice(0, 70_000))).isEqualTo(new Payloads.Decoded(prefix + "single", 1, true));
        }
        assertThat(c.upsert(prefix + "single", Payloads.make(prefix + "single", 2, 30_000))).isEqualTo(PutStatus.OK);
        assertThat(Payloads.decode(c.get(prefix + "single").orElseThrow()).version()).isEqualTo(2);
    }

    @Test
    void sharedSegmentIsReadWithoutTheNode() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(32));
             KvPoolClient c = cluster.client()) {
            StorageNode node = cluster.nodes.getFirst();
            assertThat(node.shmPath()).isNotEmpty();
            roundTrip(c, "shm/");
            assertThat(node.bytesRead()).as("reads bypass the node").isZero();
            assertThat(node.bytesWritten()).as("the node learned of the writes (settled from their stamps)").isPositive();
            assertThat(node.stampedObjects()).as("whole puts stamp their objects").isPositive();
        }
    }

    /**
     * A same-machine put stamps its objects in its lease range and tells only the master (protocol 4.28,
     * version 16). The node learns of them when something first asks: a read over TCP by a client on no shared
     * memory, a free after a remove, an upsert's replacement. Every one of them must be served exactly.
     */
    @Test
    void objectsStampedOnTheSameMachineAreServedOverTcpAndFreedByTheNode() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(64));
             KvPoolClient writer = cluster.client();
             KvPoolClient reader = cluster.client(cfg -> cfg.withSharedMemory(false))) {
            StorageNode node = cluster.nodes.getFirst();
            List<String> keys = new ArrayList<>();
            for (int i = 0; i < 60; i++) {
                String key = "stamp/" + i;
                keys.add(key);
                // single puts and batches, so stamps follow one another in one range across calls
                if (i % 3 == 0) {
                    assertThat(writer.put(key, Payloads.make(key, 1, 1_000 + i * 977))).isEqualTo(PutStatus.OK);
                } else if (i % 3 == 2) {
                    List<String> two = List.of(keys.get(i - 1), key);
                    assertThat(writer.putBatch(two, List.of(
                            MemorySegment.ofArray(Payloads.make(two.get(0), 1, 1_000 + (i - 1) * 977)),
                            MemorySegment.ofArray(Payloads.make(key, 1, 1_000 + i * 977))))).containsOnly(PutStatus.OK);
                }
            }
            // read over TCP, newest first: each read settles whatever the writer stamped before it
            for (int i = keys.size() - 1; i >= 0; i--) {
                byte[] got = reader.get(keys.get(i)).orElseThrow(() -> new AssertionError("missing"));
                assertThat(Payloads.decode(got)).isEqualTo(new Payloads.Decoded(keys.get(i), 1, true));
            }
            assertThat(node.stampedObjects()).isEqualTo(60);
            assertThat(node.objectCount()).isEqualTo(60);
            // removals free at the node; a key replaced by an upsert is freed there too and read anew
            assertThat(writer.remove(keys.get(5))).isTrue();
            assertThat(writer.upsert(keys.get(6), Payloads.make(keys.get(6), 2, 5_000))).isEqualTo(PutStatus.OK);
            assertThat(reader.get(keys.get(5))).isEmpty();
            assertThat(Payloads.decode(reader.get(keys.get(6)).orElseThrow()).version()).isEqualTo(2);
            // the frees reach the node on its control connection, not necessarily before the calls return
            Await.until("the node holds 60 - 2 + 1 objects", Duration.ofSeconds(30), () -> node.objectCount() == 59);
        }
    }

    @Test
    void tcpWhenSharedMemoryIsOff() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(32));
             KvPoolClient c = cluster.client(cfg -> cfg.withSharedMemory(false))) {
            roundTrip(c, "tcp/");
            assertThat(cluster.nodes.getFirst().bytesRead()).isPositive();
        }
    }

    @Test
    void fallsBackToTcpWhenTheSegmentCannotBeMapped() throws Exception {
        // anonymous memory: nothing to map, so the client must use TCP by itself
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(32), m -> m, n -> n.withShmDir(null));
             KvPoolClient c = cluster.client()) {
            assertThat(cluster.nodes.getFirst().shmPath()).isEmpty();
            roundTrip(c, "anon/");
            assertThat(cluster.nodes.getFirst().bytesRead()).isPositive();
        }
    }

    /**
     * The first put after a master restart, from a client that has not met the new master yet: its
     * PUT_START fails on the pooled connection to the old master and is answered by the new one on a
     * fresh connection, whose HELLO is how the client learns of the change. Those regions are the new
     * master's and the put must land. (The client once took the master run before the call, judged
     * the answer the old master's and failed the put: FailoverIT's first put after a failover.)
     */
    @Test
    void aPutAnsweredByANewMasterOnItsRetryLands() throws Exception {
        MasterServer first = master(0);
        int port = first.port();
        StorageNode node = null;
        MasterServer second = null;
        // no read lease, no write leases, no pings: nothing but the put itself reaches the new master
        ClientConfig quiet = ClientConfig.forMaster("127.0.0.1:" + port).withLocationCache(0)
                .withPingInterval(Duration.ofHours(1));
        try (KvPoolClient c = KvPoolClient.connect(quiet)) {
            node = node(port);
            putOn(c, "before/", 4, node.name());
            first.close();
            second = master(port);
            try (KvPoolClient probe = KvPoolClient.connect(ClientConfig.forMaster("127.0.0.1:" + port))) {
                Await.until("the node registered again with its objects", () ->
                        probe.stats().segments().stream().anyMatch(s -> s.active() && s.objects() == 4));
            }
            putOn(c, "after/", 4, node.name());
            assertExact(c, "before/", 4);
            assertExact(c, "after/", 4);
        } finally {
            for (AutoCloseable x : new AutoCloseable[]{node, second, first}) {
                if (x != null) {
                    x.close();
                }
            }
        }
    }

    private static MasterServer master(int port) throws Exception {
        return new MasterServer(MasterConfig.defaults().withListen("127.0.0.1", port, 0).withSummaryInterval(Duration.ZERO));
    }

    private static StorageNode node(int masterPort) throws Exception {
        StorageNode n = new StorageNode(NodeConfig.defaults(new HostPort("127.0.0.1", masterPort), Size.ofMiB(32))
                .withListen("127.0.0.1", 0));
        if (!n.awaitRegistered(Duration.ofSeconds(30))) {
            n.close();
            throw new IllegalStateException("node " + n.name() + " did not register");
        }
        return n;
    }

    /** Puts {@code count} single-copy values of 16 KiB under {@code prefix}, on the segment named {@code on}. */
    private static void putOn(KvPoolClient c, String prefix, int count, String on) {
        for (int i = 0; i < count; i++) {
            String key = prefix + i;
            assertThat(c.put(key, Payloads.make(key, 1, 16_384), PutOptions.preferring(on).withReplicas(1)))
                    .as(key).isEqualTo(PutStatus.OK);
        }
    }

    private static void assertExact(KvPoolClient c, String prefix, int count) {
        for (int i = 0; i < count; i++) {
            String key = prefix + i;
            assertThat(c.get(key)).as(key).hasValue(Payloads.make(key, 1, 16_384));
        }
    }

    /**
     * A restarted master numbers the segments in the order their nodes register again: the segment
     * this client mapped as id 2 is id 1 now, and id 2 is a node that joined since. Puts to the new
     * id 2 must land in that node's file, and the objects of the node formerly called 2 stay intact.
     * (The client kept its mappings by id: those puts went into the old node's file, over its objects'
     * values under intact headers, and gets served those bytes; issue 25, the rolling-restart drill.)
     */
    @Test
    void segmentIdsRenumberedByANewMasterReachTheirOwnNodes() throws Exception {
        MasterServer first = master(0);
        int port = first.port();
        StorageNode one = null;
        StorageNode two = null;
        StorageNode three = null;
        MasterServer second = null;
        try (KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster("127.0.0.1:" + port))) {
            one = node(port);
            two = node(port);
            putOn(c, "old/", 40, two.name()); // on segment 2, through its mapping
            assertExact(c, "old/", 40);

            first.close();
            one.close(); // gone while the master was away: the node formerly called 2 comes back first
            second = master(port);
            try (KvPoolClient probe = KvPoolClient.connect(ClientConfig.forMaster("127.0.0.1:" + port))) {
                Await.until("the node formerly called 2 registered again with its objects", () ->
                        probe.stats().segments().stream().anyMatch(s -> s.active() && s.objects() == 40));
                assertThat(probe.stats().segments()).singleElement().satisfies(s -> assertThat(s.id()).isEqualTo(1));
            }
            three = node(port); // segment 2 now

            putOn(c, "new/", 40, three.name());
            assertExact(c, "old/", 40);
            assertExact(c, "new/", 40);
            try (KvPoolClient fresh = KvPoolClient.connect(ClientConfig.forMaster("127.0.0.1:" + port))) {
                assertExact(fresh, "old/", 40);
                assertExact(fresh, "new/", 40);
            }
        } finally {
            for (AutoCloseable x : new AutoCloseable[]{three, two, one, second, first}) {
                if (x != null) {
                    x.close();
                }
            }
        }
    }
}
