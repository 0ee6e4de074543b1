package io.kvpool.node.disk;

import io.kvpool.protocol.ObjectLayout;

import java.nio.charset.StandardCharsets;

/**
 * One live object of the {@link DiskIndex}: what it is (final fields, never changed) and where its
 * record is and how cold it is (the others).
 *
 * <p>Non-final fields are guarded by the store's lock ({@link DiskIndex#lock}). Where the record is
 * ({@link #file}, {@link #offset}, {@link #fileIndex}) changes only on the writer thread (compaction,
 * or a later copy found at open), under that lock. {@link #live} goes false once, when the slot
 * leaves the index; a reader holding a dropped slot still reads the file it pinned.
 */
final class Slot {
    /** The key bytes as a Latin-1 string (one char per byte): hashable, one byte per char in memory. */
    final String key;
    final long generation;
    final long epoch;
    final long valueLength;
    final int valueCrc;
    final long recordLength;
    /** Where the record is; changed only by the writer (compaction), under the lock. */
    DataFile file;
    long offset;
    /** This slot's index in {@code file.slots}. */
    int fileIndex;
    int hits;
    boolean live = true;
    /** Links in its coldness list: never read (insertion order) or read (last-read order). */
    Slot prev;
    Slot next;
    ColdList list;

    Slot(String key, long generation, long epoch, long valueLength, int valueCrc) {
        this.key = key;
        this.generation = generation;
        this.epoch = epoch;
        this.valueLength = valueLength;
        this.valueCrc = valueCrc;
        this.recordLength = ObjectLayout.regionLength(key.length(), valueLength);
    }

    long valuePosition() {
        return offset + ObjectLayout.valueOffset(key.length());
    }

    DiskStore.Entry entry() {
        return new DiskStore.Entry(key.getBytes(StandardCharsets.ISO_8859_1), generation, epoch, valueLength,
                valueCrc, hits);
    }
}
