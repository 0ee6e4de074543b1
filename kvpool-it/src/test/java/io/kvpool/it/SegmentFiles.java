package io.kvpool.it;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * The shared-memory segment files of the node processes a test started. A node killed with SIGKILL
 * leaves its file behind on purpose (a restart on the same port adopts it, docs/operations.md
 * "Orphaned segments"); a test that will not restart it removes it, so that a full run does not
 * leave gigabytes in /dev/shm for the next one.
 */
final class SegmentFiles {

    /** Where nodes put their segment unless told otherwise. */
    static final Path SHM = Path.of("/dev/shm");

    private SegmentFiles() {
    }

    /** The files process {@code pid} created in {@code dir}: {@code kvpool-<name>-<pid>.seg}. */
    static List<Path> of(Path dir, long pid) {
        List<Path> files = new ArrayList<>();
        if (!Files.isDirectory(dir)) {
            return files;
        }
        try (DirectoryStream<Path> ds = Files.newDirectoryStream(dir, "kvpool-*-" + pid + ".seg")) {
            ds.forEach(files::add);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        return files;
    }

    /** Removes the files process {@code pid} (no longer running) created in {@code dir}. */
    static void remove(Path dir, long pid) {
        for (Path f : of(dir, pid)) {
            try {
                Files.deleteIfExists(f);
                // and the node's registration beside it, which nothing else would ever delete
                Files.deleteIfExists(f.resolveSibling(f.getFileName() + ".registration"));
            } catch (IOException e) {
                throw new UncheckedIOException("cannot remove " + f, e);
            }
        }
    }

    /**
     * The segment directory a node started with {@code args} uses: the value of {@code --shm-dir},
     * null for "none" (anonymous memory), /dev/shm when the flag is absent.
     */
    static Path dirOf(List<String> args) {
        int i = args.indexOf("--shm-dir");
        if (i < 0 || i + 1 >= args.size()) {
            return SHM;
        }
        return "none".equals(args.get(i + 1)) ? null : Path.of(args.get(i + 1));
    }
}
