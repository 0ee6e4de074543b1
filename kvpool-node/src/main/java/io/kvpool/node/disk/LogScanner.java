package io.kvpool.node.disk;

import io.kvpool.protocol.Keys;
import io.kvpool.protocol.ObjectLayout;

import java.io.EOFException;
import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;
import java.util.zip.CRC32C;

/**
 * Reads a log file from the start and reports its records. Used once per file when a store opens.
 *
 * <ul>
 *   <li>A record whose header is valid (magic, version, header CRC, fits in the file) and whose state
 *       is COMPLETE has its value read and checked against its CRC32C: intact ones are reported
 *       {@linkplain Visitor#live live}, others are skipped and counted.</li>
 *   <li>A valid header with state DEAD is a tombstone: reported {@linkplain Visitor#dead dead}, its
 *       value is not read.</li>
 *   <li>Zeros from a record's end to the next {@value DiskStore#MIN_IO_BLOCK}-byte boundary are
 *       padding (appends are written in whole blocks): skipped, not counted.</li>
 *   <li>Anything else (garbage, a header whose checksum fails, a record running past the end of the
 *       file) starts a run of garbage, counted once: the scan resynchronises on the next 64-byte
 *       aligned offset that holds the magic and checks a header there. Records are 64-byte aligned,
 *       so nothing else can be a record start.</li>
 * </ul>
 * The result's {@code validEnd} is the end of the last valid record or of the padding after it:
 * anything after it is a torn tail (the store truncates it).
 *
 * <p>Memory: one caller-provided buffer of at least 1 MiB; nothing is allocated per record besides
 * the header object.
 */
final class LogScanner {

    interface Visitor {
        void live(long offset, ObjectLayout.Header header);

        void dead(long offset, ObjectLayout.Header header);
    }

    /** @param validEnd end of the last valid record; @param skipped records and garbage runs skipped */
    record Result(long validEnd, long skipped) {
    }

    private static final ValueLayout.OfInt INT = ValueLayout.JAVA_INT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    /** Header plus the longest key, rounded up: what has to be read to check any header. */
    static final int HEADER_READ = (int) ObjectLayout.valueOffset(Keys.MAX_KEY_BYTES);

    private final MemorySegment buf;

    LogScanner(MemorySegment buf) {
        if (buf.byteSize() < HEADER_READ || buf.byteSize() % ObjectLayout.ALIGNMENT != 0) {
            throw new IllegalArgumentException("scan buffer too small or unaligned: " + buf.byteSize());
        }
        this.buf = buf;
    }

    Result scan(DataFile f, long size, Visitor visitor) throws IOException {
        long pos = 0;
        long validEnd = 0;
        long skipped = 0;
        boolean inGarbage = false;
        while (pos < size) {
            ObjectLayout.Header h = header(f, pos, size);
            if (h == null && !inGarbage) {
                long padEnd = padding(f, pos, size);
                if (padEnd > pos) {
                    pos = padEnd;
                    validEnd = padEnd;
                    continue;
                }
            }
            if (h == null) {
                if (!inGarbage) {
                    skipped++;
                    inGarbage = true;
                }
                pos = nextMagic(f, pos + ObjectLayout.ALIGNMENT, size);
                continue;
            }
            inGarbage = false;
            if (h.state() == ObjectLayout.STATE_COMPLETE) {
                long valuePos = pos + ObjectLayout.valueOffset(h.keyLength());
                if (crc(f, valuePos, h.valueLength()) == h.valueCrc()) {
                    visitor.live(pos, h);
                } else {
                    skipped++;
                }
            } else if (h.state() == ObjectLayout.STATE_DEAD) {
                visitor.dead(pos, h);
            } else {
                skipped++; // WRITING: never written by a store; not a usable record
            }
            pos += h.regionLength();
            validEnd = pos;
        }
        return new Result(validEnd, skipped);
    }

    private ObjectLayout.Header header(DataFile f, long pos, long size) throws IOException {
        long limit = size - pos;
        if (limit < ObjectLayout.KEY_OFFSET) {
            return null;
        }
        int n = (int) Math.min(HEADER_READ, limit);
        if (!f.readFully(buf.asSlice(0, n).asByteBuffer(), pos)) {
            return null;
        }
        // readHeader touches no byte past 48 + key length before checking the record fits in limit,
        // and a record that fits has its key within the n bytes just read
        return ObjectLayout.readHeader(buf, 0, limit);
    }

    /**
     * If the bytes from {@code pos} to the next block boundary (or the end of the file) are all zero,
     * that boundary (or the end); else {@code pos}.
     */
    private long padding(DataFile f, long pos, long size) throws IOException {
        long end = Math.min(size, (pos / DiskStore.MIN_IO_BLOCK + 1) * DiskStore.MIN_IO_BLOCK);
        int n = (int) (end - pos);
        if (!f.readFully(buf.asSlice(0, n).asByteBuffer(), pos)) {
            return pos;
        }
        for (int off = 0; off + 8 <= n; off += 8) {
            if (buf.get(ValueLayout.JAVA_LONG_UNALIGNED, off) != 0) {
                return pos;
            }
        }
        return end;
    }

    /** The first 64-aligned offset at or after {@code from} holding the magic, or {@code size}. */
    private long nextMagic(DataFile f, long from, long size) throws IOException {
        long pos = from;
        while (pos < size) {
            int n = (int) Math.min(buf.byteSize(), size - pos);
            if (!f.readFully(buf.asSlice(0, n).asByteBuffer(), pos)) {
                return size;
            }
            for (int off = 0; off + 4 <= n; off += ObjectLayout.ALIGNMENT) {
                if (buf.get(INT, off) == ObjectLayout.MAGIC) {
                    return pos + off;
                }
            }
            pos += n;
        }
        return size;
    }

    private int crc(DataFile f, long pos, long length) throws IOException {
        CRC32C crc = new CRC32C();
        long done = 0;
        while (done < length) {
            int n = (int) Math.min(buf.byteSize(), length - done);
            if (!f.readFully(buf.asSlice(0, n).asByteBuffer(), pos + done)) {
                throw new EOFException(f + " ended inside a value at " + (pos + done));
            }
            crc.update(buf.asSlice(0, n).asByteBuffer());
            done += n;
        }
        return (int) crc.getValue();
    }
}
