package io.kvpool.client;

import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.SynchronousQueue;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.IntConsumer;
import java.util.function.ToLongFunction;

/**
 * Work split by segment: a batch's items grouped per segment run as one task each, in parallel where
 * the caller's memory allows it; a segment's share cut into parts that a few threads take in turn
 * ({@link #runParts}); and node frames cut to the item and payload limits.
 *
 * <p>The helper threads are platform threads, kept for a minute when idle: they move bytes through
 * blocking sockets, which a virtual thread does through the poller, and the JDK leaves a socket a
 * virtual thread used in non-blocking mode for good. Measured with 16 x 1 MiB batches split over 4
 * connections: virtual lanes took twice the client CPU per byte of platform ones (560 against 280 ms
 * per GiB). At most {@link #MAX_HELPERS} run at once; beyond that, segment tasks run on virtual
 * threads and parts are taken by the threads already at work.
 */
final class PerSegment implements AutoCloseable {

    /** Most objects in one node frame. */
    static final int MAX_ITEMS_PER_NODE_FRAME = 4096;
    /** Most platform helper threads of one client. */
    static final int MAX_HELPERS = 64;

    /** One segment's share of a batch. */
    interface Task<T> {
        void run(int segmentId, List<T> slots);
    }

    /** A thread that never runs: a segment accessible by it is accessible by any worker thread. */
    private static final Thread ANY_OTHER_THREAD = Thread.ofVirtual().unstarted(() -> { });

    private final ThreadPoolExecutor helpers = new ThreadPoolExecutor(0, MAX_HELPERS, 60, TimeUnit.SECONDS,
            new SynchronousQueue<>(), r -> {
                Thread t = new Thread(r, "kvpool-client-io");
                t.setDaemon(true);
                return t;
            });
    private final ExecutorService overflow = Executors.newVirtualThreadPerTaskExecutor();

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
     * Runs one task per segment: on helper threads when there are several and the caller's memory
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
            Runnable r = () -> task.run(e.getKey(), e.getValue());
            Future<?> f;
            try {
                f = helpers.submit(r);
            } catch (RejectedExecutionException busy) {
                f = overflow.submit(r);
            }
            futures.add(f);
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
     * Runs {@code part.accept(0 .. parts - 1)} on up to {@code lanes} threads (the caller and helper
     * threads), each taking the next part not yet taken, so parts start in order. Returns when all
     * ran; the first exception of any part is rethrown (parts not started by then are skipped).
     */
    void runParts(int parts, int lanes, IntConsumer part) {
        int n = Math.min(parts, lanes);
        if (n <= 1) {
            for (int p = 0; p < parts; p++) {
                part.accept(p);
            }
            return;
        }
        AtomicInteger next = new AtomicInteger();
        AtomicReference<Throwable> failure = new AtomicReference<>();
        Runnable lane = () -> {
            int p;
            while (failure.get() == null && (p = next.getAndIncrement()) < parts) {
                try {
                    part.accept(p);
                } catch (Throwable t) {
                    failure.compareAndSet(null, t);
                }
            }
        };
        List<Future<?>> others = new ArrayList<>(n - 1);
        for (int l = 1; l < n; l++) {
            try {
                others.add(helpers.submit(lane));
            } catch (RejectedExecutionException busy) {
                break; // the lanes already running take the rest
            }
        }
        lane.run();
        boolean interrupted = false;
        for (Future<?> f : others) {
            while (true) {
                try {
                    f.get();
                    break;
                } catch (InterruptedException e) {
                    interrupted = true; // the lanes use the caller's memory: wait for them to finish
                } catch (ExecutionException e) {
                    failure.compareAndSet(null, e.getCause());
                    break;
                }
            }
        }
        if (interrupted) {
            Thread.currentThread().interrupt();
        }
        Throwable t = failure.get();
        if (t instanceof RuntimeException re) {
            throw re;
        }
        if (t instanceof Error err) {
            throw err;
        }
        if (t != null) {
            throw new KvPoolException(t.toString(), t);
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
        helpers.shutdownNow();
        overflow.shutdownNow();
    }
}
