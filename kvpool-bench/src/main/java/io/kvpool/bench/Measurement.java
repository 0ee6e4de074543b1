package io.kvpool.bench;

import java.util.Arrays;

/**
 * What one measured run did: operations, bytes moved, wall time, and every operation's latency.
 * Derived figures (GB/s, ops/s, percentiles) are computed from these, never stored separately.
 */
public record Measurement(long ops, long bytes, long wallNanos, long[] latenciesNanos) {

    public Measurement {
        latenciesNanos = latenciesNanos.clone();
        Arrays.sort(latenciesNanos);
    }

    /** Decimal gigabytes per second of payload moved. */
    public double gbPerSecond() {
        return wallNanos == 0 ? 0 : bytes / (double) wallNanos;
    }

    public double opsPerSecond() {
        return wallNanos == 0 ? 0 : ops * 1e9 / wallNanos;
    }

    /** Latency percentile in microseconds, e.g. {@code percentileMicros(0.99)}. */
    public double percentileMicros(double p) {
        if (latenciesNanos.length == 0) {
            return 0;
        }
        int i = (int) Math.min(latenciesNanos.length - 1, Math.max(0, Math.ceil(p * latenciesNanos.length) - 1));
        return latenciesNanos[i] / 1e3;
    }
}
