package io.kvpool.cli;

import io.kvpool.config.Size;

import java.lang.management.ManagementFactory;

/**
 * What this machine can hold, and the checks of the command line's counts and sizes against it.
 *
 * <h2>Why every count has a bound</h2>
 * A count or size is a promise of threads, connections or memory. One the machine cannot keep does
 * not fail cleanly later: {@code pool-demo --clients 100000000} allocated client buffers until the
 * machine swapped, and the JVM then answered neither SIGTERM nor jcmd. So each command checks its
 * numbers before it starts anything, and a number out of bounds is a bad flag: an
 * {@link IllegalArgumentException} whose message names the flag, the value given and the bound,
 * which {@link Main} turns into exit code 2.
 *
 * <p>Bounds are of two kinds: fixed ranges that keep arithmetic in range and work finite (documented
 * per flag in docs/operations.md), and what this machine has: its memory ({@link #machineMemory}),
 * which the memory a command's flags commit together must not exceed, and the process's open-file
 * limit, which bounds connections.
 */
final class Bounds {

    private Bounds() {
    }

    /** The machine's (or container's) physical memory in bytes, 0 when the JVM cannot tell. */
    static long machineMemory() {
        return ManagementFactory.getOperatingSystemMXBean() instanceof com.sun.management.OperatingSystemMXBean os
                ? os.getTotalMemorySize() : 0;
    }

    /** The most files (sockets included) this process may have open, 0 when the JVM cannot tell. */
    static long openFileLimit() {
        return ManagementFactory.getOperatingSystemMXBean() instanceof com.sun.management.UnixOperatingSystemMXBean os
                ? os.getMaxFileDescriptorCount() : 0;
    }

    /** {@code value} must be in {@code [min, max]}; {@code why} (may be null) says where the bound comes from. */
    static int range(String flag, long value, long min, long max, String why) {
        if (value < min || value > max) {
            throw new IllegalArgumentException(flag + " " + value + " is out of range: " + min + " to " + max
                    + (why == null ? "" : " (" + why + ")"));
        }
        return (int) Math.min(value, Integer.MAX_VALUE);
    }

    /** {@code flagA} times {@code flagB} ({@code unit}, e.g. "requests") must be at most {@code max}. */
    static void productAtMost(String flagA, long a, String flagB, long b, long max, String unit, String why) {
        long product = times(a, b);
        if (product > max) {
            throw new IllegalArgumentException(flagA + " " + a + " x " + flagB + " " + b + " is " + product + " " + unit
                    + ", more than " + max + " (" + why + ")");
        }
    }

    /** {@code value} must be at least {@code min}. */
    static void atLeast(String flag, long value, long min) {
        if (value < min) {
            throw new IllegalArgumentException(flag + " " + value + " must be at least " + min);
        }
    }

    /** {@code size} must be at most {@code max} bytes, which {@code bound} names (e.g. "the segment (--segment-size)"). */
    static void sizeAtMost(String flag, Size size, long max, String bound) {
        if (size.bytes() > max) {
            throw new IllegalArgumentException(flag + " " + size + " is more than " + bound + ", " + Size.ofBytes(max));
        }
    }

    /** {@code size} must be at least {@code min} bytes. */
    static void sizeAtLeast(String flag, Size size, long min) {
        if (size.bytes() < min) {
            throw new IllegalArgumentException(flag + " " + size + " is less than the least it can be, " + Size.ofBytes(min));
        }
    }

    /**
     * The memory {@code what} (the flags that make it, with their values) commits, {@code bytes}, must
     * fit this machine's memory. Unknown memory (0) passes.
     */
    static void fitsMemory(String what, long bytes) {
        long memory = machineMemory();
        if (memory > 0 && bytes > memory) {
            throw new IllegalArgumentException(what + " need " + Size.human(bytes) + " of memory, more than this"
                    + " machine's " + Size.human(memory));
        }
    }

    /** {@code a * b}, or {@link Long#MAX_VALUE} where that overflows (both non-negative). */
    static long times(long a, long b) {
        return Math.multiplyHigh(a, b) != 0 || a * b < 0 ? Long.MAX_VALUE : a * b;
    }

    /** {@code a + b}, or {@link Long#MAX_VALUE} where that overflows (both non-negative). */
    static long plus(long a, long b) {
        long s = a + b;
        return s < 0 ? Long.MAX_VALUE : s;
    }

    /** A port flag: 0 to 65535 (0 picks a free one), or -1 too where {@code offAllowed}. */
    static void port(String flag, int port, boolean offAllowed) {
        if (port < (offAllowed ? -1 : 0) || port > 65535) {
            throw new IllegalArgumentException(flag + " " + port + " is out of range: 0 to 65535 (0 picks a free port"
                    + (offAllowed ? ", -1 turns it off)" : ")"));
        }
    }

    /** Connections a server may keep open: at least 1, at most this process's open-file limit. */
    static void connections(String flag, int value) {
        long files = openFileLimit();
        long max = files > 0 ? files : Integer.MAX_VALUE;
        range(flag, value, 1, max, "each connection is an open file; this process may open " + max
                + " (ulimit -n)");
    }
}
