package io.kvpool.bench.baseline;

import io.kvpool.bench.Load;
import io.kvpool.bench.Measurement;
import io.kvpool.bench.StoreTarget;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.time.Duration;
import java.util.SplittableRandom;

/**
 * The ceiling of the same-machine data path: a plain {@link MemorySegment#copy} between native
 * memory, with no store, lookup or IPC. All clients share one 1 GiB source region (filled once, so
 * its pages are committed); each has a native buffer of the value size. A get copies the value size
 * from a random 4 KiB-aligned offset of the source into the client's buffer, a put copies the
 * client's buffer to a random offset of the source; the region is far bigger than the caches, so
 * this measures memory bandwidth, not cache bandwidth.
 */
public final class MemcpyTarget implements StoreTarget {

    /** Size of the shared source region. */
    public static final long REGION_BYTES = 1L << 30;
    static final long ALIGN = 4096;

    private final Arena arena = Arena.ofShared();
    private final MemorySegment region;
    private int run;

    public MemcpyTarget() {
        this(REGION_BYTES);
    }

    /** A smaller region, for tests. */
    MemcpyTarget(long regionBytes) {
        region = arena.allocate(regionBytes, ALIGN);
        region.fill((byte) 0x5a); // touch every page now, not during the measurement
    }

    @Override
    public String name() {
        return "memcpy";
    }

    @Override
    public Measurement put(int valueSize, int clients, Duration warmup, Duration duration) throws Exception {
        return run(true, valueSize, clients, warmup, duration);
    }

    @Override
    public Measurement get(int valueSize, int clients, Duration warmup, Duration duration) throws Exception {
        return run(false, valueSize, clients, warmup, duration);
    }

    private Measurement run(boolean put, int valueSize, int clients, Duration warmup, Duration duration) throws Exception {
        if (valueSize <= 0 || valueSize > region.byteSize()) {
            throw new IllegalArgumentException("value size must be in 1.." + region.byteSize() + ": " + valueSize);
        }
        int r = ++run;
        long slots = (region.byteSize() - valueSize) / ALIGN + 1; // aligned offsets where a value fits
        return Load.run(clients, warmup, duration, id -> new Load.Client() {
            final Arena own = Arena.ofShared(); // built on the runner's thread, used on the client's
            final MemorySegment buffer = own.allocate(valueSize, 64).fill((byte) id);
            final SplittableRandom rnd = new SplittableRandom(1_000_003L * r + id);

            @Override
            public Load.Op op() {
                if (put) {
                    return i -> {
                        MemorySegment.copy(buffer, 0, region, rnd.nextLong(slots) * ALIGN, valueSize);
                        return valueSize;
                    };
                }
                return i -> {
                    MemorySegment.copy(region, rnd.nextLong(slots) * ALIGN, buffer, 0, valueSize);
                    return valueSize;
                };
            }

            @Override
            public void close() {
                own.close();
            }
        });
    }

    /**
     * Copies of {@code batch} values per operation into {@code batch} distinct destinations: the
     * ceiling for a batched same-machine get, whose destinations (an engine's KV blocks) are not all
     * in the cache either.
     */
    public Measurement getBatched(int valueSize, int batch, int clients, Duration warmup, Duration duration)
            throws Exception {
        int r = ++run;
        long slots = (region.byteSize() - valueSize) / ALIGN + 1;
        return Load.run(clients, warmup, duration, id -> new Load.Client() {
            final Arena own = Arena.ofShared();
            final MemorySegment[] dsts = new MemorySegment[batch];
            final SplittableRandom rnd = new SplittableRandom(1_000_033L * r + id);

            {
                for (int b = 0; b < batch; b++) {
                    dsts[b] = own.allocate(valueSize, 64).fill((byte) id);
                }
            }

            @Override
            public Load.Op op() {
                return i -> {
                    for (MemorySegment d : dsts) {
                        MemorySegment.copy(region, rnd.nextLong(slots) * ALIGN, d, 0, valueSize);
                    }
                    return (long) valueSize * batch;
                };
            }

            @Override
            public void close() {
                own.close();
            }
        });
    }

    /** Frees the shared region. */
    @Override
    public void close() {
        arena.close();
    }
}
