package io.kvpool.connector;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.locks.ReentrantReadWriteLock;
import java.util.function.LongSupplier;

/**
 * One step's loads on the worker side of {@link PoolConnector}: started on the connector's I/O threads, waited
 * for by the engine's thread (all of them, or layer by layer), and given up on at their deadline
 * ({@link LoadGate}). Engine thread only but for the load itself.
 *
 * <p>What it reports goes through {@link Outcome}: loaded blocks and bytes, and loads that failed (a block
 * missing or short, a call that threw, the step planned before a reset, the deadline passed). A load that was
 * abandoned reports nothing more, however late it ends.
 */
final class StepLoad {

    private static final Logger log = LoggerFactory.getLogger(StepLoad.class);

    /** Where a step's load reports to. */
    interface Outcome {
        void failed(List<ConnectorMeta.Load> loads);

        void loaded(long blocks, long bytes);

        /** {@code blocks} loads passed their deadline; {@code probe} makes them again (off the engine's path). */
        void abandoned(int blocks, PoolBreaker.Probe probe);
    }

    /** What a load needs of its connector. */
    record Context(PoolStore store, ExecutorService io, ReentrantReadWriteLock fence, LongSupplier generation,
                   Outcome outcome) {
    }

    private final ConnectorMeta meta;
    private final LoadGate gate;
    private final Future<?> running;
    /** LAYER: layer l's loads are in (or failed) once {@code layers[l]} completes; empty for BLOCK. */
    private final CompletableFuture<?>[] layers;
    private final Outcome outcome;
    private final PoolStore store;
    private final long blockBytes;
    private final long deadlineNanos;
    private boolean awaited;

    private StepLoad(ConnectorMeta meta, LoadGate gate, Future<?> running, CompletableFuture<?>[] layers,
                     Outcome outcome, boolean awaited, PoolStore store, long blockBytes, long deadlineNanos) {
        this.meta = meta;
        this.gate = gate;
        this.running = running;
        this.layers = layers;
        this.outcome = outcome;
        this.awaited = awaited;
        this.store = store;
        this.blockBytes = blockBytes;
        this.deadlineNanos = deadlineNanos;
    }

    /** A step without loads. */
    static StepLoad none(ConnectorMeta meta, Outcome outcome) {
        return new StepLoad(meta, new LoadGate(-1), CompletableFuture.completedFuture(null), new CompletableFuture<?>[0],
                outcome, true, null, 0, -1);
    }

    /** Starts the step's loads; {@code deadlineNanos}: how long they may take (-1: no limit). */
    static StepLoad start(ConnectorMeta meta, PagedKv kv, PoolConnector.Granularity granularity, long deadlineNanos,
                          Context ctx) {
        if (meta.loads().isEmpty()) {
            return none(meta, ctx.outcome());
        }
        LoadGate gate = new LoadGate(deadlineNanos < 0 ? -1 : System.nanoTime() + deadlineNanos);
        if (granularity == PoolConnector.Granularity.LAYER) {
            CompletableFuture<?>[] layers = new CompletableFuture<?>[kv.numLayers()];
            for (int l = 0; l < layers.length; l++) {
                layers[l] = new CompletableFuture<Void>();
            }
            return new StepLoad(meta, gate, ctx.io().submit(() -> byLayer(meta, kv, layers, gate, ctx)), layers,
                    ctx.outcome(), false, ctx.store(), kv.blockBytes(), deadlineNanos);
        }
        return new StepLoad(meta, gate, ctx.io().submit(() -> whole(meta, kv, gate, ctx)), new CompletableFuture<?>[0],
                ctx.outcome(), false, ctx.store(), kv.blockBytes(), deadlineNanos);
    }

    /** LAYER: the step's loads, a layer at a time ({@link LayerTransfers#load}), under the fence. */
    private static void byLayer(ConnectorMeta meta, PagedKv kv, CompletableFuture<?>[] layers, LoadGate gate,
                                Context ctx) {
        ctx.fence().readLock().lock();
        try {
            if (gate.abandoned()) {
                return;
            }
            if (meta.generation() != ctx.generation().getAsLong()) {
                gate.land(() -> ctx.outcome().failed(meta.loads()), true);
                return;
            }
            List<ConnectorMeta.Load> bad = LayerTransfers.load(ctx.store(), meta.loads(), kv, layers, gate);
            gate.land(() -> {
                int good = meta.loads().size() - bad.size();
                ctx.outcome().loaded(good, good * kv.blockBytes());
                ctx.outcome().failed(bad);
            }, true);
        } finally {
            ctx.fence().readLock().unlock();
            for (CompletableFuture<?> f : layers) {
                f.complete(null); // a load that stopped early releases every layer's waiter
            }
        }
    }

    /** BLOCK: the step's loads in one batch, under the fence. */
    private static void whole(ConnectorMeta meta, PagedKv kv, LoadGate gate, Context ctx) {
        if (gate.abandoned()) {
            return; // its step gave up on it while it waited
        }
        Outcome out = ctx.outcome();
        ctx.fence().readLock().lock();
        try (Arena arena = Arena.ofConfined()) {
            if (meta.generation() != ctx.generation().getAsLong()) {
                gate.land(() -> out.failed(meta.loads()), true); // planned before a reset: the KV it names is stale
                return;
            }
            List<String> k = new ArrayList<>(meta.loads().size());
            List<MemorySegment> dst = new ArrayList<>(meta.loads().size());
            for (ConnectorMeta.Load l : meta.loads()) {
                k.add(l.key());
                dst.add(kv.block(l.blockId()));
            }
            List<MemorySegment> into = gate.staged(dst, arena);
            long[] got;
            try {
                got = ctx.store().getIntoBatch(k, into);
            } catch (RuntimeException e) {
                log.warn("kvpool load of {} blocks failed: {}", k.size(), e.toString());
                gate.land(() -> out.failed(meta.loads()), true);
                return;
            }
            boolean[] ok = new boolean[got.length];
            for (int i = 0; i < got.length; i++) {
                ok[i] = got[i] == kv.blockBytes();
            }
            gate.land(() -> {
                gate.copyBack(into, dst, ok);
                List<ConnectorMeta.Load> bad = new ArrayList<>();
                long blocks = 0;
                long bytes = 0;
                for (int i = 0; i < ok.length; i++) {
                    if (ok[i]) {
                        blocks++;
                        bytes += got[i];
                    } else {
                        bad.add(meta.loads().get(i));
                    }
                }
                out.loaded(blocks, bytes);
                out.failed(bad);
            }, true);
        } finally {
            ctx.fence().readLock().unlock();
        }
    }

    /** Returns once layer {@code layer} is in or failed (BLOCK: every layer, at the first); at most the deadline. */
    void waitForLayer(int layer) {
        if (awaited || layers.length == 0) {
            settle();
            return;
        }
        try {
            layers[Math.max(0, Math.min(layer, layers.length - 1))].get(gate.remainingNanos(), TimeUnit.NANOSECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            settle();
        } catch (ExecutionException e) {
            settle(); // the load itself reports what failed
        } catch (TimeoutException e) {
            abandon();
            awaited = true; // nothing of it will be waited for
            for (CompletableFuture<?> f : layers) {
                f.complete(null);
            }
        }
        if (layer >= layers.length - 1) {
            settle();
        }
    }

    /** Waits for every load of the step (at most until the deadline, then abandons them). */
    void settle() {
        if (awaited) {
            return;
        }
        awaited = true;
        try {
            running.get(gate.remainingNanos(), TimeUnit.NANOSECONDS);
        } catch (TimeoutException e) {
            abandon();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            outcome.failed(meta.loads());
        } catch (ExecutionException e) {
            log.warn("kvpool load failed: {}", e.getCause().toString());
            outcome.failed(meta.loads());
        }
    }

    /**
     * A probe of a pool left alone after {@code loads} were abandoned: the same loads into scratch memory; true when
     * they came back within the deadline they missed (a link that is only slow still misses it).
     */
    static boolean again(PoolStore store, List<ConnectorMeta.Load> loads, long blockBytes, long deadlineNanos) {
        List<String> keys = loads.stream().map(ConnectorMeta.Load::key).toList();
        try (Arena a = Arena.ofConfined()) {
            List<MemorySegment> dst = keys.stream().map(k -> a.allocate(blockBytes)).toList();
            long t0 = System.nanoTime();
            store.getIntoBatch(keys, dst);
            return deadlineNanos < 0 || System.nanoTime() - t0 <= deadlineNanos;
        }
    }

    /** The deadline passed: the loads fail unless they landed already. */
    private void abandon() {
        if (gate.abandon()) {
            outcome.failed(meta.loads());
            List<ConnectorMeta.Load> loads = meta.loads();
            outcome.abandoned(loads.size(), () -> again(store, loads, blockBytes, deadlineNanos));
            log.warn("kvpool: {} block loads passed their deadline; the engine recomputes them", meta.loads().size());
        }
    }
}
