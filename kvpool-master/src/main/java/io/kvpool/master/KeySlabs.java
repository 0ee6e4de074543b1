package io.kvpool.master;

import java.util.Arrays;

/**
 * The key bytes of one {@link ObjectTable}: appended to {@code byte[]} slabs of at most 256 KiB and
 * named by one {@code long} address each. A removed key's bytes stay where they are as garbage until
 * the table compacts ({@link #compactInto}); {@link #liveBytes} counts what is still referenced. Not
 * thread-safe: the table's shard lock guards it.
 *
 * <pre>
 *  key address (one long):                 key bytes: byte[] slabs of at most 256 KiB, appended to
 *  +--------------+-------------+--------+ +-----------------------------------+-------+-------+
 *  | slab (30)    | offset (18) | len(16)| | key a | key b | (garbage) | key c | ...   | free  |
 *  +--------------+-------------+--------+ +-----------------------------------+-------+-------+
 * </pre>
 * Slabs start at 1 KiB and double up to the maximum, so a nearly empty shard stays small, and no slab
 * is a G1 humongous object.
 */
final class KeySlabs {

    private static final int SLAB_BITS = 18;
    /** Largest slab, and so the largest offset an address holds. */
    static final int MAX_SLAB = 1 << SLAB_BITS;
    private static final int MIN_SLAB = 1024;
    /** Longest key an address can name. */
    static final int MAX_KEY = 0xFFFF;
    /** Below this many slab bytes a shard's garbage is not worth a compaction. */
    private static final long MIN_COMPACT = 16 * 1024;

    private byte[][] slabs = new byte[4][];
    private int slabCount;
    private int slabPos;
    private int nextSlab;
    private long slabBytes;
    private long liveBytes;

    KeySlabs() {
        this(MIN_SLAB);
    }

    private KeySlabs(int firstSlab) {
        this.nextSlab = firstSlab;
    }

    static int length(long addr) {
        return (int) addr & 0xFFFF;
    }

    private static int slab(long addr) {
        return (int) (addr >>> (SLAB_BITS + 16));
    }

    private static int offset(long addr) {
        return (int) (addr >>> 16) & (MAX_SLAB - 1);
    }

    /** Stores {@code len} bytes of {@code src} from {@code from}; returns their address. */
    long append(byte[] src, int from, int len) {
        byte[] cur = slabCount == 0 ? null : slabs[slabCount - 1];
        if (cur == null || slabPos + len > cur.length) {
            cur = newSlab(len);
        }
        System.arraycopy(src, from, cur, slabPos, len);
        long addr = ((long) (slabCount - 1) << (SLAB_BITS + 16)) | ((long) slabPos << 16) | len;
        slabPos += len;
        liveBytes += len;
        return addr;
    }

    private byte[] newSlab(int atLeast) {
        int n = Math.max(atLeast, nextSlab);
        nextSlab = Math.min(MAX_SLAB, n * 2);
        if (slabCount == slabs.length) {
            slabs = Arrays.copyOf(slabs, slabCount * 2);
        }
        byte[] slab = new byte[n];
        slabs[slabCount++] = slab;
        slabPos = 0;
        slabBytes += n;
        return slab;
    }

    /** The key at {@code addr} is no longer referenced: its bytes become garbage. */
    void release(long addr) {
        liveBytes -= length(addr);
    }

    boolean equals(long addr, byte[] key) {
        int len = length(addr);
        if (len != key.length) {
            return false;
        }
        int off = offset(addr);
        return Arrays.equals(slabs[slab(addr)], off, off + len, key, 0, len);
    }

    boolean startsWith(long addr, byte[] prefix) {
        if (prefix.length > length(addr)) {
            return false;
        }
        int off = offset(addr);
        return Arrays.equals(slabs[slab(addr)], off, off + prefix.length, prefix, 0, prefix.length);
    }

    /** A copy of the key at {@code addr}. */
    byte[] copy(long addr) {
        int off = offset(addr);
        return Arrays.copyOfRange(slabs[slab(addr)], off, off + length(addr));
    }

    /** Reads both ends of the key at {@code addr} (to bring them into the cache); returns their sum. */
    int touch(long addr) {
        int len = length(addr);
        if (len == 0) {
            return 0;
        }
        byte[] s = slabs[slab(addr)];
        int off = offset(addr);
        return s[off] + s[off + len - 1];
    }

    /** Whether garbage is over half the slab bytes (and worth the copy). */
    boolean wantsCompaction() {
        long garbage = slabBytes - liveBytes - (slabCount == 0 ? 0 : slabs[slabCount - 1].length - slabPos);
        return slabBytes >= MIN_COMPACT && 2 * garbage > slabBytes;
    }

    /** Empty slabs for a compaction of these: the first one about fits what is live. */
    KeySlabs fresh() {
        long fit = liveBytes <= 1 ? 1 : Long.highestOneBit(liveBytes - 1) << 1;
        return new KeySlabs((int) Math.min(MAX_SLAB, Math.max(MIN_SLAB, fit)));
    }

    /** Copies the key at {@code addr} (of these slabs) into {@code to}; returns its address there. */
    long compactInto(KeySlabs to, long addr) {
        return to.append(slabs[slab(addr)], offset(addr), length(addr));
    }

    /** Bytes of slabs allocated (live keys, garbage and the current slab's free end). */
    long slabBytes() {
        return slabBytes;
    }

    /** Bytes of the keys still referenced. */
    long liveBytes() {
        return liveBytes;
    }
}
