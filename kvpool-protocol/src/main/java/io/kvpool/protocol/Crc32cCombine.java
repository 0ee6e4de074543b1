package io.kvpool.protocol;

/**
 * The CRC32C of a concatenation from the CRC32Cs of its pieces, without their bytes: what a writer
 * that sends a value in parts, in any order, needs for the value's checksum (NODE_PART_END).
 *
 * <h2>Why it works</h2>
 * A CRC is the remainder of the message polynomial times {@code x^32} modulo the generator P, with
 * the register preset to all ones and the result inverted. For CRC32C both the preset and the final
 * inversion are {@code 0xFFFFFFFF}, and for such CRCs appending {@code B} to {@code A} gives
 * {@code crc(A || B) = crc(A) * x^(8 |B|) mod P  xor  crc(B)}: the presets and inversions cancel out
 * in the sum. So combining needs one multiplication modulo P by {@code x^(8 |B|)}, which is built
 * from the powers {@code x^(2^k)} (square and multiply), in at most 64 multiplications of 32 steps.
 *
 * <p>Polynomials are held bit-reflected, as the CRC register holds them: the coefficient of
 * {@code x^0} is bit 31 and that of {@code x^31} bit 0, and P (without its {@code x^32} term) is
 * {@code 0x82F63B78}.
 */
public final class Crc32cCombine {

    /** The Castagnoli polynomial, reflected. */
    private static final int POLY = 0x82F63B78;
    /** {@code x^0 = 1}, reflected. */
    private static final int ONE = 0x80000000;
    /** {@code X2N[k] = x^(2^k) mod P}, reflected, for every k a byte count below 2^63 needs (8 n < 2^66). */
    private static final int[] X2N = new int[66];

    static {
        int p = ONE >>> 1; // x^1
        X2N[0] = p;
        for (int k = 1; k < X2N.length; k++) {
            p = multiply(p, p);
            X2N[k] = p;
        }
    }

    private Crc32cCombine() {
    }

    /**
     * The CRC32C of {@code A || B} given {@code crcA = crc32c(A)}, {@code crcB = crc32c(B)} and the
     * length of {@code B} in bytes.
     */
    public static int combine(int crcA, int crcB, long lengthB) {
        if (lengthB < 0) {
            throw new IllegalArgumentException("length " + lengthB + " is negative");
        }
        return multiply(xPowerOfBytes(lengthB), crcA) ^ crcB;
    }

    /** {@code a * b mod P}, reflected. */
    static int multiply(int a, int b) {
        int product = 0;
        for (int bit = ONE; bit != 0; bit >>>= 1) {
            if ((a & bit) != 0) {
                product ^= b;
            }
            b = (b & 1) != 0 ? (b >>> 1) ^ POLY : b >>> 1;
        }
        return product;
    }

    /** {@code x^(8 n) mod P}: the shift of appending n bytes. */
    private static int xPowerOfBytes(long n) {
        int p = ONE;
        int k = 3; // 8 n = n * 2^3
        while (n != 0) {
            if ((n & 1) != 0) {
                p = multiply(X2N[k], p);
            }
            n >>>= 1;
            k++;
        }
        return p;
    }
}
