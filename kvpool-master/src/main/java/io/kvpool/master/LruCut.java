package io.kvpool.master;

import java.util.function.Consumer;

/**
 * Which objects one eviction round takes: approximate LRU by access tick, without sorting.
 *
 * <p>Two passes over the index: the first finds the range of access ticks among objects that take
 * memory, the second histograms their bytes into {@link #BUCKETS} buckets over that range. The cut
 * is the first bucket at which the bytes in it and below reach the target: every object in a bucket
 * below the cut goes, and the cut bucket goes whole when that frees at most twice the target, else
 * until the round has freed enough. Objects read between the passes can move a tick past the first
 * pass's range; they fall into the edge buckets, which is what approximate means here.
 */
final class LruCut {

    /** Buckets in the histogram: resolution of the cut, 1/4096 of the tick range. */
    static final int BUCKETS = 4096;

    /** What an object weighs: bytes it would free, or a negative value to leave it out entirely. */
    interface Weight {
        long of(ObjectTable objects, int slot);
    }

    private final int min;
    private final long span;
    private final int cut;
    /** Whether the cut bucket goes whole rather than until the round freed enough. */
    private final boolean whole;

    private LruCut(int min, long span, int cut, boolean whole) {
        this.min = min;
        this.span = span;
        this.cut = cut;
        this.whole = whole;
    }

    /** Whether the cut bucket goes whole (the round may free up to twice its target). */
    boolean whole() {
        return whole;
    }

    /** The cut for freeing {@code targetBytes}, or null when no object weighs anything. */
    static LruCut find(ObjectIndex index, long targetBytes, Weight weight) {
        int[] range = {Integer.MAX_VALUE, Integer.MIN_VALUE};
        @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
        Consumer<ObjectIndex.Shard> bounds = shard -> {
            ObjectTable objects = shard.objects;
            for (int slot = 0, n = objects.size(); slot < n; slot++) {
                if (weight.of(objects, slot) >= 0) {
                    int t = objects.lastAccess(slot);
                    range[0] = Math.min(range[0], t);
                    range[1] = Math.max(range[1], t);
                }
            }
        };
        index.forEachShard(bounds);
        if (range[0] > range[1]) {
            return null;
        }
        int min = range[0];
        long span = (long) range[1] - min + 1;
        long[] bytes = new long[BUCKETS];
        @SuppressWarnings("GuardedBy") // ObjectIndex runs it under the shard's lock, out of the checker's sight
        Consumer<ObjectIndex.Shard> weigh = shard -> {
            ObjectTable objects = shard.objects;
            for (int slot = 0, n = objects.size(); slot < n; slot++) {
                long w = weight.of(objects, slot);
                if (w >= 0) {
                    bytes[bucket(objects.lastAccess(slot), min, span)] += w;
                }
            }
        };
        index.forEachShard(weigh);
        int cut = 0;
        long acc = 0;
        while (cut < BUCKETS - 1 && acc + bytes[cut] < targetBytes) {
            acc += bytes[cut];
            cut++;
        }
        // the cut bucket whole when that at most doubles the round: its objects were written (or last read)
        // together, so they lie side by side in the segments, and taking some of them in index order left
        // holes scattered over its range, too short for the next write lease (docs/architecture.md)
        return new LruCut(min, span, cut, acc + bytes[cut] <= 2 * targetBytes);
    }

    /**
     * Whether an object last read at {@code tick} goes: below the cut always, in the cut bucket when it
     * goes {@link #whole}, else only while the round has not freed enough ({@code enough} false).
     */
    boolean takes(int tick, boolean enough) {
        int b = bucket(tick, min, span);
        return b < cut || (b == cut && (whole || !enough));
    }

    private static int bucket(int tick, int min, long span) {
        long b = ((long) tick - min) * BUCKETS / span;
        return (int) Math.max(0, Math.min(BUCKETS - 1, b));
    }
}
