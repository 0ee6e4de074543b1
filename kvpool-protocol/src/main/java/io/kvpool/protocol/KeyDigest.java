package io.kvpool.protocol;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * The 128-bit digest of a key: what lookups by digest send instead of the key (docs/protocol.md,
 * section 4.26), and, in its low 32 bits, the hash every index structure of the master uses.
 *
 * <h2>The function ("KD1")</h2>
 * Over the key's UTF-8 bytes {@code b[0..n)}, with 64-bit wrapping arithmetic, {@code rotl} a left
 * rotation and the constants below:
 * <pre>
 *   a = P3 + n * P1
 *   c = P4 + n * P2
 *   for each full 8-byte word w (little-endian) at i = 0, 8, 16, ...:
 *       a = rotl(a ^ (w * P2), 31) * P1
 *       c = rotl(c ^ (w * P1), 27) * P2
 *   if r = n mod 8 bytes remain: w = those bytes little-endian, zero-extended
 *       a = rotl(a ^ (w * P3), 23) * P2
 *       c = rotl(c ^ (w * P4), 29) * P1
 *   lo = fmix(a + c)
 *   hi = fmix(c ^ rotl(a, 17))
 *   fmix(x): x ^= x >>> 33; x *= 0xFF51AFD7ED558CCD; x ^= x >>> 33; x *= 0xC4CEB9FE1A85EC53; x ^= x >>> 33
 * </pre>
 * On the wire a digest is {@code lo} then {@code hi}, each an {@code i64} little-endian: 16 bytes.
 *
 * <h2>What it promises</h2>
 * It is fast (two multiply-rotate lanes over 8-byte words; about 15 ns for an 81-byte key) and mixes
 * every input bit into every output bit, so two different keys share a digest with probability
 * 2^-128 unless someone chose them to. It is not a cryptographic hash: keys crafted to collide are
 * possible. That is why a lookup by digest only ever says "present": a read goes by the key itself,
 * and the node confirms it against the key in the object's header, so a forged collision can cost a
 * reader a miss (a recompute), never the wrong bytes.
 */
public final class KeyDigest {

    /** Bytes of a digest on the wire. */
    public static final int BYTES = 16;

    static final long P1 = 0x9E3779B185EBCA87L;
    static final long P2 = 0xC2B2AE3D27D4EB4FL;
    static final long P3 = 0x165667B19E3779F9L;
    static final long P4 = 0x85EBCA77C2B2AE63L;

    private static final VarHandle LONGS = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);

    private KeyDigest() {
    }

    /** The low half of the digest of {@code k[off, off + len)} (the master's table hash is its low 32 bits). */
    public static long lo(byte[] k, int off, int len) {
        long[] t = new long[2]; // does not escape: scalar-replaced by the JIT
        digest(k, off, len, t, 0);
        return t[0];
    }

    /** The digest of {@code k[off, off + len)} into {@code out[at]} (lo) and {@code out[at + 1]} (hi). */
    public static void digest(byte[] k, int off, int len, long[] out, int at) {
        long a = P3 + len * P1;
        long c = P4 + len * P2;
        int i = off;
        int end = off + len;
        for (; i + 8 <= end; i += 8) {
            long w = (long) LONGS.get(k, i);
            a = Long.rotateLeft(a ^ (w * P2), 31) * P1;
            c = Long.rotateLeft(c ^ (w * P1), 27) * P2;
        }
        if (i < end) {
            long w = tail(k, i, end);
            a = Long.rotateLeft(a ^ (w * P3), 23) * P2;
            c = Long.rotateLeft(c ^ (w * P4), 29) * P1;
        }
        out[at] = fmix(a + c);
        out[at + 1] = fmix(c ^ Long.rotateLeft(a, 17));
    }

    private static final long QUESTION_MARKS = 0x3F3F_3F3F_3F3F_3F3FL;
    private static final long ONES = 0x0101_0101_0101_0101L;
    private static final long HIGHS = 0x8080_8080_8080_8080L;

    /**
     * {@link #digest(byte[], int, int, long[], int) digest} of all of {@code k}, and whether {@code k} holds a
     * {@code '?'}, found in the same pass over its words ({@code (x - 0x01..) & ~x & 0x80..} of the word XOR eight
     * '?' is non-zero exactly when the word has one): {@link Keys#digests} needs both, and one pass over a key's
     * bytes costs less than two.
     */
    static boolean digestFindingQuestionMark(byte[] k, long[] out, int at) {
        int len = k.length;
        long a = P3 + len * P1;
        long c = P4 + len * P2;
        long found = 0;
        int i = 0;
        for (; i + 8 <= len; i += 8) {
            long w = (long) LONGS.get(k, i);
            long x = w ^ QUESTION_MARKS;
            found |= (x - ONES) & ~x & HIGHS;
            a = Long.rotateLeft(a ^ (w * P2), 31) * P1;
            c = Long.rotateLeft(c ^ (w * P1), 27) * P2;
        }
        if (i < len) {
            long w = tail(k, i, len);
            for (; i < len; i++) {
                found |= k[i] == '?' ? 1 : 0;
            }
            a = Long.rotateLeft(a ^ (w * P3), 23) * P2;
            c = Long.rotateLeft(c ^ (w * P4), 29) * P1;
        }
        out[at] = fmix(a + c);
        out[at + 1] = fmix(c ^ Long.rotateLeft(a, 17));
        return found != 0;
    }

    /**
     * The digest of the {@code len} bytes at {@code off} of a little-endian buffer (absolute: its position is left
     * alone) into {@code out[at]} and {@code out[at + 1]}: the same function as {@link #digest(byte[], int, int,
     * long[], int)}, for keys read in place from a frame body.
     */
    public static void digest(ByteBuffer le, int off, int len, long[] out, int at) {
        long a = P3 + len * P1;
        long c = P4 + len * P2;
        int i = off;
        int end = off + len;
        for (; i + 8 <= end; i += 8) {
            long w = le.getLong(i);
            a = Long.rotateLeft(a ^ (w * P2), 31) * P1;
            c = Long.rotateLeft(c ^ (w * P1), 27) * P2;
        }
        if (i < end) {
            long w = 0;
            for (int s = 0; i < end; i++, s += 8) {
                w |= (le.get(i) & 0xFFL) << s;
            }
            a = Long.rotateLeft(a ^ (w * P3), 23) * P2;
            c = Long.rotateLeft(c ^ (w * P4), 29) * P1;
        }
        out[at] = fmix(a + c);
        out[at + 1] = fmix(c ^ Long.rotateLeft(a, 17));
    }

    /** The digest of a whole key as {lo, hi}. */
    public static long[] of(byte[] k) {
        long[] out = new long[2];
        digest(k, 0, k.length, out, 0);
        return out;
    }

    private static long tail(byte[] k, int from, int end) {
        long w = 0;
        for (int s = 0, i = from; i < end; i++, s += 8) {
            w |= (k[i] & 0xFFL) << s;
        }
        return w;
    }

    static long fmix(long x) {
        x ^= x >>> 33;
        x *= 0xFF51AFD7ED558CCDL;
        x ^= x >>> 33;
        x *= 0xC4CEB9FE1A85EC53L;
        x ^= x >>> 33;
        return x;
    }
}
