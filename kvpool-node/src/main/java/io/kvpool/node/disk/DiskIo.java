package io.kvpool.node.disk;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;

/**
 * What the store learns about, and asks of, the device under its directory: the I/O block appends are
 * aligned to, whether O_DIRECT works there (probed once, at open), forcing the directory after a file
 * is created, and block arithmetic. Stateless; safe from any thread.
 */
final class DiskIo {

    /** Logs as the store: the tier's messages keep one logger name. */
    private static final Logger log = LoggerFactory.getLogger(DiskStore.class);

    private static final String PROBE_FILE = "kvpool-disk.probe";

    private DiskIo() {
    }

    /** The I/O block of the file system holding {@code dir}: its block size if larger than a page. */
    static int ioBlock(Path dir) {
        try {
            long b = Files.getFileStore(dir).getBlockSize();
            if (b > DiskStore.MIN_IO_BLOCK && b <= RunWriter.WRITE_BUFFER && Long.bitCount(b) == 1) {
                return (int) b;
            }
        } catch (IOException | UnsupportedOperationException e) {
            log.debug("disk tier: block size of {} unknown ({}); using {}", dir, e.toString(), DiskStore.MIN_IO_BLOCK);
        }
        return DiskStore.MIN_IO_BLOCK;
    }

    /** Whether O_DIRECT writes work in {@code dir}: one aligned block written to a scratch file, then deleted. */
    static boolean probeDirect(Path dir, MemorySegment block) {
        Path probe = dir.resolve(PROBE_FILE);
        try {
            Files.deleteIfExists(probe);
            Files.createFile(probe);
            try (FileChannel ch = DataFile.openDirect(probe)) {
                block.fill((byte) 0);
                ch.write(block.asByteBuffer(), 0);
            }
            return true;
        } catch (IOException | RuntimeException e) {
            log.info("disk tier {}: direct I/O unavailable ({}); spills go through the page cache", dir,
                    e.getMessage());
            return false;
        } finally {
            try {
                Files.deleteIfExists(probe);
            } catch (IOException ignored) {
                // left behind: harmless, not a log file
            }
        }
    }

    /** Makes a new file's directory entry durable; a failure is logged, not thrown. */
    static void forceDirectory(Path dir) {
        try (FileChannel d = FileChannel.open(dir, StandardOpenOption.READ)) {
            d.force(true);
        } catch (IOException e) {
            log.debug("disk tier: cannot force directory {}: {}", dir, e.toString());
        }
    }

    static long alignUp(long x, long block) {
        return (x + block - 1) / block * block;
    }
}
