package io.kvpool.bench;

import io.kvpool.node.NodeConfig;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * The benchmark's child processes (pools, failover masters and nodes): how they are stopped, what
 * their end means, and how a child notices its parent is gone.
 *
 * <h2>Leaving nothing behind</h2>
 * A node deletes its shared-memory segment file ({@code /dev/shm/kvpool-<name>-<pid>.seg}) when it
 * closes, which a SIGKILL does not let it do: the file then holds its memory until a later node
 * start reclaims it. So a child is stopped with SIGTERM (its shutdown hook closes its nodes), and
 * only one that does not exit within the grace gets SIGKILL. Whatever ended it (a SIGKILL from us,
 * from the kernel's OOM killer, a crash), once it is gone the files named with its pid are its own
 * leftovers and are deleted: a node names its file with its own pid, so no live process owns them
 * (the pid is checked to be free again just before).
 *
 * <h2>A parent that dies</h2>
 * A child started here reads its standard input, a pipe from the benchmark, until it ends: that
 * happens when the benchmark exits however it exits (even SIGKILL), and the child then exits
 * through its shutdown hooks. No pool outlives the run that started it.
 */
final class Children {

    /** How long a child has to exit after SIGTERM before it gets SIGKILL. */
    static final Duration GRACE = Duration.ofSeconds(10);

    private Children() {
    }

    /**
     * Stops {@code p}: SIGTERM, SIGKILL after {@link #GRACE}, then deletes the segment files it left
     * (if it could not delete them itself).
     */
    static void stop(Process p) throws InterruptedException {
        p.destroy();
        if (!p.waitFor(GRACE.toMillis(), TimeUnit.MILLISECONDS)) {
            p.destroyForcibly();
            p.waitFor(GRACE.toMillis(), TimeUnit.MILLISECONDS);
        }
        if (!p.isAlive()) {
            removeSegmentFiles(p.pid());
        }
    }

    /** Deletes the segment files of the dead process {@code pid} in the default shared-memory directory. */
    static void removeSegmentFiles(long pid) {
        Path dir = NodeConfig.DEFAULT_SHM_DIR;
        if (!Files.isDirectory(dir) || ProcessHandle.of(pid).map(ProcessHandle::isAlive).orElse(false)) {
            return;
        }
        try (DirectoryStream<Path> files = Files.newDirectoryStream(dir, "kvpool-*-" + pid + ".seg")) {
            for (Path f : files) {
                Files.deleteIfExists(f);
                // the node's registration beside it (what a restart would prove itself with): nothing without the segment
                Files.deleteIfExists(f.resolveSibling(f.getFileName() + ".registration"));
            }
        } catch (IOException e) {
            System.err.println("bench: cannot remove the segment files of pid " + pid + " in " + dir + ": " + e);
        }
    }

    /**
     * How a child ended, for a message: its exit code and, for a signal, which one and who usually
     * sends it.
     */
    static String describeExit(int code) {
        if (code == 137) {
            return "exit code 137: killed by SIGKILL (when nobody here sent it, the kernel's OOM killer did: the"
                    + " machine ran short of memory; see dmesg)";
        }
        if (code == 143) {
            return "exit code 143: stopped by SIGTERM";
        }
        if (code > 128 && code < 160) {
            return "exit code " + code + ": killed by signal " + (code - 128);
        }
        return "exit code " + code;
    }

    /**
     * In a child: runs {@code running} until stopped or until the parent is gone ({@link #exitWithParent}), closing
     * it on the way out; prints {@code ready PID} first.
     */
    static void serve(AutoCloseable running) throws InterruptedException {
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                running.close();
            } catch (Exception ignored) {
                // exiting
            }
        }));
        exitWithParent();
        System.out.println("ready " + ProcessHandle.current().pid());
        System.out.flush();
        new CountDownLatch(1).await();
    }

    /**
     * In a child: exits (through the shutdown hooks) once standard input ends, that is once the
     * parent that holds the pipe's other end is gone.
     */
    static void exitWithParent() {
        Thread t = new Thread(() -> {
            InputStream in = System.in;
            try {
                while (in.read() != -1) {
                    // nothing is sent on it: it only tells when the parent is gone
                }
            } catch (IOException ignored) {
                // the pipe broke: the parent is gone as well
            }
            System.exit(0);
        }, "exit-with-parent");
        t.setDaemon(true);
        t.start();
    }
}
