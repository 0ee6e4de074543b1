package io.kvpool.it;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.client.PutOptions;
import io.kvpool.client.PutStatus;
import org.junit.jupiter.api.Test;

import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.SplittableRandom;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The master and three nodes as separate OS processes on loopback: serving, losing a node to
 * SIGKILL in the middle of traffic, and a master restart that rebuilds its metadata from the nodes.
 */
class ProcessClusterIT {

    private static final long SEED = Long.getLong("kvpool.seed", 42);

    private static Map<String, byte[]> fill(KvPoolClient c, String prefix, int n, String segment) {
        SplittableRandom rnd = new SplittableRandom(SEED + prefix.hashCode());
        Map<String, byte[]> stored = new HashMap<>();
        for (int i = 0; i < n; i++) {
            String key = prefix + i;
            byte[] v = Payloads.make(key, 1, 50_000 + rnd.nextInt(150_000));
            PutStatus st = segment == null ? c.put(key, v) : c.put(key, v, PutOptions.preferring(segment));
            assertThat(st).as(key).isEqualTo(PutStatus.OK);
            stored.put(key, v);
        }
        return stored;
    }

    private static void assertAllReadBack(KvPoolClient c, Map<String, byte[]> stored) {
        List<String> keys = new ArrayList<>(stored.keySet());
        List<Optional<byte[]>> got = c.getBatch(keys);
        for (int i = 0; i < keys.size(); i++) {
            byte[] expected = stored.get(keys.get(i));
            assertThat(got.get(i)).as(keys.get(i)).hasValueSatisfying(b -> assertThat(b).isEqualTo(expected));
        }
    }

    @Test
    void threeNodeProcessesServeAndShareTheLoad() throws Exception {
        try (ProcessCluster cluster = new ProcessCluster("three-nodes")) {
            for (int i = 0; i < 3; i++) {
                cluster.startNode("64MiB");
            }
            try (KvPoolClient c = KvPoolClient.connect(io.kvpool.client.ClientConfig.forMaster(cluster.masterAddress())
                    .withAutoDetectLocal(false))) {
                ProcessCluster.awaitActive(c, 3, "three segments are registered");
                Map<String, byte[]> stored = fill(c, "spread/", 300, null);
                assertAllReadBack(c, stored);
                PoolStats s = c.stats();
                assertThat(s.keys()).isEqualTo(300);
                assertThat(s.segments()).allSatisfy(seg -> assertThat(seg.objects()).as(seg.name()).isPositive());
                List<MemorySegment> values = new ArrayList<>();
                List<String> keys = new ArrayList<>();
                for (int i = 0; i < 100; i++) {
                    keys.add("batch/" + i);
                    values.add(MemorySegment.ofArray(Payloads.make("batch/" + i, 1, 30_000)));
                }
                assertThat(c.putBatch(keys, values)).containsOnly(PutStatus.OK);
                assertThat(c.prefixMatch(keys)).isEqualTo(100);

                // a launcher's KVPOOL_PREFERRED_SEGMENT steers another process's puts to the named node
                String target = cluster.nodes.get(2).name;
                long before = objectsOn(c, target);
                for (int i = 0; i < 3; i++) {
                    assertThat(ProcessCluster.runCli(Map.of("KVPOOL_PREFERRED_SEGMENT", target), "put", "env/" + i,
                            "--value", "v", "--master", cluster.masterAddress())).isZero();
                }
                assertThat(objectsOn(c, target)).isEqualTo(before + 3);

                // the nodes' heartbeats are answered in the master's frame loop, not on a thread per node
                // (kvpool.frameLoop): each node's link waits there, and the nodes stay registered
                long frames = (long) cluster.metric("master_loop_frames_total");
                while (cluster.metric("master_loop_connections") < 3 || cluster.metric("master_loop_frames_total") < frames + 6) {
                    Thread.sleep(100); // heartbeats come every few hundred ms; the IT's own timeout bounds the wait
                }
                assertThat(c.stats().segments()).hasSize(3).allSatisfy(seg -> assertThat(seg.active()).isTrue());
            }
        }
    }

    private static long objectsOn(KvPoolClient c, String segment) {
        return c.stats().segments().stream().filter(s -> s.name().equals(segment)).findFirst().orElseThrow().objects();
    }

    @Test
    void killingANodeMidTrafficLeavesMissesNotErrors() throws Exception {
        try (ProcessCluster cluster = new ProcessCluster("kill-node", "--node-ttl", "2s")) {
            for (int i = 0; i < 3; i++) {
                cluster.startNode("64MiB");
            }
            try (KvPoolClient c = KvPoolClient.connect(cluster.masterAddress())) {
                ProcessCluster.awaitActive(c, 3, "three segments are registered");
                // place a known set of objects on each node
                List<Map<String, byte[]>> perNode = new ArrayList<>();
                for (int n = 0; n < 3; n++) {
                    perNode.add(fill(c, "node" + n + "/", 40, cluster.nodes.get(n).name));
                }
                ProcessCluster.Managed victim = cluster.nodes.get(1);

                ConcurrentLinkedQueue<String> errors = new ConcurrentLinkedQueue<>();
                AtomicBoolean stop = new AtomicBoolean();
                AtomicLong hits = new AtomicLong();
                AtomicLong misses = new AtomicLong();
                AtomicLong puts = new AtomicLong();
                List<Thread> traffic = new ArrayList<>();
                for (int t = 0; t < 2; t++) {
                    int id = t;
                    traffic.add(Thread.ofPlatform().start(() -> {
                        SplittableRandom rnd = new SplittableRandom(SEED + id);
                        try (KvPoolClient tc = KvPoolClient.connect(io.kvpool.client.ClientConfig
                                .forMaster(cluster.masterAddress()).withAutoDetectLocal(false))) {
                            for (int i = 0; !stop.get(); i++) {
                                String key = "traffic/" + id + "/" + i;
                                PutStatus st = tc.put(key, Payloads.make(key, 1, 20_000 + rnd.nextInt(50_000)));
                                // keep the traffic's own objects to about 200 (9 MB): the pool never fills, so
                                // no eviction takes the objects the test checks afterwards
                                tc.remove("traffic/" + id + "/" + (i - 100));
                                if (st == PutStatus.OK) {
                                    puts.incrementAndGet();
                                } else if (st != PutStatus.FAILED) {
                                    errors.add(key + ": " + st);
                                }
                                int n = rnd.nextInt(3);
                                String probe = "node" + n + "/" + rnd.nextInt(40);
                                Optional<byte[]> got = tc.get(probe);
                                if (got.isPresent()) {
                                    hits.incrementAndGet();
                                    if (!java.util.Arrays.equals(got.get(), perNode.get(n).get(probe))) {
                                        errors.add("wrong bytes for " + probe);
                                    }
                                } else {
                                    misses.incrementAndGet();
                                }
                            }
                        } catch (RuntimeException e) {
                            errors.add("traffic " + id + ": " + e);
                        }
                    }));
                }
                // kill -9 in the middle of traffic, once traffic is flowing
                Await.until("50 puts of the traffic", () -> puts.get() >= 50 || !errors.isEmpty());
                victim.kill9();
                ProcessCluster.awaitStats(c, s -> s.segments().size() == 2, "the killed node is dropped");
                long putsAfterDrop = puts.get();
                Await.until("50 puts after the drop", () -> puts.get() >= putsAfterDrop + 50 || !errors.isEmpty());
                stop.set(true);
                for (Thread t : traffic) {
                    t.join();
                }
                assertThat(errors).as("clients see values (misses, FAILED puts), never exceptions").isEmpty();
                assertThat(hits.get()).isPositive();

                // what was on the dead node is gone; everything else is intact
                for (String key : perNode.get(1).keySet()) {
                    assertThat(c.get(key)).as(key).isEmpty();
                }
                assertAllReadBack(c, perNode.get(0));
                assertAllReadBack(c, perNode.get(2));
                PoolStats s = c.stats();
                assertThat(s.segments()).extracting(PoolStats.SegmentStats::name).doesNotContain(victim.name);

                // a replacement node joins and takes writes
                ProcessCluster.Managed fresh = cluster.startNode("64MiB");
                ProcessCluster.awaitActive(c, 3, "the new node is registered");
                Map<String, byte[]> more = fill(c, "fresh/", 10, fresh.name);
                assertAllReadBack(c, more);
            }
        }
    }

    @Test
    void restartedMasterRebuildsFromTheNodes() throws Exception {
        try (ProcessCluster cluster = new ProcessCluster("master-restart")) {
            cluster.startNode("64MiB");
            cluster.startNode("64MiB");
            try (KvPoolClient c = KvPoolClient.connect(io.kvpool.client.ClientConfig.forMaster(cluster.masterAddress())
                    .withAutoDetectLocal(false))) {
                ProcessCluster.awaitActive(c, 2, "two segments are registered");
                c.removeAll(true);
                long epoch = c.stats().epoch();
                Map<String, byte[]> stored = fill(c, "keep/", 200, null);
                assertThat(c.remove("keep/0")).isTrue();
                stored.remove("keep/0");

                cluster.killMaster();
                cluster.startMaster();
                PoolStats s = ProcessCluster.awaitStats(c, st -> st.keys() == stored.size()
                        && st.segments().size() == 2 && st.segments().stream().allMatch(PoolStats.SegmentStats::active),
                        "the new master has rebuilt every object");
                assertThat(s.epoch()).as("the epoch survives the restart").isEqualTo(epoch);
                // the same client instance carries on, and a new one sees the same pool
                assertAllReadBack(c, stored);
                assertThat(c.get("keep/0")).as("a removed object does not come back").isEmpty();
                // its write leases died with the old master: the next puts go under fresh ones
                byte[] v = Payloads.make("after/0", 1, 3000);
                assertThat(c.put("after/0", v)).isEqualTo(PutStatus.OK);
                assertThat(c.putBatch(List.of("after/b0", "after/b1"), List.of(MemorySegment.ofArray(v),
                        MemorySegment.ofArray(v)))).containsOnly(PutStatus.OK);
                assertThat(c.get("after/0")).hasValueSatisfying(b -> assertThat(b).isEqualTo(v));
                try (KvPoolClient fresh = KvPoolClient.connect(cluster.masterAddress())) {
                    assertAllReadBack(fresh, stored);
                    assertThat(fresh.put("after/1", new byte[100])).isEqualTo(PutStatus.OK);
                    assertThat(fresh.put("keep/1", new byte[100])).isEqualTo(PutStatus.ALREADY_EXISTS);
                }
            }
        }
    }
}
