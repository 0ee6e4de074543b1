package io.kvpool.cli;

import java.io.IOException;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * What a command creates (an embedded pool, a node, an etcd), released exactly once however the
 * command ends: when it returns or throws ({@link #close}), or on SIGTERM or Ctrl-C, when the JVM
 * runs its shutdown hooks but no {@code finally} block of the threads still running. A node deletes
 * its shared-memory segment file when it closes; a command stopped by a signal used to leave the
 * file, and its memory, in {@code /dev/shm}.
 *
 * <h2>Stopped while starting</h2>
 * The hook is installed before anything is created, and each thing is {@link #add added} once
 * it exists. A signal can still land inside a constructor, after a node made its segment file and
 * before the node is there to close. So on the way out of the JVM the hook also deletes the segment
 * files named with this process's pid ({@code kvpool-<name>-<pid>.seg}) in the command's
 * shared-memory directory: a node names its file with its own pid, so those are this process's and
 * nobody else's, and the process is ending. Only the hook does that, never {@link #close}: a command
 * run inside a longer-lived JVM (tests call {@link Main#run}) must not touch that JVM's other nodes.
 *
 * <p>The release is synchronized: when the command's own end and the hook meet (a SIGTERM as the
 * command returns), the hook waits for the release already running, so the JVM does not halt
 * halfway through it.
 */
final class OnExit implements AutoCloseable {

    private final String command;
    private final Path shmDir;
    private final List<AutoCloseable> resources = new ArrayList<>();
    private final Thread hook;
    private boolean released;
    private volatile boolean keepFiles;

    private OnExit(String command, Path shmDir) {
        this.command = command;
        this.shmDir = shmDir;
        this.hook = new Thread(this::exit, "kvpool-" + command + "-shutdown");
    }

    /**
     * Installs the hook for {@code command}, whose nodes (if any) keep their segment files in
     * {@code shmDir} (null: none, or anonymous memory).
     */
    static OnExit start(String command, Path shmDir) {
        OnExit e = new OnExit(command, shmDir);
        Runtime.getRuntime().addShutdownHook(e.hook);
        return e;
    }

    /** Releases {@code resource} at the end (in reverse order of adding, like try-with-resources); returns it. */
    synchronized <T extends AutoCloseable> T add(T resource) {
        resources.add(resource);
        return resource;
    }

    private synchronized void release() {
        if (released) {
            return;
        }
        released = true;
        for (int i = resources.size() - 1; i >= 0; i--) {
            try {
                resources.get(i).close();
            } catch (Exception e) {
                System.err.println("kvpool " + command + ": error while stopping: " + e);
            }
        }
    }

    /**
     * The hook leaves this process's segment files alone: its node is stopping for a restart and
     * closed keeping its file for the next start to adopt ({@link RestartSignal}).
     */
    void keepSegmentFiles() {
        keepFiles = true;
    }

    /** The hook: release, then delete this process's segment files left by a node caught starting. */
    private void exit() {
        release();
        if (keepFiles || shmDir == null || !Files.isDirectory(shmDir)) {
            return;
        }
        try (DirectoryStream<Path> mine = Files.newDirectoryStream(shmDir,
                "kvpool-*-" + ProcessHandle.current().pid() + ".seg")) {
            for (Path f : mine) {
                Files.deleteIfExists(f);
            }
        } catch (IOException e) {
            System.err.println("kvpool " + command + ": cannot remove this process's segment files in " + shmDir
                    + ": " + e);
        }
    }

    @Override
    public void close() {
        try {
            Runtime.getRuntime().removeShutdownHook(hook);
        } catch (IllegalStateException shuttingDown) {
            // the hook is running or about to: release() below waits for it, or does it first
        }
        release();
    }
}
