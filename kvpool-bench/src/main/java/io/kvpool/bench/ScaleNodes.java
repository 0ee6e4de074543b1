package io.kvpool.bench;

import io.kvpool.config.HostPort;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.FrameServer;
import io.kvpool.protocol.FrameStatus;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.MalformedFrameException;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.Request;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.NodeMessages;

import java.io.IOException;
import java.net.InetSocketAddress;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.concurrent.locks.LockSupport;
import java.util.function.Supplier;

/**
 * Many nodes in one process, for the {@code scale} section ({@link ScaleBench}): each registers a segment with
 * the master, reports an empty inventory and heartbeats on a connection of its own, exactly as a {@code
 * StorageNode} does on the wire, but stores no bytes. They share one control server (the address every one of
 * them registers), which answers the master's NODE_FREE and NODE_RESET and counts the regions freed, so that
 * eviction and removals run as they would against real nodes.
 *
 * <p>Like {@code MasterLink}, a node sends one NODE_HEARTBEAT in {@link #HEARTBEAT_EVERY} and NODE_BEACONs
 * (answered only with news) in between, reading any answer to them before its next one; {@link #paced} runs
 * every node at a faster pace for a while, with beacons or with full heartbeats only, to measure the master's
 * time for each.
 *
 * <p>Nodes follow the leader the way {@code MasterLink} does: a heartbeat that fails sends the node to
 * {@code leader.get()}; a reply naming a higher term is answered by a heartbeat under that term at once (a
 * promoted standby places nothing on a segment before it heard its node under its own term); NOT_FOUND (the
 * master dropped the segment) makes the node register again.
 */
final class ScaleNodes implements AutoCloseable {

    private static final Duration T = Duration.ofSeconds(30);
    /** How soon a node that lost its master tries the leader again (MasterLink.ELECTED_RETRY). */
    private static final Duration ELECTED_RETRY = Duration.ofMillis(100);
    /** One heartbeat in this many is a full NODE_HEARTBEAT, the others NODE_BEACONs (MasterLink.HEARTBEAT_EVERY). */
    static final int HEARTBEAT_EVERY = 5;

    private final Supplier<HostPort> leader;
    private final FrameServer control;
    private final Node[] nodes;
    private final long capacity;
    private final Duration interval;
    private final AtomicLong heartbeats = new AtomicLong();
    private final AtomicLong freed = new AtomicLong();
    private final AtomicLong registrations = new AtomicLong();
    private final AtomicReference<Throwable> failure = new AtomicReference<>();
    /** Heartbeats that failed on the connection (a master gone, a failover), and the last of them. */
    private final AtomicLong lost = new AtomicLong();
    private final AtomicReference<String> lastLoss = new AtomicReference<>("");
    private volatile boolean running = true;
    /** Leader records seen to change: each wakes every node to heartbeat the leader at once, as MasterLink does. */
    private volatile int leaderChanges;
    /** Until this System.nanoTime(), nodes heartbeat back to back instead of every {@link #interval}. */
    private volatile long floodUntil;
    /** Until this System.nanoTime(), nodes heartbeat every {@link #pacedPeriod} ns, beacons between or not. */
    private volatile long pacedUntil;
    private volatile long pacedPeriod;
    private volatile boolean pacedBeacons;
    /** Calls of {@link #pace}: each makes every node take the new pace at once. */
    private volatile int pacedRound;

    /** One simulated node. */
    private final class Node {
        final String name;
        long incarnation = ThreadLocalRandom.current().nextLong();
        ControlToken token = ControlToken.random();
        int segmentId;
        long epoch;
        long term;
        FrameConnection conn;
        volatile boolean silent;
        volatile boolean rejoin;
        Thread thread;
        /** The leader changes this node has acted on. */
        int seenChanges;
        /** The calls of {@link #pace} this node has acted on. */
        int seenPaced;
        /** Beacons this connection may send before its next full heartbeat; 0: a full one is due. */
        int beaconsLeft;

        Node(String name) {
            this.name = name;
        }

        /**
         * Registers (again) with an empty inventory; {@code previous} is the token of the registration a restarted
         * node replaces (null: none).
         */
        void register(ControlToken previous) throws IOException {
            closeConnection();
            conn = FrameConnection.connect(leader(), Duration.ofSeconds(5), Limits.DEFAULT);
            BodyWriter w = new BodyWriter();
            (previous == null ? new MasterMessages.RegisterNode(name, "127.0.0.1", control.port(), capacity, epoch,
                    incarnation, 0, "", token) : new MasterMessages.RegisterNode(name, "127.0.0.1", control.port(),
                    capacity, epoch, incarnation, 0, "", token, previous)).write(w);
            MasterMessages.RegisterReply r = MasterMessages.RegisterReply.read(conn.call(Opcode.REGISTER_NODE, w, T).body());
            segmentId = r.segmentId();
            epoch = r.epoch();
            term = r.term();
            BodyWriter inv = new BodyWriter();
            new MasterMessages.Inventory(segmentId, incarnation, true, List.of()).write(inv);
            conn.call(Opcode.NODE_INVENTORY, inv, T);
            registrations.incrementAndGet();
        }

        /**
         * One heartbeat: a beacon ({@code beacon} true, and a full heartbeat is not due), else a full one, and a
         * second under the master's term when a reply names a newer one.
         */
        void heartbeat(boolean beacon) throws IOException {
            if (conn == null) {
                conn = FrameConnection.connect(leader(), Duration.ofSeconds(5), Limits.DEFAULT);
                beaconsLeft = 0;
            }
            List<FrameConnection.Reply> news = conn.notices(T);
            if (!news.isEmpty() && act(MasterMessages.HeartbeatReply.read(news.getLast().body()))) {
                return;
            }
            if (beacon && beaconsLeft > 0) {
                conn.notify(Opcode.NODE_BEACON, body(), T);
                beaconsLeft--;
                heartbeats.incrementAndGet();
                return;
            }
            for (int i = 0; i < 2; i++) {
                MasterMessages.HeartbeatReply r = MasterMessages.HeartbeatReply.read(conn.call(Opcode.NODE_HEARTBEAT,
                        body(), T).body());
                heartbeats.incrementAndGet();
                beaconsLeft = HEARTBEAT_EVERY - 1;
                if (!act(r)) {
                    return;
                }
            }
        }

        /** Acts on a heartbeat's or beacon's reply; true when it named a newer term (a heartbeat under it is due). */
        boolean act(MasterMessages.HeartbeatReply r) throws IOException {
            if (r.code() == ResultCode.NOT_FOUND) {
                register(null);
                return false;
            }
            epoch = Math.max(epoch, r.epoch());
            if (r.term() <= term) {
                return false;
            }
            term = r.term();
            beaconsLeft = 0;
            return true;
        }

        private BodyWriter body() {
            BodyWriter w = new BodyWriter(152);
            new MasterMessages.Heartbeat(segmentId, incarnation, epoch, 0, MasterMessages.TierStats.NONE, term).write(w);
            return w;
        }

        void loop() {
            long next = System.nanoTime() + ThreadLocalRandom.current().nextLong(interval.toNanos());
            while (running) {
                try {
                    if (rejoin) {
                        incarnation = ThreadLocalRandom.current().nextLong();
                        ControlToken previous = token;
                        token = ControlToken.random();
                        register(previous);
                        rejoin = false;
                        silent = false;
                    }
                    long now = System.nanoTime();
                    while (running && now < next && now >= floodUntil && seenChanges == leaderChanges) {
                        if (seenPaced != pacedRound) {
                            seenPaced = pacedRound;
                            next = Math.min(next, now + ThreadLocalRandom.current().nextLong(pacedPeriod));
                            continue;
                        }
                        LockSupport.parkNanos(next - now);
                        now = System.nanoTime();
                    }
                    seenChanges = leaderChanges;
                    // flooding: no schedule to keep; afterwards, one interval after the last heartbeat at the latest
                    boolean paced = now < pacedUntil;
                    long period = paced ? pacedPeriod : interval.toNanos();
                    next = now < floodUntil ? now : Math.max(next, now - period) + period;
                    if (silent) {
                        closeConnection();
                        continue;
                    }
                    heartbeat(now >= floodUntil && (!paced || pacedBeacons));
                } catch (IOException e) {
                    // the master went away (a failover): the next heartbeat goes to whoever leads then, at once when
                    // the leader record changes (leaderChanged), else after ELECTED_RETRY, as MasterLink does (a new
                    // leader publishes its address a moment before its port listens)
                    lost.incrementAndGet();
                    lastLoss.set(name + ": " + e);
                    closeConnection();
                    next = System.nanoTime() + ELECTED_RETRY.toNanos();
                } catch (RuntimeException e) {
                    failure.compareAndSet(null, new IllegalStateException("simulated node " + name + ": " + e, e));
                    closeConnection();
                }
            }
            closeConnection();
        }

        void closeConnection() {
            if (conn != null) {
                try {
                    conn.close();
                } catch (IOException ignored) {
                    // gone already
                }
                conn = null;
            }
        }
    }

    /**
     * Registers {@code count} nodes of {@code capacity} bytes each with the master {@code leader} names, and
     * starts their heartbeats every {@code interval}.
     */
    ScaleNodes(Supplier<HostPort> leader, int count, long capacity, Duration interval) throws IOException {
        this.leader = leader;
        this.capacity = capacity;
        this.interval = interval;
        this.control = new FrameServer("scale-nodes", new InetSocketAddress("127.0.0.1", 0), Limits.DEFAULT,
                Duration.ofSeconds(30), op -> op == Opcode.NODE_FREE || op == Opcode.NODE_RESET, this::serve);
        this.nodes = new Node[count];
        String run = Long.toHexString(ThreadLocalRandom.current().nextLong() & 0xffffffL);
        for (int i = 0; i < count; i++) {
            nodes[i] = new Node("sim-" + run + "-" + i);
            nodes[i].register(null);
        }
        for (Node n : nodes) {
            n.thread = Thread.ofVirtual().name("scale-node-" + n.name).start(n::loop);
        }
    }

    /** The master to talk to; an IOException while none is known (an election in progress). */
    private HostPort leader() throws IOException {
        HostPort h = leader.get();
        if (h == null) {
            throw new IOException("no leader known");
        }
        return h;
    }

    private void serve(Request req) throws IOException {
        switch (req.opcode()) {
            case NODE_FREE -> {
                int n = NodeMessages.Free.read(req.body()).items().size();
                freed.addAndGet(n);
                req.reply(new BodyWriter(8).i64(n));
            }
            case NODE_RESET -> {
                NodeMessages.Reset.read(req.body());
                req.reply(new BodyWriter(8).i64(0));
            }
            default -> throw new MalformedFrameException(FrameStatus.UNKNOWN_OPCODE, req.requestId(),
                    req.opcode().metricName + " is not served by simulated nodes");
        }
    }

    int count() {
        return nodes.length;
    }

    long heartbeats() {
        return heartbeats.get();
    }

    /** Regions the master told these nodes to free (evictions, removals). */
    long freed() {
        return freed.get();
    }

    long registrations() {
        return registrations.get();
    }

    /** Every node heartbeats back to back for {@code d}; returns the heartbeats answered meanwhile. */
    long flood(Duration d) throws InterruptedException {
        long before = heartbeats.get();
        floodUntil = System.nanoTime() + d.toNanos();
        for (Node n : nodes) {
            LockSupport.unpark(n.thread);
        }
        Thread.sleep(d);
        return heartbeats.get() - before;
    }

    /**
     * From now on and for {@code d}, every node heartbeats once every {@code period} (each at its own moment in the
     * period, as nodes at their own pace do), with beacons between full heartbeats ({@code beacons}) or full
     * heartbeats only; count them with {@link #heartbeats}.
     */
    void pace(Duration period, boolean beacons, Duration d) {
        pacedBeacons = beacons;
        pacedPeriod = period.toNanos();
        pacedUntil = System.nanoTime() + d.toNanos();
        pacedRound++;
        for (Node n : nodes) {
            LockSupport.unpark(n.thread);
        }
    }

    /** The leader record changed: every node heartbeats now (to the new leader, once there is one). */
    void leaderChanged() {
        leaderChanges++;
        for (Node n : nodes) {
            LockSupport.unpark(n.thread);
        }
    }

    /** The first {@code k} nodes fall silent (their connections closed), as nodes that died. */
    List<String> silence(int k) {
        List<String> names = new ArrayList<>();
        for (int i = 0; i < k; i++) {
            nodes[i].silent = true;
            names.add(nodes[i].name);
        }
        return names;
    }

    /** The first {@code k} nodes come back empty (restarted), each proving itself with its previous token. */
    void rejoin(int k) {
        for (int i = 0; i < k; i++) {
            nodes[i].rejoin = true;
        }
    }

    /** Heartbeats that failed on the connection so far, and the last such failure. */
    String losses() {
        return lost.get() + " heartbeats failed on the connection" + (lost.get() > 0 ? ", the last: " + lastLoss.get() : "");
    }

    /** Throws what went wrong in a node's loop, if anything did. */
    void check() {
        Throwable t = failure.get();
        if (t != null) {
            throw new IllegalStateException(t.getMessage(), t);
        }
    }

    @Override
    public void close() throws IOException {
        running = false;
        for (Node n : nodes) {
            if (n != null && n.thread != null) {
                n.thread.interrupt();
            }
        }
        control.close();
    }
}
