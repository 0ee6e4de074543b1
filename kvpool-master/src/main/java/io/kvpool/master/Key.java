package io.kvpool.master;

import io.kvpool.protocol.KeyDigest;

import java.util.Arrays;

/**
 * The key hash every index structure uses, and the key object of the (few) pending puts.
 *
 * <p>{@link #hash} is computed once per request key: the shard is chosen from its top bits, a shard's
 * table cell from its low bits (see {@link ObjectIndex} and {@link ObjectTable}). It is the low half
 * of the key's {@link KeyDigest} (two multiply-rotate lanes over 8-byte words and a full 64-bit
 * avalanche), so keys that share a long prefix and differ in a few hex digits still spread over every
 * bit, and a digest sent instead of a key finds the same cell.
 */
final class Key {

    final byte[] bytes;
    private final int hash;

    /** A key and its {@link #hash} (already computed by the caller). */
    Key(byte[] bytes, int hash) {
        this.bytes = bytes;
        this.hash = hash;
    }

    /**
     * The key's hash: the low 32 bits of its {@link KeyDigest}, so a lookup by digest (which carries
     * no key) lands on the same shard and table cell as a lookup by key. Allocates nothing.
     */
    static int hash(byte[] k) {
        return (int) KeyDigest.lo(k, 0, k.length);
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
