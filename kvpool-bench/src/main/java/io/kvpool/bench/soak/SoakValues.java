package io.kvpool.bench.soak;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;

/**
 * The soak's values: every byte derived from the key and the version of the put that wrote it, so a
 * read says which put it came from and every byte of it can be checked.
 *
 * <pre>
 *   0        8          16         24     28     32                                  size
 *   +--------+----------+----------+------+------+-------------------------------------+
 *   | magic  | version  | key hash | size | 0    | bytes from a generator seeded by    |
 *   |        | (LE)     | (LE)     | (LE) |      | (key hash, version)                 |
 *   +--------+----------+----------+------+------+-------------------------------------+
 * </pre>
 *
 * The size itself is a function of (key, version) between the soak's smallest and largest value, so
 * a value cut short or run long shows too. A read is checked by decoding the version from the
 * header and comparing every byte with the value that version would have: a value of another key
 * (its key hash), of no version (its magic), or with any byte flipped counts its differing bytes.
 */
final class SoakValues {

    static final int HEADER = 32;
    private static final long MAGIC = 0x31304b414f53564bL; // "KVSOAK01" read little-endian

    private final int minSize;
    private final int maxSize;

    SoakValues(int minSize, int maxSize) {
        if (minSize < HEADER || maxSize < minSize) {
            throw new IllegalArgumentException("value sizes must satisfy " + HEADER + " <= min <= max, got min "
                    + minSize + " and max " + maxSize);
        }
        this.minSize = minSize;
        this.maxSize = maxSize;
    }

    int maxSize() {
        return maxSize;
    }

    /** The mean value size (for sizing the working set). */
    long meanSize() {
        return (minSize + (long) maxSize) / 2;
    }

    /** The size of {@code key}'s value at {@code version}. */
    int sizeOf(String key, long version) {
        long span = (long) maxSize - minSize + 1;
        return minSize + (int) Long.remainderUnsigned(mix(keyHash(key) ^ version * 0x9E3779B97F4A7C15L), span);
    }

    /** The value {@code key} holds when written by the put of {@code version} (version >= 1). */
    byte[] valueOf(String key, long version) {
        long kh = keyHash(key);
        byte[] v = new byte[sizeOf(key, version)];
        ByteBuffer b = ByteBuffer.wrap(v).order(ByteOrder.LITTLE_ENDIAN);
        b.putLong(0, MAGIC).putLong(8, version).putLong(16, kh).putInt(24, v.length);
        long s = mix(kh + version * 0xD1B54A32D192ED03L);
        int i = HEADER;
        for (; i + 8 <= v.length; i += 8) {
            s += 0x9E3779B97F4A7C15L;
            b.putLong(i, mix(s));
        }
        if (i < v.length) {
            s += 0x9E3779B97F4A7C15L;
            long last = mix(s);
            for (; i < v.length; i++, last >>>= 8) {
                v[i] = (byte) last;
            }
        }
        return v;
    }

    /**
     * What a read of {@code key} returned: the version named in its header (or -1 when the header is
     * not this soak's, names no version, or another key) and how many of its bytes differ from that
     * version's value (every byte when no version could be read; a length difference counts too).
     */
    Checked check(String key, byte[] got) {
        if (got.length < HEADER) {
            return new Checked(-1, Math.max(got.length, 1));
        }
        ByteBuffer b = ByteBuffer.wrap(got).order(ByteOrder.LITTLE_ENDIAN);
        long version = b.getLong(8);
        if (b.getLong(0) != MAGIC || version < 1 || b.getLong(16) != keyHash(key)) {
            return new Checked(-1, got.length);
        }
        byte[] want = valueOf(key, version);
        int common = Math.min(want.length, got.length);
        long wrong = Math.abs(want.length - got.length);
        int mismatch = java.util.Arrays.mismatch(want, 0, common, got, 0, common);
        for (int i = Math.max(mismatch, 0); mismatch >= 0 && i < common; i++) {
            if (want[i] != got[i]) {
                wrong++;
            }
        }
        return new Checked(version, wrong);
    }

    /** A checked read: the version it came from (-1: none recognisable) and its wrong bytes. */
    record Checked(long version, long wrongBytes) {
    }

    static long keyHash(String key) {
        long h = 0xcbf29ce484222325L;
        for (byte c : key.getBytes(StandardCharsets.UTF_8)) {
            h = (h ^ (c & 0xff)) * 0x100000001b3L;
        }
        return mix(h);
    }

    /** SplitMix64's finaliser. */
    private static long mix(long z) {
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
        z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
        return z ^ (z >>> 31);
    }
}
