package io.kvpool.node;

import io.kvpool.config.Size;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;

/**
 * The node's off-heap segment: one contiguous {@link MemorySegment} of any size (not limited to
 * 2 GiB), with exactly one owner that closes it exactly once.
 *
 * <p>Preferred backing is a file in a shared-memory directory ({@code /dev/shm}) mapped into a
 * shared arena: pages are committed on first touch (a 32 GiB segment costs nothing until used), and
 * a client on the same machine can map the same file. If the directory is missing or has less
 * free space than the segment needs, the segment is anonymous memory from the arena instead
 * (committed and zeroed up front), and the log says so.
 */
final class SegmentMemory implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(SegmentMemory.class);

    private final Arena arena;
    private final MemorySegment segment;
    private final Path file;

    private SegmentMemory(Arena arena, MemorySegment segment, Path file) {
        this.arena = arena;
        this.segment = segment;
        this.file = file;
    }

    /**
     * Allocates a segment of {@code size} bytes.
     *
     * @param shmDir directory for a shared-memory backing file, or null for anonymous memory
     * @param name   used in the file name, e.g. the segment name
     */
    static SegmentMemory allocate(long size, Path shmDir, String name, boolean prefault) {
        if (size <= 0) {
            throw new IllegalArgumentException("segment size must be positive, got " + size);
        }
        if (shmDir != null) {
            try {
                if (Files.isDirectory(shmDir) && Files.getFileStore(shmDir).getUsableSpace() >= size) {
                    Path file = shmDir.resolve("kvpool-" + name.replaceAll("[^A-Za-z0-9._-]", "_") + "-"
                            + ProcessHandle.current().pid() + ".seg");
                    Arena arena = Arena.ofShared();
                    try (FileChannel ch = FileChannel.open(file, StandardOpenOption.CREATE, StandardOpenOption.READ,
                            StandardOpenOption.WRITE, StandardOpenOption.TRUNCATE_EXISTING)) {
                        ch.truncate(0);
                        // sparse: tmpfs commits pages as they are first written
                        ch.write(java.nio.ByteBuffer.wrap(new byte[1]), size - 1);
                        MemorySegment seg = ch.map(FileChannel.MapMode.READ_WRITE, 0, size, arena);
                        if (prefault) {
                            // nothing is stored yet, so writing zeros is safe; it allocates every page now
                            long t0 = System.nanoTime();
                            seg.fill((byte) 0);
                            log.info("segment {}: {} mapped from {}, pages committed in {} ms", name, Size.human(size),
                                    file, (System.nanoTime() - t0) / 1_000_000);
                        } else {
                            log.info("segment {}: {} mapped from {} (pages committed on first use)", name,
                                    Size.human(size), file);
                        }
                        return new SegmentMemory(arena, seg, file);
                    } catch (IOException | RuntimeException e) {
                        arena.close();
                        Files.deleteIfExists(file);
                        log.warn("segment {}: cannot map {} ({}); using anonymous memory", name, file, e.toString());
                    }
                } else {
                    log.info("segment {}: {} is missing or has less than {} free; using anonymous memory",
                            name, shmDir, Size.human(size));
                }
            } catch (IOException e) {
                log.warn("segment {}: cannot inspect {} ({}); using anonymous memory", name, shmDir, e.toString());
            }
        }
        Arena arena = Arena.ofShared();
        try {
            MemorySegment seg = arena.allocate(size, 4096);
            log.info("segment {}: {} of anonymous memory", name, Size.human(size));
            return new SegmentMemory(arena, seg, null);
        } catch (OutOfMemoryError | IllegalArgumentException e) {
            arena.close();
            throw new IllegalStateException("segment " + name + ": cannot allocate " + Size.human(size)
                    + " of off-heap memory: " + e.getMessage(), e);
        }
    }

    MemorySegment segment() {
        return segment;
    }

    /** The shared-memory file backing the segment, or null for anonymous memory. */
    Path file() {
        return file;
    }

    @Override
    public void close() {
        arena.close();
        if (file != null) {
            try {
                Files.deleteIfExists(file);
            } catch (IOException e) {
                log.warn("cannot delete segment file {}: {}", file, e.toString());
            }
        }
    }
}
