package io.kvpool.config;

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
        double value = Double.parseDouble(m.group(1));
        double nanosPerUnit = switch (m.group(2).toLowerCase(Locale.ROOT)) {
            case "ns" -> 1;
            case "us" -> 1e3;
            case "ms" -> 1e6;
            case "s" -> 1e9;
            case "m" -> 60e9;
            case "h" -> 3600e9;
            case "d" -> 86400e9;
            default -> throw new IllegalArgumentException("'" + text + "': unknown unit " + m.group(2));
        };
        double nanos = value * nanosPerUnit;
        if (nanos > Long.MAX_VALUE) {
            throw new IllegalArgumentException("'" + text + "' is too long");
        }
        return Duration.ofNanos(Math.round(nanos));
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
