package io.kvpool.connector;

import io.kvpool.connector.hash.BlockHasher;
import io.kvpool.connector.hash.KeyFormat;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

import java.lang.foreign.ValueLayout;
import java.time.Duration;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.junit.jupiter.api.Assertions.assertTimeoutPreemptively;

/**
 * {@link PoolConnector} on its own, over an in-memory store ({@link MemoryStore}): what the shared
 * contract scenarios ({@link ConnectorContractTest}) cannot say as data, the ordering of its
 * background loads and saves against the engine, resets and preemption. Orderings are forced with
 * gates in the store, and every wait has a deadline.
 */
class PoolConnectorTest {

    private static final int BS = 4;
    private static final KeyFormat KEYS = KeyFormat.of("unit-model", "v1", "f32");

    private final MemoryStore store = new MemoryStore();
    private final PoolConnector c = new PoolConnector(store, new BlockHasher(BS, "0"), KEYS,
            PoolConnector.ResetScope.ALL_FENCED);
    private final ConnectorContractTest.Blocks kv = new ConnectorContractTest.Blocks(BS);
    private final CountDownLatch release = new CountDownLatch(1);

    @AfterEach
    void close() {
        release.countDown();
        c.close();
        kv.close();
    }

    private static int[] tokens(int n, int salt) {
        int[] t = new int[n];
        for (int i = 0; i < n; i++) {
            t[i] = salt * 1000 + i;
        }
        return t;
    }

    /** One engine step that computes the request's tokens [from, to) into blocks 0.. of {@code table}. */
    private ConnectorMeta step(ConnectorRequest r, int[] table, int from, int to) {
        ConnectorMeta meta = c.buildConnectorMeta(List.of(new ScheduledRequest(r, table, from, to)));
        c.startLoadKv(meta, kv);
        c.waitForLayerLoad(0);
        for (int l = 0; l < kv.numLayers(); l++) {
            c.saveKvLayer(l, kv);
        }
        return meta;
    }

    /** Holds every put of {@code request}'s blocks until {@link #release}; counts down {@code entered} first. */
    private void holdPutsOf(String request, CountDownLatch entered, List<String> keys) {
        store.beforePut = k -> {
            if (k.stream().anyMatch(keys::contains)) {
                entered.countDown();
                await(release, "the test to release the put of " + request);
            }
        };
    }

    private static void await(CountDownLatch latch, String what) {
        try {
            assertThat(latch.await(30, TimeUnit.SECONDS)).as("waited for %s", what).isTrue();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new AssertionError(e);
        }
    }

    /** Waits (with a deadline) until {@code t} is parked: blocked inside the call under test. */
    private static void awaitParked(Thread t, String what) {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
        while (t.getState() != Thread.State.WAITING && t.getState() != Thread.State.TIMED_WAITING) {
            assertThat(System.nanoTime()).as("timed out waiting for %s", what).isLessThan(deadline);
            Thread.onSpinWait();
        }
    }

    /** Releases the gate once {@code caller} is parked in the call under test (or at the deadline, so nothing hangs). */
    private Thread releaseWhenParked(Thread caller, String what) {
        return Thread.ofPlatform().start(() -> {
            try {
                awaitParked(caller, what);
            } finally {
                release.countDown();
            }
        });
    }

    private List<String> keysOf(ConnectorRequest r) {
        return c.buildConnectorMeta(List.of(new ScheduledRequest(r, new int[]{30, 31}, 0, r.numTokens())))
                .saves().stream().map(ConnectorMeta.Save::key).toList();
    }

    /**
     * Steps whose saves queue up behind one that is running go to the pool together: one putBatch for
     * all of them, not one each (a save costs a round trip per batch, not per step).
     */
    @Test
    void savesQueuedBehindARunningOneGoInOnePutBatch() {
        ConnectorRequest a = new ConnectorRequest("a", tokens(8, 1));
        CountDownLatch entered = new CountDownLatch(1);
        holdPutsOf("a", entered, keysOf(a));
        AtomicInteger puts = new AtomicInteger();
        var hold = store.beforePut;
        store.beforePut = k -> {
            puts.incrementAndGet();
            hold.accept(k);
        };
        step(a, new int[]{0, 1}, 0, 8);
        await(entered, "a's save to reach the store");
        for (int r = 2; r <= 4; r++) {
            step(new ConnectorRequest("r" + r, tokens(8, r)), new int[]{2 * r, 2 * r + 1}, 0, 8);
        }
        release.countDown();
        c.waitForSave();
        assertThat(puts.get()).as("putBatch calls: a's, then the three queued behind it together").isEqualTo(2);
        for (int r = 1; r <= 4; r++) {
            for (String k : keysOf(new ConnectorRequest(r == 1 ? "a" : "r" + r, tokens(8, r)))) {
                assertThat(store.get(k)).as("saved %s", k).isNotNull();
            }
        }
        assertThat(c.stats().savedBlocks()).isEqualTo(8);
    }

    @Test
    void aFinishedRequestKeepsItsBlocksUntilItsSaveIsDone() {
        ConnectorRequest a = new ConnectorRequest("a", tokens(8, 1));
        CountDownLatch entered = new CountDownLatch(1);
        holdPutsOf("a", entered, keysOf(a));
        step(a, new int[]{0, 1}, 0, 8);
        await(entered, "a's save to reach the store");
        assertThat(c.savesInFlight()).isEqualTo(2);
        assertThat(c.requestFinished(a, new int[]{0, 1})).as("keep the blocks: a save reads them").isTrue();
        assertThat(c.getFinished(Set.of("a"))).isEmpty();
        release.countDown();
        c.waitForSave();
        assertThat(c.savesInFlight()).isZero();
        assertThat(c.getFinished(Set.of())).containsExactly("a");
        assertThat(c.getFinished(Set.of())).as("reported once").isEmpty();
        assertThat(c.requestFinished(new ConnectorRequest("idle", tokens(3, 2)), new int[]{5}))
                .as("nothing in flight: free the blocks at once").isFalse();
    }

    @Test
    void aSaveStartedBeforeAResetIsRemovedByItAndOneQueuedBehindItIsDropped() throws Exception {
        ConnectorRequest a = new ConnectorRequest("a", tokens(8, 1));
        ConnectorRequest b = new ConnectorRequest("b", tokens(8, 2));
        CountDownLatch entered = new CountDownLatch(1);
        holdPutsOf("a", entered, keysOf(a));
        step(a, new int[]{0, 1}, 0, 8);
        await(entered, "a's save to reach the store");
        AtomicReference<ResetResult> reset = new AtomicReference<>();
        Thread resetter = Thread.ofPlatform().start(() -> reset.set(c.resetCache()));
        awaitParked(resetter, "the reset to wait for the save in flight");
        step(b, new int[]{2, 3}, 0, 8); // planned before the reset returns: never lands after it
        release.countDown();
        resetter.join(TimeUnit.SECONDS.toMillis(30));
        assertThat(reset.get().success()).isTrue();
        assertThat(reset.get().removed()).as("a's blocks, stored before the reset ran").isEqualTo(2);
        c.waitForSave();
        assertThat(store.keys()).isEmpty();
        ConnectorStats s = c.stats();
        assertThat(s.savedBlocks()).isEqualTo(2);
        assertThat(s.droppedSaves()).isEqualTo(2);
        assertThat(s.resets()).isEqualTo(1);
    }

    @Test
    void waitForRequestSavesWaitsForTheNamedRequestsOnly() throws Exception {
        ConnectorRequest a = new ConnectorRequest("a", tokens(8, 1));
        List<String> aKeys = keysOf(a);
        CountDownLatch entered = new CountDownLatch(1);
        holdPutsOf("a", entered, aKeys);
        step(a, new int[]{0, 1}, 0, 8);
        await(entered, "a's save to reach the store");
        assertTimeoutPreemptively(Duration.ofSeconds(30), () -> c.waitForRequestSaves(Set.of("other")),
                "a request with no save in flight does not wait for another's");
        Thread releaser = releaseWhenParked(Thread.currentThread(), "waitForRequestSaves(a) to block");
        c.waitForRequestSaves(Set.of("a"));
        assertThat(store.keys()).as("a's save is done when the wait returns").containsExactlyInAnyOrderElementsOf(aKeys);
        releaser.join(TimeUnit.SECONDS.toMillis(30));
    }

    @Test
    void loadErrorsAreAskedForOnlyOnceTheStepsLoadIsOver() throws Exception {
        ConnectorRequest a = new ConnectorRequest("a", tokens(8, 1));
        step(a, new int[]{0, 1}, 0, 8);
        c.waitForSave();
        ConnectorRequest b = new ConnectorRequest("b", tokens(9, 1));
        assertThat(c.getNumNewMatchedTokens(b, 0).tokens()).isEqualTo(8);
        store.remove(keysOf(a).get(1)); // evicted between the lookup and the load
        c.updateStateAfterAlloc(b, new int[]{4, 5, 6}, 8);
        store.beforeGet = k -> await(release, "the test to release the load");
        c.startLoadKv(c.buildConnectorMeta(List.of()), kv);
        Thread releaser = releaseWhenParked(Thread.currentThread(), "blockIdsWithLoadErrors to wait for the load");
        assertThat(c.blockIdsWithLoadErrors()).as("the engine never waited for the layers: still told").containsExactly(5);
        releaser.join(TimeUnit.SECONDS.toMillis(30));
    }

    @Test
    void aStepsSavesStartOnceHoweverOftenTheLastLayerIsSignalled() {
        AtomicInteger puts = new AtomicInteger();
        store.beforePut = k -> puts.incrementAndGet();
        ConnectorRequest a = new ConnectorRequest("a", tokens(8, 1));
        step(a, new int[]{0, 1}, 0, 8);
        c.saveKvLayer(kv.numLayers() - 1, kv);
        c.waitForSave();
        assertThat(puts.get()).isEqualTo(1);
        assertThat(c.stats().savedBlocks()).isEqualTo(2);
        assertThat(c.stats().skippedSaves()).isZero();
    }

    @Test
    void aModelScopeResetRemovesThisModelsKeysOnly() {
        try (PoolConnector other = new PoolConnector(store, new BlockHasher(BS, "0"), KeyFormat.of("other-model", "v1", "f32"),
                PoolConnector.ResetScope.ALL_FENCED);
             PoolConnector mine = new PoolConnector(store, new BlockHasher(BS, "0"), KEYS, PoolConnector.ResetScope.MODEL)) {
            ConnectorRequest a = new ConnectorRequest("a", tokens(8, 1));
            for (PoolConnector p : List.of(other, mine)) {
                p.startLoadKv(p.buildConnectorMeta(List.of(new ScheduledRequest(a, new int[]{0, 1}, 0, 8))), kv);
                p.saveKvLayer(kv.numLayers() - 1, kv);
                p.waitForSave();
            }
            assertThat(store.keys()).hasSize(4);
            ResetResult r = mine.resetCache();
            assertThat(r.success()).isTrue();
            assertThat(r.removed()).isEqualTo(2);
            assertThat(store.keys()).allMatch(k -> k.startsWith(KeyFormat.modelPrefix("other-model")));
        }
    }

    @Test
    void aWeightSwitchWithoutReclaimLeavesTheOldVersionToEviction() throws Exception {
        ConnectorRequest a = new ConnectorRequest("a", tokens(8, 1));
        step(a, new int[]{0, 1}, 0, 8);
        c.waitForSave();
        assertThat(c.switchWeights("v2", false).get()).isZero();
        assertThat(store.keys()).hasSize(2).allMatch(k -> k.startsWith(KeyFormat.versionPrefix("unit-model", "v1")));
        assertThat(c.keys().weights()).isEqualTo("v2");
        assertThat(c.getNumNewMatchedTokens(new ConnectorRequest("a2", tokens(8, 1)), 0)).isEqualTo(Match.NONE);
        assertThat(c.switchWeights("v2", true).get()).as("the same version: nothing to reclaim").isZero();
    }

    @Test
    void misuseNamesTheRequest() {
        assertThatThrownBy(() -> c.getNumNewMatchedTokens(new ConnectorRequest("neg", tokens(8, 1)), -4))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("neg").hasMessageContaining("-4");
        assertThatThrownBy(() -> c.updateStateAfterAlloc(new ConnectorRequest("unasked", tokens(8, 1)), new int[]{0, 1}, 4))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("unasked")
                .hasMessageContaining("offered none");
        assertThatThrownBy(() -> new MultiConnector(List.of(c)).updateStateAfterAlloc(
                new ConnectorRequest("multi", tokens(8, 1)), new int[]{0, 1}, 4))
                .as("no child offered the tokens").isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("multi");
        ConnectorRequest r = new ConnectorRequest("past", tokens(8, 1));
        assertThatThrownBy(() -> new ScheduledRequest(r, new int[]{0, 1, 2}, 0, 9))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("past")
                .hasMessageContaining("9 tokens computed but only 8 known");
        assertThatThrownBy(() -> new PoolConnector((io.kvpool.client.KvPoolClient) null, new BlockHasher(BS, "0"), KEYS,
                PoolConnector.ResetScope.ALL_FENCED)).hasMessageContaining("client");
    }

    @ParameterizedTest
    @EnumSource(PoolConnector.Granularity.class)
    void loadsPastTheirDeadlineAreAbandonedNeverWriteTheBlocksAndThePoolComesBack(PoolConnector.Granularity g)
            throws Exception {
        MemoryStore s = new MemoryStore();
        CountDownLatch release = new CountDownLatch(1);
        try (ConnectorContractTest.Blocks blocks = new ConnectorContractTest.Blocks(BS)) {
            // a deadline no healthy in-memory call comes near, however loaded the machine
            PoolConnector p = new PoolConnector(s, new BlockHasher(BS, "0"), KEYS, PoolConnector.ResetScope.ALL_FENCED, g)
                    .loadDeadline(Duration.ofSeconds(2));
            AtomicLong now = new AtomicLong();
            p.useClock(now::get);
            try {
                for (long i = 0; i < blocks.blockBytes(); i++) {
                    blocks.block(0).set(ValueLayout.JAVA_BYTE, i, (byte) i);
                    blocks.block(1).set(ValueLayout.JAVA_BYTE, i, (byte) (i * 7));
                }
                ConnectorRequest a = new ConnectorRequest("a", tokens(8, 1));
                p.startLoadKv(p.buildConnectorMeta(List.of(new ScheduledRequest(a, new int[]{0, 1}, 0, 8))), blocks);
                for (int l = 0; l < blocks.numLayers(); l++) {
                    p.saveKvLayer(l, blocks);
                }
                p.waitForSave();

                // the pool holds every read: the step gives up at its deadline, the blocks are recomputed
                ConnectorRequest b = new ConnectorRequest("b", tokens(9, 1));
                assertThat(p.getNumNewMatchedTokens(b, 0).tokens()).isEqualTo(8);
                p.updateStateAfterAlloc(b, new int[]{4, 5, 6}, 8);
                blocks.block(4).fill((byte) 0x5A);
                blocks.block(5).fill((byte) 0x5A);
                s.beforeGet = k -> await(release, "the test to let the pool answer");
                p.startLoadKv(p.buildConnectorMeta(List.of()), blocks);
                for (int l = 0; l < blocks.numLayers(); l++) {
                    p.waitForLayerLoad(l); // returns at the deadline, never by the release (30 s away)
                }
                assertThat(p.blockIdsWithLoadErrors()).containsExactlyInAnyOrder(4, 5);
                assertThat(p.abandonedLoads()).isEqualTo(2);

                // the pool is left alone for a second: the next request recomputes at once, saves are skipped
                ConnectorRequest lone = new ConnectorRequest("lone", tokens(9, 1));
                assertThat(p.getNumNewMatchedTokens(lone, 0).tokens()).isZero();
                assertThat(p.skippedLookups()).isEqualTo(1);
                long skippedBefore = p.stats().skippedSaves();
                p.startLoadKv(p.buildConnectorMeta(List.of(new ScheduledRequest(
                        new ConnectorRequest("d", tokens(8, 2)), new int[]{6, 7}, 0, 8))), blocks);
                for (int l = 0; l < blocks.numLayers(); l++) {
                    p.saveKvLayer(l, blocks);
                }
                p.waitForSave();
                assertThat(p.stats().skippedSaves() - skippedBefore).isEqualTo(2);

                // the pool answers again; a second later a request starts a probe (a read of an abandoned block),
                // off its path: once that answers, the pool is in use again, the loads land, the abandoned ones never do
                s.beforeGet = k -> { };
                release.countDown();
                now.addAndGet(PoolBreaker.FIRST_BACKOFF_NANOS);
                assertThat(p.getNumNewMatchedTokens(new ConnectorRequest("probe", tokens(9, 1)), 0).tokens()).isZero();
                long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
                while (p.getNumNewMatchedTokens(new ConnectorRequest("wait", tokens(9, 1)), 0).tokens() == 0) {
                    assertThat(System.nanoTime()).as("the probe answered").isLessThan(until);
                    Thread.sleep(1);
                }
                p.requestFinished(new ConnectorRequest("wait", tokens(9, 1)), new int[0]);
                ConnectorRequest c2 = new ConnectorRequest("c", tokens(9, 1));
                assertThat(p.getNumNewMatchedTokens(c2, 0).tokens()).isEqualTo(8);
                p.updateStateAfterAlloc(c2, new int[]{2, 3, 7}, 8);
                p.startLoadKv(p.buildConnectorMeta(List.of()), blocks);
                for (int l = 0; l < blocks.numLayers(); l++) {
                    p.waitForLayerLoad(l);
                }
                assertThat(p.blockIdsWithLoadErrors()).isEmpty();
                assertThat(blocks.block(2).mismatch(blocks.block(0))).isEqualTo(-1);
                assertThat(blocks.block(3).mismatch(blocks.block(1))).isEqualTo(-1);
                assertThat(p.getNumNewMatchedTokens(new ConnectorRequest("e", tokens(9, 1)), 0).tokens()).isEqualTo(8);
            } finally {
                release.countDown();
                p.close(); // waits for the abandoned load's thread too
            }
            for (int id : new int[]{4, 5}) {
                for (long i = 0; i < blocks.blockBytes(); i++) {
                    assertThat(blocks.block(id).get(ValueLayout.JAVA_BYTE, i)).as("block %d byte %d", id, i)
                            .isEqualTo((byte) 0x5A);
                }
            }
        }
    }
}
