package io.kvpool.cli;

import io.kvpool.bench.soak.Soak;
import io.kvpool.bench.soak.SoakConfig;
import io.kvpool.bench.soak.SoakReport;
import io.kvpool.config.Size;
import io.kvpool.etcd.MasterAddress;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

import java.nio.file.Path;
import java.time.Duration;
import java.time.LocalDateTime;
import java.time.format.DateTimeFormatter;
import java.util.concurrent.Callable;

/**
 * {@code kvpool soak}: verified traffic while nodes are killed, the leading master fails over and
 * nodes are partitioned; exits 1 when a read was wrong or an acknowledged object was lost (see
 * {@link Soak} and docs/soak.md).
 */
@Command(name = "soak", mixinStandardHelpOptions = true, sortOptions = false,
        description = {"Run verified traffic (every byte of every read checked, removals racing puts) while nodes are",
                "killed and restarted, the leading master is killed, and nodes are partitioned; report counts.",
                "By default starts its own pool: etcd (scripts/etcd.sh), 2 elected masters, 3 nodes, 2 copies per put,",
                "all stopped by PID at the end. Exit code 1 when a read was wrong, an acknowledged object was lost,",
                "or the run was inconclusive (see docs/soak.md)."})
final class SoakCommand implements Callable<Integer> {

    @Option(names = "--duration", paramLabel = "DURATION", description = "How long traffic runs (default: ${DEFAULT-VALUE}).")
    Duration duration = Duration.ofMinutes(5);

    @Option(names = "--clients", description = "Client threads, each with its own connection (default: ${DEFAULT-VALUE}).")
    int clients = 8;

    @Option(names = "--keys", description = "Keys in the working set, a multiple of 16 (default: ${DEFAULT-VALUE}).")
    int keys = 2048;

    @Option(names = "--min-value", paramLabel = "SIZE", description = "Smallest value (default: ${DEFAULT-VALUE}).")
    Size minValue = Size.ofKiB(1);

    @Option(names = "--max-value", paramLabel = "SIZE", description = "Largest value (default: ${DEFAULT-VALUE}).")
    Size maxValue = Size.ofKiB(64);

    @Option(names = "--seed", description = "Seed of every random choice (default: random, printed).")
    Long seed;

    @Option(names = "--node-kill-every", paramLabel = "DURATION",
            description = "Mean time between node kills; 0s: none (default: ${DEFAULT-VALUE}).")
    Duration nodeKillEvery = Duration.ofSeconds(60);

    @Option(names = "--node-down", paramLabel = "DURATION",
            description = "How long a killed node stays down (default: ${DEFAULT-VALUE}).")
    Duration nodeDown = Duration.ofSeconds(5);

    @Option(names = "--restart-empty", description = "Restart killed nodes empty (--no-adopt-segment); by default"
            + " they adopt the segment their previous run left.")
    boolean restartEmpty;

    @Option(names = "--failover-every", paramLabel = "DURATION",
            description = "Mean time between kills of the leading master; 0s: none (default: ${DEFAULT-VALUE}).")
    Duration failoverEvery = Duration.ofSeconds(90);

    @Option(names = "--partition-every", paramLabel = "DURATION",
            description = "Mean time between partitions of a node; 0s: none (default: ${DEFAULT-VALUE}).")
    Duration partitionEvery = Duration.ofSeconds(45);

    @Option(names = "--partition-length", paramLabel = "DURATION",
            description = "How long a partition lasts (default: ${DEFAULT-VALUE}).")
    Duration partitionLength = Duration.ofSeconds(5);

    @Option(names = "--repair-deadline", paramLabel = "DURATION",
            description = "Longest wait for the copies a lost node held to be remade (default: ${DEFAULT-VALUE}).")
    Duration repairDeadline = Duration.ofSeconds(60);

    @Option(names = "--progress-every", paramLabel = "DURATION",
            description = "Period of the progress line (default: ${DEFAULT-VALUE}).")
    Duration progressEvery = Duration.ofSeconds(10);

    @Option(names = "--segment-size", paramLabel = "SIZE", description = "Memory of each node started (default: ${DEFAULT-VALUE}).")
    Size segmentSize = Size.ofMiB(256);

    @Option(names = "--replicas", description = "Copies each put asks for (default: ${DEFAULT-VALUE}).")
    int replicas = 2;

    @Option(names = "--node-ttl", paramLabel = "DURATION",
            description = "The started masters' --node-ttl (default: ${DEFAULT-VALUE}).")
    Duration nodeTtl = Duration.ofSeconds(3);

    @Option(names = "--request-timeout", paramLabel = "DURATION",
            description = "The clients' request timeout (default: ${DEFAULT-VALUE}).")
    Duration requestTimeout = Duration.ofSeconds(5);

    @Option(names = "--log-dir", paramLabel = "DIR",
            description = "Where the started processes' logs go (default: soak-logs/<date-time>).")
    Path logDir;

    @Option(names = "--report-json", paramLabel = "FILE", description = "Also write the final report as JSON here.")
    Path reportJson;

    @Option(names = "--master", paramLabel = "HOST:PORT|etcd://HOST:PORT,...[/CLUSTER]",
            description = "Soak this running pool instead of starting one: traffic, races and the final pass, no chaos.")
    MasterAddress master;

    /** Nodes of the pool the soak starts. */
    private static final int NODES = 3;

    /** The most keys of the working set. */
    static final int MAX_KEYS = 1 << 20;

    @Override
    public Integer call() throws Exception {
        long s = seed != null ? seed : new java.util.SplittableRandom().nextLong();
        Path logs = logDir != null ? logDir : Path.of("soak-logs",
                LocalDateTime.now().format(DateTimeFormatter.ofPattern("yyyyMMdd-HHmmss")));
        boolean local = master == null;
        // the rest of the values SoakConfig checks; these are against this machine
        Bounds.range("--keys", keys, 16, MAX_KEYS, "the soak keeps each key's state");
        if (local) {
            Bounds.sizeAtLeast("--segment-size", segmentSize, 1 << 20);
            Bounds.fitsMemory("--segment-size " + segmentSize + " for each of the " + NODES + " nodes started",
                    Bounds.times(NODES, segmentSize.bytes()));
        }
        SoakConfig config = new SoakConfig(duration, clients, keys, minValue, maxValue, s,
                local ? nodeKillEvery : Duration.ZERO, local ? failoverEvery : Duration.ZERO,
                local ? partitionEvery : Duration.ZERO, partitionLength, nodeDown, restartEmpty, repairDeadline, progressEvery,
                segmentSize, NODES, 2, replicas, nodeTtl, requestTimeout, "384m", logs, master, System.out);
        // installed before etcd and the pool start: a SIGTERM at any point stops every child by PID
        try (OnExit exit = OnExit.start("soak", null)) {
            LocalEtcd etcd = local ? exit.add(LocalEtcd.start(logs.resolve("etcd"))) : null;
            Soak soak = new Soak(config, etcd == null ? null : etcd.url("soak"), Main.class.getName());
            exit.add(soak::stopProcesses);
            SoakReport report = soak.run();
            if (reportJson != null) {
                report.writeJson(reportJson);
            }
            return report.exitCode();
        }
    }
}
