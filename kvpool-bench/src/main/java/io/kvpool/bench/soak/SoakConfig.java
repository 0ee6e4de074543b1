package io.kvpool.bench.soak;

import io.kvpool.config.Size;
import io.kvpool.etcd.MasterAddress;

import java.io.PrintStream;
import java.nio.file.Path;
import java.time.Duration;

/**
 * What a soak does (see {@link Soak}).
 *
 * @param duration          how long traffic runs (chaos may extend it: every enabled kind runs at least once)
 * @param clients           client threads, each with its own client connection
 * @param keys              keys in the working set (soak/gG/kI, 16 to a group)
 * @param minValue          smallest value
 * @param maxValue          largest value
 * @param seed              seed of every random choice (traffic and chaos)
 * @param nodeKillEvery     mean time between node kills; zero: none
 * @param failoverEvery     mean time between killing the leading master; zero: none
 * @param partitionEvery    mean time between partitions; zero: none
 * @param partitionLength   how long a partition lasts
 * @param nodeDown          how long a killed node stays down before it is restarted
 * @param restartEmpty      restart killed nodes with --no-adopt-segment (empty) instead of adopting their segment
 * @param repairDeadline    bound on waiting for repair (below-count objects back to 0) before the next kill
 * @param progressEvery     period of the one-line progress
 * @param segmentSize       memory of each node started
 * @param nodes             nodes started
 * @param masters           elected masters started
 * @param replicas          copies each put asks for
 * @param nodeTtl           the masters' --node-ttl
 * @param requestTimeout    the clients' request timeout
 * @param childHeap         -Xmx of each started master and node
 * @param logDir            where the started processes write their output
 * @param external          a running pool to soak instead of starting one (no chaos then); null: start one
 * @param out               where progress and the report go
 */
public record SoakConfig(Duration duration, int clients, int keys, Size minValue, Size maxValue, long seed,
                         Duration nodeKillEvery, Duration failoverEvery, Duration partitionEvery,
                         Duration partitionLength, Duration nodeDown, boolean restartEmpty, Duration repairDeadline, Duration progressEvery,
                         Size segmentSize, int nodes, int masters, int replicas, Duration nodeTtl,
                         Duration requestTimeout, String childHeap, Path logDir, MasterAddress external,
                         PrintStream out) {

    /** Keys to a group: a removal by prefix removes one group. */
    static final int GROUP = 16;

    public SoakConfig {
        positive("--duration", duration);
        positive("--partition-length", partitionLength);
        positive("--repair-deadline", repairDeadline);
        positive("--progress-every", progressEvery);
        notNegative("--node-kill-every", nodeKillEvery);
        notNegative("--failover-every", failoverEvery);
        notNegative("--partition-every", partitionEvery);
        notNegative("--node-down", nodeDown);
        if (clients < 1 || clients > 256) {
            throw new IllegalArgumentException("--clients must be 1 to 256, got " + clients);
        }
        if (keys < GROUP || keys % GROUP != 0) {
            throw new IllegalArgumentException("--keys must be a multiple of " + GROUP + " (a group removed by prefix), got "
                    + keys);
        }
        if (minValue.bytes() < SoakValues.HEADER || maxValue.bytes() < minValue.bytes()
                || maxValue.bytes() > 64L << 20) {
            throw new IllegalArgumentException("value sizes must satisfy " + SoakValues.HEADER
                    + "B <= --min-value <= --max-value <= 64MiB, got " + minValue + " and " + maxValue);
        }
        if (replicas < 1 || (external == null && replicas >= nodes)) {
            throw new IllegalArgumentException("--replicas must be at least 1 and below the node count (" + nodes
                    + ") so a node can be lost and its copies remade, got " + replicas);
        }
        if (external == null && masters < 2 && !failoverEvery.isZero()) {
            throw new IllegalArgumentException("a failover needs at least 2 masters, got " + masters);
        }
    }

    boolean startsPool() {
        return external == null;
    }

    /**
     * The most the working set can hold at once, all copies counted: every key at the largest size
     * (a key's old version is freed by its removal before a new one is put).
     */
    long workingSetBytes() {
        return (long) keys * (maxValue.bytes() + 4096) * replicas;
    }

    private static void positive(String flag, Duration d) {
        if (d == null || d.isNegative() || d.isZero()) {
            throw new IllegalArgumentException(flag + " must be positive, got " + d);
        }
    }

    private static void notNegative(String flag, Duration d) {
        if (d == null || d.isNegative()) {
            throw new IllegalArgumentException(flag + " must not be negative (0 turns it off), got " + d);
        }
    }
}
