package io.kvpool.cli;

import io.kvpool.etcd.MasterAddress;
import io.kvpool.etcd.MasterLocator;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.TimeUnit;
import java.util.regex.Pattern;

/**
 * A rolling restart of the pool a {@code kvpool launch} supervises: every master, then every node,
 * one at a time, while engines keep using the pool, keeping the cache.
 *
 * <h2>The procedure</h2>
 * <pre>
 *   check: every process alive, every node registered and active
 *   masters, standbys first and the leader last (one master: it alone, the pool pauses meanwhile):
 *       SIGTERM, wait for the exit; start again with the same arguments (same ports, same id);
 *       wait until it stands for election (elected) or listens (single); then until every node is
 *       registered and active again through the pool's address (after the leader: under the new one)
 *   nodes, in host order:
 *       SIGUSR1: the node drains (the master places nothing more on it, the writes in progress end),
 *       stops and keeps its /dev/shm segment file ({@link RestartSignal});
 *       start again on the same address with the same segment size: it adopts the file, verifies
 *       every object (header and CRC32C) and offers them to the master at registration;
 *       wait until that node is registered anew (another registration id than before the stop: the
 *       master lists the old one, draining, until the new one replaces it) and every node is active
 * </pre>
 * A node's objects are misses while it is away (a copy on another node serves a get when the object
 * has two); the master's metadata survives a master's restart because the other master leads
 * meanwhile, or, with one master, because every node re-offers its objects when it registers again.
 * Any step that fails stops the procedure there, with the reason: the pool keeps running as it is.
 *
 * <h2>How it is asked for</h2>
 * {@code kvpool rolling-restart --log-dir DIR} writes {@code DIR/rolling-restart.request}; the
 * launcher (which checks once a second, between its supervision rounds) renames it away, carries out
 * the restart and writes {@code DIR/rolling-restart.result}: {@code ok} or {@code failed: REASON} on the
 * first line, then one line per step. Nodes reached over ssh cannot be signalled from here: the
 * restart refuses to start on such a pool.
 */
final class RollingRestart {

    private static final Logger log = LoggerFactory.getLogger(RollingRestart.class);

    static final String REQUEST = "rolling-restart.request";
    static final String RESULT = "rolling-restart.result";

    private static final Pattern STANDING = Pattern.compile("kvpool master \\S+ standing for election");
    private static final Pattern LISTENING = Pattern.compile("kvpool master listening on");
    /** What a node that took over its previous run's segment file says (SegmentMemory). */
    private static final Pattern ADOPTED = Pattern.compile("segment \\S+: adopting ");
    /** How long a process may take to stop, and a restarted one to come back. */
    private static final Duration STEP_TIMEOUT = Duration.ofSeconds(60);

    private final LaunchCommand launch;
    private final Path dir;
    private final PrintStream say;

    RollingRestart(LaunchCommand launch, Path dir, PrintStream say) {
        this.launch = launch;
        this.dir = dir;
        this.say = say;
    }

    /** Carries out a pending request, if any; writes its result. Never throws. */
    void serveRequest() {
        Path request = dir.resolve(REQUEST);
        if (!Files.exists(request)) {
            return;
        }
        String id;
        try {
            Path taken = dir.resolve(REQUEST + ".taken");
            Files.move(request, taken, StandardCopyOption.REPLACE_EXISTING);
            id = Files.readString(taken, StandardCharsets.UTF_8).strip();
            Files.delete(taken);
        } catch (IOException e) {
            log.warn("rolling restart: cannot take the request {}: {}", request, e.toString());
            return;
        }
        List<String> steps = new ArrayList<>();
        String outcome;
        say.println("rolling restart: starting (request " + id + ")");
        say.flush();
        try {
            run(steps);
            outcome = "ok";
        } catch (Exception e) {
            outcome = "failed: " + (e instanceof LaunchCommand.LaunchFailure ? e.getMessage() : e.toString());
            if (e instanceof InterruptedException) {
                Thread.currentThread().interrupt();
            }
        }
        say.println("rolling restart: " + outcome);
        say.flush();
        List<String> out = new ArrayList<>();
        out.add(outcome);
        out.add("request " + id);
        out.addAll(steps);
        try {
            Path tmp = dir.resolve(RESULT + ".tmp");
            Files.write(tmp, out, StandardCharsets.UTF_8);
            Files.move(tmp, dir.resolve(RESULT), StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
        } catch (IOException e) {
            log.warn("rolling restart: cannot write {}: {}", dir.resolve(RESULT), e.toString());
        }
    }

    private void run(List<String> steps) throws Exception {
        List<LaunchCommand.Supervised> masters = launch.masters();
        List<LaunchCommand.Supervised> nodes = launch.nodes();
        for (LaunchCommand.Supervised n : nodes) {
            if (n.host().via().startsWith("ssh")) {
                throw new LaunchCommand.LaunchFailure("node " + n.name() + " runs over ssh: this launcher cannot signal"
                        + " it (only the local ssh process is its own); restart such pools host by host");
            }
        }
        launch.checkAlive();
        String address = launch.masterAddress();
        launch.awaitRegistered(address, nodes.size());
        for (LaunchCommand.Supervised m : mastersInOrder(masters, address)) {
            long t0 = System.nanoTime();
            int lines = lines(m);
            stop(m, false);
            launch.restart(m);
            launch.awaitLine(m, masters.size() > 1 ? STANDING : LISTENING, STEP_TIMEOUT, lines);
            launch.awaitRegistered(address, nodes.size());
            steps.add(step(m, t0));
        }
        for (LaunchCommand.Supervised n : nodes) {
            long t0 = System.nanoTime();
            int lines = lines(n);
            String name = n.args().get(n.args().indexOf("--advertise-host") + 1) + ":"
                    + n.args().get(n.args().indexOf("--port") + 1);
            // the registration this run holds: the node is back only under another one
            int before = launch.registrationOf(address, name);
            stop(n, true);
            launch.restart(n);
            launch.awaitLine(n, LaunchCommand.NODE_LINE, STEP_TIMEOUT, lines);
            if (!logged(n, ADOPTED, lines)) {
                // the cache of this node is gone: the next nodes would lose theirs the same way
                throw new LaunchCommand.LaunchFailure(n.name() + " came back without its objects (it did not adopt its"
                        + " segment file; its log " + n.log() + " says why); stopping the rolling restart here");
            }
            // its segment by name (HOST:PORT, the identity it adopted its file under), registered anew (not the
            // previous run's registration, which the master lists, draining, until the new one replaces it) and
            // active again with every other
            launch.awaitRegistered(address, nodes.size(), name, before);
            steps.add(step(n, t0));
        }
    }

    private String step(LaunchCommand.Supervised s, long t0) {
        String line = String.format(Locale.ROOT, "%s restarted in %.2f s (pid %d, back at %s)", s.name(),
                (System.nanoTime() - t0) / 1e9, s.process().pid(), java.time.Instant.now());
        say.println("rolling restart: " + line);
        say.flush();
        return line;
    }

    /** Standbys first, the leader last: the pool changes leader once. One master: itself. */
    private static List<LaunchCommand.Supervised> mastersInOrder(List<LaunchCommand.Supervised> masters, String address)
            throws IOException {
        if (masters.size() == 1) {
            return masters;
        }
        String leaderId;
        try (MasterLocator locator = MasterLocator.of(MasterAddress.parse(address), Duration.ofSeconds(5))) {
            locator.locate(STEP_TIMEOUT, true);
            leaderId = locator.latest().id();
        }
        List<LaunchCommand.Supervised> out = new ArrayList<>();
        LaunchCommand.Supervised leader = null;
        for (LaunchCommand.Supervised m : masters) {
            int i = m.args().indexOf("--id");
            if (i >= 0 && m.args().get(i + 1).equals(leaderId)) {
                leader = m;
            } else {
                out.add(m);
            }
        }
        if (leader != null) {
            out.add(leader);
        }
        return out;
    }

    /** Stops a process: SIGUSR1 (a node: keep the segment) or SIGTERM, and waits for its exit. */
    private void stop(LaunchCommand.Supervised s, boolean keepSegment) throws Exception {
        Process p = s.process();
        if (keepSegment) {
            Process kill = new ProcessBuilder("kill", "-s", RestartSignal.NAME, Long.toString(p.pid()))
                    .redirectErrorStream(true).start();
            if (kill.waitFor() != 0) {
                throw new LaunchCommand.LaunchFailure("cannot signal " + s.name() + " (pid " + p.pid() + "): "
                        + new String(kill.getInputStream().readAllBytes(), StandardCharsets.UTF_8).strip());
            }
        } else {
            p.destroy();
        }
        if (!p.waitFor(STEP_TIMEOUT.toSeconds(), TimeUnit.SECONDS)) {
            throw new LaunchCommand.LaunchFailure(s.name() + " (pid " + p.pid() + ") did not stop within "
                    + STEP_TIMEOUT.toSeconds() + " s; it is left running; see " + s.log());
        }
        if (keepSegment && p.exitValue() != 0) {
            throw new LaunchCommand.LaunchFailure(s.name() + " (pid " + p.pid() + ") exited with code " + p.exitValue()
                    + " instead of stopping for a restart; see " + s.log());
        }
    }

    /** Whether the log has a line matching {@code p} after its first {@code skipLines}. */
    private static boolean logged(LaunchCommand.Supervised s, Pattern p, int skipLines) throws IOException {
        try (var l = Files.lines(s.log(), StandardCharsets.UTF_8)) {
            return l.skip(skipLines).anyMatch(line -> p.matcher(line).find());
        }
    }

    private static int lines(LaunchCommand.Supervised s) throws IOException {
        try (var l = Files.lines(s.log(), StandardCharsets.UTF_8)) {
            return (int) l.count();
        }
    }
}
