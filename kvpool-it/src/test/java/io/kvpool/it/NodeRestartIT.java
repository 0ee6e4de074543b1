package io.kvpool.it;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.client.PutStatus;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * A node killed with SIGKILL and started again on its port keeps its memory: it adopts the segment
 * file its previous run left in shared memory, verifies every object, and registers them, so every
 * object reads back byte-exact, also when another node started on the machine meanwhile (the orphan
 * grace keeps its file for it); with no grace, that other node reclaims the file at once.
 * Real processes; the segment files live in a directory of this test's own.
 */
class NodeRestartIT {

    private static final int OBJECTS = 5000;

    @TempDir
    Path shm;

    private static void putAll(KvPoolClient c) {
        List<String> keys = new ArrayList<>();
        List<MemorySegment> values = new ArrayList<>();
        for (int i = 0; i < OBJECTS; i++) {
            keys.add("restart/" + i);
            values.add(MemorySegment.ofArray(FailoverIT.valueOf("restart/" + i)));
        }
        assertThat(c.putBatch(keys, values)).containsOnly(PutStatus.OK);
    }

    /** A client of {@code cluster} over TCP only (the killed node's file must not be mapped by the test). */
    private static KvPoolClient client(ProcessCluster cluster) {
        return KvPoolClient.connect(ClientConfig.forMaster(cluster.masterAddress()).withSharedMemory(false));
    }

    /**
     * Starts a node on {@code port} with its segment in this test's directory, puts every object (it is
     * the only node), and kills it with SIGKILL; its segment id.
     */
    private int fillAndKill(ProcessCluster cluster, KvPoolClient c, int port) throws Exception {
        ProcessCluster.Managed node = cluster.startNode("64MiB", shm.toString(), port);
        int id = ProcessCluster.awaitStats(c, s -> s.segments().size() == 1 && s.segments().getFirst().active(),
                "the node registered").segments().getFirst().id();
        putAll(c);
        node.kill9();
        return id;
    }

    private long segmentFiles() throws Exception {
        try (var files = Files.list(shm)) {
            return files.filter(f -> f.getFileName().toString().endsWith(".seg")).count();
        }
    }

    /**
     * Objects a same-machine client wrote into the shared segment (write leases, one put at a time and
     * in batches) are adopted like the others after a restart.
     */
    @Test
    void objectsWrittenThroughSharedMemoryAreAdoptedToo() throws Exception {
        try (ProcessCluster cluster = new ProcessCluster("node-restart-shm")) {
            int port = ProcessCluster.freePort();
            ProcessCluster.Managed node = cluster.startNode("64MiB", shm.toString(), port);
            List<String> keys = new ArrayList<>();
            try (KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster(cluster.masterAddress()))) {
                int first = ProcessCluster.awaitActive(c, 1, "the node registered")
                        .segments().getFirst().id();
                putAll(c);
                for (int i = 0; i < 500; i++) {
                    String k = "single/" + i;
                    keys.add(k);
                    assertThat(c.putDetailed(k, FailoverIT.valueOf(k), io.kvpool.client.PutOptions.DEFAULT).status())
                            .isEqualTo(PutStatus.OK);
                }
                node.kill9();
                cluster.startNode("64MiB", shm.toString(), port);
                PoolStatsView.await(c, first, OBJECTS + keys.size());
            }
            try (KvPoolClient fresh = KvPoolClient.connect(ClientConfig.forMaster(cluster.masterAddress())
                    .withSharedMemory(false))) {
                for (int i = 0; i < OBJECTS; i++) {
                    keys.add("restart/" + i);
                }
                int exact = 0;
                for (String k : keys) {
                    Optional<byte[]> got = fresh.get(k);
                    exact += got.isPresent() && java.util.Arrays.equals(got.get(), FailoverIT.valueOf(k)) ? 1 : 0;
                }
                assertThat(exact).as("objects byte-exact after the restart").isEqualTo(keys.size());
            }
        }
    }

    /** Waits until the restarted node (a segment id other than {@code first}) is active with {@code objects}. */
    private static final class PoolStatsView {
        static void await(KvPoolClient c, int first, int objects) throws Exception {
            ProcessCluster.awaitStats(c, s -> s.segments().size() == 1 && s.segments().getFirst().id() != first
                    && s.segments().getFirst().active(), "the restarted node registered");
            System.out.println("restarted node holds " + c.stats().segments().getFirst().objects() + " of " + objects);
        }
    }

    @Test
    void aNodeRestartedOnItsPortServesEveryObjectItHeld() throws Exception {
        try (ProcessCluster cluster = new ProcessCluster("node-restart")) {
            int port = ProcessCluster.freePort();
            ProcessCluster.Managed node = cluster.startNode("64MiB", shm.toString(), port);
            try (KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster(cluster.masterAddress())
                    .withSharedMemory(false))) {
                int first = ProcessCluster.awaitActive(c, 1, "the node registered")
                        .segments().getFirst().id();
                putAll(c);
                node.kill9();
                assertThat(segmentFiles()).as("a killed node leaves its file").isEqualTo(1);
                cluster.startNode("64MiB", shm.toString(), port);
                // a registration of its own (a new segment id), with every object listed
                ProcessCluster.awaitStats(c, s -> s.segments().size() == 1 && s.segments().getFirst().id() != first
                        && s.segments().getFirst().active() && s.segments().getFirst().objects() == OBJECTS,
                        "the restarted node registered its objects");
                try (KvPoolClient fresh = KvPoolClient.connect(ClientConfig.forMaster(cluster.masterAddress()))) {
                    for (int i = 0; i < OBJECTS; i++) {
                        String k = "restart/" + i;
                        Optional<byte[]> got = fresh.get(k);
                        assertThat(got).as("fresh " + k).hasValueSatisfying(v -> assertThat(v).isEqualTo(FailoverIT.valueOf(k)));
                    }
                }
                for (int i = 0; i < OBJECTS; i++) {
                    String k = "restart/" + i;
                    Optional<byte[]> got = c.get(k);
                    assertThat(got).as(k).hasValueSatisfying(v -> assertThat(v).isEqualTo(FailoverIT.valueOf(k)));
                }
                assertThat(segmentFiles()).as("the adopted file is the node's only one").isEqualTo(1);
            }
        }
    }

    /**
     * The soak's finding: keys removed while their node was down came back when it restarted and
     * listed its segment. The master keeps the frees the node missed and refuses those copies.
     */
    @Test
    void keysRemovedWhileTheirNodeWasDownStayRemovedWhenItComesBack() throws Exception {
        // a long node TTL: the dead node stays registered, so the removals reach the index and their frees fail
        try (ProcessCluster cluster = new ProcessCluster("node-restart-removed", "--node-ttl", "60s")) {
            int port = ProcessCluster.freePort();
            ProcessCluster.Managed node = cluster.startNode("64MiB", shm.toString(), port);
            try (KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster(cluster.masterAddress())
                    .withSharedMemory(false))) {
                int first = ProcessCluster.awaitStats(c, s -> s.segments().size() == 1 && s.segments().getFirst().active(),
                        "the node registered").segments().getFirst().id();
                putAll(c);
                node.kill9();
                List<String> removed = new ArrayList<>();
                for (int i = 0; i < OBJECTS; i += 2) {
                    assertThat(c.remove("restart/" + i)).as("removal of restart/" + i).isTrue();
                    removed.add("restart/" + i);
                }
                cluster.startNode("64MiB", shm.toString(), port);
                ProcessCluster.awaitStats(c, s -> s.segments().size() == 1 && s.segments().getFirst().id() != first
                        && s.segments().getFirst().active(), "the restarted node registered");
                assertThat(c.stats().segments().getFirst().objects()).as("objects taken back")
                        .isEqualTo(OBJECTS - removed.size());
                try (KvPoolClient fresh = KvPoolClient.connect(ClientConfig.forMaster(cluster.masterAddress())
                        .withSharedMemory(false))) {
                    for (int i = 0; i < OBJECTS; i++) {
                        String k = "restart/" + i;
                        if (i % 2 == 0) {
                            assertThat(fresh.get(k)).as("removed " + k).isEmpty();
                        } else {
                            assertThat(fresh.get(k)).as(k).hasValueSatisfying(v -> assertThat(v).isEqualTo(FailoverIT.valueOf(k)));
                        }
                    }
                }
                assertThat(cluster.metric("master_frees_undelivered")).as("nothing owed once it listed its segment")
                        .isZero();
            }
        }
    }

    /**
     * The same after the master dropped the node for silence: its copies left the index, so removals
     * after that cannot be recorded against it; when it comes back, its copies of objects that kept
     * copies elsewhere are taken only while those objects live, so the removed keys stay removed and
     * the others are served.
     */
    @Test
    void aNodeDroppedForSilenceBringsNoRemovedKeyBack() throws Exception {
        try (ProcessCluster cluster = new ProcessCluster("node-restart-dropped", "--node-ttl", "2s", "--replicas", "2")) {
            int port = ProcessCluster.freePort();
            ProcessCluster.Managed node = cluster.startNode("64MiB", shm.toString(), port);
            cluster.startNode("64MiB");
            try (KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster(cluster.masterAddress())
                    .withSharedMemory(false))) {
                ProcessCluster.awaitStats(c, s -> s.segments().size() == 2
                        && s.segments().stream().allMatch(PoolStats.SegmentStats::active), "both nodes registered");
                putAll(c);
                node.kill9();
                ProcessCluster.awaitStats(c, s -> s.segments().size() == 1, "the killed node dropped");
                for (int i = 0; i < OBJECTS; i += 2) {
                    assertThat(c.remove("restart/" + i)).as("removal of restart/" + i).isTrue();
                }
                cluster.startNode("64MiB", shm.toString(), port);
                PoolStats back = ProcessCluster.awaitStats(c, s -> s.segments().size() == 2
                        && s.segments().stream().allMatch(PoolStats.SegmentStats::active), "the node back");
                assertThat(back.segments()).as("each node holds a copy of every live object")
                        .allSatisfy(seg -> assertThat(seg.objects()).isEqualTo(OBJECTS / 2));
                for (int i = 0; i < OBJECTS; i++) {
                    String k = "restart/" + i;
                    if (i % 2 == 0) {
                        assertThat(c.get(k)).as("removed " + k).isEmpty();
                    } else {
                        assertThat(c.get(k)).as(k).hasValueSatisfying(v -> assertThat(v).isEqualTo(FailoverIT.valueOf(k)));
                    }
                }
            }
        }
    }

    /**
     * The race of issue 25: another node starting on the machine while a killed node is down used to
     * reclaim the killed node's segment file at once, and with it every object the node would have
     * adopted. Within the orphan grace the file stays for its node.
     */
    @Test
    void aNodeStartedWhileAnotherIsDownLeavesItsSegmentForItToAdopt() throws Exception {
        try (ProcessCluster cluster = new ProcessCluster("node-restart-beside"); KvPoolClient c = client(cluster)) {
            int port = ProcessCluster.freePort();
            int first = fillAndKill(cluster, c, port);
            ProcessCluster.Managed other = cluster.startNode("64MiB", shm.toString(), ProcessCluster.freePort());
            ProcessCluster.awaitStats(c, s -> s.segments().stream().anyMatch(x -> x.name().equals(other.name)
                    && x.active()), "the other node registered");
            assertThat(segmentFiles()).as("the killed node's file is kept for it beside the new node's").isEqualTo(2);
            cluster.startNode("64MiB", shm.toString(), port);
            String name = "127.0.0.1:" + port;
            ProcessCluster.awaitStats(c, s -> s.segments().stream().anyMatch(x -> x.name().equals(name)
                    && x.id() != first && x.active() && x.objects() == OBJECTS), "the restarted node adopted its objects");
            for (int i = 0; i < OBJECTS; i++) {
                String k = "restart/" + i;
                assertThat(c.get(k)).as(k).hasValueSatisfying(v -> assertThat(v).isEqualTo(FailoverIT.valueOf(k)));
            }
            assertThat(segmentFiles()).as("one file per live node").isEqualTo(2);
        }
    }

    /**
     * With no orphan grace ({@code --orphan-grace 0s}) a node reclaims a dead node's file as soon as it
     * starts: the killed node, coming back on its port, has nothing to adopt and registers empty. (The
     * grace running out, and a node that needs the memory, are tested with an injected clock and
     * free-space figure in {@code OrphanedSegmentsTest}.)
     */
    @Test
    void withNoOrphanGraceANodeStartingBesideADeadOneReclaimsItsFile() throws Exception {
        try (ProcessCluster cluster = new ProcessCluster("node-restart-no-grace"); KvPoolClient c = client(cluster)) {
            int port = ProcessCluster.freePort();
            int first = fillAndKill(cluster, c, port);
            cluster.startNode("64MiB", shm.toString(), ProcessCluster.freePort(), List.of("--orphan-grace", "0s"));
            assertThat(segmentFiles()).as("the old file was reclaimed, the new node has its own").isEqualTo(1);
            cluster.startNode("64MiB", shm.toString(), port);
            String name = "127.0.0.1:" + port;
            PoolStats back = ProcessCluster.awaitStats(c, s -> s.segments().stream().anyMatch(x -> x.name().equals(name)
                    && x.id() != first && x.active()), "the killed node registered again");
            assertThat(back.segments().stream().filter(x -> x.name().equals(name)).findFirst().orElseThrow().objects())
                    .as("what it comes back with").isZero();
        }
    }
}
