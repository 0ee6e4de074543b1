package io.kvpool.node.disk;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import com.sun.nio.file.ExtendedOpenOption;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.nio.channels.ClosedByInterruptException;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * One log file of a {@link DiskStore}: its channel, and the store's bookkeeping about it.
 *
 * <p>A {@link FileChannel} is an interruptible channel: if a thread is interrupted while it reads,
 * the JDK closes the channel for every thread. A reader on a node connection thread must not be able
 * to break the store that way, so the I/O helpers here reopen the file when they find its channel
 * closed by someone else (and rethrow only to the interrupted thread itself). A channel this class
 * closed on purpose ({@link #closeAndDelete}, {@link #close}) is never reopened.
 *
 * <p>Appends go through {@link #writeAligned}: whole blocks at block-aligned positions, with
 * {@code O_DIRECT} when the store found the file system supports it (the page cache is bypassed, so
 * spilling does not fill the machine's memory with dirty pages and is not throttled by their
 * write-back). Large reads can go through {@link #readDirect} (whole blocks covering the record);
 * small reads, tombstones and compaction copies use the ordinary channel. Direct writes only ever go
 * to fresh blocks past the end of everything written before, so no block is written both ways; the
 * kernel writes back dirty cached pages of a range before a direct read of it.
 *
 * <p>Fields other than the final ones and the channels are guarded by the store's lock ({@link DiskIndex#lock}).
 */
final class DataFile {

    private static final Logger log = LoggerFactory.getLogger(DataFile.class);

    static final String PREFIX = "kvpool-disk-";
    static final String SUFFIX = ".log";
    private static final Pattern NAME = Pattern.compile("kvpool-disk-(\\d{6,9})\\.log");
    /** Largest single read or write handed to the kernel (ByteBuffer views stop at 2 GiB). */
    static final int MAX_IO = 1 << 30;

    final int id;
    final Path path;
    private volatile FileChannel channel;
    /** The O_DIRECT channel for appends and large reads, opened on first use. */
    private volatile FileChannel directChannel;
    @GuardedBy("this")
    private boolean closedOnPurpose;

    /** Bytes appended so far (positions handed out, whether or not their write finished). */
    long size;
    /** Sum of the record lengths of the live slots in this file. */
    long live;
    /** The live slots in this file; each slot knows its index here ({@code Slot.fileIndex}). */
    final ArrayList<Slot> slots = new ArrayList<>();
    /** Reads in progress; a retired file is closed and deleted when the last one ends. */
    int readers;
    /** Compacted or emptied: no longer in the store; deleted once no read uses it. */
    boolean retired;
    /** The store closed while reads were in progress: the last reader closes the channel. */
    boolean closeWhenIdle;
    /** Holds records of the batch being written (not indexed yet): never compacted meanwhile. */
    boolean pinned;
    /** Its compaction failed with an I/O error; not tried again in this run. */
    boolean noCompact;

    private DataFile(int id, Path path, FileChannel channel) {
        this.id = id;
        this.path = path;
        this.channel = channel;
    }

    static String fileName(int id) {
        return PREFIX + String.format("%06d", id) + SUFFIX;
    }

    /** The file number of a log file name, or -1 if the name is not one of ours. */
    static int idOf(Path file) {
        Matcher m = NAME.matcher(file.getFileName().toString());
        return m.matches() ? Integer.parseInt(m.group(1)) : -1;
    }

    static DataFile create(Path dir, int id) throws IOException {
        Path p = dir.resolve(fileName(id));
        return new DataFile(id, p, FileChannel.open(p, StandardOpenOption.CREATE_NEW, StandardOpenOption.READ,
                StandardOpenOption.WRITE));
    }

    static DataFile open(Path file, int id) throws IOException {
        return new DataFile(id, file, FileChannel.open(file, StandardOpenOption.READ, StandardOpenOption.WRITE));
    }

    /**
     * Replaces a channel that another thread's interrupt closed. Returns false if the file was closed
     * on purpose (or cannot be reopened), in which case the caller gives up.
     */
    private boolean reopen(FileChannel broken) {
        synchronized (this) {
            if (closedOnPurpose) {
                return false;
            }
            if (channel == broken) {
                try {
                    channel = FileChannel.open(path, StandardOpenOption.READ, StandardOpenOption.WRITE);
                    log.debug("reopened {} after its channel was closed by an interrupt", path);
                } catch (IOException e) {
                    log.warn("cannot reopen {}: {}", path, e.toString());
                    return false;
                }
            }
            return true;
        }
    }

    /** Reads exactly {@code dst.remaining()} bytes at {@code pos}; false if the file ends first. */
    boolean readFully(ByteBuffer dst, long pos) throws IOException {
        long p = pos;
        int retries = 0;
        while (dst.hasRemaining()) {
            FileChannel ch = channel;
            int n;
            try {
                n = ch.read(dst, p);
            } catch (ClosedByInterruptException e) {
                throw e; // this thread was interrupted; others reopen the channel when they see it closed
            } catch (ClosedChannelException e) {
                if (++retries > 3 || !reopen(ch)) {
                    throw e;
                }
                continue;
            }
            if (n < 0) {
                return false;
            }
            p += n;
        }
        return true;
    }

    /** Writes all of {@code src} at {@code pos}. */
    void writeFully(ByteBuffer src, long pos) throws IOException {
        long p = pos;
        int retries = 0;
        while (src.hasRemaining()) {
            FileChannel ch = channel;
            try {
                p += ch.write(src, p);
            } catch (ClosedByInterruptException e) {
                throw e;
            } catch (ClosedChannelException e) {
                if (++retries > 3 || !reopen(ch)) {
                    throw e;
                }
            }
        }
    }

    /**
     * Appends whole blocks: {@code src} (address and length multiples of the I/O block) at {@code pos}
     * (a multiple too), through O_DIRECT with {@code direct}, else through the ordinary channel. Writer
     * thread only.
     */
    void writeAligned(MemorySegment src, long pos, boolean direct) throws IOException {
        if (!direct) {
            writeFully(src.asByteBuffer(), pos);
            return;
        }
        ByteBuffer b = src.asByteBuffer();
        long p = pos;
        int retries = 0;
        while (b.hasRemaining()) {
            FileChannel ch = direct();
            try {
                p += ch.write(b, p);
            } catch (ClosedByInterruptException e) {
                throw e;
            } catch (ClosedChannelException e) {
                if (++retries > 3 || !reopenDirect(ch)) {
                    throw e;
                }
            }
        }
    }

    /**
     * Reads through O_DIRECT into {@code dst} (address and length multiples of {@code block}, the I/O
     * block) from {@code pos} (a multiple too) until {@code dst} is full or the file ends; returns the
     * bytes read. A read that ends off a block boundary met the end of the file mid-block (a file whose
     * last bytes a compaction copy wrote through the page cache ends anywhere): nothing follows it, and
     * a direct read may not start there, so the loop stops. Before, it asked once more from that
     * position, the kernel refused ("not a multiple of the block size"), and the record, whole in the
     * buffer already, was answered to its reader as a failed connection: a miss of an object the tier
     * held (issue 32, the SSD-tier drill).
     */
    long readDirect(MemorySegment dst, long pos, int block) throws IOException {
        ByteBuffer b = dst.asByteBuffer();
        long p = pos;
        int retries = 0;
        while (b.hasRemaining()) {
            FileChannel ch = direct();
            int n;
            try {
                n = ch.read(b, p);
            } catch (ClosedByInterruptException e) {
                throw e;
            } catch (ClosedChannelException e) {
                if (++retries > 3 || !reopenDirect(ch)) {
                    throw e;
                }
                continue;
            }
            if (n <= 0) {
                break; // the end of the file, on a block boundary
            }
            p += n;
            if (n % block != 0) {
                break; // the end of the file, mid-block
            }
        }
        return p - pos;
    }

    /** The O_DIRECT channel, opened on first use. */
    private FileChannel direct() throws IOException {
        FileChannel ch = directChannel;
        if (ch != null) {
            return ch;
        }
        synchronized (this) {
            if (closedOnPurpose) {
                throw new ClosedChannelException();
            }
            if (directChannel == null) {
                directChannel = openDirect(path);
            }
            return directChannel;
        }
    }

    /** {@link #reopen} for the O_DIRECT channel. */
    private boolean reopenDirect(FileChannel broken) {
        synchronized (this) {
            if (closedOnPurpose) {
                return false;
            }
            if (directChannel == broken) {
                try {
                    directChannel = openDirect(path);
                } catch (IOException e) {
                    log.warn("cannot reopen {} for direct I/O: {}", path, e.toString());
                    return false;
                }
            }
            return true;
        }
    }

    /** Opens {@code file} for O_DIRECT reads and writes; fails on file systems without it (some overlays). */
    static FileChannel openDirect(Path file) throws IOException {
        try {
            return FileChannel.open(file, StandardOpenOption.READ, StandardOpenOption.WRITE, ExtendedOpenOption.DIRECT);
        } catch (UnsupportedOperationException e) {
            throw new IOException("O_DIRECT is not supported for " + file, e);
        }
    }

    /** {@code force(false)}: the data and the metadata needed to read it back (size) are durable. */
    void force() throws IOException {
        for (int retries = 0; ; retries++) {
            FileChannel ch = channel;
            try {
                ch.force(false);
                return;
            } catch (ClosedByInterruptException e) {
                throw e;
            } catch (ClosedChannelException e) {
                // fsync works on the file, whatever descriptor it goes through
                if (retries >= 3 || !reopen(ch)) {
                    throw e;
                }
            }
        }
    }

    long channelSize() throws IOException {
        return channel.size();
    }

    void truncate(long newSize) throws IOException {
        channel.truncate(newSize);
        channel.force(true);
    }

    /** Closes the channel for good. */
    void close() {
        FileChannel d;
        synchronized (this) {
            closedOnPurpose = true;
            d = directChannel;
        }
        try {
            if (d != null) {
                d.close();
            }
            channel.close();
        } catch (IOException e) {
            log.warn("closing {}: {}", path, e.toString());
        }
    }

    /** Closes the channel for good and deletes the file. */
    void closeAndDelete() {
        close();
        try {
            Files.deleteIfExists(path);
        } catch (IOException e) {
            log.warn("cannot delete {}: {}", path, e.toString());
        }
    }

    @Override
    public String toString() {
        return path.getFileName().toString();
    }
}
