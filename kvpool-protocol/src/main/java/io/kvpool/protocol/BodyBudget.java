package io.kvpool.protocol;

import io.kvpool.config.Durations;

import java.time.Duration;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The bytes of frame bodies that the servers of one process may hold at once.
 *
 * <h2>What it bounds</h2>
 * A {@link FrameServer} reads each request's body into memory whole before its handler runs. Every
 * connection owns a standing body buffer of {@link BodyIntake#STANDING_BYTES} (part of its fixed cost,
 * with its header and scratch buffers, bounded by the connection limits). A body that does not fit it
 * reserves its whole size here, from its header and before a byte of it is read, and only then gets a
 * buffer of that size; the reservation is given back when its frame has been handled (the buffer is
 * let go, and the connection returns to its standing buffer). So, whatever peers send, the body bytes
 * a process holds stay below {@code connections × 4 KiB + this budget}. Small bodies count as much as
 * large ones: only what fits the standing buffer is free.
 *
 * <h2>Whole reservations, so work finishes</h2>
 * Bodies once took their budget piecemeal, a share for each fourfold growth of their buffer as bytes
 * arrived. Many bodies arriving slowly together then each held a share, the budget ran out with none
 * of them complete, and all waited until they were refused: with {@code -Xmx256m}, 64 clients sending
 * 40 MiB bodies slowly got 0 of 64 handled. A whole reservation cannot be stranded that way: a body
 * that holds one has all the room it will ever need, finishes once its sender has sent it (within the
 * frame timeout), and gives it back. The budget is then in use only by bodies that can complete.
 *
 * <h2>In order, with a bounded wait</h2>
 * Reservations are granted first come, first served (a fair semaphore): one that does not fit waits
 * at the head of the line, and later ones, even small ones that would fit, wait behind it, so a large
 * body is never starved by a stream of small ones. A reservation waits at most what its server
 * allows (half the frame timeout from the frame's first byte); then {@link #take} answers false,
 * having taken nothing, and the server refuses the frame naming the budget ({@link #refusal}). The
 * next reservation in line is then considered at once. A body larger than the whole budget could
 * never be held, and is refused from its header.
 *
 * <h2>One per process</h2>
 * The limit is memory, which the servers of one JVM share: a master and a node in one process
 * ({@code kvpool serve}, embedded pools) draw on {@link #PROCESS}. It is sized from the heap
 * ({@link #sizeFor}): an eighth of {@link Runtime#maxMemory()}, at least {@link #FLOOR_BYTES} (so a
 * body of the default largest size, {@link Limits#DEFAULT_MAX_BODY_BYTES}, always fits) and at most
 * {@link #CEILING_BYTES}. The way to change it is the heap size ({@code -Xmx}). Tests make their own,
 * small ones. In such a shared process a master request that calls its own node while holding a
 * reservation (the frees after a removal, or after an eviction a put caused) may find that node's
 * frame waiting behind a larger body queued for the same budget. The master waits for its nodes a
 * bounded time (5 s a call; the read lease for a removal's acknowledgements), so this can delay
 * such a request by that much, never hold the budget for good.
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
        this.free = new Semaphore(bytes, true);
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

    /** Reservations waiting for room now (an estimate, for metrics). */
    int waiting() {
        return free.getQueueLength();
    }

    /** The most bytes ever taken at once. */
    long peak() {
        return peak.get();
    }

    /**
     * Reserves {@code n} bytes, after every reservation asked for before it, waiting up to {@code wait}
     * for them to be given back by others: false (nothing taken) when they were not. A zero wait
     * still waits its turn: it succeeds only when nobody is waiting and the bytes are free.
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

    /**
     * Why a body of {@code length} bytes was refused after waiting {@code wait} for its reservation:
     * what to answer the peer.
     */
    String refusal(int length, Duration wait) {
        return String.format("a body of %d bytes cannot be buffered now: this process's body budget of %s stayed in"
                + " use by other bodies until %s after the frame began (half the frame timeout); send it again later"
                + " or in smaller frames, and if this persists give the server a larger heap (-Xmx)", length, this,
                Durations.format(wait));
    }

    /** Why a body of {@code length} bytes, more than the whole budget, is refused from its header. */
    String neverFits(int length) {
        return String.format("a body of %d bytes can never be buffered: it is larger than this process's whole body"
                + " budget of %s; send it in smaller frames, or give the server a larger heap (-Xmx)", length, this);
    }

    /** The budget's size as a person reads it (whole MiB, or KiB for a small one) and how it was chosen. */
    @Override
    public String toString() {
        return (bytes % (1 << 20) == 0 ? (bytes >> 20) + " MiB" : (bytes >> 10) + " KiB") + " (" + sizing + ")";
    }
}
