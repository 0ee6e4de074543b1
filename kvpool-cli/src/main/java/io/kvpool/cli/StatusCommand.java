package io.kvpool.cli;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.config.Durations;
import io.kvpool.config.Size;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.kvpool.etcd.EtcdGateway;
import io.kvpool.etcd.EtcdTarget;
import io.kvpool.etcd.LeaderRecord;
import io.kvpool.etcd.MasterAddress;

import java.io.PrintWriter;
import java.io.StringWriter;
import java.time.Duration;
import java.time.LocalTime;
import java.util.Locale;
import java.util.concurrent.Callable;

/**
 * {@code kvpool status}: the cluster as a table; with {@code --watch}, redrawn in place every
 * interval like {@code top} (on a terminal; otherwise each frame is printed after the last, with its
 * time), with the change in keys and use since the previous frame, until Ctrl-C.
 */
@Command(name = "status", mixinStandardHelpOptions = true,
        description = "Show segments, capacity, use, keys and clients as a table.")
final class StatusCommand implements Callable<Integer> {

    @Mixin
    ClientOptions client;

    @Option(names = "--watch", arity = "0..1", fallbackValue = "2s", paramLabel = "INTERVAL",
            description = "Refresh in place every INTERVAL (default when given without one: 2s) until Ctrl-C.")
    Duration watch;

    @Option(names = "--frames", paramLabel = "N", hidden = true,
            description = "With --watch: stop after N frames (for scripts and tests).")
    int frames;

    /** ANSI: cursor home, and clear from the cursor to the end of the screen / line. */
    private static final String HOME = "\033[H";
    private static final String CLEAR_BELOW = "\033[J";
    private static final String CLEAR_LINE = "\033[K";

    @Override
    public Integer call() throws Exception {
        if (watch == null) {
            try (KvPoolClient c = client.connect()) {
                System.out.print(frame(c, null, 0));
            }
            return 0;
        }
        Bounds.atLeast("--frames", frames, 0);
        if (watch.isNegative() || watch.isZero()) {
            throw new IllegalArgumentException("--watch interval must be positive, got " + Durations.format(watch));
        }
        boolean terminal = System.console() != null && System.getenv("TERM") != null
                && !"dumb".equals(System.getenv("TERM"));
        if (terminal) {
            System.out.print("\033[2J"); // clear once; each frame then overwrites the last
        }
        PoolStats previous = null;
        long previousNanos = 0;
        try (KvPoolClient c = client.connect()) {
            for (int n = 0; frames <= 0 || n < frames; n++) {
                if (n > 0) {
                    Thread.sleep(watch);
                }
                String text;
                PoolStats now = null;
                long t = System.nanoTime();
                try {
                    now = c.stats();
                    text = frame(c, now, previous == null ? 0 : (t - previousNanos) / 1e9, previous);
                } catch (RuntimeException e) {
                    // keep watching through an outage or a failover: say what is wrong, try again next time
                    text = "cannot reach the pool at " + client.master() + ": " + e.getMessage() + "\n";
                }
                String header = String.format(Locale.ROOT, "kvpool status  %s  every %s  (Ctrl-C to stop)%n",
                        LocalTime.now().withNano(0), Durations.format(watch));
                if (terminal) {
                    System.out.print(HOME + (header + text).replace("\n", CLEAR_LINE + "\n") + CLEAR_BELOW);
                } else {
                    System.out.print((n > 0 ? "\n" : "") + header + text);
                }
                System.out.flush();
                if (now != null) {
                    previous = now;
                    previousNanos = t;
                }
            }
        }
        return 0;
    }

    private String frame(KvPoolClient c, PoolStats known, double secondsSincePrevious) throws Exception {
        return frame(c, known == null ? c.stats() : known, secondsSincePrevious, null);
    }

    /** One screen: the election (etcd), the pool's totals (with changes since {@code before}), the segments. */
    private String frame(KvPoolClient c, PoolStats s, double secs, PoolStats before) throws Exception {
        StringWriter w = new StringWriter();
        PrintWriter out = new PrintWriter(w);
        if (client.master() instanceof MasterAddress.Elected e) {
            printElection(e.target(), out);
        }
        out.printf(Locale.ROOT, "master %s  epoch %d  keys %d%s  pending puts %d  clients %d%n", client.master(),
                s.epoch(), s.keys(), before == null || secs <= 0 ? ""
                        : String.format(Locale.ROOT, " (%+.1f/s)", (s.keys() - before.keys()) / secs),
                s.pendingPuts(), s.activeClients());
        out.printf(Locale.ROOT, "capacity %s  used %s (%.1f%%)%s%n%n", Size.human(s.capacityBytes()),
                Size.human(s.allocatedBytes()),
                s.capacityBytes() == 0 ? 0.0 : 100.0 * s.allocatedBytes() / s.capacityBytes(),
                before == null || secs <= 0 ? "" : String.format(Locale.ROOT, " (%s%s/s)",
                        s.allocatedBytes() >= before.allocatedBytes() ? "+" : "-",
                        Size.human((long) (Math.abs(s.allocatedBytes() - before.allocatedBytes()) / secs))));
        Table t = new Table("ID", "SEGMENT", "STATE", "CAPACITY", "USED", "USED%", "OBJECTS", "HEARTBEAT").right(0, 3, 4, 5, 6, 7);
        for (PoolStats.SegmentStats seg : s.segments()) {
            t.row(seg.id(), seg.name(), seg.state(), Size.human(seg.capacityBytes()),
                    Size.human(seg.usedBytes()),
                    String.format(Locale.ROOT, "%.1f", seg.capacityBytes() == 0 ? 0.0 : 100.0 * seg.usedBytes() / seg.capacityBytes()),
                    seg.objects(), seg.heartbeatAgeMillis() + " ms ago");
        }
        if (s.segments().isEmpty()) {
            out.println("no segments registered");
        } else {
            out.print(t.render());
        }
        out.flush();
        return w.toString();
    }

    /** The masters registered in etcd: which one leads, at which term, and whether it serves yet. */
    private static void printElection(EtcdTarget target, PrintWriter out) throws Exception {
        try (EtcdGateway etcd = new EtcdGateway(target.endpoints(), Duration.ofSeconds(5))) {
            EtcdGateway.KeyValue leaderKv = etcd.range(target.leaderKey()).first();
            LeaderRecord leader = leaderKv == null ? null : LeaderRecord.parse(leaderKv.value());
            out.printf(Locale.ROOT, "election %s: %s%n", target, leader == null ? "no leader"
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
            out.print(t.render());
            out.println();
        }
    }
}
