package io.kvpool.node.disk;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.protocol.ObjectLayout;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.Supplier;

/**
 * What the tier holds: every live object's {@link Slot}, by generation and by key, in eviction order;
 * the store's one lock; the work that dropping objects leaves for the writer; the tier's counters.
 *
 * <h2>The store lock</h2>
 * {@link #lock} guards everything here, and also the fields of {@link Slot}, the bookkeeping of each
 * {@link DataFile} (size, live, slots, readers, flags), the file set of {@link LogFiles}, the queue of
 * {@link Staging} and the pass counters of {@link AppendWriter}: one lock for the whole store, so that
 * no two locks are ever taken in an order. It is held for map and counter updates only, never for I/O
 * (callers copy what they need, unlock, then read or write). Two conditions: {@link #work} wakes the
 * writer (a record became ready, housekeeping is wanted, the store is closing), {@link #progress} wakes
 * waiters of flush and close (a batch was committed, a housekeeping pass ended, the writer ended).
 *
 * <h2>Index</h2>
 * Generation to slot, plus key to the slot of its newest generation: a second generation of a key
 * replaces the older one (reported dropped). Two intrusive {@link ColdList}s give the eviction order
 * without sorting: objects never read, in insertion (at open: scan) order, then objects read, least
 * recently read first; a read moves its object to the tail. About 250 bytes plus the key per object.
 *
 * <h2>Invariants</h2>
 * <ul>
 *   <li>A slot is in {@code index} iff it is {@link Slot#live live}; then it is also in {@code byKey}
 *       (a key has at most one live generation), in exactly one cold list, and in its file's
 *       {@code slots} at {@link Slot#fileIndex}.</li>
 *   <li>{@code liveBytes} is the sum of the live slots' record lengths; a file's {@code live} the sum
 *       of its own.</li>
 *   <li>The last record of a generation in append order (file number, offset) decides whether it is
 *       live: every other copy written, and the record of every dropped slot, gets a {@link Tomb}
 *       queued here for the writer, with {@link #housekeepingWanted} set.</li>
 * </ul>
 */
final class DiskIndex {

    /** A record to mark DEAD. */
    record Tomb(DataFile file, long offset) {
    }

    final ReentrantLock lock = new ReentrantLock();
    /** Signals the writer: a record became ready, housekeeping is wanted, or the store is closing. */
    final Condition work = lock.newCondition();
    /** Signals waiters of flush/close: a batch was committed, a housekeeping pass ended, the writer ended. */
    final Condition progress = lock.newCondition();

    // ---- guarded by lock ----
    @GuardedBy("lock")
    private final Map<Long, Slot> index = new HashMap<>();
    @GuardedBy("lock")
    private final Map<String, Slot> byKey = new HashMap<>();
    /** Eviction order: never-read objects first, oldest first; then read ones, least recently read first. */
    @GuardedBy("lock")
    private final ColdList neverRead = new ColdList();
    @GuardedBy("lock")
    private final ColdList readOnce = new ColdList();
    @GuardedBy("lock")
    private long liveBytes;
    @GuardedBy("lock")
    private List<Tomb> tombs = new ArrayList<>();
    /** Slots dropped by readers (checksum failures), reported to the listener by the writer. */
    @GuardedBy("lock")
    private List<Slot> dropReports = new ArrayList<>();
    /** Asks the writer for a housekeeping pass. */
    @GuardedBy("lock")
    boolean housekeepingWanted;
    /** Spills from epochs before this are refused (the last {@link DiskStore#reset}). */
    @GuardedBy("lock")
    long fenceEpoch = Long.MIN_VALUE;
    /** The store closed: reads find nothing. */
    @GuardedBy("lock")
    boolean closed;

    // ---- counters, for DiskStore.Stats; guarded by lock ----
    @GuardedBy("lock")
    long hits;
    @GuardedBy("lock")
    long bytesRead;
    @GuardedBy("lock")
    long bytesWritten;
    @GuardedBy("lock")
    long drops;
    /** Write batches that failed with an I/O error (their records are among the drops). */
    @GuardedBy("lock")
    long writeErrors;
    @GuardedBy("lock")
    long evictions;
    @GuardedBy("lock")
    long compactions;
    @GuardedBy("lock")
    long checksumFailures;
    @GuardedBy("lock")
    long skippedRecords;

    /** Runs {@code body} under the lock. */
    <T> T locked(Supplier<T> body) {
        lock.lock();
        try {
            return body.get();
        } finally {
            lock.unlock();
        }
    }

    /** Runs {@code body} under the lock. */
    void withLock(Runnable body) {
        lock.lock();
        try {
            body.run();
        } finally {
            lock.unlock();
        }
    }

    // ------------------------------------------------------------------------------------------------
    // queries (under lock)
    // ------------------------------------------------------------------------------------------------

    @GuardedBy("lock")
    Slot get(long generation) {
        return index.get(generation);
    }

    /** The slot of the newest generation of {@code key} (bytes as Latin-1), or null. */
    @GuardedBy("lock")
    Slot newest(String key) {
        return byKey.get(key);
    }

    @GuardedBy("lock")
    int size() {
        return index.size();
    }

    @GuardedBy("lock")
    long liveBytes() {
        return liveBytes;
    }

    @GuardedBy("lock")
    List<DiskStore.Entry> entries() {
        List<DiskStore.Entry> out = new ArrayList<>(index.size());
        for (Slot s : index.values()) {
            out.add(s.entry());
        }
        return out;
    }

    // ------------------------------------------------------------------------------------------------
    // changes (under lock)
    // ------------------------------------------------------------------------------------------------

    @GuardedBy("lock")
    private void addSlot(Slot s, DataFile f, long offset) {
        linkToFile(s, f, offset);
        liveBytes += s.recordLength;
        index.put(s.generation, s);
        byKey.put(s.key, s);
        neverRead.addLast(s);
    }

    private static void linkToFile(Slot s, DataFile f, long offset) {
        s.file = f;
        s.offset = offset;
        s.fileIndex = f.slots.size();
        f.slots.add(s);
        f.live += s.recordLength;
    }

    private static void unlinkFromFile(Slot s) {
        DataFile f = s.file;
        Slot last = f.slots.removeLast();
        if (last != s) {
            f.slots.set(s.fileIndex, last);
            last.fileIndex = s.fileIndex;
        }
        f.live -= s.recordLength;
    }

    /** Removes a live slot from the index; with {@code tomb}, queues the DEAD mark of its record. */
    @GuardedBy("lock")
    private void dropSlot(Slot s, boolean tomb) {
        s.live = false;
        s.list.remove(s);
        index.remove(s.generation);
        byKey.remove(s.key, s);
        unlinkFromFile(s);
        liveBytes -= s.recordLength;
        if (tomb) {
            tomb(s.file, s.offset);
        }
    }

    /** Moves a slot's record to {@code to} at {@code offset} (a later copy of the same bytes). */
    @GuardedBy("lock")
    void relocate(Slot s, DataFile to, long offset) {
        unlinkFromFile(s);
        linkToFile(s, to, offset);
    }

    /** Queues the DEAD mark of the record at {@code offset} of {@code f}, for the writer's next pass. */
    @GuardedBy("lock")
    void tomb(DataFile f, long offset) {
        tombs.add(new Tomb(f, offset));
        housekeepingWanted = true;
    }

    @GuardedBy("lock")
    boolean hasTombs() {
        return !tombs.isEmpty();
    }

    /** The tombstones queued so far, for the writer to write; the queue starts empty again. */
    @GuardedBy("lock")
    List<Tomb> takeTombs() {
        List<Tomb> marks = tombs;
        tombs = new ArrayList<>();
        return marks;
    }

    /** The slots readers dropped so far, for the writer to report; the list starts empty again. */
    @GuardedBy("lock")
    List<Slot> takeDropReports() {
        List<Slot> reports = dropReports;
        dropReports = new ArrayList<>();
        return reports;
    }

    /**
     * A live record found by the scan at open. Records are scanned in append order (file number,
     * offset), and the last record of a generation decides: a later copy replaces an earlier one (left
     * by a crash during compaction: same generation, same bytes), which is marked dead. Of two
     * generations of a key, the newer one is kept.
     */
    @GuardedBy("lock")
    void admitScanned(DataFile f, long offset, ObjectLayout.Header h) {
        Slot earlier = index.get(h.generation());
        if (earlier != null) {
            tomb(earlier.file, earlier.offset);
            relocate(earlier, f, offset);
            return;
        }
        String key = new String(h.key(), StandardCharsets.ISO_8859_1);
        Slot same = byKey.get(key);
        if (same != null) {
            if (same.generation > h.generation()) {
                tomb(f, offset);
                return;
            }
            dropSlot(same, true);
        }
        addSlot(new Slot(key, h.generation(), h.epoch(), h.valueLength(), h.valueCrc()), f, offset);
    }

    /** A tombstone found by the scan: the last record of its generation, it kills the copies before it. */
    @GuardedBy("lock")
    void deadScanned(ObjectLayout.Header h) {
        Slot earlier = index.get(h.generation());
        if (earlier != null) {
            dropSlot(earlier, true);
        }
    }

    /**
     * Indexes a record the writer wrote and forced: {@code stored} gets its entry, {@code superseded}
     * the older generation of its key it replaced. A record older than what is here is marked dead.
     */
    @GuardedBy("lock")
    void commit(Staging.Pending p, List<DiskStore.Entry> stored, List<Slot> superseded) {
        Slot existing = index.get(p.generation);
        if (existing != null) {
            // cannot happen (offer refuses a generation that is stored or queued); if it did, the new
            // copy is the last record of the generation, so it becomes the live one
            tomb(existing.file, existing.offset);
            relocate(existing, p.file, p.filePos);
            return;
        }
        String key = new String(p.key, StandardCharsets.ISO_8859_1);
        Slot same = byKey.get(key);
        if (same != null && same.generation > p.generation) {
            tomb(p.file, p.filePos);
            return;
        }
        if (same != null) {
            dropSlot(same, true);
            superseded.add(same);
        }
        Slot s = new Slot(key, p.generation, p.epoch, p.valueLength, p.valueCrc);
        addSlot(s, p.file, p.filePos);
        stored.add(s.entry());
    }

    /** Drops a live object at the caller's request (not reported) and wakes the writer. Whether it was here. */
    @GuardedBy("lock")
    boolean remove(long generation) {
        Slot s = index.get(generation);
        if (s == null) {
            return false;
        }
        dropSlot(s, true);
        work.signal();
        return true;
    }

    /** Refuses epochs before {@code epoch} from now on and drops their objects. Returns how many. */
    @GuardedBy("lock")
    long dropOlderThan(long epoch) {
        fenceEpoch = Math.max(fenceEpoch, epoch);
        List<Slot> old = new ArrayList<>();
        for (Slot s : index.values()) {
            if (s.epoch < epoch) {
                old.add(s);
            }
        }
        for (Slot s : old) {
            dropSlot(s, true);
        }
        return old.size();
    }

    /**
     * Evicts objects, coldest first, until live bytes are at most {@code target}; {@code evicted} gets
     * them. Returns how many went. O(1) per object: the coldness lists are kept in order as objects are
     * stored and read.
     */
    @GuardedBy("lock")
    int evictDownTo(long target, List<Slot> evicted) {
        int n = 0;
        while (liveBytes > target) {
            Slot s = neverRead.head() != null ? neverRead.head() : readOnce.head();
            if (s == null) {
                break;
            }
            dropSlot(s, true);
            evicted.add(s);
            evictions++;
            n++;
        }
        return n;
    }

    /** A read of {@code s} returned its value: counted, and {@code s} is now the most recently read. */
    @GuardedBy("lock")
    void readOk(Slot s) {
        hits++;
        bytesRead += s.valueLength;
        if (s.hits < Integer.MAX_VALUE) {
            s.hits++;
        }
        if (s.live) {
            s.list.remove(s);
            readOnce.addLast(s); // now the most recently read
        }
    }

    /** A read of {@code s} found its bytes damaged: counted, and {@code s} dropped and reported by the writer. */
    @GuardedBy("lock")
    void readCorrupt(Slot s) {
        checksumFailures++;
        if (s.live) {
            dropSlot(s, true);
            dropReports.add(s);
            work.signal();
        }
    }
}
