package io.kvpool.bench;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.atomic.AtomicReference;

/**
 * Runs {@code clients} threads, each repeating one operation for a fixed time after a short warm-up,
 * and collects what they did into a {@link Measurement}. Each client gets its own state from the
 * factory (a connection, buffers) so clients share nothing but the system under test.
 */
public final class Load {

    /** One client's operation. Returns the payload bytes it moved. */
    @FunctionalInterface
    public interface Op {
        long run(int iteration) throws Exception;
    }

    /** Builds one client's operation; closed when the run ends. */
    public interface Client extends AutoCloseable {
        Op op();

        @Override
        default void close() throws Exception {
        }
    }

    @FunctionalInterface
    public interface ClientFactory {
        Client create(int clientIndex) throws Exception;
    }

    private Load() {
    }

    /**
     * Runs the load: every client warms up for {@code warmup}, then all start together and run for
     * {@code duration}; an operation in progress at the end is allowed to finish and is counted.
     */
    public static Measurement run(int clients, Duration warmup, Duration duration, ClientFactory factory) throws Exception {
        List<Client> cs = new ArrayList<>(clients);
        try {
            for (int i = 0; i < clients; i++) {
                cs.add(factory.create(i));
            }
            CyclicBarrier start = new CyclicBarrier(clients + 1);
            long[][] lat = new long[clients][];
            long[] ops = new long[clients];
            long[] bytes = new long[clients];
            AtomicReference<Throwable> failure = new AtomicReference<>();
            long[] window = new long[2];
            List<Thread> threads = new ArrayList<>(clients);
            for (int c = 0; c < clients; c++) {
                int id = c;
                threads.add(Thread.ofPlatform().name("bench-client-" + c).start(() -> {
                    try {
                        Op op = cs.get(id).op();
                        long warmEnd = System.nanoTime() + warmup.toNanos();
                        int it = 0;
                        while (System.nanoTime() < warmEnd) {
                            op.run(it++);
                        }
                        long[] l = new long[1 << 14];
                        int n = 0;
                        long b = 0;
                        start.await();
                        long end = window[1];
                        while (true) {
                            long t0 = System.nanoTime();
                            if (t0 >= end) {
                                break;
                            }
                            b += op.run(it++);
                            if (n == l.length) {
                                l = Arrays.copyOf(l, n * 2);
                            }
                            l[n++] = System.nanoTime() - t0;
                        }
                        lat[id] = Arrays.copyOf(l, n);
                        ops[id] = n;
                        bytes[id] = b;
                    } catch (Throwable t) {
                        failure.compareAndSet(null, t);
                        start.reset();
                    }
                }));
            }
            // everyone warmed up: open the measured window
            while (start.getNumberWaiting() < clients && failure.get() == null) {
                Thread.sleep(1);
            }
            if (failure.get() != null) {
                throw new IllegalStateException("a benchmark client failed: " + failure.get(), failure.get());
            }
            window[0] = System.nanoTime();
            window[1] = window[0] + duration.toNanos();
            start.await();
            long wallEnd = 0;
            for (Thread t : threads) {
                t.join();
            }
            wallEnd = System.nanoTime();
            if (failure.get() != null) {
                throw new IllegalStateException("a benchmark client failed: " + failure.get(), failure.get());
            }
            long totalOps = 0;
            long totalBytes = 0;
            int totalLat = 0;
            for (int c = 0; c < clients; c++) {
                totalOps += ops[c];
                totalBytes += bytes[c];
                totalLat += lat[c].length;
            }
            long[] all = new long[totalLat];
            int pos = 0;
            for (long[] l : lat) {
                System.arraycopy(l, 0, all, pos, l.length);
                pos += l.length;
            }
            return new Measurement(totalOps, totalBytes, wallEnd - window[0], all);
        } finally {
            for (Client c : cs) {
                c.close();
            }
        }
    }
}
