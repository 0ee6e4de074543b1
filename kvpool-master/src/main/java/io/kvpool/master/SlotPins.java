package io.kvpool.master;

import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.IntToLongFunction;

/**
 * The pinned objects of one {@link ObjectTable}: slot to the pin's deadline (epoch millis;
 * {@code Long.MAX_VALUE}: until removed), and the region bytes they hold back from eviction (each
 * pinned object's region times its wanted copies), for the table and summed over the pool. Few
 * objects are pinned (pins are capped), so a map is fine. Not thread-safe: the table's shard lock
 * guards it. {@code weight} functions give a slot's pinned weight (region times copies wanted).
 */
final class SlotPins {

    private final HashMap<Integer, Long> until = new HashMap<>();
    private long bytes;
    /** The pool's pinned bytes, over every table that shares it (the index's shards). */
    private final AtomicLong pool;

    SlotPins(AtomicLong pool) {
        this.pool = pool;
    }

    private void add(long delta) {
        bytes += delta;
        pool.addAndGet(delta);
    }

    /** Whether {@code slot} is pinned with a deadline after {@code nowMillis}. */
    boolean pinned(int slot, long nowMillis) {
        if (until.isEmpty()) {
            return false;
        }
        Long u = until.get(slot);
        return u != null && u > nowMillis;
    }

    /** The pin's deadline, or 0 when {@code slot} is not pinned. */
    long until(int slot) {
        Long u = until.isEmpty() ? null : until.get(slot);
        return u == null ? 0 : u;
    }

    boolean contains(int slot) {
        return !until.isEmpty() && until.containsKey(slot);
    }

    /** Pins {@code slot} until {@code untilMillis}, or unpins it with 0; {@code weight} is its pinned weight. */
    void set(int slot, long untilMillis, long weight) {
        Long was = untilMillis > 0 ? until.put(slot, untilMillis) : until.remove(slot);
        if (was == null && untilMillis > 0) {
            add(weight);
        } else if (was != null && untilMillis <= 0) {
            add(-weight);
        }
    }

    /** A pinned slot's weight changed by {@code delta} (its copies wanted moved). */
    void reweigh(int slot, long delta) {
        if (contains(slot)) {
            add(delta);
        }
    }

    /** The record in slot {@code from} moved to slot {@code to} (a swap-remove); {@code to}'s pin was dropped. */
    void moved(int from, int to) {
        Long pin = until.isEmpty() ? null : until.remove(from);
        if (pin != null) {
            until.put(to, pin);
        }
    }

    /** Drops the pins whose deadline passed; returns how many. */
    int expire(long nowMillis, IntToLongFunction weight) {
        if (until.isEmpty()) {
            return 0;
        }
        int[] n = {0};
        until.entrySet().removeIf(e -> {
            if (e.getValue() > nowMillis) {
                return false;
            }
            add(-weight.applyAsLong(e.getKey()));
            n[0]++;
            return true;
        });
        return n[0];
    }

    void clear() {
        until.clear();
        add(-bytes);
    }

    long bytes() {
        return bytes;
    }

    /** Checks the slots are below {@code size} and the bytes add up; throws if not. For tests. */
    void check(int size, IntToLongFunction weight) {
        long counted = 0;
        for (Map.Entry<Integer, Long> e : until.entrySet()) {
            if (e.getKey() < 0 || e.getKey() >= size) {
                throw new IllegalStateException("pin of slot " + e.getKey() + " (size " + size + ")");
            }
            counted += weight.applyAsLong(e.getKey());
        }
        if (counted != bytes) {
            throw new IllegalStateException("pinned bytes " + bytes + ", counted " + counted);
        }
    }
}
