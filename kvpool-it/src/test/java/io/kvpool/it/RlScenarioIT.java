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
 * engines, a trainer updating the weights every 3 steps. Its log must show each update, the reset
 * (or the key switch), rollouts under the new weights, and the hit rate back up after each update.
 */
class RlScenarioIT {

    private static final Pattern STEP = Pattern.compile("step +(\\d+) +weights (v\\d+) .* prefix hit +([0-9.]+)%");

    private static String run(String mode) throws Exception {
        Path script = Path.of(System.getProperty("user.dir")).getParent().resolve("scripts/rl-scenario.sh");
        Assumptions.assumeTrue(Files.isExecutable(script), "no " + script);
        Path out = Files.createTempFile("kvpool-rl", ".log");
        Process p = new ProcessBuilder("bash", script.toString(), mode, "7", "3").redirectErrorStream(true)
                .redirectOutput(out.toFile()).start();
        assertThat(p.waitFor(5, TimeUnit.MINUTES)).as("finished").isTrue();
        String log = Files.readString(out, StandardCharsets.UTF_8);
        System.out.println(log);
        assertThat(p.exitValue()).as(log).isZero();
        return log;
    }

    private static void assertRecovers(String log) {
        List<double[]> steps = new ArrayList<>();
        List<String> versions = new ArrayList<>();
        Matcher m = STEP.matcher(log);
        while (m.find()) {
            steps.add(new double[]{Double.parseDouble(m.group(1)), Double.parseDouble(m.group(3))});
            versions.add(m.group(2));
        }
        assertThat(steps).hasSize(7);
        assertThat(versions).containsExactly("v1", "v1", "v1", "v2", "v2", "v2", "v3");
        // the first step under new weights finds nothing of the old ones locally; the next is back up
        assertThat(steps.get(4)[1]).as("hit rate recovers after the update").isGreaterThan(steps.get(3)[1]);
        assertThat(steps.get(5)[1]).isGreaterThanOrEqualTo(steps.get(4)[1]);
    }

    @Test
    void weightUpdatesThroughTheResetCascade() throws Exception {
        String log = run("reset");
        assertThat(log).contains("ready: master").contains("weight update to v2").contains("weight update to v3")
                .contains("reset cascade done").contains("stopping the pool");
        assertRecovers(log);
    }

    @Test
    void weightUpdatesWithVersionedKeys() throws Exception {
        String log = run("versioned");
        assertThat(log).contains("weight update to v2").contains("versioned keys: engines now use v2 keys")
                .doesNotContain("reset cascade done");
        assertRecovers(log);
    }
}
