package io.kvpool.node;

import io.kvpool.config.Size;
import io.kvpool.etcd.MasterLocator;
import io.kvpool.node.disk.DiskStore;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.Replica;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.Semaphore;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A node's SSD tier as the rest of the node sees it: the {@link DiskStore} plus what connects it to
 * the pool.
 *
 * <h2>Flows</h2>
 * <ul>
 *   <li><b>Spill.</b> The master evicts a memory object and asks for a spill (a NODE_FREE item with
 *       the spill flag); it lists the object as a disk copy on this node at once, with the offset its
 *       memory copy had. The node copies the value out of its segment (the region pinned meanwhile)
 *       into the store's bounded staging queue, then retires the region. Reads find it in the region
 *       until then, in staging until it is written, and on disk after: never a miss on the way. When the
 *       store has written and forced it, the object is reported to the master (NODE_DISK_ADD, sent by
 *       {@link MasterLink}), which confirms it; a spill the store could not take or keep is reported
 *       dropped (NODE_DISK_DROP) and leaves the index.</li>
 *   <li><b>Read.</b> A NODE_READ item for the disk tier is read by generation into a staging buffer,
 *       its checksum verified (a mismatch is a miss and a counter, never bytes), and sent. Staging
 *       for reads is bounded by a byte budget: a reader waits for room (back-pressure).</li>
 *   <li><b>Promotion.</b> After {@code promoteAfter} disk hits an object is put back into memory by
 *       the node itself: a conditional upsert (only if the key still holds that generation) placed
 *       on this node's segment, written locally, completed; the master then frees the disk copy.</li>
 *   <li><b>Disk watermark.</b> The store drops its coldest objects; they are reported (NODE_DISK_DROP).</li>
 * </ul>
 */
final class DiskTier implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(DiskTier.class);
    /** Bytes of disk reads staged in memory at once, across all connections. */
    static final long READ_STAGING_BYTES = 256L << 20;
    /** Most promotions waiting; more are skipped (an object keeps being served from disk). */
    static final int PROMOTION_QUEUE = 1024;

    private final LocalSegment node;
    private final NodeConfig config;
    /** Where promotions ask the master for space. */
    private final MasterLocator masters;
    private final DiskStore store;
    private final Semaphore readBudget = new Semaphore((int) (READ_STAGING_BYTES >> 10));
    private final ConcurrentLinkedQueue<DiskStore.Entry> added = new ConcurrentLinkedQueue<>();
    private final ConcurrentLinkedQueue<DiskStore.Entry> dropped = new ConcurrentLinkedQueue<>();
    private final LinkedBlockingQueue<Long> promotions = new LinkedBlockingQueue<>(PROMOTION_QUEUE);
    private final Set<Long> promoting = ConcurrentHashMap.newKeySet();
    private final AtomicLong promoted = new AtomicLong();
    private final Thread promoter;
    private volatile Runnable onChange = () -> { };
    private volatile boolean closed;

    DiskTier(LocalSegment node, NodeConfig config, MasterLocator masters) throws IOException {
        this.node = node;
        this.masters = masters;
        this.config = config;
        this.store = new DiskStore(DiskStore.Config.defaults(config.diskDir(), config.diskSize().bytes()),
                new DiskStore.Listener() {
                    @Override
                    public void stored(List<DiskStore.Entry> entries) {
                        added.addAll(entries);
                        onChange.run();
                    }

                    @Override
                    public void dropped(List<DiskStore.Entry> entries) {
                        dropped.addAll(entries);
                        onChange.run();
                    }
                });
        this.promoter = config.promoteAfter() > 0
                ? Thread.ofPlatform().daemon().name("kvpool-disk-promoter").start(this::promoteLoop) : null;
        DiskStore.Stats st = store.stats();
        log.info("disk tier at {}: {} capacity, {} objects found ({} records skipped)", config.diskDir(),
                Size.human(st.capacityBytes()), st.objects(), st.skippedRecords());
    }

    /** Called whenever there are disk additions or drops to report (wakes the master link). */
    void onChange(Runnable r) {
        this.onChange = r;
    }

    DiskStore store() {
        return store;
    }

    /**
     * Spills a value from the segment; false if the store would not take it (staging full: dropped and counted).
     * The master lists a spill on this node's SSD tier from the moment it asks for it, so a spill not taken is
     * reported dropped (NODE_DISK_DROP), as one the writer later cannot keep.
     */
    boolean spill(byte[] key, long generation, long epoch, MemorySegment value, int valueCrc) {
        if (store.offer(key, generation, epoch, value, valueCrc)) {
            return true;
        }
        dropped.add(new DiskStore.Entry(key.clone(), generation, epoch, value.byteSize(), valueCrc, 0));
        onChange.run();
        return false;
    }

    /** A staged disk read, to be sent and then released. */
    static final class Staged implements AutoCloseable {
        final MemorySegment value;
        private final Arena arena;
        private final Runnable release;

        Staged(MemorySegment value, Arena arena, Runnable release) {
            this.value = value;
            this.arena = arena;
            this.release = release;
        }

        @Override
        public void close() {
            arena.close();
            release.run();
        }
    }

    /**
     * Reads an object of this generation and length into a staging buffer, waiting for staging room
     * (back-pressure). Null for a miss: absent, another length, or a checksum mismatch.
     */
    Staged read(long generation, long length) throws IOException {
        DiskStore.Entry e = store.lookup(generation);
        if (e == null || e.valueLength() != length) {
            return null;
        }
        int kib = (int) Math.min(READ_STAGING_BYTES >> 10, (length + 1023) >> 10);
        try {
            readBudget.acquire(kib);
        } catch (InterruptedException ex) {
            Thread.currentThread().interrupt();
            throw new IOException("interrupted waiting for disk read staging");
        }
        Arena arena = Arena.ofShared();
        boolean ok = false;
        try {
            MemorySegment buf = arena.allocate(Math.max(1, length), 64).asSlice(0, length);
            if (store.read(generation, buf) != DiskStore.ReadStatus.OK) {
                return null;
            }
            ok = true;
            DiskStore.Entry after = store.lookup(generation);
            if (after != null && config.promoteAfter() > 0 && after.hits() >= config.promoteAfter()
                    && promoting.add(generation) && !promotions.offer(generation)) {
                promoting.remove(generation);
            }
            return new Staged(buf, arena, () -> readBudget.release(kib));
        } finally {
            if (!ok) {
                arena.close();
                readBudget.release(kib);
            }
        }
    }

    boolean remove(long generation) {
        return store.remove(generation);
    }

    long reset(long epoch) {
        return store.reset(epoch);
    }

    List<DiskStore.Entry> entries() {
        return store.entries();
    }

    /** Takes what was spilled since the last report (to send as NODE_DISK_ADD). */
    List<DiskStore.Entry> takeAdded() {
        return drain(added);
    }

    /** Takes what the store let go since the last report (to send as NODE_DISK_DROP). */
    List<DiskStore.Entry> takeDropped() {
        return drain(dropped);
    }

    /** Puts back a batch of {@link #takeAdded} whose report failed (the master was unreachable). */
    void requeueAdded(List<DiskStore.Entry> batch) {
        added.addAll(batch);
    }

    /** Puts back a batch of {@link #takeDropped} whose report failed. */
    void requeueDropped(List<DiskStore.Entry> batch) {
        dropped.addAll(batch);
    }

    private static List<DiskStore.Entry> drain(ConcurrentLinkedQueue<DiskStore.Entry> q) {
        List<DiskStore.Entry> out = new ArrayList<>();
        DiskStore.Entry e;
        while (out.size() < 4096 && (e = q.poll()) != null) {
            out.add(e);
        }
        return out;
    }

    /** The master would not list a spilled object (the key was re-put, a reset happened): forget it. */
    void rejected(DiskStore.Entry e) {
        store.remove(e.generation());
        node.ledger().dropRetired(e.generation());
    }

    MasterMessages.TierStats stats(long memReadBytes, long memWrittenBytes, long memReads) {
        DiskStore.Stats s = store.stats();
        return new MasterMessages.TierStats(memReadBytes, memWrittenBytes, memReads, s.capacityBytes(), s.usedBytes(),
                s.objects(), s.hits(), s.bytesRead(), s.bytesWritten(), s.queueDepthBytes(), s.drops(), s.evictions(),
                promoted.get(), s.checksumFailures());
    }

    // ------------------------------------------------------------------ promotion

    private void promoteLoop() {
        FrameConnection conn = null;
        while (!closed) {
            Long generation;
            try {
                generation = promotions.take();
            } catch (InterruptedException e) {
                return;
            }
            try {
                if (conn == null || conn.isBroken()) {
                    conn = FrameConnection.connect(masters.locate(Duration.ofSeconds(3), true).address(),
                            Duration.ofSeconds(3), config.limits(), config.secrets());
                }
                if (promote(conn, generation)) {
                    promoted.incrementAndGet();
                }
            } catch (IOException | RuntimeException e) {
                log.debug("promotion of generation {} failed: {}", generation, e.toString());
                if (conn != null) {
                    try {
                        conn.close();
                    } catch (IOException ignored) {
                        // reconnecting next time
                    }
                    conn = null;
                }
            } finally {
                promoting.remove(generation);
            }
        }
    }

    /**
     * Moves one object back to memory: a conditional upsert placed on this node, written locally,
     * completed. Returns true when the object is now in memory (the master frees the disk copy).
     */
    private boolean promote(FrameConnection conn, long generation) throws IOException {
        DiskStore.Entry e = store.lookup(generation);
        if (e == null) {
            return false;
        }
        Duration t = Duration.ofSeconds(30);
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment value = arena.allocate(Math.max(1, e.valueLength()), 64).asSlice(0, e.valueLength());
            if (store.read(generation, value) != DiskStore.ReadStatus.OK) {
                return false;
            }
            BodyWriter w = new BodyWriter();
            new MasterMessages.PutStart(true, 1, node.name(),
                    List.of(new MasterMessages.PutStartItem(e.key(), e.valueLength(), generation))).write(w);
            MasterMessages.PutStartReply reply = MasterMessages.PutStartReply.read(conn.call(Opcode.PUT_START, w, t).body());
            MasterMessages.PutStartResult r = reply.results().getFirst();
            if (r.code() != ResultCode.OK) {
                return false; // the key moved on (replaced, removed) or memory is full: stays on disk
            }
            Replica rep = r.replicas().getFirst();
            boolean written = rep.segmentId() == node.segmentId() && rep.tier() == Tier.MEMORY
                    && node.currentTerm(reply.term())
                    && node.writeLocal(rep.offset(), r.generation(), reply.epoch(), e.key(), value, e.valueCrc());
            BodyWriter end = new BodyWriter();
            new MasterMessages.PutEnd(List.of(new MasterMessages.PutEndItem(e.key(), r.generation(), 0))).write(end);
            if (!written) {
                conn.call(Opcode.PUT_REVOKE, end, t);
                return false;
            }
            return MasterMessages.Codes.read(conn.call(Opcode.PUT_END, end, t).body()).codes().getFirst() == ResultCode.OK;
        }
    }

    @Override
    public void close() {
        closed = true;
        if (promoter != null) {
            promoter.interrupt();
        }
        store.close();
    }

    /** A value's CRC from its header in the segment (spills store the checksum the writer computed). */
    static int headerCrc(MemorySegment segment, long regionOffset) {
        return segment.get(ValueLayout.JAVA_INT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN),
                regionOffset + ObjectLayout.VALUE_CRC_OFFSET);
    }
}
