package io.kvpool.connector;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.locks.ReentrantLock;

/**
 * One step's loads as the engine waits for them, with their deadline (the Python connector's
 * {@code pool_connector.LoadGate} keeps the same rules).
 *
 * <p>Design note. The engine's thread gives up on the loads once their deadline passed ({@link #abandon}):
 * they are reported failed and the engine recomputes those blocks. The load itself may still be held by a
 * pool that is frozen or slow, and may finish long after. So with a deadline the reads go to staging memory
 * ({@link #staged}) and reach the engine's blocks only through {@link #land}, under the gate's lock, which
 * {@link #abandon} takes too: once abandoned, nothing of the load ever writes the engine's memory or its
 * error sets. Without a deadline the reads go straight into the blocks, as before.
 */
final class LoadGate {

    private final long deadlineNanos; // System.nanoTime() by which the loads must be in; -1: none
    private final ReentrantLock lock = new ReentrantLock();
    private boolean abandoned;
    private boolean done;

    LoadGate(long deadlineNanos) {
        this.deadlineNanos = deadlineNanos;
    }

    boolean hasDeadline() {
        return deadlineNanos >= 0;
    }

    /** Nanoseconds left, never negative; {@code Long.MAX_VALUE} without a deadline. */
    long remainingNanos() {
        return deadlineNanos < 0 ? Long.MAX_VALUE : Math.max(0, deadlineNanos - System.nanoTime());
    }

    boolean abandoned() {
        lock.lock();
        try {
            return abandoned;
        } finally {
            lock.unlock();
        }
    }

    /**
     * Runs {@code landing} (put bytes in place, record an outcome) unless abandoned; true if it ran. {@code last}:
     * the loads are over with it (they can no longer be abandoned).
     */
    boolean land(Runnable landing, boolean last) {
        lock.lock();
        try {
            if (abandoned) {
                return false;
            }
            landing.run();
            done |= last;
            return true;
        } finally {
            lock.unlock();
        }
    }

    /** Gives up on the loads unless they landed already; true if they are abandoned (now or before). */
    boolean abandon() {
        lock.lock();
        try {
            if (!done) {
                abandoned = true;
            }
            return abandoned;
        } finally {
            lock.unlock();
        }
    }

    /**
     * Where the reads for {@code targets} go: the targets themselves without a deadline, else staging memory of
     * the same sizes from {@code arena}, which {@link #copyBack} copies into the targets (inside {@link #land}).
     */
    List<MemorySegment> staged(List<MemorySegment> targets, Arena arena) {
        if (!hasDeadline()) {
            return targets;
        }
        List<MemorySegment> out = new ArrayList<>(targets.size());
        for (MemorySegment t : targets) {
            out.add(t.byteSize() == 0 ? t : arena.allocate(t.byteSize(), 64));
        }
        return out;
    }

    /** Copies staged reads into their targets where {@code ok} (no-op without a deadline). */
    void copyBack(List<MemorySegment> staged, List<MemorySegment> targets, boolean[] ok) {
        if (!hasDeadline()) {
            return;
        }
        for (int i = 0; i < targets.size(); i++) {
            if (ok[i] && staged.get(i) != targets.get(i)) {
                MemorySegment.copy(staged.get(i), 0, targets.get(i), 0, targets.get(i).byteSize());
            }
        }
    }
}
