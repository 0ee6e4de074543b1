package io.kvpool.node;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.ResultCode;

import java.lang.foreign.MemorySegment;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The node's record of which regions of its segment hold which objects, and which transfers are in
 * progress on them. It is what makes reads safe while the master reuses space.
 *
 * <h2>The problem</h2>
 * The master allocates and frees regions; it may free an object (remove, eviction, reset) and hand
 * an overlapping range to a new put while a client is still reading the old object from this node.
 * The master never waits for readers (probes and reads take no leases there), so the node must
 * guarantee on its own that <em>a reader never receives bytes of another object or of a partial
 * object</em>.
 *
 * <h2>The rules</h2>
 * <ol>
 *   <li>A read names (offset, generation). It is admitted only if a region starts at that offset with
 *       that generation and is {@code COMPLETE}; the region is then pinned ({@code readers++}) until
 *       the reply's last byte is written.</li>
 *   <li>A write is admitted only when no overlapping region is pinned by a reader or being written.
 *       Otherwise it waits (bounded by the region wait timeout, then fails as a value). Once
 *       admitted, every overlapping region is dropped and its header marked dead, and the new region
 *       is entered as {@code WRITING}; it becomes {@code COMPLETE} only after its last byte arrived.</li>
 *   <li>Free and reset never wait: a pinned region is only flagged {@code dead} (no new reads) and
 *       leaves the ledger when its last reader finishes.</li>
 *   <li>Writes carry the cluster epoch of their put; a write from an older epoch than the node has
 *       seen is refused ({@code FENCED}), so a put that started before a reset cannot land after it.</li>
 * </ol>
 * Together: bytes under a pinned region cannot change, and a region answers only for the generation
 * written into it, so a read returns exactly the object it asked for or a miss.
 *
 * <h2>Concurrency</h2>
 * One lock guards the map; it is held only for map operations, never during I/O. Writers waiting
 * for readers park on one condition that every state change signals.
 */
final class RegionLedger {

    /** One region of the segment. Fields other than the final ones are guarded by the ledger lock. */
    static final class Region {
        final long offset;
        final long length;
        final long generation;
        final long epoch;
        final byte[] key;
        final long valueLength;
        boolean complete;
        boolean writing;
        boolean dead;
        /** Moved to the SSD tier ({@link #retire}): not readable here, its header kept until the space is taken. */
        boolean retired;
        int readers;

        Region(long offset, long length, long generation, long epoch, byte[] key, long valueLength) {
            this.offset = offset;
            this.length = length;
            this.generation = generation;
            this.epoch = epoch;
            this.key = key;
            this.valueLength = valueLength;
        }

        long end() {
            return offset + length;
        }

        boolean busy() {
            return writing || readers > 0;
        }

        long valueOffset() {
            return offset + ObjectLayout.valueOffset(key.length);
        }
    }

    /** Outcome of asking to write: the admitted region, or why not. */
    record WriteAdmission(Region region, ResultCode refusal) {
    }

    private final MemorySegment memory;
    private final ReentrantLock lock = new ReentrantLock();
    private final Condition changed = lock.newCondition();
    @GuardedBy("lock")
    private final TreeMap<Long, Region> regions = new TreeMap<>();
    @GuardedBy("lock")
    private long epoch;
    @GuardedBy("lock")
    private long completeCount;
    @GuardedBy("lock")
    private long completeBytes;
    /** Regions {@link #retire}d and not dropped since, by generation. */
    @GuardedBy("lock")
    private final Map<Long, Region> retiredByGeneration = new java.util.HashMap<>();
    /** Regions being written that will be objects (lease ranges not counted): {@link #writesInProgress}. */
    @GuardedBy("lock")
    private int writes;
    /** The generation of a same-machine lease range held as one region ({@link #beginLease}): no object's. */
    static final long LEASE_GENERATION = -1;

    RegionLedger(MemorySegment memory) {
        this.memory = memory;
    }

    long epoch() {
        lock.lock();
        try {
            return epoch;
        } finally {
            lock.unlock();
        }
    }

    /** Objects fully written and not freed. */
    long objectCount() {
        lock.lock();
        try {
            return completeCount;
        } finally {
            lock.unlock();
        }
    }

    long objectBytes() {
        lock.lock();
        try {
            return completeBytes;
        } finally {
            lock.unlock();
        }
    }

    /**
     * Admits a write of a new region, waiting up to {@code maxWait} for overlapping reads and writes
     * to finish. Refusals: {@code FENCED} for a write from an older epoch, {@code FAILED} when the
     * range stayed busy for the whole wait.
     */
    WriteAdmission beginWrite(long offset, long length, long generation, long writeEpoch, byte[] key,
                              long valueLength, Duration maxWait) throws InterruptedException {
        long deadline = System.nanoTime() + maxWait.toNanos();
        lock.lock();
        try {
            while (true) {
                if (writeEpoch < epoch) {
                    return new WriteAdmission(null, ResultCode.FENCED);
                }
                List<Region> overlapping = overlapping(offset, offset + length);
                boolean busy = false;
                for (Region r : overlapping) {
                    busy |= r.busy();
                }
                if (!busy) {
                    for (Region r : overlapping) {
                        drop(r);
                    }
                    Region fresh = new Region(offset, length, generation, writeEpoch, key, valueLength);
                    fresh.writing = true;
                    if (generation != LEASE_GENERATION) {
                        writes++;
                    }
                    regions.put(offset, fresh);
                    return new WriteAdmission(fresh, null);
                }
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    return new WriteAdmission(null, ResultCode.FAILED);
                }
                changed.awaitNanos(left);
            }
        } finally {
            lock.unlock();
        }
    }

    /**
     * Ends a write. With {@code ok} the region becomes readable, unless it was freed or reset while
     * it was being written; otherwise it is dropped.
     *
     * @return true when the region is now complete and readable
     */
    boolean endWrite(Region r, boolean ok) {
        lock.lock();
        try {
            if (r.writing && r.generation != LEASE_GENERATION) {
                writes--;
            }
            r.writing = false;
            boolean readable = ok && !r.dead && r.epoch >= epoch && regions.get(r.offset) == r;
            if (readable) {
                ObjectLayout.setState(memory, r.offset, ObjectLayout.STATE_COMPLETE);
                r.complete = true;
                completeCount++;
                completeBytes += r.length;
            } else {
                // the writer may have stamped its header after a free or reset marked it dead
                ObjectLayout.setState(memory, r.offset, ObjectLayout.STATE_DEAD);
                if (regions.get(r.offset) == r) {
                    drop(r);
                }
            }
            changed.signalAll();
            return readable;
        } finally {
            lock.unlock();
        }
    }

    /**
     * Whether a region admitted for writing would still become readable if its write ended now: not
     * freed or reset since its admission. A writer that takes parts over time asks before each part,
     * so that bytes for a fenced write are not moved at all ({@link #endWrite} decides in the end).
     */
    boolean stillWritable(Region r) {
        lock.lock();
        try {
            return r.writing && !r.dead && r.epoch >= epoch && regions.get(r.offset) == r;
        } finally {
            lock.unlock();
        }
    }

    /**
     * Sets a same-machine writer's lease range aside: admitted as a write is (waiting for readers and
     * writers of the space, dropping what overlaps, fencing old epochs), then held as one region being
     * written that no read can name (generation -1). Objects are carved from its front with
     * {@link #carve}; the writer's connection closing ends it ({@link #endWrite} with false).
     */
    WriteAdmission beginLease(long offset, long length, long writeEpoch, Duration maxWait) throws InterruptedException {
        return beginWrite(offset, length, LEASE_GENERATION, writeEpoch, new byte[0], 0, maxWait);
    }

    /** What {@link #carve} did: the object's code, and the lease region left (null when nothing is left). */
    record Carved(ResultCode code, Region rest) {
    }

    /**
     * Records an object the lease's writer copied into {@code [offset, offset + length)}: it must lie
     * in the lease region, at or after its start. The object becomes complete and readable (its header
     * stamped {@code COMPLETE} with the fields given); the lease region shrinks to what follows it (what
     * lay before it was never an object). Refused with FENCED when a reset since voided the lease, and
     * FAILED when the range is not the lease's; then the lease region is unchanged.
     */
    Carved carve(Region lease, long offset, long length, long generation, long writeEpoch, byte[] key,
                 long valueLength, int valueCrc) {
        lock.lock();
        try {
            if (lease.dead || writeEpoch < epoch || lease.epoch < epoch) {
                return new Carved(ResultCode.FENCED, lease);
            }
            if (regions.get(lease.offset) != lease || offset < lease.offset || offset + length > lease.end()
                    || length <= 0) {
                return new Carved(ResultCode.FAILED, lease);
            }
            regions.remove(lease.offset);
            Region obj = new Region(offset, length, generation, writeEpoch, key, valueLength);
            ObjectLayout.writeHeader(memory, offset, ObjectLayout.STATE_COMPLETE, key, valueLength, generation,
                    writeEpoch, valueCrc);
            obj.complete = true;
            completeCount++;
            completeBytes += length;
            regions.put(offset, obj);
            Region rest = null;
            if (obj.end() < lease.end()) {
                rest = new Region(obj.end(), lease.end() - obj.end(), LEASE_GENERATION, lease.epoch, lease.key, 0);
                rest.writing = true;
                regions.put(rest.offset, rest);
            }
            changed.signalAll();
            return new Carved(ResultCode.OK, rest);
        } finally {
            lock.unlock();
        }
    }

    /** Pins a complete region for reading, or returns null when (offset, generation) names no readable object. */
    Region beginRead(long offset, long generation) {
        lock.lock();
        try {
            Region r = regions.get(offset);
            if (r == null || r.generation != generation || !r.complete || r.dead) {
                return null;
            }
            r.readers++;
            return r;
        } finally {
            lock.unlock();
        }
    }

    /** Unpins a region after its bytes were sent. */
    void endRead(Region r) {
        lock.lock();
        try {
            r.readers--;
            if (r.readers == 0) {
                if (r.dead && regions.get(r.offset) == r) {
                    regions.remove(r.offset);
                }
                changed.signalAll();
            }
        } finally {
            lock.unlock();
        }
    }

    /** Drops a region the master freed. Returns true if it was here. */
    boolean free(long offset, long generation) {
        lock.lock();
        try {
            Region r = regions.get(offset);
            if (r == null || r.generation != generation || r.dead) {
                return false;
            }
            drop(r);
            changed.signalAll();
            return true;
        } finally {
            lock.unlock();
        }
    }

    /**
     * The master moved this object to the SSD tier (a NODE_FREE with the spill flag) after its value
     * was copied out for the disk: it is no longer readable here and its space is the master's to hand
     * out again, but its header stays COMPLETE, and the region stays in the ledger, until a write takes
     * any of that space (then it is dropped, header marked dead, as any overlapped region) or the SSD
     * tier lets the copy go ({@link #dropRetired}). So a node killed while the copy is still on its way
     * to the disk (in the staging queue) finds the object again in its segment file when it restarts:
     * an object caught between the tiers is kept in one of them, and if it reached both, the master
     * keeps one (issue 32). Returns true if the region was here.
     */
    boolean retire(long offset, long generation) {
        lock.lock();
        try {
            Region r = regions.get(offset);
            if (r == null || r.generation != generation || r.dead || r.retired) {
                return false;
            }
            if (r.complete) {
                r.complete = false;
                completeCount--;
                completeBytes -= r.length;
            }
            r.retired = true;
            retiredByGeneration.put(generation, r);
            changed.signalAll();
            return true;
        } finally {
            lock.unlock();
        }
    }

    /**
     * The SSD tier let the copy of {@code generation} go (the master freed it: removed, replaced,
     * promoted back to memory; or it refused the spill): the memory copy {@link #retire} kept goes too,
     * so it cannot come back at a restart. Returns true if there was one.
     */
    boolean dropRetired(long generation) {
        lock.lock();
        try {
            Region r = retiredByGeneration.remove(generation);
            if (r == null || regions.get(r.offset) != r || r.dead) {
                return false;
            }
            drop(r);
            changed.signalAll();
            return true;
        } finally {
            lock.unlock();
        }
    }

    /**
     * Moves to {@code newEpoch} (never backwards) and drops every object from an older epoch. Returns
     * how many complete objects were dropped. Writes from older epochs already admitted finish their
     * transfer but never become readable. Writes of the new epoch itself are kept: the master may
     * place a new-epoch put before this node hears of the reset.
     */
    long reset(long newEpoch) {
        lock.lock();
        try {
            long before = completeCount;
            epoch = Math.max(epoch, newEpoch);
            for (Region r : new ArrayList<>(regions.values())) {
                if (r.epoch < epoch) {
                    drop(r);
                }
            }
            long dropped = before - completeCount;
            changed.signalAll();
            return dropped;
        } finally {
            lock.unlock();
        }
    }

    /** Raises the epoch without dropping anything (the master adopted this epoch for our objects). */
    void adoptEpoch(long newEpoch) {
        lock.lock();
        try {
            epoch = Math.max(epoch, newEpoch);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Enters an object found intact in an adopted segment ({@link SegmentAdoption}) as a complete
     * region, before the node serves: 64-byte aligned, inside the segment, overlapping no region
     * already entered. Returns false (and enters nothing) when any of that does not hold. The
     * ledger's epoch becomes the newest of the adopted objects'.
     */
    boolean adopt(long offset, long length, long generation, long objectEpoch, byte[] key, long valueLength) {
        if (offset < 0 || offset % ObjectLayout.ALIGNMENT != 0 || length <= 0 || offset + length > memory.byteSize()
                || offset + length < 0) {
            return false;
        }
        lock.lock();
        try {
            Map.Entry<Long, Region> before = regions.floorEntry(offset);
            if (before != null && before.getValue().end() > offset) {
                return false;
            }
            Map.Entry<Long, Region> after = regions.ceilingEntry(offset);
            if (after != null && after.getKey() < offset + length) {
                return false;
            }
            Region r = new Region(offset, length, generation, objectEpoch, key, valueLength);
            r.complete = true;
            regions.put(offset, r);
            completeCount++;
            completeBytes += length;
            epoch = Math.max(epoch, objectEpoch);
            return true;
        } finally {
            lock.unlock();
        }
    }

    /**
     * Objects admitted for writing whose write has not ended (not counting same-machine lease ranges,
     * which hold space rather than an object): what a registration or a stop waits for ({@link WriteGate}).
     */
    int writesInProgress() {
        lock.lock();
        try {
            return writes;
        } finally {
            lock.unlock();
        }
    }

    /** A snapshot of the readable regions, for the inventory sent at registration. */
    List<Region> completeRegions() {
        lock.lock();
        try {
            List<Region> out = new ArrayList<>((int) Math.min(Integer.MAX_VALUE - 8, completeCount));
            for (Region r : regions.values()) {
                if (r.complete && !r.dead) {
                    out.add(r);
                }
            }
            return out;
        } finally {
            lock.unlock();
        }
    }

    /** Waits until no transfer is in progress, for a clean shutdown. */
    boolean awaitIdle(Duration maxWait) throws InterruptedException {
        long deadline = System.nanoTime() + maxWait.toNanos();
        lock.lock();
        try {
            while (true) {
                boolean busy = false;
                for (Region r : regions.values()) {
                    busy |= r.busy();
                }
                if (!busy) {
                    return true;
                }
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    return false;
                }
                changed.await(Math.min(left, TimeUnit.MILLISECONDS.toNanos(100)), TimeUnit.NANOSECONDS);
            }
        } finally {
            lock.unlock();
        }
    }

    /** Regions intersecting [start, end). */
    @GuardedBy("lock")
    private List<Region> overlapping(long start, long end) {
        List<Region> out = new ArrayList<>(2);
        Map.Entry<Long, Region> before = regions.floorEntry(start);
        if (before != null && before.getValue().end() > start) {
            out.add(before.getValue());
        }
        Iterator<Region> it = regions.subMap(start, false, end, false).values().iterator();
        while (it.hasNext()) {
            out.add(it.next());
        }
        return out;
    }

    /**
     * Makes a region unreadable: marks its header dead, and removes it unless a transfer still needs
     * it (then it leaves when the transfer ends).
     */
    @GuardedBy("lock")
    private void drop(Region r) {
        if (r.retired) {
            retiredByGeneration.remove(r.generation, r);
        }
        if (r.complete) {
            r.complete = false;
            completeCount--;
            completeBytes -= r.length;
        }
        if (!r.dead) {
            r.dead = true;
            ObjectLayout.setState(memory, r.offset, ObjectLayout.STATE_DEAD);
        }
        if (!r.busy()) {
            regions.remove(r.offset);
        }
    }
}
