package io.kvpool.master;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.Secrets;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.NodeMessages;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The master's side of the control channel to nodes ({@link NodeNotifier} over TCP). One connection
 * per segment, opened on first use. Frees are queued per segment and sent in NODE_FREE batches by a
 * background flusher (every {@link #FLUSH_INTERVAL} or at {@link #MAX_BATCH} items); resets are sent
 * to all nodes in parallel and awaited.
 */
final class NodeControl implements NodeNotifier {

    private static final Logger log = LoggerFactory.getLogger(NodeControl.class);
    /** Longest a freed region waits before its node hears of it. */
    static final Duration FLUSH_INTERVAL = Duration.ofMillis(50);
    /** Most regions in one NODE_FREE frame. */
    static final int MAX_BATCH = 8192;
    /** Bound on one control call (connect + reply). */
    static final Duration CALL_TIMEOUT = Duration.ofSeconds(5);

    private final Limits limits;
    /** Longest a removal or reset waits for nodes to acknowledge; a node slower than that catches up later. */
    private final Duration ackWait;
    private final Map<Integer, Channel> channels = new ConcurrentHashMap<>();
    /** Frees a node missed (down or cut off), owed to it until its copies can no longer come back. */
    private final UndeliveredFrees undelivered = new UndeliveredFrees();
    private final Thread flusher;
    private volatile boolean running = true;

    private static final class Channel {
        final Segment segment;
        /** Guards the connection only; the queue is lock-free so callers holding index locks never wait on I/O. */
        final ReentrantLock lock = new ReentrantLock();
        final ConcurrentLinkedQueue<NodeMessages.FreeItem> queue = new ConcurrentLinkedQueue<>();
        @GuardedBy("lock")
        FrameConnection conn;
        @GuardedBy("lock")
        boolean failing;
        /** A bounded flush gave up waiting for this node; later ones do not wait for it until it answers. */
        volatile boolean stalled;

        Channel(Segment segment) {
            this.segment = segment;
        }
    }

    NodeControl(Limits limits, Duration ackWait, long term, Secrets secrets) {
        this.limits = limits;
        this.secrets = secrets;
        this.term = term;
        this.ackWait = ackWait;
        this.flusher = Thread.ofPlatform().daemon().name("kvpool-master-free-flusher").start(this::flushLoop);
    }

    /** What the master proves to nodes on its connections (the admin secret: frees, resets and copies need it). */
    private final Secrets secrets;

    /** The term every frame to a node carries: a node that knows a newer one refuses them. */
    private final long term;

    private Channel channel(Segment s) {
        return channels.computeIfAbsent(s.id, id -> new Channel(s));
    }

    @Override
    public void free(Segment segment, long offset, long generation, Tier tier, boolean spill) {
        channel(segment).queue.add(new NodeMessages.FreeItem(offset, generation, tier, spill));
    }

    @Override
    public void reset(Collection<Segment> segments, long epoch) {
        Map<Channel, Thread> senders = new LinkedHashMap<>();
        for (Segment s : segments) {
            Channel c = channel(s);
            senders.put(c, Thread.ofVirtual().name("kvpool-master-reset-" + s.id).start(() -> {
                try {
                    c.lock.lock();
                    try {
                        c.queue.clear();
                        BodyWriter w = new BodyWriter(16);
                        new NodeMessages.Reset(epoch, term, s.controlToken).write(w);
                        call(c, Opcode.NODE_RESET, w);
                        c.stalled = false;
                    } finally {
                        c.lock.unlock();
                    }
                } catch (IOException | RuntimeException e) {
                    log.warn("reset of {} to epoch {} not acknowledged ({}); it will catch up at its next heartbeat",
                            s, epoch, e.getMessage());
                }
            }));
        }
        awaitAcks(senders, ackWait.toNanos(), "the reset to epoch " + epoch);
    }

    /** Bound on one NODE_REPLICATE: the source reads up to {@link Repair#MAX_BYTES_PER_CALL} and writes it on. */
    static final Duration REPLICATE_TIMEOUT = Duration.ofSeconds(60);

    @Override
    public List<ResultCode> replicate(Segment source, Segment target, long epoch, List<NodeMessages.ReplicateItem> items) {
        BodyWriter w = new BodyWriter(64 + items.size() * 96);
        new NodeMessages.Replicate(epoch, term, source.controlToken, target.address.host(), target.address.port(), items).write(w);
        // a connection of its own: a copy may take a while and must not hold up the frees on the channel
        try (FrameConnection conn = FrameConnection.connect(source.address, CALL_TIMEOUT, limits, secrets)) {
            List<ResultCode> codes = MasterMessages.Codes.read(conn.call(Opcode.NODE_REPLICATE, w, REPLICATE_TIMEOUT).body())
                    .codes();
            if (codes.size() != items.size()) {
                throw new IOException(codes.size() + " results for " + items.size() + " items");
            }
            return codes;
        } catch (IOException | RuntimeException e) {
            log.warn("repair: {} did not copy {} objects to {} ({})", source, items.size(), target, e.getMessage());
            return Collections.nCopies(items.size(), ResultCode.FAILED);
        }
    }

    @Override
    public boolean mustComeBackEmpty(String segmentName) {
        return undelivered.overflowed(segmentName);
    }

    @Override
    public void silenced(String segmentName, Collection<Long> elsewhere) {
        undelivered.silenced(segmentName, elsewhere);
    }

    @Override
    public boolean copiedElsewhere(String segmentName, long generation) {
        return undelivered.copiedElsewhere(segmentName, generation);
    }

    @Override
    public boolean freedWhileAway(String segmentName, long generation) {
        return undelivered.covers(segmentName, generation);
    }

    @Override
    public void inventoryTaken(String segmentName) {
        undelivered.settled(segmentName);
    }

    @Override
    public long undeliveredFrees() {
        return undelivered.size();
    }

    /** Segments a previous leader owed frees to ({@link UndeliveredFrees#forceEmpty}). */
    void owedBefore(Collection<String> names) {
        undelivered.forceEmpty(names);
    }

    /** Names of the segments frees are owed to, for the next leader. */
    Set<String> owed() {
        return undelivered.owed();
    }

    @Override
    public void forget(Segment segment) {
        Channel c = channels.remove(segment.id);
        if (c != null) {
            // the node may come back with its segment: what it was never told stays owed
            List<NodeMessages.FreeItem> left = new ArrayList<>(c.queue);
            c.queue.clear();
            undelivered.record(segment.name, left);
            c.lock.lock();
            try {
                closeConn(c);
            } finally {
                c.lock.unlock();
            }
        }
    }

    private void flushLoop() {
        while (running) {
            try {
                Thread.sleep(FLUSH_INTERVAL);
            } catch (InterruptedException e) {
                return;
            }
            for (Channel c : channels.values()) {
                flush(c, false);
            }
        }
    }

    @Override
    public void flush() {
        flushChannels(Long.MAX_VALUE);
    }

    @Override
    public void flushRemovals() {
        flushChannels(ackWait.toNanos());
    }

    /**
     * Flushes every channel in parallel (a frozen node holds up no other) and waits up to
     * {@code boundNanos} (or for good, with {@link Long#MAX_VALUE}).
     */
    private void flushChannels(long boundNanos) {
        Map<Channel, Thread> senders = new LinkedHashMap<>();
        for (Channel c : channels.values()) {
            senders.put(c, Thread.ofVirtual().name("kvpool-master-free-" + c.segment.id).start(() -> flush(c, true)));
        }
        awaitAcks(senders, boundNanos, "frees");
    }

    /**
     * Waits for each channel's sender up to {@code boundNanos} in all, except for a node already found
     * stalled by an earlier bounded wait (so a hung node costs one bound, not one per removal or
     * reset, until it answers again or is dropped); a node that misses this bound is marked stalled.
     * The senders go on in the background either way.
     */
    private static void awaitAcks(Map<Channel, Thread> senders, long boundNanos, String what) {
        boolean bounded = boundNanos != Long.MAX_VALUE;
        long deadline = System.nanoTime() + boundNanos;
        try {
            for (Map.Entry<Channel, Thread> e : senders.entrySet()) {
                Channel c = e.getKey();
                if (!bounded) {
                    e.getValue().join();
                } else if (!c.stalled) {
                    long left = deadline - System.nanoTime();
                    if (left > 0) {
                        e.getValue().join(Duration.ofNanos(left));
                    }
                    if (e.getValue().isAlive()) { // not by the time the bound ran out (an earlier node used it up)
                        c.stalled = true;
                        log.warn("{} did not acknowledge {} within {} ms; not waiting for it again until it answers",
                                c.segment, what, TimeUnit.NANOSECONDS.toMillis(boundNanos));
                    }
                }
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /** Sends the channel's queued frees; {@code wait} waits for a flush already in progress instead of skipping. */
    private void flush(Channel c, boolean wait) {
        // with wait, take the lock even if the queue looks empty: the flusher may have taken the
        // items and still be sending them, and the caller's contract is that they were delivered
        // (an eviction frees the regions right after, and a spill must copy its value out first)
        if (!wait && c.queue.isEmpty()) {
            return;
        }
        if (wait) {
            c.lock.lock();
        } else if (!c.lock.tryLock()) {
            return; // the flusher or a reset is on this channel already
        }
        try {
            while (!c.queue.isEmpty() && running) {
                List<NodeMessages.FreeItem> batch = new ArrayList<>();
                NodeMessages.FreeItem it;
                while (batch.size() < MAX_BATCH && (it = c.queue.poll()) != null) {
                    batch.add(it);
                }
                BodyWriter w = new BodyWriter(8 + batch.size() * 16);
                new NodeMessages.Free(term, c.segment.controlToken, batch).write(w);
                try {
                    call(c, Opcode.NODE_FREE, w);
                    c.stalled = false;
                    if (c.failing) {
                        List<NodeMessages.FreeItem> owed = undelivered.drain(c.segment.name);
                        log.info("control channel to {} works again; sending the {} frees it missed", c.segment,
                                owed.size());
                        c.queue.addAll(owed);
                        c.failing = false;
                    }
                } catch (IOException | RuntimeException e) {
                    undelivered.record(c.segment.name, batch);
                    if (!c.failing) {
                        log.warn("cannot send frees to {} ({}); kept until it is reachable, and refused from its"
                                + " inventory if it comes back", c.segment, e.getMessage());
                        c.failing = true;
                    }
                }
            }
        } finally {
            c.lock.unlock();
        }
    }

    /** One control call on the segment's connection. */
    @GuardedBy("c.lock")
    private void call(Channel c, Opcode op, BodyWriter w) throws IOException {
        if (c.conn == null || c.conn.isBroken()) {
            closeConn(c);
            c.conn = FrameConnection.connect(c.segment.address, CALL_TIMEOUT, limits, secrets);
        }
        try {
            c.conn.call(op, w, CALL_TIMEOUT);
        } catch (IOException | RuntimeException e) {
            closeConn(c);
            throw e;
        }
    }

    @GuardedBy("c.lock")
    private static void closeConn(Channel c) {
        if (c.conn != null) {
            try {
                c.conn.close();
            } catch (IOException ignored) {
                // replacing it
            }
            c.conn = null;
        }
    }

    /** Sends every queued free now (for tests and shutdown). */
    void flushAll() {
        flush();
    }

    @Override
    public void close() {
        running = false;
        flusher.interrupt();
        for (Channel c : channels.values()) {
            // waits out a call in flight (bounded by CALL_TIMEOUT): its connection is closed after it
            c.lock.lock();
            try {
                closeConn(c);
            } finally {
                c.lock.unlock();
            }
        }
        channels.clear();
    }
}
