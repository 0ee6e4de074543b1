package io.kvpool.it;

import io.kvpool.cli.Main;
import io.kvpool.config.Size;
import io.kvpool.master.MasterConfig;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;

import static org.assertj.core.api.Assertions.assertThat;

/** The kvpool command line: exit codes, messages that name the bad flag, and the debugging commands. */
class CliIT {

    private static InProcessCluster cluster;

    @BeforeAll
    static void start() throws Exception {
        cluster = new InProcessCluster(1, Size.ofMiB(32));
    }

    @AfterAll
    static void stop() {
        cluster.close();
    }

    /** Exit code and everything printed. */
    private record Run(int code, String out, String err) {
    }

    private static synchronized Run run(String... args) {
        PrintStream oldOut = System.out;
        PrintStream oldErr = System.err;
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        ByteArrayOutputStream err = new ByteArrayOutputStream();
        try {
            System.setOut(new PrintStream(out, true, StandardCharsets.UTF_8));
            System.setErr(new PrintStream(err, true, StandardCharsets.UTF_8));
            int code = Main.run(args);
            return new Run(code, out.toString(StandardCharsets.UTF_8), err.toString(StandardCharsets.UTF_8));
        } finally {
            System.setOut(oldOut);
            System.setErr(oldErr);
        }
    }

    @Test
    void badFlagsAndValuesExitWithTwoAndNameTheFlag() {
        Run r = run("node", "--master", "127.0.0.1:1", "--segment-size", "8GB8");
        assertThat(r.code()).isEqualTo(2);
        assertThat(r.err()).contains("--segment-size").contains("8GB8");

        r = run("master", "--eviction-ratio", "2", "--port", "0", "--http-port", "-1");
        assertThat(r.code()).isEqualTo(2);
        assertThat(r.err()).contains("--eviction-ratio");

        r = run("node", "--master", "127.0.0.1:1", "--heartbeat-interval", "10");
        assertThat(r.code()).isEqualTo(2);
        assertThat(r.err()).contains("--heartbeat-interval").contains("unit");

        r = run("node", "--master", "127.0.0.1:1", "--orphan-grace", "-1s");
        assertThat(r.code()).isEqualTo(2);
        assertThat(r.err()).contains("--orphan-grace").contains("-1s");

        r = run("master", "--tenant", "a=kvp1/x/:lots", "--port", "0", "--http-port", "-1");
        assertThat(r.code()).isEqualTo(2);
        assertThat(r.err()).contains("--tenant").contains("bad size 'lots'");
        r = run("master", "--tenants-file", "/no/such/tenants.json", "--port", "0", "--http-port", "-1");
        assertThat(r.code()).isEqualTo(2);
        assertThat(r.err()).contains("--tenants-file").contains("/no/such/tenants.json");

        r = run("master", "--no-such-flag");
        assertThat(r.code()).isEqualTo(2);
        assertThat(r.err()).contains("--no-such-flag");

        r = run("status", "--master", "nohostport");
        assertThat(r.code()).isEqualTo(2);
        assertThat(r.err()).contains("--master");

        r = run("node", "--segment-size", "1GiB");
        assertThat(r.code()).isEqualTo(2);
        assertThat(r.err()).contains("--master");

        r = run("rm", "--master", cluster.masterAddress());
        assertThat(r.code()).isEqualTo(2);
        r = run("rm", "somekey", "--force", "--master", cluster.masterAddress());
        assertThat(r.code()).isEqualTo(2);
        assertThat(r.err()).contains("--force");

        r = run("frobnicate");
        assertThat(r.code()).isEqualTo(2);
    }

    @Test
    void aSegmentLargerThanTheMachineIsABadFlag() {
        Run r = run("node", "--master", "127.0.0.1:1", "--host", "127.0.0.1", "--port", "0", "--segment-size", "99999TiB");
        assertThat(r.code()).isEqualTo(2);
        assertThat(r.err()).contains("--segment-size").contains("is more than this machine's memory");
    }

    /** Each command's counts and sizes against their bounds and this machine, before anything starts (issue 25). */
    @Test
    void countsAndSizesBeyondWhatTheMachineHoldsAreBadFlagsNamingTheValueAndTheBound() {
        expectBad(run("node", "--master", "127.0.0.1:1", "--host", "127.0.0.1", "--port", "0", "--max-connections",
                "2000000000"), "--max-connections 2000000000 is out of range: 1 to ", "ulimit -n");
        expectBad(run("serve", "--node-port", "70000"), "--node-port 70000 is out of range: 0 to 65535");
        expectBad(run("engine", "--port", "0", "--kv-blocks", "2000000000"), "--kv-blocks 2000000000 of --block-size 16",
                "more than this machine's");
        expectBad(run("engine", "--port", "0", "--block-size", "100000"), "--block-size 100000 is out of range: 1 to 4096");
        // 10^6 turns of 3,000 tokens wrapped around (in int) to a prompt that seemed to fit the context
        expectBad(run("demo", "--conversations", "1", "--turns", "1000000", "--user-tokens", "3000"),
                "--turns 1000000", "does not fit the model's context");
        expectBad(run("demo", "--concurrency", "100000"), "--concurrency 100000 is out of range: 1 to 1024");
        expectBad(run("demo", "--kv-granularity", "page"), "--kv-granularity must be block or layer, got 'page'");
        expectBad(run("pool-demo", "--turns", "1000", "--turn-blocks", "100"), "--turn-blocks 100",
                "a last prompt of 100012 blocks, more than 4096");
        expectBad(run("soak", "--segment-size", "99999TiB"), "--segment-size 99999TiB for each of the 3 nodes",
                "more than this machine's");
        expectBad(run("trainer", "--engines", "http://127.0.0.1:1", "--rollouts", "100000"),
                "--rollouts 100000 is out of range: 1 to 1024");
        expectBad(run("trainer", "--engines", "http://127.0.0.1:1", "--steps", "5", "--update-every", "2", "--fault",
                "3:true"), "--fault: K:COMMAND with K a weight update from 1 to 2", "got '3:true'");
        expectBad(run("status", "--watch", "1s", "--frames", "-1"), "--frames -1 must be at least 0");
        expectBad(run("bench", "--only", "nosuch"), "--only nosuch: no such section");
        expectBad(run("offload-config", "--block-size", "0"), "--block-size 0 is out of range: 1 to 4096");
    }

    private static void expectBad(Run r, String... says) {
        assertThat(r.code()).as("exit code; stderr: %s", r.err()).isEqualTo(2);
        for (String s : says) {
            assertThat(r.err()).contains(s);
        }
    }

    @Test
    void aShmGroupTheMachineDoesNotHaveOrWithoutAFileFailsTheNodesStartNamingIt() {
        Run r = run("node", "--master", "127.0.0.1:1", "--host", "127.0.0.1", "--port", "0",
                "--shm-group", "no-such-group-kvpool-cli");
        assertThat(r.code()).isEqualTo(2);
        assertThat(r.err()).contains("--shm-group no-such-group-kvpool-cli: no such group on this machine");
        r = run("node", "--master", "127.0.0.1:1", "--host", "127.0.0.1", "--port", "0", "--shm-dir", "none",
                "--shm-group", "users");
        assertThat(r.code()).isEqualTo(2);
        assertThat(r.err()).contains("--shm-group users needs a shared-memory directory");
    }

    @Test
    void aServerOnAPublicAddressWithoutSecretsRefusesToStartAndSaysHowToSetThem() throws Exception {
        Run r = run("master", "--port", "0", "--http-port", "-1"); // the master listens on 0.0.0.0 by default
        assertThat(r.code()).isEqualTo(2);
        assertThat(r.err()).contains("refusing to listen on 0.0.0.0 without a cluster secret").contains("--secret-file")
                .contains("KVPOOL_SECRET_FILE").contains("--insecure");
        r = run("node", "--master", "127.0.0.1:1", "--host", "0.0.0.0", "--port", "0");
        assertThat(r.code()).isEqualTo(2);
        assertThat(r.err()).contains("refusing to listen on 0.0.0.0");
        // --insecure lets it past that check (here it then stops at a bad flag of its own)
        r = run("master", "--insecure", "--eviction-ratio", "2", "--port", "0", "--http-port", "-1");
        assertThat(r.code()).isEqualTo(2);
        assertThat(r.err()).contains("--eviction-ratio").doesNotContain("refusing to listen");
        // an engine's API on a public address needs its token
        r = run("engine", "--host", "0.0.0.0", "--port", "0", "--model", "tiny");
        assertThat(r.code()).isEqualTo(2);
        assertThat(r.err()).contains("refusing to serve the engine API on 0.0.0.0 without a token")
                .contains("KVPOOL_ENGINE_TOKEN_FILE");
        // the two secret files go together, and a short secret is named as such
        Path dir = Files.createTempDirectory("kvpool-cli-secrets");
        Path shortSecret = Files.writeString(dir.resolve("short"), "tooshort\n");
        r = run("master", "--port", "0", "--http-port", "-1", "--secret-file", shortSecret.toString());
        assertThat(r.code()).isEqualTo(2);
        assertThat(r.err()).contains("--secret-file and --admin-secret-file go together");
        r = run("master", "--port", "0", "--http-port", "-1", "--secret-file", shortSecret.toString(),
                "--admin-secret-file", shortSecret.toString());
        assertThat(r.code()).isEqualTo(2);
        assertThat(r.err()).contains("has 8 characters; it needs at least 16").doesNotContain("tooshort");
    }

    @Test
    void aRandomValueTooLargeToStoreIsABadValueCheckedBeforeAllocating() {
        // more than one array can hold: refused before connecting, so no --master is needed
        Run r = run("put", "k", "--random", "3GiB");
        assertThat(r.code()).isEqualTo(2);
        assertThat(r.err()).contains("--random").contains("3GiB").contains("" + (Integer.MAX_VALUE - 8))
                .doesNotContain("overflow");

        // more than the master accepts: refused before the bytes are made
        String limit = MasterConfig.DEFAULT_MAX_VALUE_SIZE.toString();
        r = run("put", "k", "--random", "1GiB", "--master", cluster.masterAddress());
        assertThat(r.code()).isEqualTo(2);
        assertThat(r.err()).contains("--random").contains("1GiB").contains(limit).contains("--max-value-size");
        assertThat(run("get", "k", "--master", cluster.masterAddress()).code()).isEqualTo(1);
    }

    @Test
    void unreachableMasterIsARuntimeFailureNamingIt() {
        Run r = run("status", "--master", "127.0.0.1:1");
        assertThat(r.code()).isEqualTo(1);
        assertThat(r.err()).contains("127.0.0.1:1");
    }

    @Test
    void putGetStatusAndRemove() {
        String m = cluster.masterAddress();
        Run r = run("put", "cli/one", "--value", "hello kv", "--master", m);
        assertThat(r.code()).isZero();
        assertThat(r.out()).contains("OK");
        assertThat(run("put", "cli/one", "--value", "again", "--master", m).out()).contains("ALREADY_EXISTS");
        assertThat(run("put", "cli/one", "--value", "again", "--upsert", "--master", m).code()).isZero();

        r = run("get", "cli/one", "--master", m);
        assertThat(r.code()).isZero();
        assertThat(r.out()).isEqualTo("again");
        assertThat(run("get", "cli/none", "--master", m).code()).isEqualTo(1);

        assertThat(run("put", "cli/two", "--random", "100KiB", "--master", m).code()).isZero();
        r = run("status", "--master", m);
        assertThat(r.code()).isZero();
        assertThat(r.out()).contains(cluster.nodes.getFirst().name()).contains("active").contains("SEGMENT")
                .contains("keys 2");

        assertThat(run("rm", "cli/one", "--master", m).code()).isZero();
        assertThat(run("rm", "cli/one", "--master", m).code()).isEqualTo(1);
        assertThat(run("rm", "--prefix", "cli/", "--master", m).out()).contains("removed 1 objects");
        assertThat(run("put", "cli/three", "--value", "x", "--master", m).code()).isZero();
        r = run("rm", "--all", "--force", "--master", m);
        assertThat(r.code()).isZero();
        assertThat(r.out()).contains("removed 1 objects").contains("fenced");
    }

    @Test
    void statusWatchRedrawsWithChangesSinceTheLastFrame() {
        String m = cluster.masterAddress();
        // not a terminal here: each frame follows the last, headed by its time
        Run r = run("status", "--master", m, "--watch", "100ms", "--frames", "2");
        assertThat(r.code()).as(r.err()).isZero();
        assertThat(r.out().split("kvpool status ", -1)).as(r.out()).hasSize(3);
        assertThat(r.out()).contains("every 100ms").contains("SEGMENT").contains("/s)");
        assertThat(r.out()).doesNotContain("\033[");
        Run bad = run("status", "--master", m, "--watch", "0s");
        assertThat(bad.code()).isEqualTo(2);
        assertThat(bad.err()).contains("--watch interval must be positive, got 0s");
    }

    @Test
    void helpAndVersion() {
        Run r = run("--help");
        assertThat(r.code()).isZero();
        assertThat(r.out()).contains("serve").contains("master").contains("node").contains("demo");
        assertThat(run("--version").out()).contains("kvpool");
    }
}
