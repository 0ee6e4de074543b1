package io.kvpool.it;

import io.kvpool.bench.RollingRestartBench;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * {@code kvpool rolling-restart} on a pool {@code kvpool launch --local 3 --masters 2} runs (every
 * role its own process, etcd started by the launcher), with two clients getting and putting
 * throughout: both masters and the three nodes are restarted one at a time and the cache is kept.
 * The figures of the bench section come from the same drill.
 */
class RollingRestartIT {

    @Test
    void aRollingRestartKeepsTheCacheAndServesNoWrongByte(@TempDir Path dir) throws Exception {
        int objects = 600;
        RollingRestartBench.Outcome o = RollingRestartBench.drill(objects, 16 << 10, dir);
        System.out.println("rolling restart: " + o);
        Path notExact = dir.resolve("not-exact.txt");
        if (Files.exists(notExact)) { // the temporary directory goes with the test: say what missed here
            System.out.println("not byte-exact afterwards:\n" + Files.readString(notExact));
            Path launchLog = dir.resolve("launch.log");
            if (Files.exists(launchLog)) {
                List<String> lines = Files.readAllLines(launchLog);
                System.out.println("launcher log (last 200 lines):\n"
                        + String.join("\n", lines.subList(Math.max(0, lines.size() - 200), lines.size())));
            }
        }
        try {
            check(o, objects);
        } catch (AssertionError e) {
            // the temporary directory goes with the test: keep its logs for the diagnosis
            Path kept = Path.of("target", "it-logs", "RollingRestartIT-" + System.currentTimeMillis());
            copy(dir, kept);
            System.out.println("the drill's logs are kept in " + kept.toAbsolutePath());
            throw e;
        }
    }

    private static void check(RollingRestartBench.Outcome o, int objects) {
        assertThat(o.steps()).as("every master and node restarted").hasSize(5)
                .anyMatch(s -> s.startsWith("master-1 ")).anyMatch(s -> s.startsWith("master-2 "))
                .anyMatch(s -> s.startsWith("node-0 ")).anyMatch(s -> s.startsWith("node-2 "));
        assertThat(o.exactTwoCopies()).as("objects with two copies, byte-exact afterwards").isEqualTo(objects);
        assertThat(o.exactOneCopy()).as("objects with one copy (re-adopted), byte-exact afterwards: every one")
                .isEqualTo(objects);
        assertThat(o.wrongReads()).as("wrong bytes read during the restart").isZero();
        assertThat(o.acknowledgedLost()).as("acknowledged puts unreadable afterwards").isZero();
        assertThat(o.gets()).as("the clients ran throughout").isPositive();
    }

    private static void copy(Path from, Path to) throws java.io.UncheckedIOException {
        try (var files = Files.walk(from)) {
            for (Path f : (Iterable<Path>) files::iterator) {
                Path t = to.resolve(from.relativize(f).toString());
                if (Files.isDirectory(f)) {
                    Files.createDirectories(t);
                } else if (Files.isRegularFile(f) && !f.getFileName().toString().endsWith(".seg")) {
                    Files.copy(f, t);
                }
            }
        } catch (java.io.IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
    }
}
