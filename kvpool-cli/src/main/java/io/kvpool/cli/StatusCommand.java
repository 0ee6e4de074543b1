package io.kvpool.cli;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.config.Size;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.kvpool.etcd.EtcdGateway;
import io.kvpool.etcd.EtcdTarget;
import io.kvpool.etcd.LeaderRecord;
import io.kvpool.etcd.MasterAddress;

import java.time.Duration;
import java.util.Locale;
import java.util.concurrent.Callable;

/** {@code kvpool status}: the cluster as a table. */
@Command(name = "status", mixinStandardHelpOptions = true,
        description = "Show segments, capacity, use, keys and clients as a table.")
final class StatusCommand implements Callable<Integer> {

    @Mixin
    ClientOptions client;

    @Override
    public Integer call() throws Exception {
        if (client.master() instanceof MasterAddress.Elected e) {
            printElection(e.target());
        }
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

    /** The masters registered in etcd: which one leads, at which term, and whether it serves yet. */
    private static void printElection(EtcdTarget target) throws Exception {
        try (EtcdGateway etcd = new EtcdGateway(target.endpoints(), Duration.ofSeconds(5))) {
            EtcdGateway.KeyValue leaderKv = etcd.range(target.leaderKey()).first();
            LeaderRecord leader = leaderKv == null ? null : LeaderRecord.parse(leaderKv.value());
            System.out.printf(Locale.ROOT, "election %s: %s%n", target, leader == null ? "no leader"
                    : "leader " + leader.id() + " at " + leader.address() + ", term " + leaderKv.createRevision()
                    + (leader.ready() ? "" : " (rebuilding from the nodes, not serving yet)"));
            Table t = new Table("MASTER", "ADDRESS", "HTTP", "ROLE");
            ObjectMapper json = new ObjectMapper();
            for (EtcdGateway.KeyValue kv : etcd.rangePrefix(target.mastersPrefix()).kvs()) {
                JsonNode m = json.readTree(kv.value());
                String id = m.path("id").asText("?");
                t.row(id, m.path("address").asText(""), m.path("http").asText(""),
                        leader != null && leader.id().equals(id) ? "leader" : "standby");
            }
            t.print(System.out);
            System.out.println();
        }
    }
}
