package io.kvpool.node.disk;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.protocol.ObjectLayout;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.IdentityHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Set;
import java.util.function.Consumer;

/**
 * The {@code kvpool-disk-writer} thread: the one thread that mutates files.
 *
 * <h2>Threads</h2>
 * One platform daemon thread drains the staging queue in batches: a run per batch and file, laid out a
 * write buffer at a time by the {@link RunWriter} (whose {@code kvpool-disk-io} thread writes each
 * filled half of the buffer while this one fills the other; this one waits for both before it goes
 * on). It forces every file it wrote once per batch, then indexes the batch and calls
 * {@link DiskStore.Listener#stored}: "stored" means durable. Between batches it runs a housekeeping
 * pass: evicts and compacts ({@link Compactor}), writes and forces tombstones, and reports drops.
 * Listener calls are made on this thread, never under the store's lock; a listener that throws is
 * logged, not allowed to stop the writer.
 *
 * <h2>Locks</h2>
 * It takes the store's lock ({@link DiskIndex#lock}) to take a batch, to claim file positions and to
 * index what it wrote, never for I/O. The files of a batch are pinned from their first claim until the
 * batch is indexed, so that no compaction moves records around them meanwhile. Its pass counters,
 * guarded by that lock, let {@link #flush} wait for "everything queued before me is written and a whole
 * pass has run since". If the writer fails, the store stops taking spills; reads keep working.
 */
final class AppendWriter {

    /** Logs as the store: the tier's messages keep one logger name. */
    private static final Logger log = LoggerFactory.getLogger(DiskStore.class);

    private final DiskIndex index;
    private final LogFiles files;
    private final Staging staging;
    private final RunWriter runWriter;
    private final Compactor compactor;
    private final DiskStore.Listener listener;
    private final Path dir;
    private final int ioBlock;
    private final ByteBuffer deadByte = ByteBuffer.allocateDirect(1).put(0, ObjectLayout.STATE_DEAD);
    private final Thread thread;

    @GuardedBy("index.lock")
    private long passStarted;
    @GuardedBy("index.lock")
    private long passDone;
    @GuardedBy("index.lock")
    private boolean done;

    /** False once the writer thread has ended (closed, or stopped by an error: spills are refused). */
    boolean running() {
        index.lock.lock();
        try {
            return !done;
        } finally {
            index.lock.unlock();
        }
    }

    AppendWriter(DiskIndex index, LogFiles files, Staging staging, RunWriter runWriter, Compactor compactor,
                 DiskStore.Listener listener, Path dir, int ioBlock) {
        this.index = index;
        this.files = files;
        this.staging = staging;
        this.runWriter = runWriter;
        this.compactor = compactor;
        this.listener = listener;
        this.dir = dir;
        this.ioBlock = ioBlock;
        this.thread = Thread.ofPlatform().name("kvpool-disk-writer").daemon(true).unstarted(this::loop);
    }

    void start() {
        thread.start();
    }

    /** Throws if called from a listener, on the writer thread, where {@code method} would wait for itself. */
    void checkNotWriter(String method) {
        if (Thread.currentThread() == thread) {
            throw new IllegalStateException("disk tier: " + method + "() called from a listener, on the writer thread");
        }
    }

    /** See {@link DiskStore#flush}. */
    void flush() throws InterruptedException {
        index.lock.lock();
        try {
            long target = staging.reservedSeq();
            while (staging.writtenSeq() < target && !done) {
                index.progress.await();
            }
            long pass = passStarted;
            index.housekeepingWanted = true;
            index.work.signal();
            while (passDone <= pass && !done) {
                index.progress.await();
            }
        } finally {
            index.lock.unlock();
        }
    }

    /**
     * Waits for the writer to end (the store must be closing) and stops the I/O thread. Returns whether
     * the calling thread was interrupted meanwhile (its interrupt status is then cleared).
     */
    boolean join() {
        boolean interrupted = false;
        while (thread.isAlive()) {
            try {
                thread.join();
            } catch (InterruptedException e) {
                interrupted = true;
            }
        }
        return runWriter.shutdown() | interrupted;
    }

    private void loop() {
        try {
            while (true) {
                List<Staging.Pending> batch;
                boolean exit;
                index.lock.lock();
                try {
                    while (!staging.headReady() && !index.housekeepingWanted && !staging.drained()) {
                        index.work.awaitUninterruptibly();
                    }
                    batch = staging.takeReady();
                    exit = staging.drained() && batch.isEmpty();
                } finally {
                    index.lock.unlock();
                }
                if (!batch.isEmpty()) {
                    writeBatch(batch);
                }
                housekeeping();
                if (exit) {
                    break;
                }
            }
            for (DataFile f : files.all()) {
                try {
                    f.force();
                } catch (IOException e) {
                    log.warn("disk tier: forcing {} at close: {}", f, e.toString());
                }
            }
        } catch (Throwable t) {
            log.error("disk tier {}: the writer stopped; spills are refused from now on", dir, t);
            index.withLock(staging::stop); // refuse offers; reads keep working
        } finally {
            index.lock.lock();
            try {
                done = true;
                index.progress.signalAll();
            } finally {
                index.lock.unlock();
            }
        }
    }

    private void writeBatch(List<Staging.Pending> batch) {
        List<RunWriter.Run> runs = new ArrayList<>();
        Set<DataFile> touched = new LinkedHashSet<>();
        List<Slot> evicted = new ArrayList<>();
        // spills taken but not kept: the listener hears of them as drops (they were readable while queued)
        List<DiskStore.Entry> lost = new ArrayList<>();
        long placed = 0;
        boolean failed = false;
        try {
            for (Staging.Pending p : batch) {
                if (p.skip) {
                    continue;
                }
                if (!compactor.ensureRoom(p.recordLength + ioBlock, evicted)) {
                    index.lock.lock();
                    try {
                        index.drops++;
                    } finally {
                        index.lock.unlock();
                    }
                    lost.add(entry(p));
                    continue;
                }
                DataFile f = files.appendTarget(p.recordLength);
                RunWriter.Run last = runs.isEmpty() ? null : runs.getLast();
                // a record follows the previous one if nothing was appended between them (compaction
                // can, while making room); otherwise it starts a new run at the next block boundary
                boolean follows = last != null && last.file == f && files.sizeOf(f) == last.filePos + last.length;
                long pos = files.claim(f, p.recordLength, true, !follows);
                touched.add(f);
                p.file = f;
                p.filePos = pos;
                placed++;
                if (follows) {
                    last.add(p);
                } else {
                    last = new RunWriter.Run(f, pos);
                    last.add(p);
                    runs.add(last);
                }
            }
            long written = 0;
            for (RunWriter.Run r : runs) {
                files.padRun(r.file, r.filePos + r.length);
                written += runWriter.write(r);
            }
            for (DataFile f : touched) {
                f.force();
            }
            index.lock.lock();
            try {
                index.bytesWritten += written;
            } finally {
                index.lock.unlock();
            }
        } catch (IOException e) {
            log.warn("disk tier {}: writing {} records failed, they are dropped: {}", dir, placed, e.toString());
            failed = true;
        }
        List<DiskStore.Entry> stored = new ArrayList<>(batch.size());
        List<Slot> superseded = new ArrayList<>();
        index.lock.lock();
        try {
            if (failed) {
                index.drops += placed;
                index.writeErrors++;
                if (files.active != null && touched.contains(files.active)) {
                    files.active = null; // start clean in a new file
                }
            }
            for (Staging.Pending p : batch) {
                if (failed && p.file != null && !p.cancelled) {
                    lost.add(entry(p));
                }
                if (!failed && p.file != null) {
                    if (p.cancelled || p.epoch < index.fenceEpoch) {
                        index.tomb(p.file, p.filePos);
                    } else {
                        index.commit(p, stored, superseded);
                    }
                }
            }
            staging.release(batch);
            for (DataFile f : touched) {
                f.pinned = false;
            }
            index.progress.signalAll();
        } finally {
            index.lock.unlock();
        }
        evicted.addAll(superseded);
        reportDropped(evicted);
        tell(lost, listener::dropped, "dropped");
        reportStored(stored);
    }

    private static DiskStore.Entry entry(Staging.Pending p) {
        return new DiskStore.Entry(p.key.clone(), p.generation, p.epoch, p.valueLength, p.valueCrc, 0);
    }


    /**
     * A writer pass between batches: deletes emptied files, compacts, evicts if the files are past
     * the high watermark, writes and forces tombstones, and reports drops found by readers.
     */
    private void housekeeping() {
        long pass;
        List<Slot> evicted = new ArrayList<>();
        boolean over;
        index.lock.lock();
        try {
            pass = ++passStarted;
            index.housekeepingWanted = false;
            DataFile active = files.active;
            if (active != null && active.live == 0 && active.size > 0 && !active.pinned) {
                files.active = null; // nothing live in it: let it be deleted
            }
            over = files.usedBytes > compactor.highMark;
        } finally {
            index.lock.unlock();
        }
        compactor.reclaim(over, evicted);
        List<DiskIndex.Tomb> marks;
        List<Slot> reports;
        index.lock.lock();
        try {
            marks = index.takeTombs();
            reports = index.takeDropReports();
        } finally {
            index.lock.unlock();
        }
        writeTombstones(marks);
        evicted.addAll(reports);
        reportDropped(evicted); // before the pass counts as done: after flush() the listener knows
        index.lock.lock();
        try {
            passDone = pass;
            index.progress.signalAll();
        } finally {
            index.lock.unlock();
        }
    }

    private void writeTombstones(List<DiskIndex.Tomb> marks) {
        if (marks.isEmpty()) {
            return;
        }
        Set<DataFile> touched = Collections.newSetFromMap(new IdentityHashMap<>());
        for (DiskIndex.Tomb t : marks) {
            // only the writer retires files, so a file not retired now stays open for this write
            if (index.locked(() -> t.file().retired)) {
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

    private void reportStored(List<DiskStore.Entry> stored) {
        tell(stored, listener::stored, "stored");
    }

    private void reportDropped(List<Slot> dropped) {
        List<DiskStore.Entry> entries = new ArrayList<>(dropped.size());
        for (Slot s : dropped) {
            entries.add(s.entry());
        }
        tell(entries, listener::dropped, "dropped");
    }

    /** Calls the listener with a non-empty list; a listener that throws is logged. */
    private static void tell(List<DiskStore.Entry> entries, Consumer<List<DiskStore.Entry>> call, String what) {
        if (entries.isEmpty()) {
            return;
        }
        try {
            call.accept(entries);
        } catch (RuntimeException e) {
            log.warn("disk tier: listener.{} failed", what, e);
        }
    }
}
