package io.kvpool.it;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.client.PutOptions;
import io.kvpool.client.PutStatus;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;
import org.junit.jupiter.api.Test;

import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * Removals are absolute: once {@code removeAll(force)}, {@code remove}, {@code removeByPrefix} or an
 * {@code upsert} returns, no reader anywhere gets the removed or replaced bytes, even a reader that
 * remembers where they were and even when the node holding them is frozen (SIGSTOP) or killed
 * (SIGKILL, its shared-memory file left behind) and so cannot mark them dead.
 *
 * <p>Real processes: a master, node A (shared memory in /dev/shm: same-machine readers copy straight
 * out of it) and node B. Readers of four kinds read every key first, so that they remember its
 * location: same-machine and TCP clients in this JVM, and the same two in processes of their own.
 * Then node A is hurt, and each operation runs and is checked against every reader.
 */
class AbsoluteRemovalIT {

    /** What happens to node A before the removals. */
    enum Fault { HEALTHY, FROZEN, KILLED }

    private static final Duration READER_TIMEOUT = Duration.ofSeconds(2);
    private static final int SIZE = 64 << 10;

    /** The readers: two in this JVM, two in processes of their own. */
    private static final class Readers implements AutoCloseable {
        final KvPoolClient shm;
        final KvPoolClient tcp;
        final ReaderProcess.Handle shmProcess;
        final ReaderProcess.Handle tcpProcess;

        Readers(String master) throws Exception {
            shm = KvPoolClient.connect(ClientConfig.forMaster(master).withRequestTimeout(READER_TIMEOUT));
            tcp = KvPoolClient.connect(ClientConfig.forMaster(master).withSharedMemory(false)
                    .withRequestTimeout(READER_TIMEOUT));
            shmProcess = new ReaderProcess.Handle(master, true, READER_TIMEOUT);
            tcpProcess = new ReaderProcess.Handle(master, false, READER_TIMEOUT);
        }

        /** The versions each reader gets for {@code keys}: one list per reader, -1 for a miss. */
        List<List<Integer>> read(List<String> keys) throws Exception {
            List<List<Integer>> out = new ArrayList<>();
            out.add(versions(shm.getBatch(keys)));
            out.add(versions(tcp.getBatch(keys)));
            out.add(shmProcess.get(keys));
            out.add(tcpProcess.get(keys));
            return out;
        }

        @Override
        public void close() {
            shm.close();
            tcp.close();
            shmProcess.close();
            tcpProcess.close();
        }
    }

    private static List<Integer> versions(List<Optional<byte[]>> values) {
        List<Integer> out = new ArrayList<>(values.size());
        for (Optional<byte[]> v : values) {
            out.add(ReaderProcess.version(v));
        }
        return out;
    }

    private static void putAll(KvPoolClient c, List<String> keys, int version, String segment, boolean upsert) {
        PutOptions on = PutOptions.preferring(segment);
        for (String k : keys) {
            byte[] v = Payloads.make(k, version, SIZE);
            PutStatus st = upsert ? c.upsert(k, MemorySegment.ofArray(v), on) : c.put(k, v, on);
            assertThat(st).as("put %s v%d", k, version).isEqualTo(PutStatus.OK);
        }
    }

    /** Every reader, for every key: never a version below {@code minVersion} (-1, a miss, is fine), never garbage. */
    private static void assertNothingOlder(Readers r, List<String> keys, int minVersion, String what) throws Exception {
        List<List<Integer>> got = r.read(keys);
        String[] names = {"same-machine reader", "TCP reader", "same-machine reader process", "TCP reader process"};
        for (int i = 0; i < got.size(); i++) {
            for (int j = 0; j < keys.size(); j++) {
                int v = got.get(i).get(j);
                assertThat(v == -1 || v >= minVersion).as("%s: %s read %s as version %d", what, names[i], keys.get(j), v)
                        .isTrue();
            }
        }
    }

    @ParameterizedTest(name = "node A {0}")
    @EnumSource(Fault.class)
    void noReaderGetsRemovedOrReplacedBytesOnceTheOperationReturned(Fault fault) throws Exception {
        Assumptions.assumeTrue(Files.isDirectory(Path.of("/dev/shm")), "no /dev/shm");
        try (ProcessCluster cluster = new ProcessCluster("absolute-" + fault.name().toLowerCase(),
                "--node-ttl", "60s")) { // the default read lease (2s): the times printed are the product's
            ProcessCluster.Managed a = cluster.startNode("64MiB", "/dev/shm");
            ProcessCluster.Managed b = cluster.startNode("64MiB", "/dev/shm");
            try (KvPoolClient admin = KvPoolClient.connect(ClientConfig.forMaster(cluster.masterAddress())
                    .withRequestTimeout(Duration.ofSeconds(10))); // a removal may wait one read lease
                 Readers readers = new Readers(cluster.masterAddress())) {
                ProcessCluster.awaitStats(admin, s -> s.segments().stream().filter(PoolStats.SegmentStats::active).count() == 2,
                        "both nodes active");
                List<String> byKey = Payloads.keys("abs/key/", 8);
                List<String> byPrefix = Payloads.keys("abs/prefix/", 8);
                List<String> upserted = Payloads.keys("abs/upsert/", 8);
                List<String> byReset = Payloads.keys("abs/reset/", 8);
                List<String> all = new ArrayList<>();
                for (List<String> set : List.of(byKey, byPrefix, upserted, byReset)) {
                    putAll(admin, set, 1, a.name, false);
                    all.addAll(set);
                }
                // every reader reads everything: hits, and now remembered
                for (List<Integer> got : readers.read(all)) {
                    assertThat(got).as("before the fault").containsOnly(1);
                }

                switch (fault) {
                    case HEALTHY -> { }
                    case FROZEN -> a.freeze();
                    case KILLED -> a.kill9();
                }
                try {
                    long t0 = System.nanoTime();
                    assertThat(admin.removeBatch(byKey)).isEqualTo(byKey.size());
                    long tRemove = System.nanoTime() - t0;
                    assertNothingOlder(readers, byKey, Integer.MAX_VALUE, "after remove");

                    t0 = System.nanoTime();
                    assertThat(admin.removeByPrefix("abs/prefix/")).isEqualTo(byPrefix.size());
                    long tPrefix = System.nanoTime() - t0;
                    assertNothingOlder(readers, byPrefix, Integer.MAX_VALUE, "after removeByPrefix");

                    // the replacement lands on node B; the old version stays intact in A's memory
                    t0 = System.nanoTime();
                    putAll(admin, upserted, 2, b.name, true);
                    long tUpsert = (System.nanoTime() - t0) / upserted.size();
                    assertNothingOlder(readers, upserted, 2, "after upsert");

                    t0 = System.nanoTime();
                    admin.removeAll(true);
                    long tReset = System.nanoTime() - t0;
                    assertNothingOlder(readers, all, Integer.MAX_VALUE, "after removeAll(force)");

                    // the RL hazard: the same keys saved again with new content (new weights, same tokens)
                    putAll(admin, byReset, 3, b.name, false);
                    assertNothingOlder(readers, byReset, 3, "after removeAll(force) and a new put of the same keys");
                    System.out.printf("node A %s: remove of 8 keys %d ms, removeByPrefix %d ms, upsert %d ms each,"
                                    + " removeAll(force) %d ms%n", fault, tRemove / 1_000_000, tPrefix / 1_000_000,
                            tUpsert / 1_000_000, tReset / 1_000_000);
                } finally {
                    if (fault == Fault.FROZEN) {
                        a.thaw();
                    }
                }
                if (fault == Fault.FROZEN) {
                    // awake again, the node may serve what it still holds until it hears of the reset:
                    // readers must not care
                    assertNothingOlder(readers, all, 2, "after node A woke up");
                    assertNothingOlder(readers, byReset, 3, "after node A woke up");
                }
            }
        }
    }

    /**
     * A reader process frozen while it holds a lease and remembers locations: removeAll(force)
     * returns once that lease has run out (bounded), and the reader, woken, reads nothing old.
     */
    @Test
    void aFrozenReaderHoldsAResetForOneLeaseAtMostAndReadsNothingOldWhenItWakes() throws Exception {
        Assumptions.assumeTrue(Files.isDirectory(Path.of("/dev/shm")), "no /dev/shm");
        try (ProcessCluster cluster = new ProcessCluster("absolute-frozen-reader")) {
            ProcessCluster.Managed a = cluster.startNode("64MiB", "/dev/shm");
            try (KvPoolClient admin = KvPoolClient.connect(cluster.masterAddress());
                 ReaderProcess.Handle reader = new ReaderProcess.Handle(cluster.masterAddress(), true, READER_TIMEOUT)) {
                ProcessCluster.awaitStats(admin, s -> s.segments().stream().anyMatch(PoolStats.SegmentStats::active),
                        "node active");
                List<String> ks = Payloads.keys("frozen-reader/", 8);
                putAll(admin, ks, 1, a.name, false);
                assertThat(reader.get(ks)).containsOnly(1);
                reader.freeze();
                long took;
                try {
                    long t0 = System.nanoTime();
                    admin.removeAll(true);
                    took = System.nanoTime() - t0;
                    putAll(admin, ks, 2, a.name, false);
                } finally {
                    reader.thaw();
                }
                assertThat(reader.get(ks)).as("the woken reader").containsOnly(2);
                System.out.printf("removeAll(force) with a frozen reader (default read lease): %d ms%n", took / 1_000_000);
            }
        }
    }
}
