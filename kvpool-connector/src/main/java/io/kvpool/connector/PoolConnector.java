package io.kvpool.connector;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.connector.hash.BlockHash;
import io.kvpool.connector.hash.BlockHasher;
import io.kvpool.connector.hash.KeyFormat;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.lang.foreign.MemorySegment;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.LongAdder;
import java.util.concurrent.locks.ReentrantReadWriteLock;
import java.util.function.LongSupplier;

/**
 * The connector over a kvpool: one pool object per KV block, named by {@link KeyFormat} from the
 * block's chained hash ({@link BlockHasher}); lookups are one {@code prefixMatch}, loads one
 * {@code getIntoBatch} straight into the engine's blocks, saves one {@code putBatch} straight from
 * them, in the background.
 *
 * <h2>Reset and weight updates: no stale KV, ever</h2>
 * Two remedies, both here:
 * <ol>
 *   <li><b>Hard reset</b> ({@link #resetCache()}): {@code removeAll(force)} on the pool. The pool
 *       fences puts in flight (a put started before the reset never becomes visible after it). The
 *       connector closes the remaining gap, saves it has planned or queued but not yet started:
 *       every piece of work carries the cache <i>generation</i> it was planned in, and a reset bumps
 *       the generation under the write side of a read-write lock that loads and saves hold (read
 *       side) while they run. So a save either runs entirely before the reset (and the reset then
 *       removes what it stored) or finds the generation changed and is dropped; a load planned
 *       before the reset fails (the engine recomputes) rather than fill a block with old KV, and so
 *       do loads the engine accepted, or a match it was offered, before the reset but had not yet
 *       put in a step ({@link Planner}: they become void loads, reported failed).</li>
 *   <li><b>Versioned keys</b> ({@link #switchWeights}): the weight version is part of every key, so
 *       the switch makes all older KV unreachable at once; the same generation bump drops work
 *       planned under the old version, and the old version's objects are removed in the background
 *       ({@code removeByPrefix}), or left to eviction.</li>
 * </ol>
 *
 * <h2>Granularity</h2>
 * A block is one pool object holding all its layers, layer-major, so layer l of a block is the range
 * {@code [l * layerBytes, (l + 1) * layerBytes)} of its value, and the keys and bytes are the same
 * whichever way they move ({@link Granularity}):
 * <ul>
 *   <li>{@link Granularity#BLOCK}: one {@code getIntoBatch} of the step's blocks, so the first
 *       {@link #waitForLayerLoad} waits for the whole step's loads, and one {@code putBatch} once
 *       the last layer is saved.</li>
 *   <li>{@link Granularity#LAYER}: the step's blocks are located once, then read a layer at a time
 *       in order, each layer of every block in one ranged read, so {@link #waitForLayerLoad}(l) waits
 *       for layer l only and layer 0 computes while later layers arrive; the step's saves are
 *       reserved at the first {@link #saveKvLayer} and each layer is written as it is computed
 *       ({@code PutInParts}), made visible after the last.</li>
 * </ul>
 * docs/architecture.md ("Layer by layer") says why the object stays one block and when each mode is
 * faster.
 *
 * <h2>A failed load voids what was computed over it</h2>
 * A block's KV depends on every block before it. When a request's load of block i fails, the blocks
 * after i that the step computed are wrong, so the step's saves of them are dropped
 * ({@link ConnectorMeta#savesNotOverFailedLoads}); the engine recomputes from block i (and saves
 * them then) or fails the request, by its load failure policy.
 *
 * <h2>Threads</h2>
 * The scheduler-side methods are called by one scheduler thread and the worker-side ones by one
 * worker thread (they may be the same); loads and saves run on virtual threads of this connector.
 * Saves read the engine's blocks after the step: the engine keeps a finished request's blocks while
 * {@link #requestFinished} says saves are pending, until {@link #getFinished} reports it.
 */
public final class PoolConnector implements KvConnector, VersionedKeys {

    private static final Logger log = LoggerFactory.getLogger(PoolConnector.class);

    /** How a step's KV moves: whole blocks, or layer by layer (see the class comment). */
    public enum Granularity { BLOCK, LAYER }

    /** What to remove on {@link #resetCache()}. */
    public enum ResetScope {
        /** {@code removeAll(force)}: everything in the pool, with puts in flight fenced. The RL default. */
        ALL_FENCED,
        /** {@code removeByPrefix} of this model's keys: other models' KV stays; puts in flight are not fenced by the pool (the connector's generation still drops its own). */
        MODEL
    }

    private final PoolStore store;
    private final BlockHasher hasher;
    private final Planner planner;
    private final ResetScope resetScope;
    private final Granularity granularity;
    private volatile KeyFormat keys;

    /** Loads and saves hold the read side while they run; resets and weight switches take the write side. */
    private final ReentrantReadWriteLock fence = new ReentrantReadWriteLock();
    private volatile long generation = 1;

    private final ExecutorService io = Executors.newThreadPerTaskExecutor(Thread.ofVirtual().name("kvpool-connector-", 0).factory());

    // scheduler side (scheduler thread; the rest of it is the planner's)
    /** Per request: its blocks' key digests, made once. */
    private final RequestDigests digests = new RequestDigests();

    // worker side
    private ConnectorMeta current = ConnectorMeta.EMPTY;
    /** The current step's loads (engine thread), and what every step's load needs of this connector. */
    private StepLoad step;
    private final StepLoad.Context loads;
    /** Deadlines of lookups and loads, and whether the pool is in use now ({@link LoadBudget}). */
    private volatile LongSupplier clock = System::nanoTime;
    private final LoadBudget budget = new LoadBudget(() -> clock.getAsLong(), io);
    private final LongAdder abandonedLoads = new LongAdder();
    private boolean savesStarted = true;
    /** LAYER: the step's saves in parts (null until the first {@link #saveKvLayer} of a step). */
    private LayerTransfers.Saves stepSaves;
    /** Blocks whose load failed, until the engine asks ({@link #blockIdsWithLoadErrors}). */
    private final Set<Integer> loadErrors = ConcurrentHashMap.newKeySet();
    /** Blocks whose load failed in the current step (kept after the engine asks: the saves need it). */
    private final Set<Integer> stepLoadErrors = ConcurrentHashMap.newKeySet();

    // saves in flight, by request (guarded by saveLock)
    private final Object saveLock = new Object();
    @GuardedBy("saveLock")
    private final Map<String, Integer> pendingSaves = new HashMap<>();
    @GuardedBy("saveLock")
    private final Set<String> finishedWithSaves = new HashSet<>();
    @GuardedBy("saveLock")
    private final Set<String> doneSaving = new HashSet<>();
    @GuardedBy("saveLock")
    private final List<Future<?>> saving = new ArrayList<>();
    /** BLOCK: steps' saves waiting for the saver, in order. */
    @GuardedBy("saveLock")
    private final ArrayDeque<SaveJob> queued = new ArrayDeque<>();
    @GuardedBy("saveLock")
    private boolean saverRunning;

    /** BLOCK: one step's saves, and what completes when they are stored (or dropped). */
    private record SaveJob(List<ConnectorMeta.Save> saves, long planned, PagedKv kv, CompletableFuture<Void> done) {
    }

    /** Most bytes one coalesced save ({@link #saverLoop}) stores in one putBatch. */
    static final long SAVE_BATCH_BYTES = 64L << 20;

    private final LongAdder lookups = new LongAdder();
    private final LongAdder matchedTokens = new LongAdder();
    private final LongAdder loadedBlocks = new LongAdder();
    private final LongAdder loadedBytes = new LongAdder();
    private final LongAdder failedLoads = new LongAdder();
    private final LongAdder savedBlocks = new LongAdder();
    private final LongAdder savedBytes = new LongAdder();
    private final LongAdder skippedSaves = new LongAdder();
    private final LongAdder droppedSaves = new LongAdder();
    private final LongAdder resets = new LongAdder();

    /**
     * @param client     the pool client (not closed by this connector)
     * @param hasher     block size and hash seed; the engine's block size must equal it
     * @param keys       model, weight version, ranks and dtype of this engine's KV
     * @param resetScope what {@link #resetCache()} removes
     */
    public PoolConnector(KvPoolClient client, BlockHasher hasher, KeyFormat keys, ResetScope resetScope) {
        this(client, hasher, keys, resetScope, Granularity.BLOCK);
    }

    /** The same, moving KV at {@code granularity}. */
    public PoolConnector(KvPoolClient client, BlockHasher hasher, KeyFormat keys, ResetScope resetScope,
                         Granularity granularity) {
        this(PoolStore.of(Objects.requireNonNull(client, "client")), hasher, keys, resetScope, granularity);
    }

    /** Over any store: the contract tests' in-memory one. */
    PoolConnector(PoolStore store, BlockHasher hasher, KeyFormat keys, ResetScope resetScope) {
        this(store, hasher, keys, resetScope, Granularity.BLOCK);
    }

    PoolConnector(PoolStore store, BlockHasher hasher, KeyFormat keys, ResetScope resetScope, Granularity granularity) {
        this.granularity = Objects.requireNonNull(granularity, "granularity");
        this.store = Objects.requireNonNull(store, "store");
        this.hasher = Objects.requireNonNull(hasher, "hasher");
        this.planner = new Planner(hasher);
        this.keys = Objects.requireNonNull(keys, "keys");
        this.resetScope = Objects.requireNonNull(resetScope, "resetScope");
        StepLoad.Outcome outcome = new StepLoad.Outcome() {
            @Override
            public void failed(List<ConnectorMeta.Load> loads) {
                fail(loads);
            }

            @Override
            public void loaded(long blocks, long bytes) {
                loadedBlocks.add(blocks);
                loadedBytes.add(bytes);
                if (blocks > 0) {
                    budget.landed();
                }
            }

            @Override
            public void abandoned(int blocks, PoolBreaker.Probe probe) {
                abandonedLoads.add(blocks);
                budget.abandoned(blocks, probe);
            }
        };
        this.loads = new StepLoad.Context(store, io, fence, () -> generation, outcome);
        this.step = StepLoad.none(current, outcome);
    }

    public KeyFormat keys() {
        return keys;
    }

    public Granularity granularity() {
        return granularity;
    }

    public long generation() {
        return generation;
    }

    // ---------------------------------------------------------------- scheduler side

    @Override
    public Match getNumNewMatchedTokens(ConnectorRequest request, int numComputedTokens) {
        lookups.increment();
        int start = planner.firstBlock(request, numComputedTokens);
        if (start < 0 || !budget.admit()) { // nothing to look up, or the pool is left alone for now
            return planner.answer(request, numComputedTokens, start, 0);
        }
        List<BlockHash> h = planner.hashes(request);
        int full = hasher.fullBlocks(request.numTokens());
        long[] d = digests.of(request, h, full, keys);
        int present = budget.lookup(() -> store.prefixMatchDigests(d, start, full),
                (long) (full - start) * hasher.blockSize(), io, 0);
        Match m = planner.answer(request, numComputedTokens, start, present);
        matchedTokens.add(m.tokens());
        return m;
    }

    @Override
    public void updateStateAfterAlloc(ConnectorRequest request, int[] blockIds, int numExternalTokens) {
        planner.alloc(request, blockIds, numExternalTokens, keys);
    }

    @Override
    public ConnectorMeta buildConnectorMeta(List<ScheduledRequest> scheduled) {
        budget.planned(scheduled.stream().mapToLong(s -> s.computedAfter() - s.computedBefore()).sum());
        return planner.build(scheduled, keys, generation);
    }

    @Override
    public boolean requestFinished(ConnectorRequest request, int[] blockIds) {
        planner.forget(request.id());
        digests.forget(request.id());
        synchronized (saveLock) {
            if (pendingSaves.getOrDefault(request.id(), 0) > 0) {
                finishedWithSaves.add(request.id());
                return true;
            }
            return false;
        }
    }

    @Override
    public ResetResult resetCache() {
        fence.writeLock().lock();
        try {
            generation++;
            planner.voidAll();
            long removed = switch (resetScope) {
                case ALL_FENCED -> store.removeAll(true);
                case MODEL -> store.removeByPrefix(KeyFormat.modelPrefix(keys.model()));
            };
            resets.increment();
            log.info("kvpool connector: cache reset ({}), {} objects removed; generation {}", resetScope, removed,
                    generation);
            return ResetResult.ok(removed);
        } catch (RuntimeException e) {
            log.warn("kvpool connector: cache reset failed: {}", e.toString());
            return ResetResult.failed("kvpool reset failed: " + e.getMessage());
        } finally {
            fence.writeLock().unlock();
        }
    }

    /**
     * Versioned keys: from now on keys carry {@code weights}; work planned under the old version is
     * dropped. With {@code reclaim}, the old version's objects are removed in the background; the
     * returned future gives how many.
     */
    @Override
    public CompletableFuture<Long> switchWeights(String weights, boolean reclaim) {
        String oldPrefix;
        fence.writeLock().lock();
        try {
            KeyFormat old = keys;
            keys = old.withWeights(weights);
            generation++;
            planner.voidAll();
            digests.clear();
            oldPrefix = old.versionPrefix();
        } finally {
            fence.writeLock().unlock();
        }
        if (!reclaim || oldPrefix.equals(keys.versionPrefix())) {
            return CompletableFuture.completedFuture(0L);
        }
        return CompletableFuture.supplyAsync(() -> {
            long n = store.removeByPrefix(oldPrefix);
            log.info("kvpool connector: reclaimed {} objects of {}", n, oldPrefix);
            return n;
        }, io);
    }

    // ---------------------------------------------------------------- worker side

    @Override
    public void startLoadKv(ConnectorMeta meta, PagedKv kv) {
        step.settle(); // the previous step's load, if the engine never waited for it
        if (stepSaves != null) {
            stepSaves.finishEarly(keep(stepSaves)); // the engine never saved the last layer: what is unwritten fails
        }
        current = meta;
        loadErrors.clear();
        stepLoadErrors.clear();
        savesStarted = false;
        stepSaves = null;
        fail(meta.voidLoads()); // accepted before a reset: the KV they name is gone or stale
        budget.started(!meta.loads().isEmpty());
        step = StepLoad.start(meta, kv, granularity, budget.deadlineNanos((long) meta.loads().size() * hasher.blockSize()),
                loads);
    }

    /**
     * Gives lookups and a step's loads at most {@code deadline} (null: no limit, the default): loads still out then
     * are abandoned and reported failed, so the engine recomputes those blocks instead of waiting for a pool that is
     * down, frozen or slow; they never write the engine's memory afterwards ({@link LoadGate}).
     */
    public PoolConnector loadDeadline(Duration deadline) {
        budget.fixed(deadline);
        return this;
    }

    /**
     * Gives lookups and loads at most {@code factor} times what recomputing their tokens takes, by the prefill rate
     * measured on the engine's steps (NaN: off, the default; with {@link #loadDeadline}, the shorter holds). A pool
     * that missed a deadline is left alone until a probe of it answers ({@link PoolBreaker}).
     */
    public PoolConnector loadDeadlineFromPrefill(double factor) {
        budget.fromPrefill(factor);
        return this;
    }

    /** Tests: the clock that says when a pool left alone is tried again. */
    void useClock(LongSupplier nanos) {
        clock = nanos;
    }

    /** Lookups answered as misses without asking the pool, while it was left alone after a missed deadline. */
    public long skippedLookups() {
        return budget.skipped();
    }

    /** Block loads abandoned at their deadline so far. */
    public long abandonedLoads() {
        return abandonedLoads.sum();
    }

    private void fail(List<ConnectorMeta.Load> loads) {
        for (ConnectorMeta.Load l : loads) {
            stepLoadErrors.add(l.blockId());
            loadErrors.add(l.blockId());
        }
        failedLoads.add(loads.size());
    }

    @Override
    public void waitForLayerLoad(int layer) {
        step.waitForLayer(layer);
    }

    @Override
    public void saveKvLayer(int layer, PagedKv kv) {
        budget.layerDone(layer, kv.numLayers());
        if (granularity == Granularity.LAYER) {
            saveLayer(layer, kv);
            return;
        }
        if (layer != kv.numLayers() - 1 || savesStarted) {
            return;
        }
        savesStarted = true; // a step's saves start once
        step.settle();
        ConnectorMeta meta = current;
        List<ConnectorMeta.Save> saves = stepSaves(meta);
        if (saves.isEmpty()) {
            return;
        }
        SaveJob job = new SaveJob(saves, meta.generation(), kv, new CompletableFuture<>());
        synchronized (saveLock) {
            for (ConnectorMeta.Save s : saves) {
                pendingSaves.merge(s.requestId(), 1, Integer::sum);
            }
            saving.removeIf(Future::isDone);
            saving.add(job.done());
            queued.add(job);
            if (!saverRunning) {
                saverRunning = true;
                io.submit(this::saverLoop);
            }
        }
    }

    /**
     * BLOCK: stores the queued steps' saves, one at a time, each putBatch taking every step queued
     * behind the first of the same generation and cache (up to {@link #SAVE_BATCH_BYTES}). While one
     * putBatch runs the next steps queue up and go together: a save costs a pool round trip per batch,
     * not per step (one task per step, each under its own write lease, made a 32 KiB-block save 0.27x
     * the restore rate).
     */
    private void saverLoop() {
        while (true) {
            List<SaveJob> batch = new ArrayList<>();
            synchronized (saveLock) {
                SaveJob first = queued.poll();
                if (first == null) {
                    saverRunning = false;
                    return;
                }
                batch.add(first);
                long bytes = first.saves().size() * first.kv().blockBytes();
                while (!queued.isEmpty() && queued.peek().planned() == first.planned() && queued.peek().kv() == first.kv()
                        && bytes + queued.peek().saves().size() * first.kv().blockBytes() <= SAVE_BATCH_BYTES) {
                    SaveJob next = queued.poll();
                    bytes += next.saves().size() * first.kv().blockBytes();
                    batch.add(next);
                }
            }
            List<ConnectorMeta.Save> all = new ArrayList<>();
            for (SaveJob j : batch) {
                all.addAll(j.saves());
            }
            try {
                save(all, batch.getFirst().planned(), batch.getFirst().kv());
            } finally {
                for (SaveJob j : batch) {
                    j.done().complete(null);
                }
            }
        }
    }

    /** LAYER: layer {@code layer} of the step was computed: reserve the saves at the first call, write it. */
    private void saveLayer(int layer, PagedKv kv) {
        if (stepSaves == null) {
            if (savesStarted) {
                return; // this step's saves were planned already (and there were none)
            }
            savesStarted = true;
            ConnectorMeta meta = current;
            List<ConnectorMeta.Save> saves = stepSaves(meta);
            if (saves.isEmpty()) {
                return;
            }
            LayerTransfers.Saves ls = new LayerTransfers.Saves(store, io, saves, kv, meta.generation(),
                    () -> generation, fence, new LayerTransfers.Outcomes() {
                        @Override
                        public void counted(PutStatus p) {
                            count(p, kv);
                        }

                        @Override
                        public void dropped(int n) {
                            droppedSaves.add(n);
                        }

                        @Override
                        public void over() {
                            saveDone(saves);
                        }
                    });
            synchronized (saveLock) {
                for (ConnectorMeta.Save sv : saves) {
                    pendingSaves.merge(sv.requestId(), 1, Integer::sum);
                }
                saving.removeIf(Future::isDone);
                saving.add(ls.done());
            }
            stepSaves = ls;
        }
        int last = kv.numLayers() - 1;
        if (layer >= last) {
            step.settle(); // every load of the step is in: the final word on which saves stand
        }
        stepSaves.through(Math.min(layer, last), keep(stepSaves));
    }

    /** The step's saves worth starting: none while the pool is left alone, none computed over a failed load. */
    private List<ConnectorMeta.Save> stepSaves(ConnectorMeta meta) {
        if (!budget.poolInUse()) {
            skippedSaves.add(meta.saves().size());
            return List.of();
        }
        List<ConnectorMeta.Save> saves = meta.savesNotOverFailedLoads(Set.copyOf(stepLoadErrors));
        droppedSaves.add(meta.saves().size() - saves.size());
        return saves;
    }

    /** Which of the step's saves are still worth writing, given the load errors known now. */
    private boolean[] keep(LayerTransfers.Saves ls) {
        Set<ConnectorMeta.Save> ok = Set.copyOf(current.savesNotOverFailedLoads(Set.copyOf(stepLoadErrors)));
        boolean[] keep = new boolean[ls.saves().size()];
        for (int i = 0; i < keep.length; i++) {
            keep[i] = ok.contains(ls.saves().get(i));
        }
        return keep;
    }

    /** Counts one save's outcome. */
    private void count(PutStatus p, PagedKv kv) {
        switch (p) {
            case OK -> {
                savedBlocks.increment();
                savedBytes.add(kv.blockBytes());
            }
            case ALREADY_EXISTS, POOL_FULL, NO_SEGMENT -> skippedSaves.increment();
            case FENCED, FAILED -> droppedSaves.increment();
        }
    }

    /** These saves are over: their requests may be reported finished. */
    private void saveDone(List<ConnectorMeta.Save> saves) {
        synchronized (saveLock) {
            for (ConnectorMeta.Save s : saves) {
                if (pendingSaves.merge(s.requestId(), -1, Integer::sum) == 0) {
                    pendingSaves.remove(s.requestId());
                    if (finishedWithSaves.remove(s.requestId())) {
                        doneSaving.add(s.requestId());
                    }
                }
            }
        }
    }

    private void save(List<ConnectorMeta.Save> saves, long planned, PagedKv kv) {
        try {
            fence.readLock().lock();
            try {
                if (planned != generation) {
                    droppedSaves.add(saves.size());
                    return;
                }
                List<String> k = new ArrayList<>(saves.size());
                List<MemorySegment> src = new ArrayList<>(saves.size());
                for (ConnectorMeta.Save s : saves) {
                    k.add(s.key());
                    src.add(kv.block(s.blockId()));
                }
                for (PutStatus p : store.putBatch(k, src)) {
                    count(p, kv);
                }
            } finally {
                fence.readLock().unlock();
            }
        } catch (RuntimeException e) {
            log.warn("kvpool save of {} blocks failed: {}", saves.size(), e.toString());
            droppedSaves.add(saves.size());
        } finally {
            saveDone(saves);
        }
    }

    @Override
    public void waitForSave() {
        List<Future<?>> all;
        synchronized (saveLock) {
            all = new ArrayList<>(saving);
        }
        for (Future<?> f : all) {
            try {
                f.get();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return;
            } catch (ExecutionException e) {
                // counted by the save itself
            }
        }
    }

    /** Waits for every save of these requests if any is queued or running (a preemption reuses their blocks). */
    @Override
    public void waitForRequestSaves(Set<String> requestIds) {
        boolean pending = false;
        synchronized (saveLock) {
            for (String id : requestIds) { // a loop, not a stream: the checker sees the lock held here
                pending |= pendingSaves.containsKey(id);
            }
        }
        if (pending) {
            waitForSave();
        }
    }

    @Override
    public Set<String> getFinished(Set<String> finishedRequestIds) {
        synchronized (saveLock) {
            if (doneSaving.isEmpty()) {
                return Set.of();
            }
            Set<String> out = Set.copyOf(doneSaving);
            doneSaving.clear();
            return out;
        }
    }

    @Override
    public Set<Integer> blockIdsWithLoadErrors() {
        step.settle();
        Set<Integer> out = Set.copyOf(loadErrors);
        loadErrors.removeAll(out);
        return out;
    }

    @Override
    public int savesInFlight() {
        synchronized (saveLock) {
            int n = 0;
            for (int blocks : pendingSaves.values()) {
                n += blocks;
            }
            return n;
        }
    }

    @Override
    public ConnectorStats stats() {
        return new ConnectorStats(lookups.sum(), matchedTokens.sum(), loadedBlocks.sum(), loadedBytes.sum(),
                failedLoads.sum(), savedBlocks.sum(), savedBytes.sum(), skippedSaves.sum(), droppedSaves.sum(),
                resets.sum());
    }

    @Override
    public void close() {
        waitForSave();
        io.shutdown();
    }
}
