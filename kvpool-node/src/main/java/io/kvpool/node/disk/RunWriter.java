package io.kvpool.node.disk;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

/**
 * Writes runs of staged records to their file: each record copied from the staging ring into a 16 MiB
 * block-aligned write buffer (O_DIRECT needs aligned memory), and written from there in whole blocks.
 *
 * <p>Threads: {@link #write} is called by the writer thread only. The buffer has two halves; a second
 * thread, {@code kvpool-disk-io}, writes each filled half while the writer fills the other, so the copy
 * overlaps the device's work. The writer waits for every write it started before {@link #write}
 * returns, even after a failure. No lock: the records written are not yet indexed and their file
 * positions were claimed beforehand, so nothing else touches these bytes.
 *
 * <p>Invariant: a half is never filled while a write from it is in flight ({@link #writes}).
 */
final class RunWriter {

    /** Appends are written in pieces of at most half this (a multiple of any I/O block). */
    static final int WRITE_BUFFER = 16 << 20;

    /** Records adjacent in a file, starting at a block boundary: written together, padded to a whole block. */
    static final class Run {
        final DataFile file;
        final long filePos;
        final List<Staging.Pending> records = new ArrayList<>();
        long length;

        Run(DataFile file, long filePos) {
            this.file = file;
            this.filePos = filePos;
        }

        void add(Staging.Pending p) {
            records.add(p);
            length += p.recordLength;
        }
    }

    private final MemorySegment ring;
    /** The two halves of the write buffer: one is filled while the I/O thread writes the other. */
    private final MemorySegment[] writeBufs;
    /** Writes in flight from each half; writer thread only. */
    @SuppressWarnings("unchecked")
    private final Future<Void>[] writes = new Future[2];
    /** Writes appends, so that the writer can lay out the next piece meanwhile. */
    private final ExecutorService io;
    /** The I/O block: appends start at multiples of it and are padded with zeros to one. */
    private final int ioBlock;
    /** Whether appends bypass the page cache (O_DIRECT). */
    private final boolean directIo;

    /**
     * @param ring     the staging memory the records are in
     * @param writeBuf {@link #WRITE_BUFFER} bytes aligned to {@code ioBlock}
     */
    RunWriter(MemorySegment ring, MemorySegment writeBuf, int ioBlock, boolean directIo) {
        this.ring = ring;
        this.writeBufs = new MemorySegment[]{writeBuf.asSlice(0, WRITE_BUFFER / 2),
                writeBuf.asSlice(WRITE_BUFFER / 2, WRITE_BUFFER / 2)};
        this.ioBlock = ioBlock;
        this.directIo = directIo;
        this.io = Executors.newSingleThreadExecutor(Thread.ofPlatform().name("kvpool-disk-io").daemon(true).factory());
    }

    /**
     * Writes a run: its records copied from staging into the aligned write buffers, each buffer written
     * by the I/O thread while the next is filled (the copy overlaps the device's work), the last piece
     * padded with zeros to a whole block. Returns the bytes written. Waits for every write it started.
     */
    long write(Run r) throws IOException {
        long cap = writeBufs[0].byteSize();
        long fileAt = r.filePos;
        long fill = 0;
        int cur = 0;
        try {
            for (Staging.Pending p : r.records) {
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
                long padded = DiskIo.alignUp(fill, ioBlock);
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

    /**
     * Stops the I/O thread, which is idle (the writer waited for every write it started). Returns
     * whether the calling thread was interrupted meanwhile (its interrupt status is then cleared).
     */
    boolean shutdown() {
        boolean interrupted = false;
        io.shutdown();
        while (!io.isTerminated()) {
            try {
                io.awaitTermination(1, TimeUnit.MINUTES);
            } catch (InterruptedException e) {
                interrupted = true;
            }
        }
        return interrupted;
    }
}
