package io.kvpool.cli;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.config.Size;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;

import java.util.Locale;
import java.util.concurrent.Callable;

/** {@code kvpool status}: the cluster as a table. */
@Command(name = "status", mixinStandardHelpOptions = true,
        description = "Show segments, capacity, use, keys and clients as a table.")
final class StatusCommand implements Callable<Integer> {

    @Mixin
    ClientOptions client;

    @Override
    public Integer call() {
        PoolStats s;
        try (KvPoolClient c = client.connect()) {
            s = c.stats();
        }
        System.out.printf(Locale.ROOT, "master %s  epoch %d  keys %d  pending puts %d  clients %d%n", client.master(),
                s.epoch(), s.keys(), s.pendingPuts(), s.activeClients());
        System.out.printf(Locale.ROOT, "capacity %s  used %s (%.1f%%)%n%n", Size.human(s.capacityBytes()),
                Size.human(s.allocatedBytes()),
                s.capacityBytes() == 0 ? 0.0 : 100.0 * s.allocatedBytes() / s.capacityBytes());
        Table t = new Table("ID", "SEGMENT", "STATE", "CAPACITY", "USED", "USED%", "OBJECTS", "HEARTBEAT").right(0, 3, 4, 5, 6, 7);
        for (PoolStats.SegmentStats seg : s.segments()) {
            t.row(seg.id(), seg.name(), seg.active() ? "active" : "joining", Size.human(seg.capacityBytes()),
                    Size.human(seg.usedBytes()),
                    String.format(Locale.ROOT, "%.1f", seg.capacityBytes() == 0 ? 0.0 : 100.0 * seg.usedBytes() / seg.capacityBytes()),
                    seg.objects(), seg.heartbeatAgeMillis() + " ms ago");
        }
        if (s.segments().isEmpty()) {
            System.out.println("no segments registered");
        } else {
            t.print(System.out);
        }
        return 0;
    }
}
