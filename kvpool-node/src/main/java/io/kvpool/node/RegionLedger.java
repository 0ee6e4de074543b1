package io.kvpool.node;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.ResultCode;

import java.lang.foreign.MemorySegment;
import java.lang.invoke.VarHandle;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Set;
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
 * <h2>Lease ranges and stamped objects</h2>
 * A same-machine writer's lease range ({@link LeaseRange}) is one region being written. Since protocol
 * version 16 its writer may stamp objects in it and tell only the master, so the ledger may not know an
 * object a read names. Every lookup by offset ({@link #beginRead}, {@link #free}, {@link #retire}) that
 * lands in a held range, and every count, settles the range first ({@link #settle}): the stamped objects at
 * its front become regions under the rules above, as if the writer had recorded them. The writer fills the
 * range front to back without gaps and commits only after stamping, so an object the master knows is always
 * reachable by that walk.
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
        /** For the front of a same-machine lease range ({@link #beginLease}), that range; null for objects. */
        LeaseRange held;

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
    /** Whether {@link #settle} checks a stamped value against its CRC32C too ({@code --verify-writes}). */
    private final boolean verifyStamps;
    @GuardedBy("lock")
    private long stamped;
    @GuardedBy("lock")
    private long stampedBytes;
    /** Stamped objects dropped when settled: their value did not match its checksum ({@code --verify-writes}). */
    @GuardedBy("lock")
    private long refusedStamps;
    /** The lease ranges held now ({@link #beginLease}), settled whenever the counts are read ({@link #settleAll}). */
    @GuardedBy("lock")
    private final Set<LeaseRange> held = new HashSet<>();

    RegionLedger(MemorySegment memory) {
        this(memory, false);
    }

    RegionLedger(MemorySegment memory, boolean verifyStamps) {
        this.memory = memory;
        this.verifyStamps = verifyStamps;
    }

    long epoch() {
        lock.lock();
        try {
            return epoch;
        } finally {
            lock.unlock();
        }
    }

    /** Objects fully written and not freed (those stamped in lease ranges settled first). */
    long objectCount() {
        lock.lock();
        try {
            settleAll();
            return completeCount;
        } finally {
            lock.unlock();
        }
    }

    long objectBytes() {
        lock.lock();
        try {
            settleAll();
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
     * A same-machine writer's lease range on this node (docs/protocol.md, section 4.28): the part not yet
     * made into objects is one region being written that no read can name ({@link #front}). Objects come
     * off its front in two ways: the writer records them ({@link #carve}, NODE_SHM_LEASE_WRITE), or it
     * stamps each object's header itself and tells only the master, and the node finds them when anything
     * asks about that space ({@link #settle}, protocol version 16). Guarded by the ledger's lock.
     */
    static final class LeaseRange {
        private Region front;
        /** The lease's block of generations: a stamped header outside it, or not above the last one taken, is no object of this lease. */
        private long nextGeneration;
        private final long lastGeneration;

        private LeaseRange(long firstGeneration, long lastGeneration) {
            this.nextGeneration = firstGeneration;
            this.lastGeneration = lastGeneration;
        }
    }

    /** Outcome of asking for a lease range: the range, or why not. */
    record LeaseAdmission(LeaseRange range, ResultCode refusal) {
    }

    /**
     * Sets a same-machine writer's lease range aside: admitted as a write is (waiting for readers and
     * writers of the space, dropping what overlaps, fencing old epochs), then held as one region being
     * written that no read can name (generation -1). Objects come off its front ({@link #carve},
     * {@link #settle}); the writer's connection closing ends it ({@link #endLease}). Generations from
     * {@code firstGeneration} for {@code generationCount} are the lease's.
     */
    LeaseAdmission beginLease(long offset, long length, long writeEpoch, long firstGeneration, int generationCount,
                              Duration maxWait) throws InterruptedException {
        WriteAdmission a = beginWrite(offset, length, LEASE_GENERATION, writeEpoch, new byte[0], 0, maxWait);
        if (a.region() == null) {
            return new LeaseAdmission(null, a.refusal());
        }
        lock.lock();
        try {
            LeaseRange range = new LeaseRange(firstGeneration, firstGeneration + Math.max(0, generationCount) - 1);
            range.front = a.region();
            a.region().held = range;
            held.add(range);
            return new LeaseAdmission(range, null);
        } finally {
            lock.unlock();
        }
    }

    /** What is left of a lease range, after settling the objects stamped at its front; null when nothing is. */
    Region front(LeaseRange range) {
        lock.lock();
        try {
            settle(range);
            return range.front;
        } finally {
            lock.unlock();
        }
    }

    /**
     * Records an object the lease's writer copied into {@code [offset, offset + length)}: it must lie
     * in the lease range, at or after its front (objects stamped there are settled first). The object
     * becomes complete and readable (its header stamped {@code COMPLETE} with the fields given); the
     * range shrinks to what follows it (what lay before it was never an object). FENCED when a reset
     * since voided the lease, FAILED when the range is not the lease's; then the range is unchanged.
     */
    ResultCode carve(LeaseRange range, long offset, long length, long generation, long writeEpoch, byte[] key,
                     long valueLength, int valueCrc) {
        lock.lock();
        try {
            settle(range);
            Region lease = range.front;
            if (lease == null || lease.dead || writeEpoch < epoch || lease.epoch < epoch) {
                return lease == null ? ResultCode.FAILED : ResultCode.FENCED;
            }
            if (offset < lease.offset || offset + length > lease.end() || length <= 0) {
                return ResultCode.FAILED;
            }
            ObjectLayout.writeHeader(memory, offset, ObjectLayout.STATE_COMPLETE, key, valueLength, generation,
                    writeEpoch, valueCrc);
            takeFront(range, offset, length, generation, writeEpoch, key, valueLength);
            return ResultCode.OK;
        } finally {
            lock.unlock();
        }
    }

    /**
     * The writer's connection closed, or it set another range aside: what it stamped is settled, and
     * the rest of the range is let go (never readable).
     */
    void endLease(LeaseRange range) {
        lock.lock();
        try {
            settle(range);
            held.remove(range);
            if (range.front != null) {
                endWrite(range.front, false);
                range.front = null;
            }
        } finally {
            lock.unlock();
        }
    }

    /**
     * Settles every lease range held now ({@link #settle}): the counts, a registration's inventory and the
     * node's pages see what the writers stamped.
     */
    void settleAll() {
        lock.lock();
        try {
            for (Iterator<LeaseRange> it = held.iterator(); it.hasNext(); ) {
                LeaseRange range = it.next();
                settle(range);
                if (range.front == null || range.front.dead) {
                    it.remove();
                }
            }
        } finally {
            lock.unlock();
        }
    }

    /**
     * Makes the objects a writer stamped at the front of its lease range into complete regions, one after
     * another, while the header there verifies (section 8), says COMPLETE, is of the lease's epoch and
     * carries the next generation of its block, and its region lies in the range. The writer fills its
     * range from the front without gaps, writing each header's state last, and tells the master only after
     * that; so every object the master knows of in the range is settled by the time anything asks for it,
     * and a header not (or not yet) complete ends the walk. A stale header left in the space by an earlier
     * object fails the generation check.
     */
    @GuardedBy("lock")
    private void settle(LeaseRange range) {
        while (range.front != null && !range.front.dead && range.front.epoch >= epoch
                && range.nextGeneration <= range.lastGeneration) {
            Region lease = range.front;
            if (ObjectLayout.state(memory, lease.offset) != ObjectLayout.STATE_COMPLETE) {
                return;
            }
            VarHandle.acquireFence(); // the writer stores the state last
            ObjectLayout.Header h = ObjectLayout.readHeader(memory, lease.offset, lease.end());
            if (h == null || h.state() != ObjectLayout.STATE_COMPLETE || h.epoch() != lease.epoch
                    || h.generation() < range.nextGeneration || h.generation() > range.lastGeneration) {
                return;
            }
            if (verifyStamps && ObjectLayout.valueCrc(memory.asSlice(lease.offset
                    + ObjectLayout.valueOffset(h.keyLength()), h.valueLength())) != h.valueCrc()) {
                // --verify-writes: a value that is not what its writer checksummed is no object. Its header
                // verified, so its region is known, and the walk goes on past it to the writer's next object
                ObjectLayout.setState(memory, lease.offset, ObjectLayout.STATE_DEAD);
                takeFront(range, lease.offset, h.regionLength(), h.generation(), h.epoch(), null, 0);
                refusedStamps++;
                continue;
            }
            takeFront(range, lease.offset, h.regionLength(), h.generation(), h.epoch(), h.key(), h.valueLength());
            stamped++;
            stampedBytes += h.valueLength();
        }
    }

    /**
     * The object at {@code [offset, offset + length)} becomes complete (none does with a null key: the
     * space is skipped); the range keeps what follows it.
     */
    @GuardedBy("lock")
    private void takeFront(LeaseRange range, long offset, long length, long generation, long writeEpoch, byte[] key,
                           long valueLength) {
        Region lease = range.front;
        regions.remove(lease.offset);
        lease.held = null;
        if (key != null) {
            Region obj = new Region(offset, length, generation, writeEpoch, key, valueLength);
            obj.complete = true;
            completeCount++;
            completeBytes += length;
            regions.put(offset, obj);
        }
        range.nextGeneration = Math.max(range.nextGeneration, generation + 1);
        range.front = null;
        long end = offset + length;
        if (end < lease.end()) {
            Region rest = new Region(end, lease.end() - end, LEASE_GENERATION, lease.epoch, lease.key, 0);
            rest.writing = true;
            rest.held = range;
            regions.put(rest.offset, rest);
            range.front = rest;
        }
        changed.signalAll();
    }

    /**
     * The region at {@code offset}, settling the lease range it lies in first when that is where it would
     * be (an object stamped by its writer that nothing asked about yet).
     */
    @GuardedBy("lock")
    private Region at(long offset) {
        Region r = regions.get(offset);
        if (r != null && r.held == null) {
            return r;
        }
        Map.Entry<Long, Region> e = regions.floorEntry(offset);
        if (e != null && e.getValue().held != null && offset < e.getValue().end()) {
            settle(e.getValue().held);
            return regions.get(offset);
        }
        return r;
    }

    /** Objects settled from headers their writers stamped ({@link #settle}), since the node started. */
    long stampedObjects() {
        lock.lock();
        try {
            settleAll();
            return stamped;
        } finally {
            lock.unlock();
        }
    }

    /** Stamped objects dropped when settled because their value did not match its CRC32C ({@code --verify-writes}). */
    long refusedStamps() {
        lock.lock();
        try {
            settleAll();
            return refusedStamps;
        } finally {
            lock.unlock();
        }
    }

    /** Value bytes of the objects {@link #stampedObjects} counts. */
    long stampedBytes() {
        lock.lock();
        try {
            settleAll();
            return stampedBytes;
        } finally {
            lock.unlock();
        }
    }

    /** Pins a complete region for reading, or returns null when (offset, generation) names no readable object. */
    Region beginRead(long offset, long generation) {
        lock.lock();
        try {
            Region r = at(offset);
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
            Region r = at(offset);
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
            Region r = at(offset);
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

    /** A snapshot of the readable regions, for the inventory sent at registration; lease ranges are settled first. */
    List<Region> completeRegions() {
        lock.lock();
        try {
            settleAll();
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
