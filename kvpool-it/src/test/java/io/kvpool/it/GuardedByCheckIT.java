package io.kvpool.it;

import org.junit.jupiter.api.Test;

import java.io.File;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The build's lock-discipline check works: a tiny project that inherits the root pom (and so its
 * compiler settings and {@code .mvn/jvm.config}) is compiled by the Maven wrapper, offline (the
 * reactor around this test resolved everything it needs). Its one class reads a
 * {@code @GuardedBy("lock")} field once with the lock held and once without: the compile must fail,
 * naming Error Prone's GuardedBy check at the unguarded read and nowhere else. Without the check in
 * the root pom the project compiles and this test fails.
 */
class GuardedByCheckIT {

    private static final Path ROOT = Path.of("..").toAbsolutePath().normalize();

    private static final String POM = """
            <?xml version="1.0" encoding="UTF-8"?>
            <project xmlns="http://maven.apache.org/POM/4.0.0">
              <modelVersion>4.0.0</modelVersion>
              <parent>
                <groupId>io.kvpool</groupId>
                <artifactId>kvpool-parent</artifactId>
                <version>0.1.0-SNAPSHOT</version>
                <relativePath>%s</relativePath>
              </parent>
              <artifactId>guarded-by-fixture</artifactId>
            </project>
            """;

    /** Line 9 reads {@code count} under {@code lock}; line 14 reads it bare. */
    private static final String COUNTER = """
            package fixture;

            import com.google.errorprone.annotations.concurrent.GuardedBy;

            final class Counter {
                private final Object lock = new Object();
                @GuardedBy("lock") private long count;

                long locked() { synchronized (lock) { return count; } }

                void add() { synchronized (lock) { count++; } }

                long unlocked() {
                    return count;
                }
            }
            """;

    @Test
    void anUnguardedReadFailsTheCompile() throws IOException, InterruptedException {
        // inside the repository (under target/), so that Maven finds the root's .mvn directory above it
        Path fixture = Files.createTempDirectory(Files.createDirectories(Path.of("target")), "guarded-by-")
                .toAbsolutePath();
        Path sources = Files.createDirectories(fixture.resolve("src/main/java/fixture"));
        Files.writeString(fixture.resolve("pom.xml"), POM.formatted(fixture.relativize(ROOT.resolve("pom.xml"))));
        Files.writeString(sources.resolve("Counter.java"), COUNTER);

        List<String> cmd = new ArrayList<>(List.of(ROOT.resolve("mvnw").toString(), "-B", "-q", "-o", "compile"));
        String repo = System.getProperty("maven.repo.local");
        if (repo != null) {
            cmd.add("-Dmaven.repo.local=" + repo);
        }
        File log = fixture.resolve("build.log").toFile();
        ProcessBuilder pb = new ProcessBuilder(cmd).directory(fixture.toFile()).redirectErrorStream(true)
                .redirectOutput(log);
        pb.environment().put("JAVA_HOME", System.getProperty("java.home"));
        Process p = pb.start();
        if (!p.waitFor(5, TimeUnit.MINUTES)) {
            p.destroyForcibly();
            throw new AssertionError("the fixture's build ran past 5 minutes; its log: " + log);
        }
        String out = Files.readString(log.toPath(), StandardCharsets.UTF_8);

        assertThat(p.exitValue()).as("exit status of the fixture's build; its output:%n%s", out).isNotZero();
        assertThat(out).contains("Counter.java:[14,").contains("[GuardedBy]")
                .contains("This access should be guarded by 'this.lock'")
                .doesNotContain("Counter.java:[9,").doesNotContain("Counter.java:[11,");
    }
}
