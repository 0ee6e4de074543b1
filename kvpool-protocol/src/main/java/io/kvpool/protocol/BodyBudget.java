package io.kvpool.protocol;

import java.time.Duration;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The bytes of frame bodies that the servers of one process may hold at once.
 *
 * <h2>What it bounds</h2>
 * A {@link FrameServer} reads each request's body into memory whole before its handler runs. Every
 * connection owns a standing body buffer of {@link FrameServer#INITIAL_BODY_BYTES} (part of its fixed
 * cost, with its header and scratch buffers, bounded by the connection limits); a body that does not
 * fit grows a larger buffer, fourfold at a time and only as its bytes arrive. Each grown buffer's
 * whole capacity is taken from this budget before it is allocated and given back when its frame has
 * been handled (the buffer is then let go, and the connection returns to its standing buffer). So,
 * whatever peers send, the body bytes a process holds stay below
 * {@code connections × 4 KiB + this budget}. Small bodies count as much as large ones: only what fits
 * the standing buffer is free.
 *
 * <h2>One per process</h2>
 * The limit is memory, which the servers of one JVM share: a master and a node in one process
 * ({@code kvpool serve}, embedded pools) draw on {@link #PROCESS}. It is sized from the heap
 * ({@link #sizeFor}): an eighth of {@link Runtime#maxMemory()}, at least {@link #FLOOR_BYTES} (so a
 * body of the default largest size, {@link Limits#DEFAULT_MAX_BODY_BYTES}, always fits) and at most
 * {@link #CEILING_BYTES}. The way to change it is the heap size ({@code -Xmx}). Tests make their own,
 * small ones.
 *
 * <h2>Back-pressure</h2>
 * A buffer that cannot get its share at once waits, up to the time its server allows, for others'
 * frames to finish; failing that, {@link #take} answers false and the server refuses the frame naming
 * the budget. A body larger than the whole budget could never be held, and is refused from its header.
 */
final class BodyBudget {

    /** The least budget: a body of {@link Limits#DEFAULT_MAX_BODY_BYTES} fits whatever the heap. */
    static final int FLOOR_BYTES = 64 << 20;
    /** The most budget, whatever the heap: 1 GiB of bodies in flight is far beyond any real load. */
    static final int CEILING_BYTES = 1 << 30;
    /** The share of the heap the budget is: one part in this many. */
    static final int HEAP_FRACTION = 8;

    /** The budget of this process's servers, sized from its heap. */
    static final BodyBudget PROCESS = new BodyBudget(sizeFor(Runtime.getRuntime().maxMemory()),
            "an eighth of the heap (-Xmx), within " + (FLOOR_BYTES >> 20) + " MiB and " + (CEILING_BYTES >> 20)
                    + " MiB, shared by every server of the process");

    private final int bytes;
    private final String sizing;
    private final Semaphore free;
    private final AtomicLong peak = new AtomicLong();

    /** A budget of {@code bytes}; {@code sizing} says how it was chosen, for the refusals that name it. */
    BodyBudget(int bytes, String sizing) {
        if (bytes < 1) {
            throw new IllegalArgumentException("a body budget needs at least 1 byte, got " + bytes);
        }
        this.bytes = bytes;
        this.sizing = sizing;
        this.free = new Semaphore(bytes);
    }

    /** The budget for a heap of {@code maxHeapBytes}: an eighth of it, within the floor and the ceiling. */
    static int sizeFor(long maxHeapBytes) {
        return (int) Math.clamp(maxHeapBytes / HEAP_FRACTION, FLOOR_BYTES, CEILING_BYTES);
    }

    /** The whole budget, in bytes. */
    int bytes() {
        return bytes;
    }

    /** Bytes taken now by buffered bodies. */
    long inUse() {
        return bytes - (long) free.availablePermits();
    }

    /** The most bytes ever taken at once. */
    long peak() {
        return peak.get();
    }

    /**
     * Takes {@code n} bytes, waiting up to {@code wait} for them to be given back by others: false
     * (nothing taken) when they were not.
     */
    boolean take(int n, Duration wait) throws InterruptedException {
        if (!free.tryAcquire(n, wait.toMillis(), TimeUnit.MILLISECONDS)) {
            return false;
        }
        peak.accumulateAndGet(inUse(), Math::max);
        return true;
    }

    /** Gives back {@code n} bytes taken before. */
    void give(int n) {
        free.release(n);
    }

    /** The budget's size as a person reads it (whole MiB, or KiB for a small one) and how it was chosen. */
    @Override
    public String toString() {
        return (bytes % (1 << 20) == 0 ? (bytes >> 20) + " MiB" : (bytes >> 10) + " KiB") + " (" + sizing + ")";
    }
}
