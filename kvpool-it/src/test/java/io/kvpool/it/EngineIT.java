package io.kvpool.it;

import io.kvpool.client.KvPoolClient;
import io.kvpool.config.Size;
import io.kvpool.connector.LoadFailurePolicy;
import io.kvpool.connector.PoolConnector;
import io.kvpool.connector.hash.BlockHasher;
import io.kvpool.connector.hash.KeyFormat;
import io.kvpool.engine.Completion;
import io.kvpool.engine.Engine;
import io.kvpool.engine.EngineConfig;
import io.kvpool.engine.SamplingParams;
import io.kvpool.engine.llama.ModelConfig;
import io.kvpool.engine.llama.Weights;
import io.kvpool.node.StorageNode;
import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicBoolean;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The reference engine with the pool: outputs with KV loaded from the pool are bit-identical to a
 * full recompute; weight updates never let a request use KV from other weights (both remedies);
 * failed loads are recomputed or fail the request cleanly.
 */
class EngineIT {

    private static final ModelConfig MODEL = ModelConfig.tiny();
    private static final int BS = 4;

    private static EngineConfig engineConfig(int blocks) {
        return EngineConfig.defaults().withNumBlocks(blocks).withMaxStepTokens(64).withMaxRunning(4)
                .withModelName("tiny");
    }

    private static EngineConfig withBlockSize(EngineConfig c) {
        return new EngineConfig(BS, c.numBlocks(), c.maxRunning(), c.maxStepTokens(), c.loadFailure(), c.hashSeed(),
                c.modelName(), c.versionedKeys());
    }

    /** How the connectors of these tests move KV; {@link EngineLayerwiseIT} runs every test layer by layer. */
    PoolConnector.Granularity granularity() {
        return PoolConnector.Granularity.BLOCK;
    }

    private PoolConnector connector(KvPoolClient c, String weights, PoolConnector.ResetScope scope) {
        return new PoolConnector(c, new BlockHasher(BS, "0"), KeyFormat.of("tiny", weights, "f32"), scope,
                granularity());
    }

    /** A fresh engine with no external cache and a cache too small to keep anything between requests. */
    private static Engine reference(long seed) {
        return new Engine(withBlockSize(engineConfig(64)), MODEL, Weights.random(MODEL, seed), "w" + seed, null);
    }

    private static int[] prompt(int length, int family) {
        SplittableRandom r = new SplittableRandom(family);
        int[] t = new int[length];
        for (int i = 0; i < length; i++) {
            t[i] = r.nextInt(256);
        }
        return t;
    }

    private static void assertSameOutput(Completion got, Completion want, String what) {
        assertThat(got.error()).as(what).isNull();
        assertThat(got.outputTokens()).as(what + ": tokens").isEqualTo(want.outputTokens());
        assertThat(got.logitsDigest()).as(what + ": every logit, bit for bit").isEqualTo(want.logitsDigest());
        int[] a = new int[got.firstLogits().length];
        int[] b = new int[want.firstLogits().length];
        for (int i = 0; i < a.length; i++) {
            a[i] = Float.floatToRawIntBits(got.firstLogits()[i]);
            b[i] = Float.floatToRawIntBits(want.firstLogits()[i]);
        }
        assertThat(a).as(what + ": first logits").isEqualTo(b);
    }

    @Test
    void kvLoadedFromThePoolGivesBitIdenticalOutputs() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(64)); KvPoolClient c = cluster.client();
             Engine ref = reference(1)) {
            // the family's longest prompt, saved by a first engine
            int[] longest = prompt(70, 5);
            try (Engine writer = new Engine(withBlockSize(engineConfig(64)), MODEL, Weights.random(MODEL, 1), "w1",
                    connector(c, "w1", PoolConnector.ResetScope.ALL_FENCED))) {
                assertThat(writer.generate(longest, SamplingParams.greedy(6), null).get().ok()).isTrue();
                writer.connector().waitForSave();
                assertThat(writer.connector().stats().savedBlocks()).as("blocks saved").isGreaterThanOrEqualTo(70 / BS);
                assertThat(writer.connector().stats().droppedSaves()).as("saves dropped").isZero();
            }
            // prefixes of many lengths (partial last blocks, exact blocks, the whole saved prompt) on a
            // second engine whose own cache is empty
            int[] lengths = {1, 3, 4, 5, 8, 15, 16, 17, 31, 32, 33, 48, 63, 64, 68, 69, 70};
            for (int len : lengths) {
                try (Engine reader = new Engine(withBlockSize(engineConfig(64)), MODEL, Weights.random(MODEL, 1), "w1",
                        connector(c, "w1", PoolConnector.ResetScope.ALL_FENCED))) {
                    int[] p = Arrays.copyOf(longest, len);
                    Completion got = reader.generate(p, SamplingParams.greedy(5), null).get();
                    Completion want = ref.generate(p, SamplingParams.greedy(5), null).get();
                    assertThat(want.externalHitTokens()).isZero();
                    int expectHit = Math.min((len - 1) / BS, 70 / BS) * BS;
                    assertThat(got.externalHitTokens()).as("loaded tokens of a %d-token prompt", len).isEqualTo(expectHit);
                    // loaded, not recomputed after a failed load (which would give the same output)
                    assertThat(reader.connector().stats().failedLoads()).as("failed loads").isZero();
                    assertThat(reader.connector().stats().loadedBlocks()).as("blocks loaded").isEqualTo(expectHit / BS);
                    assertSameOutput(got, want, len + " tokens");
                }
            }
        }
    }

    @Test
    void aCacheSaltSharesNoKvWithUnsaltedRequestsAndGivesTheSameOutput() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(64)); KvPoolClient c = cluster.client();
             Engine e = new Engine(withBlockSize(engineConfig(64)), MODEL, Weights.random(MODEL, 1), "w1",
                     connector(c, "w1", PoolConnector.ResetScope.ALL_FENCED))) {
            int[] p = prompt(41, 9); // 10 full blocks and a token
            Completion plain = e.generate(p, SamplingParams.greedy(6), null).get();
            e.connector().waitForSave();
            assertThat(e.generate(p, SamplingParams.greedy(6), null).get().localHitTokens())
                    .as("unsalted again: the local prefix cache has it").isEqualTo(40);

            Completion salted = e.generate(p, SamplingParams.greedy(6), "salt-a", null).get();
            assertThat(salted.localHitTokens()).as("salted: nothing from the local prefix cache").isZero();
            assertThat(salted.externalHitTokens()).as("salted: nothing from the pool").isZero();
            assertSameOutput(salted, plain, "salted recompute");
            e.connector().waitForSave();

            Completion again = e.generate(p, SamplingParams.greedy(6), "salt-a", null).get();
            assertThat(again.localHitTokens()).as("the same salt shares its own KV").isEqualTo(40);
            assertSameOutput(again, plain, "salted, from the cache");
            try (Engine other = new Engine(withBlockSize(engineConfig(64)), MODEL, Weights.random(MODEL, 1), "w1",
                    connector(c, "w1", PoolConnector.ResetScope.ALL_FENCED))) {
                Completion viaPool = other.generate(p, SamplingParams.greedy(6), "salt-a", null).get();
                assertThat(viaPool.externalHitTokens()).as("the salted blocks, from the pool").isEqualTo(40);
                assertSameOutput(viaPool, plain, "salted, from the pool");
                assertThat(other.generate(p, SamplingParams.greedy(6), "salt-b", null).get().externalHitTokens())
                        .as("another salt").isZero();
            }
        }
    }

    private void weightUpdatesNeverServeStaleKv(boolean versioned) throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(64)); KvPoolClient c = cluster.client()) {
            PoolConnector pc = connector(c, "v0", PoolConnector.ResetScope.ALL_FENCED);
            EngineConfig cfg = withBlockSize(engineConfig(48)).withVersionedKeys(versioned);
            try (Engine e = new Engine(cfg, MODEL, Weights.random(MODEL, 100), "v0", pc)) {
                ConcurrentLinkedQueue<Completion> done = new ConcurrentLinkedQueue<>();
                AtomicBoolean stop = new AtomicBoolean();
                List<CompletableFuture<Void>> clients = new ArrayList<>();
                for (int k = 0; k < 3; k++) {
                    int client = k;
                    clients.add(CompletableFuture.runAsync(() -> {
                        SplittableRandom r = new SplittableRandom(client);
                        while (!stop.get()) {
                            int[] p = prompt(8 + r.nextInt(40), r.nextInt(3)); // shared prefixes: many hits
                            try {
                                done.add(e.generate(p, SamplingParams.greedy(3), null).get());
                            } catch (Exception ex) {
                                throw new IllegalStateException(ex);
                            }
                        }
                    }));
                }
                for (int v = 1; v <= 8; v++) {
                    awaitServedUnder(done, "v" + (v - 1));
                    e.pauseGeneration(false, true).get();
                    long seed = 100 + v;
                    e.updateWeights(() -> Weights.random(MODEL, seed), "v" + v);
                    if (!versioned) {
                        assertThat(e.resetPrefixCache(true).success()).isTrue();
                    }
                    e.resume();
                }
                awaitServedUnder(done, "v8");
                Await.until("a completion with a cache hit", () -> done.stream()
                        .anyMatch(got -> got.ok() && got.externalHitTokens() + got.localHitTokens() > 0));
                stop.set(true);
                CompletableFuture.allOf(clients.toArray(CompletableFuture[]::new)).get();

                Map<String, Engine> refs = new HashMap<>();
                int checked = 0;
                long hits = 0;
                try {
                    for (Completion got : done) {
                        if (!got.ok()) {
                            continue; // aborted by an update
                        }
                        long seed = 100 + Long.parseLong(got.weightsVersion().substring(1));
                        Engine ref = refs.computeIfAbsent(got.weightsVersion(), x -> reference(seed));
                        Completion want = ref.generate(got.promptTokens(), SamplingParams.greedy(3), null).get();
                        assertSameOutput(got, want, got.requestId() + " under " + got.weightsVersion());
                        checked++;
                        hits += got.externalHitTokens() + got.localHitTokens();
                    }
                } finally {
                    refs.values().forEach(Engine::close);
                }
                assertThat(checked).as("requests checked").isGreaterThan(30);
                assertThat(hits).as("cache hits happened, so the check means something").isPositive();
                assertThat(e.metrics().weightUpdates()).isGreaterThanOrEqualTo(8);
            }
        }
    }

    /** Waits until a few requests completed under weights {@code version}, so each version's KV is exercised. */
    private static void awaitServedUnder(Collection<Completion> done, String version) throws InterruptedException {
        Await.until("4 requests completed under weights " + version, () -> done.stream()
                .filter(got -> got.ok() && got.weightsVersion().equals(version)).count() >= 4);
    }

    @Test
    void weightUpdatesWithHardResetNeverServeStaleKv() throws Exception {
        weightUpdatesNeverServeStaleKv(false);
    }

    @Test
    void weightUpdatesWithVersionedKeysNeverServeStaleKv() throws Exception {
        weightUpdatesNeverServeStaleKv(true);
    }

    /**
     * A hard-reset engine's keys name the weights it runs after an update: an engine started later
     * under the first version's name (a restart, the next job on the same pool) finds none of the
     * updated weights' KV. Before the fix the keys kept the start-up name, and that engine loaded KV
     * of other weights as its own (found by the RL soak: its versioned run, started on the pool the
     * reset run had used, served stale outputs from its first step).
     */
    @Test
    void afterAHardResetUpdateKeysNameTheNewWeights() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(64)); KvPoolClient c = cluster.client();
             Engine ref = reference(100)) {
            int[] p = prompt(41, 3);
            try (Engine trained = new Engine(withBlockSize(engineConfig(64)), MODEL, Weights.random(MODEL, 100), "v1",
                    connector(c, "v1", PoolConnector.ResetScope.ALL_FENCED))) {
                trained.pauseGeneration(false, true).get();
                trained.updateWeights(() -> Weights.random(MODEL, 200), "v2");
                assertThat(trained.resetPrefixCache(true).success()).isTrue();
                trained.resume();
                assertThat(trained.generate(p, SamplingParams.greedy(4), null).get().ok()).isTrue();
                trained.connector().waitForSave(); // the pool now holds KV of the v2 weights
            }
            try (Engine fresh = new Engine(withBlockSize(engineConfig(64)), MODEL, Weights.random(MODEL, 100), "v1",
                    connector(c, "v1", PoolConnector.ResetScope.ALL_FENCED))) {
                Completion got = fresh.generate(p, SamplingParams.greedy(4), null).get();
                assertThat(got.externalHitTokens()).as("KV of the v2 weights found under the name v1").isZero();
                assertSameOutput(got, ref.generate(p, SamplingParams.greedy(4), null).get(), "v1 weights");
            }
        }
    }

    private void loadFailure(LoadFailurePolicy policy) throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(2, Size.ofMiB(32)); KvPoolClient c = cluster.client();
             Engine ref = reference(3)) {
            List<int[]> prompts = new ArrayList<>();
            for (int i = 0; i < 8; i++) {
                prompts.add(prompt(40, 50 + i));
            }
            // half the prompts stored on each node (the client prefers the node named), so that killing
            // one node fails some requests' loads and not others'
            for (int half = 0; half < 2; half++) {
                String node = cluster.nodes.get(half).name();
                try (KvPoolClient wc = cluster.client(cfg -> cfg.withPreferredSegment(node));
                     Engine writer = new Engine(withBlockSize(engineConfig(64)), MODEL, Weights.random(MODEL, 3), "w",
                             connector(wc, "w", PoolConnector.ResetScope.ALL_FENCED))) {
                    for (int i = half * 4; i < half * 4 + 4; i++) {
                        writer.generate(prompts.get(i), SamplingParams.greedy(2), null).get();
                    }
                    writer.connector().waitForSave();
                }
            }
            StorageNode victim = cluster.nodes.get(1);
            victim.close(); // the master still lists its objects until the node's TTL: loads from it fail
            try (Engine reader = new Engine(withBlockSize(engineConfig(64)).withLoadFailure(policy), MODEL,
                    Weights.random(MODEL, 3), "w", connector(c, "w", PoolConnector.ResetScope.ALL_FENCED))) {
                int failed = 0;
                int ok = 0;
                long thrownAway = 0;
                for (int[] p : prompts) {
                    Completion got = reader.generate(p, SamplingParams.greedy(4), null).get();
                    Completion want = ref.generate(p, SamplingParams.greedy(4), null).get();
                    if (got.error() != null) {
                        assertThat(policy).isEqualTo(LoadFailurePolicy.FAIL);
                        assertThat(got.error()).contains("failed").contains("load failure policy: fail");
                        failed++;
                    } else {
                        assertSameOutput(got, want, "prompt " + ok);
                        thrownAway += got.recomputedTokens();
                        ok++;
                    }
                }
                assertThat(reader.metrics().loadFailures()).as("some loads hit the dead node").isPositive();
                if (policy == LoadFailurePolicy.RECOMPUTE) {
                    assertThat(failed).isZero();
                    assertThat(thrownAway).as("work redone after failed loads is reported").isPositive();
                } else {
                    assertThat(failed).as("the requests whose KV was on the dead node").isEqualTo(4);
                    assertThat(ok).as("the others are unharmed").isEqualTo(4);
                }
            }
        }
    }

    /**
     * A step whose load failed computed its request over a block that never arrived: none of what
     * that request computed in the step may reach the pool. Before the fix the step's saves were
     * queued without looking at the step's load failures, so the pool kept wrong KV under right keys
     * (the recomputation's own save was then refused as already present) and a later reader loaded it
     * as its own; weightUpdatesWithHardResetNeverServeStaleKv failed that way about once in 25 runs.
     */
    @Test
    void aStepWhoseLoadFailedSavesNothingOfItsRequest() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(2, Size.ofMiB(32));
             InProcessCluster clean = new InProcessCluster(1, Size.ofMiB(32)); KvPoolClient cc = clean.client()) {
            int[] stored = prompt(40, 77);
            int[] longer = prompt(48, 77); // the same 40 tokens, then 8 more: two blocks the pool lacks
            String dead = cluster.nodes.get(1).name();
            String live = cluster.nodes.get(0).name();
            try (KvPoolClient wc = cluster.client(cfg -> cfg.withPreferredSegment(dead));
                 Engine writer = new Engine(withBlockSize(engineConfig(64)), MODEL, Weights.random(MODEL, 3), "w",
                         connector(wc, "w", PoolConnector.ResetScope.ALL_FENCED))) {
                assertThat(writer.generate(stored, SamplingParams.greedy(2), null).get().ok()).isTrue();
                writer.connector().waitForSave();
            }
            cluster.nodes.get(1).close(); // still listed by the master: the reader's loads from it fail
            // over TCP: a same-machine reader could still copy the dead node's mapped bytes before failing
            try (KvPoolClient rc = cluster.client(cfg -> cfg.withPreferredSegment(live).withSharedMemory(false));
                 Engine reader = new Engine(withBlockSize(engineConfig(64)).withLoadFailure(LoadFailurePolicy.RECOMPUTE),
                         MODEL, Weights.random(MODEL, 3), "w", connector(rc, "w", PoolConnector.ResetScope.ALL_FENCED))) {
                Completion got = reader.generate(longer, SamplingParams.greedy(2), null).get();
                assertThat(got.ok()).isTrue();
                assertThat(got.recomputedTokens()).as("the step over the failed load was thrown away").isPositive();
                reader.connector().waitForSave();
                // the failed step's two new blocks were dropped, not queued: a queued save reads the block
                // whenever it runs, before or after the recomputation rewrote it
                assertThat(reader.connectorStats().droppedSaves()).as("saves of the failed step").isEqualTo(2);
            }
            // the bytes each new block's key must hold: the same request on a pool where nothing fails
            try (Engine ref = new Engine(withBlockSize(engineConfig(64)), MODEL, Weights.random(MODEL, 3), "w",
                    connector(cc, "w", PoolConnector.ResetScope.ALL_FENCED))) {
                assertThat(ref.generate(longer, SamplingParams.greedy(2), null).get().ok()).isTrue();
                ref.connector().waitForSave();
            }
            List<io.kvpool.connector.hash.BlockHash> h = new BlockHasher(BS, "0").hashes(longer);
            KeyFormat keys = KeyFormat.of("tiny", "w", "f32");
            try (KvPoolClient c = cluster.client(cfg -> cfg.withPreferredSegment(live))) {
                for (int b = stored.length / BS; b < longer.length / BS; b++) {
                    String key = keys.keyString(h.get(b));
                    byte[] want = cc.get(key).orElseThrow();
                    byte[] got = c.get(key).orElse(null);
                    assertThat(got).as("block %d in the pool after the failed step", b).isNotNull();
                    assertThat(Arrays.equals(got, want)).as("block %d holds the right KV", b).isTrue();
                }
            }
        }
    }

    @Test
    void failedLoadsAreRecomputed() throws Exception {
        loadFailure(LoadFailurePolicy.RECOMPUTE);
    }

    @Test
    void failedLoadsFailOnlyTheirRequestUnderPolicyFail() throws Exception {
        loadFailure(LoadFailurePolicy.FAIL);
    }
}
