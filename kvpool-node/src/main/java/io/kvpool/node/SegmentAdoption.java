package io.kvpool.node;

import io.kvpool.protocol.ObjectLayout;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;

/**
 * Rebuilds a node's {@link RegionLedger} from a segment file its previous run left
 * ({@link SegmentMemory#adopted()}), before the node serves or registers.
 *
 * <h2>What is kept</h2>
 * Every object header sits at a 64-byte aligned offset and describes itself (docs/protocol.md,
 * section 8). The scan looks at each aligned offset; where a header verifies (magic, version,
 * header checksum, region inside the segment) and says COMPLETE, the value's CRC32C is computed and
 * compared with the header's. Only then is the object entered ({@link RegionLedger#adopt}), and the
 * scan continues after its region: a newer object written inside that range would have overwritten
 * part of its value, and its checksum would have failed. Anything else (no header, a torn or
 * corrupted one, WRITING or DEAD, a value that does not match) is skipped one alignment step at a
 * time, so an object written later inside a freed region is still found. Nothing is trusted that
 * did not verify, and no two adopted regions overlap.
 *
 * <h2>Why the scan reads through the file</h2>
 * A tmpfs file's holes (space never written) cost no memory, and reading them through the mapping
 * would allocate every page. The scan therefore reads the file in chunks with positional reads
 * (which read holes as zeros without allocating) to find candidate headers, and touches the mapping
 * only where a header's magic number is.
 *
 * <p>The master then decides, at registration, whether the objects' epoch is current
 * ({@code MasterLink.register}); stale ones are dropped there. Terms are not kept: the node learns
 * its master's at registration.
 */
final class SegmentAdoption {

    /** Bytes read per positional read while looking for headers. */
    static final int CHUNK = 8 << 20;

    /** What a scan found. */
    record Result(long kept, long keptBytes, long skipped, long corrupt, long epoch) {
    }

    private SegmentAdoption() {
    }

    /**
     * Scans {@code segment} (backed by {@code file}) and enters every intact complete object into
     * {@code ledger}.
     *
     * @throws IOException when the file cannot be read
     */
    static Result scan(FileChannel file, MemorySegment segment, RegionLedger ledger) throws IOException {
        long size = segment.byteSize();
        ByteBuffer chunk = ByteBuffer.allocateDirect(CHUNK).order(ByteOrder.LITTLE_ENDIAN);
        long kept = 0;
        long keptBytes = 0;
        long skipped = 0;
        long corrupt = 0;
        long next = 0; // the first offset not covered by an adopted region
        for (long base = 0; base < size; base += CHUNK) {
            chunk.clear();
            long want = Math.min(CHUNK, size - base);
            chunk.limit((int) want);
            while (chunk.hasRemaining()) {
                if (file.read(chunk, base + chunk.position()) < 0) {
                    break;
                }
            }
            for (int at = 0; at + 4 <= chunk.position(); at += ObjectLayout.ALIGNMENT) {
                long offset = base + at;
                if (offset < next || chunk.getInt(at + ObjectLayout.MAGIC_OFFSET) != ObjectLayout.MAGIC) {
                    continue;
                }
                ObjectLayout.Header h = ObjectLayout.readHeader(segment, offset, size);
                if (h == null) {
                    corrupt++;
                    continue;
                }
                if (h.state() != ObjectLayout.STATE_COMPLETE) {
                    skipped++;
                    continue;
                }
                long valueOffset = offset + ObjectLayout.valueOffset(h.keyLength());
                if (ObjectLayout.valueCrc(segment.asSlice(valueOffset, h.valueLength())) != h.valueCrc()) {
                    corrupt++;
                    continue;
                }
                long length = ObjectLayout.regionLength(h.keyLength(), h.valueLength());
                if (ledger.adopt(offset, length, h.generation(), h.epoch(), h.key(), h.valueLength())) {
                    kept++;
                    keptBytes += h.valueLength();
                    next = offset + length;
                } else {
                    corrupt++;
                }
            }
        }
        return new Result(kept, keptBytes, skipped, corrupt, ledger.epoch());
    }
}
