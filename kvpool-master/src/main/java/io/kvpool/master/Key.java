package io.kvpool.master;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.util.Arrays;

/**
 * The key hash every index structure uses, and the key object of the (few) pending puts.
 *
 * <p>{@link #hash} is computed once per request key: the shard is chosen from its top bits, a shard's
 * table cell from its low bits (see {@link ObjectIndex} and {@link ObjectTable}). It reads the key
 * eight bytes at a time, mixes each word into the state with a multiply and a rotation, and ends
 * with a full 64-bit avalanche (MurmurHash3's finalizer), so keys that share a long prefix and differ
 * in a few hex digits still spread over every bit.
 */
final class Key {

    private static final VarHandle LONGS = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
    private static final VarHandle INTS = MethodHandles.byteArrayViewVarHandle(int[].class, ByteOrder.LITTLE_ENDIAN);
    private static final long P1 = 0x9E3779B185EBCA87L;
    private static final long P2 = 0xC2B2AE3D27D4EB4FL;
    private static final long P3 = 0x165667B19E3779F9L;

    final byte[] bytes;
    private final int hash;

    /** A key and its {@link #hash} (already computed by the caller). */
    Key(byte[] bytes, int hash) {
        this.bytes = bytes;
        this.hash = hash;
    }

    /** A well-mixed 32-bit hash of the key bytes; allocates nothing. */
    static int hash(byte[] k) {
        int len = k.length;
        long h = P3 + len * P1;
        int i = 0;
        for (; i + 8 <= len; i += 8) {
            h = Long.rotateLeft(h ^ ((long) LONGS.get(k, i) * P2), 31) * P1;
        }
        if (i + 4 <= len) {
            h = Long.rotateLeft(h ^ (((int) INTS.get(k, i) & 0xFFFF_FFFFL) * P1), 23) * P2;
            i += 4;
        }
        for (; i < len; i++) {
            h = Long.rotateLeft(h ^ ((k[i] & 0xFFL) * P3), 11) * P1;
        }
        h ^= h >>> 33;
        h *= 0xFF51AFD7ED558CCDL;
        h ^= h >>> 33;
        h *= 0xC4CEB9FE1A85EC53L;
        h ^= h >>> 33;
        return (int) h;
    }

    @Override
    public int hashCode() {
        return hash;
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof Key k && k.hash == hash && Arrays.equals(k.bytes, bytes);
    }

    @Override
    public String toString() {
        return io.kvpool.protocol.Keys.decode(bytes);
    }
}
