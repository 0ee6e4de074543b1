package io.kvpool.connector;

import io.kvpool.client.PutStatus;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;
import java.util.concurrent.locks.ReadWriteLock;
import java.util.function.LongSupplier;

/**
 * The layer-by-layer half of {@link PoolConnector} ({@link PoolConnector.Granularity#LAYER}). A block
 * is one pool object, layer-major, so layer l of a block is the range
 * {@code [l * layerBytes, (l + 1) * layerBytes)} of its value:
 * <ul>
 *   <li>{@link #load}: the step's blocks are located once, then layer 0 of every block is read in one
 *       ranged read, then layer 1, ...; the engine's wait for layer l ends when layer l is in.</li>
 *   <li>{@link Saves}: the step's saves are reserved at the first layer saved and written in parts, a
 *       layer at a time as the engine computes it, in layer order on the connector's threads, and made
 *       visible after the last layer.</li>
 * </ul>
 */
final class LayerTransfers {

    private static final Logger log = LoggerFactory.getLogger(LayerTransfers.class);

    private LayerTransfers() {
    }

    /**
     * Reads {@code loads} into their blocks a layer at a time, completing {@code layers[l]} as layer l
     * is in. Returns the loads that failed: a block missing, of another size, or one of whose ranges
     * missed (the engine recomputes it).
     */
    static List<ConnectorMeta.Load> load(PoolStore store, List<ConnectorMeta.Load> loads, PagedKv kv,
                                         CompletableFuture<?>[] layers, LoadGate gate) {
        int n = loads.size();
        List<String> k = new ArrayList<>(n);
        for (ConnectorMeta.Load l : loads) {
            k.add(l.key());
        }
        long layerBytes = kv.blockBytes() / kv.numLayers();
        boolean[] failed = new boolean[n];
        try {
            PoolStore.Ranges at = store.locate(k);
            for (int i = 0; i < n; i++) {
                failed[i] = at.valueLength(i) != kv.blockBytes();
            }
            for (int layer = 0; layer < layers.length; layer++) {
                if (gate.abandoned()) {
                    Arrays.fill(failed, true);
                    break;
                }
                long[] offsets = new long[n];
                List<MemorySegment> dst = new ArrayList<>(n);
                for (int i = 0; i < n; i++) {
                    // a block that failed reads nothing more (an empty range of an object that is there)
                    offsets[i] = failed[i] ? 0 : layer * layerBytes;
                    dst.add(kv.block(loads.get(i).blockId()).asSlice(layer * layerBytes, failed[i] ? 0 : layerBytes));
                }
                try (Arena arena = Arena.ofConfined()) {
                    List<MemorySegment> into = gate.staged(dst, arena);
                    long[] got = at.read(offsets, into);
                    boolean[] ok = new boolean[n];
                    for (int i = 0; i < n; i++) {
                        ok[i] = dst.get(i).byteSize() != 0 && got[i] == dst.get(i).byteSize();
                        failed[i] |= !ok[i];
                    }
                    if (!gate.land(() -> gate.copyBack(into, dst, ok), false)) {
                        Arrays.fill(failed, true); // abandoned: nothing of it reaches the blocks
                        break;
                    }
                }
                layers[layer].complete(null);
            }
        } catch (RuntimeException e) {
            log.warn("kvpool layer-by-layer load of {} blocks failed: {}", n, e.toString());
            Arrays.fill(failed, true);
        }
        List<ConnectorMeta.Load> bad = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            if (failed[i]) {
                bad.add(loads.get(i));
            }
        }
        return bad;
    }

    /** What a step's saves report to the connector. */
    interface Outcomes {
        /** One save's final status. */
        void counted(PutStatus status);

        /** {@code n} saves dropped without a status (the generation moved, or the begin failed). */
        void dropped(int n);

        /** The saves are over (every status counted): their requests may be reported finished. */
        void over();
    }

    /**
     * A step's saves in parts. Blocks of a request whose load failed are not written from then on
     * ({@code keep}), so they fail at the finish and nothing of them becomes visible: a failed load
     * voids what was computed over it. A reset between the begin and the finish either comes before
     * the finish (which then sees the generation moved and abandons) or after it (and removes what it
     * stored): the finish holds the connector's fence.
     */
    static final class Saves {
        private final PoolStore store;
        private final Executor io;
        private final List<ConnectorMeta.Save> saves;
        private final PagedKv kv;
        private final long planned;
        private final LongSupplier generation;
        private final ReadWriteLock fence;
        private final Outcomes outcomes;
        private final long layerBytes;
        private final CompletableFuture<Void> done = new CompletableFuture<>();
        /** The begin, then each layer's write, chained in order; null once finishing (worker thread only). */
        private CompletableFuture<PoolStore.Parts> chain;
        private int nextLayer;

        Saves(PoolStore store, Executor io, List<ConnectorMeta.Save> saves, PagedKv kv, long planned,
              LongSupplier generation, ReadWriteLock fence, Outcomes outcomes) {
            this.store = store;
            this.io = io;
            this.saves = saves;
            this.kv = kv;
            this.planned = planned;
            this.generation = generation;
            this.fence = fence;
            this.outcomes = outcomes;
            this.layerBytes = kv.blockBytes() / kv.numLayers();
            List<String> k = new ArrayList<>(saves.size());
            for (ConnectorMeta.Save sv : saves) {
                k.add(sv.key());
            }
            long[] lengths = new long[saves.size()];
            Arrays.fill(lengths, kv.blockBytes());
            chain = CompletableFuture.supplyAsync(() -> planned == generation.getAsLong() ? store.beginPut(k, lengths)
                    : null, io);
        }

        List<ConnectorMeta.Save> saves() {
            return saves;
        }

        /** Completes when the saves are over (finished or abandoned). */
        CompletableFuture<Void> done() {
            return done;
        }

        /**
         * Layers up to {@code layer} were computed: queues the writes of those not queued yet, and the
         * finish after the last layer. Repeated calls for layers already queued do nothing.
         */
        void through(int layer, boolean[] keep) {
            if (chain == null) {
                return;
            }
            for (; nextLayer <= layer; nextLayer++) {
                write(nextLayer, keep);
            }
            if (nextLayer == kv.numLayers()) {
                finish(keep);
            }
        }

        /** The step ended without its last layer saved: finishes what was written (the rest fails). */
        void finishEarly(boolean[] keep) {
            if (chain != null) {
                finish(keep);
            }
        }

        private void write(int layer, boolean[] keep) {
            chain = chain.thenApplyAsync(parts -> {
                if (parts == null) {
                    return null;
                }
                int n = 0;
                for (boolean b : keep) {
                    n += b ? 1 : 0;
                }
                int[] items = new int[n];
                long[] offsets = new long[n];
                List<MemorySegment> src = new ArrayList<>(n);
                for (int i = 0, j = 0; i < keep.length; i++) {
                    if (keep[i]) {
                        items[j] = i;
                        offsets[j++] = layer * layerBytes;
                        src.add(kv.block(saves.get(i).blockId()).asSlice(layer * layerBytes, layerBytes));
                    }
                }
                parts.write(items, offsets, src);
                return parts;
            }, io);
        }

        private void finish(boolean[] keep) {
            chain.thenAcceptAsync(parts -> {
                if (parts == null) {
                    outcomes.dropped(saves.size());
                    return;
                }
                fence.readLock().lock();
                try {
                    if (planned != generation.getAsLong()) {
                        parts.abandon();
                        outcomes.dropped(saves.size());
                        return;
                    }
                    List<PutStatus> st = parts.finish();
                    for (int i = 0; i < st.size(); i++) {
                        outcomes.counted(keep[i] ? st.get(i) : PutStatus.FAILED);
                    }
                } finally {
                    fence.readLock().unlock();
                }
            }, io).whenComplete((v, e) -> {
                if (e != null) {
                    log.warn("kvpool layer-by-layer save of {} blocks failed: {}", saves.size(), e.toString());
                    outcomes.dropped(saves.size());
                }
                outcomes.over();
                done.complete(null);
            });
            chain = null;
        }
    }
}
