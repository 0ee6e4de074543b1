package io.kvpool.master;

/**
 * A replica's stored segment, as the index keeps it: the segment id, with {@link #DISK_BIT} set for a copy in
 * that node's SSD tier (found there by generation; its offset is 0).
 */
final class StoredSegment {

    static final int DISK_BIT = 1 << 30;

    private StoredSegment() {
    }

    static boolean onDisk(int storedSegment) {
        return (storedSegment & DISK_BIT) != 0;
    }

    /** The segment id, whichever tier. */
    static int id(int storedSegment) {
        return storedSegment & ~DISK_BIT;
    }
}
