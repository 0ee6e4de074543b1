package io.kvpool.config;

import java.util.Locale;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * A byte count with units, as users write it in flags and config files: {@code 4GiB}, {@code 512MiB},
 * {@code 256KiB}, {@code 1048576}, {@code 2GB}. Binary units (KiB, MiB, GiB, TiB) are powers of 1024;
 * decimal units (KB, MB, GB, TB) are powers of 1000; a bare number is bytes. {@link #toString()}
 * prints the largest binary unit that divides the value exactly, so a parsed value prints back the
 * way it was meant.
 */
public record Size(long bytes) implements Comparable<Size> {

    private static final Pattern FORMAT =
            Pattern.compile("\\s*(\\d+(?:\\.\\d+)?)\\s*([KMGT]i?B|B)?\\s*", Pattern.CASE_INSENSITIVE);

    public Size {
        if (bytes < 0) {
            throw new IllegalArgumentException("a size cannot be negative: " + bytes);
        }
    }

    public static Size ofBytes(long bytes) {
        return new Size(bytes);
    }

    public static Size ofKiB(long n) {
        return new Size(Math.multiplyExact(n, 1L << 10));
    }

    public static Size ofMiB(long n) {
        return new Size(Math.multiplyExact(n, 1L << 20));
    }

    public static Size ofGiB(long n) {
        return new Size(Math.multiplyExact(n, 1L << 30));
    }

    /**
     * Parses a size such as {@code 8GiB}.
     *
     * @throws IllegalArgumentException naming the text and the accepted forms
     */
    public static Size parse(String text) {
        if (text == null) {
            throw new IllegalArgumentException("missing size; expected a number with a unit such as 4GiB");
        }
        Matcher m = FORMAT.matcher(text);
        if (!m.matches()) {
            throw new IllegalArgumentException("'" + text + "' is not a size; expected a number with an"
                    + " optional unit B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000),"
                    + " e.g. 4GiB");
        }
        String unit = m.group(2) == null ? "B" : m.group(2).toUpperCase(Locale.ROOT);
        long multiplier = switch (unit) {
            case "B" -> 1L;
            case "KIB" -> 1L << 10;
            case "MIB" -> 1L << 20;
            case "GIB" -> 1L << 30;
            case "TIB" -> 1L << 40;
            case "KB" -> 1_000L;
            case "MB" -> 1_000_000L;
            case "GB" -> 1_000_000_000L;
            case "TB" -> 1_000_000_000_000L;
            default -> throw new IllegalArgumentException("'" + text + "': unknown unit " + m.group(2));
        };
        java.math.BigDecimal value = new java.math.BigDecimal(m.group(1)).multiply(java.math.BigDecimal.valueOf(multiplier));
        if (value.compareTo(java.math.BigDecimal.valueOf(Long.MAX_VALUE)) > 0) {
            throw new IllegalArgumentException("'" + text + "' is too large");
        }
        if (value.stripTrailingZeros().scale() > 0) {
            throw new IllegalArgumentException("'" + text + "' is not a whole number of bytes");
        }
        return new Size(value.longValueExact());
    }

    @Override
    public int compareTo(Size o) {
        return Long.compare(bytes, o.bytes);
    }

    /** The shortest exact form with a binary unit, e.g. {@code 8GiB}, {@code 1536KiB}, {@code 100B}. */
    @Override
    public String toString() {
        String[] units = {"TiB", "GiB", "MiB", "KiB"};
        int[] shifts = {40, 30, 20, 10};
        for (int i = 0; i < units.length; i++) {
            long unit = 1L << shifts[i];
            if (bytes >= unit && bytes % unit == 0) {
                return (bytes >> shifts[i]) + units[i];
            }
        }
        return bytes + "B";
    }

    /** A human-readable approximation, e.g. {@code 1.50 GiB}, for logs and tables. */
    public static String human(long bytes) {
        if (bytes < 1024) {
            return bytes + " B";
        }
        String[] units = {"KiB", "MiB", "GiB", "TiB", "PiB"};
        double v = bytes;
        int i = -1;
        while (v >= 1024 && i < units.length - 1) {
            v /= 1024;
            i++;
        }
        return String.format(Locale.ROOT, "%.2f %s", v, units[i]);
    }
}
