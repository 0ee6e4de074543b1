package io.kvpool.protocol;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/**
 * Object keys: non-empty UTF-8 strings of at most {@link #MAX_KEY_BYTES} bytes. Keys are compared as
 * bytes; prefix operations work on the UTF-8 bytes.
 */
public final class Keys {

    /** Longest key accepted, in UTF-8 bytes. Enough for model + version + ranks + a 256-bit hash in hex. */
    public static final int MAX_KEY_BYTES = 512;

    private Keys() {
    }

    /**
     * Encodes and validates a key.
     *
     * @throws IllegalArgumentException naming the key (shortened) and its length when it is empty,
     *                                  too long, or not valid UTF-16 text
     */
    public static byte[] encode(String key) {
        if (key == null || key.isEmpty()) {
            throw new IllegalArgumentException("key is empty: keys must have 1 to " + MAX_KEY_BYTES + " UTF-8 bytes");
        }
        byte[] b = key.getBytes(StandardCharsets.UTF_8);
        if (b.length != key.length() || hasQuestionMark(b)) {
            // not plain ASCII, or a '?' that may stand for an unpaired surrogate the encoder replaced
            checkWellFormed(key);
        }
        validate(b, key);
        return b;
    }

    /** {@link #encode} of each key, in order. */
    public static List<byte[]> encodeAll(List<String> keys) {
        List<byte[]> out = new ArrayList<>(keys.size());
        for (String k : keys) {
            out.add(encode(k));
        }
        return out;
    }

    /**
     * The {@link KeyDigest digests} of {@code keys[from, to)}, lo then hi of each: {@code KeyDigest.of(encode(key))}
     * for each, checked as {@link #encode} checks a key, without keeping the keys' bytes. What a lookup by digest
     * sends. It reads each key's bytes once (digest and '?' check in one pass) and keeps no list of them: 45 us
     * for 1,024 keys of 87 bytes, where {@link #encodeAll} then {@link KeyDigest#digest} took 55 to 60 us.
     *
     * @throws IllegalArgumentException naming the first key {@link #encode} would refuse
     */
    public static long[] digests(List<String> keys, int from, int to) {
        long[] out = new long[2 * (to - from)];
        for (int i = from; i < to; i++) {
            String key = keys.get(i);
            if (key == null || key.isEmpty()) {
                throw new IllegalArgumentException("key is empty: keys must have 1 to " + MAX_KEY_BYTES + " UTF-8 bytes");
            }
            byte[] b = key.getBytes(StandardCharsets.UTF_8);
            validate(b, key);
            if (KeyDigest.digestFindingQuestionMark(b, out, 2 * (i - from)) || b.length != key.length()) {
                checkWellFormed(key); // as in encode: not plain ASCII, or a '?' that may stand for a lone surrogate
            }
        }
        return out;
    }

    private static final VarHandle LONGS = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
    private static final long QUESTION_MARKS = 0x3F3F_3F3F_3F3F_3F3FL;
    private static final long ONES = 0x0101_0101_0101_0101L;
    private static final long HIGHS = 0x8080_8080_8080_8080L;

    /**
     * Whether {@code b} holds a '?', eight bytes at a time: XOR with eight '?' turns each '?' into a
     * zero byte, and {@code (x - 0x01..) & ~x & 0x80..} is non-zero exactly when {@code x} has one. A
     * byte-by-byte loop was a third of the client's time in a 1,024-key prefix match.
     */
    private static boolean hasQuestionMark(byte[] b) {
        int i = 0;
        for (; i + Long.BYTES <= b.length; i += Long.BYTES) {
            long x = (long) LONGS.get(b, i) ^ QUESTION_MARKS;
            if (((x - ONES) & ~x & HIGHS) != 0) {
                return true;
            }
        }
        for (; i < b.length; i++) {
            if (b[i] == '?') {
                return true;
            }
        }
        return false;
    }

    /**
     * Rejects unpaired surrogates: UTF-8 encoding would turn each into '?', so two different keys
     * could name the same object.
     */
    private static void checkWellFormed(String key) {
        for (int i = 0; i < key.length(); i++) {
            char c = key.charAt(i);
            if (Character.isHighSurrogate(c) && i + 1 < key.length() && Character.isLowSurrogate(key.charAt(i + 1))) {
                i++;
            } else if (Character.isSurrogate(c)) {
                throw new IllegalArgumentException("key '" + abbreviate(key) + "' has an unpaired surrogate at index "
                        + i + " and cannot be encoded as UTF-8");
            }
        }
    }

    /** Validates an encoded key; {@code shown} is used in the message. */
    public static void validate(byte[] b, String shown) {
        if (b.length == 0) {
            throw new IllegalArgumentException("key is empty: keys must have 1 to " + MAX_KEY_BYTES + " UTF-8 bytes");
        }
        if (b.length > MAX_KEY_BYTES) {
            throw new IllegalArgumentException("key '" + abbreviate(shown) + "' is " + b.length
                    + " UTF-8 bytes; the limit is " + MAX_KEY_BYTES);
        }
    }

    /** Decodes a key for messages and listings. */
    public static String decode(byte[] b) {
        return new String(b, StandardCharsets.UTF_8);
    }

    /** A key shortened for error messages: first 60 characters and a count of what was cut. */
    public static String abbreviate(String key) {
        if (key == null) {
            return "null";
        }
        return key.length() <= 80 ? key : key.substring(0, 60) + "...(" + (key.length() - 60) + " more chars)";
    }

    /** True if {@code key} starts with {@code prefix}, byte-wise. */
    public static boolean hasPrefix(byte[] key, byte[] prefix) {
        if (prefix.length > key.length) {
            return false;
        }
        return java.util.Arrays.equals(key, 0, prefix.length, prefix, 0, prefix.length);
    }
}
