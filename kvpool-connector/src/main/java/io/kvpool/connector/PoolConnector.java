package io.kvpool.connector;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.connector.hash.BlockHash;
import io.kvpool.connector.hash.BlockHasher;
import io.kvpool.connector.hash.KeyFormat;
import io.kvpool.protocol.KeyDigest;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.Arrays;
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
 *       before the reset fails (the engine recomputes) rather than fill a block with old KV.</li>
 *   <li><b>Versioned keys</b> ({@link #switchWeights}): the weight version is part of every key, so
 *       the switch makes all older KV unreachable at once; the same generation bump drops work
 *       planned under the old version, and the old version's objects are removed in the background
 *       ({@code removeByPrefix}), or left to eviction.</li>
 * </ol>
 *
 * <h2>Granularity</h2>
 * A block moves as one object with all its layers, so the first {@link #waitForLayerLoad} waits for
 * the whole step's loads and the last {@link #saveKvLayer} starts the step's saves. (Per-layer
 * objects would let layer 0 compute while later layers load, at the price of one pool object per
 * block per layer; with the pool's loads running at memory or network speed, the whole-block form
 * costs less in metadata and round trips.)
 *
 * <h2>Threads</h2>
 * The scheduler-side methods are called by one scheduler thread and the worker-side ones by one
 * worker thread (they may be the same); loads and saves run on virtual threads of this connector.
 * Saves read the engine's blocks after the step: the engine keeps a finished request's blocks while
 * {@link #requestFinished} says saves are pending, until {@link #getFinished} reports it.
 */
public final class PoolConnector implements KvConnector, VersionedKeys {

    private static final Logger log = LoggerFactory.getLogger(PoolConnector.class);

    /** What to remove on {@link #resetCache()}. */
    public enum ResetScope {
        /** {@code removeAll(force)}: everything in the pool, with puts in flight fenced. The RL default. */
        ALL_FENCED,
        /** {@code removeByPrefix} of this model's keys: other models' KV stays; puts in flight are not fenced by the pool (the connector's generation still drops its own). */
        MODEL
    }

    private final KvPoolClient client;
    private final BlockHasher hasher;
    private final ResetScope resetScope;
    private volatile KeyFormat keys;

    /** Loads and saves hold the read side while they run; resets and weight switches take the write side. */
    private final ReentrantReadWriteLock fence = new ReentrantReadWriteLock();
    private volatile long generation = 1;

    private final ExecutorService io = Executors.newThreadPerTaskExecutor(Thread.ofVirtual().name("kvpool-connector-", 0).factory());

    // scheduler side (scheduler thread; guarded by this)
    @GuardedBy("this")
    private final Map<String, List<BlockHash>> hashes = new HashMap<>();
    /** Per request: its blocks' key digests, under the key format they were made for (see {@link #digestsFor}). */
    @GuardedBy("this")
    private final Map<String, Digests> digests = new HashMap<>();

    /** The digests ({@link KeyDigest}: lo, hi) of a request's first {@code count} block keys in {@code format}. */
    private record Digests(KeyFormat format, long[] values, int count) {
    }
    /** Tokens the engine had when a request was last matched. */
    @GuardedBy("this")
    private final Map<String, Integer> matchedFrom = new HashMap<>();
    @GuardedBy("this")
    private final List<ConnectorMeta.Load> plannedLoads = new ArrayList<>();

    // worker side
    private ConnectorMeta current = ConnectorMeta.EMPTY;
    private Future<?> currentLoad = CompletableFuture.completedFuture(null);
    private boolean loadAwaited = true;
    private final Set<Integer> loadErrors = ConcurrentHashMap.newKeySet();

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
    private volatile long lastLookupWarning;

    /**
     * @param client     the pool client (not closed by this connector)
     * @param hasher     block size and hash seed; the engine's block size must equal it
     * @param keys       model, weight version, ranks and dtype of this engine's KV
     * @param resetScope what {@link #resetCache()} removes
     */
    public PoolConnector(KvPoolClient client, BlockHasher hasher, KeyFormat keys, ResetScope resetScope) {
        this.client = Objects.requireNonNull(client, "client");
        this.hasher = Objects.requireNonNull(hasher, "hasher");
        this.keys = Objects.requireNonNull(keys, "keys");
        this.resetScope = Objects.requireNonNull(resetScope, "resetScope");
    }

    public KeyFormat keys() {
        return keys;
    }

    public long generation() {
        return generation;
    }

    // ---------------------------------------------------------------- scheduler side

    private synchronized List<BlockHash> hashesFor(ConnectorRequest r) {
        List<BlockHash> h = hashes.get(r.id());
        int full = hasher.fullBlocks(r.numTokens());
        if (h == null || h.size() < full) {
            List<BlockHash> grown = h == null ? new ArrayList<>(full) : new ArrayList<>(h);
            BlockHash parent = grown.isEmpty() ? hasher.root() : grown.getLast();
            for (int b = grown.size(); b < full; b++) {
                parent = hasher.next(parent, r.tokens(), b * hasher.blockSize(), r.extraKeysFor(b));
                grown.add(parent);
            }
            hashes.put(r.id(), grown);
            h = grown;
        }
        return h;
    }

    /**
     * The key digests of the request's first {@code full} blocks in format {@code k}, computed once per
     * block: the scheduler asks about a waiting request at every step, and digesting a long prompt's
     * keys costs about as much as the lookup's round trip.
     */
    private synchronized long[] digestsFor(ConnectorRequest r, List<BlockHash> h, int full, KeyFormat k) {
        Digests d = digests.get(r.id());
        if (d != null && d.format == k && d.count >= full) {
            return d.values;
        }
        int known = d != null && d.format == k ? d.count : 0;
        long[] values = d != null && d.format == k ? Arrays.copyOf(d.values, 2 * full) : new long[2 * full];
        for (int b = known; b < full; b++) {
            byte[] key = k.key(h.get(b));
            KeyDigest.digest(key, 0, key.length, values, 2 * b);
        }
        digests.put(r.id(), new Digests(k, values, full));
        return values;
    }

    @Override
    public Match getNumNewMatchedTokens(ConnectorRequest request, int numComputedTokens) {
        lookups.increment();
        int bs = hasher.blockSize();
        List<BlockHash> h = hashesFor(request);
        int full = hasher.fullBlocks(request.numTokens());
        int start = numComputedTokens / bs;
        if (start >= full) {
            return Match.NONE;
        }
        long[] d = digestsFor(request, h, full, keys);
        int present;
        try {
            present = client.prefixMatchDigests(d, start, full);
        } catch (RuntimeException e) {
            long now = System.nanoTime();
            if (now - lastLookupWarning > 10_000_000_000L) {
                lastLookupWarning = now;
                log.warn("kvpool lookup failed ({}); treating as a miss (logged at most every 10 s)", e.toString());
            }
            return Match.NONE;
        }
        int tokens = (start + present) * bs - numComputedTokens;
        if (tokens <= 0) {
            return Match.NONE;
        }
        synchronized (this) {
            matchedFrom.put(request.id(), numComputedTokens);
        }
        matchedTokens.add(tokens);
        return new Match(tokens, false);
    }

    @Override
    public synchronized void updateStateAfterAlloc(ConnectorRequest request, int[] blockIds, int numExternalTokens) {
        Integer computed = matchedFrom.remove(request.id());
        if (numExternalTokens <= 0 || computed == null) {
            return;
        }
        int bs = hasher.blockSize();
        if ((computed + numExternalTokens) % bs != 0) {
            throw new IllegalArgumentException("request " + request.id() + ": " + computed + " computed plus "
                    + numExternalTokens + " external tokens do not end on a block boundary (block size " + bs + ")");
        }
        List<BlockHash> h = hashesFor(request);
        int start = computed / bs; // a partly computed first block is loaded whole: same bytes
        int end = (computed + numExternalTokens) / bs;
        if (end > h.size() || end > blockIds.length) {
            throw new IllegalArgumentException("request " + request.id() + ": " + numExternalTokens
                    + " external tokens after " + computed + " need " + end + " blocks; it has " + blockIds.length
                    + " allocated and " + h.size() + " full");
        }
        KeyFormat k = keys;
        for (int b = start; b < end; b++) {
            plannedLoads.add(new ConnectorMeta.Load(request.id(), blockIds[b], b, k.keyString(h.get(b))));
        }
    }

    @Override
    public synchronized ConnectorMeta buildConnectorMeta(List<ScheduledRequest> scheduled) {
        int bs = hasher.blockSize();
        KeyFormat k = keys;
        List<ConnectorMeta.Save> saves = new ArrayList<>();
        for (ScheduledRequest s : scheduled) {
            int firstNew = s.computedBefore() / bs; // a block partly computed before may fill now
            int filled = s.computedAfter() / bs;
            if (filled <= firstNew) {
                continue;
            }
            if (s.computedAfter() > s.request().numTokens()) {
                throw new IllegalArgumentException("request " + s.request().id() + ": " + s.computedAfter()
                        + " tokens computed but only " + s.request().numTokens() + " known");
            }
            List<BlockHash> h = hashesFor(s.request());
            for (int b = firstNew; b < filled && b < s.blockIds().length; b++) {
                saves.add(new ConnectorMeta.Save(s.request().id(), s.blockIds()[b], b, k.keyString(h.get(b))));
            }
        }
        ConnectorMeta meta = new ConnectorMeta(List.copyOf(plannedLoads), saves, generation);
        plannedLoads.clear();
        return meta;
    }

    @Override
    public boolean requestFinished(ConnectorRequest request, int[] blockIds) {
        synchronized (this) {
            hashes.remove(request.id());
            digests.remove(request.id());
            matchedFrom.remove(request.id());
        }
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
            synchronized (this) {
                plannedLoads.clear();
                matchedFrom.clear();
            }
            long removed = switch (resetScope) {
                case ALL_FENCED -> client.removeAll(true);
                case MODEL -> client.removeByPrefix(KeyFormat.modelPrefix(keys.model()));
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
            synchronized (this) {
                plannedLoads.clear();
                matchedFrom.clear();
                hashes.clear();
                digests.clear();
            }
            oldPrefix = old.versionPrefix();
        } finally {
            fence.writeLock().unlock();
        }
        if (!reclaim || oldPrefix.equals(keys.versionPrefix())) {
            return CompletableFuture.completedFuture(0L);
        }
        return CompletableFuture.supplyAsync(() -> {
            long n = client.removeByPrefix(oldPrefix);
            log.info("kvpool connector: reclaimed {} objects of {}", n, oldPrefix);
            return n;
        }, io);
    }

    // ---------------------------------------------------------------- worker side

    @Override
    public void startLoadKv(ConnectorMeta meta, PagedKv kv) {
        current = meta;
        loadErrors.clear();
        if (meta.loads().isEmpty()) {
            currentLoad = CompletableFuture.completedFuture(null);
        } else {
            currentLoad = io.submit(() -> load(meta, kv));
        }
        loadAwaited = false;
    }

    private void load(ConnectorMeta meta, PagedKv kv) {
        fence.readLock().lock();
        try {
            if (meta.generation() != generation) {
                fail(meta.loads()); // planned before a reset: the KV it names is gone or stale
                return;
            }
            List<String> k = new ArrayList<>(meta.loads().size());
            List<MemorySegment> dst = new ArrayList<>(meta.loads().size());
            for (ConnectorMeta.Load l : meta.loads()) {
                k.add(l.key());
                dst.add(kv.block(l.blockId()));
            }
            long[] got;
            try {
                got = client.getIntoBatch(k, dst);
            } catch (RuntimeException e) {
                log.warn("kvpool load of {} blocks failed: {}", k.size(), e.toString());
                fail(meta.loads());
                return;
            }
            for (int i = 0; i < got.length; i++) {
                if (got[i] != kv.blockBytes()) {
                    loadErrors.add(meta.loads().get(i).blockId());
                    failedLoads.increment();
                } else {
                    loadedBlocks.increment();
                    loadedBytes.add(got[i]);
                }
            }
        } finally {
            fence.readLock().unlock();
        }
    }

    private void fail(List<ConnectorMeta.Load> loads) {
        for (ConnectorMeta.Load l : loads) {
            loadErrors.add(l.blockId());
        }
        failedLoads.add(loads.size());
    }

    @Override
    public void waitForLayerLoad(int layer) {
        if (loadAwaited) {
            return;
        }
        loadAwaited = true;
        try {
            currentLoad.get();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            fail(current.loads());
        } catch (ExecutionException e) {
            log.warn("kvpool load failed: {}", e.getCause().toString());
            fail(current.loads());
        }
    }

    @Override
    public void saveKvLayer(int layer, PagedKv kv) {
        if (layer != kv.numLayers() - 1 || current.saves().isEmpty()) {
            return;
        }
        waitForLayerLoad(0); // the step's loads have settled: their failures are known
        List<ConnectorMeta.Save> kept = current.savesWithoutFailedLoads(Set.copyOf(loadErrors));
        droppedSaves.add(current.saves().size() - kept.size());
        if (kept.isEmpty()) {
            return;
        }
        ConnectorMeta meta = new ConnectorMeta(current.loads(), kept, current.generation());
        synchronized (saveLock) {
            for (ConnectorMeta.Save s : meta.saves()) {
                pendingSaves.merge(s.requestId(), 1, Integer::sum);
            }
            saving.removeIf(Future::isDone);
            saving.add(io.submit(() -> save(meta, kv)));
        }
    }

    private void save(ConnectorMeta meta, PagedKv kv) {
        try {
            fence.readLock().lock();
            try {
                if (meta.generation() != generation) {
                    droppedSaves.add(meta.saves().size());
                    return;
                }
                List<String> k = new ArrayList<>(meta.saves().size());
                List<MemorySegment> src = new ArrayList<>(meta.saves().size());
                for (ConnectorMeta.Save s : meta.saves()) {
                    k.add(s.key());
                    src.add(kv.block(s.blockId()));
                }
                List<PutStatus> st = client.putBatch(k, src);
                for (PutStatus p : st) {
                    switch (p) {
                        case OK -> {
                            savedBlocks.increment();
                            savedBytes.add(kv.blockBytes());
                        }
                        case ALREADY_EXISTS, POOL_FULL, NO_SEGMENT -> skippedSaves.increment();
                        case FENCED, FAILED -> droppedSaves.increment();
                    }
                }
            } finally {
                fence.readLock().unlock();
            }
        } catch (RuntimeException e) {
            log.warn("kvpool save of {} blocks failed: {}", meta.saves().size(), e.toString());
            droppedSaves.add(meta.saves().size());
        } finally {
            synchronized (saveLock) {
                for (ConnectorMeta.Save s : meta.saves()) {
                    if (pendingSaves.merge(s.requestId(), -1, Integer::sum) == 0) {
                        pendingSaves.remove(s.requestId());
                        if (finishedWithSaves.remove(s.requestId())) {
                            doneSaving.add(s.requestId());
                        }
                    }
                }
            }
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
