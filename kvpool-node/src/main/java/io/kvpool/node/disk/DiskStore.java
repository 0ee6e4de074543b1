package io.kvpool.node.disk;

import io.kvpool.config.Size;
import io.kvpool.protocol.Keys;
import io.kvpool.protocol.ObjectLayout;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Comparator;
import java.util.HashMap;
import java.util.IdentityHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;
import java.util.stream.Stream;

/**
 * A node's SSD tier: objects evicted from memory are spilled here, served from here, and found again
 * after a restart. A self-contained library; the node decides what to spill and what to tell the
 * master.
 *
 * <h2>On disk</h2>
 * <pre>
 *   dir/
 *     kvpool-disk.lock          held (FileChannel.tryLock) while a store has the directory open
 *     kvpool-disk-000001.log    append-only logs, numbered in creation order. Only the newest one is
 *     kvpool-disk-000002.log    appended to; it grows to fileBytes (a record larger than that gets a
 *     ...                       file of its own), then the next one is started.
 * </pre>
 * A log is a sequence of runs. A run starts at a multiple of the I/O block (4 KiB, or the file
 * system's block if larger) and holds records packed back to back, each starting at a multiple of 64
 * bytes, then zeros up to the next block boundary:
 * <pre>
 *   block boundary                                                        block boundary
 *   | record | record | record | ... | record | zeros (padding, < 1 block) | next run ...
 * </pre>
 * A record is exactly the region an object occupies in a memory segment ({@link ObjectLayout}):
 * <pre>
 *   file offset p (p % 64 == 0)
 *   +--------------------------------------------------------------------+ p
 *   | ObjectLayout header (48 bytes, little-endian)                      |
 *   |   0 magic 'KVOB'   4 version  5 state  6 key length (u16)          |
 *   |   8 value length (u64)      16 generation (u64)   24 epoch (u64)   |
 *   |  32 value CRC32C  36 header CRC32C   40 reserved (u64, zero)       |
 *   +--------------------------------------------------------------------+ p + 48
 *   | key (1..512 bytes)                                                 |
 *   +--------------------------------------------------------------------+
 *   | zeros up to a multiple of 64                                       |
 *   +--------------------------------------------------------------------+ p + valueOffset(key length)
 *   | value (value length bytes)                                         |
 *   +--------------------------------------------------------------------+
 *   | zeros up to a multiple of 64                                       |
 *   +--------------------------------------------------------------------+ p + regionLength = next record
 * </pre>
 * The state byte is COMPLETE when a record is appended. Dropping a record (remove, reset, eviction,
 * a checksum failure, a newer version of its key) rewrites that one byte to DEAD in place: a
 * tombstone. The header checksum does not cover the state, so a tombstone is still a valid header.
 *
 * <p>Why this layout:
 * <ul>
 *   <li><b>One format for memory and disk.</b> The same header code writes and checks both; a record
 *       read from disk is byte for byte what the object was in memory, and the node lists disk
 *       objects to the master with the same fields (generation, epoch, CRC) as memory ones.</li>
 *   <li><b>Self-describing, no separate index file.</b> The in-memory index is rebuilt by one
 *       sequential scan at start. There is no manifest to keep consistent with the data (no second
 *       write, no fsync ordering between two files); a crash can at worst leave a torn last record,
 *       which the scan detects (the header says how long the record must be, and the value CRC says
 *       whether it is all there) and truncates.</li>
 *   <li><b>Large append-only files, not a file per key.</b> KV blocks are many (millions) and
 *       medium-sized. A file per key costs an inode, a directory entry, journal writes and an fsync
 *       per object, an open per read, and a directory walk at start. Appending turns spills into big
 *       sequential writes (one write and one fsync for many records), the pattern SSDs handle with
 *       the least write amplification.</li>
 *   <li><b>Whole blocks per append.</b> The writer writes runs block-aligned and padded, so it can
 *       write them with {@code O_DIRECT}: spills then bypass the page cache instead of filling the
 *       machine's memory with dirty pages and waiting on their write-back (buffered appends ran at a
 *       fifth of the device's speed on the reference machine; direct ones near it). Where O_DIRECT is
 *       refused (probed at open) the same layout is written through the page cache. Compaction
 *       copies go through the page cache and start a fresh block, and direct writes only go to fresh
 *       blocks past everything written, so the two never write one block; a tombstone rewrites a byte
 *       of a record whose direct write finished and was forced (the kernel keeps buffered and direct
 *       I/O coherent for such sequential use). The padding costs at most a block per batch of spills,
 *       counted in {@code usedBytes}.</li>
 *   <li><b>64-byte alignment.</b> Values start at aligned offsets, and after garbage (a bad sector, a
 *       torn write) the scan finds the next record by testing only aligned offsets for the magic.</li>
 *   <li><b>Tombstones in place rather than delete records.</b> No space used, nothing to order across
 *       files. Records are only ever appended, so (file number, offset) is the append order, and the
 *       last record of a generation in that order decides whether it is live (COMPLETE) or not (DEAD):
 *       compaction moves records forward, tombstones go to the newest copy, and a generation spilled
 *       again after a removal is appended after its tombstone.</li>
 * </ul>
 *
 * <h2>In memory</h2>
 * <ul>
 *   <li>Index: generation to {@link Slot} (key, epoch, lengths, CRC, file and offset, hits, list links),
 *       plus key to the slot of its newest generation: a second generation of a key replaces the
 *       older one (reported dropped). Two intrusive lists give the eviction order without sorting:
 *       objects never read, in insertion (at open: scan) order, then objects read, least recently
 *       read first; a read moves its object to the tail. About 250 bytes plus the key per object.</li>
 *   <li>Per file: size, live bytes, and its live slots.</li>
 *   <li>Staging: one native ring of {@code stagingBytes} (a {@link StagingRing}) where {@link #offer}
 *       lays out each record completely (header, key, value, zero padding); the writer copies a batch
 *       once into a 16 MiB block-aligned write buffer (O_DIRECT needs aligned memory) and
 *       writes from there, up to 16 MiB per write. A 1 MiB buffer for scanning and compaction. With
 *       direct I/O, four 4 MiB aligned buffers for large reads.
 *       Nothing else grows with the data; reads allocate nothing large.</li>
 * </ul>
 *
 * <h2>Threads</h2>
 * One platform daemon thread, {@code kvpool-disk-writer}, does every file mutation: it drains the
 * staging queue in batches (a run per batch and file, laid out a write buffer at a time; a second
 * thread, {@code kvpool-disk-io}, writes each filled half of the buffer while the writer fills the
 * other, and the writer waits for both before it goes on), forces every file it wrote once per
 * batch, then indexes the batch and calls {@link Listener#stored}: "stored" means durable. It also evicts, compacts, deletes files and writes
 * tombstones. Callers' threads only take the store's lock for map updates (never for I/O) and do
 * their own positional reads. A read pins the file it reads ({@code readers++}); a compacted file is
 * closed and deleted when its last reader finishes, so compaction never waits for readers and readers
 * never see a file vanish under them. An interrupted reader closes a FileChannel for every thread (a
 * JDK rule); {@link DataFile} reopens it, so only the interrupted read fails.
 *
 * <h2>Space</h2>
 * {@code usedBytes} is the bytes in files; {@code liveBytes} the bytes of live records. Before an
 * append would take usedBytes past {@code highWatermark * capacity} (and after a batch that did), the
 * writer evicts the coldest live objects until liveBytes (plus the record) is at most
 * {@code lowWatermark * capacity}: objects never read are coldest, oldest first, then objects by last
 * read. Then it compacts: a file less than half live has its live records copied to the active file
 * (forced), their slots moved, and is deleted, so each byte copied frees at least one. That rule also
 * runs after every batch and after removals. Under pressure (usedBytes still past the high watermark,
 * because eviction left garbage spread thin) the files with the most garbage are compacted whatever
 * their live fraction; if the record still does not fit, eviction goes on a file's worth at a time,
 * still coldest first. A compaction starts only if its copies fit, and an append only if the record
 * fits: usedBytes never exceeds the capacity. A record that cannot be placed is dropped (counted).
 * Files are at most a quarter of the capacity (an eighth by default), so that the live part of a
 * file with garbage to give back fits in the headroom left above the watermarks.
 *
 * <h2>Crash safety</h2>
 * New files are created, then the directory is forced. A batch is reported stored only after its
 * files were forced. A compacted file is deleted only after its copies were forced; if a crash leaves
 * both copies, the scan keeps the later one (the last record of the generation) and tombstones the
 * other. Tombstones are written by the writer shortly after the drop and forced; a crash in between
 * can bring a dropped object back (a valid copy: the same generation, checked by CRC), never a wrong
 * one. {@link #flush()} waits for them.
 */
public final class DiskStore implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(DiskStore.class);

    static final String LOCK_FILE = "kvpool-disk.lock";
    /**
     * Directories opened by a store in this process. Checked before the lock file is even opened: on
     * POSIX, closing any descriptor of a file drops the process's lock on it, so a second store must not
     * open (and close) the lock file of a first one.
     */
    private static final Set<Path> OPEN_DIRS = ConcurrentHashMap.newKeySet();
    private static final long KiB = 1L << 10;
    private static final long MiB = 1L << 20;
    /** Scan and compaction buffer. */
    private static final int COPY_BUFFER = (int) MiB;
    /** A batch takes at most this many bytes of ready records (at least one record). */
    private static final long MAX_BATCH_BYTES = 32 * MiB;
    /** Appends are written in pieces of at most half this (a multiple of any I/O block). */
    private static final int WRITE_BUFFER = (int) (16 * MiB);
    /** Smallest I/O block assumed: page-sized, aligned for O_DIRECT on any common device. */
    static final int MIN_IO_BLOCK = 4096;
    private static final String PROBE_FILE = "kvpool-disk.probe";
    /** Values at least this large are read with O_DIRECT (when appends are): see {@link #readInto}. */
    static final long DIRECT_READ_MIN = 128 * KiB;
    /** Aligned buffers for direct reads, and the size of each (one direct read at most). */
    private static final int BOUNCE_BUFFERS = 4;
    private static final int BOUNCE_BYTES = (int) (4 * MiB);
    /** Reads into a heap segment go through the JDK's temporary direct buffers: keep those small. */
    private static final int HEAP_READ_CHUNK = (int) (256 * KiB);

    /**
     * @param dir           directory of the log files (created if missing)
     * @param capacityBytes most bytes the files may take together
     * @param fileBytes     size at which a log file is closed and the next one started
     * @param stagingBytes  memory holding spills until the writer has written them
     * @param highWatermark fraction of the capacity in files that starts an eviction
     * @param lowWatermark  fraction of the capacity in live records that an eviction brings usage down to
     */
    public record Config(Path dir, long capacityBytes, long fileBytes, long stagingBytes, double highWatermark,
                         double lowWatermark) {

        public static final long DEFAULT_FILE_BYTES = 256 * MiB;
        public static final long MIN_DEFAULT_FILE_BYTES = MiB;
        public static final long DEFAULT_STAGING_BYTES = 64 * MiB;
        public static final double DEFAULT_HIGH_WATERMARK = 0.90;
        public static final double DEFAULT_LOW_WATERMARK = 0.80;
        public static final long MIN_CAPACITY_BYTES = 4 * MiB;
        public static final long MIN_FILE_BYTES = 64 * KiB;
        public static final long MIN_STAGING_BYTES = 4 * KiB;

        public Config {
            if (dir == null) {
                throw new IllegalArgumentException("disk tier: dir is required");
            }
            if (capacityBytes < MIN_CAPACITY_BYTES) {
                throw new IllegalArgumentException("disk tier: capacityBytes must be at least "
                        + Size.human(MIN_CAPACITY_BYTES) + ", got " + capacityBytes);
            }
            if (fileBytes < MIN_FILE_BYTES || fileBytes > capacityBytes / 4) {
                // a file must be small next to the capacity, or compacting it needs more room than is free
                throw new IllegalArgumentException("disk tier: fileBytes must be between " + Size.human(MIN_FILE_BYTES)
                        + " and a quarter of capacityBytes (" + capacityBytes / 4 + "), got " + fileBytes);
            }
            if (stagingBytes < MIN_STAGING_BYTES) {
                throw new IllegalArgumentException("disk tier: stagingBytes must be at least "
                        + Size.human(MIN_STAGING_BYTES) + ", got " + stagingBytes);
            }
            if (!(highWatermark > 0 && highWatermark <= 1)) {
                throw new IllegalArgumentException("disk tier: highWatermark must be in (0, 1], got " + highWatermark);
            }
            if (!(lowWatermark > 0 && lowWatermark < highWatermark)) {
                throw new IllegalArgumentException("disk tier: lowWatermark must be in (0, highWatermark "
                        + highWatermark + "), got " + lowWatermark);
            }
        }

        /**
         * Defaults for a tier of {@code capacityBytes} (at least 4 MiB) in {@code dir}: files of 256 MiB,
         * or an eighth of the capacity if that is smaller (at least 1 MiB); 64 MiB of staging; watermarks
         * 0.90/0.80.
         */
        public static Config defaults(Path dir, long capacityBytes) {
            long file = Math.min(DEFAULT_FILE_BYTES, Math.max(MIN_DEFAULT_FILE_BYTES, capacityBytes / 8));
            return new Config(dir, capacityBytes, file, DEFAULT_STAGING_BYTES, DEFAULT_HIGH_WATERMARK,
                    DEFAULT_LOW_WATERMARK);
        }

        public Config withFileBytes(long bytes) {
            return new Config(dir, capacityBytes, bytes, stagingBytes, highWatermark, lowWatermark);
        }

        public Config withStagingBytes(long bytes) {
            return new Config(dir, capacityBytes, fileBytes, bytes, highWatermark, lowWatermark);
        }

        public Config withWatermarks(double high, double low) {
            return new Config(dir, capacityBytes, fileBytes, stagingBytes, high, low);
        }
    }

    /** A live object of the tier. {@code hits}: successful reads since it was stored or the store opened. */
    public record Entry(byte[] key, long generation, long epoch, long valueLength, int valueCrc, int hits) {
    }

    /** Told what the tier holds. Called on the writer thread, in batches, never under the store's lock. */
    public interface Listener {
        /** These objects were written and forced: they survive a crash. */
        void stored(List<Entry> entries);

        /**
         * These objects are gone: evicted by the watermark, failed their checksum on a read, or replaced
         * by a newer generation of their key. Not called for {@link #remove} and {@link #reset}, which
         * the caller asked for.
         */
        void dropped(List<Entry> entries);
    }

    public enum ReadStatus { OK, NOT_FOUND, CORRUPT }

    /**
     * @param capacityBytes    configured capacity
     * @param usedBytes        bytes in log files (live, dead and not yet reclaimed)
     * @param liveBytes        bytes of live records (header, key, value, padding)
     * @param objects          live objects
     * @param hits             reads that returned OK
     * @param bytesRead        value bytes returned by those reads
     * @param bytesWritten     bytes written to log files: spilled records and compaction copies
     * @param queueDepthBytes  staging memory in use (records waiting or being written)
     * @param queuedItems      records waiting or being written
     * @param drops            spills refused by {@link #offer} or abandoned by the writer (no room, I/O error)
     * @param evictions        objects evicted to make room
     * @param compactions      files compacted or deleted because they emptied
     * @param checksumFailures reads whose value failed its CRC32C
     * @param skippedRecords   records or garbage runs skipped when the files were scanned at open
     */
    public record Stats(long capacityBytes, long usedBytes, long liveBytes, long objects, long hits, long bytesRead,
                        long bytesWritten, long queueDepthBytes, long queuedItems, long drops, long evictions,
                        long compactions, long checksumFailures, long skippedRecords) {
    }

    /** Where a record is; for tests. */
    record Location(Path file, long recordOffset, long valueOffset, long recordLength) {
    }

    /** One live object. Final fields never change; the others are guarded by the store's lock. */
    static final class Slot {
        /** The key bytes as a Latin-1 string (one char per byte): hashable, one byte per char in memory. */
        final String key;
        final long generation;
        final long epoch;
        final long valueLength;
        final int valueCrc;
        final long recordLength;
        /** Where the record is; changed only by the writer (compaction), under the lock. */
        DataFile file;
        long offset;
        int fileIndex;
        int hits;
        boolean live = true;
        /** Links in its coldness list: never read (insertion order) or read (last-read order). */
        Slot prev;
        Slot next;
        ColdList list;

        Slot(String key, long generation, long epoch, long valueLength, int valueCrc) {
            this.key = key;
            this.generation = generation;
            this.epoch = epoch;
            this.valueLength = valueLength;
            this.valueCrc = valueCrc;
            this.recordLength = ObjectLayout.regionLength(key.length(), valueLength);
        }

        long valuePosition() {
            return offset + ObjectLayout.valueOffset(key.length());
        }

        Entry entry() {
            return new Entry(key.getBytes(StandardCharsets.ISO_8859_1), generation, epoch, valueLength, valueCrc, hits);
        }
    }

    /** An intrusive doubly linked list of slots, coldest at the head. Guarded by the store's lock. */
    static final class ColdList {
        private Slot head;
        private Slot tail;

        void addLast(Slot s) {
            s.list = this;
            s.prev = tail;
            s.next = null;
            if (tail == null) {
                head = s;
            } else {
                tail.next = s;
            }
            tail = s;
        }

        void remove(Slot s) {
            if (s.prev == null) {
                head = s.next;
            } else {
                s.prev.next = s.next;
            }
            if (s.next == null) {
                tail = s.prev;
            } else {
                s.next.prev = s.prev;
            }
            s.prev = null;
            s.next = null;
            s.list = null;
        }

        Slot head() {
            return head;
        }
    }

    /** A spill waiting in staging. Guarded by the lock, except the writer-only fields. */
    private static final class Pending {
        final byte[] key;
        final long generation;
        final long epoch;
        final long valueLength;
        final int valueCrc;
        final long recordLength;
        final long ringOffset;
        final long ringWaste;
        final long seq;
        boolean ready;
        boolean cancelled;
        // writer only
        boolean skip;
        DataFile file;
        long filePos;

        Pending(byte[] key, long generation, long epoch, long valueLength, int valueCrc, long recordLength,
                long ringOffset, long ringWaste, long seq) {
            this.key = key;
            this.generation = generation;
            this.epoch = epoch;
            this.valueLength = valueLength;
            this.valueCrc = valueCrc;
            this.recordLength = recordLength;
            this.ringOffset = ringOffset;
            this.ringWaste = ringWaste;
            this.seq = seq;
        }
    }

    /** A record to mark DEAD. */
    private record Tomb(DataFile file, long offset) {
    }

    /** Records adjacent in a file, starting at a block boundary: written together, padded to a whole block. */
    private static final class Run {
        final DataFile file;
        final long filePos;
        final List<Pending> records = new ArrayList<>();
        long length;

        Run(DataFile file, long filePos) {
            this.file = file;
            this.filePos = filePos;
        }

        void add(Pending p) {
            records.add(p);
            length += p.recordLength;
        }
    }

    private final Config config;
    private final Listener listener;
    private final Path dir;
    private final Path realDir;
    private final long highMark;
    private final long lowMark;

    private final Arena arena;
    private final MemorySegment ring;
    private final MemorySegment copyBuf;
    /** Appends are laid out here, block-aligned, and written from here (O_DIRECT needs aligned memory). */
    private final MemorySegment writeBuf;
    /** The two halves of {@link #writeBuf}: one is filled while the I/O thread writes the other. */
    private final MemorySegment[] writeBufs;
    /** Writes in flight from each half; writer thread only. */
    @SuppressWarnings("unchecked")
    private final Future<Void>[] writes = new Future[2];
    /** Writes appends, so that the writer can lay out the next piece meanwhile. */
    private final ExecutorService io;
    /** The I/O block: appends start at multiples of it and are padded with zeros to one. */
    private final int ioBlock;
    /** Whether appends bypass the page cache (O_DIRECT); false where the file system refuses it. */
    private final boolean directIo;
    /** Aligned buffers for large reads through O_DIRECT; empty without direct I/O. A read finding none free reads buffered. */
    private final ArrayBlockingQueue<MemorySegment> bounce = new ArrayBlockingQueue<>(BOUNCE_BUFFERS);
    private final ByteBuffer deadByte;
    private final FileChannel lockChannel;
    private final FileLock dirLock;
    private final Thread writer;

    private final ReentrantLock lock = new ReentrantLock();
    /** Signals the writer: a record became ready, housekeeping is wanted, or the store is closing. */
    private final Condition work = lock.newCondition();
    /** Signals waiters of flush/close: a batch was committed, a housekeeping pass ended, the writer ended. */
    private final Condition progress = lock.newCondition();

    // ---- guarded by lock ----
    private final Map<Long, Slot> index = new HashMap<>();
    private final Map<String, Slot> byKey = new HashMap<>();
    private final TreeMap<Integer, DataFile> files = new TreeMap<>();
    private DataFile active;
    private int nextFileId;
    private final StagingRing staging;
    private final ArrayDeque<Pending> queue = new ArrayDeque<>();
    private final Map<Long, Pending> pending = new HashMap<>();
    private long stagedItems;
    private int copiesInFlight;
    private List<Tomb> tombs = new ArrayList<>();
    private List<Slot> dropReports = new ArrayList<>();
    private boolean housekeepingWanted;
    private long fenceEpoch = Long.MIN_VALUE;
    /** Eviction order: never-read objects first, oldest first; then read ones, least recently read first. */
    private final ColdList neverRead = new ColdList();
    private final ColdList readOnce = new ColdList();
    private long reservedSeq;
    private long writtenSeq;
    private long passStarted;
    private long passDone;
    /** No more spills (close() was called, or the writer failed). */
    private boolean closing;
    private boolean closeCalled;
    private boolean closed;
    private boolean writerDone;
    private long usedBytes;
    private long liveBytes;
    private long hits;
    private long bytesRead;
    private long bytesWritten;
    private long drops;
    private long evictions;
    private long compactions;
    private long checksumFailures;
    private long skippedRecords;

    /**
     * Opens the tier in {@code config.dir()}, creating the directory if missing, and rebuilds the index
     * from the log files there (see the class comment for what the scan keeps and skips). Starts the
     * writer thread.
     *
     * @throws IOException if the directory cannot be created or read, or another store has it open
     */
    public DiskStore(Config config, Listener listener) throws IOException {
        this(config, listener, true);
    }

    /** With {@code tryDirect} false, appends go through the page cache even where O_DIRECT works. */
    DiskStore(Config config, Listener listener, boolean tryDirect) throws IOException {
        this.config = Objects.requireNonNull(config, "config");
        this.listener = Objects.requireNonNull(listener, "listener");
        this.dir = config.dir();
        this.highMark = (long) (config.highWatermark() * config.capacityBytes());
        this.lowMark = (long) (config.lowWatermark() * config.capacityBytes());
        Files.createDirectories(dir);
        this.realDir = dir.toRealPath();
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
        this.lockChannel = lc;
        this.dirLock = l;
        long ringBytes = config.stagingBytes() & -ObjectLayout.ALIGNMENT;
        this.staging = new StagingRing(ringBytes);
        this.arena = Arena.ofShared();
        try {
            this.ring = arena.allocate(ringBytes, ObjectLayout.ALIGNMENT);
            this.copyBuf = arena.allocate(COPY_BUFFER, 4096);
            this.ioBlock = ioBlock(dir);
            this.writeBuf = arena.allocate(WRITE_BUFFER, ioBlock);
            this.writeBufs = new MemorySegment[]{writeBuf.asSlice(0, WRITE_BUFFER / 2),
                    writeBuf.asSlice(WRITE_BUFFER / 2, WRITE_BUFFER / 2)};
            this.directIo = tryDirect && probeDirect(dir, writeBuf.asSlice(0, ioBlock));
            if (directIo) {
                for (int i = 0; i < BOUNCE_BUFFERS; i++) {
                    bounce.add(arena.allocate(BOUNCE_BYTES, ioBlock));
                }
            }
            this.deadByte = ByteBuffer.allocateDirect(1).put(0, ObjectLayout.STATE_DEAD);
            long t0 = System.nanoTime();
            open();
            log.info("disk tier {}: {} objects, {} live in {} used of {}, {} files, {} records skipped, scanned in {} ms;"
                            + " appends {} in {}-byte blocks",
                    dir, index.size(), Size.human(liveBytes), Size.human(usedBytes), Size.human(config.capacityBytes()),
                    files.size(), skippedRecords, (System.nanoTime() - t0) / 1_000_000,
                    directIo ? "direct (O_DIRECT)" : "through the page cache", ioBlock);
        } catch (Throwable e) {
            for (DataFile f : files.values()) {
                f.close();
            }
            arena.close();
            dirLock.release();
            lockChannel.close();
            OPEN_DIRS.remove(realDir);
            throw e;
        }
        this.io = Executors.newSingleThreadExecutor(Thread.ofPlatform().name("kvpool-disk-io").daemon(true).factory());
        this.writer = Thread.ofPlatform().name("kvpool-disk-writer").daemon(true).unstarted(this::writerLoop);
        writer.start();
    }

    // ------------------------------------------------------------------------------------------------
    // open: scan and rebuild
    // ------------------------------------------------------------------------------------------------

    private void open() throws IOException {
        List<Path> found = new ArrayList<>();
        try (Stream<Path> s = Files.list(dir)) {
            s.filter(p -> DataFile.idOf(p) >= 0 && Files.isRegularFile(p)).forEach(found::add);
        }
        for (Path p : found) {
            DataFile f = DataFile.open(p, DataFile.idOf(p));
            files.put(f.id, f);
        }
        LogScanner scanner = new LogScanner(copyBuf);
        for (DataFile f : List.copyOf(files.values())) {
            nextFileId = Math.max(nextFileId, f.id + 1);
            long size = f.channelSize();
            LogScanner.Result r = scanner.scan(f, size, new LogScanner.Visitor() {
                @Override
                public void live(long offset, ObjectLayout.Header h) {
                    admitScanned(f, offset, h);
                }

                @Override
                public void dead(long offset, ObjectLayout.Header h) {
                    // the last record of a generation decides: this tombstone kills the copies before it
                    Slot earlier = index.get(h.generation());
                    if (earlier != null) {
                        dropSlot(earlier, true);
                    }
                }
            });
            skippedRecords += r.skipped();
            if (r.validEnd() < size) {
                log.warn("disk tier: {} has {} bytes of garbage after its last valid record at {}; truncated",
                        f.path, size - r.validEnd(), r.validEnd());
                f.truncate(r.validEnd());
            }
            f.size = r.validEnd();
            usedBytes += f.size;
        }
        for (DataFile f : List.copyOf(files.values())) {
            if (f.size == 0) {
                files.remove(f.id);
                f.closeAndDelete();
            }
        }
        if (!files.isEmpty() && files.lastEntry().getValue().size < config.fileBytes()) {
            active = files.lastEntry().getValue();
        }
        nextFileId = Math.max(nextFileId, 1);
        housekeepingWanted = !tombs.isEmpty();
    }

    /**
     * A live record found by the scan. Records are scanned in append order (file number, offset), and
     * the last record of a generation decides: a later copy replaces an earlier one (left by a crash
     * during compaction: same generation, same bytes), which is marked dead. Of two generations of a
     * key, the newer one is kept.
     */
    private void admitScanned(DataFile f, long offset, ObjectLayout.Header h) {
        Slot earlier = index.get(h.generation());
        if (earlier != null) {
            tombs.add(new Tomb(earlier.file, earlier.offset));
            relocate(earlier, f, offset);
            return;
        }
        String key = new String(h.key(), StandardCharsets.ISO_8859_1);
        Slot same = byKey.get(key);
        if (same != null) {
            if (same.generation > h.generation()) {
                tombs.add(new Tomb(f, offset));
                return;
            }
            dropSlot(same, true);
        }
        Slot s = new Slot(key, h.generation(), h.epoch(), h.valueLength(), h.valueCrc());
        addSlot(s, f, offset);
    }

    // ------------------------------------------------------------------------------------------------
    // index helpers (under lock)
    // ------------------------------------------------------------------------------------------------

    private void addSlot(Slot s, DataFile f, long offset) {
        s.file = f;
        s.offset = offset;
        s.fileIndex = f.slots.size();
        f.slots.add(s);
        f.live += s.recordLength;
        liveBytes += s.recordLength;
        index.put(s.generation, s);
        byKey.put(s.key, s);
        neverRead.addLast(s);
    }

    private static void unlinkFromFile(Slot s) {
        DataFile f = s.file;
        Slot last = f.slots.removeLast();
        if (last != s) {
            f.slots.set(s.fileIndex, last);
            last.fileIndex = s.fileIndex;
        }
        f.live -= s.recordLength;
    }

    /** Removes a live slot from the index; with {@code tomb}, queues the DEAD mark of its record. */
    private void dropSlot(Slot s, boolean tomb) {
        s.live = false;
        s.list.remove(s);
        index.remove(s.generation);
        byKey.remove(s.key, s);
        unlinkFromFile(s);
        liveBytes -= s.recordLength;
        if (tomb) {
            tombs.add(new Tomb(s.file, s.offset));
            housekeepingWanted = true;
        }
    }

    private void relocate(Slot s, DataFile to, long offset) {
        unlinkFromFile(s);
        s.file = to;
        s.offset = offset;
        s.fileIndex = to.slots.size();
        to.slots.add(s);
        to.live += s.recordLength;
    }

    /** Takes a file out of the store. Returns it if it is to be closed and deleted now (outside the lock). */
    private DataFile retire(DataFile f) {
        f.retired = true;
        files.remove(f.id);
        usedBytes -= f.size;
        if (active == f) {
            active = null;
        }
        return f.readers == 0 ? f : null;
    }

    private static List<Entry> entriesOf(List<Slot> slots) {
        List<Entry> out = new ArrayList<>(slots.size());
        for (Slot s : slots) {
            out.add(s.entry());
        }
        return out;
    }

    // ------------------------------------------------------------------------------------------------
    // public API
    // ------------------------------------------------------------------------------------------------

    /**
     * Queues a spill. The value is copied now, with its header, into staging memory (bounded by
     * stagingBytes); the caller may reuse its memory as soon as this returns. Never waits for I/O or
     * for the writer (only for the store's lock, which nobody holds during I/O).
     *
     * <p>Returns false, counting a drop, if the store is closing, staging is full, the record (the
     * value plus 64 to 640 bytes of header, key and padding) is larger than staging or the capacity, {@code epoch} is older than the last {@link #reset}, or a
     * newer generation of the key is already here. Returns true without queueing anything if this
     * generation is already stored or queued. A queued spill is not stored until the listener says
     * so; the writer can still drop it (counted) if eviction cannot make room, or cancel it if it is
     * removed or reset first.
     *
     * @param valueCrc the value's CRC32C as in its header; every read checks the value against it
     * @throws IllegalArgumentException for an empty key or one longer than {@link Keys#MAX_KEY_BYTES}
     */
    public boolean offer(byte[] key, long generation, long epoch, MemorySegment value, int valueCrc) {
        Objects.requireNonNull(key, "key");
        Objects.requireNonNull(value, "value");
        if (key.length == 0 || key.length > Keys.MAX_KEY_BYTES) {
            throw new IllegalArgumentException("disk tier: key of " + key.length + " bytes; keys have 1 to "
                    + Keys.MAX_KEY_BYTES + " bytes");
        }
        long valueLength = value.byteSize();
        long recordLength = ObjectLayout.regionLength(key.length, valueLength);
        Pending p;
        lock.lock();
        try {
            if (index.containsKey(generation) || pending.containsKey(generation)) {
                return !closing;
            }
            Slot same = byKey.get(new String(key, StandardCharsets.ISO_8859_1));
            if (closing || epoch < fenceEpoch || recordLength > staging.size() || recordLength > config.capacityBytes()
                    || (same != null && same.generation > generation)) {
                drops++;
                return false;
            }
            long[] waste = new long[1];
            long at = staging.reserve(recordLength, waste);
            if (at < 0) {
                drops++;
                return false;
            }
            p = new Pending(key.clone(), generation, epoch, valueLength, valueCrc, recordLength, at, waste[0], ++reservedSeq);
            queue.addLast(p);
            pending.put(generation, p);
            stagedItems++;
            copiesInFlight++;
        } finally {
            lock.unlock();
        }
        boolean ok = false;
        try {
            MemorySegment rec = ring.asSlice(p.ringOffset, recordLength);
            ObjectLayout.writeHeader(rec, 0, ObjectLayout.STATE_COMPLETE, p.key, valueLength, generation, epoch, valueCrc);
            long keyEnd = ObjectLayout.KEY_OFFSET + key.length;
            long valueOffset = ObjectLayout.valueOffset(key.length);
            rec.asSlice(keyEnd, valueOffset - keyEnd).fill((byte) 0);
            MemorySegment.copy(value, 0, rec, valueOffset, valueLength);
            rec.asSlice(valueOffset + valueLength, recordLength - valueOffset - valueLength).fill((byte) 0);
            ok = true;
        } finally {
            lock.lock();
            try {
                p.ready = true;
                copiesInFlight--;
                if (!ok) {
                    p.cancelled = true;
                    pending.remove(generation, p);
                }
                work.signal();
                progress.signalAll();
            } finally {
                lock.unlock();
            }
        }
        return true;
    }

    /**
     * Reads the value of {@code generation} into {@code dst} (native or byte[]-backed, of exactly the
     * value's length) and checks it against its CRC32C. OK: dst holds exactly the stored value, its
     * hit count goes up and it becomes the most recently read object (the last to be evicted). NOT_FOUND: no such object (or the store is
     * closed). CORRUPT: the bytes on disk are damaged; dst is zeroed, the object is dropped (reported
     * to the listener) and a checksum failure counted. Safe concurrently with everything; a record
     * moved by compaction meanwhile is read from the file it was found in, which lives until the read
     * ends.
     *
     * @throws IllegalArgumentException if {@code dst.byteSize()} is not the value length
     * @throws IOException              if the file cannot be read
     */
    public ReadStatus read(long generation, MemorySegment dst) throws IOException {
        Objects.requireNonNull(dst, "dst");
        Slot s;
        DataFile f;
        long pos;
        lock.lock();
        try {
            s = closed ? null : index.get(generation);
            if (s == null) {
                return ReadStatus.NOT_FOUND;
            }
            if (dst.byteSize() != s.valueLength) {
                throw new IllegalArgumentException("disk tier: generation " + generation + " has a value of "
                        + s.valueLength + " bytes, destination has " + dst.byteSize());
            }
            f = s.file;
            pos = s.valuePosition();
            f.readers++;
        } finally {
            lock.unlock();
        }
        boolean complete = false;
        try {
            complete = readInto(f, pos, dst);
        } finally {
            DataFile toClose = null;
            lock.lock();
            try {
                if (--f.readers == 0 && (f.retired || f.closeWhenIdle)) {
                    toClose = f;
                }
            } finally {
                lock.unlock();
            }
            if (toClose != null) {
                if (toClose.retired) {
                    toClose.closeAndDelete();
                } else {
                    toClose.close();
                }
            }
        }
        boolean intact = complete && ObjectLayout.valueCrc(dst) == s.valueCrc;
        lock.lock();
        try {
            if (intact) {
                hits++;
                bytesRead += s.valueLength;
                if (s.hits < Integer.MAX_VALUE) {
                    s.hits++;
                }
                if (s.live) {
                    s.list.remove(s);
                    readOnce.addLast(s); // now the most recently read
                }
                return ReadStatus.OK;
            }
            checksumFailures++;
            if (s.live) {
                dropSlot(s, true);
                dropReports.add(s);
                work.signal();
            }
        } finally {
            lock.unlock();
        }
        log.warn("disk tier: generation {} in {} at {} failed its checksum{}; dropped", generation, f, pos,
                complete ? "" : " (file too short)");
        dst.fill((byte) 0);
        return ReadStatus.CORRUPT;
    }

    /**
     * Reads {@code dst.byteSize()} bytes at {@code pos}. Large values go through O_DIRECT when the
     * store writes that way: the whole blocks covering each piece are read into a free bounce buffer
     * and the piece copied out. A buffered read of a value written around the page cache waits on the
     * device one readahead window at a time (0.6 GB/s here for 1 MiB reads, against 2 GB/s direct);
     * the extra copy costs far less. Small values, and reads finding no bounce buffer free, read
     * through the page cache.
     */
    private boolean readInto(DataFile f, long pos, MemorySegment dst) throws IOException {
        long n = dst.byteSize();
        if (n >= DIRECT_READ_MIN) {
            MemorySegment b = bounce.poll();
            if (b != null) {
                try {
                    return readDirect(f, pos, dst, b);
                } finally {
                    bounce.add(b);
                }
            }
        }
        int chunk = dst.isNative() ? DataFile.MAX_IO : HEAP_READ_CHUNK;
        long off = 0;
        while (off < n) {
            int len = (int) Math.min(chunk, n - off);
            if (!f.readFully(dst.asSlice(off, len).asByteBuffer(), pos + off)) {
                return false;
            }
            off += len;
        }
        return true;
    }

    private boolean readDirect(DataFile f, long pos, MemorySegment dst, MemorySegment buf) throws IOException {
        long n = dst.byteSize();
        long off = 0;
        while (off < n) {
            long from = pos + off;
            long start = from / ioBlock * ioBlock;
            long len = Math.min(buf.byteSize(), alignUp(pos + n, ioBlock) - start);
            long got = f.readDirect(buf.asSlice(0, len), start);
            long piece = Math.min(n - off, start + got - from);
            if (piece <= 0) {
                return false; // the file ends before the value does
            }
            MemorySegment.copy(buf, from - start, dst, off, piece);
            off += piece;
        }
        return true;
    }

    /** The live object with this generation, or null (also while it is only queued). */
    public Entry lookup(long generation) {
        lock.lock();
        try {
            Slot s = index.get(generation);
            return s == null ? null : s.entry();
        } finally {
            lock.unlock();
        }
    }

    /**
     * Drops an object (the master freed it), or cancels its queued spill. Its record is marked DEAD by
     * the writer shortly after ({@link #flush} waits for that). Returns false if it was not here.
     */
    public boolean remove(long generation) {
        lock.lock();
        try {
            Slot s = index.get(generation);
            if (s != null) {
                dropSlot(s, true);
                work.signal();
                return true;
            }
            Pending p = pending.remove(generation);
            if (p != null) {
                p.cancelled = true;
                return true;
            }
            return false;
        } finally {
            lock.unlock();
        }
    }

    /**
     * Drops every object and queued spill with an epoch older than {@code epoch}, and refuses spills
     * from those epochs from now on. Files left without live records are deleted by the writer
     * ({@link #flush} waits for that). Returns how many objects and queued spills were dropped.
     */
    public long reset(long epoch) {
        lock.lock();
        try {
            fenceEpoch = Math.max(fenceEpoch, epoch);
            List<Slot> old = new ArrayList<>();
            for (Slot s : index.values()) {
                if (s.epoch < epoch) {
                    old.add(s);
                }
            }
            for (Slot s : old) {
                dropSlot(s, true);
            }
            long n = old.size();
            for (var it = pending.values().iterator(); it.hasNext(); ) {
                Pending p = it.next();
                if (p.epoch < epoch) {
                    p.cancelled = true;
                    it.remove();
                    n++;
                }
            }
            housekeepingWanted = true;
            work.signal();
            return n;
        } finally {
            lock.unlock();
        }
    }

    /** The live objects, for registering with the master. */
    public List<Entry> entries() {
        lock.lock();
        try {
            List<Entry> out = new ArrayList<>(index.size());
            for (Slot s : index.values()) {
                out.add(s.entry());
            }
            return out;
        } finally {
            lock.unlock();
        }
    }

    /** Whether appends bypass the page cache (O_DIRECT), as probed when the store opened. */
    public boolean directIo() {
        return directIo;
    }

    /** The block appends are aligned and padded to. */
    public int ioBlock() {
        return ioBlock;
    }

    public Stats stats() {
        lock.lock();
        try {
            return new Stats(config.capacityBytes(), usedBytes, liveBytes, index.size(), hits, bytesRead, bytesWritten,
                    staging.used(), stagedItems, drops, evictions, compactions, checksumFailures, skippedRecords);
        } finally {
            lock.unlock();
        }
    }

    public Config config() {
        return config;
    }

    /**
     * Waits until every spill queued before this call has been written (or dropped) and a writer pass
     * started after it has run: tombstones of earlier removals written, emptied files deleted.
     */
    public void flush() throws InterruptedException {
        if (Thread.currentThread() == writer) {
            throw new IllegalStateException("disk tier: flush() called from a listener, on the writer thread");
        }
        lock.lock();
        try {
            long target = reservedSeq;
            while (writtenSeq < target && !writerDone) {
                progress.await();
            }
            long pass = passStarted;
            housekeepingWanted = true;
            work.signal();
            while (passDone <= pass && !writerDone) {
                progress.await();
            }
        } finally {
            lock.unlock();
        }
    }

    /**
     * Stops taking spills, lets the writer write what is queued, forces and closes the files, and frees
     * the staging memory. Reads still in progress finish on their file; later reads return NOT_FOUND.
     */
    @Override
    public void close() {
        if (Thread.currentThread() == writer) {
            throw new IllegalStateException("disk tier: close() called from a listener, on the writer thread");
        }
        lock.lock();
        try {
            if (closeCalled) {
                return;
            }
            closeCalled = true;
            closing = true;
            work.signalAll();
        } finally {
            lock.unlock();
        }
        boolean interrupted = false;
        while (writer.isAlive()) {
            try {
                writer.join();
            } catch (InterruptedException e) {
                interrupted = true;
            }
        }
        io.shutdown(); // idle: the writer waited for every write it started
        while (!io.isTerminated()) {
            try {
                io.awaitTermination(1, TimeUnit.MINUTES);
            } catch (InterruptedException e) {
                interrupted = true;
            }
        }
        List<DataFile> toClose = new ArrayList<>();
        lock.lock();
        try {
            closed = true;
            while (copiesInFlight > 0) {
                progress.awaitUninterruptibly();
            }
            for (DataFile f : files.values()) {
                if (f.readers == 0) {
                    toClose.add(f);
                } else {
                    f.closeWhenIdle = true;
                }
            }
        } finally {
            lock.unlock();
        }
        for (DataFile f : toClose) {
            f.close();
        }
        arena.close();
        try {
            dirLock.release();
            lockChannel.close();
        } catch (IOException e) {
            log.warn("disk tier {}: releasing the directory lock: {}", dir, e.toString());
        }
        OPEN_DIRS.remove(realDir);
        if (interrupted) {
            Thread.currentThread().interrupt();
        }
        log.info("disk tier {} closed", dir);
    }

    /** For tests: where the record of a live generation is, or null. */
    Location locate(long generation) {
        lock.lock();
        try {
            Slot s = index.get(generation);
            return s == null ? null
                    : new Location(s.file.path, s.offset, s.valuePosition(), s.recordLength);
        } finally {
            lock.unlock();
        }
    }

    // ------------------------------------------------------------------------------------------------
    // the writer
    // ------------------------------------------------------------------------------------------------

    private void writerLoop() {
        try {
            while (true) {
                List<Pending> batch;
                boolean exit;
                lock.lock();
                try {
                    while (!headReady() && !housekeepingWanted && !(closing && queue.isEmpty())) {
                        work.awaitUninterruptibly();
                    }
                    batch = takeReady();
                    exit = closing && queue.isEmpty() && batch.isEmpty();
                } finally {
                    lock.unlock();
                }
                if (!batch.isEmpty()) {
                    writeBatch(batch);
                }
                housekeeping();
                if (exit) {
                    break;
                }
            }
            List<DataFile> all;
            lock.lock();
            try {
                all = List.copyOf(files.values());
            } finally {
                lock.unlock();
            }
            for (DataFile f : all) {
                try {
                    f.force();
                } catch (IOException e) {
                    log.warn("disk tier: forcing {} at close: {}", f, e.toString());
                }
            }
        } catch (Throwable t) {
            log.error("disk tier {}: the writer stopped; spills are refused from now on", dir, t);
            lock.lock();
            try {
                closing = true; // refuse offers; reads keep working
            } finally {
                lock.unlock();
            }
        } finally {
            lock.lock();
            try {
                writerDone = true;
                progress.signalAll();
            } finally {
                lock.unlock();
            }
        }
    }

    private boolean headReady() {
        Pending p = queue.peekFirst();
        return p != null && p.ready;
    }

    /** Ready records from the head of the queue, in order, up to MAX_BATCH_BYTES (at least one). */
    private List<Pending> takeReady() {
        List<Pending> batch = new ArrayList<>();
        long bytes = 0;
        while (headReady()) {
            Pending p = queue.peekFirst();
            if (!batch.isEmpty() && bytes + p.recordLength > MAX_BATCH_BYTES) {
                break;
            }
            queue.pollFirst();
            p.skip = p.cancelled;
            batch.add(p);
            bytes += p.recordLength;
        }
        return batch;
    }

    private void writeBatch(List<Pending> batch) {
        List<Run> runs = new ArrayList<>();
        Set<DataFile> touched = new LinkedHashSet<>();
        List<Slot> evicted = new ArrayList<>();
        long placed = 0;
        boolean failed = false;
        try {
            for (Pending p : batch) {
                if (p.skip) {
                    continue;
                }
                if (!ensureRoom(p.recordLength + ioBlock, evicted)) {
                    lock.lock();
                    try {
                        drops++;
                    } finally {
                        lock.unlock();
                    }
                    continue;
                }
                DataFile f = appendTarget(p.recordLength);
                Run last = runs.isEmpty() ? null : runs.getLast();
                // a record follows the previous one if nothing was appended between them (compaction
                // can, while making room); otherwise it starts a new run at the next block boundary
                boolean follows = last != null && last.file == f && sizeOf(f) == last.filePos + last.length;
                long pos = claim(f, p.recordLength, true, !follows);
                touched.add(f);
                p.file = f;
                p.filePos = pos;
                placed++;
                if (follows) {
                    last.add(p);
                } else {
                    last = new Run(f, pos);
                    last.add(p);
                    runs.add(last);
                }
            }
            long written = 0;
            for (Run r : runs) {
                padRun(r);
                written += writeRun(r);
            }
            for (DataFile f : touched) {
                f.force();
            }
            lock.lock();
            try {
                bytesWritten += written;
            } finally {
                lock.unlock();
            }
        } catch (IOException e) {
            log.warn("disk tier {}: writing {} records failed, they are dropped: {}", dir, placed, e.toString());
            failed = true;
        }
        List<Entry> stored = new ArrayList<>(batch.size());
        List<Slot> superseded = new ArrayList<>();
        lock.lock();
        try {
            if (failed) {
                drops += placed;
                if (active != null && touched.contains(active)) {
                    active = null; // start clean in a new file
                }
            }
            for (Pending p : batch) {
                pending.remove(p.generation, p);
                if (!failed && p.file != null) {
                    if (p.cancelled || p.epoch < fenceEpoch) {
                        tombs.add(new Tomb(p.file, p.filePos));
                        housekeepingWanted = true;
                    } else {
                        commit(p, stored, superseded);
                    }
                }
                staging.release(p.ringOffset, p.recordLength, p.ringWaste);
                stagedItems--;
            }
            for (DataFile f : touched) {
                f.pinned = false;
            }
            writtenSeq = batch.getLast().seq;
            progress.signalAll();
        } finally {
            lock.unlock();
        }
        evicted.addAll(superseded);
        reportDropped(evicted);
        reportStored(stored);
    }

    /** Indexes a written record (under lock). */
    private void commit(Pending p, List<Entry> stored, List<Slot> superseded) {
        Slot existing = index.get(p.generation);
        if (existing != null) {
            // cannot happen (offer refuses a generation that is stored or queued); if it did, the new
            // copy is the last record of the generation, so it becomes the live one
            tombs.add(new Tomb(existing.file, existing.offset));
            housekeepingWanted = true;
            relocate(existing, p.file, p.filePos);
            return;
        }
        String key = new String(p.key, StandardCharsets.ISO_8859_1);
        Slot same = byKey.get(key);
        if (same != null && same.generation > p.generation) {
            tombs.add(new Tomb(p.file, p.filePos));
            housekeepingWanted = true;
            return;
        }
        if (same != null) {
            dropSlot(same, true);
            superseded.add(same);
        }
        Slot s = new Slot(key, p.generation, p.epoch, p.valueLength, p.valueCrc);
        addSlot(s, p.file, p.filePos);
        stored.add(s.entry());
    }

    /** The file to append {@code n} bytes to: the active one, or a new one if it is full. */
    private DataFile appendTarget(long n) throws IOException {
        lock.lock();
        try {
            if (active != null && active.size > 0 && active.size + n > config.fileBytes()) {
                active = null; // full: stays as it is, a compaction candidate from now on
            }
            if (active != null) {
                return active;
            }
        } finally {
            lock.unlock();
        }
        int id;
        lock.lock();
        try {
            id = nextFileId++;
        } finally {
            lock.unlock();
        }
        DataFile f = DataFile.create(dir, id);
        forceDirectory();
        lock.lock();
        try {
            files.put(f.id, f);
            active = f;
        } finally {
            lock.unlock();
        }
        return f;
    }

    /**
     * Hands out {@code n} bytes at the end of {@code f}; with {@code newRun}, at the next block boundary
     * (the bytes skipped are zeros: padding, in the used bytes).
     */
    private long claim(DataFile f, long n, boolean pin, boolean newRun) {
        lock.lock();
        try {
            if (newRun) {
                long aligned = alignUp(f.size, ioBlock);
                usedBytes += aligned - f.size;
                f.size = aligned;
            }
            long pos = f.size;
            f.size += n;
            usedBytes += n;
            if (pin) {
                f.pinned = true;
            }
            return pos;
        } finally {
            lock.unlock();
        }
    }

    private long sizeOf(DataFile f) {
        lock.lock();
        try {
            return f.size;
        } finally {
            lock.unlock();
        }
    }

    private static long alignUp(long x, long block) {
        return (x + block - 1) / block * block;
    }

    /** A run is written padded to a whole block: its file takes the padding too, unless something followed. */
    private void padRun(Run r) {
        lock.lock();
        try {
            DataFile f = r.file;
            if (f.size == r.filePos + r.length) {
                long aligned = alignUp(f.size, ioBlock);
                usedBytes += aligned - f.size;
                f.size = aligned;
            }
        } finally {
            lock.unlock();
        }
    }

    /**
     * Writes a run: its records copied from staging into the aligned write buffers, each buffer written
     * by the I/O thread while the next is filled (the copy overlaps the device's work), the last piece
     * padded with zeros to a whole block. Returns the bytes written. Waits for every write it started.
     */
    private long writeRun(Run r) throws IOException {
        long cap = writeBufs[0].byteSize();
        long fileAt = r.filePos;
        long fill = 0;
        int cur = 0;
        try {
            for (Pending p : r.records) {
                for (long off = 0; off < p.recordLength; ) {
                    long n = Math.min(cap - fill, p.recordLength - off);
                    MemorySegment.copy(ring, p.ringOffset + off, writeBufs[cur], fill, n);
                    fill += n;
                    off += n;
                    if (fill == cap) {
                        submitWrite(cur, r.file, writeBufs[cur], fileAt);
                        fileAt += fill;
                        fill = 0;
                        cur ^= 1;
                        awaitWrite(cur); // the buffer to fill next
                    }
                }
            }
            if (fill > 0) {
                long padded = alignUp(fill, ioBlock);
                writeBufs[cur].asSlice(fill, padded - fill).fill((byte) 0);
                submitWrite(cur, r.file, writeBufs[cur].asSlice(0, padded), fileAt);
                fileAt += padded;
            }
            awaitWrite(0);
            awaitWrite(1);
            return fileAt - r.filePos;
        } finally {
            drainWrites(); // after a failure: no write may still use a buffer
        }
    }

    private void submitWrite(int buffer, DataFile f, MemorySegment src, long pos) {
        writes[buffer] = io.submit(() -> {
            f.writeAligned(src, pos, directIo);
            return null;
        });
    }

    /** Waits for the write from {@code buffer}, if any; its failure is this call's. */
    private void awaitWrite(int buffer) throws IOException {
        Future<Void> w = writes[buffer];
        if (w == null) {
            return;
        }
        writes[buffer] = null;
        boolean interrupted = false;
        try {
            while (true) {
                try {
                    w.get();
                    return;
                } catch (InterruptedException e) {
                    interrupted = true; // the write is in flight on its buffer: it must end first
                } catch (ExecutionException e) {
                    if (e.getCause() instanceof IOException io) {
                        throw io;
                    }
                    throw new IOException("disk tier write failed", e.getCause());
                }
            }
        } finally {
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
    }

    private void drainWrites() {
        for (int i = 0; i < writes.length; i++) {
            try {
                awaitWrite(i);
            } catch (IOException ignored) {
                // reported by the caller's own await, or the run already failed
            }
        }
    }

    /** The I/O block of the file system holding {@code dir}: its block size if larger than a page. */
    private static int ioBlock(Path dir) {
        try {
            long b = Files.getFileStore(dir).getBlockSize();
            if (b > MIN_IO_BLOCK && b <= WRITE_BUFFER && Long.bitCount(b) == 1) {
                return (int) b;
            }
        } catch (IOException | UnsupportedOperationException e) {
            log.debug("disk tier: block size of {} unknown ({}); using {}", dir, e.toString(), MIN_IO_BLOCK);
        }
        return MIN_IO_BLOCK;
    }

    /** Whether O_DIRECT writes work in {@code dir}: one aligned block written to a scratch file, then deleted. */
    private static boolean probeDirect(Path dir, MemorySegment block) {
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

    private void forceDirectory() {
        try (FileChannel d = FileChannel.open(dir, StandardOpenOption.READ)) {
            d.force(true);
        } catch (IOException e) {
            log.debug("disk tier: cannot force directory {}: {}", dir, e.toString());
        }
    }

    private long used() {
        lock.lock();
        try {
            return usedBytes;
        } finally {
            lock.unlock();
        }
    }

    /** Before appending {@code n} bytes: evicts and compacts past the high watermark. Whether n fits. */
    private boolean ensureRoom(long n, List<Slot> evicted) {
        if (used() + n <= highMark) {
            return true;
        }
        return makeRoom(n, evicted);
    }

    /**
     * Makes room for {@code need} more bytes; returns whether they fit in the capacity now.
     * <ol>
     *   <li>evicts the coldest objects until live bytes plus {@code need} are at most the low watermark;</li>
     *   <li>compacts every file less than half live (the standing policy);</li>
     *   <li>if the files are still past the high watermark, compacts the files with the most garbage
     *       whatever their live fraction, as long as the copies fit in the capacity;</li>
     *   <li>if {@code need} still does not fit, rolls the active file (so its garbage can go too) and
     *       evicts further, coldest first, one file's worth at a time, compacting after each step.</li>
     * </ol>
     * Eviction is always in coldness order: nothing warm goes while something colder is live.
     */
    private boolean makeRoom(long need, List<Slot> evicted) {
        long cap = config.capacityBytes();
        evictColdest(lowMark - need, evicted);
        compact(0.5, -1);
        compact(1.0, highMark - need);
        long target = lowMark - need;
        while (used() + need > cap) {
            lock.lock();
            try {
                if (active != null && !active.pinned && active.live < active.size) {
                    active = null; // its garbage becomes compactable
                }
            } finally {
                lock.unlock();
            }
            compact(1.0, cap - need);
            if (used() + need <= cap) {
                break;
            }
            target -= config.fileBytes();
            if (!evictColdest(target, evicted)) {
                break; // nothing left to evict: what remains is in files being written
            }
            compact(1.0, cap - need);
        }
        return used() + need <= cap;
    }

    /**
     * Evicts objects, coldest first, until live bytes are at most {@code target}. Whether any went.
     * O(1) per object: the coldness lists are kept in order as objects are stored and read.
     */
    private boolean evictColdest(long target, List<Slot> evicted) {
        lock.lock();
        try {
            int n = 0;
            while (liveBytes > target) {
                Slot s = neverRead.head() != null ? neverRead.head() : readOnce.head();
                if (s == null) {
                    break;
                }
                dropSlot(s, true);
                evicted.add(s);
                evictions++;
                n++;
            }
            if (n > 0) {
                log.debug("disk tier {}: evicted {} objects, live {}", dir, n, liveBytes);
            }
            return n > 0;
        } finally {
            lock.unlock();
        }
    }

    /**
     * Compacts files whose live bytes are below {@code threshold} of their size, the one with the most
     * garbage first, while the copies fit in the capacity, until none is left or used bytes are at most
     * {@code untilUsed}. Files with nothing live are just deleted.
     */
    private void compact(double threshold, long untilUsed) {
        int budget;
        lock.lock();
        try {
            budget = files.size();
        } finally {
            lock.unlock();
        }
        long cap = config.capacityBytes();
        for (int i = 0; i < budget; i++) {
            DataFile pick = null;
            DataFile empty = null;
            lock.lock();
            try {
                if (usedBytes <= untilUsed) {
                    return;
                }
                for (DataFile f : files.values()) {
                    if (f == active || f.pinned || f.noCompact || f.size == 0 || f.live >= threshold * f.size
                            || usedBytes + f.live > cap) {
                        continue;
                    }
                    if (pick == null || f.size - f.live > pick.size - pick.live) {
                        pick = f;
                    }
                }
                if (pick != null && pick.live == 0) {
                    compactions++;
                    empty = retire(pick);
                    if (empty == null) {
                        continue; // deleted when its last read ends
                    }
                }
            } finally {
                lock.unlock();
            }
            if (pick == null) {
                return;
            }
            if (empty != null) {
                empty.closeAndDelete();
            } else {
                compactFile(pick);
            }
        }
    }

    /** Copies the live records of {@code f} to the active file, moves their slots, and deletes {@code f}. */
    private void compactFile(DataFile f) {
        record Move(Slot slot, DataFile to, long offset) {
        }
        List<Slot> slots;
        lock.lock();
        try {
            slots = new ArrayList<>(f.slots);
        } finally {
            lock.unlock();
        }
        // offsets of slots in f change only on this thread
        slots.sort(Comparator.comparingLong(s -> s.offset));
        List<Move> moves = new ArrayList<>(slots.size());
        Set<DataFile> touched = new LinkedHashSet<>();
        long copied = 0;
        IOException failure = null;
        try {
            for (Slot s : slots) {
                DataFile to = appendTarget(s.recordLength);
                Move prev = moves.isEmpty() ? null : moves.getLast();
                // copies go through the page cache: start them on a fresh block, so that no block is
                // written both through it and around it (by an append's O_DIRECT write)
                boolean follows = prev != null && prev.to() == to && sizeOf(to) == prev.offset() + prev.slot().recordLength;
                long pos = claim(to, s.recordLength, false, !follows);
                touched.add(to);
                copy(f, s.offset, to, pos, s.recordLength);
                moves.add(new Move(s, to, pos)); // only copies written whole
                copied += s.recordLength;
            }
        } catch (IOException e) {
            failure = e;
        }
        try {
            for (DataFile t : touched) {
                t.force();
            }
        } catch (IOException e) {
            log.warn("disk tier {}: compaction of {} failed to force its copies, leaving it as it is: {}", dir, f,
                    e.toString());
            lock.lock();
            try {
                f.noCompact = true; // copies not known durable: the slots stay where they are
                bytesWritten += copied;
            } finally {
                lock.unlock();
            }
            return;
        }
        if (failure != null) {
            // the copies made so far are durable and are the last records of their generations: move the
            // slots to them (as a restart would) and leave the rest in f, which is not compacted again
            log.warn("disk tier {}: compaction of {} failed after {} records, leaving the rest: {}", dir, f,
                    moves.size(), failure.toString());
        }
        DataFile toDelete = null;
        lock.lock();
        try {
            for (Move m : moves) {
                Slot s = m.slot();
                if (s.live && s.file == f) {
                    relocate(s, m.to(), m.offset());
                } else {
                    tombs.add(new Tomb(m.to(), m.offset())); // dropped while being copied
                    housekeepingWanted = true;
                }
            }
            bytesWritten += copied;
            if (failure == null) {
                compactions++;
                toDelete = retire(f);
            } else {
                f.noCompact = true;
            }
        } finally {
            lock.unlock();
        }
        log.debug("disk tier {}: compacted {} ({} records, {} copied)", dir, f, moves.size(), copied);
        if (toDelete != null) {
            toDelete.closeAndDelete();
        }
    }

    private void copy(DataFile from, long fromPos, DataFile to, long toPos, long length) throws IOException {
        for (long off = 0; off < length; ) {
            int n = (int) Math.min(copyBuf.byteSize(), length - off);
            ByteBuffer b = copyBuf.asSlice(0, n).asByteBuffer();
            if (!from.readFully(b, fromPos + off)) {
                throw new IOException(from + " ends before " + (fromPos + off + n));
            }
            to.writeFully(b.flip(), toPos + off);
            off += n;
        }
    }

    /**
     * A writer pass between batches: deletes emptied files, compacts, evicts if the files are past
     * the high watermark, writes and forces tombstones, and reports drops found by readers.
     */
    private void housekeeping() {
        long pass;
        List<Slot> evicted = new ArrayList<>();
        boolean over;
        lock.lock();
        try {
            pass = ++passStarted;
            housekeepingWanted = false;
            if (active != null && active.live == 0 && active.size > 0 && !active.pinned) {
                active = null; // nothing live in it: let it be deleted
            }
            over = usedBytes > highMark;
        } finally {
            lock.unlock();
        }
        if (over) {
            makeRoom(0, evicted);
        } else {
            compact(0.5, -1);
        }
        List<Tomb> marks;
        List<Slot> reports;
        lock.lock();
        try {
            marks = tombs;
            tombs = new ArrayList<>();
            reports = dropReports;
            dropReports = new ArrayList<>();
        } finally {
            lock.unlock();
        }
        writeTombstones(marks);
        evicted.addAll(reports);
        reportDropped(evicted); // before the pass counts as done: after flush() the listener knows
        lock.lock();
        try {
            passDone = pass;
            progress.signalAll();
        } finally {
            lock.unlock();
        }
    }

    private void writeTombstones(List<Tomb> marks) {
        if (marks.isEmpty()) {
            return;
        }
        Set<DataFile> touched = Collections.newSetFromMap(new IdentityHashMap<>());
        for (Tomb t : marks) {
            // only the writer retires files, so a file not retired now stays open for this write
            boolean retired;
            lock.lock();
            try {
                retired = t.file().retired;
            } finally {
                lock.unlock();
            }
            if (retired) {
                continue;
            }
            try {
                t.file().writeFully(deadByte.clear(), t.offset() + ObjectLayout.STATE_OFFSET);
                touched.add(t.file());
            } catch (IOException e) {
                log.warn("disk tier: cannot mark the record at {} of {} dead: {}", t.offset(), t.file(), e.toString());
            }
        }
        for (DataFile f : touched) {
            try {
                f.force();
            } catch (IOException e) {
                log.warn("disk tier: forcing tombstones in {}: {}", f, e.toString());
            }
        }
    }

    private void reportStored(List<Entry> stored) {
        if (stored.isEmpty()) {
            return;
        }
        try {
            listener.stored(stored);
        } catch (RuntimeException e) {
            log.warn("disk tier: listener.stored failed", e);
        }
    }

    private void reportDropped(List<Slot> dropped) {
        if (dropped.isEmpty()) {
            return;
        }
        try {
            listener.dropped(entriesOf(dropped));
        } catch (RuntimeException e) {
            log.warn("disk tier: listener.dropped failed", e);
        }
    }
}
