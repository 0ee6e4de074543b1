package io.kvpool.node.disk;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.config.Size;
import io.kvpool.protocol.Keys;
import io.kvpool.protocol.ObjectLayout;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Path;
import java.util.List;
import java.util.Objects;

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
 * <h2>Parts</h2>
 * This class is a facade: it owns the configuration, the order of opening and closing, and the native
 * memory, one shared arena: the staging ring ({@code stagingBytes}), a 16 MiB block-aligned write
 * buffer, a 1 MiB buffer for scanning and compaction and, with direct I/O, four 4 MiB aligned buffers
 * for large reads. Nothing else grows with the data; reads allocate nothing large. The work is done by
 * package-private parts, each with a design note of its own:
 * <ul>
 *   <li>{@link DirectoryLock}: exclusive use of the directory, in this process and across processes.</li>
 *   <li>{@link DiskIndex}: the store's one lock and what it guards: generation and key to {@link Slot},
 *       the eviction order, tombstones to write, the counters.</li>
 *   <li>{@link LogFiles}: the set of log files, the active one, the bytes they take.</li>
 *   <li>{@link Recovery}: the scan at open that rebuilds the index ({@link LogScanner} reads a file).</li>
 *   <li>{@link Staging}: spills between {@link #offer} and the writer, in a native ring.</li>
 *   <li>{@link AppendWriter}: the {@code kvpool-disk-writer} thread: batches, fsync, indexing,
 *       tombstones, listener calls; {@link RunWriter} writes a batch's runs with the
 *       {@code kvpool-disk-io} thread.</li>
 *   <li>{@link Compactor}: eviction and compaction, keeping the files within the capacity.</li>
 *   <li>{@link ValueReader}: reads on callers' threads, pinning the file they read.</li>
 * </ul>
 *
 * <h2>Threads</h2>
 * {@code kvpool-disk-writer} does every file mutation (appends, fsync, tombstones, eviction,
 * compaction, deletion) and calls the {@link Listener}; {@code kvpool-disk-io} writes its buffers.
 * Callers' threads only take the store's lock for map updates (never for I/O) and do their own
 * positional reads. A read pins the file it reads; a compacted file is closed and deleted when its
 * last reader finishes, so compaction never waits for readers and readers never see a file vanish
 * under them.
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

    private static final long KiB = 1L << 10;
    private static final long MiB = 1L << 20;
    /** Scan and compaction buffer. */
    private static final int COPY_BUFFER = (int) MiB;
    /** Smallest I/O block assumed: page-sized, aligned for O_DIRECT on any common device. */
    static final int MIN_IO_BLOCK = 4096;

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
     * @param writeErrors      write batches that failed with an I/O error (their records count as drops)
     * @param writerRunning    the writer thread runs; false after close, or after an error stopped it
     *                         (then spills are refused and reads go on)
     */
    public record Stats(long capacityBytes, long usedBytes, long liveBytes, long objects, long hits, long bytesRead,
                        long bytesWritten, long queueDepthBytes, long queuedItems, long drops, long evictions,
                        long compactions, long checksumFailures, long skippedRecords, long writeErrors,
                        boolean writerRunning) {
    }

    /** Where a record is; for tests. */
    record Location(Path file, long recordOffset, long valueOffset, long recordLength) {
    }


    private final Config config;
    private final Path dir;
    private final DirectoryLock dirLock;
    private final Arena arena;
    private final DiskIndex index;
    private final LogFiles files;
    private final Staging staging;
    private final ValueReader reader;
    private final AppendWriter writer;
    /** The I/O block: appends start at multiples of it and are padded with zeros to one. */
    private final int ioBlock;
    /** Whether appends bypass the page cache (O_DIRECT); false where the file system refuses it. */
    private final boolean directIo;
    @GuardedBy("index.lock")
    private boolean closeCalled;

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
        Objects.requireNonNull(listener, "listener");
        this.dir = config.dir();
        this.dirLock = DirectoryLock.acquire(dir);
        this.index = new DiskIndex();
        this.arena = Arena.ofShared();
        LogFiles lf = null;
        MemorySegment ring;
        MemorySegment copyBuf;
        MemorySegment writeBuf;
        try {
            ring = arena.allocate(config.stagingBytes() & -ObjectLayout.ALIGNMENT, ObjectLayout.ALIGNMENT);
            copyBuf = arena.allocate(COPY_BUFFER, 4096);
            this.ioBlock = DiskIo.ioBlock(dir);
            lf = new LogFiles(index, dir, config.fileBytes(), ioBlock);
            writeBuf = arena.allocate(RunWriter.WRITE_BUFFER, ioBlock);
            this.directIo = tryDirect && DiskIo.probeDirect(dir, writeBuf.asSlice(0, ioBlock));
            this.reader = new ValueReader(index, arena, ioBlock, directIo);
            long t0 = System.nanoTime();
            Recovery.open(dir, config.fileBytes(), index, lf, copyBuf);
            log.info("disk tier {}: {} objects, {} live in {} used of {}, {} files, {} records skipped, scanned in {} ms;"
                            + " appends {} in {}-byte blocks",
                    dir, index.size(), Size.human(index.liveBytes()), Size.human(lf.usedBytes),
                    Size.human(config.capacityBytes()), lf.byId.size(), index.skippedRecords,
                    (System.nanoTime() - t0) / 1_000_000, directIo ? "direct (O_DIRECT)" : "through the page cache",
                    ioBlock);
        } catch (Throwable e) {
            if (lf != null) {
                lf.closeAll();
            }
            arena.close();
            dirLock.release();
            throw e;
        }
        this.files = lf;
        this.staging = new Staging(index, ring, config.capacityBytes());
        this.writer = new AppendWriter(index, files, staging, new RunWriter(ring, writeBuf, ioBlock, directIo),
                new Compactor(index, files, config, copyBuf), listener, dir, ioBlock);
        writer.start();
    }

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
        return staging.offer(key, generation, epoch, value, valueCrc);
    }

    /**
     * Reads the value of {@code generation} into {@code dst} (native or byte[]-backed, of exactly the
     * value's length) and checks it against its CRC32C. A spill still queued is read from staging memory
     * (so an object is readable from the moment it is offered). OK: dst holds exactly the stored value, its
     * hit count goes up (not for a queued spill) and it becomes the most recently read object (the last to be
     * evicted). NOT_FOUND: no such object (or the store is
     * closed). CORRUPT: the bytes on disk are damaged; dst is zeroed, the object is dropped (reported
     * to the listener) and a checksum failure counted. Safe concurrently with everything; a record
     * moved by compaction meanwhile is read from the file it was found in, which lives until the read
     * ends. Values of {@value ValueReader#DIRECT_READ_MIN} bytes or more are read with O_DIRECT when
     * appends are.
     *
     * @throws IllegalArgumentException if {@code dst.byteSize()} is not the value length
     * @throws IOException              if the file cannot be read
     */
    public ReadStatus read(long generation, MemorySegment dst) throws IOException {
        // staging first: a record goes from the queue to the index, never back, in one hold of the lock
        ReadStatus queued = staging.readQueued(generation, dst);
        return queued != null ? queued : reader.read(generation, dst);
    }

    /** The live object with this generation, stored or queued (with no hits yet), or null. */
    public Entry lookup(long generation) {
        index.lock.lock();
        try {
            Slot s = index.get(generation);
            if (s != null) {
                return s.entry();
            }
            Staging.Pending p = staging.queued(generation);
            return p == null ? null : new Entry(p.key.clone(), p.generation, p.epoch, p.valueLength, p.valueCrc, 0);
        } finally {
            index.lock.unlock();
        }
    }

    /**
     * Drops an object (the master freed it), or cancels its queued spill. Its record is marked DEAD by
     * the writer shortly after ({@link #flush} waits for that). Returns false if it was not here.
     */
    public boolean remove(long generation) {
        index.lock.lock();
        try {
            return index.remove(generation) || staging.cancel(generation);
        } finally {
            index.lock.unlock();
        }
    }

    /**
     * Drops every object and queued spill with an epoch older than {@code epoch}, and refuses spills
     * from those epochs from now on. Files left without live records are deleted by the writer
     * ({@link #flush} waits for that). Returns how many objects and queued spills were dropped.
     */
    public long reset(long epoch) {
        index.lock.lock();
        try {
            long n = index.dropOlderThan(epoch) + staging.cancelOlderThan(epoch);
            index.housekeepingWanted = true;
            index.work.signal();
            return n;
        } finally {
            index.lock.unlock();
        }
    }

    /** The live objects, for registering with the master. */
    public List<Entry> entries() {
        index.lock.lock();
        try {
            return index.entries();
        } finally {
            index.lock.unlock();
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
        index.lock.lock();
        try {
            return new Stats(config.capacityBytes(), files.usedBytes, index.liveBytes(), index.size(), index.hits,
                    index.bytesRead, index.bytesWritten, staging.usedBytes(), staging.items(), index.drops,
                    index.evictions, index.compactions, index.checksumFailures, index.skippedRecords, index.writeErrors,
                    writer.running());
        } finally {
            index.lock.unlock();
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
        writer.checkNotWriter("flush");
        writer.flush();
    }

    /**
     * Stops taking spills, lets the writer write what is queued, forces and closes the files, and frees
     * the staging memory. Reads still in progress finish on their file; later reads return NOT_FOUND.
     */
    @Override
    public void close() {
        writer.checkNotWriter("close");
        index.lock.lock();
        try {
            if (closeCalled) {
                return;
            }
            closeCalled = true;
            staging.stop();
            index.work.signalAll();
        } finally {
            index.lock.unlock();
        }
        boolean interrupted = writer.join();
        List<DataFile> toClose;
        index.lock.lock();
        try {
            index.closed = true;
            staging.awaitCopies();
            toClose = files.closeOrDefer();
        } finally {
            index.lock.unlock();
        }
        for (DataFile f : toClose) {
            f.close();
        }
        arena.close();
        try {
            dirLock.release();
        } catch (IOException e) {
            log.warn("disk tier {}: releasing the directory lock: {}", dir, e.toString());
        }
        if (interrupted) {
            Thread.currentThread().interrupt();
        }
        log.info("disk tier {} closed", dir);
    }

    /** For tests: where the record of a live generation is, or null. */
    Location locate(long generation) {
        index.lock.lock();
        try {
            Slot s = index.get(generation);
            return s == null ? null : new Location(s.file.path, s.offset, s.valuePosition(), s.recordLength);
        } finally {
            index.lock.unlock();
        }
    }
}
