package io.kvpool.engine;

import io.kvpool.connector.ConnectorMeta;
import io.kvpool.connector.ConnectorRequest;
import io.kvpool.connector.ConnectorStats;
import io.kvpool.connector.KvConnector;
import io.kvpool.connector.LoadFailurePolicy;
import io.kvpool.connector.Match;
import io.kvpool.connector.PagedKv;
import io.kvpool.connector.ResetResult;
import io.kvpool.connector.ScheduledRequest;
import io.kvpool.connector.VersionedKeys;
import io.kvpool.connector.hash.BlockHash;
import io.kvpool.connector.hash.BlockHasher;
import io.kvpool.engine.llama.KvBlocks;
import io.kvpool.engine.llama.LayerHook;
import io.kvpool.engine.llama.ModelConfig;
import io.kvpool.engine.llama.Transformer;
import io.kvpool.engine.llama.Weights;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.lang.foreign.MemorySegment;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;
import java.util.function.Supplier;

/**
 * The reference engine: requests in, tokens out, over a paged KV cache with a local prefix cache and
 * an optional external cache behind a {@link KvConnector}.
 *
 * <h2>One thread owns everything</h2>
 * The step thread runs the scheduler and the model; every public method is a command queued to it
 * and answered through a future, so no engine state is ever shared between threads (the connector's
 * loads and saves run on its own threads, touching only the blocks they were given).
 *
 * <h2>A step</h2>
 * <pre>
 *   commands (generate, abort, pause, reset, update weights)
 *   admit waiting requests, in arrival order, while blocks (for the prompt and every output token)
 *   and running slots last:
 *       local prefix cache hits (whole blocks, at most prompt - 1 tokens: the last token is always
 *       computed, to get its logits)
 *       connector.getNumNewMatchedTokens -> external hits (whole blocks, same cap)
 *       allocate the rest of the prompt's blocks; connector.updateStateAfterAlloc
 *   plan: each running request gets a prefill chunk or one decode token, within maxStepTokens
 *   connector.buildConnectorMeta, startLoadKv
 *   model forward per request (LayerHook: waitForLayerLoad before each layer)
 *   connector.saveKvLayer for every layer
 *   load failures: the requests whose loaded blocks failed are rolled back to the first failed block
 *       (recompute) or failed with an error (fail); their logits from this step are discarded
 *   register newly full blocks in the prefix cache; sample; finish requests (stop, length)
 *   finished requests whose saves are still running keep their blocks until getFinished says so
 * </pre>
 *
 * <h2>Weight updates</h2>
 * {@link #pauseGeneration} (aborting or draining the requests in flight), {@link #updateWeights},
 * {@link #resetPrefixCache} (the local cache, then the connector's: one cascade), {@link #resume}.
 * A request runs entirely under one weights version: pausing aborts or drains every request first.
 * With {@link EngineConfig#versionedKeys()}, the update switches the connector's key version
 * instead of resetting it.
 */
public final class Engine implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(Engine.class);

    /** Receives each output token as it is chosen (on the engine's thread: return quickly). */
    public interface TokenListener {
        void onToken(String requestId, int token);
    }

    private final EngineConfig config;
    private final ModelConfig modelConfig;
    private final KvBlocks kv;
    private final PagedKv paged;
    private final BlockPool pool;
    private final BlockHasher hasher;
    private final KvConnector connector; // null: no external cache
    private final EngineMetrics metrics;
    private final Thread thread;
    private final ConcurrentLinkedQueue<Runnable> commands = new ConcurrentLinkedQueue<>();
    private final AtomicLong ids = new AtomicLong();
    private volatile boolean running = true;

    // step-thread state
    private Transformer model;
    private String weightsVersion;
    private final ArrayDeque<Sequence> waiting = new ArrayDeque<>();
    private final List<Sequence> active = new ArrayList<>();
    /** Finished requests whose blocks wait for their saves, by id. */
    private final Map<String, Sequence> savingBlocks = new HashMap<>();
    private boolean paused;
    private Pause pausing;

    private record Pause(boolean abort, boolean clearCache, int aborted, CompletableFuture<Paused> done) {
    }

    /**
     * What a pause found and did.
     *
     * @param reset          the cache reset's result (success with 0 removed when the pause cleared nothing)
     * @param aborted        requests aborted by it (waiting and running)
     * @param savesInFlight  blocks whose saves to the external cache were queued or running when the
     *                       engine stopped (a reset or weight switch after the pause drops the ones not
     *                       yet done; the engine keeps their blocks meanwhile)
     */
    public record Paused(ResetResult reset, int aborted, int savesInFlight) {
    }

    public Engine(EngineConfig config, ModelConfig modelConfig, Weights weights, String weightsVersion,
                  KvConnector connector) {
        this.config = Objects.requireNonNull(config, "config");
        this.modelConfig = Objects.requireNonNull(modelConfig, "modelConfig");
        this.model = new Transformer(modelConfig, weights);
        this.weightsVersion = Objects.requireNonNull(weightsVersion, "weightsVersion");
        this.kv = new KvBlocks(modelConfig, config.numBlocks(), config.blockSize());
        this.paged = new PagedKv() {
            @Override
            public int blockSize() {
                return config.blockSize();
            }

            @Override
            public int numLayers() {
                return modelConfig.nLayers();
            }

            @Override
            public long blockBytes() {
                return kv.blockBytes();
            }

            @Override
            public MemorySegment block(int id) {
                return kv.block(id);
            }
        };
        this.pool = new BlockPool(config.numBlocks());
        this.hasher = new BlockHasher(config.blockSize(), config.hashSeed());
        this.connector = connector;
        this.metrics = new EngineMetrics();
        this.thread = Thread.ofPlatform().name("kvpool-engine-step").daemon(true).start(this::loop);
    }

    public EngineConfig config() {
        return config;
    }

    public ModelConfig modelConfig() {
        return modelConfig;
    }

    public EngineMetrics metrics() {
        return metrics;
    }

    /** The connector, or null when the engine has no external cache. */
    public KvConnector connector() {
        return connector;
    }

    /** Bytes of KV one token takes (every layer, K and V). */
    public long kvBytesPerToken() {
        return kv.blockBytes() / config.blockSize();
    }

    // ---------------------------------------------------------------- public commands

    /** Queues a request; the future completes when it finishes (never exceptionally: errors are in the completion). */
    public CompletableFuture<Completion> generate(int[] prompt, SamplingParams params, TokenListener listener) {
        return generate(prompt, params, null, listener);
    }

    /**
     * {@link #generate(int[], SamplingParams, TokenListener)} with vLLM's per-request cache salt
     * (null for none): hashed into the first block only, so the request shares no KV, local or
     * external, with requests that do not carry the same salt.
     */
    public CompletableFuture<Completion> generate(int[] prompt, SamplingParams params, String cacheSalt,
                                                  TokenListener listener) {
        Objects.requireNonNull(params, "params");
        if (cacheSalt != null && cacheSalt.isEmpty()) {
            throw new IllegalArgumentException("cache_salt must not be empty (omit it for no salt)");
        }
        if (prompt.length == 0) {
            throw new IllegalArgumentException("prompt must have at least one token");
        }
        int total = prompt.length + params.maxTokens();
        if (total > modelConfig.maxSeqLen()) {
            throw new IllegalArgumentException("prompt (" + prompt.length + " tokens) plus max_tokens ("
                    + params.maxTokens() + ") exceeds the model's context of " + modelConfig.maxSeqLen());
        }
        int blocksNeeded = (total + config.blockSize() - 1) / config.blockSize();
        if (blocksNeeded > config.numBlocks()) {
            throw new IllegalArgumentException("request needs " + blocksNeeded + " KV blocks; the cache has "
                    + config.numBlocks());
        }
        for (int t : prompt) {
            if (t < 0 || t >= modelConfig.vocabSize()) {
                throw new IllegalArgumentException("token id " + t + " outside the vocabulary (0.."
                        + (modelConfig.vocabSize() - 1) + ")");
            }
        }
        Sequence s = new Sequence("req-" + ids.incrementAndGet(), prompt, params, cacheSalt, listener,
                System.nanoTime());
        command(() -> {
            if (pausing != null || paused) {
                s.finish(FinishReason.ABORT, "the engine is paused", this);
            } else {
                waiting.add(s);
            }
            return null;
        });
        return s.result;
    }

    /** Aborts every waiting and running request; returns how many. */
    public int abortAllRequests() {
        return command(this::abortAll).join();
    }

    /**
     * Stops generating: with {@code abort}, every request in flight is aborted now; without, new
     * requests are refused and the ones in flight finish first. With {@code clearCache}, the local
     * prefix cache and the connector's external cache are then reset (see {@link #resetPrefixCache}).
     * The future completes when the engine is paused, with the reset's result (success if none), the
     * requests aborted and the saves still in flight at that moment.
     */
    public CompletableFuture<Paused> pauseGeneration(boolean clearCache, boolean abort) {
        CompletableFuture<Paused> done = new CompletableFuture<>();
        command(() -> {
            int aborted = abort ? abortAll() : 0;
            Pause earlier = pausing;
            if (earlier != null) {
                // a pause still draining: this one supersedes it, and both callers hear when the engine stops
                aborted += earlier.aborted();
                done.whenComplete((p, e) -> earlier.done().complete(p));
            }
            pausing = new Pause(abort || (earlier != null && earlier.abort()), clearCache || (earlier != null
                    && earlier.clearCache()), aborted, done);
            return null;
        });
        return done;
    }

    public void resume() {
        command(() -> {
            paused = false;
            pausing = null;
            return null;
        }).join();
    }

    public boolean isPaused() {
        return command(() -> paused).join();
    }

    /**
     * Drops the local prefix cache and, with {@code resetConnector}, the external one: one cascade.
     * With no connector configured the external part is a quiet success.
     */
    public ResetResult resetPrefixCache(boolean resetConnector) {
        return command(() -> resetCaches(resetConnector)).join();
    }

    /**
     * Swaps the weights (the engine must be paused, so no request spans two versions). The local
     * prefix cache is dropped (its KV came from the old weights); the connector's keys switch to
     * {@code version} either way, so that a key always names the weights its KV was computed with.
     * With versioned keys that is the remedy: the old version is reclaimed in the background;
     * otherwise the caller resets the external cache ({@link #resetPrefixCache}, or
     * {@link #pauseGeneration} with clearCache), which removes the old KV whatever its keys say (and is
     * what keeps it out when the version name does not change).
     */
    public void updateWeights(Supplier<Weights> weights, String version) {
        Objects.requireNonNull(version, "version");
        command(() -> {
            if (!paused) {
                throw new IllegalStateException("update_weights needs the engine paused (pause_generation first)");
            }
            Weights w = weights.get();
            model = new Transformer(modelConfig, w);
            String previous = weightsVersion;
            weightsVersion = version;
            pool.reset();
            if (connector instanceof VersionedKeys v) {
                if (config.versionedKeys()) {
                    v.switchWeights(version, true);
                } else if (!version.equals(previous)) {
                    // the hard reset removes the old KV; the keys must still name the weights their KV came
                    // from, or an engine started later under the old name would load this KV as its own
                    v.switchWeights(version, false);
                }
            }
            metrics.weightUpdates.increment();
            log.info("engine: weights updated to version {}", version);
            return null;
        }).join();
    }

    public String weightsVersion() {
        return command(() -> weightsVersion).join();
    }

    /** Requests waiting and running. */
    public int inFlight() {
        return command(() -> waiting.size() + active.size()).join();
    }

    private <T> CompletableFuture<T> command(Supplier<T> c) {
        if (!running) {
            throw new IllegalStateException("engine closed");
        }
        CompletableFuture<T> f = new CompletableFuture<>();
        commands.add(() -> {
            try {
                f.complete(c.get());
            } catch (RuntimeException e) {
                f.completeExceptionally(e);
            }
        });
        LockSupport.unpark(thread);
        return f;
    }

    // ---------------------------------------------------------------- the step thread

    private void loop() {
        while (running) {
            Runnable c;
            while ((c = commands.poll()) != null) {
                c.run();
            }
            collectFinishedSaves(Set.of());
            if (pausing != null && (pausing.abort() || (waiting.isEmpty() && active.isEmpty()))) {
                Pause p = pausing;
                pausing = null;
                paused = true;
                int saves = connector == null ? 0 : connector.savesInFlight(); // before a reset drops them
                p.done().complete(new Paused(p.clearCache() ? resetCaches(true) : ResetResult.ok(0), p.aborted(), saves));
            }
            boolean worked = false;
            if (!paused) {
                try {
                    worked = step();
                } catch (RuntimeException | Error e) {
                    log.error("engine step failed; failing the requests in it", e);
                    for (Sequence s : new ArrayList<>(active)) {
                        finish(s, FinishReason.ERROR, "engine step failed: " + e);
                    }
                }
            }
            if (!worked && commands.isEmpty()) {
                LockSupport.parkNanos(savingBlocks.isEmpty() ? 50_000_000L : 1_000_000L);
            }
        }
    }

    private int abortAll() {
        int n = waiting.size() + active.size();
        for (Sequence s : new ArrayList<>(waiting)) {
            waiting.remove(s);
            if (connector != null) {
                connector.requestFinished(view(s), new int[0]); // drops what a lookup cached for it
            }
            s.finish(FinishReason.ABORT, null, this);
        }
        for (Sequence s : new ArrayList<>(active)) {
            finish(s, FinishReason.ABORT, null);
        }
        metrics.aborted.add(n);
        return n;
    }

    private ResetResult resetCaches(boolean resetConnector) {
        int local = pool.reset();
        metrics.prefixCacheResets.increment();
        if (!resetConnector || connector == null) {
            return ResetResult.ok(local); // no external cache: nothing more to do, and nothing to warn about
        }
        ResetResult r = connector.resetCache();
        return r.success() ? ResetResult.ok(local + r.removed()) : r;
    }

    private ConnectorRequest view(Sequence s) {
        return new ConnectorRequest(s.id, s.tokens, s.numTokens, null, s.cacheSalt);
    }

    /** One step; false when there was nothing to do. */
    private boolean step() {
        admit();
        if (active.isEmpty()) {
            return false;
        }
        int budget = config.maxStepTokens();
        List<Sequence> batch = new ArrayList<>();
        List<ScheduledRequest> scheduled = new ArrayList<>();
        for (Sequence s : active) {
            int want = s.numTokens - s.computed;
            int n = Math.min(want, budget);
            if (n <= 0) {
                continue;
            }
            if (!ensureBlocks(s, s.computed + n)) {
                continue; // no block for its next token now: it waits (others may finish and free some)
            }
            s.stepTokens = n;
            budget -= n;
            batch.add(s);
            scheduled.add(new ScheduledRequest(view(s), s.table(), s.computed, s.computed + n));
            if (budget == 0) {
                break;
            }
        }
        if (batch.isEmpty()) {
            return false;
        }
        ConnectorMeta meta = ConnectorMeta.EMPTY;
        if (connector != null) {
            meta = connector.buildConnectorMeta(scheduled);
            connector.startLoadKv(meta, paged);
        }
        LayerHook hook = connector == null ? LayerHook.NONE : new LayerHook() {
            @Override
            public void beforeLayer(int layer) {
                connector.waitForLayerLoad(layer);
            }
        };
        // the batch's last sequence computes layer l last: then layer l of the whole step is done and
        // can be saved while the later layers compute (a connector that saves whole blocks waits for
        // the last layer)
        LayerHook lastHook = connector == null ? LayerHook.NONE : new LayerHook() {
            @Override
            public void beforeLayer(int layer) {
                connector.waitForLayerLoad(layer);
            }

            @Override
            public void afterLayer(int layer) {
                connector.saveKvLayer(layer, paged);
            }
        };
        long t0 = System.nanoTime();
        Map<Sequence, float[]> logits = new HashMap<>();
        for (int i = 0; i < batch.size(); i++) {
            Sequence s = batch.get(i);
            logits.put(s, model.forward(s.tokens, s.computed, s.stepTokens, s.table(), kv,
                    i == batch.size() - 1 ? lastHook : hook, false));
        }
        metrics.computedTokens.add(batch.stream().mapToLong(s -> s.stepTokens).sum());
        metrics.stepNanos.add(System.nanoTime() - t0);
        if (connector != null) {
            connector.waitForLayerLoad(0); // a step whose model never ran a layer still settles its loads
            for (int l = 0; l < modelConfig.nLayers(); l++) {
                connector.saveKvLayer(l, paged); // the layers the hook saved already are not saved twice
            }
        }
        Set<Integer> failed = connector == null ? Set.of() : connector.blockIdsWithLoadErrors();
        Set<String> finishedNow = new HashSet<>();
        for (Sequence s : batch) {
            int firstFailed = s.firstFailedLoadedBlock(failed);
            s.loadedBlocks.clear();
            if (firstFailed >= 0) {
                metrics.loadFailures.increment();
                if (config.loadFailure() == LoadFailurePolicy.FAIL) {
                    finish(s, FinishReason.ERROR, "loading KV block " + firstFailed + " of the prompt from the external cache"
                            + " failed (load failure policy: fail)");
                    finishedNow.add(s.id);
                    continue;
                }
                int back = firstFailed * config.blockSize();
                s.recomputed += s.stepTokens; // computed over a block that never arrived: thrown away
                s.externalHits = Math.min(s.externalHits, Math.max(0, back - s.localHits));
                s.computed = back; // recompute from the first failed block; this step's logits are void
                continue;
            }
            s.computed += s.stepTokens;
            registerFullBlocks(s);
            if (s.computed == s.numTokens) {
                sample(s, logits.get(s));
                if (s.done != null) {
                    finish(s, s.done, null);
                    finishedNow.add(s.id);
                }
            }
        }
        collectFinishedSaves(finishedNow);
        return true;
    }

    /** Takes waiting requests in order while there are slots and blocks for their prompts. */
    private void admit() {
        while (!waiting.isEmpty() && active.size() < config.maxRunning()) {
            Sequence s = waiting.peek();
            int bs = config.blockSize();
            // every block the request can ever need is taken now: a running request never waits for
            // a block another running request holds (no deadlock when the cache is small)
            int needBlocks = (s.promptLength + s.params.maxTokens() + bs - 1) / bs;
            int maxHitBlocks = (s.promptLength - 1) / bs; // the last prompt token is always computed
            List<BlockHash> hashes = hasher.hashes(s.tokens, s.promptLength, s::extraKeys);
            // local prefix cache: take matching blocks, stop at the first miss
            List<Integer> taken = new ArrayList<>();
            for (int b = 0; b < maxHitBlocks && b < hashes.size(); b++) {
                if (!pool.contains(hashes.get(b))) {
                    break;
                }
                taken.add(pool.take(hashes.get(b)));
            }
            int local = taken.size() * bs;
            int external = 0;
            if (connector != null && taken.size() < maxHitBlocks) {
                Match m = connector.getNumNewMatchedTokens(view(s), local);
                external = Math.min(m.tokens(), maxHitBlocks * bs - local);
                external -= external % bs;
            }
            int fresh = needBlocks - taken.size();
            if (pool.available() < fresh) {
                for (int b : taken) {
                    pool.release(b);
                }
                if (connector != null) {
                    connector.updateStateAfterAlloc(view(s), new int[0], 0); // forget the match
                }
                return; // wait for blocks (first come, first served: no overtaking)
            }
            waiting.poll();
            for (int b : taken) {
                s.blocks.add(b);
            }
            for (int i = 0; i < fresh; i++) {
                s.blocks.add(pool.allocate());
            }
            if (connector != null) {
                connector.updateStateAfterAlloc(view(s), s.table(), external);
            }
            for (int b = taken.size(); b < taken.size() + external / bs; b++) {
                s.loadedBlocks.add(s.blocks.get(b));
            }
            s.localHits = local;
            s.externalHits = external;
            s.computed = local + external;
            s.admittedVersion = weightsVersion;
            metrics.localHitTokens.add(local);
            metrics.externalHitTokens.add(external);
            metrics.promptTokens.add(s.promptLength);
            active.add(s);
        }
    }

    private boolean ensureBlocks(Sequence s, int tokens) {
        int need = (tokens + config.blockSize() - 1) / config.blockSize();
        while (s.blocks.size() < need) {
            int b = pool.allocate();
            if (b < 0) {
                return false;
            }
            s.blocks.add(b);
        }
        return true;
    }

    private void registerFullBlocks(Sequence s) {
        int bs = config.blockSize();
        int full = s.computed / bs;
        if (full <= s.registeredBlocks) {
            return;
        }
        List<BlockHash> h = hasher.hashes(s.tokens, full * bs, s::extraKeys);
        for (int b = s.registeredBlocks; b < full; b++) {
            pool.register(s.blocks.get(b), h.get(b));
        }
        s.registeredBlocks = full;
    }

    private void sample(Sequence s, float[] logits) {
        int token = Sampling.choose(logits, s.params, s.rng);
        s.digest(logits);
        if (s.output == 0) {
            s.firstLogits = logits.clone();
            s.firstTokenAt = System.nanoTime();
            metrics.ttft(s.firstTokenAt - s.arrival);
        }
        s.append(token);
        metrics.generatedTokens.increment();
        if (s.listener != null) {
            s.listener.onToken(s.id, token);
        }
        if (s.params.stopAtEos() && token == modelConfig.eosToken()) {
            s.done = FinishReason.STOP;
        } else if (s.output >= s.params.maxTokens()) {
            s.done = FinishReason.LENGTH;
        }
    }

    private void finish(Sequence s, FinishReason reason, String error) {
        active.remove(s);
        boolean keep = connector != null && connector.requestFinished(view(s), s.table());
        if (keep) {
            savingBlocks.put(s.id, s);
        } else {
            s.releaseBlocks(pool);
        }
        s.finish(reason, error, this);
    }

    private void collectFinishedSaves(Set<String> finishedNow) {
        if (connector == null || savingBlocks.isEmpty()) {
            return;
        }
        for (String id : connector.getFinished(finishedNow)) {
            Sequence s = savingBlocks.remove(id);
            if (s != null) {
                s.releaseBlocks(pool);
            }
        }
    }

    Completion completionOf(Sequence s, FinishReason reason, String error) {
        long now = System.nanoTime();
        return new Completion(s.id, java.util.Arrays.copyOf(s.tokens, s.promptLength),
                java.util.Arrays.copyOfRange(s.tokens, s.promptLength, s.numTokens), reason, error,
                s.admittedVersion == null ? weightsVersion : s.admittedVersion, s.localHits, s.externalHits,
                s.recomputed, s.firstTokenAt == 0 ? -1 : s.firstTokenAt - s.arrival, now - s.arrival, s.firstLogits,
                s.digest);
    }

    /** Engine-wide counters and the connector's, for /metrics. */
    public ConnectorStats connectorStats() {
        return connector == null ? ConnectorStats.ZERO : connector.stats();
    }

    /** Blocks cached in the local prefix cache, and its hit counts (blocks). */
    public long[] prefixCacheStats() {
        return command(() -> new long[]{pool.cachedBlocks(), pool.hitBlocks(), pool.queriedBlocks()}).join();
    }

    @Override
    public void close() {
        if (!running) {
            return;
        }
        try {
            command(this::abortAll).join();
        } catch (RuntimeException ignored) {
            // closing anyway
        }
        running = false;
        LockSupport.unpark(thread);
        try {
            thread.join(10_000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        if (connector != null) {
            connector.waitForSave();
        }
        kv.close();
    }

    /** A request's state; step thread only. */
    static final class Sequence {
        final String id;
        int[] tokens;
        final int promptLength;
        int numTokens;
        int output;
        final SamplingParams params;
        final String cacheSalt;
        final TokenListener listener;
        final java.util.SplittableRandom rng;
        final long arrival;
        long firstTokenAt;
        final List<Integer> blocks = new ArrayList<>();
        final Set<Integer> loadedBlocks = new HashSet<>();
        int computed;
        int stepTokens;
        int registeredBlocks;
        int localHits;
        int externalHits;
        int recomputed;
        String admittedVersion;
        FinishReason done;
        float[] firstLogits;
        long digest;
        private final java.util.zip.CRC32C crc = new java.util.zip.CRC32C();
        final CompletableFuture<Completion> result = new CompletableFuture<>();

        Sequence(String id, int[] prompt, SamplingParams params, String cacheSalt, TokenListener listener,
                 long arrival) {
            this.id = id;
            this.tokens = java.util.Arrays.copyOf(prompt, prompt.length + params.maxTokens());
            this.promptLength = prompt.length;
            this.numTokens = prompt.length;
            this.params = params;
            this.cacheSalt = cacheSalt;
            this.listener = listener;
            this.rng = new java.util.SplittableRandom(params.seed());
            this.arrival = arrival;
        }

        /** Extra keys of block b's hash: the cache salt on block 0, as the connector hashes it. */
        List<?> extraKeys(int b) {
            return ConnectorRequest.extraKeysFor(null, cacheSalt, b);
        }

        int[] table() {
            int[] t = new int[blocks.size()];
            for (int i = 0; i < t.length; i++) {
                t[i] = blocks.get(i);
            }
            return t;
        }

        void append(int token) {
            tokens[numTokens++] = token;
            output++;
        }

        void digest(float[] logits) {
            byte[] b = new byte[logits.length * 4];
            for (int i = 0; i < logits.length; i++) {
                int bits = Float.floatToRawIntBits(logits[i]);
                b[4 * i] = (byte) bits;
                b[4 * i + 1] = (byte) (bits >>> 8);
                b[4 * i + 2] = (byte) (bits >>> 16);
                b[4 * i + 3] = (byte) (bits >>> 24);
            }
            crc.update(b);
            digest = crc.getValue();
        }

        /** The index (in the block table) of the first block loaded this step whose load failed, or -1. */
        int firstFailedLoadedBlock(Set<Integer> failed) {
            if (failed.isEmpty() || loadedBlocks.isEmpty()) {
                return -1;
            }
            for (int i = 0; i < blocks.size(); i++) {
                if (loadedBlocks.contains(blocks.get(i)) && failed.contains(blocks.get(i))) {
                    return i;
                }
            }
            return -1;
        }

        void releaseBlocks(BlockPool pool) {
            for (int b : blocks) {
                pool.release(b);
            }
            blocks.clear();
        }

        void finish(FinishReason reason, String error, Engine engine) {
            if (!result.isDone()) {
                result.complete(engine.completionOf(this, reason, error));
            }
        }
    }
}
