package io.kvpool.web;

import com.sun.net.httpserver.HttpServer;
import io.prometheus.metrics.model.registry.PrometheusRegistry;

import java.time.Duration;
import java.time.InstantSource;
import java.util.function.DoubleSupplier;

/**
 * The status page with made-up numbers, for working on the page (its HTML, script and styles) and
 * taking screenshots without a pool:
 *
 * <pre>
 *   java -cp ... io.kvpool.web.DemoStatusMain [--port 8088] [--role master|node|engine] [--host 127.0.0.1]
 * </pre>
 * then open {@code http://127.0.0.1:8088/}. The numbers are smooth functions of the wall clock (no
 * randomness), so two screenshots a second apart look alike, and the history starts with ten minutes
 * already sampled so the charts are full at once. Counters grow, rates wander, the pool fills and
 * evicts; one segment drains, one node's disk tier is failing, and a segment name carries markup to
 * show that the page never renders data as HTML.
 */
public final class DemoStatusMain {

    private static final long GiB = 1L << 30;
    private static final long MiB = 1L << 20;

    private DemoStatusMain() {
    }

    public static void main(String[] args) throws Exception {
        int port = 8088;
        String role = "master";
        String host = "127.0.0.1";
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            if (i + 1 >= args.length) {
                throw new IllegalArgumentException("demo: " + a + " needs a value");
            }
            switch (a) {
                case "--port" -> port = Integer.parseInt(args[++i]);
                case "--role" -> role = args[++i];
                case "--host" -> host = args[++i];
                default -> throw new IllegalArgumentException("demo: unknown flag " + a
                        + " (known: --port N, --role master|node|engine, --host H)");
            }
        }
        HttpServer http = StatusPages.listen("demo", host, port);
        try (StatusPages pages = start(http, role, InstantSource.system())) {
            http.start();
            System.out.println("demo " + role + " status page at http://" + host + ":" + http.getAddress().getPort()
                    + "/ (Ctrl-C stops)");
            Thread.currentThread().join();
        }
    }

    /** Mounts a demo page for {@code role} at "/" on {@code http} (not started), with a filled history. */
    public static StatusPages start(HttpServer http, String role, InstantSource clock) {
        Demo d = switch (role) {
            case "master" -> new MasterDemo();
            case "node" -> new NodeDemo();
            case "engine" -> new EngineDemo();
            default -> throw new IllegalArgumentException("demo: --role must be master, node or engine, got " + role);
        };
        SimClock sim = new SimClock(clock);
        History h = d.history(sim);
        long now = clock.millis();
        for (long t = now - History.DEFAULT_CAPACITY * 1000L + 1000; t < now; t += 1000) {
            sim.at = t;
            h.sample(t);
        }
        sim.at = -1;
        return StatusPages.mount(http, "/", new PrometheusRegistry(), () -> d.view(clock.millis()), h, clock,
                Duration.ofSeconds(1));
    }

    /** The time the history's sources read: a fixed instant while the past is filled in, then the clock. */
    private static final class SimClock {
        private final InstantSource clock;
        volatile long at = -1;

        SimClock(InstantSource clock) {
            this.clock = clock;
        }

        double seconds() {
            return (at >= 0 ? at : clock.millis()) / 1000.0;
        }

        DoubleSupplier of(java.util.function.DoubleUnaryOperator f) {
            return () -> f.applyAsDouble(seconds());
        }
    }

    private interface Demo {
        StatusView view(long nowMillis);

        History history(SimClock sim);
    }

    /** A slow wave between lo and hi with the given period in seconds. */
    private static double wave(double t, double lo, double hi, double period, double phase) {
        return lo + (hi - lo) * (0.5 + 0.5 * Math.sin(2 * Math.PI * t / period + phase));
    }

    /** The integral of {@link #wave} from 0 to t: a counter whose rate is that wave. */
    private static double counter(double t, double lo, double hi, double period, double phase) {
        double mid = (lo + hi) / 2;
        double amp = (hi - lo) / 2;
        double w = 2 * Math.PI / period;
        return mid * t - amp / w * (Math.cos(w * t + phase) - Math.cos(phase));
    }

    private static final class MasterDemo implements Demo {
        private static final String[] SEGMENTS = {"10.0.0.11:50052", "10.0.0.12:50052", "10.0.0.13:50052",
            "10.0.0.14:50052", "<b>node-e</b>:50052"};
        private static final long SEGMENT = 64 * GiB;
        private static final long DISK = 400 * GiB;

        private double used(double t, int i) {
            return SEGMENT * wave(t, 0.78, 0.97, 240 + 37 * i, i);
        }

        private double disk(double t, int i) {
            return i == 4 ? 0 : DISK * wave(t, 0.3, 0.55, 900 + 51 * i, i * 2);
        }

        private double usedTotal(double t) {
            double s = 0;
            for (int i = 0; i < SEGMENTS.length; i++) {
                s += used(t, i);
            }
            return s;
        }

        private double diskTotal(double t) {
            double s = 0;
            for (int i = 0; i < SEGMENTS.length; i++) {
                s += disk(t, i);
            }
            return s;
        }

        private static double gets(double t) {
            return counter(t, 6_000, 14_000, 180, 0);
        }

        private static double puts(double t) {
            return counter(t, 2_500, 4_800, 150, 1);
        }

        private static double hits(double t) {
            return counter(t, 5_200, 11_500, 180, 0.2);
        }

        @Override
        public StatusView view(long now) {
            double t = now / 1000.0;
            double g = wave(t, 6_000, 14_000, 180, 0);
            double hit = wave(t, 5_200, 11_500, 180, 0.2) / g;
            StatusView v = new StatusView("master", "kvpool master", now)
                    .subtitle("127.0.0.1:50051 · leader, term 3 · up 2 h 14 min · demo data");
            long objects = (long) (usedTotal(t) / (2 * MiB));
            v.card("objects", "Objects", objects, Unit.COUNT,
                    String.format("in memory; %,d more on SSD", (long) (diskTotal(t) / (2 * MiB))));
            v.card("segments", "Segments", SEGMENTS.length, Unit.COUNT, "4 active, 1 draining");
            v.card("capacity", "Capacity", SEGMENTS.length * SEGMENT, Unit.BYTES, "memory tier");
            v.card("used", "Used", usedTotal(t), Unit.BYTES, "of the memory tier");
            v.card("fill", "Memory full", usedTotal(t) / (SEGMENTS.length * SEGMENT), Unit.RATIO);
            v.card("disk_used", "SSD used", diskTotal(t), Unit.BYTES, "of " + 4 * DISK / GiB + " GiB");
            v.card("gets_per_s", "Gets", g, Unit.PER_SECOND);
            v.card("puts_per_s", "Puts", wave(t, 2_500, 4_800, 150, 1), Unit.PER_SECOND);
            v.card("hit_rate", "Hit rate", hit, Unit.RATIO, "last 10 s");
            v.card("evictions_per_s", "Evictions", wave(t, 20, 900, 240, 2), Unit.PER_SECOND);
            v.card("epoch", "Epoch", 7, Unit.COUNT, "emptied 09:41:07");
            v.card("clients", "Clients", 12, Unit.COUNT);
            StatusView.Table s = v.table("segments", "Segments")
                    .column("name", "Segment", Unit.TEXT).column("state", "State", Unit.TEXT)
                    .column("capacity", "Capacity", Unit.BYTES).column("used", "Used", Unit.BYTES)
                    .column("fill", "Full", Unit.RATIO).column("objects", "Objects", Unit.COUNT)
                    .column("disk_used", "SSD used", Unit.BYTES).column("disk_errors", "SSD write errors", Unit.COUNT)
                    .column("heartbeat", "Last heartbeat", Unit.TIME);
            for (int i = 0; i < SEGMENTS.length; i++) {
                double u = used(t, i);
                s.row(SEGMENTS[i], i == 3 ? "DRAINING" : "ACTIVE", SEGMENT, u, u / SEGMENT, (long) (u / (2 * MiB)),
                        i == 4 ? Double.NaN : disk(t, i), i == 2 ? 14L : 0L, now - 300 - 170L * i);
            }
            v.table("resets", "Recent resets").column("time", "When", Unit.TIME).column("what", "What", Unit.TEXT)
                    .column("objects", "Objects dropped", Unit.COUNT)
                    .row(now - 3_400_000, "remove_all (RL weight update, epoch 6 → 7)", 183_204L)
                    .row(now - 7_950_000, "segment 10.0.0.15:50052 lost (heartbeats stopped)", 31_870L);
            v.link("node 10.0.0.11", "http://10.0.0.11:8081/").link("metrics", "/metrics");
            return v;
        }

        @Override
        public History history(SimClock sim) {
            return History.builder()
                    .chart("ops", "Operations", Unit.PER_SECOND)
                    .rate("gets", "gets", sim.of(MasterDemo::gets))
                    .rate("puts", "puts", sim.of(MasterDemo::puts))
                    .rate("misses", "misses", sim.of(t -> gets(t) - hits(t)))
                    .chart("use", "Pool use", Unit.BYTES)
                    .gauge("memory", "memory", sim.of(this::usedTotal))
                    .gauge("ssd", "SSD", sim.of(this::diskTotal))
                    .chart("hit_rate", "Hit rate", Unit.RATIO)
                    .gauge("hit_rate", "hits / gets", sim.of(t -> wave(t, 5_200, 11_500, 180, 0.2)
                            / wave(t, 6_000, 14_000, 180, 0)))
                    .chart("evictions", "Evictions and spills", Unit.PER_SECOND)
                    .rate("evicted", "evicted", sim.of(t -> counter(t, 20, 900, 240, 2)))
                    .rate("spilled", "spilled to SSD", sim.of(t -> counter(t, 10, 700, 240, 2.3)))
                    // a gap: the spill counter of a node that was away for a while
                    .rate("disk_errors", "SSD write errors", sim.of(t -> ((long) t / 60) % 5 == 0 ? Double.NaN
                            : counter(t, 0, 8, 60, 0)))
                    .build();
        }
    }

    private static final class NodeDemo implements Demo {
        private static final long SEGMENT = 64 * GiB;

        @Override
        public StatusView view(long now) {
            double t = now / 1000.0;
            double used = SEGMENT * wave(t, 0.8, 0.96, 240, 0);
            StatusView v = new StatusView("node", "kvpool node 10.0.0.11:50052", now)
                    .subtitle("master 10.0.0.1:50051 · segment ACTIVE · demo data");
            v.card("segment_used", "Memory used", used, Unit.BYTES, "of 64 GiB");
            v.card("segment_fill", "Memory full", used / SEGMENT, Unit.RATIO);
            v.card("objects", "Objects", (long) (used / (2 * MiB)), Unit.COUNT);
            v.card("disk_used", "SSD used", 173.4 * GiB, Unit.BYTES, "of 400 GiB");
            v.card("disk_queue", "Disk queue", (long) wave(t, 0, 40, 30, 0), Unit.COUNT, "writes waiting");
            v.card("reads_per_s", "Reads", wave(t, 900 * MiB, 2.4 * GiB, 90, 0), Unit.BYTES_PER_SECOND);
            v.card("read_latency", "Disk read p99", wave(t, 0.0004, 0.003, 45, 0), Unit.SECONDS);
            v.card("state", "State", "ACTIVE", null);
            v.table("tiers", "Tiers").column("tier", "Tier", Unit.TEXT).column("capacity", "Capacity", Unit.BYTES)
                    .column("used", "Used", Unit.BYTES).column("fill", "Full", Unit.RATIO)
                    .row("memory", SEGMENT, used, used / SEGMENT).row("ssd", 400 * GiB, 173.4 * GiB, 173.4 / 400);
            v.link("master", "http://10.0.0.1:8080/");
            return v;
        }

        @Override
        public History history(SimClock sim) {
            return History.builder()
                    .chart("io", "Bytes moved", Unit.BYTES_PER_SECOND)
                    .rate("read", "read", sim.of(t -> counter(t, 900 * MiB, 2.4 * GiB, 90, 0)))
                    .rate("written", "written", sim.of(t -> counter(t, 300 * MiB, 1.1 * GiB, 70, 1)))
                    .chart("queue", "Disk queue", Unit.COUNT)
                    .gauge("queue", "writes waiting", sim.of(t -> Math.floor(wave(t, 0, 40, 30, 0))))
                    .build();
        }
    }

    private static final class EngineDemo implements Demo {
        @Override
        public StatusView view(long now) {
            double t = now / 1000.0;
            StatusView v = new StatusView("engine", "kvpool reference engine", now)
                    .subtitle("model tiny-llama · pool 10.0.0.1:50051 · demo data");
            v.card("ttft_p50", "TTFT p50", wave(t, 0.04, 0.09, 60, 0), Unit.SECONDS);
            v.card("ttft_p99", "TTFT p99", wave(t, 0.2, 0.6, 60, 1), Unit.SECONDS);
            v.card("prefix_hit", "Prefix cache hits", wave(t, 0.3, 0.5, 120, 0), Unit.RATIO, "local GPU cache");
            v.card("pool_hit", "Pool hits", wave(t, 0.4, 0.7, 120, 1), Unit.RATIO, "blocks loaded from the pool");
            v.card("loads_per_s", "Loads", wave(t, 200, 600, 50, 0), Unit.PER_SECOND);
            v.card("saves_per_s", "Saves", wave(t, 100, 300, 50, 2), Unit.PER_SECOND);
            v.card("save_drops", "Save drops", 0, Unit.COUNT);
            return v;
        }

        @Override
        public History history(SimClock sim) {
            return History.builder()
                    .chart("ttft", "Time to first token", Unit.SECONDS)
                    .gauge("p50", "p50", sim.of(t -> wave(t, 0.04, 0.09, 60, 0)))
                    .gauge("p99", "p99", sim.of(t -> wave(t, 0.2, 0.6, 60, 1)))
                    .build();
        }
    }
}
