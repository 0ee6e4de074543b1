package io.kvpool.master;

import io.kvpool.protocol.ObjectLayout;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Fork;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Measurement;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;
import org.openjdk.jmh.annotations.Warmup;

import java.util.SplittableRandom;
import java.util.concurrent.TimeUnit;

/**
 * The master's per-segment {@link RangeAllocator} (best fit over a size-ordered and an
 * offset-ordered tree of free ranges, with coalescing on free) in steady state: one cycle frees one
 * region and allocates one.
 *
 * <ul>
 *   <li>{@link #fragmented}: a 16 GiB segment kept about 80% full by regions of random sizes between
 *       64 KiB and 4 MiB (multiples of 64), freed in random order, so the free space is scattered over
 *       thousands of ranges. This is what a long-running pool looks like when objects are evicted and
 *       removed out of allocation order.</li>
 *   <li>{@link #sequential}: the best case. The same 16 GiB, 80% full, but 2 MiB regions freed in the
 *       order they were allocated (a FIFO, like pure LRU eviction of blocks written in order), so there
 *       are at most two free ranges.</li>
 * </ul>
 *
 * <p>Why it matters: every PUT_START allocates one region per replica, and every removal, eviction,
 * expiry and upsert frees one, all under the allocator's monitor; a batch of 1024 puts is 1024
 * allocations. The gap between the two benchmarks is the cost of fragmentation (deeper trees,
 * cache misses on tree nodes).
 *
 * <p>Results are average time per cycle (one free plus one allocate).
 */
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.NANOSECONDS)
@Warmup(iterations = 3, time = 1)
@Measurement(iterations = 5, time = 1)
@Fork(1)
public class AllocatorBench {

    static final long CAPACITY = 16L << 30;
    static final long MIN_REGION = 64L << 10;
    static final long MAX_REGION = 4L << 20;
    static final double FILL = 0.80;

    /** Random-size regions freed in random order. */
    @State(Scope.Thread)
    public static class Fragmented {

        RangeAllocator allocator;
        SplittableRandom rnd;
        /** Live regions, unordered (a slot is refilled or swapped with the last on free). */
        long[] offsets;
        long[] lengths;
        int live;
        long low;
        long high;

        @Setup(Level.Trial)
        public void setUp() {
            allocator = new RangeAllocator(CAPACITY);
            rnd = new SplittableRandom(42);
            int maxLive = (int) (CAPACITY / MIN_REGION) + 1;
            offsets = new long[maxLive];
            lengths = new long[maxLive];
            // hold usage within a band of a few maximal regions around 80%
            low = (long) (CAPACITY * FILL) - 2 * MAX_REGION;
            high = (long) (CAPACITY * FILL) + 2 * MAX_REGION;
            // fill to 95%, then free at random down to 80%: the free space starts out scattered
            while (allocator.used() < CAPACITY * 0.95) {
                if (!allocateOne()) {
                    break;
                }
            }
            while (allocator.used() > CAPACITY * FILL) {
                freeRandom();
            }
        }

        long randomSize() {
            return ObjectLayout.align(rnd.nextLong(MIN_REGION, MAX_REGION + 1));
        }

        boolean allocateOne() {
            long len = randomSize();
            long off = allocator.allocate(len);
            if (off < 0) {
                return false;
            }
            offsets[live] = off;
            lengths[live] = len;
            live++;
            return true;
        }

        void freeRandom() {
            int i = rnd.nextInt(live);
            allocator.free(offsets[i], lengths[i]);
            live--;
            offsets[i] = offsets[live];
            lengths[i] = lengths[live];
        }

        @TearDown(Level.Trial)
        public void check() {
            double fill = (double) allocator.used() / CAPACITY;
            if (fill < 0.75 || fill > 0.85) {
                throw new IllegalStateException("allocator drifted to " + fill + " full");
            }
        }
    }

    /** Fixed 2 MiB regions freed oldest first. */
    @State(Scope.Thread)
    public static class Sequential {

        static final long REGION = 2L << 20;

        RangeAllocator allocator;
        long[] ring;
        int head;

        @Setup(Level.Trial)
        public void setUp() {
            allocator = new RangeAllocator(CAPACITY);
            ring = new long[(int) (CAPACITY * FILL / REGION)];
            for (int i = 0; i < ring.length; i++) {
                ring[i] = allocator.allocate(REGION);
            }
            head = 0;
        }
    }

    /** Free a random live region, allocate a random-size one; rebalance (rarely) to stay near 80% full. */
    @Benchmark
    public long fragmented(Fragmented s) {
        s.freeRandom();
        long len = s.randomSize();
        long off = s.allocator.allocate(len);
        while (off < 0) {
            // no single free range fits: fragmentation made room unusable; free more, as eviction would
            s.freeRandom();
            off = s.allocator.allocate(len);
        }
        s.offsets[s.live] = off;
        s.lengths[s.live] = len;
        s.live++;
        // sizes are random, so usage does a random walk; keep it in the band
        long used = s.allocator.used();
        if (used > s.high) {
            s.freeRandom();
        } else if (used < s.low) {
            s.allocateOne();
        }
        return off;
    }

    /** Free the oldest region, allocate a new one of the same size. */
    @Benchmark
    public long sequential(Sequential s) {
        int h = s.head;
        s.allocator.free(s.ring[h], Sequential.REGION);
        long off = s.allocator.allocate(Sequential.REGION);
        s.ring[h] = off;
        s.head = h + 1 == s.ring.length ? 0 : h + 1;
        return off;
    }
}
