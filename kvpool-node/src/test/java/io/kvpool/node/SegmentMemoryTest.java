package io.kvpool.node;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.lang.foreign.ValueLayout;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.time.Duration;
import java.time.InstantSource;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;

/** The shared-memory segment file: its lock, and reclaiming the files of nodes that died without closing. */
@Timeout(60) // a guard against hangs only; no assertion depends on timing
class SegmentMemoryTest {

    /** Above the largest pid_max Linux allows (2^22), so no process can have it. */
    private static final long IMPOSSIBLE_PID = (1L << 22) + 12345;
    private static final long MY_PID = ProcessHandle.current().pid();

    @TempDir
    Path dir;

    @Test
    void deletesFilesOfDeadPidsAndKeepsLiveOnes() throws Exception {
        long exited = exitedPid();
        Path dead = file("kvpool-seg-a-" + IMPOSSIBLE_PID + ".seg", 4096);
        Path deadDashes = file("kvpool-node-1-2-" + exited + ".seg", 1 << 20);
        Path mine = file("kvpool-seg-b-" + MY_PID + ".seg", 4096);

        assertThat(reclaimNow(dir)).isEqualTo(2);

        assertThat(dead).doesNotExist();
        assertThat(deadDashes).doesNotExist();
        assertThat(mine).exists();
        assertThat(reclaimNow(dir)).isZero();
    }

    @Test
    void keepsADeadPidsFileThatAnotherChannelInThisJvmHasLocked() throws Exception {
        Path locked = file("kvpool-seg-" + IMPOSSIBLE_PID + ".seg", 4096);
        try (FileChannel ch = FileChannel.open(locked, StandardOpenOption.READ, StandardOpenOption.WRITE);
             FileLock lock = ch.tryLock()) {
            assertThat(lock).isNotNull();
            // the scan's own tryLock throws OverlappingFileLockException: that means "locked, keep it"
            assertThat(reclaimNow(dir)).isZero();
            assertThat(locked).exists();
        }
    }

    @Test
    void keepsADeadPidsFileThatAnotherProcessHasLocked() throws Exception {
        Path locked = file("kvpool-seg-" + IMPOSSIBLE_PID + ".seg", 4096);
        Process holder = lockInChildProcess(locked);
        try {
            assertThat(reclaimNow(dir)).isZero();
            assertThat(locked).exists();
        } finally {
            holder.getOutputStream().close(); // the child exits at end of input, and its lock goes with it
            assertThat(holder.waitFor(30, TimeUnit.SECONDS)).isTrue();
        }
        assertThat(reclaimNow(dir)).isEqualTo(1);
        assertThat(locked).doesNotExist();
    }

    @Test
    void leavesEverythingElseAlone() throws Exception {
        Path[] others = {
                file("kvpool-" + IMPOSSIBLE_PID + ".seg", 10), // no name before the pid
                file("kvpool-seg.seg", 10),
                file("kvpool-seg-x" + IMPOSSIBLE_PID + ".seg", 10),
                file("kvpool-seg-" + IMPOSSIBLE_PID + ".seg.bak", 10),
                file("kvpool-seg-" + IMPOSSIBLE_PID + ".txt", 10),
                file("other-" + IMPOSSIBLE_PID + ".seg", 10),
                file("kvpool-seg-99999999999999999999999.seg", 10), // not a pid
        };
        Path subdir = Files.createDirectory(dir.resolve("kvpool-dir-" + IMPOSSIBLE_PID + ".seg"));
        Path target = file("target", 10);
        Path link = Files.createSymbolicLink(dir.resolve("kvpool-link-" + IMPOSSIBLE_PID + ".seg"), target);

        assertThat(reclaimNow(dir)).isZero();

        for (Path p : others) {
            assertThat(p).exists();
        }
        assertThat(subdir).isDirectory();
        assertThat(link).isSymbolicLink();
        assertThat(target).exists();
    }

    @Test
    void aMissingDirectoryIsNotAnError() {
        assertThat(reclaimNow(dir.resolve("absent"))).isZero();
    }

    @Test
    void allocateReclaimsOrphansAndLocksItsOwnFileUntilClosed() throws Exception {
        Path orphan = file("kvpool-old-" + IMPOSSIBLE_PID + ".seg", 1 << 20);
        Path own;
        try (SegmentMemory m = SegmentMemory.allocate(1 << 20, ShmDir.ownerOnly(dir).withOrphanGrace(Duration.ZERO),
                "seg/1", false, false)) {
            own = m.file();
            assertThat(orphan).as("no grace: reclaimed at once").doesNotExist();
            assertThat(own).isEqualTo(dir.resolve("kvpool-seg_1-" + MY_PID + ".seg"));
            assertThat(Files.size(own)).isEqualTo(1 << 20);
            m.segment().set(ValueLayout.JAVA_LONG, 8, 42L);
            assertThat(lockableFromChildProcess(own)).isFalse();
        }
        assertThat(own).doesNotExist();
    }

    @Test
    void allocateDoesNotTouchAFileAnotherProcessHoldsUnderItsName() throws Exception {
        Path own = file("kvpool-seg-" + MY_PID + ".seg", 4096);
        Files.write(own, "someone else's".getBytes(StandardCharsets.UTF_8));
        Process holder = lockInChildProcess(own);
        try (SegmentMemory m = SegmentMemory.allocate(1 << 20, dir, "seg", false)) {
            assertThat(m.file()).isNull(); // fell back to anonymous memory
        } finally {
            holder.getOutputStream().close();
            assertThat(holder.waitFor(30, TimeUnit.SECONDS)).isTrue();
        }
        assertThat(Files.readString(own)).isEqualTo("someone else's");
    }

    // ------------------------------------------------------------------ helpers

    /** Reclaims every orphan in {@code d} now (no grace). */
    private static int reclaimNow(Path d) {
        return new OrphanedSegments(d, Duration.ZERO, InstantSource.system()).reclaimExpired();
    }

    private Path file(String name, long size) throws IOException {
        Path p = dir.resolve(name);
        try (FileChannel ch = FileChannel.open(p, StandardOpenOption.CREATE_NEW, StandardOpenOption.WRITE)) {
            ch.truncate(0);
            ch.write(java.nio.ByteBuffer.wrap(new byte[1]), size - 1);
        }
        return p;
    }

    /** The pid of a process that has exited. */
    private static long exitedPid() throws Exception {
        Process p = new ProcessBuilder("true").start();
        assertThat(p.waitFor(30, TimeUnit.SECONDS)).isTrue();
        return p.pid();
    }

    /**
     * A child JVM that locks {@code file} (as a live node on another machine's pid namespace would),
     * prints "locked" and holds the lock until its standard input ends. With "probe" it only prints
     * whether the lock could be taken.
     */
    private static final String CHILD = """
            import java.nio.channels.FileChannel;
            import java.nio.file.Path;
            import java.nio.file.StandardOpenOption;
import java.time.Duration;
import java.time.InstantSource;
            public class LockChild {
                public static void main(String[] a) throws Exception {
                    try (FileChannel ch = FileChannel.open(Path.of(a[0]), StandardOpenOption.READ, StandardOpenOption.WRITE)) {
                        var lock = ch.tryLock();
                        System.out.println(lock == null ? "busy" : "locked");
                        System.out.flush();
                        if (a.length == 1) {
                            System.in.readAllBytes();
                        }
                    }
                }
            }
            """;

    private Process startChild(Path file, boolean probe) throws IOException {
        Path src = dir.resolve("child").resolve("LockChild.java");
        if (!Files.exists(src)) {
            Files.createDirectories(src.getParent());
            Files.writeString(src, CHILD);
        }
        String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
        ProcessBuilder pb = probe ? new ProcessBuilder(java, src.toString(), file.toString(), "probe")
                : new ProcessBuilder(java, src.toString(), file.toString());
        return pb.redirectError(ProcessBuilder.Redirect.INHERIT).start();
    }

    private static String firstLine(Process p) throws IOException {
        BufferedReader r = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8));
        return r.readLine();
    }

    private Process lockInChildProcess(Path file) throws IOException {
        Process p = startChild(file, false);
        assertThat(firstLine(p)).isEqualTo("locked");
        return p;
    }

    private boolean lockableFromChildProcess(Path file) throws Exception {
        Process p = startChild(file, true);
        String line = firstLine(p);
        assertThat(p.waitFor(30, TimeUnit.SECONDS)).isTrue();
        assertThat(line).isIn("locked", "busy");
        return line.equals("locked");
    }
}
