package io.kvpool.node.disk;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
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
 * <p>Fields other than the final ones and the channel are guarded by the store's lock.
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
    private boolean closedOnPurpose; // guarded by this

    /** Bytes appended so far (positions handed out, whether or not their write finished). */
    long size;
    /** Sum of the record lengths of the live slots in this file. */
    long live;
    /** The live slots in this file; each slot knows its index here ({@code Slot.fileIndex}). */
    final ArrayList<DiskStore.Slot> slots = new ArrayList<>();
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
        synchronized (this) {
            closedOnPurpose = true;
        }
        try {
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
