package io.kvpool.node.disk;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Set;

/**
 * Keeps the files within the capacity: evicts the coldest objects and compacts files, giving back the
 * space of dead records.
 *
 * <h2>Space</h2>
 * {@code usedBytes} is the bytes in files; {@code liveBytes} the bytes of live records. Before an
 * append would take usedBytes past {@code highWatermark * capacity} (and after a batch that did), the
 * writer evicts the coldest live objects until liveBytes (plus the record) is at most
 * {@code lowWatermark * capacity}: objects never read are coldest, oldest first, then objects by last
 * read. Then it compacts: a file less than half live has its live records copied to the active file
 * (forced), their slots moved, and is deleted, so each byte copied frees at least one. That rule also
 * runs after every batch and after removals. Under pressure (usedBytes still past the high watermark,
 * because eviction left garbage spread thin) the files with the most garbage are compacted whatever
 * their live fraction; if the record still does not fit, eviction goes on a file's worth at a time,
 * still coldest first. A compaction starts only if its copies fit, and an append only if the record
 * fits: usedBytes never exceeds the capacity. A record that cannot be placed is dropped (counted).
 * Files are at most a quarter of the capacity (an eighth by default), so that the live part of a
 * file with garbage to give back fits in the headroom left above the watermarks.
 *
 * <h2>Threads and locks</h2>
 * Writer thread only. The store's lock is taken to pick a file, evict, and move slots, never while
 * copying: a copy goes through the page cache and starts a fresh block (so no block is written both
 * through it and around it by an O_DIRECT append). Files being appended to (active or pinned) are never
 * compacted. A compacted file is deleted only after its copies were forced, and only when no read has it
 * pinned (else its last reader deletes it). A record dropped while it was being copied gets a tombstone
 * on its copy.
 */
final class Compactor {

    /** Logs as the store: the tier's messages keep one logger name. */
    private static final Logger log = LoggerFactory.getLogger(DiskStore.class);

    private final DiskIndex index;
    private final LogFiles files;
    private final Path dir;
    private final long capacity;
    private final long fileBytes;
    /** Used bytes past this start an eviction. */
    final long highMark;
    /** Live bytes an eviction brings usage down to. */
    private final long lowMark;
    /** Compaction copies go through this. */
    private final MemorySegment copyBuf;

    Compactor(DiskIndex index, LogFiles files, DiskStore.Config config, MemorySegment copyBuf) {
        this.index = index;
        this.files = files;
        this.dir = config.dir();
        this.capacity = config.capacityBytes();
        this.fileBytes = config.fileBytes();
        this.highMark = (long) (config.highWatermark() * config.capacityBytes());
        this.lowMark = (long) (config.lowWatermark() * config.capacityBytes());
        this.copyBuf = copyBuf;
    }

    /** Before appending {@code n} bytes: evicts and compacts past the high watermark. Whether n fits. */
    boolean ensureRoom(long n, List<Slot> evicted) {
        if (files.used() + n <= highMark) {
            return true;
        }
        return makeRoom(n, evicted);
    }

    /** A housekeeping pass: makes room if the files are {@code over} the high watermark, else compacts. */
    void reclaim(boolean over, List<Slot> evicted) {
        if (over) {
            makeRoom(0, evicted);
        } else {
            compact(0.5, -1);
        }
    }

    /**
     * Makes room for {@code need} more bytes; returns whether they fit in the capacity now.
     * <ol>
     *   <li>evicts the coldest objects until live bytes plus {@code need} are at most the low watermark;</li>
     *   <li>compacts every file less than half live (the standing policy);</li>
     *   <li>if the files are still past the high watermark, compacts the files with the most garbage
     *       whatever their live fraction, as long as the copies fit in the capacity;</li>
     *   <li>if {@code need} still does not fit, rolls the active file (so its garbage can go too) and
     *       evicts further, coldest first, one file's worth at a time, compacting after each step.</li>
     * </ol>
     * Eviction is always in coldness order: nothing warm goes while something colder is live.
     */
    private boolean makeRoom(long need, List<Slot> evicted) {
        long cap = capacity;
        evictColdest(lowMark - need, evicted);
        compact(0.5, -1);
        compact(1.0, highMark - need);
        long target = lowMark - need;
        while (files.used() + need > cap) {
            index.withLock(() -> {
                DataFile active = files.active;
                if (active != null && !active.pinned && active.live < active.size) {
                    files.active = null; // its garbage becomes compactable
                }
            });
            compact(1.0, cap - need);
            if (files.used() + need <= cap) {
                break;
            }
            target -= fileBytes;
            if (!evictColdest(target, evicted)) {
                break; // nothing left to evict: what remains is in files being written
            }
            compact(1.0, cap - need);
        }
        return files.used() + need <= cap;
    }

    /** Evicts objects, coldest first, until live bytes are at most {@code target}. Whether any went. */
    private boolean evictColdest(long target, List<Slot> evicted) {
        index.lock.lock();
        try {
            int n = index.evictDownTo(target, evicted);
            if (n > 0) {
                log.debug("disk tier {}: evicted {} objects, live {}", dir, n, index.liveBytes());
            }
            return n > 0;
        } finally {
            index.lock.unlock();
        }
    }

    /**
     * Compacts files whose live bytes are below {@code threshold} of their size, the one with the most
     * garbage first, while the copies fit in the capacity, until none is left or used bytes are at most
     * {@code untilUsed}. Files with nothing live are just deleted.
     */
    private void compact(double threshold, long untilUsed) {
        int budget = index.locked(files.byId::size);
        long cap = capacity;
        for (int i = 0; i < budget; i++) {
            DataFile pick = null;
            DataFile empty = null;
            index.lock.lock();
            try {
                if (files.usedBytes <= untilUsed) {
                    return;
                }
                for (DataFile f : files.byId.values()) {
                    if (f == files.active || f.pinned || f.noCompact || f.size == 0 || f.live >= threshold * f.size
                            || files.usedBytes + f.live > cap) {
                        continue;
                    }
                    if (pick == null || f.size - f.live > pick.size - pick.live) {
                        pick = f;
                    }
                }
                if (pick != null && pick.live == 0) {
                    index.compactions++;
                    empty = files.retire(pick);
                    if (empty == null) {
                        continue; // deleted when its last read ends
                    }
                }
            } finally {
                index.lock.unlock();
            }
            if (pick == null) {
                return;
            }
            if (empty != null) {
                empty.closeAndDelete();
            } else {
                compactFile(pick);
            }
        }
    }

    /** Copies the live records of {@code f} to the active file, moves their slots, and deletes {@code f}. */
    private void compactFile(DataFile f) {
        record Move(Slot slot, DataFile to, long offset) {
        }
        List<Slot> slots = index.locked(() -> new ArrayList<>(f.slots));
        // offsets of slots in f change only on this thread
        slots.sort(Comparator.comparingLong(s -> s.offset));
        List<Move> moves = new ArrayList<>(slots.size());
        Set<DataFile> touched = new LinkedHashSet<>();
        long copied = 0;
        IOException failure = null;
        try {
            for (Slot s : slots) {
                DataFile to = files.appendTarget(s.recordLength);
                Move prev = moves.isEmpty() ? null : moves.getLast();
                // copies go through the page cache: start them on a fresh block, so that no block is
                // written both through it and around it (by an append's O_DIRECT write)
                boolean follows = prev != null && prev.to() == to
                        && files.sizeOf(to) == prev.offset() + prev.slot().recordLength;
                long pos = files.claim(to, s.recordLength, false, !follows);
                touched.add(to);
                copy(f, s.offset, to, pos, s.recordLength);
                moves.add(new Move(s, to, pos)); // only copies written whole
                copied += s.recordLength;
            }
        } catch (IOException e) {
            failure = e;
        }
        long written = copied;
        try {
            for (DataFile t : touched) {
                t.force();
            }
        } catch (IOException e) {
            log.warn("disk tier {}: compaction of {} failed to force its copies, leaving it as it is: {}", dir, f,
                    e.toString());
            index.lock.lock();
            try {
                f.noCompact = true; // copies not known durable: the slots stay where they are
                index.bytesWritten += written;
            } finally {
                index.lock.unlock();
            }
            return;
        }
        if (failure != null) {
            // the copies made so far are durable and are the last records of their generations: move the
            // slots to them (as a restart would) and leave the rest in f, which is not compacted again
            log.warn("disk tier {}: compaction of {} failed after {} records, leaving the rest: {}", dir, f,
                    moves.size(), failure.toString());
        }
        DataFile toDelete = null;
        index.lock.lock();
        try {
            for (Move m : moves) {
                Slot s = m.slot();
                if (s.live && s.file == f) {
                    index.relocate(s, m.to(), m.offset());
                } else {
                    index.tomb(m.to(), m.offset()); // dropped while being copied
                }
            }
            index.bytesWritten += copied;
            if (failure == null) {
                index.compactions++;
                toDelete = files.retire(f);
            } else {
                f.noCompact = true;
            }
        } finally {
            index.lock.unlock();
        }
        log.debug("disk tier {}: compacted {} ({} records, {} copied)", dir, f, moves.size(), copied);
        if (toDelete != null) {
            toDelete.closeAndDelete();
        }
    }

    private void copy(DataFile from, long fromPos, DataFile to, long toPos, long length) throws IOException {
        for (long off = 0; off < length; ) {
            int n = (int) Math.min(copyBuf.byteSize(), length - off);
            ByteBuffer b = copyBuf.asSlice(0, n).asByteBuffer();
            if (!from.readFully(b, fromPos + off)) {
                throw new IOException(from + " ends before " + (fromPos + off + n));
            }
            to.writeFully(b.flip(), toPos + off);
            off += n;
        }
    }
}
