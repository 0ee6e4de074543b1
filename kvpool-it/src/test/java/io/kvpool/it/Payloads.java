package io.kvpool.it;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/**
 * Self-checking values: the first bytes name the key and a version, the rest is a pseudo-random
 * stream seeded by both. A reader can tell from the bytes alone whether it got exactly the object
 * (key, version) it thinks it got, or anything else: another object, a partial one, garbage.
 *
 * <pre>
 *  | magic u32 | version u32 | key length u16 | key bytes | stream bytes ... |
 * </pre>
 */
final class Payloads {

    private static final int MAGIC = 0x5EEDF00D;
    private static final ValueLayout.OfInt INT = ValueLayout.JAVA_INT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    private static final ValueLayout.OfShort SHORT = ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);

    private Payloads() {
    }

    /** Smallest value that can carry a header for {@code key}. */
    /** The keys {@code prefix + 0} to {@code prefix + (n - 1)}. */
    static List<String> keys(String prefix, int n) {
        List<String> out = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            out.add(prefix + i);
        }
        return out;
    }

    static int minSize(String key) {
        return 10 + key.getBytes(StandardCharsets.UTF_8).length;
    }

    static byte[] make(String key, int version, int size) {
        byte[] k = key.getBytes(StandardCharsets.UTF_8);
        if (size < 10 + k.length) {
            throw new IllegalArgumentException("size " + size + " too small for key " + key);
        }
        byte[] b = new byte[size];
        MemorySegment s = MemorySegment.ofArray(b);
        s.set(INT, 0, MAGIC);
        s.set(INT, 4, version);
        s.set(SHORT, 8, (short) k.length);
        System.arraycopy(k, 0, b, 10, k.length);
        long x = seed(key, version);
        for (int i = 10 + k.length; i < size; i++) {
            x = x * 6364136223846793005L + 1442695040888963407L;
            b[i] = (byte) (x >>> 56);
        }
        return b;
    }

    /** What a read returned, decoded; null fields mean the bytes are not a well-formed payload. */
    record Decoded(String key, int version, boolean intact) {
    }

    static Decoded decode(byte[] b) {
        return decode(MemorySegment.ofArray(b));
    }

    static Decoded decode(MemorySegment s) {
        if (s.byteSize() < 10 || s.get(INT, 0) != MAGIC) {
            return new Decoded(null, -1, false);
        }
        int version = s.get(INT, 4);
        int klen = s.get(SHORT, 8) & 0xFFFF;
        if (10 + klen > s.byteSize()) {
            return new Decoded(null, version, false);
        }
        String key = new String(s.asSlice(10, klen).toArray(ValueLayout.JAVA_BYTE), StandardCharsets.UTF_8);
        long x = seed(key, version);
        for (long i = 10 + klen; i < s.byteSize(); i++) {
            x = x * 6364136223846793005L + 1442695040888963407L;
            if (s.get(ValueLayout.JAVA_BYTE, i) != (byte) (x >>> 56)) {
                return new Decoded(key, version, false);
            }
        }
        return new Decoded(key, version, true);
    }

    private static long seed(String key, int version) {
        return key.hashCode() * 0x9E3779B97F4A7C15L + version;
    }
}
