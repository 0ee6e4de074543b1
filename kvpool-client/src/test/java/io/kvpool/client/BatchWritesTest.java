package io.kvpool.client;

import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameServer;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.Request;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.NodeMessages;
import io.kvpool.protocol.msg.Replica;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.io.RandomAccessFile;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.net.InetSocketAddress;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The put path against a scripted master and scripted nodes: how a batch is cut into node frames,
 * that every value arrives byte-exact with its checksum, and which replicas PUT_END reports failed
 * (or which keys are revoked) when some frames or items fail.
 */
class BatchWritesTest {

    private static final long SEGMENT = 256L << 20;

    /** A node that keeps what it is sent, by offset; fails keys containing "!fail", drops frames with "!drop". */
    private static final class FakeNode implements AutoCloseable {
        final int id;
        final FrameServer server;
        final MemorySegment shm; // null: TCP only
        final Map<Long, byte[]> values = new ConcurrentHashMap<>();
        final List<Integer> frameItems = Collections.synchronizedList(new ArrayList<>());
        final List<Long> framePayloads = Collections.synchronizedList(new ArrayList<>());
        final Map<String, Map<Long, NodeMessages.WriteItem>> begun = new ConcurrentHashMap<>();
        final List<String> badChecksums = Collections.synchronizedList(new ArrayList<>());

        FakeNode(int id, MemorySegment shm) throws IOException {
            this.id = id;
            this.shm = shm;
            this.server = new FrameServer("node" + id, new InetSocketAddress("127.0.0.1", 0), Limits.DEFAULT,
                    Duration.ofSeconds(30), op -> true, this::handle);
        }

        private void handle(Request req) throws IOException {
            switch (req.opcode()) {
                case NODE_WRITE -> {
                    NodeMessages.Write w = NodeMessages.Write.read(req.body());
                    frameItems.add(w.items().size());
                    framePayloads.add(req.payloadLength());
                    if (w.items().stream().anyMatch(it -> key(it).contains("!drop"))) {
                        throw new IOException("dropping the connection");
                    }
                    List<ResultCode> codes = new ArrayList<>();
                    for (NodeMessages.WriteItem it : w.items()) {
                        byte[] v = new byte[(int) it.valueLength()];
                        req.readPayload(MemorySegment.ofArray(v));
                        codes.add(keep(it, v));
                    }
                    reply(req, codes);
                }
                case NODE_SHM_WRITE_BEGIN -> {
                    NodeMessages.Write w = NodeMessages.Write.read(req.body());
                    frameItems.add(w.items().size());
                    framePayloads.add(req.payloadLength());
                    if (w.items().stream().anyMatch(it -> key(it).contains("!drop"))) {
                        throw new IOException("dropping the connection");
                    }
                    Map<Long, NodeMessages.WriteItem> open = begun.computeIfAbsent(req.peer(), p -> new ConcurrentHashMap<>());
                    List<ResultCode> codes = new ArrayList<>();
                    for (NodeMessages.WriteItem it : w.items()) {
                        open.put(it.generation(), it);
                        codes.add(ResultCode.OK);
                    }
                    reply(req, codes);
                }
                case NODE_SHM_WRITE_END -> {
                    NodeMessages.ShmWriteEnd end = NodeMessages.ShmWriteEnd.read(req.body());
                    Map<Long, NodeMessages.WriteItem> open = begun.getOrDefault(req.peer(), Map.of());
                    List<ResultCode> codes = new ArrayList<>();
                    for (NodeMessages.ShmWriteEndItem e : end.items()) {
                        NodeMessages.WriteItem it = open.remove(e.generation());
                        if (it == null || it.offset() != e.offset() || !e.copied()) {
                            codes.add(ResultCode.NOT_FOUND);
                            continue;
                        }
                        long at = it.offset() + ObjectLayout.valueOffset(it.key().length);
                        codes.add(keep(it, shm.asSlice(at, it.valueLength()).toArray(ValueLayout.JAVA_BYTE)));
                    }
                    reply(req, codes);
                }
                default -> throw new IOException("unexpected " + req.opcode());
            }
        }

        private ResultCode keep(NodeMessages.WriteItem it, byte[] v) {
            assertThat(ObjectLayout.valueCrc(MemorySegment.ofArray(v))).as("checksum of %s", key(it))
                    .isEqualTo(it.valueCrc());
            if (key(it).contains("!fail")) {
                return ResultCode.FAILED;
            }
            values.put(it.offset(), v);
            return ResultCode.OK;
        }

        private static String key(NodeMessages.WriteItem it) {
            return new String(it.key(), StandardCharsets.UTF_8);
        }

        private static void reply(Request req, List<ResultCode> codes) throws IOException {
            BodyWriter out = new BodyWriter(8 + codes.size());
            new MasterMessages.Codes(codes).write(out);
            req.reply(out);
        }

        @Override
        public void close() throws IOException {
            server.close();
        }
    }

    /** A master that places every key on the first {@code replicas} nodes and records PUT_END and PUT_REVOKE. */
    private static final class FakeMaster implements AutoCloseable {
        final FrameServer server;
        final List<FakeNode> nodes;
        final String shmPath;
        final AtomicLong generation = new AtomicLong(100);
        final AtomicLong nextOffset = new AtomicLong();
        /** Key to where its replicas went (segment id, offset). */
        final Map<String, List<Replica>> placed = new ConcurrentHashMap<>();
        final Map<String, Long> ended = new ConcurrentHashMap<>();
        final List<String> revoked = Collections.synchronizedList(new ArrayList<>());

        FakeMaster(List<FakeNode> nodes, String shmPath) throws IOException {
            this.nodes = nodes;
            this.shmPath = shmPath;
            this.server = new FrameServer("master", new InetSocketAddress("127.0.0.1", 0), Limits.DEFAULT,
                    Duration.ofSeconds(30), op -> true, this::handle);
        }

        private void handle(Request req) throws IOException {
            BodyWriter out = new BodyWriter();
            switch (req.opcode()) {
                case HELLO -> new MasterMessages.HelloReply(1, 0, 512, 1L << 30, 1, 0).write(out);
                case PING -> out.i64(0);
                case CLUSTER_STATS -> {
                    List<MasterMessages.SegmentInfo> segs = new ArrayList<>();
                    for (FakeNode n : nodes) {
                        segs.add(new MasterMessages.SegmentInfo(n.id, "node" + n.id, "127.0.0.1", n.server.port(),
                                SEGMENT, 0, 0, MasterMessages.SegmentInfo.STATE_ACTIVE, 0,
                                n.shm == null ? "" : shmPath, MasterMessages.TierStats.NONE));
                    }
                    new MasterMessages.ClusterStats(1, 0, 0, 0, 0, SEGMENT * nodes.size(), 1, segs).write(out);
                }
                case PUT_START, BATCH_PUT_START -> {
                    MasterMessages.PutStart ps = MasterMessages.PutStart.read(req.body());
                    List<MasterMessages.PutStartResult> results = new ArrayList<>();
                    for (MasterMessages.PutStartItem it : ps.items()) {
                        long len = ObjectLayout.regionLength(it.key().length, it.valueLength());
                        long offset = nextOffset.getAndAdd((len + 4095) & ~4095L);
                        List<Replica> reps = new ArrayList<>();
                        for (int r = 0; r < ps.replicas(); r++) {
                            reps.add(new Replica(nodes.get(r).id, Tier.MEMORY, offset));
                        }
                        placed.put(new String(it.key(), StandardCharsets.UTF_8), reps);
                        results.add(new MasterMessages.PutStartResult(ResultCode.OK, generation.incrementAndGet(), reps));
                    }
                    new MasterMessages.PutStartReply(0, 0, results).write(out);
                }
                case PUT_END, BATCH_PUT_END, PUT_REVOKE, BATCH_PUT_REVOKE -> {
                    MasterMessages.PutEnd pe = MasterMessages.PutEnd.read(req.body());
                    boolean revoke = req.opcode() == Opcode.PUT_REVOKE || req.opcode() == Opcode.BATCH_PUT_REVOKE;
                    List<ResultCode> codes = new ArrayList<>();
                    for (MasterMessages.PutEndItem it : pe.items()) {
                        String key = new String(it.key(), StandardCharsets.UTF_8);
                        if (revoke) {
                            revoked.add(key);
                        } else {
                            ended.put(key, it.failedReplicas());
                        }
                        codes.add(ResultCode.OK);
                    }
                    new MasterMessages.Codes(codes).write(out);
                }
                default -> throw new IOException("unexpected " + req.opcode());
            }
            req.reply(out);
        }

        KvPoolClient client(int replicas) {
            return KvPoolClient.connect(ClientConfig.forMaster("127.0.0.1:" + server.port()).withLocationCache(0)
                    .withAutoDetectLocal(false).withReplicas(replicas).withSharedMemory(shmPath != null));
        }

        @Override
        public void close() throws IOException {
            server.close();
        }
    }

    private final List<AutoCloseable> closing = new ArrayList<>();

    @AfterEach
    void closeAll() throws Exception {
        Collections.reverse(closing);
        for (AutoCloseable c : closing) {
            c.close();
        }
    }

    private <T extends AutoCloseable> T closeLater(T c) {
        closing.add(c);
        return c;
    }

    private static byte[] bytes(int n, long seed) {
        byte[] b = new byte[n];
        new SplittableRandom(seed).nextBytes(b);
        return b;
    }

    private static void assertStored(FakeMaster m, FakeNode node, int replica, String key, byte[] value) {
        long offset = m.placed.get(key).get(replica).offset();
        assertThat(node.values.get(offset)).as("%s on node %d", key, node.id).isEqualTo(value);
    }

    @Test
    void aLargeBatchGoesInSeveralFramesAndArrivesWhole() throws Exception {
        FakeNode node = closeLater(new FakeNode(1, null));
        FakeMaster master = closeLater(new FakeMaster(List.of(node), null));
        KvPoolClient c = closeLater(master.client(1));
        List<String> keys = new ArrayList<>();
        List<MemorySegment> values = new ArrayList<>();
        List<byte[]> raw = new ArrayList<>();
        try (Arena arena = Arena.ofShared()) {
            for (int i = 0; i < 16; i++) {
                keys.add("big/" + i);
                raw.add(bytes((1 << 20) + i * 1000, i));
                values.add(arena.allocate(raw.get(i).length).copyFrom(MemorySegment.ofArray(raw.get(i))));
            }
            assertThat(c.putBatch(keys, values)).containsOnly(PutStatus.OK).hasSize(16);
        }
        for (int i = 0; i < 16; i++) {
            assertStored(master, node, 0, keys.get(i), raw.get(i));
            assertThat(master.ended.get(keys.get(i))).isZero();
        }
        // about 1/8 of the share per frame (4 lanes, two frames each), never under 1 MiB unless one value is
        assertThat(node.frameItems).hasSizeGreaterThan(1);
        assertThat(node.frameItems.stream().mapToInt(Integer::intValue).sum()).isEqualTo(16);
        assertThat(node.badChecksums).isEmpty();
        assertThat(node.framePayloads).allSatisfy(p -> assertThat(p).isLessThanOrEqualTo(3L << 20));
        assertThat(master.revoked).isEmpty();
    }

    @Test
    void valuesOfAConfinedArenaGoOnTheCallersThread() throws Exception {
        FakeNode node = closeLater(new FakeNode(1, null));
        FakeMaster master = closeLater(new FakeMaster(List.of(node), null));
        KvPoolClient c = closeLater(master.client(1));
        List<String> keys = new ArrayList<>();
        List<byte[]> raw = new ArrayList<>();
        try (Arena arena = Arena.ofConfined()) {
            List<MemorySegment> values = new ArrayList<>();
            for (int i = 0; i < 8; i++) {
                keys.add("confined/" + i);
                raw.add(bytes(1 << 20, 100 + i));
                values.add(arena.allocate(1 << 20).copyFrom(MemorySegment.ofArray(raw.get(i))));
            }
            assertThat(c.putBatch(keys, values)).containsOnly(PutStatus.OK);
        }
        for (int i = 0; i < 8; i++) {
            assertStored(master, node, 0, keys.get(i), raw.get(i));
        }
        assertThat(node.frameItems).containsExactly(8); // one frame: no other thread may read the values
    }

    @Test
    void manySmallValuesStayWithinTheItemLimitPerFrame() throws Exception {
        FakeNode node = closeLater(new FakeNode(1, null));
        FakeMaster master = closeLater(new FakeMaster(List.of(node), null));
        KvPoolClient c = closeLater(master.client(1));
        int n = PerSegment.MAX_ITEMS_PER_NODE_FRAME + 100;
        List<String> keys = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            keys.add("small/" + i);
        }
        byte[] v = bytes(100, 7);
        assertThat(c.putBatch(keys, Collections.nCopies(n, MemorySegment.ofArray(v)))).containsOnly(PutStatus.OK);
        assertThat(node.frameItems).allSatisfy(items -> assertThat(items).isLessThanOrEqualTo(PerSegment.MAX_ITEMS_PER_NODE_FRAME));
        assertThat(node.frameItems.stream().mapToInt(Integer::intValue).sum()).isEqualTo(n);
        assertStored(master, node, 0, keys.get(n - 1), v);
    }

    @Test
    void failedFramesAndItemsFailOnlyTheirReplicas() throws Exception {
        FakeNode first = closeLater(new FakeNode(1, null));
        FakeNode second = closeLater(new FakeNode(2, null));
        FakeMaster master = closeLater(new FakeMaster(List.of(first, second), null));
        KvPoolClient c = closeLater(master.client(2));
        // 24 values of 1 MiB: several frames per node. "!drop" makes whichever frame carries it fail
        // as a whole on both nodes; "!fail" fails that item on both nodes
        List<String> keys = new ArrayList<>();
        List<MemorySegment> values = new ArrayList<>();
        List<byte[]> raw = new ArrayList<>();
        try (Arena arena = Arena.ofShared()) {
            for (int i = 0; i < 24; i++) {
                String k = "rep/" + i + (i == 5 ? "!fail" : "") + (i == 17 ? "!drop" : "");
                keys.add(k);
                raw.add(bytes(1 << 20, 1000 + i));
                values.add(arena.allocate(1 << 20).copyFrom(MemorySegment.ofArray(raw.get(i))));
            }
            List<PutStatus> st = c.putBatch(keys, values);
            // frames are cut the same way on both nodes, so a dropped frame loses the same keys on
            // both: those are revoked and FAILED, like the failed item; every other key is complete
            List<String> lost = new ArrayList<>();
            for (int i = 0; i < 24; i++) {
                String k = keys.get(i);
                boolean onFirst = first.values.containsKey(master.placed.get(k).get(0).offset());
                boolean onSecond = second.values.containsKey(master.placed.get(k).get(1).offset());
                if (!onFirst && !onSecond) {
                    lost.add(k);
                    assertThat(st.get(i)).as(k).isEqualTo(PutStatus.FAILED);
                    assertThat(master.ended).doesNotContainKey(k);
                } else {
                    assertThat(st.get(i)).as(k).isEqualTo(PutStatus.OK);
                    long failed = (onFirst ? 0 : 1) | (onSecond ? 0 : 2);
                    assertThat(master.ended.get(k)).as("failed replicas of %s", k).isEqualTo(failed);
                    if (onFirst) {
                        assertStored(master, first, 0, k, raw.get(i));
                    }
                    if (onSecond) {
                        assertStored(master, second, 1, k, raw.get(i));
                    }
                }
            }
            assertThat(lost).contains(keys.get(5), keys.get(17));
            assertThat(first.badChecksums).isEmpty();
            assertThat(second.badChecksums).isEmpty();
            assertThat(master.revoked).containsExactlyInAnyOrderElementsOf(lost);
            assertThat(lost.size()).as("a dropped frame takes only its own keys").isLessThan(24);
        }
    }

    @Test
    void theSameMachinePathSplitsAndCopiesToo(@TempDir Path dir) throws Exception {
        Path file = dir.resolve("segment");
        try (RandomAccessFile f = new RandomAccessFile(file.toFile(), "rw")) {
            f.setLength(SEGMENT);
        }
        try (FileChannel ch = FileChannel.open(file, StandardOpenOption.READ, StandardOpenOption.WRITE)) {
            MemorySegment nodeView = ch.map(FileChannel.MapMode.READ_WRITE, 0, SEGMENT, Arena.ofAuto());
            FakeNode node = closeLater(new FakeNode(1, nodeView));
            FakeMaster master = closeLater(new FakeMaster(List.of(node), file.toString()));
            KvPoolClient c = closeLater(master.client(1));
            List<String> keys = new ArrayList<>();
            List<MemorySegment> values = new ArrayList<>();
            List<byte[]> raw = new ArrayList<>();
            for (int i = 0; i < 12; i++) {
                keys.add("shm/" + i);
                raw.add(bytes((1 << 20) - i * 333, 50 + i));
                values.add(MemorySegment.ofArray(raw.get(i)));
            }
            assertThat(c.putBatch(keys, values)).containsOnly(PutStatus.OK);
            for (int i = 0; i < 12; i++) {
                assertStored(master, node, 0, keys.get(i), raw.get(i));
            }
            assertThat(node.frameItems).hasSizeGreaterThan(1);
            assertThat(node.framePayloads).containsOnly(0L); // NODE_SHM_WRITE_BEGIN carries no value bytes
            assertThat(node.badChecksums).isEmpty();
        }
    }
}
