package io.kvpool.it;

import io.kvpool.cli.Main;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

/**
 * The {@code kvpool} command line as its own process (issue 25, item 3): a count or size the
 * machine cannot hold is a bad flag, answered at once (exit 2, naming the flag, the value and the
 * bound) instead of a process that spins, swaps and needs SIGKILL; and a long-running command sent
 * SIGTERM exits and removes the shared-memory segment file it created. Waits have generous
 * deadlines: what is asserted is that the process exits and what it leaves, not how fast.
 */
@Timeout(value = 300, unit = TimeUnit.SECONDS)
class CliProcessIT {

    private static final Path SHM = SegmentFiles.SHM;
    private static final Path LOGS = Path.of("target", "it-logs", "CliProcessIT");
    private static final Duration EXIT_DEADLINE = Duration.ofSeconds(60);

    @BeforeAll
    static void needsShm() throws IOException {
        assumeTrue(Files.isDirectory(SHM), "no /dev/shm on this machine: nodes use anonymous memory, no file to check");
        Files.createDirectories(LOGS);
    }

    /** {@code kvpool ARGS} as a process of its own, its output in target/it-logs/CliProcessIT/NAME.log. */
    private static Process start(String name, String... args) throws IOException {
        List<String> cmd = new ArrayList<>(List.of(Path.of(System.getProperty("java.home"), "bin", "java").toString(),
                "-Xmx512m", "--enable-native-access=ALL-UNNAMED", "-cp", System.getProperty("java.class.path"),
                Main.class.getName()));
        cmd.addAll(List.of(args));
        return new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(LOGS.resolve(name + ".log").toFile())
                .start();
    }

    private static String output(String name) throws IOException {
        return Files.readString(LOGS.resolve(name + ".log"), StandardCharsets.UTF_8);
    }

    private static List<Path> segmentFilesOf(long pid) {
        return SegmentFiles.of(SHM, pid);
    }

    /**
     * Its exit code once it exited within the deadline; otherwise it is killed (and its segment file
     * removed, so a failing run leaves nothing either) and the test fails naming {@code what}.
     */
    private static int exitCode(Process p, String what) throws Exception {
        try {
            Await.until(what, EXIT_DEADLINE, () -> !p.isAlive());
        } catch (AssertionError e) {
            killAndClean(p);
            throw e;
        }
        return p.exitValue();
    }

    @Test
    void poolDemoWithMoreClientsThanTheMachineCanHoldIsABadFlagAtOnce() throws Exception {
        Process p = start("clients", "pool-demo", "--clients", "100000000");
        assertThat(exitCode(p, "pool-demo --clients 100000000 exited")).isEqualTo(2);
        assertThat(output("clients")).contains("--clients 100000000 is out of range: 1 to 256");
        assertThat(segmentFilesOf(p.pid())).isEmpty();
    }

    @Test
    void poolDemoWithABlockLargerThanAnyValueIsABadFlag() throws Exception {
        Process p = start("max-block", "pool-demo", "--max-block", "3GiB");
        assertThat(exitCode(p, "pool-demo --max-block 3GiB exited")).isEqualTo(2);
        assertThat(output("max-block")).contains("--max-block 3GiB is more than the largest value the embedded"
                + " master takes, 256MiB");
        assertThat(segmentFilesOf(p.pid())).isEmpty();
    }

    @Test
    void poolDemoStoppedWithSigtermExitsAndRemovesItsSegmentFile() throws Exception {
        // long enough that only the signal ends it
        Process p = start("pool-demo-sigterm", "pool-demo", "--conversations", "1000000", "--turns", "5",
                "--segment-size", "64MiB");
        stopOnceServingAndCheck(p, "pool-demo");
    }

    @Test
    void serveStoppedWithSigtermExitsAndRemovesItsSegmentFile() throws Exception {
        Process p = start("serve-sigterm", "serve", "--port", "0", "--node-port", "0", "--http-port", "-1",
                "--segment-size", "32MiB");
        stopOnceServingAndCheck(p, "serve");
    }

    @Test
    void serveSaysItServesOnlyOnceAPutGoesThrough() throws Exception {
        // issue 32, item 5: the first put after "kvpool serving" came back NO_SEGMENT for 1-3 s
        for (int round = 0; round < 3; round++) {
            String name = "serve-ready-" + round;
            Process p = start(name, "serve", "--port", "0", "--node-port", "0", "--http-port", "-1",
                    "--segment-size", "32MiB");
            try {
                Await.until("serve said it serves", EXIT_DEADLINE, () -> {
                    try {
                        return output(name).contains("kvpool serving: master ") || !p.isAlive();
                    } catch (IOException e) {
                        return false;
                    }
                });
                java.util.regex.Matcher m = java.util.regex.Pattern.compile("kvpool serving: master (\\S+),")
                        .matcher(output(name));
                assertThat(m.find()).as(output(name)).isTrue();
                try (io.kvpool.client.KvPoolClient c = io.kvpool.client.KvPoolClient.connect(
                        io.kvpool.client.ClientConfig.forMaster(m.group(1)))) {
                    assertThat(c.put("first/" + round, new byte[]{1, 2, 3})).as("the first put, at once")
                            .isEqualTo(io.kvpool.client.PutStatus.OK);
                    assertThat(c.exists("kvpool/ready-check/")).isFalse();
                    assertThat(c.stats().keys()).as("the readiness probe removed its object").isEqualTo(1);
                }
            } finally {
                p.destroy();
                exitCode(p, name + " exited after SIGTERM");
            }
        }
    }

    /** Once {@code p} has its segment file: SIGTERM; it must exit and leave no file of its own. */
    private static void stopOnceServingAndCheck(Process p, String command) throws Exception {
        try {
            Await.until(command + " created its segment file", () -> !segmentFilesOf(p.pid()).isEmpty()
                    || !p.isAlive());
            assertThat(p.isAlive()).as("%s still running", command).isTrue();
        } catch (AssertionError e) {
            killAndClean(p);
            throw e;
        }
        p.destroy(); // SIGTERM
        exitCode(p, command + " exited after SIGTERM");
        assertThat(segmentFilesOf(p.pid())).as("segment files of %s (pid %d) after SIGTERM", command, p.pid())
                .isEmpty();
    }

    /** SIGKILL, and its segment file removed: what a failing test must not leave behind. */
    private static void killAndClean(Process p) throws Exception {
        p.destroyForcibly();
        p.waitFor(30, TimeUnit.SECONDS);
        SegmentFiles.remove(SHM, p.pid());
    }
}
