package io.kvpool.node;

import com.google.errorprone.annotations.concurrent.GuardedBy;

import java.time.Duration;

/**
 * Whether this node takes writes now, and the write frames in progress.
 *
 * <h2>Why</h2>
 * What a node lists at registration (its inventory) is what the master takes back; an object that
 * becomes complete after that snapshot is not in it. If the master then accepts that object's COMMIT
 * or PUT_END against the registration it is about to replace, the object is acknowledged and, when
 * the new registration drops the old one, gone from the index: an acknowledged put lost (issue 32:
 * 18 of 71,074 under rolling restarts, every one written just after a node came back and before it
 * registered). So writes are admitted only while the node serves a registration, and a registration
 * (or a stop for a restart) first closes the gate and waits for the writes already admitted to end:
 * every object that ever becomes complete is either in the next inventory or refused.
 *
 * <h2>States</h2>
 * <pre>
 *                open()                      close()
 *   CLOSED ---------------------> OPEN ------------------> CLOSING --(no writes in progress,
 *     ^   (registered)                                                  or the wait ran out)--+
 *     |                                                                                      |
 *     +--------------------------------------------------------------------------------------+
 *   drain(): as close(), and the gate never opens again (a node stopping for a restart)
 * </pre>
 * <ul>
 *   <li>A <b>new write</b> (NODE_WRITE, NODE_SHM_WRITE_BEGIN, NODE_SHM_LEASE, NODE_SHM_LEASE_WRITE,
 *       NODE_PART_BEGIN, a promotion) is admitted only while OPEN ({@link #enter}); refused, it is
 *       answered NO_SEGMENT and nothing is written: the writer asks the master for another place.</li>
 *   <li>A <b>continuation</b> of a write admitted earlier (NODE_SHM_WRITE_END, NODE_PART_WRITE,
 *       NODE_PART_END) goes on while OPEN or CLOSING ({@link #carryOn}), so what was admitted can
 *       finish; once CLOSED it is refused too, and the write is dropped.</li>
 *   <li>Writes in progress are the frames between {@link #enter}/{@link #carryOn} and {@link #exit},
 *       plus the writes admitted and not yet ended (begun same-machine writes and writes in parts,
 *       which span frames), counted by the ledger.</li>
 *   <li>A write becomes readable only through {@link #endWrite} (or {@link #carve}), atomically with
 *       the gate's state: one still running when a registration gave up waiting for it (the region
 *       wait ran out) is dropped instead of becoming readable after the inventory was taken.</li>
 * </ul>
 * Thread-safe. Lock order: this gate's monitor, then the ledger's lock (never the other way round).
 */
final class WriteGate {

    enum State { CLOSED, OPEN, CLOSING }

    /** The ledger whose objects this gate admits: writes in progress are counted there, and made readable here. */
    private final RegionLedger ledger;
    @GuardedBy("this")
    private State state = State.CLOSED;
    @GuardedBy("this")
    private boolean draining;
    @GuardedBy("this")
    private int frames;

    WriteGate(RegionLedger ledger) {
        this.ledger = ledger;
    }

    /**
     * Ends a write admitted through this gate ({@link RegionLedger#endWrite}): readable with {@code ok},
     * unless the gate closed since (a registration or a stop that gave up waiting for it took its
     * snapshot without it), then dropped. Atomic with the closing: an object becomes readable either
     * before the gate closed, and is then in the registration's inventory, or never.
     */
    synchronized boolean endWrite(RegionLedger.Region r, boolean ok) {
        return ledger.endWrite(r, ok && state != State.CLOSED);
    }

    /** {@link RegionLedger#carve} of a same-machine lease write, refused NO_SEGMENT once the gate closed (as {@link #endWrite}). */
    synchronized io.kvpool.protocol.ResultCode carve(RegionLedger.LeaseRange lease, long offset, long length,
                                                     long generation, long writeEpoch, byte[] key, long valueLength,
                                                     int valueCrc) {
        if (state == State.CLOSED) {
            return io.kvpool.protocol.ResultCode.NO_SEGMENT;
        }
        return ledger.carve(lease, offset, length, generation, writeEpoch, key, valueLength, valueCrc);
    }

    /** A new write may begin: true (and counted until {@link #exit}) only while OPEN. */
    synchronized boolean enter() {
        if (state != State.OPEN) {
            return false;
        }
        frames++;
        return true;
    }

    /** A write admitted earlier may go on: true (and counted until {@link #exit}) while OPEN or CLOSING. */
    synchronized boolean carryOn() {
        if (state == State.CLOSED) {
            return false;
        }
        frames++;
        return true;
    }

    /** The frame counted by {@link #enter} or {@link #carryOn} is done. */
    synchronized void exit() {
        frames--;
        notifyAll();
    }

    /** Registered: writes are admitted, unless the node is draining. */
    synchronized void open() {
        if (!draining) {
            state = State.OPEN;
        }
    }

    /**
     * Stops admitting new writes and waits, up to {@code maxWait}, for those in progress to end; then
     * refuses their continuations too. Returns whether they all ended in time.
     */
    boolean close(Duration maxWait) throws InterruptedException {
        synchronized (this) {
            state = State.CLOSING;
        }
        boolean quiet = awaitQuiet(maxWait);
        synchronized (this) {
            state = State.CLOSED;
        }
        return quiet;
    }

    /** {@link #close}, for good: the node is stopping for a restart. */
    boolean drain(Duration maxWait) throws InterruptedException {
        synchronized (this) {
            draining = true;
        }
        return close(maxWait);
    }

    synchronized State state() {
        return state;
    }

    synchronized boolean draining() {
        return draining;
    }

    /** Write frames in progress and writes admitted and not ended. */
    synchronized int inProgress() {
        return frames + ledger.writesInProgress();
    }

    private boolean awaitQuiet(Duration maxWait) throws InterruptedException {
        long deadline = System.nanoTime() + maxWait.toNanos();
        synchronized (this) {
            while (frames + ledger.writesInProgress() > 0) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    return false;
                }
                // frames wake us as they exit; held writes end under the ledger's lock, so look again soon
                wait(Math.max(1, Math.min(10, left / 1_000_000)));
            }
            return true;
        }
    }
}
