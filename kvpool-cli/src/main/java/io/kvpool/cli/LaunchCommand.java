package io.kvpool.cli;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.config.Durations;
import io.kvpool.config.Ports;
import io.kvpool.connector.config.OffloadConfig;
import io.kvpool.connector.config.OffloadConfigs;
import io.kvpool.etcd.EtcdTarget;
import io.kvpool.master.Tenant;
import io.kvpool.protocol.Secrets;
import io.kvpool.protocol.Tls;
import picocli.CommandLine.ArgGroup;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Set;
import java.util.concurrent.Callable;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * {@code kvpool launch}: brings up one pool: the master on the head (first) host, a node on every
 * host (the head too), all contributing to one shared pool; writes the client config file engines
 * read through {@code KVPOOL_CONFIG_PATH}; supervises until stopped.
 *
 * <h2>Supervision</h2>
 * <ul>
 *   <li>Ready means every node registered with the master (checked through the master, not by
 *       process liveness); the launcher then prints {@code ready} and the export line.</li>
 *   <li>While starting, any process that exits, or nodes that do not register in time, make the
 *       launcher stop everything it started and exit 1, naming the process and its log.</li>
 *   <li>Once ready, a node that exits is reported (named, with its log) and the pool goes on
 *       without it, as a pool must; the master exiting stops everything (exit 1).</li>
 *   <li>On SIGTERM / Ctrl-C (and on any failure) it stops its processes, newest first: SIGTERM,
 *       then SIGKILL after 10 s, descendants included: no orphans.</li>
 *   <li>With {@code --run}, the command runs with {@code KVPOOL_CONFIG_PATH} set, and
 *       {@code KVPOOL_MASTER_PID} and {@code KVPOOL_NODE_PIDS} (comma-separated, in host order) for
 *       operators' scripts and fault drills: the pids of the processes this launcher started (for a
 *       host reached through ssh, the local ssh process); when it exits, the pool is stopped and
 *       its exit code returned.</li>
 *   <li>With {@code --restart-exited}, once ready, a master or node that exits is started again with
 *       the same arguments, as a supervisor (systemd, Kubernetes) would: a node on its address, so
 *       that it adopts the segment file its previous run left; a master with its id and ports, as a
 *       standby while another leads. A process that exits again within {@link #CRASH_LOOP} of being
 *       started again is not restarted a second time (reported lost, as without the flag).</li>
 *   <li>{@code LOG_DIR/pids} lists the process of each role ({@code NAME PID} per line), rewritten
 *       at every start: the pids of the current processes, after restarts too.</li>
 * </ul>
 *
 * <h2>Hosts</h2>
 * {@code --hosts FILE}: one host per line, {@code ADDRESS [local | netns:NAME | ssh[:USER@HOST]]};
 * {@code #} starts a comment; the first is the head. {@code local} runs the process here,
 * {@code netns:NAME} in that network namespace of this machine ({@code ip netns exec}), {@code ssh}
 * on the host over ssh (the same checkout path must exist there). {@code --local N} is N local
 * nodes on 127.0.0.1.
 *
 * <h2>Several masters</h2>
 * {@code --masters N} (N > 1) runs N masters elected through etcd: on the first N hosts (on one host,
 * on consecutive ports from {@code --master-port}), with etcd given by {@code --etcd}, or else one the
 * launcher starts on this machine ({@link LocalEtcd}) and stops at the end. Nodes and the client
 * config then name {@code etcd://...} instead of a master. Once ready, a master that exits is
 * reported and the pool goes on while one is left; the last one exiting stops everything.
 */
@Command(name = "launch", mixinStandardHelpOptions = true,
        description = "Start a master and one node per host (or N local nodes), write the client config, supervise.")
final class LaunchCommand implements Callable<Integer> {

    static final class Where {
        @Option(names = "--hosts", paramLabel = "FILE", description = "Hosts file: ADDRESS [local|netns:NAME|ssh] per line; the first is the head.")
        Path hostsFile;

        @Option(names = "--local", paramLabel = "N", description = "N nodes on this machine, on 127.0.0.1.")
        Integer local;
    }

    @ArgGroup(exclusive = true, multiplicity = "1")
    Where where;

    @Option(names = "--config", paramLabel = "FILE",
            description = "Offload config (YAML or JSON) of type pool: cpu per node, optional disk tier. Optional with"
                    + " --local: without it each node gets the defaults (" + DEFAULT_CONFIG_SUMMARY + ").")
    Path configFile;

    /** The pool {@code launch --local N} starts without a {@code --config}: what examples/pool.yaml says. */
    static final String DEFAULT_CONFIG = "type: pool\ncpu: 1GiB\npromote_after: 2\nreset: all\n";
    static final String DEFAULT_CONFIG_SUMMARY = "1GiB of memory each, no disk tier, reset: all";

    @Option(names = "--out", paramLabel = "FILE",
            description = "Where to write the client config (default: ${DEFAULT-VALUE}).")
    Path out = Path.of("kvpool-client.json");

    @Option(names = "--log-dir", paramLabel = "DIR", description = "Logs of the processes started (default: ${DEFAULT-VALUE}).")
    Path logDir = Path.of("kvpool-logs");
    /** The offload config's tenants as the masters read them (LOG_DIR/tenants.json), or null. */
    private Path tenantsFile;
    /** The offload config's KV event flags for every master. */
    private List<String> eventFlags = List.of();

    @Option(names = "--master-port", paramLabel = "PORT", description = "Master RPC port (default: ${DEFAULT-VALUE}; 0 picks one).")
    int masterPort = 50051;

    @Option(names = "--node-ttl", paramLabel = "DURATION",
            description = "The master's --node-ttl: a node silent this long is dropped (default: the master's, 10s).")
    Duration nodeTtl;

    @Option(names = "--masters", paramLabel = "N",
            description = "Masters to run, elected through etcd; more than 1 gives standbys (default: ${DEFAULT-VALUE}).")
    int masters = 1;

    @Option(names = "--hot-standby",
            description = "With --masters > 1: standbys keep a copy of the leader's metadata and take over serving from"
                    + " it at once (the master's --hot-standby); without it a new leader rebuilds from the nodes.")
    boolean hotStandby;

    @Option(names = "--etcd", paramLabel = "etcd://HOST:PORT[,...][/CLUSTER]",
            description = "The etcd that elects the masters (with --masters > 1); default: start one on this machine.")
    String etcd;

    @Option(names = "--ready-timeout", paramLabel = "DURATION", description = "How long nodes may take to register (default: 60s).")
    Duration readyTimeout = Duration.ofSeconds(60);

    @Option(names = "--restart-exited",
            description = "Once ready, start a master or node that exits again with the same arguments (a node on its"
                    + " address, adopting its segment file; a master as a standby), as a supervisor would.")
    boolean restartExited;

    @Option(names = "--run", arity = "1..*", paramLabel = "CMD",
            description = "Run this command once the pool is ready, with KVPOOL_CONFIG_PATH, KVPOOL_MASTER_PID and"
                    + " KVPOOL_NODE_PIDS set; stop the pool when it exits.")
    List<String> run;

    /** The line a node prints first: its name, {@code HOST:PORT}. */
    static final Pattern NODE_LINE = Pattern.compile("kvpool node (\\S+):(\\d+): \\S+ \\S+ segment");
    /** In the log directory: this launcher's pid, once the pool is ready (for {@code kvpool rolling-restart}). */
    static final String PID_FILE = "launch.pid";
    /** In the log directory: {@code NAME PID} of each role's current process, rewritten at every start. */
    static final String PIDS_FILE = "pids";
    /** A process that exits this soon after being started again is not restarted again (--restart-exited). */
    static final Duration CRASH_LOOP = Duration.ofSeconds(10);

    /** Where nodes and clients find the master: {@code HOST:PORT}, or {@code etcd://...}. */
    private String masterAddress;

    /** One line of the hosts file. */
    record Host(String address, String via) {
    }

    /**
     * Every process started, in start order. Copy-on-write: the shutdown hook's {@link #stopAll} and
     * the supervising thread read and change it at the same time (a SIGTERM while starting).
     */
    private final List<Supervised> started = new java.util.concurrent.CopyOnWriteArrayList<>();
    /** The masters started (a prefix of {@link #started}); copy-on-write as it is. */
    private final List<Supervised> masterProcesses = new java.util.concurrent.CopyOnWriteArrayList<>();
    private LocalEtcd localEtcd;
    private final PrintStream say = System.out;
    /** Set by {@link #stopAll}: nothing is restarted after it. */
    @com.google.errorprone.annotations.concurrent.GuardedBy("this")
    private boolean stopping;

    /** A process this launcher runs: its role's name, where and with what arguments (a restart reuses them). */
    static final class Supervised {
        private final String name;
        private final Host host;
        private final List<String> args;
        private final Path log;
        private volatile Process process;
        /** When {@link #process} was started ({@link System#nanoTime}). */
        private volatile long startedAt = System.nanoTime();
        /** Whether {@link #process} was started again by --restart-exited (not the first start, not a rolling restart). */
        private volatile boolean respawned;

        Supervised(String name, Host host, List<String> args, Path log, Process process) {
            this.name = name;
            this.host = host;
            this.args = args;
            this.log = log;
            this.process = process;
        }

        String name() {
            return name;
        }

        Host host() {
            return host;
        }

        List<String> args() {
            return args;
        }

        Path log() {
            return log;
        }

        Process process() {
            return process;
        }

        /** Fixes {@code flag}'s value for later starts (a port picked by the process on its first start). */
        void pin(String flag, String value) {
            int i = args.indexOf(flag);
            if (i >= 0 && i + 1 < args.size()) {
                args.set(i + 1, value);
            }
        }
    }

    @Override
    public Integer call() throws Exception {
        OffloadConfigs.Loaded loaded;
        if (configFile != null) {
            loaded = OffloadConfigs.load(configFile);
            loaded.warnings().forEach(w -> say.println("warning: " + configFile + ": " + w));
        } else if (where.local != null) {
            loaded = OffloadConfigs.parse(DEFAULT_CONFIG, true);
            say.println("no --config: starting " + where.local + " local node(s) with the defaults ("
                    + DEFAULT_CONFIG_SUMMARY + "); give --config FILE to choose (examples/pool.yaml)");
        } else {
            throw new IllegalArgumentException("--config FILE is required with --hosts (an offload config of type pool;"
                    + " see examples/pool.yaml); only --local N has defaults");
        }
        if (!(loaded.config() instanceof OffloadConfig.Pool pool)) {
            throw new IllegalArgumentException(configFile + ": offload.type: kvpool launch starts a pool; type native"
                    + " runs inside the engine and needs no launcher");
        }
        if (nodeTtl != null) {
            Durations.requirePositive("--node-ttl", nodeTtl);
        }
        Durations.requirePositive("--ready-timeout", readyTimeout);
        Bounds.port("--master-port", masterPort, false);
        List<Host> hosts = hosts();
        long here = hosts.stream().filter(h -> h.via().equals("local")).count();
        Bounds.fitsMemory(here + " node(s) on this machine with " + pool.cpu() + " each (cpu in "
                + (configFile == null ? "the default config" : configFile) + ")", Bounds.times(here, pool.cpu().bytes()));
        // every role inherits KVPOOL_TLS_*: check the files once, here, so a bad one is named before anything starts
        Tls tls = Tls.fromEnvironment();
        if (tls.enabled()) {
            say.println("TLS: every master, node and client started here uses " + tls);
        }
        for (Host h : hosts) {
            // every role started here inherits this environment: a pool on a shared network needs its secrets
            if (!ExposureOptions.loopback(h.address()) && !Secrets.fromEnvironment().present()) {
                throw new IllegalArgumentException(ExposureOptions.refusal(h.address(), "kvpool launch"
                        + " KVPOOL_SECRET_FILE and KVPOOL_ADMIN_SECRET_FILE in its environment (every master, node and"
                        + " client needs the same files"));
            }
        }
        if (masters < 1 || masters > 9) {
            throw new IllegalArgumentException("--masters: 1 to 9, got " + masters);
        }
        if (etcd != null && masters == 1) {
            throw new IllegalArgumentException("--etcd elects masters: give --masters 2 or more with it");
        }
        if (hotStandby && masters == 1) {
            throw new IllegalArgumentException("--hot-standby needs a standby: give --masters 2 or more with it");
        }
        Files.createDirectories(logDir);
        eventFlags = pool.eventFlags();
        if (pool.tenantsJson() != null) { // checked here, named by the config's file; every master reads it
            tenantsFile = logDir.resolve("tenants.json").toAbsolutePath();
            Files.writeString(tenantsFile, Tenant.toJson(checkedTenants(pool.tenantsJson())));
        }
        Runtime.getRuntime().addShutdownHook(new Thread(this::stopAll, "kvpool-launch-shutdown"));
        try {
            Host head = hosts.getFirst();
            String masterAddress;
            String metrics;
            String page = null;
            if (masters == 1) {
                List<String> masterArgs = masterArgs(head, masterPort, "0");
                Supervised master = start("master", head, masterArgs);
                masterProcesses.add(master);
                String line = awaitLine(master, Pattern.compile("kvpool master listening on \\S+:(\\d+), metrics on port (\\d+)"),
                        Duration.ofSeconds(60));
                Matcher mm = Pattern.compile("listening on \\S+:(\\d+), metrics on port (\\d+)").matcher(line);
                mm.find();
                master.pin("--port", mm.group(1)); // a restart comes back where clients and nodes look
                master.pin("--http-port", mm.group(2));
                masterAddress = head.address() + ":" + mm.group(1);
                metrics = "http://" + head.address() + ":" + mm.group(2) + "/metrics";
                page = "http://" + head.address() + ":" + mm.group(2) + "/";
            } else {
                masterAddress = startElectedMasters(hosts);
                metrics = "each master's http port";
            }
            for (int i = 0; i < hosts.size(); i++) {
                Host h = hosts.get(i);
                List<String> args = new ArrayList<>(List.of("node", "--master", masterAddress, "--host", h.address(),
                        "--advertise-host", h.address(), "--port", "0", "--segment-size", pool.cpu().toString(),
                        "--promote-after", Integer.toString(pool.promoteAfter())));
                if (LaunchHosts.sameHostBefore(hosts, i) || LaunchHosts.hostRepeats(hosts, i)) {
                    // nodes sharing an address: each status page on a port of its own (the usual one is taken
                    // by one of them, or by anything else: a node on its default moves by itself)
                    args.addAll(List.of("--http-port", "0"));
                }
                if (pool.disk() != null) {
                    args.addAll(List.of("--disk-dir", pool.disk().path().resolve("node-" + i).toString(), "--disk-size",
                            pool.disk().size().toString()));
                }
                if (pool.shmGroup() != null) {
                    args.addAll(List.of("--shm-group", pool.shmGroup()));
                }
                start("node-" + i, h, args);
            }
            awaitRegistered(masterAddress, hosts.size());
            for (Supervised n : nodes()) {
                // a restarted node comes back on its address, the identity under which it adopts its segment file
                String line = awaitLine(n, NODE_LINE, Duration.ofSeconds(10));
                Matcher nm = NODE_LINE.matcher(line);
                nm.find();
                n.pin("--port", nm.group(2));
            }
            // ready means usable: a put went through the pool's address (registered nodes alone were not enough)
            ReadyCheck.awaitPut(ClientConfig.forMaster(masterAddress), readyTimeout);
            this.masterAddress = masterAddress;
            Files.writeString(logDir.resolve(PID_FILE), ProcessHandle.current().pid() + "\n");
            Path config = writeClientConfig(pool.withMaster(masterAddress));
            say.printf(Locale.ROOT, "ready: master %s (metrics %s), %d nodes of %s%s%n", masterAddress,
                    metrics, hosts.size(), pool.cpu(), pool.disk() == null ? "" : " + " + pool.disk().size() + " disk");
            if (page != null) {
                say.println("status page: " + page + " (each node's address is in its log, " + logDir + "/node-*.log)");
            }
            say.println("export KVPOOL_CONFIG_PATH=" + config);
            say.flush();
            return supervise(config);
        } catch (LaunchFailure e) {
            say.println("FAILED: " + e.getMessage());
            say.flush();
            stopAll();
            return 1;
        }
    }

    private List<String> masterArgs(Host h, int port, String httpPort) {
        List<String> args = new ArrayList<>(List.of("master", "--host", h.via().equals("local")
                && h.address().equals("127.0.0.1") ? "127.0.0.1" : "0.0.0.0", "--port", Integer.toString(port),
                "--http-port", httpPort));
        if (nodeTtl != null) {
            args.addAll(List.of("--node-ttl", Durations.format(nodeTtl)));
        }
        if (tenantsFile != null) {
            args.addAll(List.of("--tenants-file", tenantsFile.toString()));
        }
        args.addAll(eventFlags); // the config's events: the master checks them and names a bad flag
        return args;
    }

    private List<Tenant> checkedTenants(String json) {
        try {
            return Tenant.fromJson(json);
        } catch (IllegalArgumentException e) {
            throw new IllegalArgumentException((configFile == null ? "config" : configFile) + ": offload." + e.getMessage(), e);
        }
    }

    /**
     * Starts etcd if none was given, then the masters on the first hosts (consecutive ports on one
     * host); returns the etcd:// address nodes and clients use.
     */
    private String startElectedMasters(List<Host> hosts) throws Exception {
        String url = etcd;
        if (url == null) {
            localEtcd = LocalEtcd.start(logDir.resolve("etcd").toAbsolutePath());
            url = localEtcd.url("kvpool");
            say.println("started etcd " + url + " (data and log in " + logDir.resolve("etcd").toAbsolutePath() + ")");
        }
        EtcdTarget.parse(url); // names a malformed --etcd before anything else starts
        for (int i = 0; i < masters; i++) {
            Host h = hosts.get(Math.min(i, hosts.size() - 1));
            int port = masterPort == 0 ? 0 : masterPort + (i < hosts.size() && !LaunchHosts.sameHostBefore(hosts, i) ? 0 : i);
            if (port == 0) {
                port = freePort();
            }
            List<String> args = masterArgs(h, port, Integer.toString(freePort()));
            args.addAll(List.of("--etcd", url, "--id", "m" + (i + 1), "--advertise-host", h.address()));
            if (hotStandby) {
                args.add("--hot-standby");
            }
            Supervised m = start("master-" + (i + 1), h, args);
            masterProcesses.add(m);
            awaitLine(m, Pattern.compile("kvpool master m" + (i + 1) + " standing for election"), Duration.ofSeconds(60));
        }
        return url;
    }

    private static int freePort() throws IOException {
        return Ports.reservable(); // below the ephemeral range: no client connection takes it meanwhile
    }

    private List<Host> hosts() throws IOException {
        return where.local != null ? LaunchHosts.local(where.local) : LaunchHosts.read(where.hostsFile);
    }

    /** The command line of this same kvpool, for a role, run where the host says. */
    private List<String> command(Host h, List<String> args) {
        List<String> cmd = new ArrayList<>();
        if (h.via().startsWith("netns:")) {
            cmd.addAll(List.of("ip", "netns", "exec", h.via().substring("netns:".length())));
        } else if (h.via().startsWith("ssh")) {
            cmd.addAll(List.of("ssh", "-o", "BatchMode=yes", h.via().length() > 4 ? h.via().substring(4) : h.address()));
        }
        cmd.add(ProcessHandle.current().info().command().orElse("java"));
        cmd.addAll(List.of("--enable-native-access=ALL-UNNAMED", "-Xmx1g", "-cp", System.getProperty("java.class.path"),
                Main.class.getName()));
        cmd.addAll(args);
        return cmd;
    }

    private Supervised start(String name, Host h, List<String> args) throws IOException {
        Path log = logDir.resolve(name + ".log").toAbsolutePath();
        Process p = new ProcessBuilder(command(h, args)).redirectErrorStream(true)
                .redirectOutput(ProcessBuilder.Redirect.to(log.toFile())).start();
        Supervised s = new Supervised(name, h, new ArrayList<>(args), log, p);
        started.add(s);
        say.printf("started %s on %s (pid %d), log %s%n", name, h.address(), p.pid(), log);
        writePids();
        return s;
    }

    /** Starts {@code s}'s role again with the same arguments, its output appended to the same log. */
    void restart(Supervised s) throws IOException {
        s.process = new ProcessBuilder(command(s.host(), s.args())).redirectErrorStream(true)
                .redirectOutput(ProcessBuilder.Redirect.appendTo(s.log().toFile())).start();
        s.startedAt = System.nanoTime();
        s.respawned = false;
        say.printf("started %s on %s again (pid %d), log %s%n", s.name(), s.host().address(), s.process.pid(), s.log());
        say.flush();
        writePids();
    }

    /** Rewrites {@code LOG_DIR/pids}: each role's current process. Best effort: a drill reading it finds it stale. */
    private void writePids() {
        StringBuilder b = new StringBuilder();
        for (Supervised s : started) {
            b.append(s.name()).append(' ').append(s.process().pid()).append('\n');
        }
        try {
            Path tmp = logDir.resolve(PIDS_FILE + ".tmp");
            Files.writeString(tmp, b.toString());
            Files.move(tmp, logDir.resolve(PIDS_FILE), java.nio.file.StandardCopyOption.REPLACE_EXISTING,
                    java.nio.file.StandardCopyOption.ATOMIC_MOVE);
        } catch (IOException e) {
            say.println("warning: cannot write " + logDir.resolve(PIDS_FILE) + ": " + e);
        }
    }

    /**
     * --restart-exited: starts {@code s}, which exited, again, unless the pool is being stopped or it
     * exited within {@link #CRASH_LOOP} of an earlier restart of this kind. Returns whether it did.
     */
    private synchronized boolean respawn(Supervised s, boolean master) throws IOException {
        if (stopping) {
            return false;
        }
        Process dead = s.process();
        String what = master ? "master lost" : "node lost";
        if (s.respawned && System.nanoTime() - s.startedAt < CRASH_LOOP.toNanos()) {
            say.printf("%s: %s (pid %d) exited with code %d within %d s of being started again: not restarting it"
                    + " again; see %s%n", what, s.name(), dead.pid(), dead.exitValue(), CRASH_LOOP.toSeconds(), s.log());
            say.flush();
            return false;
        }
        say.printf("%s: %s (pid %d) exited with code %d; starting it again (--restart-exited)%s; see %s%n", what,
                s.name(), dead.pid(), dead.exitValue(), master && masterProcesses.size() > 1
                        ? ", as a standby: another master takes over through etcd meanwhile"
                        : master ? "" : ", on its address: it adopts its segment file", s.log());
        say.flush();
        restart(s);
        s.respawned = true;
        return true;
    }

    static final class LaunchFailure extends Exception {
        LaunchFailure(String message) {
            super(message);
        }
    }

    private String awaitLine(Supervised s, Pattern p, Duration timeout) throws Exception {
        return awaitLine(s, p, timeout, 0);
    }

    /** Waits for a line matching {@code p} among the log's lines after the first {@code skipLines}. */
    String awaitLine(Supervised s, Pattern p, Duration timeout, int skipLines) throws Exception {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (System.nanoTime() < deadline) {
            List<String> lines = Files.readAllLines(s.log(), StandardCharsets.UTF_8);
            for (String l : lines.subList(Math.min(skipLines, lines.size()), lines.size())) {
                if (p.matcher(l).find()) {
                    return l;
                }
            }
            if (!s.process().isAlive()) {
                throw new LaunchFailure(s.name() + " (pid " + s.process().pid() + ") exited with code "
                        + s.process().exitValue() + " while starting; see " + s.log());
            }
            Thread.sleep(100);
        }
        throw new LaunchFailure(s.name() + " did not start within " + timeout.toSeconds() + " s; see " + s.log());
    }

    void awaitRegistered(String master, int nodes) throws Exception {
        awaitRegistered(master, nodes, null, -1);
    }

    /**
     * The id of the registration the master holds for the segment named {@code segment} (a node's
     * {@code HOST:PORT}), or -1 when it holds none.
     */
    int registrationOf(String master, String segment) throws Exception {
        long deadline = System.nanoTime() + readyTimeout.toNanos();
        try (KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster(master))) {
            while (true) {
                try {
                    return c.stats().segments().stream().filter(s -> s.name().equals(segment))
                            .mapToInt(PoolStats.SegmentStats::id).max().orElse(-1);
                } catch (RuntimeException e) {
                    if (System.nanoTime() > deadline) {
                        throw new LaunchFailure("the master did not answer within " + readyTimeout.toSeconds() + " s ("
                                + e.getMessage() + ")");
                    }
                    Thread.sleep(200); // a leader changing hands: ask again
                }
            }
        }
    }

    /**
     * Waits until {@code nodes} segments are registered and active, {@code segment} (a node's
     * {@code HOST:PORT}; null for any) among them under another registration than {@code notId} (the
     * one its previous run held; -1 for any): the old registration of a node that restarts is still
     * listed until the new one replaces it, and must not count as the node being back.
     */
    void awaitRegistered(String master, int nodes, String segment, int notId) throws Exception {
        Duration timeout = readyTimeout;
        long deadline = System.nanoTime() + timeout.toNanos();
        try (KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster(master))) {
            List<PoolStats.SegmentStats> segs = List.of();
            String unanswered = "";
            while (true) {
                checkAlive();
                try {
                    segs = c.stats().segments();
                    unanswered = "";
                } catch (RuntimeException e) {
                    // a master restarting or a leader changing hands (it happens in the middle of a rolling
                    // restart): ask again until the deadline
                    unanswered = "; the master did not answer the last time (" + e.getMessage() + ")";
                }
                long active = segs.stream().filter(PoolStats.SegmentStats::active).count();
                if (unanswered.isEmpty() && active >= nodes && (segment == null || segs.stream().anyMatch(
                        s -> s.active() && s.name().equals(segment) && s.id() != notId))) {
                    return;
                }
                if (System.nanoTime() > deadline) {
                    throw new LaunchFailure(active + " of " + nodes + " nodes registered within " + timeout.toSeconds()
                            + " s; registered: " + segs.stream().map(PoolStats.SegmentStats::name).toList()
                            + unanswered + "; see the node logs in " + logDir.toAbsolutePath());
                }
                Thread.sleep(200);
            }
        }
    }

    void checkAlive() throws LaunchFailure {
        for (Supervised s : started) {
            if (!s.process().isAlive()) {
                throw new LaunchFailure(s.name() + " (pid " + s.process().pid() + ") exited with code "
                        + s.process().exitValue() + "; see " + s.log());
            }
        }
    }

    private Path writeClientConfig(OffloadConfig.Pool pool) throws IOException {
        ObjectMapper m = new ObjectMapper();
        ObjectNode root = m.createObjectNode();
        root.put("master", pool.master());
        ObjectNode o = root.putObject("offload");
        o.put("type", "pool").put("cpu", pool.cpu().toString()).put("master", pool.master())
                .put("promote_after", pool.promoteAfter()).put("reset", pool.reset())
                .put("versioned_keys", pool.versionedKeys());
        if (pool.disk() != null) {
            o.putObject("disk").put("path", pool.disk().path().toString()).put("size", pool.disk().size().toString());
        }
        Path abs = out.toAbsolutePath();
        Files.writeString(abs, m.writerWithDefaultPrettyPrinter().writeValueAsString(root) + "\n");
        return abs;
    }

    private int supervise(Path config) throws Exception {
        Process child = null;
        if (run != null) {
            ProcessBuilder pb = new ProcessBuilder(run).inheritIO();
            pb.environment().put("KVPOOL_CONFIG_PATH", config.toString());
            pb.environment().put("KVPOOL_MASTER_PID", Long.toString(started.getFirst().process().pid()));
            pb.environment().put("KVPOOL_MASTER_PIDS", String.join(",", masterProcesses.stream()
                    .map(s -> Long.toString(s.process().pid())).toList()));
            pb.environment().put("KVPOOL_NODE_PIDS", String.join(",", nodes()
                    .stream().map(s -> Long.toString(s.process().pid())).toList()));
            child = pb.start();
            say.printf("running %s (pid %d)%n", String.join(" ", run), child.pid());
        }
        Set<String> lost = new HashSet<>();
        RollingRestart rolling = new RollingRestart(this, logDir, say);
        while (true) {
            rolling.serveRequest();
            if (restartExited) {
                for (Supervised s : started) {
                    if (!s.process().isAlive() && !lost.contains(s.name()) && !respawn(s, masterProcesses.contains(s))) {
                        lost.add(s.name()); // reported by respawn: not restarted again
                    }
                }
            }
            Supervised master = masterProcesses.stream().filter(m -> m.process().isAlive()).findFirst()
                    .orElse(masterProcesses.getLast());
            if (!master.process().isAlive()) {
                say.printf("FAILED: %s (pid %d) exited with code %d%s; see %s%n", masterProcesses.size() > 1
                        ? "the last master" : "master", master.process().pid(), master.process().exitValue(),
                        masterProcesses.size() > 1 ? ", no master is left" : "", master.log());
                say.flush();
                if (child != null) {
                    child.destroy();
                }
                stopAll();
                return 1;
            }
            for (Supervised s : started) {
                if (!s.process().isAlive() && masterProcesses.contains(s) && lost.add(s.name())) {
                    say.printf("master lost: %s (pid %d) exited with code %d; another master takes over through etcd;"
                            + " see %s%n", s.name(), s.process().pid(), s.process().exitValue(), s.log());
                    say.flush();
                } else if (!s.process().isAlive() && lost.add(s.name())) {
                    // a pool outlives a node: its objects become misses, the others keep serving
                    say.printf("node lost: %s (pid %d) exited with code %d; the pool goes on without it (its objects"
                            + " are misses); see %s%n", s.name(), s.process().pid(), s.process().exitValue(), s.log());
                    say.flush();
                }
            }
            if (child != null && child.waitFor(1, TimeUnit.SECONDS)) {
                int code = child.exitValue();
                say.printf("%s exited with code %d; stopping the pool%n", String.join(" ", run), code);
                stopAll();
                return code;
            }
            if (child == null) {
                Thread.sleep(1000);
            }
        }
    }

    /** The masters, in start order. */
    List<Supervised> masters() {
        return List.copyOf(masterProcesses);
    }

    /** The nodes, in host order. */
    List<Supervised> nodes() {
        List<Supervised> all = List.copyOf(started);
        return all.subList(Math.min(masterProcesses.size(), all.size()), all.size());
    }

    String masterAddress() {
        return masterAddress;
    }

    /** Stops every process started, newest first, descendants included; idempotent. */
    synchronized void stopAll() {
        stopping = true;
        List<Supervised> roles = List.copyOf(started);
        for (int i = roles.size() - 1; i >= 0; i--) {
            Supervised s = roles.get(i);
            List<ProcessHandle> all = new ArrayList<>(s.process().descendants().toList());
            all.add(s.process().toHandle());
            for (ProcessHandle h : all) {
                h.destroy();
            }
            for (ProcessHandle h : all) {
                try {
                    h.onExit().get(10, TimeUnit.SECONDS);
                } catch (Exception e) {
                    h.destroyForcibly();
                }
            }
        }
        started.clear();
        masterProcesses.clear();
        try {
            Files.deleteIfExists(logDir.resolve(PID_FILE));
            Files.deleteIfExists(logDir.resolve(PIDS_FILE));
        } catch (IOException e) {
            // a stale pid file names a dead process: rolling-restart says so
        }
        if (localEtcd != null) {
            localEtcd.close();
            localEtcd = null;
        }
    }
}
