package io.kvpool.node.disk;

import io.kvpool.protocol.ObjectLayout;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.Objects;
import java.util.concurrent.ArrayBlockingQueue;

/**
 * Reads values for callers, on the callers' threads, concurrently with each other and with the writer.
 *
 * <p>A read finds its slot and pins the slot's file ({@code readers++}) under the store's lock, reads
 * and checks the value's CRC32C without it, then unpins the file and records the outcome under the lock
 * again. A file compacted or retired meanwhile stays open until its last reader unpins it, and that
 * reader closes (and, if retired, deletes) it: compaction never waits for readers, and readers never
 * see a file vanish under them. A record moved by compaction meanwhile is read from the file it was
 * found in. An interrupted reader closes a FileChannel for every thread (a JDK rule); {@link DataFile}
 * reopens it, so only the interrupted read fails.
 *
 * <p>Memory: with direct I/O, four 4 MiB aligned bounce buffers for large reads, shared by all
 * readers; a read finding none free reads through the page cache. Nothing else large is allocated.
 */
final class ValueReader {

    /** Logs as the store: the tier's messages keep one logger name. */
    private static final Logger log = LoggerFactory.getLogger(DiskStore.class);

    /** Values at least this large are read with O_DIRECT (when appends are): see {@link #readInto}. */
    static final long DIRECT_READ_MIN = 128L << 10;
    /** Aligned buffers for direct reads, and the size of each (one direct read at most). */
    private static final int BOUNCE_BUFFERS = 4;
    private static final int BOUNCE_BYTES = 4 << 20;
    /** Reads into a heap segment go through the JDK's temporary direct buffers: keep those small. */
    private static final int HEAP_READ_CHUNK = 256 << 10;

    private final DiskIndex index;
    private final int ioBlock;
    /** Aligned buffers for large reads through O_DIRECT; empty without direct I/O. A read finding none free reads buffered. */
    private final ArrayBlockingQueue<MemorySegment> bounce = new ArrayBlockingQueue<>(BOUNCE_BUFFERS);

    /** With {@code directIo}, allocates the bounce buffers from {@code arena}. */
    ValueReader(DiskIndex index, Arena arena, int ioBlock, boolean directIo) {
        this.index = index;
        this.ioBlock = ioBlock;
        if (directIo) {
            for (int i = 0; i < BOUNCE_BUFFERS; i++) {
                bounce.add(arena.allocate(BOUNCE_BYTES, ioBlock));
            }
        }
    }

    /** See {@link DiskStore#read}. */
    DiskStore.ReadStatus read(long generation, MemorySegment dst) throws IOException {
        Objects.requireNonNull(dst, "dst");
        Slot s;
        DataFile f;
        long pos;
        index.lock.lock();
        try {
            s = index.closed ? null : index.get(generation);
            if (s == null) {
                return DiskStore.ReadStatus.NOT_FOUND;
            }
            if (dst.byteSize() != s.valueLength) {
                throw new IllegalArgumentException("disk tier: generation " + generation + " has a value of "
                        + s.valueLength + " bytes, destination has " + dst.byteSize());
            }
            f = s.file;
            pos = s.valuePosition();
            f.readers++;
        } finally {
            index.lock.unlock();
        }
        boolean complete = false;
        try {
            complete = readInto(f, pos, dst);
        } finally {
            unpin(f);
        }
        boolean intact = complete && ObjectLayout.valueCrc(dst) == s.valueCrc;
        index.lock.lock();
        try {
            if (intact) {
                index.readOk(s);
                return DiskStore.ReadStatus.OK;
            }
            index.readCorrupt(s);
        } finally {
            index.lock.unlock();
        }
        log.warn("disk tier: generation {} in {} at {} failed its checksum{}; dropped", generation, f, pos,
                complete ? "" : " (file too short)");
        dst.fill((byte) 0);
        return DiskStore.ReadStatus.CORRUPT;
    }

    /** Ends a read of {@code f}: the last reader of a retired file deletes it, of a closed store's file closes it. */
    private void unpin(DataFile f) {
        DataFile toClose = null;
        index.lock.lock();
        try {
            if (--f.readers == 0 && (f.retired || f.closeWhenIdle)) {
                toClose = f;
            }
        } finally {
            index.lock.unlock();
        }
        if (toClose != null) {
            if (toClose.retired) {
                toClose.closeAndDelete();
            } else {
                toClose.close();
            }
        }
    }

    /**
     * Reads {@code dst.byteSize()} bytes at {@code pos}. Large values go through O_DIRECT when the
     * store writes that way: the whole blocks covering each piece are read into a free bounce buffer
     * and the piece copied out. A buffered read of a value written around the page cache waits on the
     * device one readahead window at a time (0.6 GB/s here for 1 MiB reads, against 2 GB/s direct);
     * the extra copy costs far less. Small values, and reads finding no bounce buffer free, read
     * through the page cache.
     */
    private boolean readInto(DataFile f, long pos, MemorySegment dst) throws IOException {
        long n = dst.byteSize();
        if (n >= DIRECT_READ_MIN) {
            MemorySegment b = bounce.poll();
            if (b != null) {
                try {
                    return readDirect(f, pos, dst, b);
                } finally {
                    bounce.add(b);
                }
            }
        }
        int chunk = dst.isNative() ? DataFile.MAX_IO : HEAP_READ_CHUNK;
        long off = 0;
        while (off < n) {
            int len = (int) Math.min(chunk, n - off);
            if (!f.readFully(dst.asSlice(off, len).asByteBuffer(), pos + off)) {
                return false;
            }
            off += len;
        }
        return true;
    }

    private boolean readDirect(DataFile f, long pos, MemorySegment dst, MemorySegment buf) throws IOException {
        long n = dst.byteSize();
        long off = 0;
        while (off < n) {
            long from = pos + off;
            long start = from / ioBlock * ioBlock;
            long len = Math.min(buf.byteSize(), DiskIo.alignUp(pos + n, ioBlock) - start);
            long got = f.readDirect(buf.asSlice(0, len), start, ioBlock);
            long piece = Math.min(n - off, start + got - from);
            if (piece <= 0) {
                return false; // the file ends before the value does
            }
            MemorySegment.copy(buf, from - start, dst, off, piece);
            off += piece;
        }
        return true;
    }
}
