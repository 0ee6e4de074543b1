package io.kvpool.it;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutInParts;
import io.kvpool.client.PutOptions;
import io.kvpool.client.PutStatus;
import io.kvpool.config.HostPort;
import io.kvpool.config.Size;
import io.kvpool.master.MasterConfig;
import io.kvpool.master.MasterServer;
import io.kvpool.node.NodeConfig;
import io.kvpool.node.StorageNode;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.FrameStatus;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.RemoteException;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.NodeMessages;
import io.kvpool.protocol.msg.WriteGrant;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;
import org.junit.jupiter.params.provider.ValueSource;

import java.lang.foreign.MemorySegment;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Optional;
import java.util.Random;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * Puts in parts (protocol version 11): objects reserved at once, their values written range by range
 * in any order and from several threads, as a layerwise save writes layers, and made visible at the
 * finish; over the same-machine path and TCP (NODE_PART_WRITE), two-phase and under write leases. An
 * object with a byte unwritten fails and leaves nothing readable; a removeAll(force) or a new master
 * between the begin and the finish fences; an abandoned put leaves nothing.
 */
class PutInPartsIT {

    private static final int LAYERS = 8;
    private static final int LAYER = 16 << 10;

    private static List<byte[]> values(List<String> keys, int version) {
        List<byte[]> out = new ArrayList<>();
        for (String k : keys) {
            out.add(Payloads.make(k, version, LAYERS * LAYER));
        }
        return out;
    }

    private static long[] lengths(List<byte[]> values) {
        return values.stream().mapToLong(v -> v.length).toArray();
    }

    /** Writes layers [from, to) of every item, layers in a shuffled order, each layer one batch of parts. */
    private static void writeLayers(PutInParts parts, List<byte[]> values, int from, int to, Random r) {
        writeLayers(parts, values, from, to, r, 0);
    }

    /** {@link #writeLayers} of items [first, first + values.size()). */
    private static void writeLayers(PutInParts parts, List<byte[]> values, int from, int to, Random r, int first) {
        List<Integer> order = new ArrayList<>();
        for (int l = from; l < to; l++) {
            order.add(l);
        }
        Collections.shuffle(order, r);
        for (int l : order) {
            int n = values.size();
            int[] items = new int[n];
            long[] offsets = new long[n];
            List<MemorySegment> srcs = new ArrayList<>();
            for (int i = 0; i < n; i++) {
                items[i] = first + n - 1 - i;
                offsets[i] = (long) l * LAYER;
                srcs.add(MemorySegment.ofArray(values.get(n - 1 - i)).asSlice((long) l * LAYER, LAYER));
            }
            parts.write(items, offsets, srcs);
        }
    }

    private static void assertStored(KvPoolClient c, List<String> keys, List<byte[]> values) {
        List<Optional<byte[]>> got = c.getBatch(keys);
        for (int i = 0; i < keys.size(); i++) {
            byte[] expected = values.get(i);
            assertThat(got.get(i)).as(keys.get(i)).hasValueSatisfying(b -> assertThat(b).isEqualTo(expected));
        }
    }

    @ParameterizedTest(name = "shared memory {0}, write leases {1}")
    @CsvSource({"true,true", "true,false", "false,true", "false,false"})
    void partsWrittenInAnyOrderFromManyThreadsFinishByteExact(boolean shm, boolean leases) throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(64));
             KvPoolClient c = cluster.client(cfg -> cfg.withSharedMemory(shm).withWriteLeases(leases))) {
            List<String> keys = Payloads.keys("parts/" + shm + leases + "/", 12);
            List<byte[]> values = values(keys, 1);
            long tcpBefore = cluster.nodes.getFirst().bytesWritten();
            try (PutInParts parts = c.beginPut(keys, lengths(values), PutOptions.DEFAULT)) {
                assertThat(parts.size()).isEqualTo(12);
                assertThat(parts.status(0)).as("open").isNull();
                // half the layers layer by layer, the rest part by part from four threads, in random order
                writeLayers(parts, values, 0, LAYERS / 2, new Random(1));
                List<int[]> rest = new ArrayList<>();
                for (int i = 0; i < keys.size(); i++) {
                    for (int l = LAYERS / 2; l < LAYERS; l++) {
                        rest.add(new int[]{i, l});
                    }
                }
                Collections.shuffle(rest, new Random(2));
                try (ExecutorService pool = Executors.newFixedThreadPool(4)) {
                    List<Future<Boolean>> done = new ArrayList<>();
                    for (int[] p : rest) {
                        done.add(pool.submit(() -> parts.write(p[0], (long) p[1] * LAYER,
                                MemorySegment.ofArray(values.get(p[0])).asSlice((long) p[1] * LAYER, LAYER))));
                    }
                    for (Future<Boolean> f : done) {
                        assertThat(f.get()).isTrue();
                    }
                }
                assertThat(c.get(keys.getFirst())).as("nothing is visible before the finish").isEmpty();
                assertThat(parts.finish()).containsOnly(PutStatus.OK);
                assertThat(parts.status(3)).isEqualTo(PutStatus.OK);
            }
            assertStored(c, keys, values);
            try (KvPoolClient reader = cluster.client(cfg -> cfg.withSharedMemory(!shm))) {
                assertStored(reader, keys, values); // the checksums held for the other path's reads too
            }
            if (!shm) {
                assertThat(cluster.nodes.getFirst().bytesWritten() - tcpBefore).isEqualTo(12L * LAYERS * LAYER);
            }
        }
    }

    /**
     * More part writes than the pipelining window ({@code PIPELINED_WRITES} frames unanswered on a
     * connection): each layer of each block is its own write call, so the client takes answers as it goes
     * and still lands every byte where it belongs.
     */
    @Test
    void morePartWritesThanThePipeliningWindowLandByteExact() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(32));
             KvPoolClient c = cluster.client(cfg -> cfg.withSharedMemory(false))) {
            List<String> keys = Payloads.keys("window/", 12);
            List<byte[]> values = values(keys, 1);
            try (PutInParts parts = c.beginPut(keys, lengths(values), PutOptions.DEFAULT)) {
                for (int l = 0; l < LAYERS; l++) {
                    for (int i = 0; i < keys.size(); i++) {
                        assertThat(parts.write(i, (long) l * LAYER,
                                MemorySegment.ofArray(values.get(i)).asSlice((long) l * LAYER, LAYER))).isTrue();
                    }
                }
                assertThat(LAYERS * keys.size()).as("write calls").isGreaterThan(64);
                assertThat(parts.finish()).containsOnly(PutStatus.OK);
            }
            assertStored(c, keys, values);
        }
    }

    @Test
    void everyCopyIsWrittenInPartsOverTcp() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(2, Size.ofMiB(32));
             KvPoolClient c = cluster.client(cfg -> cfg.withSharedMemory(false))) {
            List<String> keys = Payloads.keys("copies/", 6);
            List<byte[]> values = values(keys, 1);
            try (PutInParts parts = c.beginPut(keys, lengths(values), PutOptions.DEFAULT.withReplicas(2))) {
                writeLayers(parts, values, 0, LAYERS, new Random(3));
                assertThat(parts.finish()).containsOnly(PutStatus.OK);
            }
            for (StorageNode n : cluster.nodes) {
                assertThat(n.objectCount()).as("objects on %s", n.name()).isEqualTo(6);
            }
            assertStored(c, keys, values);
        }
    }

    @ParameterizedTest(name = "shared memory {0}, write leases {1}")
    @CsvSource({"true,true", "false,false"})
    void aMissingPartFailsItsObjectAndLeavesNothingReadable(boolean shm, boolean leases) throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(32));
             KvPoolClient c = cluster.client(cfg -> cfg.withSharedMemory(shm).withWriteLeases(leases));
             KvPoolClient other = cluster.client()) {
            List<String> keys = Payloads.keys("missing/" + shm + "/", 3);
            List<byte[]> values = values(keys, 1);
            assertThat(c.put(keys.get(2), values.get(2))).isEqualTo(PutStatus.OK);
            try (PutInParts parts = c.beginPut(keys, lengths(values), PutOptions.DEFAULT)) {
                if (leases) {
                    // under a write lease a taken key is found at the commit: its bytes are written in vain
                    assertThat(parts.status(2)).isNull();
                    writeLayers(parts, List.of(values.get(2)), 0, LAYERS, new Random(10), 2);
                } else {
                    assertThat(parts.status(2)).isEqualTo(PutStatus.ALREADY_EXISTS);
                    assertThat(parts.write(2, 0, MemorySegment.ofArray(values.get(2)).asSlice(0, LAYER)))
                            .as("no copy to write to").isFalse();
                }
                for (int l = 0; l < LAYERS; l++) {
                    MemorySegment layer0 = MemorySegment.ofArray(values.get(0)).asSlice((long) l * LAYER, LAYER);
                    parts.write(0, (long) l * LAYER, layer0);
                    if (l != 5) {
                        parts.write(1, (long) l * LAYER, MemorySegment.ofArray(values.get(1)).asSlice((long) l * LAYER, LAYER));
                    }
                }
                // the bytes of layer 5 of item 1, one byte short
                parts.write(1, 5L * LAYER, MemorySegment.ofArray(values.get(1)).asSlice(5L * LAYER, LAYER - 1));
                assertThatThrownBy(() -> parts.write(1, 5L * LAYER - 8, MemorySegment.ofArray(new byte[16])))
                        .isInstanceOf(IllegalArgumentException.class).hasMessageContaining(keys.get(1))
                        .hasMessageContaining("overlaps the range [" + 4 * LAYER + ", " + 5 * LAYER + ")");
                assertThatThrownBy(() -> parts.write(0, LAYERS * LAYER - 1, MemorySegment.ofArray(new byte[2])))
                        .isInstanceOf(IllegalArgumentException.class).hasMessageContaining(keys.get(0))
                        .hasMessageContaining("outside its value of " + LAYERS * LAYER + " bytes");
                assertThat(parts.finish()).containsExactly(PutStatus.OK, PutStatus.FAILED, PutStatus.ALREADY_EXISTS);
                assertThatThrownBy(() -> parts.write(0, 0, MemorySegment.ofArray(new byte[1])))
                        .isInstanceOf(IllegalStateException.class).hasMessageContaining("finished");
            }
            assertStored(c, List.of(keys.get(0), keys.get(2)), List.of(values.get(0), values.get(2)));
            assertThat(c.get(keys.get(1))).isEmpty();
            assertThat(other.exists(keys.get(1))).isFalse();
            // the key is free for a put after the failed one
            assertThat(other.put(keys.get(1), values.get(1))).isEqualTo(PutStatus.OK);
        }
    }

    @ParameterizedTest(name = "shared memory {0}, write leases {1}")
    @CsvSource({"true,true", "false,false", "false,true"})
    void aForcedRemoveAllBetweenBeginAndFinishFences(boolean shm, boolean leases) throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(32));
             KvPoolClient c = cluster.client(cfg -> cfg.withSharedMemory(shm).withWriteLeases(leases));
             KvPoolClient admin = cluster.client()) {
            List<String> keys = Payloads.keys("fenced/" + shm + leases + "/", 4);
            List<byte[]> values = values(keys, 1);
            try (PutInParts parts = c.beginPut(keys, lengths(values), PutOptions.DEFAULT)) {
                writeLayers(parts, values, 0, LAYERS / 2, new Random(4));
                admin.removeAll(true);
                writeLayers(parts, values, LAYERS / 2, LAYERS, new Random(5));
                assertThat(parts.finish()).containsOnly(PutStatus.FENCED);
            }
            for (String k : keys) {
                assertThat(admin.get(k)).as(k).isEmpty();
            }
            // the same keys stored afresh after the reset
            try (PutInParts parts = c.beginPut(keys, lengths(values), PutOptions.DEFAULT)) {
                writeLayers(parts, values, 0, LAYERS, new Random(6));
                assertThat(parts.finish()).containsOnly(PutStatus.OK);
            }
            assertStored(admin, keys, values);
        }
    }

    @ParameterizedTest(name = "write leases {0}")
    @ValueSource(booleans = {true, false})
    void aNewMasterBetweenBeginAndFinishFences(boolean leases) throws Exception {
        MasterServer first = master(0);
        int port = first.port();
        MasterServer second = null;
        StorageNode node = null;
        try {
            node = new StorageNode(NodeConfig.defaults(new HostPort("127.0.0.1", port), Size.ofMiB(32))
                    .withListen("127.0.0.1", 0));
            assertThat(node.awaitRegistered(Duration.ofSeconds(30))).isTrue();
            try (KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster("127.0.0.1:" + port)
                    .withWriteLeases(leases))) {
                List<String> keys = Payloads.keys("newmaster/" + leases + "/", 4);
                List<byte[]> values = values(keys, 1);
                PutInParts parts = c.beginPut(keys, lengths(values), PutOptions.DEFAULT);
                writeLayers(parts, values, 0, LAYERS / 2, new Random(7));
                first.close();
                second = master(port);
                StorageNode n = node;
                Await.until("the node registered with the new master", () -> n.isRegistered()
                        && c.stats().segments().stream().anyMatch(s -> s.active() && s.name().equals(n.name())));
                writeLayers(parts, values, LAYERS / 2, LAYERS, new Random(8));
                assertThat(parts.finish()).doesNotContain(PutStatus.OK);
                for (String k : keys) {
                    assertThat(c.get(k)).as(k).isEmpty();
                    assertThat(c.exists(k)).as(k).isFalse();
                }
            }
        } finally {
            for (AutoCloseable x : new AutoCloseable[]{node, second, first}) {
                if (x != null) {
                    x.close();
                }
            }
        }
    }

    private static MasterServer master(int port) throws Exception {
        return new MasterServer(MasterConfig.defaults().withListen("127.0.0.1", port, 0)
                .withSummaryInterval(Duration.ZERO));
    }

    @ParameterizedTest(name = "shared memory {0}")
    @ValueSource(booleans = {true, false})
    void anAbandonedPutLeavesNothing(boolean shm) throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(32));
             KvPoolClient c = cluster.client(cfg -> cfg.withSharedMemory(shm))) {
            List<String> keys = Payloads.keys("abandoned/" + shm + "/", 4);
            List<byte[]> values = values(keys, 1);
            PutInParts parts = c.beginPut(keys, lengths(values), PutOptions.DEFAULT);
            writeLayers(parts, values, 0, LAYERS, new Random(9));
            parts.abandon();
            parts.abandon(); // twice: nothing more
            assertThatThrownBy(() -> parts.finish()).isInstanceOf(IllegalStateException.class)
                    .hasMessageContaining("abandoned");
            for (String k : keys) {
                assertThat(c.get(k)).as(k).isEmpty();
            }
            assertThat(cluster.nodes.getFirst().objectCount()).isZero();
            List<byte[]> again = values(keys, 2);
            assertThat(c.putBatch(keys, again.stream().map(MemorySegment::ofArray).toList())).containsOnly(PutStatus.OK);
            assertStored(c, keys, again);
        }
    }

    /**
     * The node's side, frame by frame: a part outside its value is refused naming it before any byte
     * is stored; a part of a write not begun on this connection is NOT_FOUND; a write begun and never
     * ended is dropped when its connection closes, never readable.
     */
    @Test
    void theNodeTakesPartsOnlyForWritesItsConnectionBegan() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(32))) {
            StorageNode node = cluster.nodes.getFirst();
            HostPort at = new HostPort("127.0.0.1", node.port());
            byte[] key = "raw/part".getBytes(StandardCharsets.UTF_8);
            long offset = 1 << 20;
            long gen = 1L << 40;
            byte[] value = Payloads.make("raw/part", 1, 1000);
            try (FrameConnection a = FrameConnection.connect(at, Duration.ofSeconds(5), Limits.DEFAULT);
                 FrameConnection b = FrameConnection.connect(at, Duration.ofSeconds(5), Limits.DEFAULT)) {
                BodyWriter begin = new BodyWriter(256);
                new NodeMessages.Write(node.epoch(), 0, List.of(new NodeMessages.WriteItem(offset, gen, key, 1000, 0,
                        WriteGrant.none()))).write(begin);
                assertThat(codes(a.call(Opcode.NODE_PART_BEGIN, begin, Duration.ofSeconds(5)))).containsExactly(ResultCode.OK);
                assertThatThrownBy(() -> part(a, offset, gen, 990, value, 0, 11)).isInstanceOfSatisfying(
                        RemoteException.class, e -> assertThat(e.status()).isEqualTo(FrameStatus.BAD_REQUEST))
                        .hasMessageContaining("item 0").hasMessageContaining("[990, 990 + 11)")
                        .hasMessageContaining("outside its value of 1000 bytes");
                assertThat(part(b, offset, gen, 0, value, 0, 500)).as("not begun on this connection")
                        .containsExactly(ResultCode.NOT_FOUND);
            }
            Await.until("the write begun on a closed connection is dropped", () -> !readable(at, offset, gen));
            // the same frames, ended: readable with the checksum given at the end
            try (FrameConnection a = FrameConnection.connect(at, Duration.ofSeconds(5), Limits.DEFAULT)) {
                BodyWriter begin = new BodyWriter(256);
                new NodeMessages.Write(node.epoch(), 0, List.of(new NodeMessages.WriteItem(offset, gen + 1, key, 1000, 0,
                        WriteGrant.none()))).write(begin);
                assertThat(codes(a.call(Opcode.NODE_PART_BEGIN, begin, Duration.ofSeconds(5)))).containsExactly(ResultCode.OK);
                assertThat(part(a, offset, gen + 1, 500, value, 500, 500)).containsExactly(ResultCode.OK);
                assertThat(part(a, offset, gen + 1, 0, value, 0, 500)).containsExactly(ResultCode.OK);
                BodyWriter end = new BodyWriter(64);
                new NodeMessages.PartEnd(List.of(new NodeMessages.PartEndItem(offset, gen + 1,
                        ObjectLayout.valueCrc(MemorySegment.ofArray(value)), true))).write(end);
                assertThat(codes(a.call(Opcode.NODE_PART_END, end, Duration.ofSeconds(5)))).containsExactly(ResultCode.OK);
                assertThat(readable(at, offset, gen + 1)).isTrue();
            }
        }
    }

    private static List<ResultCode> codes(FrameConnection.Reply r) {
        return MasterMessages.Codes.read(r.body()).codes();
    }

    private static List<ResultCode> part(FrameConnection c, long offset, long gen, long at, byte[] value, int from,
                                         int n) throws Exception {
        BodyWriter w = new BodyWriter(64);
        new NodeMessages.PartWrite(List.of(new NodeMessages.PartItem(offset, gen, at, n))).write(w);
        return codes(c.call(Opcode.NODE_PART_WRITE, w, Duration.ofSeconds(5),
                MemorySegment.ofArray(Arrays.copyOfRange(value, from, from + n)).asByteBuffer()));
    }

    private static boolean readable(HostPort at, long offset, long gen) {
        try (FrameConnection c = FrameConnection.connect(at, Duration.ofSeconds(5), Limits.DEFAULT)) {
            BodyWriter w = new BodyWriter(64);
            new NodeMessages.Read(List.of(new NodeMessages.ReadItem(offset, gen, 1000))).write(w);
            FrameConnection.Reply r = c.call(Opcode.NODE_READ, w, Duration.ofSeconds(5));
            boolean ok = codes(r).getFirst() == ResultCode.OK;
            c.skipPayload(r.payloadLength(), Duration.ofSeconds(5));
            return ok;
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
    }
}
