package io.kvpool.node;

import io.kvpool.config.Durations;
import io.kvpool.config.Size;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.channels.OverlappingFileLockException;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.time.Duration;
import java.time.Instant;
import java.time.InstantSource;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.function.LongSupplier;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Segment files in a shared-memory directory whose node died without closing them (SIGKILL, a
 * crash), and when each may be deleted. tmpfs keeps a file's pages until it is deleted, so an orphan
 * holds up to a segment's worth of memory; but it also holds every object its node stored, which
 * the node takes back if it restarts with the same name and size ({@link SegmentMemory}'s adoption).
 * The rule decides between the two.
 *
 * <h2>Who is an orphan</h2>
 * A {@code kvpool-<name>-<pid>.seg} (a regular file, not a link) whose pid is not a live process.
 * Deleting one also needs its exclusive lock: the lock protects a live node whose pid this process
 * cannot see or that was reused (another pid namespace sharing the directory). A file that cannot be
 * inspected is logged and left; nothing here fails a node.
 *
 * <h2>When an orphan goes</h2>
 * Only when its node cannot come back for it:
 * <ul>
 *   <li><b>Its own node came back without it.</b> A node starting under the orphan's name that does
 *       not adopt it (adoption off, another segment size, or it adopted a newer one) deletes it at
 *       once ({@link #reclaimOwn}).</li>
 *   <li><b>Its grace ran out.</b> A running node looks at the directory at its start and every
 *       {@link ShmDir#sweepInterval()} ({@link ShmKeeper}), and remembers when it first saw each
 *       orphan. Once it has seen one for the grace ({@link ShmDir#orphanGrace()}, 10 minutes by
 *       default), it deletes it ({@link #reclaimExpired}). A node that never comes back therefore
 *       leaves nothing behind while any node runs on the machine. The grace counts from the first
 *       sighting, not from the node's death, which no file records: the modification time does not
 *       (writes through the mapping need not move it, so an idle node's file looks old), and a live
 *       node cannot move it either without opening and closing its own file, which would drop its
 *       lock (see {@link SegmentMemory}). So an orphan may be kept longer than the grace, by whoever
 *       starts later, never shorter.</li>
 *   <li><b>Memory is needed.</b> A node that starts and finds less free space in the directory than
 *       its segment needs deletes orphans still within their grace, the longest-dead first, until
 *       it fits ({@link #makeRoom}), the files modified longest ago first.</li>
 * </ul>
 * A grace of zero restores the old behaviour: every orphan goes as soon as another node sees it.
 * The clock is injected; tests move it instead of sleeping.
 */
final class OrphanedSegments {

    private static final Logger log = LoggerFactory.getLogger(OrphanedSegments.class);

    /** {@code kvpool-<name>-<pid>.seg}; the name may itself contain dashes, the pid is the last field. */
    private static final Pattern FILE_NAME = Pattern.compile("kvpool-.*-(\\d{1,18})\\.seg");

    /** An orphaned file: its pid, its size, when it was last modified, and since when this process has seen it. */
    record Orphan(Path file, long pid, long bytes, Instant modified, Instant seenSince) {
    }

    private final Path dir;
    private final Duration grace;
    private final InstantSource clock;
    /** When this process first saw each orphan it still sees. Guarded by {@code this}. */
    private final Map<Path, Instant> firstSeen = new HashMap<>();

    OrphanedSegments(Path dir, Duration grace, InstantSource clock) {
        this.dir = dir;
        this.grace = grace;
        this.clock = clock;
    }

    /** {@code kvpool-<name>-}: the start of the file names of the node called {@code name}. */
    static String filePrefix(String name) {
        return "kvpool-" + name.replaceAll("[^A-Za-z0-9._-]", "_") + "-";
    }

    /**
     * The file beside segment file {@code segmentFile} that keeps the token of its node's last
     * registration ({@link RegistrationFile}): it goes where the segment file goes (renamed with it
     * when a restarted node adopts it, deleted with it), so only the process that holds the segment
     * can prove it is that node's next run.
     */
    static Path registrationOf(Path segmentFile) {
        return segmentFile.resolveSibling(segmentFile.getFileName() + ".registration");
    }

    /** The pid in the name of a file of the node whose {@link #filePrefix} is {@code prefix}, or -1. */
    static long pidOf(Path file, String prefix) {
        String n = file.getFileName().toString();
        if (!n.startsWith(prefix) || !n.endsWith(".seg")) {
            return -1;
        }
        String pid = n.substring(prefix.length(), n.length() - ".seg".length());
        return pid.matches("\\d{1,18}") ? Long.parseLong(pid) : -1;
    }

    /**
     * The orphans in the directory now, the least recently modified first; empty when it cannot be
     * read. Each one not seen before is remembered as first seen now.
     */
    synchronized List<Orphan> find() {
        Instant now = clock.instant();
        List<Orphan> out = new ArrayList<>();
        try (DirectoryStream<Path> files = Files.newDirectoryStream(dir, "kvpool-*.seg")) {
            for (Path f : files) {
                Matcher m = FILE_NAME.matcher(f.getFileName().toString());
                try {
                    if (m.matches() && Files.isRegularFile(f, LinkOption.NOFOLLOW_LINKS)
                            && !isAlive(Long.parseLong(m.group(1)))) {
                        out.add(new Orphan(f, Long.parseLong(m.group(1)), Files.size(f),
                                Files.getLastModifiedTime(f, LinkOption.NOFOLLOW_LINKS).toInstant(),
                                firstSeen.computeIfAbsent(f, k -> now)));
                    }
                } catch (NoSuchFileException e) {
                    // another node reclaimed or adopted it first
                } catch (IOException | RuntimeException e) {
                    log.warn("cannot inspect segment file {} ({}); leaving it", f, e.toString());
                }
            }
        } catch (IOException | RuntimeException e) {
            log.warn("cannot scan {} for orphaned segment files ({})", dir, e.toString());
        }
        // forget what is gone (reclaimed, adopted, or a live node's after all)
        firstSeen.keySet().retainAll(out.stream().map(Orphan::file).toList());
        out.sort(Comparator.comparing(Orphan::modified));
        return out;
    }

    /**
     * Deletes the orphans of the node whose {@link #filePrefix} is {@code prefix}, whatever their age:
     * that node is the one starting, and it does not take them.
     *
     * @return how many files were deleted
     */
    int reclaimOwn(String prefix) {
        int n = 0;
        for (Orphan o : find()) {
            if (pidOf(o.file, prefix) >= 0 && reclaim(o, "its node started again without it")) {
                n++;
            }
        }
        return n;
    }

    /** Deletes every orphan this process has seen for the grace or longer; how many. */
    int reclaimExpired() {
        int n = 0;
        for (Orphan o : find()) {
            Duration seen = Duration.between(o.seenSince, clock.instant());
            if (seen.compareTo(grace) >= 0 && reclaim(o, "orphaned for at least " + Durations.format(seen)
                    + ", the orphan grace")) {
                n++;
            }
        }
        return n;
    }

    /**
     * Deletes orphans still within their grace, the longest-dead first, while {@code usable} (the
     * directory's free bytes) is below {@code needed}; how many.
     */
    int makeRoom(long needed, LongSupplier usable) {
        int n = 0;
        for (Orphan o : find()) {
            long free = usable.getAsLong();
            if (free >= needed) {
                break;
            }
            if (reclaim(o, "a starting node needs " + Size.human(needed) + " and " + dir + " has "
                    + Size.human(free) + " free (it was within its grace)")) {
                n++;
            }
        }
        return n;
    }

    /** Deletes {@code o} if it is still an orphan (lock taken, pid still dead); false if it was not. */
    private static boolean reclaim(Orphan o, String why) {
        try (FileChannel ch = FileChannel.open(o.file, StandardOpenOption.READ, StandardOpenOption.WRITE,
                LinkOption.NOFOLLOW_LINKS)) {
            // a live node holds it (its pid is not visible here, or was reused); or a new process was given
            // that pid and created the same name since the first look
            if (tryLock(ch) == null || isAlive(o.pid)) {
                return false;
            }
            Files.delete(o.file); // while still holding the lock; closing the channel releases it
            Files.deleteIfExists(registrationOf(o.file));
            log.info("reclaimed orphaned segment file {} ({}) left by pid {}: {}", o.file, Size.human(o.bytes), o.pid, why);
            return true;
        } catch (NoSuchFileException e) {
            return false; // another node reclaimed or adopted it first
        } catch (IOException | RuntimeException e) {
            log.warn("cannot reclaim segment file {} ({}); leaving it", o.file, e.toString());
            return false;
        }
    }

    /**
     * Whether {@code pid} is a live process. A zombie (killed, not yet reaped by its parent: state Z in
     * /proc) counts as dead: it holds no files, locks or memory any more.
     */
    static boolean isAlive(long pid) {
        Optional<ProcessHandle> p = ProcessHandle.of(pid);
        if (p.isEmpty() || !p.get().isAlive()) {
            return false;
        }
        try {
            String stat = Files.readString(Path.of("/proc", Long.toString(pid), "stat"));
            int close = stat.lastIndexOf(')'); // the command name, in parentheses, may contain anything
            return close < 0 || close + 2 >= stat.length() || stat.charAt(close + 2) != 'Z';
        } catch (IOException | RuntimeException e) {
            return true; // no /proc: trust ProcessHandle
        }
    }

    /**
     * The channel's exclusive lock on its whole file, or null if another process holds a lock on it.
     * A lock held through another channel in this JVM counts as held.
     */
    static FileLock tryLock(FileChannel ch) throws IOException {
        try {
            return ch.tryLock();
        } catch (OverlappingFileLockException e) {
            return null;
        }
    }
}
