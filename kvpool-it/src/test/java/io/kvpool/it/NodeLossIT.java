package io.kvpool.it;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.client.PutOptions;
import io.kvpool.client.PutResult;
import io.kvpool.client.PutStatus;
import org.junit.jupiter.api.Test;

import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.List;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * One of three nodes killed with SIGKILL while clients put and get (real processes). With two copies
 * per object nothing acknowledged is lost, no read returns a wrong byte, and the master's repair
 * brings every object back to two copies on the survivors. With one copy, exactly the dead node's
 * objects become misses, as before. Reads go over TCP (no shared memory), so a read of a dead node's
 * copy really fails and falls through to the next copy.
 */
class NodeLossIT {

    private static final int OBJECTS = 3000;

    private static List<MemorySegment> values(List<String> keys) {
        List<MemorySegment> out = new ArrayList<>(keys.size());
        for (String k : keys) {
            out.add(MemorySegment.ofArray(FailoverIT.valueOf(k)));
        }
        return out;
    }

    private static long regions(PoolStats s) {
        return s.segments().stream().mapToLong(PoolStats.SegmentStats::objects).sum();
    }

    private static KvPoolClient client(ProcessCluster cluster) {
        return KvPoolClient.connect(ClientConfig.forMaster(cluster.masterAddress()).withSharedMemory(false));
    }

    @Test
    void withTwoCopiesAKilledNodeLosesNothingAndRepairRestoresTwoCopies() throws Exception {
        try (ProcessCluster cluster = new ProcessCluster("node-loss-2", "--node-ttl", "2s")) {
            List<ProcessCluster.Managed> nodes = List.of(cluster.startNode("64MiB"), cluster.startNode("64MiB"),
                    cluster.startNode("64MiB"));
            PutOptions two = PutOptions.DEFAULT.withReplicas(2);
            try (KvPoolClient c = client(cluster)) {
                ProcessCluster.awaitActive(c, 3, "three nodes registered");
                List<String> keys = Payloads.keys("loss/", OBJECTS);
                for (PutResult r : c.putBatchDetailed(keys, values(keys), two)) {
                    assertThat(r.status()).isEqualTo(PutStatus.OK);
                    assertThat(r.copies()).isEqualTo(2);
                }
                Set<String> acknowledged = ConcurrentHashMap.newKeySet();
                acknowledged.addAll(keys);

                // traffic: gets of acknowledged keys (every byte checked) and two-copy puts of new ones
                AtomicBoolean stop = new AtomicBoolean();
                AtomicLong gets = new AtomicLong();
                AtomicLong wrong = new AtomicLong();
                AtomicLong lostReads = new AtomicLong();
                AtomicLong puts = new AtomicLong();
                List<String> lostKeys = new ArrayList<>();
                Thread traffic = Thread.ofPlatform().name("node-loss-traffic").start(() -> {
                    try (KvPoolClient t = client(cluster)) {
                        int n = 0;
                        while (!stop.get()) {
                            String k = "loss/" + ThreadLocalRandom.current().nextInt(OBJECTS);
                            Optional<byte[]> v = t.get(k);
                            gets.incrementAndGet();
                            if (v.isEmpty()) {
                                lostReads.incrementAndGet();
                                synchronized (lostKeys) {
                                    lostKeys.add(k);
                                }
                            } else if (!Arrays.equals(v.get(), FailoverIT.valueOf(k))) {
                                wrong.incrementAndGet();
                            }
                            if (n % 10 == 0) {
                                String nk = "loss/new/" + n;
                                if (t.putDetailed(nk, FailoverIT.valueOf(nk), two).status() == PutStatus.OK) {
                                    acknowledged.add(nk);
                                    puts.incrementAndGet();
                                }
                            }
                            n++;
                        }
                    }
                });
                ProcessCluster.awaitStats(c, s -> true, "traffic running");
                Await.until("500 gets of the traffic", () -> gets.get() >= 500);
                double copiesBefore = cluster.metric("master_repair_copies_total");
                nodes.get(1).kill9();
                ProcessCluster.awaitStats(c, s -> s.segments().size() == 2, "the killed node dropped");
                // traffic goes on while the repair starts (copies made after the kill)
                long deadline = System.nanoTime() + 60_000_000_000L;
                while (System.nanoTime() < deadline && cluster.metric("master_repair_copies_total") <= copiesBefore) {
                    Thread.sleep(100);
                }
                stop.set(true);
                traffic.join();

                // the repair restores the copies: two regions per object, and the gauge says so. Waited for
                // on the regions themselves: the gauge is as of the last scan (a wait on the gauge alone
                // ended twice in full-suite runs with about 3,000 objects one copy short)
                PoolStats s = c.stats();
                while (System.nanoTime() < deadline && !(s.pendingPuts() == 0 && regions(s) == 2 * s.keys()
                        && cluster.metric("master_objects_under_replicated") == 0)) {
                    Thread.sleep(100);
                    s = c.stats();
                }
                assertThat(s.pendingPuts()).as("puts in flight").isZero();
                assertThat(regions(s)).as("two copies of each of the %d objects", s.keys()).isEqualTo(2 * s.keys());
                assertThat(cluster.metric("master_objects_under_replicated")).isZero();
                assertThat(cluster.metric("master_repair_copies_total")).isGreaterThan(copiesBefore);

                assertThat(wrong.get()).as("wrong bytes").isZero();
                assertThat(lostReads.get()).as("acknowledged keys missed during the loss: %s", lostKeys).isZero();
                assertThat(gets.get()).isGreaterThan(500);
                assertThat(puts.get()).isPositive();
                int missing = 0;
                List<String> all = new ArrayList<>(acknowledged);
                List<Optional<byte[]>> got = c.getBatch(all);
                for (int i = 0; i < all.size(); i++) {
                    if (got.get(i).isEmpty()) {
                        missing++;
                    } else {
                        assertThat(got.get(i).get()).as(all.get(i)).isEqualTo(FailoverIT.valueOf(all.get(i)));
                    }
                }
                assertThat(missing).as("acknowledged objects lost").isZero();
                assertThat(s.keys()).isEqualTo(all.size());
            }
        }
    }

    @Test
    void withOneCopyOnlyTheKilledNodesObjectsAreMissed() throws Exception {
        try (ProcessCluster cluster = new ProcessCluster("node-loss-1", "--node-ttl", "2s")) {
            List<ProcessCluster.Managed> nodes = List.of(cluster.startNode("64MiB"), cluster.startNode("64MiB"),
                    cluster.startNode("64MiB"));
            try (KvPoolClient c = client(cluster)) {
                ProcessCluster.awaitActive(c, 3, "three nodes registered");
                List<String> keys = Payloads.keys("single/", OBJECTS);
                for (PutResult r : c.putBatchDetailed(keys, values(keys), PutOptions.DEFAULT.withReplicas(1))) {
                    assertThat(r.status()).isEqualTo(PutStatus.OK);
                    assertThat(r.copies()).isOne();
                }
                // single copies go under write leases, a range at a time: kill the node holding the most
                PoolStats.SegmentStats fullest = c.stats().segments().stream()
                        .max(Comparator.comparingLong(PoolStats.SegmentStats::objects)).orElseThrow();
                ProcessCluster.Managed victim = nodes.stream().filter(n -> n.name.equals(fullest.name())).findFirst()
                        .orElseThrow();
                long onVictim = fullest.objects();
                assertThat(onVictim).isPositive();
                victim.kill9();
                ProcessCluster.awaitStats(c, s -> s.segments().size() == 2, "the killed node dropped");
                List<Optional<byte[]>> got = c.getBatch(keys);
                long misses = 0;
                for (int i = 0; i < keys.size(); i++) {
                    if (got.get(i).isEmpty()) {
                        misses++;
                    } else {
                        assertThat(got.get(i).get()).isEqualTo(FailoverIT.valueOf(keys.get(i)));
                    }
                }
                assertThat(misses).isEqualTo(onVictim);
                assertThat(cluster.metric("master_objects_under_replicated")).isZero();
            }
        }
    }
}
