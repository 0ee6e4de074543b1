package io.kvpool.it;

import io.kvpool.client.KvPoolClient;
import io.kvpool.config.Size;
import io.kvpool.connector.ConnectorMeta;
import io.kvpool.connector.ConnectorRequest;
import io.kvpool.connector.KvConnector;
import io.kvpool.connector.Match;
import io.kvpool.connector.MultiConnector;
import io.kvpool.connector.PagedKv;
import io.kvpool.connector.PoolConnector;
import io.kvpool.connector.ResetResult;
import io.kvpool.connector.ScheduledRequest;
import io.kvpool.connector.hash.BlockHasher;
import io.kvpool.connector.hash.KeyFormat;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.List;
import java.util.Set;
import java.util.SplittableRandom;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * The pool connector against a real pool, driven the way an engine drives it: save blocks, find
 * them, load them byte-exact; resets and weight switches that leave nothing stale; MultiConnector.
 */
class ConnectorIT {

    private static final int BS = 4;
    private static final int LAYERS = 3;
    private static final long BLOCK_BYTES = 6 * 1024;

    /** An engine's block memory: numbered blocks in one shared arena. */
    static final class Blocks implements PagedKv, AutoCloseable {
        final Arena arena = Arena.ofShared();
        final MemorySegment all;
        final int count;

        Blocks(int count) {
            this.count = count;
            this.all = arena.allocate(BLOCK_BYTES * count, 64);
        }

        @Override
        public int blockSize() {
            return BS;
        }

        @Override
        public int numLayers() {
            return LAYERS;
        }

        @Override
        public long blockBytes() {
            return BLOCK_BYTES;
        }

        @Override
        public MemorySegment block(int id) {
            return all.asSlice(id * BLOCK_BYTES, BLOCK_BYTES);
        }

        /** Fills a block with bytes derived from (tag, index): what "computing" it means here. */
        void compute(int id, long tag, int index) {
            SplittableRandom r = new SplittableRandom(tag * 1_000_003 + index);
            MemorySegment b = block(id);
            for (long o = 0; o < BLOCK_BYTES; o += 8) {
                b.set(ValueLayout.JAVA_LONG_UNALIGNED, o, r.nextLong());
            }
        }

        boolean holds(int id, long tag, int index) {
            try (Blocks ref = new Blocks(1)) {
                ref.compute(0, tag, index);
                return ref.block(0).mismatch(block(id)) == -1;
            }
        }

        @Override
        public void close() {
            arena.close();
        }
    }

    private InProcessCluster cluster;
    private KvPoolClient client;

    @BeforeEach
    void start() throws Exception {
        cluster = new InProcessCluster(1, Size.ofMiB(64));
        client = cluster.client();
    }

    @AfterEach
    void stop() {
        client.close();
        cluster.close();
    }

    private static PoolConnector connector(KvPoolClient c, String weights) {
        return new PoolConnector(c, new BlockHasher(BS, "0"), KeyFormat.of("test-model", weights, "f32"),
                PoolConnector.ResetScope.ALL_FENCED);
    }

    private static int[] tokens(int n, int salt) {
        int[] t = new int[n];
        for (int i = 0; i < n; i++) {
            t[i] = (i * 31 + salt) % 1000;
        }
        return t;
    }

    /** One engine step that computes tokens [from, to) of the request in blocks 0.. and saves what filled. */
    private static void computeAndSave(KvConnector c, Blocks kv, ConnectorRequest r, int[] table, int from, int to, long tag) {
        ConnectorMeta meta = c.buildConnectorMeta(List.of(new ScheduledRequest(r, table, from, to)));
        c.startLoadKv(meta, kv);
        for (int l = 0; l < LAYERS; l++) {
            c.waitForLayerLoad(l);
            if (l == 0) {
                for (int b = from / BS; b < (to + BS - 1) / BS; b++) {
                    kv.compute(table[b], tag, b);
                }
            }
            c.saveKvLayer(l, kv);
        }
    }

    @Test
    void savedBlocksAreFoundAndLoadedBackExactly() {
        try (PoolConnector a = connector(client, "w1"); PoolConnector b = connector(client, "w1");
             Blocks kvA = new Blocks(16); Blocks kvB = new Blocks(16)) {
            ConnectorRequest r = new ConnectorRequest("r1", tokens(22, 7)); // 5 full blocks and 2 tokens
            int[] table = {3, 1, 4, 0, 5, 9};
            assertThat(a.getNumNewMatchedTokens(r, 0)).isEqualTo(Match.NONE);
            a.updateStateAfterAlloc(r, table, 0);
            computeAndSave(a, kvA, r, table, 0, 22, 42);
            a.requestFinished(r, table);
            a.waitForSave();
            assertThat(a.stats().savedBlocks()).isEqualTo(5); // the partial last block is never saved

            // another engine, same model and weights: the same prompt extended by a turn
            int[] longer = tokens(30, 7);
            ConnectorRequest r2 = new ConnectorRequest("r2", longer);
            Match m = b.getNumNewMatchedTokens(r2, 0);
            assertThat(m.tokens()).isEqualTo(20);
            assertThat(b.getNumNewMatchedTokens(r2, 0)).as("a probe: asking again changes nothing").isEqualTo(m);
            assertThat(b.getNumNewMatchedTokens(r2, 8).tokens()).as("with 2 blocks local").isEqualTo(12);
            assertThat(b.getNumNewMatchedTokens(r2, 10).tokens()).as("mid-block").isEqualTo(10);
            assertThat(b.buildConnectorMeta(List.of()).loads()).as("no loads planned by lookups alone").isEmpty();

            assertThat(b.getNumNewMatchedTokens(r2, 0).tokens()).isEqualTo(20);
            int[] table2 = {7, 2, 8, 6, 10, 11, 12, 13};
            b.updateStateAfterAlloc(r2, table2, 20);
            ConnectorMeta meta = b.buildConnectorMeta(List.of(new ScheduledRequest(r2, table2, 20, 30)));
            assertThat(meta.loads()).hasSize(5);
            assertThat(meta.saves()).extracting(ConnectorMeta.Save::blockIndex).containsExactly(5, 6);
            b.startLoadKv(meta, kvB);
            b.waitForLayerLoad(0);
            assertThat(b.blockIdsWithLoadErrors()).isEmpty();
            for (int i = 0; i < 5; i++) {
                assertThat(kvB.holds(table2[i], 42, i)).as("block %d", i).isTrue();
            }
            assertThat(b.stats().loadedBytes()).isEqualTo(5 * BLOCK_BYTES);
        }
    }

    @Test
    void extraKeysAndWeightVersionsSeparateTheSameTokens() {
        try (PoolConnector a = connector(client, "w1"); Blocks kv = new Blocks(8)) {
            ConnectorRequest r = new ConnectorRequest("r", tokens(8, 1));
            computeAndSave(a, kv, r, new int[]{0, 1}, 0, 8, 1);
            a.waitForSave();
            assertThat(a.getNumNewMatchedTokens(new ConnectorRequest("x", tokens(8, 1)), 0).tokens()).isEqualTo(8);
            assertThat(a.getNumNewMatchedTokens(new ConnectorRequest("y", tokens(8, 1), 8, List.of("salt")), 0))
                    .isEqualTo(Match.NONE);
            try (PoolConnector w2 = connector(client, "w2")) {
                assertThat(w2.getNumNewMatchedTokens(new ConnectorRequest("z", tokens(8, 1)), 0)).isEqualTo(Match.NONE);
            }
        }
    }

    @Test
    void aResetDropsEverythingAndEveryPlanMadeBeforeIt() {
        try (PoolConnector a = connector(client, "w1"); Blocks kv = new Blocks(16)) {
            ConnectorRequest r = new ConnectorRequest("r", tokens(16, 3));
            int[] table = {0, 1, 2, 3};
            computeAndSave(a, kv, r, table, 0, 16, 5);
            a.waitForSave();
            ConnectorRequest again = new ConnectorRequest("again", tokens(16, 3));
            assertThat(a.getNumNewMatchedTokens(again, 0).tokens()).isEqualTo(16);
            a.updateStateAfterAlloc(again, new int[]{4, 5, 6, 7}, 16);
            ConnectorMeta plannedLoad = a.buildConnectorMeta(List.of());

            // a save planned with old weights, not yet started
            ConnectorRequest fresh = new ConnectorRequest("fresh", tokens(8, 99));
            ConnectorMeta plannedSave = a.buildConnectorMeta(List.of(new ScheduledRequest(fresh, new int[]{8, 9}, 0, 8)));
            assertThat(plannedSave.saves()).hasSize(2);

            ResetResult rr = a.resetCache();
            assertThat(rr.success()).isTrue();
            assertThat(rr.removed()).isEqualTo(4);
            assertThat(client.stats().keys()).isZero();

            a.startLoadKv(plannedLoad, kv); // planned before the reset: must not load old KV
            a.waitForLayerLoad(0);
            assertThat(a.blockIdsWithLoadErrors()).containsExactlyInAnyOrder(4, 5, 6, 7);

            a.startLoadKv(plannedSave, kv);
            for (int l = 0; l < LAYERS; l++) {
                a.saveKvLayer(l, kv);
            }
            a.waitForSave();
            assertThat(client.stats().keys()).as("the old save never lands").isZero();
            assertThat(a.stats().droppedSaves()).isEqualTo(2);
            assertThat(a.getNumNewMatchedTokens(new ConnectorRequest("after", tokens(16, 3)), 0)).isEqualTo(Match.NONE);
        }
    }

    @Test
    void switchingWeightsHidesTheOldVersionAndReclaimsIt() throws Exception {
        try (PoolConnector a = connector(client, "v1"); Blocks kv = new Blocks(16)) {
            computeAndSave(a, kv, new ConnectorRequest("r", tokens(12, 4)), new int[]{0, 1, 2}, 0, 12, 9);
            a.waitForSave();
            assertThat(client.stats().keys()).isEqualTo(3);
            long reclaimed = a.switchWeights("v2", true).get();
            assertThat(reclaimed).isEqualTo(3);
            assertThat(a.keys().weights()).isEqualTo("v2");
            assertThat(a.getNumNewMatchedTokens(new ConnectorRequest("r", tokens(12, 4)), 0)).isEqualTo(Match.NONE);
            computeAndSave(a, kv, new ConnectorRequest("r", tokens(12, 4)), new int[]{0, 1, 2}, 0, 12, 10);
            a.waitForSave();
            assertThat(a.getNumNewMatchedTokens(new ConnectorRequest("q", tokens(12, 4)), 0).tokens()).isEqualTo(12);
        }
    }

    @Test
    void finishedRequestsKeepTheirBlocksUntilTheirSavesAreDone() {
        try (PoolConnector a = connector(client, "w1"); Blocks kv = new Blocks(8)) {
            ConnectorRequest r = new ConnectorRequest("r", tokens(8, 2));
            computeAndSave(a, kv, r, new int[]{0, 1}, 0, 8, 3);
            boolean keep = a.requestFinished(r, new int[]{0, 1});
            a.waitForSave();
            Set<String> done = a.getFinished(Set.of("r"));
            if (keep) {
                assertThat(done).containsExactly("r");
            } else {
                assertThat(done).isEmpty(); // the save finished before the request did
            }
            assertThat(a.getFinished(Set.of())).isEmpty();
            assertThat(a.requestFinished(new ConnectorRequest("idle", tokens(3, 0)), new int[]{2})).isFalse();
        }
    }

    @Test
    void multiConnectorLoadsFromTheFirstThatHasTheTokensAndSavesToAll() throws Exception {
        try (InProcessCluster other = new InProcessCluster(1, Size.ofMiB(64)); KvPoolClient oc = other.client();
             PoolConnector first = connector(client, "w"); PoolConnector second = connector(oc, "w");
             MultiConnector multi = new MultiConnector(List.of(first, second)); Blocks kv = new Blocks(16)) {
            ConnectorRequest r = new ConnectorRequest("r", tokens(8, 6));
            computeAndSave(multi, kv, r, new int[]{0, 1}, 0, 8, 11);
            multi.waitForSave();
            assertThat(client.stats().keys()).isEqualTo(2);
            assertThat(oc.stats().keys()).isEqualTo(2);

            client.removeAll(true); // only the second child has them now
            ConnectorRequest r2 = new ConnectorRequest("r2", tokens(8, 6));
            assertThat(multi.getNumNewMatchedTokens(r2, 0).tokens()).isEqualTo(8);
            multi.updateStateAfterAlloc(r2, new int[]{2, 3}, 8);
            ConnectorMeta meta = multi.buildConnectorMeta(List.of());
            assertThat(meta.children().get(0).loads()).isEmpty();
            assertThat(meta.children().get(1).loads()).hasSize(2);
            multi.startLoadKv(meta, kv);
            multi.waitForLayerLoad(0);
            assertThat(multi.blockIdsWithLoadErrors()).isEmpty();
            assertThat(kv.holds(2, 11, 0) && kv.holds(3, 11, 1)).isTrue();

            assertThat(multi.resetCache().success()).isTrue();
            assertThat(oc.stats().keys()).isZero();
            assertThatThrownBy(() -> multi.startLoadKv(ConnectorMeta.EMPTY, kv)).hasMessageContaining("children");
        }
    }
}
