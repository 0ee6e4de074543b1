package io.kvpool.node;

import io.kvpool.config.Size;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.time.InstantSource;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Set;

/**
 * The node's off-heap segment: one contiguous {@link MemorySegment} of any size (not limited to
 * 2 GiB), with exactly one owner that closes it exactly once.
 *
 * <p>Preferred backing is a file in a shared-memory directory ({@code /dev/shm}) mapped into a
 * shared arena: pages are committed on first touch (a 32 GiB segment costs nothing until used), and
 * a client on the same machine can map the same file. If the directory is missing or has less
 * free space than the segment needs, the segment is anonymous memory from the arena instead
 * (committed and zeroed up front), and the log says so.
 *
 * <p>The file is {@code kvpool-<name>-<pid>.seg}. {@link #close()} deletes it, but a node killed
 * with SIGKILL cannot, and tmpfs keeps a file's pages until it is deleted, so every crash would leak
 * up to a segment's worth of memory. Two things prevent that:
 * <ul>
 *   <li>While the segment lives, the node holds an exclusive lock ({@link FileChannel#tryLock()}) on
 *       its file, through a channel kept open until {@link #close()}. The kernel drops the lock when
 *       the process dies, however it dies. The node takes the lock before it truncates the file, so
 *       it never clobbers a file another live process holds.</li>
 *   <li>Every node deletes the files of nodes that died, {@code kvpool-*-<pid>.seg} whose pid is not
 *       a live process <em>and</em> whose lock it can take, once those nodes cannot come back for
 *       them: at its start, and while it runs ({@link OrphanedSegments} says when). The pid test
 *       protects files of older builds that hold no lock; the lock protects a live node whose pid this
 *       process cannot see or that was reused (another pid namespace sharing {@code /dev/shm}). Each
 *       reclaimed file is logged; a file that cannot be inspected is logged and skipped, and the scan
 *       never fails the node.</li>
 * </ul>
 * The lock is a POSIX record lock, owned by the process rather than the channel: closing
 * <em>any</em> channel on the same file in this JVM (say, an in-process client that mapped it)
 * releases it. The file then stays protected by the live-pid test, which is why reclaiming needs
 * both tests to pass.
 *
 * <h2>Adopting the previous run's file</h2>
 * A node that restarts (crash, upgrade) with the same name (its {@code host:port}) and the same
 * segment size finds the file its previous run left, orphaned by the tests above. With adoption on
 * ({@link #allocate}'s {@code adopt}), it takes that file over instead of reclaiming it: it locks it,
 * checks again that the old pid is dead, renames it to its own pid's name (atomically, in the same
 * directory, while holding the lock: the live-pid test protects it again at once) and maps it
 * without truncating. {@link #adopted()} then says so, and the node rebuilds its ledger from the
 * objects in it ({@link SegmentAdoption}). Several candidates: the newest is taken, the others are
 * reclaimed. Its own files that it does not take (another size, adoption off) are reclaimed at once;
 * another node's orphan is kept through the orphan grace ({@link ShmDir#orphanGrace()}), so that a
 * node starting while a killed one is down leaves it its objects, unless the starting node needs the
 * memory ({@link OrphanedSegments}). Nothing may open and close the node's own file while it lives
 * (not even to set its modification time): closing any descriptor of it drops the lock.
 *
 * <h2>Who may open the file</h2>
 * The file holds every value stored on the node: it is the node user's alone (mode 0600), or, with
 * a group in {@link ShmDir}, readable and writable by that group too (0660), for same-machine clients
 * running as other users ({@link SegmentAccess}). A new file and an adopted one both get the current
 * setting before they are mapped; a group that cannot be set fails the start rather than falling
 * back to anonymous memory, which would quietly cost every client its same-machine path.
 */
final class SegmentMemory implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(SegmentMemory.class);

    private final Arena arena;
    private final MemorySegment segment;
    private final Path file;
    /** Open for the life of the segment: it holds the file's lock. Null for anonymous memory. */
    private final FileChannel lockChannel;

    /** True when the file was a previous run's, taken over with its contents. */
    private final boolean adopted;
    private volatile boolean keepFile;

    private SegmentMemory(Arena arena, MemorySegment segment, Path file, FileChannel lockChannel, boolean adopted) {
        this.arena = arena;
        this.segment = segment;
        this.file = file;
        this.lockChannel = lockChannel;
        this.adopted = adopted;
    }

    /**
     * Allocates a segment of {@code size} bytes.
     *
     * @param shmDir directory for a shared-memory backing file, or null for anonymous memory
     * @param name   used in the file name, e.g. the segment name
     */
    static SegmentMemory allocate(long size, Path shmDir, String name, boolean prefault) {
        return allocate(size, shmDir, name, prefault, false);
    }

    /** {@link #allocate(long, ShmDir, String, boolean, boolean)} with the file the node user's alone. */
    static SegmentMemory allocate(long size, Path shmDir, String name, boolean prefault, boolean adopt) {
        return allocate(size, shmDir == null ? null : ShmDir.ownerOnly(shmDir), name, prefault, adopt);
    }

    /** {@link #allocate(long, ShmDir, String, boolean, boolean, OrphanedSegments)} on the system clock. */
    static SegmentMemory allocate(long size, ShmDir shm, String name, boolean prefault, boolean adopt) {
        return allocate(size, shm, name, prefault, adopt,
                shm == null ? null : new OrphanedSegments(shm.path(), shm.orphanGrace(), InstantSource.system()));
    }

    /**
     * Allocates a segment of {@code size} bytes; with {@code adopt}, takes over the file a previous run
     * of the node of this name left, when there is one of this size (see the class comment).
     *
     * @param shm     where the file goes, who may open it; null for anonymous memory
     * @param orphans the dead nodes' files in {@code shm}'s directory and when each may go (null with no
     *                {@code shm}); the node keeps using it while it runs ({@link ShmKeeper})
     * @throws IllegalArgumentException when {@code shm} names a group this machine does not have
     * @throws SegmentAccess.Refused    when the file cannot be given that group
     */
    static SegmentMemory allocate(long size, ShmDir shm, String name, boolean prefault, boolean adopt,
                                  OrphanedSegments orphans) {
        if (size <= 0) {
            throw new IllegalArgumentException("segment size must be positive, got " + size);
        }
        SegmentAccess access = SegmentAccess.of(shm); // an unknown group fails here, before anything is touched
        if (shm != null) {
            Path shmDir = shm.path();
            try {
                String prefix = OrphanedSegments.filePrefix(name);
                Path mine = shmDir.resolve(prefix + ProcessHandle.current().pid() + ".seg");
                if (adopt && Files.isDirectory(shmDir)) {
                    SegmentMemory taken = adoptOrphan(shmDir, name, size, mine, access);
                    if (taken != null) {
                        orphans.reclaimOwn(prefix); // older runs' files of the same name
                        orphans.reclaimExpired();
                        return taken;
                    }
                }
                if (Files.isDirectory(shmDir)) {
                    // before the free-space check: what they free counts
                    orphans.reclaimOwn(prefix);
                    orphans.reclaimExpired();
                    orphans.makeRoom(size, () -> usableSpace(shmDir));
                }
                if (Files.isDirectory(shmDir) && Files.getFileStore(shmDir).getUsableSpace() >= size) {
                    Path file = mine;
                    SegmentMemory mapped = mapFile(size, file, name, prefault, access);
                    if (mapped != null) {
                        return mapped;
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
            return new SegmentMemory(arena, seg, null, null, false);
        } catch (OutOfMemoryError | IllegalArgumentException e) {
            arena.close();
            throw new IllegalStateException("segment " + name + ": cannot allocate " + Size.human(size)
                    + " of off-heap memory: " + e.getMessage(), e);
        }
    }

    /**
     * Creates, locks and maps {@code file}; null (and a warning) if that fails, except that a file
     * that cannot be given {@code access} fails the allocation.
     */
    private static SegmentMemory mapFile(long size, Path file, String name, boolean prefault, SegmentAccess access) {
        Arena arena = Arena.ofShared();
        FileChannel ch = null;
        boolean locked = false;
        try {
            // created the node user's alone; widened to the chosen group (if any) once it is ours
            ch = FileChannel.open(file, Set.of(StandardOpenOption.CREATE, StandardOpenOption.READ,
                    StandardOpenOption.WRITE, LinkOption.NOFOLLOW_LINKS), SegmentAccess.atCreation());
            if (OrphanedSegments.tryLock(ch) == null) {
                throw new IOException("the file is locked by another live process");
            }
            locked = true;
            access.apply(file); // also resets a file that existed under this name
            ch.truncate(0);
            // sparse: tmpfs commits pages as they are first written
            ch.write(ByteBuffer.wrap(new byte[1]), size - 1);
            MemorySegment seg = ch.map(FileChannel.MapMode.READ_WRITE, 0, size, arena);
            if (prefault) {
                // nothing is stored yet, so writing zeros is safe; it allocates every page now
                long t0 = System.nanoTime();
                seg.fill((byte) 0);
                log.info("segment {}: {} mapped from {} ({}), pages committed in {} ms", name, Size.human(size),
                        file, access, (System.nanoTime() - t0) / 1_000_000);
            } else {
                log.info("segment {}: {} mapped from {} ({}; pages committed on first use)", name,
                        Size.human(size), file, access);
            }
            return new SegmentMemory(arena, seg, file, ch, false);
        } catch (IOException | RuntimeException e) {
            arena.close();
            if (locked) { // it is ours; a file we could not lock belongs to someone else and stays
                try {
                    Files.deleteIfExists(file);
                } catch (IOException ex) {
                    log.warn("cannot delete segment file {}: {}", file, ex.toString());
                }
            }
            closeQuietly(ch);
            if (e instanceof SegmentAccess.Refused refused) {
                throw refused;
            }
            log.warn("segment {}: cannot map {} ({}); using anonymous memory", name, file, e.toString());
            return null;
        }
    }

    /** Free bytes in {@code dir}'s file system; 0 when it cannot be read. */
    private static long usableSpace(Path dir) {
        try {
            return Files.getFileStore(dir).getUsableSpace();
        } catch (IOException e) {
            return 0;
        }
    }


    /**
     * Takes over the newest orphaned file of the node called {@code name} whose size is {@code size}:
     * locks it, renames it to {@code mine} and maps it as it is. Null when there is none (or it cannot
     * be taken: then it is left to be reclaimed, {@link OrphanedSegments#reclaimOwn}).
     */
    private static SegmentMemory adoptOrphan(Path shmDir, String name, long size, Path mine, SegmentAccess access) {
        String prefix = OrphanedSegments.filePrefix(name);
        List<Path> candidates = new ArrayList<>();
        try (DirectoryStream<Path> files = Files.newDirectoryStream(shmDir, prefix + "*.seg")) {
            for (Path f : files) {
                long pid = OrphanedSegments.pidOf(f, prefix);
                if (pid >= 0 && !OrphanedSegments.isAlive(pid)
                        && Files.isRegularFile(f, LinkOption.NOFOLLOW_LINKS) && Files.size(f) == size) {
                    candidates.add(f);
                } else if (pid >= 0) {
                    // said, so that a restart that comes back empty tells why
                    log.info("segment {}: not adopting {}: {}", name, f, OrphanedSegments.isAlive(pid)
                            ? "its owner pid " + pid + " is still running"
                            : "its size is " + Files.size(f) + " bytes, this segment's " + size);
                }
            }
        } catch (IOException | RuntimeException e) {
            log.warn("segment {}: cannot look for a previous run's segment file in {} ({})", name, shmDir, e.toString());
            return null;
        }
        candidates.sort(Comparator.comparing((Path f) -> {
            try {
                return Files.getLastModifiedTime(f, LinkOption.NOFOLLOW_LINKS).toMillis();
            } catch (IOException e) {
                return 0L;
            }
        }).reversed());
        for (Path f : candidates) {
            long pid = OrphanedSegments.pidOf(f, prefix);
            Arena arena = Arena.ofShared();
            FileChannel ch = null;
            try {
                ch = FileChannel.open(f, StandardOpenOption.READ, StandardOpenOption.WRITE, LinkOption.NOFOLLOW_LINKS);
                if (OrphanedSegments.tryLock(ch) == null || OrphanedSegments.isAlive(pid) || ch.size() != size) {
                    throw new IOException("it is in use or changed");
                }
                access.apply(f); // the current setting, whatever the previous run's was; before the name is ours
                Files.move(f, mine, StandardCopyOption.ATOMIC_MOVE);
                moveRegistration(f, mine);
                MemorySegment seg = ch.map(FileChannel.MapMode.READ_WRITE, 0, size, arena);
                log.info("segment {}: adopting {} ({}) left by pid {}, as {} ({})", name, f, Size.human(size), pid, mine,
                        access);
                return new SegmentMemory(arena, seg, mine, ch, true);
            } catch (IOException | RuntimeException e) {
                arena.close();
                closeQuietly(ch);
                if (e instanceof SegmentAccess.Refused refused) {
                    throw refused;
                }
                log.warn("segment {}: cannot adopt {} ({}); it is left to be reclaimed", name, f, e.toString());
            }
        }
        return null;
    }

    /** The previous run's registration token goes with its segment file (RegistrationFile), if it kept one. */
    private static void moveRegistration(Path from, Path to) {
        Path kept = OrphanedSegments.registrationOf(from);
        try {
            if (Files.exists(kept, LinkOption.NOFOLLOW_LINKS)) {
                Files.move(kept, OrphanedSegments.registrationOf(to), StandardCopyOption.ATOMIC_MOVE,
                        StandardCopyOption.REPLACE_EXISTING);
            }
        } catch (IOException e) {
            log.warn("cannot take over {} ({}); this restart does not prove its previous registration", kept,
                    e.toString());
        }
    }

    private static void closeQuietly(FileChannel ch) {
        if (ch != null) {
            try {
                ch.close();
            } catch (IOException e) {
                log.debug("closing a segment file channel: {}", e.toString());
            }
        }
    }

    MemorySegment segment() {
        return segment;
    }

    /** The shared-memory file backing the segment, or null for anonymous memory. */
    Path file() {
        return file;
    }

    /** Whether the segment is a previous run's file, taken over with its contents. */
    boolean adopted() {
        return adopted;
    }

    /** The open channel of the file (reads through it do not commit a tmpfs file's holes); null for anonymous memory. */
    FileChannel channel() {
        return lockChannel;
    }

    /**
     * Makes {@link #close()} keep the file: a node stopping to be restarted at once (a rolling
     * restart) leaves its objects for the next run to adopt, as a killed node does.
     */
    void keepFileOnClose() {
        keepFile = true;
    }

    @Override
    public void close() {
        arena.close();
        if (file != null) {
            if (!keepFile) {
                try {
                    Files.deleteIfExists(file);
                    Files.deleteIfExists(OrphanedSegments.registrationOf(file));
                } catch (IOException e) {
                    log.warn("cannot delete segment file {}: {}", file, e.toString());
                }
            }
            closeQuietly(lockChannel); // releases the lock, after the file is gone (or kept: an orphan to adopt)
        }
    }
}
