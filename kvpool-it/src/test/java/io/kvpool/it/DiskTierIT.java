package io.kvpool.it;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.client.PutOptions;
import io.kvpool.client.PutResult;
import io.kvpool.client.PutStatus;
import io.kvpool.config.Size;
import io.kvpool.node.StorageNode;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Tier;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The SSD tier end to end: a pool whose memory is far smaller than what is stored spills to disk
 * and reads everything back byte-exact; a restarted node brings its disk objects back; a corrupt
 * record is a miss, never bytes; a full disk evicts its coldest objects; hot disk objects move back
 * to memory.
 */
class DiskTierIT {

    private static final int VALUE = 256 << 10;

    private static InProcessCluster cluster(Path disk, Size memory, Size diskSize, int promoteAfter) throws Exception {
        return new InProcessCluster(1, memory, m -> m,
                n -> n.withDisk(disk, diskSize).withPromoteAfter(promoteAfter));
    }

    private static Map<String, byte[]> fill(KvPoolClient c, String prefix, int n) {
        Map<String, byte[]> stored = new LinkedHashMap<>();
        for (int i = 0; i < n; i++) {
            String k = prefix + i;
            byte[] v = Payloads.make(k, 1, VALUE - 1000 + i);
            assertThat(c.put(k, v)).as(k).isEqualTo(PutStatus.OK);
            stored.put(k, v);
        }
        return stored;
    }

    private static double metric(InProcessCluster cluster, String series) throws Exception {
        String body = HttpClient.newHttpClient().send(HttpRequest.newBuilder(URI.create(
                "http://127.0.0.1:" + cluster.master.httpPort() + "/metrics")).build(),
                HttpResponse.BodyHandlers.ofString()).body();
        Matcher m = Pattern.compile("^" + Pattern.quote(series) + " (\\S+)$", Pattern.MULTILINE).matcher(body);
        return m.find() ? Double.parseDouble(m.group(1)) : 0;
    }

    /** Polls until the condition holds (spills are reported by the node asynchronously). */
    private static void await(String what, java.util.function.BooleanSupplier condition) throws InterruptedException {
        Await.until(what, condition);
    }

    private static long diskObjects(KvPoolClient c) {
        return c.stats().segments().stream().mapToLong(PoolStats.SegmentStats::diskObjects).sum();
    }

    @Test
    void spillsBeyondMemoryAndReadsEverythingBack(@TempDir Path disk) throws Exception {
        try (InProcessCluster cluster = cluster(disk, Size.ofMiB(8), Size.ofMiB(128), 0);
             KvPoolClient c = cluster.client(cfg -> cfg.withTierLog(true))) {
            assertThat(cluster.nodes.getFirst().hasDiskTier()).isTrue();
            Map<String, byte[]> stored = fill(c, "spill/", 96); // 24 MiB into 8 MiB of memory
            Await.tiersSettled(c, stored.size());
            assertThat(diskObjects(c)).as("objects live in the SSD tier").isPositive();
            List<String> keys = new ArrayList<>(stored.keySet());
            List<Optional<byte[]>> got = c.getBatch(keys);
            for (int i = 0; i < keys.size(); i++) {
                byte[] expected = stored.get(keys.get(i));
                assertThat(got.get(i)).as(keys.get(i)).hasValueSatisfying(b -> assertThat(b).isEqualTo(expected));
            }
            String seg = cluster.nodes.getFirst().name();
            await("disk hits reach the master's metrics",
                    () -> metricOrZero(cluster, "node_tier_hits_total{segment=\"" + seg + "\",tier=\"disk\"}") > 0);
            assertThat(metric(cluster, "node_tier_written_bytes_total{segment=\"" + seg + "\",tier=\"disk\"}")).isPositive();
        }
    }

    @Test
    void concurrentDiskLoadsStayWithinATinyBudget(@TempDir Path disk) throws Exception {
        // every value is larger than the whole budget: each goes alone, the threads take turns
        try (InProcessCluster cluster = cluster(disk, Size.ofMiB(8), Size.ofMiB(128), 0);
             KvPoolClient c = cluster.client(cfg -> cfg.withDiskLoadBudget(ClientConfig.MIN_DISK_LOAD_BUDGET))) {
            Map<String, byte[]> stored = fill(c, "budget/", 96);
            Await.tiersSettled(c, stored.size());
            assertThat(diskObjects(c)).isPositive();
            List<String> keys = new ArrayList<>(stored.keySet());
            try (var pool = java.util.concurrent.Executors.newFixedThreadPool(4)) {
                List<java.util.concurrent.Future<List<Optional<byte[]>>>> loads = new ArrayList<>();
                for (int t = 0; t < 4; t++) {
                    List<String> mine = new ArrayList<>(keys);
                    java.util.Collections.rotate(mine, t * 24);
                    loads.add(pool.submit(() -> c.getBatch(mine)));
                }
                for (int t = 0; t < 4; t++) {
                    List<String> mine = new ArrayList<>(keys);
                    java.util.Collections.rotate(mine, t * 24);
                    List<Optional<byte[]>> got = loads.get(t).get();
                    for (int i = 0; i < mine.size(); i++) {
                        byte[] expected = stored.get(mine.get(i));
                        assertThat(got.get(i)).as(mine.get(i)).hasValueSatisfying(b -> assertThat(b).isEqualTo(expected));
                    }
                }
            }
        }
    }

    private static double metricOrZero(InProcessCluster cluster, String series) {
        try {
            return metric(cluster, series);
        } catch (Exception e) {
            return 0;
        }
    }

    /**
     * Every copy is accounted for in the SSD tier: an object with two copies, evicted from memory,
     * goes to both nodes' SSD tiers and is listed with two disk copies; removeAll(force) empties both.
     */
    @Test
    void evictedTwoCopyObjectsKeepBothCopiesOnDiskAndAResetEmptiesEveryTier(@TempDir Path disk) throws Exception {
        AtomicInteger dirs = new AtomicInteger();
        try (InProcessCluster cluster = new InProcessCluster(2, Size.ofMiB(8), m -> m,
                n -> n.withDisk(disk.resolve("node-" + dirs.incrementAndGet()), Size.ofMiB(128)).withPromoteAfter(0)
                        .withHeartbeatInterval(Duration.ofMillis(200)));
             KvPoolClient c = cluster.client()) {
            PutOptions two = PutOptions.DEFAULT.withReplicas(2);
            Map<String, byte[]> stored = new LinkedHashMap<>();
            for (int i = 0; i < 48; i++) { // 12 MiB, twice, into 16 MiB of memory
                String k = "copies/" + i;
                byte[] v = Payloads.make(k, 1, VALUE - 1000 + i);
                PutResult r = c.putDetailed(k, v, two);
                assertThat(r.status()).as(k).isEqualTo(PutStatus.OK);
                assertThat(r.copies()).as(k).isEqualTo(2);
                stored.put(k, v);
            }
            Await.tiersSettled(c, stored.size());
            await("every object is listed again with both copies, in memory or on disk", () -> {
                PoolStats s = c.stats();
                long copies = s.segments().stream().mapToLong(g -> g.objects() + g.diskObjects()).sum();
                return s.keys() == stored.size() && copies == 2L * stored.size();
            });
            for (PoolStats.SegmentStats g : c.stats().segments()) {
                assertThat(g.diskObjects()).as("%s spilled its own copies", g.name()).isPositive();
            }
            List<String> keys = new ArrayList<>(stored.keySet());
            List<Optional<byte[]>> got = c.getBatch(keys);
            for (int i = 0; i < keys.size(); i++) {
                byte[] expected = stored.get(keys.get(i));
                assertThat(got.get(i)).as(keys.get(i)).hasValueSatisfying(b -> assertThat(b).isEqualTo(expected));
            }
            assertThat(c.removeAll(true)).isEqualTo(stored.size());
            await("both SSD tiers are empty", () -> diskObjects(c) == 0);
            assertThat(c.stats().keys()).isZero();
            assertThat(c.getBatch(keys)).allSatisfy(v -> assertThat(v).isEmpty());
        }
    }

    @Test
    void aRestartedNodeBringsItsDiskObjectsBack(@TempDir Path disk) throws Exception {
        // a short TTL so that the master notices the closed node soon (close does not deregister)
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(8), m -> m.withNodeTtl(Duration.ofSeconds(2)),
                n -> n.withDisk(disk, Size.ofMiB(128)).withPromoteAfter(0).withHeartbeatInterval(Duration.ofMillis(200)));
             KvPoolClient c = cluster.client()) {
            Map<String, byte[]> stored = fill(c, "restart/", 64);
            Await.tiersSettled(c, stored.size());
            // the disk count comes with the node's heartbeats: wait until it accounts for every object
            await("the node's disk statistics caught up", () -> diskObjects(c)
                    + c.stats().segments().stream().mapToLong(PoolStats.SegmentStats::objects).sum() == stored.size());
            long onDisk = diskObjects(c);
            assertThat(onDisk).isPositive();

            StorageNode old = cluster.nodes.removeFirst();
            old.close();
            await("the node's objects are gone with it", () -> c.stats().keys() == 0);
            cluster.addNode(Size.ofMiB(8), n -> n.withDisk(disk, Size.ofMiB(128)).withPromoteAfter(0)
                    .withHeartbeatInterval(Duration.ofMillis(200)));
            await("the disk objects are back", () -> c.stats().keys() == onDisk);
            int back = 0;
            for (Map.Entry<String, byte[]> e : stored.entrySet()) {
                Optional<byte[]> got = c.get(e.getKey());
                if (got.isPresent()) {
                    assertThat(got.get()).as(e.getKey()).isEqualTo(e.getValue());
                    back++;
                }
            }
            assertThat(back).isEqualTo(onDisk);
        }
    }

    @Test
    void aCorruptRecordIsAMissNeverBytes(@TempDir Path disk) throws Exception {
        try (InProcessCluster cluster = cluster(disk, Size.ofMiB(8), Size.ofMiB(128), 0);
             KvPoolClient c = cluster.client()) {
            Map<String, byte[]> stored = fill(c, "corrupt/", 64);
            Await.tiersSettled(c, stored.size());
            // flip one value byte of every record in the first log file
            Path log;
            try (Stream<Path> files = Files.list(disk)) {
                log = files.filter(p -> p.getFileName().toString().endsWith(".log")).sorted().findFirst().orElseThrow();
            }
            int corrupted = corruptValues(log);
            assertThat(corrupted).isPositive();
            int misses = 0;
            for (Map.Entry<String, byte[]> e : stored.entrySet()) {
                Optional<byte[]> got = c.get(e.getKey());
                if (got.isPresent()) {
                    assertThat(got.get()).as("never bad bytes: " + e.getKey()).isEqualTo(e.getValue());
                } else {
                    misses++;
                }
            }
            assertThat(misses).isGreaterThanOrEqualTo(corrupted);
            String seg = cluster.nodes.getFirst().name();
            await("checksum failures are counted",
                    () -> metricOrZero(cluster, "node_disk_checksum_failures_total{segment=\"" + seg + "\"}") >= 1);
        }
    }

    /** Flips a byte in the middle of the value of each record found in {@code file}; returns how many. */
    private static int corruptValues(Path file) throws Exception {
        int n = 0;
        try (FileChannel ch = FileChannel.open(file, StandardOpenOption.READ, StandardOpenOption.WRITE);
             Arena arena = Arena.ofConfined()) {
            long size = ch.size();
            MemorySegment m = ch.map(FileChannel.MapMode.READ_WRITE, 0, size, arena);
            for (long off = 0; off + ObjectLayout.KEY_OFFSET <= size; off += ObjectLayout.ALIGNMENT) {
                ObjectLayout.Header h = ObjectLayout.readHeader(m, off, size);
                if (h == null || h.valueLength() == 0) {
                    continue;
                }
                long at = off + ObjectLayout.valueOffset(h.keyLength()) + h.valueLength() / 2;
                m.set(java.lang.foreign.ValueLayout.JAVA_BYTE, at,
                        (byte) ~m.get(java.lang.foreign.ValueLayout.JAVA_BYTE, at));
                n++;
                off += h.regionLength() - ObjectLayout.ALIGNMENT;
            }
            m.force();
        }
        return n;
    }

    @Test
    void aFullDiskEvictsItsColdestObjects(@TempDir Path disk) throws Exception {
        try (InProcessCluster cluster = cluster(disk, Size.ofMiB(4), Size.ofMiB(8), 0);
             KvPoolClient c = cluster.client()) {
            Map<String, byte[]> stored = fill(c, "full/", 120); // 30 MiB through 4 MiB of memory and 8 MiB of disk
            String seg = cluster.nodes.getFirst().name();
            await("the disk tier evicted at its watermark",
                    () -> metricOrZero(cluster, "node_disk_evictions_total{segment=\"" + seg + "\"}") > 0);
            PoolStats s = c.stats();
            assertThat(s.segments().getFirst().diskUsedBytes()).isLessThanOrEqualTo(8L << 20);
            for (Map.Entry<String, byte[]> e : stored.entrySet()) {
                c.get(e.getKey()).ifPresent(b -> assertThat(b).as(e.getKey()).isEqualTo(e.getValue()));
            }
        }
    }

    @Test
    void hotDiskObjectsMoveBackToMemory(@TempDir Path disk) throws Exception {
        try (InProcessCluster cluster = cluster(disk, Size.ofMiB(8), Size.ofMiB(128), 2);
             KvPoolClient c = cluster.client(cfg -> cfg.withLocationCache(0))) {
            Map<String, byte[]> stored = fill(c, "promote/", 64);
            Await.tiersSettled(c, stored.size());
            // the first objects were evicted first: read them until promoted
            String seg = cluster.nodes.getFirst().name();
            String hot = stored.keySet().iterator().next();
            await("a hot disk object is promoted", () -> {
                assertThat(c.get(hot)).hasValueSatisfying(b -> assertThat(b).isEqualTo(stored.get(hot)));
                return metricOrZero(cluster, "node_disk_promotions_total{segment=\"" + seg + "\"}") > 0;
            });
            assertThat(c.get(hot)).hasValueSatisfying(b -> assertThat(b).isEqualTo(stored.get(hot)));
        }
    }

    /**
     * An object moving from memory to the SSD tier is never a miss: a reader holding the location the master
     * gave before the eviction (memory, this offset and generation) is served from the SSD tier, and the
     * master lists the copy on disk with the offset its memory copy had, which the node also serves.
     */
    @Test
    void aLocationFromBeforeASpillStillReads(@TempDir Path disk) throws Exception {
        try (InProcessCluster cluster = cluster(disk, Size.ofMiB(8), Size.ofMiB(128), 0);
             KvPoolClient c = cluster.client()) {
            StorageNode node = cluster.nodes.getFirst();
            byte[] value = Payloads.make("early/0", 1, VALUE);
            assertThat(c.put("early/0", value)).isEqualTo(PutStatus.OK);
            RawFrames.Where before = RawFrames.where(cluster, "early/0");
            assertThat(before.replica().tier()).isEqualTo(Tier.MEMORY);
            fill(c, "later/", 64); // 16 MiB through 8 MiB: the oldest object spills
            await("early/0 is listed on the SSD tier", () -> {
                try {
                    return RawFrames.where(cluster, "early/0").replica().tier() == Tier.DISK;
                } catch (Exception e) {
                    throw new IllegalStateException(e);
                }
            });
            RawFrames.Where after = RawFrames.where(cluster, "early/0");
            assertThat(after.generation()).isEqualTo(before.generation());
            assertThat(after.replica().offset()).as("listed with its memory offset").isEqualTo(before.replica().offset());
            assertThat(RawFrames.read(node, before.replica().offset(), before.generation(), VALUE, Tier.MEMORY))
                    .isEqualTo(value);
            assertThat(RawFrames.read(node, after.replica().offset(), after.generation(), VALUE, Tier.DISK))
                    .isEqualTo(value);
        }
    }

    @Test
    void noDiskTierMeansNoDiskAnything() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(8));
             KvPoolClient c = cluster.client()) {
            fill(c, "nodisk/", 40);
            assertThat(cluster.nodes.getFirst().hasDiskTier()).isFalse();
            assertThat(Thread.getAllStackTraces().keySet()).as("disk threads")
                    .noneMatch(t -> t.getName().startsWith("kvpool-disk"));
            assertThat(diskObjects(c)).isZero();
            assertThat(c.stats().segments().getFirst().diskCapacityBytes()).isZero();
            String seg = cluster.nodes.getFirst().name();
            String body = HttpClient.newHttpClient().send(HttpRequest.newBuilder(URI.create(
                    "http://127.0.0.1:" + cluster.master.httpPort() + "/metrics")).build(),
                    HttpResponse.BodyHandlers.ofString()).body();
            assertThat(body).contains("node_tier_capacity_bytes{segment=\"" + seg + "\",tier=\"memory\"}")
                    .doesNotContain("tier=\"disk\"").doesNotContain("node_disk_queue_bytes{");
        }
    }
}
