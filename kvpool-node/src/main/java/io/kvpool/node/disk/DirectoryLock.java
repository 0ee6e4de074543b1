package io.kvpool.node.disk;

import java.io.IOException;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * A store's exclusive claim on its directory, against other stores in this process and in others.
 *
 * <p>Two layers, checked in this order:
 * <ol>
 *   <li>{@link #OPEN_DIRS}, the directories (by real path) opened by a store in this process. Checked
 *       before the lock file is even opened: on POSIX, closing any descriptor of a file drops the
 *       process's lock on it, so a second store must not open (and close) the lock file of a first
 *       one.</li>
 *   <li>{@value #LOCK_FILE} in the directory, held with {@link FileChannel#tryLock} while the store is
 *       open: another process's store finds it locked.</li>
 * </ol>
 * Invariant: a directory is in {@code OPEN_DIRS} exactly while one store holds it (from a successful
 * {@link #acquire} to {@link #release}); a failed acquire leaves nothing behind. Thread-safe; created
 * and released by the store's opening and closing thread.
 */
final class DirectoryLock {

    static final String LOCK_FILE = "kvpool-disk.lock";
    /** Directories opened by a store in this process (see the class comment). */
    private static final Set<Path> OPEN_DIRS = ConcurrentHashMap.newKeySet();

    private final Path realDir;
    private final FileChannel channel;
    private final FileLock lock;

    private DirectoryLock(Path realDir, FileChannel channel, FileLock lock) {
        this.realDir = realDir;
        this.channel = channel;
        this.lock = lock;
    }

    /**
     * Creates {@code dir} if missing and claims it.
     *
     * @throws IOException if it cannot be created, or another store in this process or another has it
     */
    static DirectoryLock acquire(Path dir) throws IOException {
        Files.createDirectories(dir);
        Path realDir = dir.toRealPath();
        if (!OPEN_DIRS.add(realDir)) {
            throw new IOException("disk tier directory " + dir + " is in use by another store in this process");
        }
        FileLock l = null;
        FileChannel lc = null;
        try {
            lc = FileChannel.open(dir.resolve(LOCK_FILE), StandardOpenOption.CREATE, StandardOpenOption.WRITE);
            l = lc.tryLock();
            if (l == null) {
                throw new IOException("disk tier directory " + dir + " is in use by another process (" + LOCK_FILE
                        + " is locked)");
            }
        } catch (Throwable e) {
            if (lc != null) {
                lc.close();
            }
            OPEN_DIRS.remove(realDir);
            throw e;
        }
        return new DirectoryLock(realDir, lc, l);
    }

    /** Releases the lock file and the process's claim; the claim goes even if the release fails. */
    void release() throws IOException {
        try {
            lock.release();
            channel.close();
        } finally {
            OPEN_DIRS.remove(realDir);
        }
    }
}
