package io.kvpool.connector.hash;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.List;

/**
 * The canonical CBOR (RFC 8949, section 4.2.1 "core deterministic encoding") of the few value kinds
 * that block hashing needs, so that a hash computed here matches one computed by Python's
 * {@code cbor2.dumps(obj, canonical=True)} byte for byte.
 *
 * <pre>
 *   initial byte: major type (3 bits) | additional info (5 bits)
 *   0 unsigned int   1 negative int (-1 - n)   2 byte string   3 text string (UTF-8)   4 array
 *   7 simple: 0xf4 false, 0xf5 true, 0xf6 null
 *   argument n (an int's value, a string's byte length, an array's element count), shortest form:
 *     n &lt; 24          in the additional info itself
 *     n &lt; 2^8         info 24, then 1 byte        n &lt; 2^16   info 25, then 2 bytes (big-endian)
 *     n &lt; 2^32        info 26, then 4 bytes       otherwise   info 27, then 8 bytes
 * </pre>
 *
 * Supported Java values: {@code null}, {@link Boolean}, {@link Byte}/{@link Short}/{@link Integer}/
 * {@link Long}, {@code byte[]}, {@link CharSequence}, {@code int[]} (an array of integers: a block's
 * token ids), {@link List} and {@code Object[]} (arrays, nested). Anything else (floats, maps) is
 * refused with an {@link IllegalArgumentException} naming its type: vLLM's extra keys are strings,
 * integers, bytes and tuples of those, and a float's canonical form (shortest of half, single,
 * double) is easy to get subtly wrong, so it is not guessed at.
 */
public final class Cbor {

    private Cbor() {
    }

    /** The canonical encoding of {@code value}. */
    public static byte[] encode(Object value) {
        ByteArrayOutputStream out = new ByteArrayOutputStream(64);
        write(out, value);
        return out.toByteArray();
    }

    /** Appends the canonical encoding of {@code value}. */
    public static void write(ByteArrayOutputStream out, Object value) {
        switch (value) {
            case null -> out.write(0xf6);
            case Boolean b -> out.write(b ? 0xf5 : 0xf4);
            case Long l -> integer(out, l);
            case Integer i -> integer(out, i);
            case Short s -> integer(out, s);
            case Byte b -> integer(out, b);
            case byte[] bytes -> {
                head(out, 2, bytes.length);
                out.writeBytes(bytes);
            }
            case CharSequence cs -> {
                byte[] utf8 = cs.toString().getBytes(StandardCharsets.UTF_8);
                head(out, 3, utf8.length);
                out.writeBytes(utf8);
            }
            case int[] ints -> {
                head(out, 4, ints.length);
                for (int v : ints) {
                    integer(out, v);
                }
            }
            case List<?> list -> {
                head(out, 4, list.size());
                for (Object o : list) {
                    write(out, o);
                }
            }
            case Object[] array -> {
                head(out, 4, array.length);
                for (Object o : array) {
                    write(out, o);
                }
            }
            default -> throw new IllegalArgumentException("CBOR: cannot encode a " + value.getClass().getName()
                    + " (supported: null, booleans, integers, byte[], strings, int[], lists and arrays of these)");
        }
    }

    static void integer(ByteArrayOutputStream out, long v) {
        if (v >= 0) {
            head(out, 0, v);
        } else {
            head(out, 1, -1 - v); // never overflows: -1 - Long.MIN_VALUE == Long.MAX_VALUE
        }
    }

    /** A major type and its argument {@code n} (treated as unsigned), in the shortest form. */
    static void head(ByteArrayOutputStream out, int major, long n) {
        byte[] b = new byte[9];
        out.write(b, 0, head(b, 0, major, n));
    }

    /** {@link #integer(ByteArrayOutputStream, long)} into {@code buf} at {@code at} (9 bytes free): the bytes written. */
    static int integer(byte[] buf, int at, long v) {
        return v >= 0 ? head(buf, at, 0, v) : head(buf, at, 1, -1 - v);
    }

    /** {@link #head(ByteArrayOutputStream, int, long)} into {@code buf} at {@code at} (9 bytes free): the bytes written. */
    static int head(byte[] buf, int at, int major, long n) {
        int mt = major << 5;
        int extra;
        if (n >= 0 && n < 24) {
            buf[at] = (byte) (mt | (int) n);
            return 1;
        } else if (n >= 0 && n < 1L << 8) {
            buf[at] = (byte) (mt | 24);
            extra = 1;
        } else if (n >= 0 && n < 1L << 16) {
            buf[at] = (byte) (mt | 25);
            extra = 2;
        } else if (n >= 0 && n < 1L << 32) {
            buf[at] = (byte) (mt | 26);
            extra = 4;
        } else {
            buf[at] = (byte) (mt | 27);
            extra = 8;
        }
        for (int i = 0; i < extra; i++) { // big-endian
            buf[at + 1 + i] = (byte) (n >>> (8 * (extra - 1 - i)));
        }
        return 1 + extra;
    }
}
