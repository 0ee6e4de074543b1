package io.kvpool.node.disk;

import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.TreeMap;

/**
 * The store's log files and the end of the log: the files by number, the active one (the only one
 * appended to), the next file number, and the bytes the files take. Hands out positions at the end of
 * the active file, block-aligned where a run starts, and starts the next file when one is full.
 *
 * <p>Threads and lock: only the writer thread creates files, claims bytes in them and retires them;
 * other threads read the set (stats, close). Every field here, and each file's {@code size} and
 * {@code pinned}, is guarded by the store's lock ({@link DiskIndex#lock}); creating a file and forcing
 * the directory happen outside it.
 *
 * <p>Invariants:
 * <ul>
 *   <li>{@code usedBytes} is the sum of the sizes of the files in the set; a file's size is the bytes
 *       handed out in it, padding included (its writes may not have finished).</li>
 *   <li>{@code active} is in the set, or null: the next append starts a new file.</li>
 *   <li>A retired file is out of the set and never written again; it is closed and deleted by whoever
 *       ends its last read (at once if it has none): compaction never deletes a file under a reader.</li>
 * </ul>
 */
final class LogFiles {

    private final DiskIndex index;
    private final Path dir;
    private final long fileBytes;
    private final int ioBlock;

    // ---- guarded by index.lock ----
    final TreeMap<Integer, DataFile> byId = new TreeMap<>();
    /** The file appends go to; null until the next append starts a new one. */
    DataFile active;
    int nextFileId;
    long usedBytes;

    LogFiles(DiskIndex index, Path dir, long fileBytes, int ioBlock) {
        this.index = index;
        this.dir = dir;
        this.fileBytes = fileBytes;
        this.ioBlock = ioBlock;
    }

    /** The file to append {@code n} bytes to: the active one, or a new one if it is full. Writer only. */
    DataFile appendTarget(long n) throws IOException {
        index.lock.lock();
        try {
            if (active != null && active.size > 0 && active.size + n > fileBytes) {
                active = null; // full: stays as it is, a compaction candidate from now on
            }
            if (active != null) {
                return active;
            }
        } finally {
            index.lock.unlock();
        }
        int id = index.locked(() -> nextFileId++);
        DataFile f = DataFile.create(dir, id);
        DiskIo.forceDirectory(dir);
        index.withLock(() -> {
            byId.put(f.id, f);
            active = f;
        });
        return f;
    }

    /**
     * Hands out {@code n} bytes at the end of {@code f}; with {@code newRun}, at the next block boundary
     * (the bytes skipped are zeros: padding, in the used bytes). With {@code pin}, {@code f} is not
     * compacted until the writer unpins it. Writer only.
     */
    long claim(DataFile f, long n, boolean pin, boolean newRun) {
        index.lock.lock();
        try {
            if (newRun) {
                padTo(f, DiskIo.alignUp(f.size, ioBlock));
            }
            long pos = f.size;
            f.size += n;
            usedBytes += n;
            if (pin) {
                f.pinned = true;
            }
            return pos;
        } finally {
            index.lock.unlock();
        }
    }

    /**
     * A run ending at {@code runEnd} of {@code f} is written padded to a whole block: its file takes the
     * padding too, unless something followed. Writer only.
     */
    void padRun(DataFile f, long runEnd) {
        index.withLock(() -> {
            if (f.size == runEnd) {
                padTo(f, DiskIo.alignUp(f.size, ioBlock));
            }
        });
    }

    /** Under lock. */
    private void padTo(DataFile f, long aligned) {
        usedBytes += aligned - f.size;
        f.size = aligned;
    }

    long sizeOf(DataFile f) {
        return index.locked(() -> f.size);
    }

    long used() {
        return index.locked(() -> usedBytes);
    }

    /** The files now, for forcing them all at close. */
    List<DataFile> all() {
        return index.locked(() -> List.copyOf(byId.values()));
    }

    /**
     * Takes a file out of the store (under lock). Returns it if it is to be closed and deleted now
     * (outside the lock); else its last reader does that.
     */
    DataFile retire(DataFile f) {
        f.retired = true;
        byId.remove(f.id);
        usedBytes -= f.size;
        if (active == f) {
            active = null;
        }
        return f.readers == 0 ? f : null;
    }

    /**
     * At close (under lock): the files to close now; those with reads in progress are closed by their
     * last reader instead.
     */
    List<DataFile> closeOrDefer() {
        List<DataFile> toClose = new ArrayList<>();
        for (DataFile f : byId.values()) {
            if (f.readers == 0) {
                toClose.add(f);
            } else {
                f.closeWhenIdle = true;
            }
        }
        return toClose;
    }

    /** After a failed open, when no other thread has the store: closes every file. */
    void closeAll() {
        for (DataFile f : byId.values()) {
            f.close();
        }
    }
}
