package io.kvpool.node.disk;

/**
 * Space accounting of the staging memory: a ring of {@code size} bytes from which whole records are
 * reserved at the head and released, in the same order, at the tail. A record is always contiguous;
 * when it does not fit between the head and the end of the ring, the end is skipped ("waste", freed
 * with that record) and the record starts at offset 0.
 *
 * <pre>
 *   0                 tail                          head                size
 *   |      free       |#### queued records, FIFO ####|       free        |
 *
 *   0         head                                  tail   waste        size
 *   |##########|              free                  |#######|xxxxxx|
 * </pre>
 *
 * Not thread-safe: the store calls it under its lock. When the ring empties, head and tail go back to
 * 0, so a lone big record always finds the whole ring.
 */
final class StagingRing {

    private final long size;
    private long head;
    private long tail;
    private long used;

    StagingRing(long size) {
        this.size = size;
    }

    long size() {
        return size;
    }

    /** Bytes reserved, including skipped ends. */
    long used() {
        return used;
    }

    /**
     * Reserves {@code n} contiguous bytes. Returns the offset, or -1 if there is no room; the bytes
     * skipped at the end of the ring (to be released with this record) go to {@code waste[0]}.
     */
    long reserve(long n, long[] waste) {
        waste[0] = 0;
        if (n <= 0 || n > size) {
            return -1;
        }
        if (used == 0) {
            head = 0;
            tail = 0;
        }
        long at;
        if (used > 0 && head == tail) {
            return -1; // full
        } else if (head >= tail) {
            // free: [head, size) and [0, tail)
            if (size - head >= n) {
                at = head;
            } else if (tail >= n) {
                waste[0] = size - head;
                at = 0;
            } else {
                return -1;
            }
        } else {
            // free: [head, tail)
            if (tail - head >= n) {
                at = head;
            } else {
                return -1;
            }
        }
        used += waste[0] + n;
        head = at + n;
        if (head == size) {
            head = 0;
        }
        return at;
    }

    /** Releases the oldest reservation, which must be {@code (offset, n)} with that waste. */
    void release(long offset, long n, long waste) {
        used -= waste + n;
        tail = offset + n;
        if (tail == size) {
            tail = 0;
        }
        if (used == 0) {
            head = 0;
            tail = 0;
        }
    }
}
