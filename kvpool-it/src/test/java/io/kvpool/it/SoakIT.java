package io.kvpool.it;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.junit.jupiter.api.Test;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The short form of {@code kvpool soak}: the real command in its own process, starting its own etcd,
 * two elected masters and three nodes, for 75 s with every kind of chaos (node kill with repair,
 * leader failover, partition); the soak runs each kind at least once however slow the machine is.
 * Asserts from its JSON report: no wrong bytes, no phantom or refused-put reads, no acknowledged
 * object lost, no eviction, each chaos kind ran, repair finished after every node kill, and calls
 * returned after every event.
 *
 * <p>Stale reads (a removed version read again) count as wrong reads: the soak found them (a node
 * that missed a removal listed the removed object again; docs/soak.md, "Findings"), and they are
 * fixed. Prints the seed; replay with {@code -Dkvpool.soak.seed=N}.
 */
class SoakIT {

    @Test
    void verifiedTrafficSurvivesNodeKillsFailoverAndPartitions() throws Exception {
        Path logs = Path.of("target", "it-logs", "soak").toAbsolutePath();
        Files.createDirectories(logs);
        // skip only where etcd cannot be installed, as the other HA tests do (an etcd that is installed
        // but does not start fails here, naming why, rather than inside the soak)
        try (EtcdProcess probe = new EtcdProcess(logs.resolve("etcd-probe"))) {
            probe.start();
        }

        long seed = Long.getLong("kvpool.soak.seed", System.nanoTime());
        System.out.println("SoakIT: seed " + seed + " (replay with -Dkvpool.soak.seed=" + seed + ")");
        Path report = logs.resolve("report.json");
        Files.deleteIfExists(report);
        List<String> args = new ArrayList<>(List.of("soak", "--duration", "75s", "--clients", "4", "--keys", "512",
                "--max-value", "32KiB", "--segment-size", "64MiB", "--node-kill-every", "25s", "--node-down", "2s",
                "--failover-every", "30s", "--partition-every", "20s", "--partition-length", "3s",
                "--progress-every", "15s", "--seed", "" + seed, "--log-dir", logs.resolve("pool").toString(),
                "--report-json", report.toString()));
        List<String> cmd = ProcessCluster.javaCommand("io.kvpool.cli.Main", args);
        cmd.set(cmd.indexOf("-Xmx256m"), "-Xmx768m");
        ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(true)
                .redirectOutput(logs.resolve("soak.out").toFile());
        pb.environment().put("KVPOOL_HOME", Path.of("..").toAbsolutePath().normalize().toString());
        Process p = pb.start();
        if (!p.waitFor(15, TimeUnit.MINUTES)) {
            p.destroyForcibly();
            throw new AssertionError("kvpool soak did not finish; see " + logs.resolve("soak.out"));
        }
        String out = Files.readString(logs.resolve("soak.out"));
        System.out.println(out);
        assertThat(report).as("the JSON report (output above)").exists();
        JsonNode r = new ObjectMapper().readTree(report.toFile());

        assertThat(r.get("wrongBytes").asLong()).as("wrong bytes").isZero();
        assertThat(r.get("phantom").asLong()).as("reads of a version never put").isZero();
        assertThat(r.get("refusedVisible").asLong()).as("reads of a put that answered it stored nothing").isZero();
        assertThat(r.get("stale").asLong()).as("stale reads (a removed version read again)").isZero();
        assertThat(r.get("acknowledgedLost").asLong()).as("acknowledged objects lost").isZero();
        assertThat(r.get("evictions").asLong()).as("evictions (would make misses ambiguous)").isZero();
        assertThat(r.get("acknowledged").asLong()).as("acknowledged puts").isPositive();
        assertThat(r.get("hits").asLong()).as("reads that found a value").isPositive();
        for (String kind : List.of("node-kill", "failover", "partition")) {
            long n = 0;
            for (JsonNode e : r.get("events")) {
                if (e.get("kind").asText().equals(kind)) {
                    n++;
                }
            }
            assertThat(n).as("%s events", kind).isPositive();
        }
        for (JsonNode e : r.get("events")) {
            assertThat(e.get("resumeMillis").asLong()).as("traffic resumed after %s", e).isNotNegative();
            assertThat(e.get("callsAfter").asLong()).as("calls returned after %s", e).isPositive();
            if (e.get("kind").asText().equals("node-kill")) {
                assertThat(e.get("repairMillis").asLong()).as("repair finished after %s", e).isNotNegative();
            }
        }
        List<String> failures = new ArrayList<>();
        r.get("failures").forEach(f -> failures.add(f.asText()));
        assertThat(failures).as("the soak's own verdict").isEmpty();
        assertThat(p.exitValue()).as("exit code").isZero();
    }
}
