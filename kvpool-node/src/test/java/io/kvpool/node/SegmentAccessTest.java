package io.kvpool.node;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFileAttributes;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.List;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

/**
 * Who may open a segment file: the node's user alone by default, or a group the operator chose. The
 * group tests create a group of their own (they need root, as on the build machines, and groupadd),
 * check a real segment file's mode and group, and open it as another user (nobody) with and without
 * membership of that group (setpriv).
 */
@Timeout(60) // a guard against hangs only; no assertion depends on timing
class SegmentAccessTest {

    private static final long SIZE = 1 << 20;
    /** Above the largest pid_max Linux allows (2^22), so no process can have it: a previous run's pid. */
    private static final long IMPOSSIBLE_PID = (1L << 22) + 12345;
    /** A group made for these tests, deleted after them; null when this machine cannot make one. */
    private static String group;

    @TempDir
    Path dir;

    @BeforeAll
    static void makeGroup() throws Exception {
        if (!isRoot() || !Files.isExecutable(Path.of("/usr/sbin/groupadd"))) {
            return;
        }
        String name = "kvpool-t" + ProcessHandle.current().pid();
        if (run(List.of("/usr/sbin/groupadd", name)) == 0) {
            group = name;
        }
    }

    @AfterAll
    static void deleteGroup() throws Exception {
        if (group != null) {
            run(List.of("/usr/sbin/groupdel", group));
        }
    }

    @Test
    void byDefaultTheFileIsTheNodeUsersAlone() throws Exception {
        try (SegmentMemory m = SegmentMemory.allocate(SIZE, ShmDir.ownerOnly(dir), "127.0.0.1:1", false, true)) {
            assertThat(mode(m.file())).isEqualTo("rw-------");
            assertThat(m.file().getFileName().toString()).endsWith(".seg");
        }
    }

    @Test
    void withAGroupTheFileIsThatGroupsToReadAndWrite() throws Exception {
        assumeTrue(group != null, "needs root and groupadd");
        try (SegmentMemory m = SegmentMemory.allocate(SIZE, new ShmDir(dir, group), "127.0.0.1:2", false, true)) {
            assertThat(mode(m.file())).isEqualTo("rw-rw----");
            assertThat(groupOf(m.file())).isEqualTo(group);
            assertThat(lockableByAnotherProcess(m.file())).as("setting the group kept the node's lock").isFalse();
            if (Files.isExecutable(Path.of("/usr/bin/setpriv"))) {
                Files.setPosixFilePermissions(dir, PosixFilePermissions.fromString("rwx--x--x")); // let nobody reach it
                assertThat(openAsNobody(m.file(), true)).as("nobody, in the group").isZero();
                assertThat(openAsNobody(m.file(), false)).as("nobody, not in the group").isNotZero();
            }
        }
    }

    @Test
    void anAdoptedFileGetsTheCurrentSettingWhateverItHad() throws Exception {
        assumeTrue(group != null, "needs root and groupadd");
        String name = "127.0.0.1:3";
        Path previous = dir.resolve("kvpool-127.0.0.1_3-" + IMPOSSIBLE_PID + ".seg");
        // a previous run's file, left world-readable by an old build: adopted as the group's
        try (SegmentMemory m = SegmentMemory.allocate(SIZE, dir, name, false)) {
            Files.copy(m.file(), previous);
        }
        Files.setPosixFilePermissions(previous, PosixFilePermissions.fromString("rw-r--r--"));
        try (SegmentMemory m = SegmentMemory.allocate(SIZE, new ShmDir(dir, group), name, false, true)) {
            assertThat(m.adopted()).isTrue();
            assertThat(mode(m.file())).isEqualTo("rw-rw----");
            assertThat(groupOf(m.file())).isEqualTo(group);
            assertThat(lockableByAnotherProcess(m.file())).as("setting the group kept the node's lock").isFalse();
            Files.copy(m.file(), previous);
        }
        // and a group's file, adopted by a node started without the group: its user's alone again
        Files.setPosixFilePermissions(previous, PosixFilePermissions.fromString("rw-rw----"));
        try (SegmentMemory m = SegmentMemory.allocate(SIZE, ShmDir.ownerOnly(dir), name, false, true)) {
            assertThat(m.adopted()).isTrue();
            assertThat(mode(m.file())).isEqualTo("rw-------");
        }
    }

    @Test
    void anUnknownGroupFailsTheStartNamingItAndTouchesNothing() throws Exception {
        Path leftover = Files.createFile(dir.resolve("kvpool-old-" + IMPOSSIBLE_PID + ".seg"));
        assertThatThrownBy(() -> SegmentMemory.allocate(SIZE, new ShmDir(dir, "no-such-group-kvpool"), "n", false, true))
                .isInstanceOf(IllegalArgumentException.class)
                .hasMessageContaining("--shm-group no-such-group-kvpool: no such group on this machine");
        assertThat(leftover).as("not even orphans are reclaimed before the check").exists();
        try (var files = Files.list(dir)) {
            assertThat(files.toList()).containsExactly(leftover);
        }
    }

    @Test
    void theConfigKeepsTheGroupWithTheDirectoryAndRefusesABlankOne() {
        NodeConfig c = NodeConfig.defaults(io.kvpool.config.HostPort.parse("127.0.0.1:1"),
                io.kvpool.config.Size.ofMiB(8));
        assertThat(c.shmDir()).isEqualTo(ShmDir.ownerOnly(NodeConfig.DEFAULT_SHM_DIR));
        NodeConfig grouped = c.withShm(new ShmDir(dir, "users")).withShmDir(dir.resolve("other"));
        assertThat(grouped.shmDir()).isEqualTo(new ShmDir(dir.resolve("other"), "users"));
        assertThat(grouped.withShmDir(null).shmDir()).isNull();
        assertThatThrownBy(() -> new ShmDir(dir, " ")).hasMessageContaining("--shm-group must be a group name");
    }

    // ------------------------------------------------------------------ helpers

    private static String mode(Path f) throws IOException {
        return PosixFilePermissions.toString(Files.getPosixFilePermissions(f, LinkOption.NOFOLLOW_LINKS));
    }

    private static String groupOf(Path f) throws IOException {
        return Files.readAttributes(f, PosixFileAttributes.class, LinkOption.NOFOLLOW_LINKS).group().getName();
    }

    /** Opens {@code f} for reading and writing as user nobody, in the test's group or in none; the exit code. */
    private static int openAsNobody(Path f, boolean inGroup) throws Exception {
        String gid = new String(new ProcessBuilder("getent", "group", group).start().getInputStream().readAllBytes())
                .split(":")[2].trim();
        return run(List.of("/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                inGroup ? "--groups=" + gid : "--clear-groups", "sh", "-c", "exec 3<>\"$0\"", f.toString()));
    }

    /** Whether another process can take the POSIX record lock the node holds on {@code f} (Python's lockf). */
    private static boolean lockableByAnotherProcess(Path f) throws Exception {
        assumeTrue(Files.isExecutable(Path.of("/usr/bin/python3")), "needs python3 to probe the lock");
        int code = run(List.of("/usr/bin/python3", "-c", "import fcntl, sys\nf = open(sys.argv[1], 'r+b')\n"
                + "try:\n    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept OSError:\n    sys.exit(3)", f.toString()));
        assertThat(code).as("the probe ran").isIn(0, 3);
        return code == 0;
    }

    private static boolean isRoot() throws Exception {
        return new String(new ProcessBuilder("id", "-u").start().getInputStream().readAllBytes()).trim().equals("0");
    }

    private static int run(List<String> command) throws Exception {
        Process p = new ProcessBuilder(command).redirectErrorStream(true).redirectOutput(ProcessBuilder.Redirect.DISCARD)
                .start();
        assertThat(p.waitFor(30, TimeUnit.SECONDS)).as("%s finished", command).isTrue();
        return p.exitValue();
    }
}
