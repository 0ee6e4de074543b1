package io.kvpool.master;

import java.util.Arrays;

/** An object key as the master stores it: UTF-8 bytes with a precomputed, well-mixed hash. */
final class Key {

    final byte[] bytes;
    private final int hash;

    Key(byte[] bytes) {
        this.bytes = bytes;
        int h = Arrays.hashCode(bytes);
        // spread the bits so both the shard choice and the hash table see all of them
        h ^= (h >>> 16);
        h *= 0x85EBCA6B;
        h ^= (h >>> 13);
        this.hash = h;
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
