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

    /** Copies the 32 bytes into {@code dst} at {@code at} (no copy of its own, unlike {@link #bytes()}). */
    void copyTo(byte[] dst, int at) {
        System.arraycopy(bytes, 0, dst, at, LENGTH);
    }

    private static final byte[] HEX = "0123456789abcdef".getBytes(java.nio.charset.StandardCharsets.US_ASCII);

    /** Writes the hash as 64 lowercase hex digits (ASCII) into {@code dst} at {@code at}. */
    void hexInto(byte[] dst, int at) {
        for (int i = 0; i < LENGTH; i++) {
            dst[at + 2 * i] = HEX[(bytes[i] >> 4) & 0xf];
            dst[at + 2 * i + 1] = HEX[bytes[i] & 0xf];
        }
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
