package io.kvpool.it;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import static org.assertj.core.api.Assertions.assertThat;

/** {@code kvpool launch} as an operator runs it: its own process, its children, its exit codes. */
class LaunchIT {

    private static final Pattern STARTED = Pattern.compile("started (\\S+) on \\S+ \\(pid (\\d+)\\)");

    /** A running launcher: its process, the lines it printed so far, and the thread that reads them. */
    record Launcher(Process process, List<String> lines, Thread reader) {
        long pidOf(String name) {
            for (String l : lines) {
                Matcher m = STARTED.matcher(l);
                if (m.find() && m.group(1).equals(name)) {
                    return Long.parseLong(m.group(2));
                }
            }
            throw new AssertionError("no " + name + " in " + lines);
        }

        List<Long> childPids() {
            List<Long> out = new ArrayList<>();
            for (String l : lines) {
                Matcher m = STARTED.matcher(l);
                if (m.find()) {
                    out.add(Long.parseLong(m.group(2)));
                }
            }
            return out;
        }

        boolean printed(String part) {
            return lines.stream().anyMatch(l -> l.contains(part));
        }

        /** Every line the launcher printed: waits (60 s at most) for it to exit and its output to be read to the end. */
        List<String> allLines() throws InterruptedException {
            assertThat(process.waitFor(60, TimeUnit.SECONDS)).as("the launcher exited").isTrue();
            assertThat(reader.join(Duration.ofSeconds(60))).as("the launcher's output read to its end").isTrue();
            return lines;
        }
    }

    private static Launcher launch(Path dir, String config, String... extra) throws Exception {
        Path cfg = dir.resolve("pool.yaml");
        Files.writeString(cfg, config);
        List<String> args = new ArrayList<>(List.of("--config", cfg.toString()));
        args.addAll(List.of(extra));
        return launchWith(dir, args.toArray(String[]::new));
    }

    private static Launcher launchWith(Path dir, String... extra) throws Exception {
        List<String> cmd = new ArrayList<>(List.of(Path.of(System.getProperty("java.home"), "bin", "java").toString(),
                "-Xmx256m", "--enable-native-access=ALL-UNNAMED", "-cp", System.getProperty("java.class.path"),
                "io.kvpool.cli.Main", "launch", "--out", dir.resolve("client.json").toString(),
                "--log-dir", dir.resolve("logs").toString(), "--master-port", "0"));
        cmd.addAll(List.of(extra));
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        List<String> lines = new CopyOnWriteArrayList<>();
        Thread reader = Thread.ofVirtual().start(() -> {
            try (BufferedReader r = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8))) {
                String l;
                while ((l = r.readLine()) != null) {
                    lines.add(l);
                }
            } catch (Exception ignored) {
                // the process ended
            }
        });
        return new Launcher(p, lines, reader);
    }

    /** Waits (120 s at most) until the launcher printed {@code part}; fails at once if it exits without. */
    private static void awaitPrinted(Launcher l, String part) throws InterruptedException {
        Await.until("the launcher printed '" + part + "' or exited", Duration.ofSeconds(120),
                () -> l.printed(part) || !l.process().isAlive());
        if (!l.printed(part)) {
            List<String> all = l.allLines(); // it exited: what it printed last may still be on its way
            assertThat(all).as("the launcher exited with %d before printing '%s'", l.process().exitValue(), part)
                    .anyMatch(line -> line.contains(part));
        }
    }

    private static void assertAllGone(List<Long> pids) throws InterruptedException {
        for (long pid : pids) {
            Await.until("pid " + pid + " exited (not left behind)", Duration.ofSeconds(15),
                    () -> !ProcessHandle.of(pid).map(ProcessHandle::isAlive).orElse(false));
        }
    }

    @Test
    void localNodesWithoutAConfigStartWithTheDefaultsAndSaySo(@TempDir Path dir) throws Exception {
        Launcher l = launchWith(dir, "--local", "1");
        try {
            awaitPrinted(l, "export KVPOOL_CONFIG_PATH=");
            assertThat(l.printed("no --config: starting 1 local node(s) with the defaults (1GiB of memory each")).isTrue();
            assertThat(l.printed("status page: http://127.0.0.1:")).as(l.lines().toString()).isTrue();
            String master = new ObjectMapper().readTree(dir.resolve("client.json").toFile()).path("master").asText();
            try (KvPoolClient c = KvPoolClient.connect(master)) {
                assertThat(c.stats().capacityBytes()).isEqualTo(1L << 30);
            }
        } finally {
            l.process().destroy();
            assertThat(l.process().waitFor(60, TimeUnit.SECONDS)).as("the launcher stopped on SIGTERM").isTrue();
        }
        // with --hosts there is no default to assume: the message says what to give
        Files.writeString(dir.resolve("hosts.txt"), "127.0.0.1 local\n");
        Launcher h = launchWith(dir, "--hosts", dir.resolve("hosts.txt").toString());
        assertThat(String.join("\n", h.allLines())).contains("--config FILE is required with --hosts");
        assertThat(h.process().exitValue()).isNotZero();
    }

    @Test
    void launchesOnePoolWritesTheClientConfigAndStopsEverythingOnSigterm(@TempDir Path dir) throws Exception {
        int events = ProcessCluster.freePort();
        Launcher l = launch(dir, "type: pool\ncpu: 64MiB\ntenants:\n  - {name: t, prefixes: [quota/], memory: 200KiB}\n"
                + "events: {endpoint: 'tcp://127.0.0.1:" + events + "', topic: kv@it@m}\n", "--local", "2");
        try {
            awaitPrinted(l, "export KVPOOL_CONFIG_PATH=");
            assertThat(l.printed("ready: master")).isTrue();
            var cfg = new ObjectMapper().readTree(dir.resolve("client.json").toFile());
            String master = cfg.path("master").asText();
            assertThat(cfg.path("offload").path("type").asText()).isEqualTo("pool");
            assertThat(cfg.path("offload").path("master").asText()).isEqualTo(master);
            try (KvPoolClient c = KvPoolClient.connect(master)) {
                assertThat(c.stats().segments()).hasSize(2).allMatch(s -> s.active());
                assertThat(c.stats().capacityBytes()).isEqualTo(128L << 20);
                assertThat(c.put("launched", "yes".getBytes(StandardCharsets.UTF_8))).isEqualTo(PutStatus.OK);
                assertThat(c.get("launched")).hasValue("yes".getBytes(StandardCharsets.UTF_8));
                // the config's tenant reached the master: three values of 64 KiB fit its 200 KiB, a fourth not
                for (int i = 0; i < 3; i++) {
                    assertThat(c.put("quota/" + i, new byte[64 << 10])).isEqualTo(PutStatus.OK);
                }
                assertThat(c.put("quota/3", new byte[64 << 10])).isEqualTo(PutStatus.QUOTA_EXCEEDED);
            }
            // and its events block: the master publishes on the endpoint the config names
            assertThat(Files.readString(dir.resolve("logs").resolve("master.log")))
                    .contains("KV events: publishing on tcp://127.0.0.1:" + events).contains("topic 'kv@it@m'");
            List<Long> children = l.childPids();
            assertThat(children).hasSize(3);
            l.process().destroy(); // SIGTERM, as an operator's Ctrl-C or a scheduler would
            assertThat(l.process().waitFor(60, TimeUnit.SECONDS)).isTrue();
            assertAllGone(children);
        } finally {
            l.process().destroyForcibly();
        }
    }

    @Test
    void aLostNodeIsNamedAndThePoolGoesOnButALostMasterStopsEverything(@TempDir Path dir) throws Exception {
        Launcher l = launch(dir, "type: pool\ncpu: 64MiB\n", "--local", "2");
        try {
            awaitPrinted(l, "export KVPOOL_CONFIG_PATH=");
            List<Long> children = l.childPids();
            long victim = l.pidOf("node-1");
            ProcessHandle.of(victim).orElseThrow().destroyForcibly();
            awaitPrinted(l, "node lost: node-1 (pid " + victim + ")");
            SegmentFiles.remove(SegmentFiles.SHM, victim); // it is not coming back
            assertThat(l.process().isAlive()).as("the pool goes on").isTrue();
            String master = new ObjectMapper().readTree(dir.resolve("client.json").toFile()).path("master").asText();
            try (KvPoolClient c = KvPoolClient.connect(master)) {
                // a put placed on the dead node fails until the master drops it (node TTL); then puts
                // go to the live one
                Await.until("a put that succeeds on the live node", () -> {
                    PutStatus st = c.put("after-loss", new byte[]{1});
                    assertThat(st).isIn(PutStatus.OK, PutStatus.FAILED);
                    return st == PutStatus.OK;
                });
            }
            long masterPid = l.pidOf("master");
            ProcessHandle.of(masterPid).orElseThrow().destroyForcibly();
            assertThat(l.process().waitFor(60, TimeUnit.SECONDS)).isTrue();
            assertThat(l.process().exitValue()).isEqualTo(1);
            awaitPrinted(l, "FAILED: master (pid " + masterPid + ") exited");
            assertAllGone(children);
        } finally {
            l.process().destroyForcibly();
        }
    }

    /** Whether {@code key} reads back as {@code value} now (a miss or an error while the pool comes back: not yet). */
    private static boolean readsBack(KvPoolClient c, String key, byte[] value) {
        try {
            return c.get(key).map(v -> java.util.Arrays.equals(v, value)).orElse(false);
        } catch (RuntimeException e) {
            return false;
        }
    }

    /** The pid of {@code name}'s latest start by --restart-exited, once the launcher printed it. */
    private static long restartedPid(Launcher l, String name) throws InterruptedException {
        Pattern again = Pattern.compile("started " + Pattern.quote(name) + " on \\S+ again \\(pid (\\d+)\\)");
        Await.until("the launcher started " + name + " again", Duration.ofSeconds(120),
                () -> l.lines().stream().anyMatch(line -> again.matcher(line).find()) || !l.process().isAlive());
        long pid = -1;
        for (String line : l.lines()) {
            Matcher m = again.matcher(line);
            if (m.find()) {
                pid = Long.parseLong(m.group(1));
            }
        }
        assertThat(pid).as("%s started again; the launcher printed %s", name, l.lines()).isPositive();
        return pid;
    }

    /**
     * {@code --restart-exited}, as a supervisor: a node killed with SIGKILL is started again on its
     * address and adopts its segment file (the object put before the kill is read back), a killed
     * master is started again on its port and rebuilds from the node; the pids file follows, and a
     * SIGTERM stops the processes started again too.
     */
    @Test
    void withRestartExitedAKilledNodeComesBackWithItsObjectsAndAKilledMasterComesBack(@TempDir Path dir) throws Exception {
        Launcher l = launch(dir, "type: pool\ncpu: 64MiB\n", "--local", "1", "--restart-exited");
        List<Long> all = new ArrayList<>();
        try {
            awaitPrinted(l, "export KVPOOL_CONFIG_PATH=");
            all.addAll(l.childPids());
            Path pids = dir.resolve("logs").resolve("pids");
            assertThat(Files.readAllLines(pids)).containsExactly("master " + l.pidOf("master"), "node-0 " + l.pidOf("node-0"));
            String master = new ObjectMapper().readTree(dir.resolve("client.json").toFile()).path("master").asText();
            byte[] value = "kept across a kill".getBytes(StandardCharsets.UTF_8);
            try (KvPoolClient c = KvPoolClient.connect(master)) {
                assertThat(c.put("kept", value)).isEqualTo(PutStatus.OK);
            }

            long node = l.pidOf("node-0");
            ProcessHandle.of(node).orElseThrow().destroyForcibly();
            awaitPrinted(l, "node lost: node-0 (pid " + node + ") exited with code 137; starting it again");
            long nodeAgain = restartedPid(l, "node-0");
            all.add(nodeAgain);
            Await.untilChecked("the pids file names node-0's new pid", Duration.ofSeconds(60),
                    () -> Files.readAllLines(pids).contains("node-0 " + nodeAgain));
            try (KvPoolClient c = KvPoolClient.connect(master)) {
                Await.until("the object put before the kill is read back from the adopted segment",
                        Duration.ofSeconds(120), () -> readsBack(c, "kept", value));
            }

            long masterPid = l.pidOf("master");
            ProcessHandle.of(masterPid).orElseThrow().destroyForcibly();
            awaitPrinted(l, "master lost: master (pid " + masterPid + ") exited with code 137; starting it again");
            all.add(restartedPid(l, "master"));
            Await.until("the object is read back under the master started again", Duration.ofSeconds(120), () -> {
                try (KvPoolClient c = KvPoolClient.connect(master)) { // refused until the master listens again
                    return readsBack(c, "kept", value);
                } catch (RuntimeException e) {
                    return false;
                }
            });
            assertThat(l.process().isAlive()).as("the pool goes on").isTrue();
            assertThat(l.printed("FAILED")).isFalse();

            l.process().destroy();
            assertThat(l.process().waitFor(60, TimeUnit.SECONDS)).isTrue();
            assertAllGone(all);
            assertThat(pids).doesNotExist();
        } finally {
            // on a failure too: the launcher's SIGTERM stops what it started again (a SIGKILL of the launcher
            // alone would leave those behind), then whatever is left by pid
            l.process().destroy();
            l.process().waitFor(60, TimeUnit.SECONDS);
            l.process().destroyForcibly();
            for (long pid : all) {
                ProcessHandle.of(pid).ifPresent(ProcessHandle::destroyForcibly);
            }
        }
    }

    @Test
    void aNodeThatCannotStartFailsTheLaunchNamingIt(@TempDir Path dir) throws Exception {
        // a disk tier where a file is in the way: the node cannot create its directory
        Files.writeString(dir.resolve("blocked"), "not a directory");
        Launcher l = launch(dir, "type: pool\ncpu: 64MiB\ndisk: {path: " + dir.resolve("blocked") + ", size: 64MiB}\n",
                "--local", "1");
        assertThat(l.process().waitFor(90, TimeUnit.SECONDS)).isTrue();
        assertThat(l.process().exitValue()).isEqualTo(1);
        awaitPrinted(l, "FAILED: node-0");
        assertAllGone(l.childPids());
    }

    @Test
    void aNodeGivenAnUnknownShmGroupFailsTheLaunchAndItsLogNamesTheGroup(@TempDir Path dir) throws Exception {
        Launcher l = launch(dir, "type: pool\ncpu: 64MiB\nshm_group: no-such-group-kvpool-it\n", "--local", "1");
        assertThat(l.process().waitFor(90, TimeUnit.SECONDS)).isTrue();
        assertThat(l.process().exitValue()).isEqualTo(1);
        awaitPrinted(l, "FAILED: node-0");
        assertAllGone(l.childPids());
        try (var logs = Files.list(dir.resolve("logs"))) {
            Path log = logs.filter(f -> f.getFileName().toString().startsWith("node-0")).findFirst().orElseThrow();
            assertThat(Files.readString(log)).contains("--shm-group no-such-group-kvpool-it: no such group on this machine");
        }
    }

    @Test
    void aBadConfigIsRefusedNamingTheField(@TempDir Path dir) throws Exception {
        Launcher l = launch(dir, "type: pool\ncpu_size: 1GiB\n", "--local", "1");
        assertThat(String.join("\n", l.allLines())).contains("offload.cpu_size").contains("use cpu");
        assertThat(l.process().exitValue()).isNotZero();
        assertThat(l.printed("started")).as("nothing started").isFalse();
    }

    @Test
    void aHotStandbyWithoutAStandbyIsRefused(@TempDir Path dir) throws Exception {
        Launcher l = launch(dir, "type: pool\ncpu: 64MiB\n", "--local", "1", "--hot-standby");
        assertThat(String.join("\n", l.allLines())).contains("--hot-standby needs a standby: give --masters 2");
        assertThat(l.process().exitValue()).isNotZero();
        assertThat(l.printed("started")).as("nothing started").isFalse();
    }

    @Test
    void runStartsACommandWithTheConfigPathAndStopsThePoolAfterIt(@TempDir Path dir) throws Exception {
        Path seen = dir.resolve("seen");
        Launcher l = launch(dir, "type: pool\ncpu: 64MiB\n", "--local", "1", "--run", "bash", "-c",
                "echo $KVPOOL_CONFIG_PATH > " + seen + "; exit 3");
        assertThat(l.process().waitFor(90, TimeUnit.SECONDS)).isTrue();
        assertThat(l.process().exitValue()).as("the command's exit code").isEqualTo(3);
        assertThat(Files.readString(seen).trim()).isEqualTo(dir.resolve("client.json").toAbsolutePath().toString());
        assertThat(l.allLines()).as("the pool was started").anyMatch(line -> line.contains("started master"));
        assertAllGone(l.childPids());
    }
}
