package io.kvpool.client;

import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.function.ToLongFunction;

/**
 * Work split by segment: a batch's items grouped per segment run as one task each, in parallel on
 * virtual threads where the caller's memory allows it; and node frames cut to the item and payload
 * limits.
 */
final class PerSegment implements AutoCloseable {

    /** Most objects in one node frame. */
    static final int MAX_ITEMS_PER_NODE_FRAME = 4096;

    /** One segment's share of a batch. */
    interface Task<T> {
        void run(int segmentId, List<T> slots);
    }

    /** A thread that never runs: a segment accessible by it is accessible by any worker thread. */
    private static final Thread ANY_OTHER_THREAD = Thread.ofVirtual().unstarted(() -> { });

    private final ExecutorService workers = Executors.newVirtualThreadPerTaskExecutor();

    /** True when every segment can be touched by worker threads (heap, global, auto and shared arenas). */
    static boolean shareable(List<MemorySegment> segments) {
        for (MemorySegment s : segments) {
            if (s != null && !s.isAccessibleBy(ANY_OTHER_THREAD)) {
                return false;
            }
        }
        return true;
    }

    /**
     * Runs one task per segment: on virtual threads when there are several and the caller's memory
     * allows it, otherwise one after another on the calling thread (memory from a confined arena can
     * only be touched by its owner).
     */
    <T> void run(Map<Integer, List<T>> bySegment, boolean parallelOk, Task<T> task) {
        if (bySegment.size() == 1 || !parallelOk) {
            for (Map.Entry<Integer, List<T>> e : bySegment.entrySet()) {
                task.run(e.getKey(), e.getValue());
            }
            return;
        }
        List<Future<?>> futures = new ArrayList<>(bySegment.size());
        for (Map.Entry<Integer, List<T>> e : bySegment.entrySet()) {
            futures.add(workers.submit(() -> task.run(e.getKey(), e.getValue())));
        }
        for (Future<?> f : futures) {
            try {
                f.get();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new KvPoolException("interrupted", e);
            } catch (ExecutionException e) {
                if (e.getCause() instanceof RuntimeException re) {
                    throw re;
                }
                throw new KvPoolException(e.getCause().toString(), e.getCause());
            }
        }
    }

    /**
     * Where the node frame starting at {@code start} ends: at most {@link #MAX_ITEMS_PER_NODE_FRAME}
     * items and {@code maxBytes} of payload (a single value over it still goes, alone).
     */
    static <T> int frameEnd(List<T> slots, int start, ToLongFunction<T> length, long maxBytes) {
        int end = start;
        long payload = 0;
        while (end < slots.size() && end - start < MAX_ITEMS_PER_NODE_FRAME) {
            long len = length.applyAsLong(slots.get(end));
            if (end > start && payload + len > maxBytes) {
                break;
            }
            payload += len;
            end++;
        }
        return end;
    }

    @Override
    public void close() {
        workers.shutdownNow();
    }
}
