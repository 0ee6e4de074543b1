package io.kvpool.connector.hash;

import java.util.Arrays;
import java.util.HexFormat;

/** A block's 32-byte SHA-256 chained hash: it names the block's tokens and every token before them. */
public record BlockHash(byte[] bytes) {

    public static final int LENGTH = 32;

    public BlockHash {
        if (bytes == null || bytes.length != LENGTH) {
            throw new IllegalArgumentException("a block hash has " + LENGTH + " bytes, got "
                    + (bytes == null ? "null" : bytes.length));
        }
        bytes = bytes.clone();
    }

    public static BlockHash ofHex(String hex) {
        return new BlockHash(HexFormat.of().parseHex(hex));
    }

    @Override
    public byte[] bytes() {
        return bytes.clone();
    }

    public String hex() {
        return HexFormat.of().formatHex(bytes);
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof BlockHash h && Arrays.equals(bytes, h.bytes);
    }

    @Override
    public int hashCode() {
        return Arrays.hashCode(bytes);
    }

    @Override
    public String toString() {
        return hex();
    }
}
