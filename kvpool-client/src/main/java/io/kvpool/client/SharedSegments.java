package io.kvpool.client;

import io.kvpool.protocol.ObjectLayout;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.VarHandle;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.BasicFileAttributes;
import java.util.HashMap;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The same-machine fast path: segments of nodes on this host, mapped into this process from the
 * node's shared-memory file, so object bytes move with a memory copy instead of through TCP.
 *
 * <h2>Reads without the node</h2>
 * A shared-memory read takes no pin on the node, so the node may reuse the space while the copy
 * runs. The node, before it lets any write into a region it reuses, marks the old object's header
 * dead (under its ledger lock, before the writer may touch a byte). So a reader checks the header
 * (magic, state complete, the generation it was told, the length) before copying, copies, then
 * checks state and generation again after an acquire fence. If the second check fails the copy may
 * be torn: it is discarded and the object is read over TCP instead (where the node pins it), which
 * yields it or a miss. A read therefore never returns another object's bytes or a partial object.
 *
 * <h2>Writes</h2>
 * The node still admits every write (NODE_SHM_WRITE_BEGIN: it waits for readers of the space, fences
 * old epochs and stamps the header); the client copies the value into the mapped region, then
 * NODE_SHM_WRITE_END makes it readable. Two small round trips instead of streaming the value.
 *
 * <h2>Page faults</h2>
 * A fresh mapping has no page-table entries, and on a {@code MAP_SHARED} tmpfs mapping each first
 * write to a 4 KiB page takes a fault (write faults get no fault-around): first-touch copies into the
 * segment ran at 2.8 to 3 GB/s here, against 16 warm. So the mapping is prefaulted in windows of
 * 64 MiB ({@link Prefault}), each the first time a copy touches it, with
 * {@code madvise(MADV_POPULATE_READ)}, which on a shared tmpfs mapping leaves the pages writable as
 * well and costs less than {@code MADV_POPULATE_WRITE} (see {@link Prefault}; first-touch copies
 * then run at 7.2 to 7.5 GB/s): one system call per window instead of 16,384 faults, and only for
 * the parts of the segment this process uses ({@code MAP_POPULATE} of the whole segment would cost
 * every client about 70 ms and 2 MiB of page tables per GiB of segment at start). A bitset per
 * mapping says which windows are done, so the check before a copy is one volatile read. Where the
 * kernel refuses the advice (before Linux 5.14) or the JVM does not allow native access
 * ({@code --enable-native-access=ALL-UNNAMED}), copies fault as before. The Python client does the
 * same with {@code MADV_POPULATE_WRITE} for writes ({@code kvpool/shm.py}).
 *
 * <h2>One mapping per process</h2>
 * Clients in one process share a file's mapping ({@link #PROCESS}, counted by user): its populated
 * windows serve every client, and a process pays the page tables (2 MiB per GiB) and the population
 * (about 70 ms per GiB) once, not once per client. The mapping is let go when its last client drops it.
 * It is shared by the file's identity (its inode, besides name and size), so a client never gets the
 * mapping of a file that was replaced under the same name (a node restarted in the same process on
 * the same port); such a file is mapped afresh.
 *
 * <h2>Falling back</h2>
 * A segment is mapped only if its node is on this host, advertises a shared-memory file, and the
 * file can be opened read-write with the segment's size. Otherwise (another host, no permission,
 * anonymous memory) that segment uses TCP, and the log says so once. Mappings live in automatic
 * arenas: they are unmapped when the segment leaves the table and nothing uses them any more.
 *
 * <h2>Keyed by file, not by segment id</h2>
 * Mappings are kept by the node's shared-memory file, never by segment id: ids are per master run,
 * and a new master (a restart, or a failover to another elected master) numbers the segments in the
 * order their nodes register again, so id 2 may name another node than it did a moment ago. Kept by
 * id, a mapping outlived that renumbering (the id was still in the table) and every same-machine
 * copy for the segment now called 2 went into the file of the node formerly called 2: values
 * overwritten under intact headers there, readers served those bytes, and the node that owned the
 * object stamped headers over values that never arrived (issue 25, the rolling-restart drill). The
 * file name carries the node's address and process id, so it names one node's segment for good.
 */
final class SharedSegments {

    private static final Logger log = LoggerFactory.getLogger(SharedSegments.class);

    /**
     * Every mapping of every client in this process, by base address: the static copy methods find a
     * mapping's populated windows here. Entries leave when their client drops the mapping; one left by
     * a client that was never closed is replaced if the address is mapped again.
     */
    private static final Map<Long, Prefault.Windows> WINDOWS = new ConcurrentHashMap<>();
    /** The entry found last: most processes copy through one mapping, and this saves the lookup. */
    private static volatile Prefault.Windows lastWindows;

    /** A mapping shared by the clients of this process, and how many of them hold it. */
    private static final class Shared {
        final String key;
        final MemorySegment mapping;
        int users;

        Shared(String key, MemorySegment mapping) {
            this.key = key;
            this.mapping = mapping;
        }
    }

    /** This process's mappings, by file identity ({@link #identity}); guarded by itself, like {@link #SHARED_AT}. */
    private static final Map<String, Shared> PROCESS = new HashMap<>();
    /** The same mappings by base address. */
    private static final Map<Long, Shared> SHARED_AT = new HashMap<>();

    private final boolean enabled;
    /** By shared-memory file (see the class comment: never by segment id). */
    private final Map<String, MemorySegment> mapped = new ConcurrentHashMap<>();
    private final Set<String> unmappable = ConcurrentHashMap.newKeySet();

    SharedSegments(boolean enabled) {
        this.enabled = enabled;
    }

    /** The mapped segment for this directory entry, or null when it must be reached over TCP. */
    MemorySegment mapping(SegmentDirectory.Entry e) {
        if (!enabled || e == null || !e.local() || e.shmPath().isEmpty() || unmappable.contains(e.shmPath())) {
            return null;
        }
        MemorySegment m = mapped.get(e.shmPath());
        if (m != null && m.byteSize() == e.capacity()) {
            return m;
        }
        synchronized (this) {
            m = mapped.get(e.shmPath());
            if (m != null && m.byteSize() != e.capacity()) {
                // the same file name for a segment of another size: not the segment mapped before
                mapped.remove(e.shmPath());
                forget(m);
                m = null;
            }
            if (m == null) {
                m = acquire(e);
                if (m == null) {
                    unmappable.add(e.shmPath());
                } else {
                    mapped.put(e.shmPath(), m);
                }
            }
        }
        return m;
    }

    /** The file's identity: its name, the segment's size and the file's inode; null if it cannot be read. */
    private static String identity(SegmentDirectory.Entry e) {
        try {
            Object inode = Files.readAttributes(Path.of(e.shmPath()), BasicFileAttributes.class).fileKey();
            return e.capacity() + ":" + inode + ":" + e.shmPath();
        } catch (IOException | RuntimeException ex) {
            return null;
        }
    }

    /** This process's mapping of the entry's file, mapped now if no client of the process holds one; null: use TCP. */
    private static MemorySegment acquire(SegmentDirectory.Entry e) {
        String key = identity(e);
        synchronized (PROCESS) {
            Shared s = key == null ? null : PROCESS.get(key);
            if (s == null) {
                MemorySegment m = map(e);
                if (m == null) {
                    return null;
                }
                s = new Shared(key, m);
                if (key != null) {
                    PROCESS.put(key, s);
                }
                SHARED_AT.put(m.address(), s);
                WINDOWS.put(m.address(), new Prefault.Windows(e.name(), m, Prefault.NATIVE));
            }
            s.users++;
            return s.mapping;
        }
    }

    private static MemorySegment map(SegmentDirectory.Entry e) {
        Path file = Path.of(e.shmPath());
        try {
            if (!Files.isRegularFile(file)) {
                log.info("segment {}: shared-memory file {} is not visible here; using TCP", e.name(), file);
                return null;
            }
            long size = Files.size(file);
            if (size < e.capacity()) {
                log.info("segment {}: {} has {} bytes, the segment {}; using TCP", e.name(), file, size, e.capacity());
                return null;
            }
            try (FileChannel ch = FileChannel.open(file, StandardOpenOption.READ, StandardOpenOption.WRITE)) {
                MemorySegment m = ch.map(FileChannel.MapMode.READ_WRITE, 0, e.capacity(), Arena.ofAuto());
                log.info("segment {}: same-machine path through {}", e.name(), file);
                return m;
            }
        } catch (IOException | RuntimeException ex) {
            log.info("segment {}: cannot map {} ({}); using TCP", e.name(), file, ex.toString());
            return null;
        }
    }

    /** Forgets mappings of files no segment in the table has any more (their nodes left or restarted). */
    synchronized void retain(Set<String> liveFiles) {
        for (var it = mapped.entrySet().iterator(); it.hasNext(); ) {
            Map.Entry<String, MemorySegment> e = it.next();
            if (!liveFiles.contains(e.getKey())) {
                it.remove();
                forget(e.getValue());
            }
        }
        unmappable.retainAll(liveFiles);
    }

    /** Drops every mapping (the client is closing); they are unmapped once nothing uses them. */
    synchronized void close() {
        for (var it = mapped.values().iterator(); it.hasNext(); ) {
            forget(it.next());
            it.remove();
        }
    }

    /** This client no longer uses its mapping {@code m}; the last client's drop lets it go. */
    private static void forget(MemorySegment m) {
        synchronized (PROCESS) {
            Shared s = SHARED_AT.get(m.address());
            if (s != null && s.mapping.byteSize() == m.byteSize()) {
                if (--s.users > 0) {
                    return;
                }
                SHARED_AT.remove(m.address());
                PROCESS.remove(s.key, s);
            }
        }
        WINDOWS.computeIfPresent(m.address(), (a, w) -> w.covers(m) ? null : w);
        Prefault.Windows last = lastWindows;
        if (last != null && last.covers(m)) {
            lastWindows = null;
        }
    }

    /** The populated windows of this mapping; null for memory that is not a registered mapping. */
    static Prefault.Windows windows(MemorySegment seg) {
        Prefault.Windows w = lastWindows;
        if (w != null && w.covers(seg)) {
            return w;
        }
        w = WINDOWS.get(seg.address());
        if (w != null && w.covers(seg)) {
            lastWindows = w;
            return w;
        }
        return null;
    }

    /**
     * Copies {@code value} into the mapped segment at {@code at} (a write the node admitted),
     * prefaulting the windows it touches first.
     */
    static void write(MemorySegment seg, long at, MemorySegment value) {
        long n = value.byteSize();
        Prefault.Windows w = windows(seg);
        if (w != null) {
            w.populate(at, n);
            w.populateAhead(at, n);
        }
        MemorySegment.copy(value, 0, seg, at, n);
    }

    /** {@link #write}, returning the value's CRC32C, summed during the copy ({@link ObjectLayout#copyWithCrc}). */
    static int writeSummed(MemorySegment seg, long at, MemorySegment value) {
        Prefault.Windows w = windows(seg);
        if (w != null) {
            w.populate(at, value.byteSize());
            w.populateAhead(at, value.byteSize());
        }
        return ObjectLayout.copyWithCrc(value, seg, at);
    }

    /**
     * Copies the object (offset, generation, length) from a mapped segment into {@code dst}. Returns
     * false if the object is not there or changed during the copy; {@code dst} then holds garbage.
     */
    static boolean read(MemorySegment seg, long offset, long generation, long length, MemorySegment dst) {
        return readRange(seg, offset, generation, length, 0, dst.asSlice(0, length));
    }

    /**
     * Copies {@code dst.byteSize()} bytes from {@code rangeOffset} of the value of the object (offset,
     * generation, length) into {@code dst}, with the same checks before and after as {@link #read}.
     * The caller checked that the range lies inside the value.
     */
    static boolean readRange(MemorySegment seg, long offset, long generation, long length, long rangeOffset,
                             MemorySegment dst) {
        if (offset < 0 || offset + ObjectLayout.KEY_OFFSET > seg.byteSize()
                || !ObjectLayout.hasMagic(seg, offset) || !current(seg, offset, generation)
                || ObjectLayout.valueLength(seg, offset) != length) {
            return false;
        }
        long valueAt = offset + ObjectLayout.valueOffset(ObjectLayout.keyLength(seg, offset));
        if (valueAt + length > seg.byteSize()) {
            return false;
        }
        long n = dst.byteSize();
        Prefault.Windows w = windows(seg);
        if (w != null) {
            w.populate(valueAt + rangeOffset, n);
        }
        VarHandle.acquireFence();
        MemorySegment.copy(seg, valueAt + rangeOffset, dst, 0, n);
        VarHandle.acquireFence();
        return current(seg, offset, generation);
    }

    private static boolean current(MemorySegment seg, long offset, long generation) {
        return ObjectLayout.state(seg, offset) == ObjectLayout.STATE_COMPLETE
                && ObjectLayout.generation(seg, offset) == generation;
    }
}
