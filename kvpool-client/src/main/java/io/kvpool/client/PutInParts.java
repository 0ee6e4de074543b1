package io.kvpool.client;

import io.kvpool.protocol.Crc32cCombine;
import io.kvpool.protocol.Keys;
import io.kvpool.protocol.ResultCode;

import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.locks.ReentrantReadWriteLock;

/**
 * A put whose values are written in parts: {@link KvPoolClient#beginPut} reserves every object,
 * {@link #write} stores byte ranges of their values as they become available (many per object, in
 * any order, from any thread), and {@link #finish} makes the objects visible. A layer-by-layer save
 * writes layer l of each block as the range {@code [l * layerBytes, (l + 1) * layerBytes)} of its
 * object as soon as the layer is computed.
 *
 * <h2>Guarantees</h2>
 * <ul>
 *   <li>Nothing is visible before {@link #finish}: readers get the key's previous state (a miss).</li>
 *   <li>An object becomes visible only if every byte of its value was written, by ranges that do not
 *       overlap. An object with any byte unwritten fails ({@link PutStatus#FAILED}) and nothing of it
 *       is readable. Overlapping ranges are refused when written ({@link IllegalArgumentException}).</li>
 *   <li>The checksum the object is stored with is the CRC32C of the bytes the caller gave: each part
 *       is checksummed as it is written, and the parts' checksums are combined at the end
 *       ({@link Crc32cCombine}), so no byte is read twice.</li>
 *   <li>A removeAll(force), or a new master, between the begin and the finish fences the objects
 *       ({@link PutStatus#FENCED} or {@link PutStatus#FAILED}): the nodes refuse their parts and ends.</li>
 *   <li>{@link #abandon} (and {@link #close} of an unfinished put) drops everything: nothing becomes
 *       visible.</li>
 * </ul>
 *
 * <h2>How the bytes move</h2>
 * The objects are reserved as whole puts are ({@link PartReservation}: PUT_START, or write leases)
 * and the nodes admit every copy at the begin (NODE_PART_BEGIN, on one connection per node held to
 * the end). A part for a segment on this host is copied straight into the mapped segment by the
 * calling thread; a part for another node goes as a NODE_PART_WRITE from the caller's memory, without
 * a staging copy ({@link PartCopies}). {@link #finish} ends the writes (NODE_PART_END with each value's
 * checksum) and completes them at the master (PUT_END, or one COMMIT per lease).
 *
 * <p>The reservation lasts the master's put timeout (30 s by default): finish well within it. A
 * put in parts holds a connection to each node it writes to until it is finished or abandoned.
 *
 * <p>Thread-safe: {@link #write} may run on many threads at once; {@link #finish} and
 * {@link #abandon} wait for writes in progress, and writes after them throw
 * {@link IllegalStateException}.
 */
public final class PutInParts implements AutoCloseable {

    private enum State { OPEN, FINISHED, ABANDONED }

    private final List<String> keys;
    private final long[] lengths;
    private final PartReservation reservation;
    private final PartCopies copies;
    /** Per item, its copies (none when refused at the reservation). */
    private final List<List<PartCopies.Copy>> byItem;
    /** Per item, the parts written: start to {end, crc}. Each map is guarded by itself. */
    private final List<TreeMap<Long, long[]>> written;
    private final ReentrantReadWriteLock gate = new ReentrantReadWriteLock();
    private volatile State state = State.OPEN;
    private volatile PutStatus[] finished;

    PutInParts(List<String> keys, long[] lengths, PartReservation reservation, PartCopies copies) {
        this.keys = List.copyOf(keys);
        this.lengths = lengths.clone();
        this.reservation = reservation;
        this.copies = copies;
        this.byItem = new ArrayList<>(keys.size());
        this.written = new ArrayList<>(keys.size());
        for (int i = 0; i < keys.size(); i++) {
            byItem.add(new ArrayList<>(1));
            written.add(new TreeMap<>());
        }
        for (PartCopies.Copy c : reservation.copies) {
            byItem.get(c.item).add(c);
        }
    }

    /** How many objects this put writes. */
    public int size() {
        return keys.size();
    }

    public String key(int item) {
        return keys.get(item);
    }

    public long valueLength(int item) {
        return lengths[item];
    }

    /**
     * The item's outcome as far as it is known: null while it can still succeed; the refusal of the
     * begin ({@link PutStatus#ALREADY_EXISTS}, {@link PutStatus#POOL_FULL}, {@link PutStatus#NO_SEGMENT});
     * {@link PutStatus#FENCED} or {@link PutStatus#FAILED} once every copy failed; after
     * {@link #finish}, its final status. Writes to an item with a status move no bytes. Under a
     * write lease (single copies, when the client uses leases) a taken key is found only at the finish
     * (its COMMIT answers {@link PutStatus#ALREADY_EXISTS}); a two-phase reservation finds it at the begin.
     */
    public PutStatus status(int item) {
        if (finished != null) {
            return finished[item];
        }
        if (reservation.refused[item] != null) {
            return reservation.refused[item];
        }
        boolean fenced = false;
        for (PartCopies.Copy c : byItem.get(item)) {
            if (c.alive()) {
                return null;
            }
            fenced |= c.outcome == ResultCode.FENCED;
        }
        return fenced ? PutStatus.FENCED : PutStatus.FAILED;
    }

    /**
     * Writes {@code src} at {@code rangeOffset} of item {@code item}'s value. Returns true if the
     * bytes reached at least one copy (false: the item was refused at the begin or all its copies
     * failed; {@link #status} says why, and {@link #finish} reports it). A part for another machine
     * counts as reached once it is sent: the node's answers are pipelined, so a part it refuses fails
     * its copy at a later write to that node or at {@link #finish}. The caller's memory may be
     * reused as soon as this returns.
     *
     * @throws IllegalArgumentException the item does not exist, or the range is outside its value or
     *                                  overlaps a range written before (naming the key and ranges)
     * @throws IllegalStateException    after {@link #finish} or {@link #abandon}
     */
    public boolean write(int item, long rangeOffset, MemorySegment src) {
        return write(new int[]{item}, new long[]{rangeOffset}, List.of(src))[0];
    }

    /**
     * Writes many parts at once: {@code srcs.get(k)} at {@code rangeOffsets[k]} of item
     * {@code items[k]}; one NODE_PART_WRITE per node (at the payload limit, more) instead of one per
     * part. Element k of the result is {@link #write}'s answer for part k. Every part is checked
     * before any byte moves.
     */
    public boolean[] write(int[] items, long[] rangeOffsets, List<MemorySegment> srcs) {
        if (items.length != rangeOffsets.length || items.length != srcs.size()) {
            throw new IllegalArgumentException(items.length + " items but " + rangeOffsets.length
                    + " range offsets and " + srcs.size() + " sources");
        }
        gate.readLock().lock();
        try {
            if (state != State.OPEN) {
                throw new IllegalStateException("put in parts of " + keys.size() + " objects is "
                        + state.name().toLowerCase() + "; no more parts can be written");
            }
            for (int k = 0; k < items.length; k++) {
                check(items[k], rangeOffsets[k], srcs.get(k).byteSize());
            }
            long[][] recorded = new long[items.length][];
            try {
                for (int k = 0; k < items.length; k++) {
                    recorded[k] = record(items[k], rangeOffsets[k], srcs.get(k).byteSize());
                }
            } catch (IllegalArgumentException overlap) {
                for (int k = 0; k < items.length && recorded[k] != null; k++) {
                    unrecord(items[k], rangeOffsets[k], srcs.get(k).byteSize());
                }
                throw overlap;
            }
            List<List<PartCopies.Copy>> targets = new ArrayList<>(items.length);
            for (int item : items) {
                targets.add(byItem.get(item));
            }
            int[] crcs = copies.write(rangeOffsets, srcs, targets, PerSegment.shareable(srcs));
            for (int k = 0; k < items.length; k++) {
                recorded[k][1] = crcs[k] & 0xFFFF_FFFFL; // the parts' checksums, read by finish under the gate
            }
            boolean[] out = new boolean[items.length];
            for (int k = 0; k < items.length; k++) {
                out[k] = status(items[k]) == null;
            }
            return out;
        } finally {
            gate.readLock().unlock();
        }
    }

    private void check(int item, long offset, long n) {
        if (item < 0 || item >= keys.size()) {
            throw new IllegalArgumentException("item " + item + " of a put in parts of " + keys.size() + " objects");
        }
        if (offset < 0 || offset > lengths[item] - n) {
            throw new IllegalArgumentException("range [" + offset + ", " + offset + " + " + n + ") of key '"
                    + Keys.abbreviate(keys.get(item)) + "' is outside its value of " + lengths[item] + " bytes");
        }
    }

    /**
     * Notes a part's range, refusing one that overlaps another; returns its entry {end, crc}, whose
     * checksum the caller fills in once the part was checksummed ({@link PartCopies#write}).
     */
    private long[] record(int item, long offset, long n) {
        long[] entry = new long[]{offset + n, 0};
        if (n == 0) {
            return entry;
        }
        TreeMap<Long, long[]> parts = written.get(item);
        synchronized (parts) {
            Map.Entry<Long, long[]> before = parts.floorEntry(offset);
            Map.Entry<Long, long[]> after = parts.ceilingEntry(offset);
            Map.Entry<Long, long[]> hit = before != null && before.getValue()[0] > offset ? before
                    : after != null && after.getKey() < offset + n ? after : null;
            if (hit != null) {
                throw new IllegalArgumentException("range [" + offset + ", " + (offset + n) + ") of key '"
                        + Keys.abbreviate(keys.get(item)) + "' overlaps the range [" + hit.getKey() + ", "
                        + hit.getValue()[0] + ") written before");
            }
            parts.put(offset, entry);
        }
        return entry;
    }

    private void unrecord(int item, long offset, long n) {
        if (n == 0) {
            return;
        }
        TreeMap<Long, long[]> parts = written.get(item);
        synchronized (parts) {
            parts.remove(offset);
        }
    }

    /**
     * Ends every write and completes the objects at the master: a status per item, in order. An item
     * with any byte of its value unwritten is {@link PutStatus#FAILED} and not visible.
     *
     * @throws IllegalStateException if already finished or abandoned
     * @throws KvPoolException       if the master cannot be reached to complete them (none is visible then)
     */
    public List<PutStatus> finish() {
        gate.writeLock().lock();
        try {
            if (state != State.OPEN) {
                throw new IllegalStateException("put in parts is already " + state.name().toLowerCase());
            }
            state = State.FINISHED;
            int n = keys.size();
            int[] crcs = new int[n];
            boolean[] complete = new boolean[n];
            for (int i = 0; i < n; i++) {
                long[] whole = combined(i);
                complete[i] = whole != null;
                crcs[i] = whole == null ? 0 : (int) whole[0];
            }
            copies.end(crcs, complete);
            PutStatus[] status = reservation.complete();
            for (int i = 0; i < n; i++) {
                if (status[i] == null) {
                    status[i] = PutStatus.FAILED;
                }
            }
            finished = status;
            return List.of(status);
        } finally {
            gate.writeLock().unlock();
        }
    }

    /** {crc} of item i's whole value from its parts, or null when they do not cover it exactly. */
    private long[] combined(int i) {
        TreeMap<Long, long[]> parts = written.get(i);
        synchronized (parts) {
            long at = 0;
            int crc = 0;
            for (Map.Entry<Long, long[]> e : parts.entrySet()) {
                if (e.getKey() != at) {
                    return null;
                }
                long end = e.getValue()[0];
                crc = Crc32cCombine.combine(crc, (int) e.getValue()[1], end - at);
                at = end;
            }
            return at == lengths[i] ? new long[]{crc & 0xFFFF_FFFFL} : null;
        }
    }

    /**
     * Drops the put: the nodes drop what was written, the master gets its reservations back, and
     * nothing becomes visible. Does nothing once finished or abandoned.
     */
    public void abandon() {
        gate.writeLock().lock();
        try {
            if (state != State.OPEN) {
                return;
            }
            state = State.ABANDONED;
            copies.abandon();
            reservation.abandon();
            PutStatus[] status = new PutStatus[keys.size()];
            Arrays.fill(status, PutStatus.FAILED);
            for (int i = 0; i < status.length; i++) {
                if (reservation.refused[i] != null) {
                    status[i] = reservation.refused[i];
                }
            }
            finished = status;
        } finally {
            gate.writeLock().unlock();
        }
    }

    /** {@link #abandon} unless finished. */
    @Override
    public void close() {
        abandon();
    }
}
