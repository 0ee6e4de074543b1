package io.kvpool.connector;

import io.kvpool.connector.hash.BlockHasher;
import io.kvpool.connector.hash.KeyFormat;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.List;
import java.util.SplittableRandom;

import static org.assertj.core.api.Assertions.assertThat;

/** Native offload: CPU slots, LRU spill to disk slots, loads back byte-exact, resets. */
class LocalOffloadConnectorTest {

    private static final int BS = 4;
    private static final long BLOCK = 4096;

    static final class Blocks implements PagedKv, AutoCloseable {
        final Arena arena = Arena.ofShared();
        final MemorySegment all = arena.allocate(BLOCK * 64, 64);

        public int blockSize() {
            return BS;
        }

        public int numLayers() {
            return 2;
        }

        public long blockBytes() {
            return BLOCK;
        }

        public MemorySegment block(int id) {
            return all.asSlice(id * BLOCK, BLOCK);
        }

        void fill(int id, long tag) {
            SplittableRandom r = new SplittableRandom(tag);
            for (long o = 0; o < BLOCK; o += 8) {
                block(id).set(ValueLayout.JAVA_LONG_UNALIGNED, o, r.nextLong());
            }
        }

        boolean holds(int id, long tag) {
            SplittableRandom r = new SplittableRandom(tag);
            for (long o = 0; o < BLOCK; o += 8) {
                if (block(id).get(ValueLayout.JAVA_LONG_UNALIGNED, o) != r.nextLong()) {
                    return false;
                }
            }
            return true;
        }

        public void close() {
            arena.close();
        }
    }

    private static int[] tokens(int n, int salt) {
        int[] t = new int[n];
        for (int i = 0; i < n; i++) {
            t[i] = i * 7 + salt;
        }
        return t;
    }

    /** Saves the request's full blocks (block b of request r holds tag r*100+b). */
    private static void save(KvConnector c, Blocks kv, int r, int blocks) {
        ConnectorRequest req = new ConnectorRequest("s" + r, tokens(blocks * BS, r));
        int[] table = new int[blocks];
        for (int b = 0; b < blocks; b++) {
            table[b] = b;
            kv.fill(b, r * 100L + b);
        }
        c.startLoadKv(c.buildConnectorMeta(List.of(new ScheduledRequest(req, table, 0, blocks * BS))), kv);
        c.saveKvLayer(0, kv);
        c.saveKvLayer(1, kv);
        c.requestFinished(req, table);
    }

    /** Looks up and loads request r into blocks 32..; returns the tokens loaded (0 on any error). */
    private static int load(KvConnector c, Blocks kv, int r, int blocks) {
        ConnectorRequest req = new ConnectorRequest("l" + r, tokens(blocks * BS, r));
        Match m = c.getNumNewMatchedTokens(req, 0);
        int[] table = new int[blocks];
        for (int b = 0; b < blocks; b++) {
            table[b] = 32 + b;
        }
        c.updateStateAfterAlloc(req, table, m.tokens());
        c.startLoadKv(c.buildConnectorMeta(List.of()), kv);
        c.waitForLayerLoad(0);
        if (!c.blockIdsWithLoadErrors().isEmpty()) {
            return -1;
        }
        for (int b = 0; b < m.tokens() / BS; b++) {
            assertThat(kv.holds(32 + b, r * 100L + b)).as("request %d block %d", r, b).isTrue();
        }
        return m.tokens();
    }

    @Test
    void blocksSpillFromCpuToDiskAndComeBackExactly(@TempDir Path dir) throws Exception {
        try (LocalOffloadConnector c = new LocalOffloadConnector(new BlockHasher(BS, "0"), KeyFormat.of("m", "v1", "f32"),
                BLOCK, 4 * BLOCK, dir, 8 * BLOCK); Blocks kv = new Blocks()) {
            for (int r = 1; r <= 3; r++) {
                save(c, kv, r, 4); // 12 blocks into 4 CPU + 8 disk slots
            }
            assertThat(c.held()).containsExactly(4, 8);
            for (int r = 1; r <= 3; r++) {
                assertThat(load(c, kv, r, 4)).as("request %d", r).isEqualTo(16);
            }
            save(c, kv, 4, 4); // the least recently used blocks leave for good
            assertThat(c.held()[0] + c.held()[1]).isEqualTo(12);
            assertThat(c.stats().savedBlocks()).isEqualTo(16);
        }
    }

    @Test
    void aCorruptDiskSlotIsALoadErrorNotBytes(@TempDir Path dir) throws Exception {
        try (LocalOffloadConnector c = new LocalOffloadConnector(new BlockHasher(BS, "0"), KeyFormat.of("m", "v1", "f32"),
                BLOCK, BLOCK, dir, 4 * BLOCK); Blocks kv = new Blocks()) {
            save(c, kv, 1, 2); // block 0 goes to disk slot 0
            try (FileChannel f = FileChannel.open(dir.resolve("kvpool-native-offload.slots"), StandardOpenOption.WRITE)) {
                f.write(ByteBuffer.wrap(new byte[]{42, 42, 42}), 100);
            }
            assertThat(load(c, kv, 1, 2)).isEqualTo(-1);
            assertThat(c.stats().failedLoads()).isPositive();
        }
    }

    @Test
    void resetsAndWeightSwitchesLeaveNothingAndVoidPlannedLoads() throws Exception {
        try (LocalOffloadConnector c = new LocalOffloadConnector(new BlockHasher(BS, "0"), KeyFormat.of("m", "v1", "f32"),
                BLOCK, 8 * BLOCK, null, 0); Blocks kv = new Blocks()) {
            save(c, kv, 1, 2);
            ConnectorRequest req = new ConnectorRequest("x", tokens(8, 1));
            assertThat(c.getNumNewMatchedTokens(req, 0).tokens()).isEqualTo(8);
            c.updateStateAfterAlloc(req, new int[]{40, 41}, 8);
            ConnectorMeta planned = c.buildConnectorMeta(List.of());
            assertThat(c.resetCache().removed()).isEqualTo(2);
            c.startLoadKv(planned, kv);
            assertThat(c.blockIdsWithLoadErrors()).containsExactlyInAnyOrder(40, 41);
            save(c, kv, 2, 2);
            assertThat(c.switchWeights("v2", true).get()).isEqualTo(2);
            assertThat(c.getNumNewMatchedTokens(new ConnectorRequest("y", tokens(8, 2)), 0)).isEqualTo(Match.NONE);
        }
    }
}
