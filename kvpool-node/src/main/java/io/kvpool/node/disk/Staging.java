package io.kvpool.node.disk;

import io.kvpool.protocol.Keys;
import io.kvpool.protocol.ObjectLayout;

import java.lang.foreign.MemorySegment;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;

/**
 * Spills between {@link DiskStore#offer} and the writer: a native ring of {@code stagingBytes} (space
 * kept by a {@link StagingRing}) where {@link #offer} lays out each record completely (header, key,
 * value, zero padding), and the queue of those records in offer order.
 *
 * <p>Threads: {@link #offer} runs on callers' threads. It reserves ring space and queues the record
 * under the store's lock, copies the value outside it, then marks the record ready under the lock; it
 * never waits for I/O or for the writer. The writer thread ({@link AppendWriter}) takes ready records
 * from the head of the queue ({@link #takeReady}) and, once they are written, {@link #release}s their
 * space. Every field but the ring is guarded by the store's lock ({@link DiskIndex#lock}).
 *
 * <p>Invariants:
 * <ul>
 *   <li>Records leave the queue in the order they entered it (their {@code seq}), and their ring space
 *       is released in that order: the ring's FIFO discipline.</li>
 *   <li>The writer reads a record's ring bytes only after it is ready (its copy has ended).</li>
 *   <li>{@code pending} maps a generation to its queued record until the record is written, cancelled
 *       or abandoned: at most one queued spill per generation.</li>
 *   <li>{@code copiesInFlight} counts copies into the ring in progress: the store frees the ring only
 *       once it is zero.</li>
 * </ul>
 */
final class Staging {

    /** A batch takes at most this many bytes of ready records (at least one record). */
    private static final long MAX_BATCH_BYTES = 32L << 20;

    /** A spill waiting in staging. Guarded by the store's lock, except the writer-only fields. */
    static final class Pending {
        final byte[] key;
        final long generation;
        final long epoch;
        final long valueLength;
        final int valueCrc;
        final long recordLength;
        final long ringOffset;
        final long ringWaste;
        final long seq;
        boolean ready;
        boolean cancelled;
        // writer only
        boolean skip;
        DataFile file;
        long filePos;

        Pending(byte[] key, long generation, long epoch, long valueLength, int valueCrc, long recordLength,
                long ringOffset, long ringWaste, long seq) {
            this.key = key;
            this.generation = generation;
            this.epoch = epoch;
            this.valueLength = valueLength;
            this.valueCrc = valueCrc;
            this.recordLength = recordLength;
            this.ringOffset = ringOffset;
            this.ringWaste = ringWaste;
            this.seq = seq;
        }
    }

    private final DiskIndex index;
    private final MemorySegment ring;
    private final long capacityBytes;

    // ---- guarded by index.lock ----
    private final StagingRing space;
    private final ArrayDeque<Pending> queue = new ArrayDeque<>();
    private final Map<Long, Pending> pending = new HashMap<>();
    private long stagedItems;
    private int copiesInFlight;
    private long reservedSeq;
    private long writtenSeq;
    /** No more spills (close() was called, or the writer failed). */
    private boolean closing;

    /** @param ring the staging memory, {@link ObjectLayout#ALIGNMENT}-aligned; its size is the ring's */
    Staging(DiskIndex index, MemorySegment ring, long capacityBytes) {
        this.index = index;
        this.ring = ring;
        this.capacityBytes = capacityBytes;
        this.space = new StagingRing(ring.byteSize());
    }

    /** The staging memory: where each queued record's bytes are, at its {@code ringOffset}. */
    MemorySegment ring() {
        return ring;
    }

    /** See {@link DiskStore#offer}. */
    boolean offer(byte[] key, long generation, long epoch, MemorySegment value, int valueCrc) {
        Objects.requireNonNull(key, "key");
        Objects.requireNonNull(value, "value");
        if (key.length == 0 || key.length > Keys.MAX_KEY_BYTES) {
            throw new IllegalArgumentException("disk tier: key of " + key.length + " bytes; keys have 1 to "
                    + Keys.MAX_KEY_BYTES + " bytes");
        }
        long valueLength = value.byteSize();
        long recordLength = ObjectLayout.regionLength(key.length, valueLength);
        Pending p;
        index.lock.lock();
        try {
            if (index.get(generation) != null || pending.containsKey(generation)) {
                return !closing;
            }
            Slot same = index.newest(new String(key, StandardCharsets.ISO_8859_1));
            if (closing || epoch < index.fenceEpoch || recordLength > space.size() || recordLength > capacityBytes
                    || (same != null && same.generation > generation)) {
                index.drops++;
                return false;
            }
            long[] waste = new long[1];
            long at = space.reserve(recordLength, waste);
            if (at < 0) {
                index.drops++;
                return false;
            }
            p = new Pending(key.clone(), generation, epoch, valueLength, valueCrc, recordLength, at, waste[0], ++reservedSeq);
            queue.addLast(p);
            pending.put(generation, p);
            stagedItems++;
            copiesInFlight++;
        } finally {
            index.lock.unlock();
        }
        boolean ok = false;
        try {
            MemorySegment rec = ring.asSlice(p.ringOffset, recordLength);
            ObjectLayout.writeHeader(rec, 0, ObjectLayout.STATE_COMPLETE, p.key, valueLength, generation, epoch, valueCrc);
            long keyEnd = ObjectLayout.KEY_OFFSET + key.length;
            long valueOffset = ObjectLayout.valueOffset(key.length);
            rec.asSlice(keyEnd, valueOffset - keyEnd).fill((byte) 0);
            MemorySegment.copy(value, 0, rec, valueOffset, valueLength);
            rec.asSlice(valueOffset + valueLength, recordLength - valueOffset - valueLength).fill((byte) 0);
            ok = true;
        } finally {
            index.lock.lock();
            try {
                p.ready = true;
                copiesInFlight--;
                if (!ok) {
                    p.cancelled = true;
                    pending.remove(generation, p);
                }
                index.work.signal();
                index.progress.signalAll();
            } finally {
                index.lock.unlock();
            }
        }
        return true;
    }

    /**
     * Reads the value of {@code generation} from its queued spill into {@code dst} (of exactly the value's
     * length) and checks it against its CRC32C; null when no spill of it is queued (it is on disk by now, or
     * gone: a record leaves the queue under the same lock hold that indexes it). Waits for a copy into the ring
     * still in progress. Copies under the store's lock, as the writer releases ring space under it; a spill is
     * queued for the few milliseconds until its batch is forced, so such reads are rare.
     *
     * @throws IllegalArgumentException if {@code dst.byteSize()} is not the value length
     */
    DiskStore.ReadStatus readQueued(long generation, MemorySegment dst) {
        int crc;
        index.lock.lock();
        try {
            Pending p = index.closed ? null : pending.get(generation); // a closed store's ring is freed
            while (p != null && !p.ready) {
                index.progress.awaitUninterruptibly();
                p = pending.get(generation);
            }
            if (p == null || p.cancelled) {
                return null;
            }
            if (dst.byteSize() != p.valueLength) {
                throw new IllegalArgumentException("disk tier: generation " + generation + " has a value of "
                        + p.valueLength + " bytes, destination has " + dst.byteSize());
            }
            MemorySegment.copy(ring, p.ringOffset + ObjectLayout.valueOffset(p.key.length), dst, 0, p.valueLength);
            crc = p.valueCrc;
        } finally {
            index.lock.unlock();
        }
        if (ObjectLayout.valueCrc(dst) == crc) {
            return DiskStore.ReadStatus.OK;
        }
        dst.fill((byte) 0);
        return DiskStore.ReadStatus.CORRUPT;
    }

    // ---- the rest under lock ----

    /** The queued (not cancelled) spill of {@code generation}, or null. */
    Pending queued(long generation) {
        Pending p = pending.get(generation);
        return p == null || p.cancelled ? null : p;
    }

    /** Cancels the queued spill of {@code generation} (the writer skips it). Whether there was one. */
    boolean cancel(long generation) {
        Pending p = pending.remove(generation);
        if (p == null) {
            return false;
        }
        p.cancelled = true;
        return true;
    }

    /** Cancels the queued spills from epochs before {@code epoch}. Returns how many. */
    long cancelOlderThan(long epoch) {
        long n = 0;
        for (var it = pending.values().iterator(); it.hasNext(); ) {
            Pending p = it.next();
            if (p.epoch < epoch) {
                p.cancelled = true;
                it.remove();
                n++;
            }
        }
        return n;
    }

    boolean headReady() {
        Pending p = queue.peekFirst();
        return p != null && p.ready;
    }

    /** Ready records from the head of the queue, in order, up to MAX_BATCH_BYTES (at least one). */
    List<Pending> takeReady() {
        List<Pending> batch = new ArrayList<>();
        long bytes = 0;
        while (headReady()) {
            Pending p = queue.peekFirst();
            if (!batch.isEmpty() && bytes + p.recordLength > MAX_BATCH_BYTES) {
                break;
            }
            queue.pollFirst();
            p.skip = p.cancelled;
            batch.add(p);
            bytes += p.recordLength;
        }
        return batch;
    }

    /** A batch taken by {@link #takeReady} is done with (written or not): frees its space, in order. */
    void release(List<Pending> batch) {
        for (Pending p : batch) {
            pending.remove(p.generation, p);
            space.release(p.ringOffset, p.recordLength, p.ringWaste);
            stagedItems--;
        }
        writtenSeq = batch.getLast().seq;
    }

    /** Refuses spills from now on. */
    void stop() {
        closing = true;
    }

    /** Closing and nothing queued: the writer may end. */
    boolean drained() {
        return closing && queue.isEmpty();
    }

    /** The {@code seq} of the last record offered. */
    long reservedSeq() {
        return reservedSeq;
    }

    /** The {@code seq} of the last record written or dropped. */
    long writtenSeq() {
        return writtenSeq;
    }

    /** Waits until no {@link #offer} copies into the ring (the lock held, released while waiting). */
    void awaitCopies() {
        while (copiesInFlight > 0) {
            index.progress.awaitUninterruptibly();
        }
    }

    /** Staging memory in use. */
    long usedBytes() {
        return space.used();
    }

    /** Records waiting or being written. */
    long items() {
        return stagedItems;
    }
}
