package io.kvpool.master;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.util.ArrayList;
import java.util.BitSet;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

class RangeAllocatorTest {

    private static final long U = 64; // allocation unit (ObjectLayout.ALIGNMENT)

    private static void assertEmpty(RangeAllocator a) {
        assertThat(a.used()).isZero();
        assertThat(a.allocations()).isZero();
        assertThat(a.free()).isEqualTo(a.capacity());
        assertThat(a.largestFree()).isEqualTo(a.capacity());
        assertThat(a.freeRanges()).isEqualTo(a.capacity() > 0 ? 1 : 0);
    }

    /** A promoted standby's allocators: taking sorted ranges in one pass ends as reserving them one by one does. */
    @Test
    void takingSortedRangesEqualsReservingThemOneByOne() {
        java.util.SplittableRandom rnd = new java.util.SplittableRandom(11);
        for (int round = 0; round < 200; round++) {
            long capacity = (1 + rnd.nextInt(4096)) * U;
            int n = rnd.nextInt(64);
            long[] offsets = new long[n];
            long[] lengths = new long[n];
            for (int i = 0; i < n; i++) {
                offsets[i] = rnd.nextLong(capacity / U + 8) * U; // some run past the end
                lengths[i] = 1 + rnd.nextLong(8 * U);
            }
            java.util.Arrays.sort(offsets);
            RangeAllocator one = new RangeAllocator(capacity);
            int refusedOne = 0;
            for (int i = 0; i < n; i++) {
                refusedOne += one.reserve(offsets[i], lengths[i]) ? 0 : 1;
            }
            RangeAllocator sorted = new RangeAllocator(capacity);
            assertThat(sorted.takeSorted(offsets, lengths, n)).as("round %d", round).isEqualTo(refusedOne);
            assertThat(sorted.used()).as("round %d", round).isEqualTo(one.used());
            assertThat(sorted.allocations()).isEqualTo(one.allocations());
            assertThat(sorted.freeRanges()).isEqualTo(one.freeRanges());
            assertThat(sorted.largestFree()).isEqualTo(one.largestFree());
            assertThat(sorted.allocate(U)).isEqualTo(one.allocate(U));
        }
        RangeAllocator busy = new RangeAllocator(16 * U);
        busy.allocate(U);
        assertThatThrownBy(() -> busy.takeSorted(new long[0], new long[0], 0)).isInstanceOf(IllegalStateException.class);
    }

    @Test
    void capacityIsRoundedDownToTheAlignment() {
        assertThat(new RangeAllocator(1000).capacity()).isEqualTo(960);
        assertThat(new RangeAllocator(1024).capacity()).isEqualTo(1024);
        RangeAllocator tiny = new RangeAllocator(63);
        assertThat(tiny.capacity()).isZero();
        assertThat(tiny.allocate(1)).isEqualTo(-1);
        assertThat(tiny.largestFree()).isZero();
        assertThat(tiny.freeRanges()).isZero();
        assertEmpty(new RangeAllocator(4096));
    }

    @Test
    void lengthsAreRoundedUpToTheAlignment() {
        RangeAllocator a = new RangeAllocator(1024);
        long x = a.allocate(1);
        long y = a.allocate(65);
        assertThat(x).isZero();
        assertThat(y).isEqualTo(64);
        assertThat(a.used()).isEqualTo(64 + 128);
        assertThat(a.allocations()).isEqualTo(2);
        a.free(y, 65);
        a.free(x, 1);
        assertEmpty(a);
    }

    @Test
    void allocateUntilFullThenMinusOne() {
        RangeAllocator a = new RangeAllocator(16 * U);
        List<Long> got = new ArrayList<>();
        for (int i = 0; i < 16; i++) {
            long off = a.allocate(U);
            assertThat(off).as("allocation %d", i).isGreaterThanOrEqualTo(0);
            got.add(off);
        }
        assertThat(got).doesNotHaveDuplicates().allSatisfy(o -> assertThat(o % U).isZero());
        assertThat(a.allocate(1)).isEqualTo(-1);
        assertThat(a.allocate(U)).isEqualTo(-1);
        assertThat(a.used()).isEqualTo(a.capacity());
        assertThat(a.free()).isZero();
        assertThat(a.largestFree()).isZero();
        assertThat(a.freeRanges()).isZero();
        assertThat(a.allocations()).isEqualTo(16);
        // a failed allocation changes nothing
        assertThat(a.allocate(17 * U)).isEqualTo(-1);
        assertThat(a.used()).isEqualTo(16 * U);
    }

    @Test
    void tooLargeForAnyRangeIsMinusOne() {
        RangeAllocator a = new RangeAllocator(8 * U);
        assertThat(a.allocate(9 * U)).isEqualTo(-1);
        assertThat(a.allocate(8 * U)).isZero();
    }

    @Test
    void freeCoalescesNeighboursSoAFullSizeAllocationSucceedsAgain() {
        RangeAllocator a = new RangeAllocator(8 * U);
        long[] offs = new long[8];
        for (int i = 0; i < 8; i++) {
            offs[i] = a.allocate(U);
        }
        // free in an order that exercises merge-with-previous, merge-with-next and merge-both
        int[] order = {1, 3, 5, 7, 2, 6, 0, 4};
        for (int i = 0; i < order.length; i++) {
            a.free(offs[order[i]], U);
            assertThat(a.allocate(8 * U)).as("after %d frees", i + 1).isEqualTo(i == 7 ? 0 : -1);
            if (i == 7) {
                break;
            }
        }
        assertThat(a.used()).isEqualTo(8 * U);
        assertThat(a.allocations()).isEqualTo(1);
        a.free(0, 8 * U);
        assertEmpty(a);
    }

    @Test
    void freeRangesCountShowsMerging() {
        RangeAllocator a = new RangeAllocator(6 * U);
        long[] o = new long[6];
        for (int i = 0; i < 6; i++) {
            o[i] = a.allocate(U);
        }
        a.free(o[0], U);
        a.free(o[2], U);
        a.free(o[4], U);
        assertThat(a.freeRanges()).isEqualTo(3);
        assertThat(a.largestFree()).isEqualTo(U);
        a.free(o[1], U); // joins [0] and [2]
        assertThat(a.freeRanges()).isEqualTo(2);
        assertThat(a.largestFree()).isEqualTo(3 * U);
        a.free(o[5], U); // joins [4]
        assertThat(a.freeRanges()).isEqualTo(2);
        a.free(o[3], U); // joins everything
        assertThat(a.freeRanges()).isEqualTo(1);
        assertEmpty(a);
    }

    @Test
    void bestFitPicksTheSmallestRangeThatFits() {
        RangeAllocator a = new RangeAllocator(20 * U);
        // carve: [0,4) used, [4,8) free, [8,9) used, [9,11) free, [11,12) used, [12,20) free
        assertThat(a.reserve(0, 4 * U)).isTrue();
        assertThat(a.reserve(8 * U, U)).isTrue();
        assertThat(a.reserve(11 * U, U)).isTrue();
        assertThat(a.freeRanges()).isEqualTo(3);
        assertThat(a.allocate(2 * U)).isEqualTo(9 * U);   // exact fit
        assertThat(a.allocate(3 * U)).isEqualTo(4 * U);   // smallest that fits (4 units)
        assertThat(a.allocate(U)).isEqualTo(7 * U);       // the 1-unit leftover
        assertThat(a.allocate(5 * U)).isEqualTo(12 * U);
    }

    @Test
    void reserveOfASpecificFreeRange() {
        RangeAllocator a = new RangeAllocator(16 * U);
        assertThat(a.reserve(5 * U, 3 * U)).isTrue();
        assertThat(a.used()).isEqualTo(3 * U);
        assertThat(a.allocations()).isEqualTo(1);
        assertThat(a.freeRanges()).isEqualTo(2);
        assertThat(a.largestFree()).isEqualTo(8 * U);
        // the reserved range is never handed out
        List<Long> rest = new ArrayList<>();
        long off;
        while ((off = a.allocate(U)) >= 0) {
            rest.add(off);
        }
        assertThat(rest).hasSize(13).doesNotContain(5 * U, 6 * U, 7 * U);
        // reserve at the very start and the very end
        RangeAllocator b = new RangeAllocator(4 * U);
        assertThat(b.reserve(0, U)).isTrue();
        assertThat(b.reserve(3 * U, U)).isTrue();
        assertThat(b.allocate(2 * U)).isEqualTo(U);
        assertThat(b.free()).isZero();
    }

    @Test
    void reserveOfAUsedOrInvalidRangeReturnsFalse() {
        RangeAllocator a = new RangeAllocator(16 * U);
        long x = a.allocate(4 * U);
        assertThat(x).isZero();
        assertThat(a.reserve(0, U)).isFalse();
        assertThat(a.reserve(3 * U, 2 * U)).as("straddles the used end").isFalse();
        assertThat(a.reserve(2 * U, U)).isFalse();
        assertThat(a.reserve(15 * U, 2 * U)).as("runs past capacity").isFalse();
        assertThat(a.reserve(16 * U, U)).as("starts at capacity").isFalse();
        assertThat(a.reserve(-U, U)).isFalse();
        assertThat(a.reserve(4 * U + 1, U)).as("unaligned").isFalse();
        assertThat(a.used()).isEqualTo(4 * U);
        assertThat(a.allocations()).isEqualTo(1);
        // a reserve spanning two free ranges separated by a used one
        assertThat(a.reserve(8 * U, U)).isTrue();
        assertThat(a.reserve(6 * U, 4 * U)).isFalse();
        assertThat(a.used()).isEqualTo(5 * U);
    }

    @Test
    void doubleFreeThrows() {
        RangeAllocator a = new RangeAllocator(16 * U);
        long x = a.allocate(2 * U);
        long y = a.allocate(2 * U);
        a.free(x, 2 * U);
        assertThatThrownBy(() -> a.free(x, 2 * U)).isInstanceOf(IllegalStateException.class)
                .hasMessageContaining("double free");
        // partly free: starts in used space, runs into a free range
        assertThatThrownBy(() -> a.free(y, 3 * U)).isInstanceOf(IllegalStateException.class)
                .hasMessageContaining("double free");
        // starts inside a free range
        assertThatThrownBy(() -> a.free(x + U, U)).isInstanceOf(IllegalStateException.class);
        // outside the segment
        assertThatThrownBy(() -> a.free(16 * U, U)).isInstanceOf(IllegalStateException.class)
                .hasMessageContaining("outside");
        assertThatThrownBy(() -> a.free(-U, U)).isInstanceOf(IllegalStateException.class);
        // failed frees changed nothing
        assertThat(a.used()).isEqualTo(2 * U);
        assertThat(a.allocations()).isEqualTo(1);
        a.free(y, 2 * U);
        assertEmpty(a);
        assertThatThrownBy(() -> a.free(y, 2 * U)).isInstanceOf(IllegalStateException.class);
    }

    @Test
    void resetFreesEverything() {
        RangeAllocator a = new RangeAllocator(16 * U);
        a.allocate(3 * U);
        a.allocate(U);
        a.reserve(10 * U, 2 * U);
        a.reset();
        assertEmpty(a);
        assertThat(a.allocate(16 * U)).isZero();
        a.reset();
        assertEmpty(a);
    }

    // ------------------------------------------------------------------ randomized model test

    /** Maximal runs of free units in the model: start unit to length in units. */
    private static Map<Long, Long> freeRuns(BitSet used, int units) {
        Map<Long, Long> runs = new HashMap<>();
        int i = used.nextClearBit(0);
        while (i < units) {
            int end = Math.min(used.nextSetBit(i) < 0 ? units : used.nextSetBit(i), units);
            runs.put((long) i, (long) (end - i));
            i = used.nextClearBit(end);
        }
        return runs;
    }

    @ParameterizedTest
    @ValueSource(longs = {1L, 2L, 3L, 42L, 0xC0FFEEL, 20240601L, -7L})
    void randomOperationsMatchABitmapModel(long seed) {
        runModel(seed);
    }

    @Test
    void randomOperationsMatchABitmapModelWithAFreshSeed() {
        runModel(System.nanoTime());
    }

    private static void runModel(long seed) {
        Random rnd = new Random(seed);
        int units = 64 + rnd.nextInt(512);
        long rawCapacity = units * U + rnd.nextInt((int) U); // a ragged tail is rounded off
        RangeAllocator a = new RangeAllocator(rawCapacity);
        assertThat(a.capacity()).as("seed=%d", seed).isEqualTo(units * U);
        BitSet model = new BitSet(units);
        Map<Long, Long> live = new HashMap<>(); // offset -> length as requested
        List<Long> liveOffsets = new ArrayList<>();
        int ops = 5000;
        for (int op = 0; op < ops; op++) {
            String at = "seed=" + seed + " op=" + op;
            int kind = rnd.nextInt(100);
            if (kind < 45) {
                long length = rnd.nextInt(10) == 0 ? 1 + rnd.nextInt((int) (units * U / 4)) : 1 + rnd.nextInt((int) (8 * U));
                int need = (int) ((length + U - 1) / U);
                Map<Long, Long> runs = freeRuns(model, units);
                long bestStart = -1;
                long bestLen = Long.MAX_VALUE;
                for (Map.Entry<Long, Long> r : runs.entrySet()) {
                    if (r.getValue() >= need && (r.getValue() < bestLen
                            || (r.getValue() == bestLen && r.getKey() < bestStart))) {
                        bestStart = r.getKey();
                        bestLen = r.getValue();
                    }
                }
                long off = a.allocate(length);
                if (bestStart < 0) {
                    assertThat(off).as(at + " allocate(" + length + ") with no run of " + need + " units").isEqualTo(-1);
                } else {
                    assertThat(off).as(at + " allocate(" + length + ") best fit").isEqualTo(bestStart * U);
                    int u = (int) (off / U);
                    assertThat(model.get(u, u + need).isEmpty()).as(at + " overlaps a live allocation").isTrue();
                    model.set(u, u + need);
                    live.put(off, length);
                    liveOffsets.add(off);
                }
            } else if (kind < 80) {
                if (liveOffsets.isEmpty()) {
                    continue;
                }
                long off = liveOffsets.remove(rnd.nextInt(liveOffsets.size()));
                long length = live.remove(off);
                a.free(off, length);
                int u = (int) (off / U);
                model.clear(u, u + (int) ((length + U - 1) / U));
            } else if (kind < 93) {
                long off = rnd.nextInt(8) == 0 ? rnd.nextInt((int) (units * U + 2 * U)) - U : U * rnd.nextInt(units + 2);
                long length = 1 + rnd.nextInt((int) (6 * U));
                int need = (int) ((length + U - 1) / U);
                boolean expect = off >= 0 && off % U == 0 && off / U + need <= units
                        && model.get((int) (off / U), (int) (off / U) + need).isEmpty();
                assertThat(a.reserve(off, length)).as(at + " reserve(" + off + ", " + length + ")").isEqualTo(expect);
                if (expect) {
                    model.set((int) (off / U), (int) (off / U) + need);
                    live.put(off, length);
                    liveOffsets.add(off);
                }
            } else if (kind < 99) {
                // free of a range that is already free must be refused and change nothing
                int u = model.nextClearBit(rnd.nextInt(units));
                if (u >= units) {
                    continue;
                }
                long off = u * U;
                assertThatThrownBy(() -> a.free(off, U)).as(at + " double free at " + off)
                        .isInstanceOf(IllegalStateException.class);
            } else {
                a.reset();
                model.clear();
                live.clear();
                liveOffsets.clear();
            }

            long modelUsed = model.cardinality() * U;
            Map<Long, Long> runs = freeRuns(model, units);
            long largest = runs.values().stream().mapToLong(Long::longValue).max().orElse(0) * U;
            assertThat(a.used()).as(at + " used").isEqualTo(modelUsed);
            assertThat(a.allocations()).as(at + " allocations").isEqualTo(live.size());
            assertThat(a.free() + a.used()).as(at + " free+used").isEqualTo(a.capacity());
            assertThat(a.largestFree()).as(at + " largest free").isEqualTo(largest);
            assertThat(a.freeRanges()).as(at + " free ranges (touching ranges must be merged)").isEqualTo(runs.size());
        }
        // free everything that is left: back to one free range
        for (long off : liveOffsets) {
            a.free(off, live.get(off));
        }
        assertThat(a.used()).as("seed=%d", seed).isZero();
        assertThat(a.allocations()).as("seed=%d", seed).isZero();
        assertThat(a.freeRanges()).as("seed=%d", seed).isEqualTo(1);
        assertThat(a.allocate(a.capacity())).as("seed=%d", seed).isZero();
    }
}
