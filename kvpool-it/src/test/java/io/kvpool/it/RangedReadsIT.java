package io.kvpool.it;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.Located;
import io.kvpool.client.PoolStats;
import io.kvpool.client.PutStatus;
import io.kvpool.config.Size;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.FrameStatus;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.RemoteException;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.KeyList;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.NodeMessages;
import io.kvpool.config.HostPort;
import io.kvpool.node.StorageNode;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * Ranged reads (protocol version 11): a located object's byte ranges, read layer by layer as a
 * layerwise load reads them, are byte-exact against the whole value, over the same-machine path and
 * over TCP (NODE_READ_RANGE), from memory and from the SSD tier; an object removed or replaced after
 * it was located is a miss, never other bytes; a range outside the value is an error naming it.
 */
class RangedReadsIT {

    private static final int LAYERS = 8;
    private static final int LAYER = 8 << 10;

    private static KvPoolClient client(InProcessCluster cluster, boolean shm) {
        return cluster.client(c -> c.withSharedMemory(shm));
    }

    /** Stores n blocks of LAYERS layers each; returns their values. */
    private static List<byte[]> store(KvPoolClient c, List<String> keys) {
        List<byte[]> values = new ArrayList<>();
        List<MemorySegment> segs = new ArrayList<>();
        for (String k : keys) {
            values.add(Payloads.make(k, 1, LAYERS * LAYER));
            segs.add(MemorySegment.ofArray(values.getLast()));
        }
        assertThat(c.putBatch(keys, segs)).containsOnly(PutStatus.OK);
        return values;
    }

    /** Reads every block layer by layer, one getRangesInto per layer, as a layerwise load does. */
    private static byte[][] readLayerwise(KvPoolClient c, Located at) {
        int n = at.size();
        byte[][] out = new byte[n][LAYERS * LAYER];
        for (int l = 0; l < LAYERS; l++) {
            long[] offsets = new long[n];
            Arrays.fill(offsets, (long) l * LAYER);
            List<MemorySegment> dsts = new ArrayList<>();
            for (int i = 0; i < n; i++) {
                dsts.add(MemorySegment.ofArray(out[i]).asSlice((long) l * LAYER, LAYER));
            }
            long[] got = c.getRangesInto(at, offsets, dsts);
            for (int i = 0; i < n; i++) {
                assertThat(got[i]).as("layer %d of %s", l, at.key(i))
                        .isEqualTo(at.valueLength(i) == KvPoolClient.MISS ? KvPoolClient.MISS : LAYER);
            }
        }
        return out;
    }

    @ParameterizedTest(name = "shared memory {0}")
    @ValueSource(booleans = {true, false})
    void layersReadOneByOneAreTheWholeValue(boolean shm) throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(32));
             KvPoolClient c = client(cluster, shm)) {
            List<String> keys = Payloads.keys("layers/" + shm + "/", 16);
            List<byte[]> values = store(c, keys);
            List<String> asked = new ArrayList<>(keys);
            asked.add("layers/absent");
            Located at = c.locate(asked);
            assertThat(at.valueLength(16)).isEqualTo(KvPoolClient.MISS);
            assertThat(at.valueLength(3)).isEqualTo(LAYERS * LAYER);
            assertThat(at.present()).isEqualTo(16);
            long servedBefore = cluster.nodes.getFirst().bytesRead();
            byte[][] got = readLayerwise(c, at);
            for (int i = 0; i < 16; i++) {
                assertThat(got[i]).as(keys.get(i)).isEqualTo(values.get(i));
            }
            if (shm) {
                assertThat(cluster.nodes.getFirst().bytesRead() - servedBefore)
                        .as("same-machine ranges are copied without the node").isZero();
            } else {
                // the node counts a reply once it was sent, which may be just after the client read it
                Await.until("the node counted the ranges it sent",
                        () -> cluster.nodes.getFirst().bytesRead() - servedBefore >= 16L * LAYERS * LAYER);
                assertThat(cluster.nodes.getFirst().bytesRead() - servedBefore).as("the node sent exactly the ranges")
                        .isEqualTo(16L * LAYERS * LAYER);
            }
            // odd ranges too: any offset and length inside the value, the empty range at its end
            Random r = new Random(42);
            try (Arena arena = Arena.ofConfined()) {
                for (int t = 0; t < 50; t++) {
                    int i = r.nextInt(16);
                    int off = r.nextInt(LAYERS * LAYER + 1);
                    int len = r.nextInt(LAYERS * LAYER - off + 1);
                    MemorySegment dst = arena.allocate(Math.max(1, len)).asSlice(0, len);
                    assertThat(c.getRangeInto(keys.get(i), off, dst)).isEqualTo(len);
                    assertThat(dst.toArray(ValueLayout.JAVA_BYTE))
                            .isEqualTo(Arrays.copyOfRange(values.get(i), off, off + len));
                }
            }
        }
    }

    @ParameterizedTest(name = "shared memory {0}")
    @ValueSource(booleans = {true, false})
    void anObjectReplacedOrRemovedAfterItWasLocatedIsAMiss(boolean shm) throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(32));
             KvPoolClient c = client(cluster, shm);
             KvPoolClient other = cluster.client()) {
            List<String> keys = Payloads.keys("gone/" + shm + "/", 4);
            List<byte[]> values = store(c, keys);
            Located at = c.locate(keys);
            assertThat(other.upsert(keys.get(0), Payloads.make(keys.get(0), 2, LAYERS * LAYER))).isEqualTo(PutStatus.OK);
            assertThat(other.remove(keys.get(1))).isTrue();
            byte[][] dst = new byte[4][LAYER];
            long[] got = c.getRangesInto(at, new long[]{LAYER, LAYER, LAYER, LAYER},
                    Arrays.stream(dst).map(MemorySegment::ofArray).toList());
            assertThat(got).containsExactly(KvPoolClient.MISS, KvPoolClient.MISS, LAYER, LAYER);
            assertThat(at.valueLength(0)).as("replaced: a miss for good").isEqualTo(KvPoolClient.MISS);
            assertThat(at.valueLength(1)).as("removed: a miss for good").isEqualTo(KvPoolClient.MISS);
            for (int i = 2; i < 4; i++) {
                assertThat(dst[i]).isEqualTo(Arrays.copyOfRange(values.get(i), LAYER, 2 * LAYER));
            }
            // the whole pool emptied: every located object is a miss
            other.removeAll(true);
            got = c.getRangesInto(at, new long[4], Arrays.stream(dst).map(MemorySegment::ofArray).toList());
            assertThat(got).containsOnly(KvPoolClient.MISS);
        }
    }

    @Test
    void aRangeOutsideTheValueIsAnErrorNamingIt() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(32));
             KvPoolClient c = cluster.client()) {
            List<String> keys = List.of("oob/a");
            store(c, keys);
            Located at = c.locate(keys);
            MemorySegment dst = MemorySegment.ofArray(new byte[LAYER]);
            assertThatThrownBy(() -> c.getRangesInto(at, new long[]{(LAYERS - 1) * LAYER + 1}, List.of(dst)))
                    .isInstanceOf(IllegalArgumentException.class)
                    .hasMessageContaining("oob/a").hasMessageContaining("[" + ((LAYERS - 1) * LAYER + 1) + ", ")
                    .hasMessageContaining("outside its value of " + LAYERS * LAYER + " bytes");
            assertThatThrownBy(() -> c.getRangesInto(at, new long[]{-1}, List.of(dst)))
                    .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("[-1, ");
            assertThatThrownBy(() -> c.getRangesInto(at, new long[]{0, 0}, List.of(dst)))
                    .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("1 located objects but 2");

            // the node refuses such a range itself, naming the item, and keeps the connection
            StorageNode node = cluster.nodes.getFirst();
            PoolStats.SegmentStats seg = c.stats().segments().getFirst();
            assertThat(seg.name()).isEqualTo(node.name());
            var where = c.locate(keys);
            try (FrameConnection conn = FrameConnection.connect(new HostPort("127.0.0.1", node.port()),
                    Duration.ofSeconds(5), Limits.DEFAULT)) {
                // an item naming nothing at offset 0 with a range past its declared length
                BodyWriter w = new BodyWriter(64);
                new NodeMessages.ReadRange(List.of(new NodeMessages.RangeItem(
                        new NodeMessages.ReadItem(0, 1, 100, Tier.MEMORY), 90, 11))).write(w);
                assertThatThrownBy(() -> conn.call(Opcode.NODE_READ_RANGE, w, Duration.ofSeconds(5)))
                        .isInstanceOfSatisfying(RemoteException.class, e -> assertThat(e.status())
                                .isEqualTo(FrameStatus.BAD_REQUEST))
                        .hasMessageContaining("item 0").hasMessageContaining("[90, 90 + 11)")
                        .hasMessageContaining("outside its value of 100 bytes");
                BodyWriter ok = new BodyWriter(64);
                new NodeMessages.ReadRange(List.of(new NodeMessages.RangeItem(
                        new NodeMessages.ReadItem(0, 1, 100, Tier.MEMORY), 90, 10))).write(ok);
                assertThat(conn.call(Opcode.NODE_READ_RANGE, ok, Duration.ofSeconds(5)).payloadLength())
                        .as("a miss, on the same connection").isZero();
            }
            assertThat(where.valueLength(0)).isEqualTo(LAYERS * LAYER);
        }
    }

    /** How many of {@code keys} the master lists with their first copy in the SSD tier. */
    private static long onDisk(InProcessCluster cluster, List<String> keys) {
        try (FrameConnection m = FrameConnection.connect(new HostPort("127.0.0.1", cluster.master.port()),
                Duration.ofSeconds(5), Limits.DEFAULT)) {
            BodyWriter w = new BodyWriter(256);
            new KeyList(keys.stream().map(k -> k.getBytes(StandardCharsets.UTF_8)).toList()).write(w);
            List<MasterMessages.ReplicaList> where = MasterMessages.ReplicaListReply.read(
                    m.call(Opcode.BATCH_GET_REPLICA_LIST, w, Duration.ofSeconds(5)).body()).items();
            return where.stream().filter(r -> r.code() == ResultCode.OK && r.replicas().getFirst().onDisk()).count();
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
    }

    @Test
    void rangesOfObjectsInTheSsdTierAreByteExact(@TempDir Path disk) throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(8), m -> m,
                n -> n.withDisk(disk, Size.ofMiB(128)).withPromoteAfter(0));
             KvPoolClient c = cluster.client()) {
            List<String> keys = Payloads.keys("disk/", 64);
            List<byte[]> values = new ArrayList<>();
            Located early = null;
            for (String k : keys) { // 64 x 256 KiB into 8 MiB of memory: most spill
                values.add(Payloads.make(k, 1, LAYERS * (32 << 10)));
                assertThat(c.put(k, values.getLast())).isEqualTo(PutStatus.OK);
                if (values.size() == 16) {
                    early = c.locate(keys.subList(0, 16)); // located in memory, most read after they moved to disk
                }
            }
            Await.tiersSettled(c, keys.size()); // 64 MiB of staging: no spill dropped
            assertThat(onDisk(cluster, keys.subList(0, 16))).as("objects moved to the SSD tier").isPositive();
            // the versions located in memory: found again by one lookup, read from the disk tier
            byte[][] moved = new byte[16][32 << 10];
            long[] at16 = new long[16];
            Arrays.setAll(at16, i -> (long) (i % LAYERS) * (32 << 10));
            long[] gotMoved = c.getRangesInto(early, at16, Arrays.stream(moved).map(MemorySegment::ofArray).toList());
            for (int i = 0; i < 16; i++) {
                assertThat(gotMoved[i]).isEqualTo(32 << 10);
                assertThat(moved[i]).isEqualTo(Arrays.copyOfRange(values.get(i), (int) at16[i],
                        (int) at16[i] + (32 << 10)));
            }
            Located at = c.locate(keys);
            int layer = 32 << 10;
            for (int l = 0; l < LAYERS; l += 3) {
                long[] offsets = new long[keys.size()];
                Arrays.fill(offsets, (long) l * layer);
                byte[][] dst = new byte[keys.size()][layer];
                long[] got = c.getRangesInto(at, offsets, Arrays.stream(dst).map(MemorySegment::ofArray).toList());
                for (int i = 0; i < keys.size(); i++) {
                    assertThat(got[i]).as("layer %d of %s", l, keys.get(i)).isEqualTo(layer);
                    assertThat(dst[i]).isEqualTo(Arrays.copyOfRange(values.get(i), l * layer, (l + 1) * layer));
                }
            }
        }
    }
}
