package io.kvpool.config;

import java.math.BigDecimal;
import java.math.RoundingMode;
import java.time.Duration;
import java.util.Locale;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Durations as users write them: {@code 10s}, {@code 500ms}, {@code 2m}, {@code 1h}, {@code 250us}.
 * A bare number is rejected, because "10" could mean seconds or milliseconds.
 */
public final class Durations {

    private static final Pattern FORMAT =
            Pattern.compile("\\s*(\\d+(?:\\.\\d+)?)\\s*(ns|us|ms|s|m|h|d)\\s*", Pattern.CASE_INSENSITIVE);

    private Durations() {
    }

    /**
     * Parses a duration such as {@code 10s}.
     *
     * @throws IllegalArgumentException naming the text and the accepted units
     */
    public static Duration parse(String text) {
        if (text == null) {
            throw new IllegalArgumentException("missing duration; expected a number with a unit such as 10s");
        }
        Matcher m = FORMAT.matcher(text);
        if (!m.matches()) {
            throw new IllegalArgumentException("'" + text + "' is not a duration; expected a number with a unit"
                    + " ns, us, ms, s, m, h or d, e.g. 10s or 500ms");
        }
        long nanosPerUnit = switch (m.group(2).toLowerCase(Locale.ROOT)) {
            case "ns" -> 1L;
            case "us" -> 1_000L;
            case "ms" -> 1_000_000L;
            case "s" -> 1_000_000_000L;
            case "m" -> 60_000_000_000L;
            case "h" -> 3_600_000_000_000L;
            case "d" -> 86_400_000_000_000L;
            default -> throw new IllegalArgumentException("'" + text + "': unknown unit " + m.group(2));
        };
        BigDecimal nanos = new BigDecimal(m.group(1)).multiply(BigDecimal.valueOf(nanosPerUnit))
                .setScale(0, RoundingMode.HALF_UP);
        if (nanos.compareTo(BigDecimal.valueOf(Long.MAX_VALUE)) > 0) {
            throw new IllegalArgumentException("'" + text + "' is too long");
        }
        return Duration.ofNanos(nanos.longValueExact());
    }

    /** Formats a duration in the form {@link #parse} accepts, e.g. {@code 10s}, {@code 1500ms}. */
    public static String format(Duration d) {
        long nanos = d.toNanos();
        if (nanos == 0) {
            return "0s";
        }
        if (nanos % 3_600_000_000_000L == 0) {
            return nanos / 3_600_000_000_000L + "h";
        }
        if (nanos % 60_000_000_000L == 0) {
            return nanos / 60_000_000_000L + "m";
        }
        if (nanos % 1_000_000_000L == 0) {
            return nanos / 1_000_000_000L + "s";
        }
        if (nanos % 1_000_000L == 0) {
            return nanos / 1_000_000L + "ms";
        }
        if (nanos % 1_000L == 0) {
            return nanos / 1_000L + "us";
        }
        return nanos + "ns";
    }

    /** Checks that {@code d} is positive, naming {@code field} otherwise. */
    public static Duration requirePositive(String field, Duration d) {
        if (d == null || d.isNegative() || d.isZero()) {
            throw new IllegalArgumentException(field + " must be a positive duration, got " + (d == null ? "nothing" : format(d)));
        }
        return d;
    }
}
