package io.kvpool.node.disk;

import io.kvpool.protocol.ObjectLayout;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Stream;

/**
 * Rebuilds the index when a store opens: one sequential scan of every log file in the directory, in
 * file-number order, with a {@link LogScanner}.
 *
 * <ul>
 *   <li>Live records go to {@link DiskIndex#admitScanned}, tombstones to {@link DiskIndex#deadScanned}:
 *       the last record of a generation in append order decides, and the copies it overrides get
 *       tombstones, written by the writer's first pass.</li>
 *   <li>Garbage after a file's last valid record (a torn append) is truncated away.</li>
 *   <li>Files left empty are deleted; the newest file becomes the active one if it has room.</li>
 * </ul>
 * Runs on the opening thread before the writer starts, so it touches the index and the file set
 * without the store's lock: no other thread can see them yet.
 */
final class Recovery {

    /** Logs as the store: the tier's messages keep one logger name. */
    private static final Logger log = LoggerFactory.getLogger(DiskStore.class);

    private Recovery() {
    }

    /** Scans {@code dir} into {@code index} and {@code files}, using {@code buf} (at least 1 MiB) to read. */
    @SuppressWarnings("GuardedBy") // runs before the store is shared: no other thread can see the index yet
    static void open(Path dir, long fileBytes, DiskIndex index, LogFiles files, MemorySegment buf) throws IOException {
        List<Path> found = new ArrayList<>();
        try (Stream<Path> s = Files.list(dir)) {
            s.filter(p -> DataFile.idOf(p) >= 0 && Files.isRegularFile(p)).forEach(found::add);
        }
        for (Path p : found) {
            DataFile f = DataFile.open(p, DataFile.idOf(p));
            files.byId.put(f.id, f);
        }
        LogScanner scanner = new LogScanner(buf);
        for (DataFile f : List.copyOf(files.byId.values())) {
            files.nextFileId = Math.max(files.nextFileId, f.id + 1);
            long size = f.channelSize();
            LogScanner.Result r = scanner.scan(f, size, new LogScanner.Visitor() {
                @Override
                public void live(long offset, ObjectLayout.Header h) {
                    index.admitScanned(f, offset, h);
                }

                @Override
                public void dead(long offset, ObjectLayout.Header h) {
                    index.deadScanned(h);
                }
            });
            index.skippedRecords += r.skipped();
            if (r.validEnd() < size) {
                log.warn("disk tier: {} has {} bytes of garbage after its last valid record at {}; truncated",
                        f.path, size - r.validEnd(), r.validEnd());
                f.truncate(r.validEnd());
            }
            f.size = r.validEnd();
            files.usedBytes += f.size;
        }
        for (DataFile f : List.copyOf(files.byId.values())) {
            if (f.size == 0) {
                files.byId.remove(f.id);
                f.closeAndDelete();
            }
        }
        if (!files.byId.isEmpty() && files.byId.lastEntry().getValue().size < fileBytes) {
            files.active = files.byId.lastEntry().getValue();
        }
        files.nextFileId = Math.max(files.nextFileId, 1);
        index.housekeepingWanted = index.hasTombs();
    }
}
