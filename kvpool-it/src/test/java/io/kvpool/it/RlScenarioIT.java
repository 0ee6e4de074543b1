package io.kvpool.it;

import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The RL scenario through the launcher ({@code scripts/rl-scenario.sh}): a two-node pool, two
 * engines, a trainer updating the weights every few steps and checking every rollout against a
 * recompute that no cache can serve. Its log must show each update, the reset (or the key switch),
 * rollouts under the new weights, the hit rate back up after each update, and no stale output; with
 * a pool node frozen (SIGSTOP) across an update too.
 */
class RlScenarioIT {

    private static final Pattern STEP = Pattern.compile("step +(\\d+) +weights (v\\d+) .* prefix hit +([0-9.]+)%");
    private static final Pattern STALE = Pattern.compile("stale outputs: (\\d+) of (\\d+) verified");

    private static String run(String... args) throws Exception {
        Path script = Path.of(System.getProperty("user.dir")).getParent().resolve("scripts/rl-scenario.sh");
        Assumptions.assumeTrue(Files.isExecutable(script), "no " + script);
        Path out = Files.createTempFile("kvpool-rl", ".log");
        List<String> cmd = new ArrayList<>(List.of("bash", script.toString()));
        cmd.addAll(List.of(args));
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(out.toFile()).start();
        assertThat(p.waitFor(10, TimeUnit.MINUTES)).as("finished").isTrue(); // bounds a hang only
        String log = Files.readString(out, StandardCharsets.UTF_8);
        System.out.println(log);
        assertThat(p.exitValue()).as(log).isZero();
        return log;
    }

    /** The versions the steps ran under, and their hit rates. */
    private static List<String> versions(String log, List<Double> hitRates) {
        List<String> versions = new ArrayList<>();
        Matcher m = STEP.matcher(log);
        while (m.find()) {
            hitRates.add(Double.parseDouble(m.group(3)));
            versions.add(m.group(2));
        }
        return versions;
    }

    private static void assertRecovers(String log) {
        List<Double> hits = new ArrayList<>();
        assertThat(versions(log, hits)).containsExactly("v1", "v1", "v1", "v2", "v2", "v2", "v3");
        // the first step under new weights finds nothing of the old ones locally; the next is back up
        assertThat(hits.get(4)).as("hit rate recovers after the update").isGreaterThan(hits.get(3));
        assertThat(hits.get(5)).isGreaterThanOrEqualTo(hits.get(4));
    }

    /** Every rollout was checked against a recompute, and none differed. */
    private static void assertNoStaleOutput(String log, int steps) {
        Matcher m = STALE.matcher(log);
        assertThat(m.find()).as("the trainer's verification summary").isTrue();
        assertThat(Integer.parseInt(m.group(1))).as("stale outputs").isZero();
        assertThat(Integer.parseInt(m.group(2))).as("outputs verified").isPositive();
        assertThat(Pattern.compile("step +\\d+ +verified \\d+ outputs, 0 stale").matcher(log).results().count())
                .as("a verification per step").isEqualTo(steps);
    }

    /** The number after {@code label} in the line of {@code text} that starts with it. */
    private static double number(String text, String label) {
        Matcher m = Pattern.compile(Pattern.quote(label) + " ([0-9.]+)").matcher(text);
        assertThat(m.find()).as("'" + label + "' in the log").isTrue();
        return Double.parseDouble(m.group(1));
    }

    /**
     * The RL soak in short ({@code scripts/rl-scenario.sh soak 10}): a negative control (new weights
     * under the old name, no remedy) whose verification must find stale outputs, then 10 updates
     * with the hard reset alone and 10 with versioned keys, rollouts racing every update. Each
     * remedy: every completed rollout verified, none stale; some updates found rollouts in flight
     * and aborted them; the cache served hits after each update's recovery.
     */
    @Test
    void theSoakInShortRacesUpdatesAndServesNothingStale() throws Exception {
        String log = run("soak", "10", "2");
        int control = log.indexOf("rl soak: negative control");
        int reset = log.indexOf("rl soak: reset, 10 updates");
        int versioned = log.indexOf("rl soak: versioned, 10 updates");
        assertThat(control).isNotNegative();
        assertThat(reset).isGreaterThan(control);
        assertThat(versioned).isGreaterThan(reset);
        assertThat(number(log.substring(control, reset), "stale outputs:")).as("the control finds stale outputs")
                .isPositive();
        for (String run : List.of(log.substring(reset, versioned), log.substring(versioned))) {
            assertThat(run).contains("summary: mode ").contains(", 10 weight updates");
            Matcher stale = STALE.matcher(run);
            assertThat(stale.find()).isTrue();
            assertThat(Integer.parseInt(stale.group(1))).as("stale outputs").isZero();
            assertThat(Integer.parseInt(stale.group(2))).as("outputs verified").isPositive();
            assertThat(number(run, "summary: verified")).as("completed rollouts verified").isPositive();
            assertThat(number(run, "updates with rollouts in flight at the pause")).as("updates that raced rollouts")
                    .isPositive();
            assertThat(number(run, "prefix hit rate: later steps")).as("hits after the recovery").isPositive();
            assertThat(number(run, "prefix hit rate: first step under new weights")).as("hits in the first step")
                    .isPositive();
        }
        assertThat(log).contains("rl soak: reset exited 0").contains("rl soak: versioned exited 0");
    }

    @Test
    void weightUpdatesThroughTheResetCascade() throws Exception {
        String log = run("reset", "7", "3");
        assertThat(log).contains("ready: master").contains("weight update to v2").contains("weight update to v3")
                .contains("reset cascade done").contains("stopping the pool");
        assertRecovers(log);
        assertNoStaleOutput(log, 7);
    }

    @Test
    void weightUpdatesWithVersionedKeys() throws Exception {
        String log = run("versioned", "7", "3");
        assertThat(log).contains("weight update to v2").contains("versioned keys: engines now use v2 keys")
                .doesNotContain("reset cascade done");
        assertRecovers(log);
        assertNoStaleOutput(log, 7);
    }

    /**
     * A pool node is stopped (SIGSTOP) before the first update's pause and continued after the first
     * step under the new weights: the reset cascade still completes, and no rollout, during the freeze
     * or after the node comes back with its old objects, is computed over KV of the old weights.
     */
    @Test
    void weightUpdateWithAFrozenNode() throws Exception {
        String log = run("reset", "5", "2", "freeze");
        Matcher node = Pattern.compile("started node-0 on \\S+ \\(pid (\\d+)\\)").matcher(log);
        assertThat(node.find()).as("the launcher names node-0's pid").isTrue();
        String pid = node.group(1);
        int froze = log.indexOf("froze pid " + pid + " (a pool node) before the weight update");
        int update = log.indexOf("weight update to v2");
        int thawed = log.indexOf("thawed pid " + pid);
        assertThat(froze).as("the freeze of node-0").isNotNegative();
        assertThat(update).as("the update, after the freeze").isGreaterThan(froze);
        assertThat(thawed).as("the thaw, after the update").isGreaterThan(update);
        String during = log.substring(froze, thawed);
        assertThat(during).contains("reset cascade done").contains("resumed");
        assertThat(STEP.matcher(during).results().map(r -> r.group(2)).toList())
                .as("the step run while the node was stopped").containsExactly("v2");
        List<Double> hits = new ArrayList<>();
        assertThat(versions(log, hits)).containsExactly("v1", "v1", "v2", "v2", "v3");
        assertNoStaleOutput(log, 5);
        Matcher reset = Pattern.compile("reset cascade done in (\\d+) ms").matcher(during);
        assertThat(reset.find()).isTrue();
        System.out.println("RlScenarioIT: reset cascade with node-0 frozen took " + reset.group(1) + " ms");
    }
}
