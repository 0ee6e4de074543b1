package io.kvpool.node;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.config.Durations;
import io.kvpool.etcd.LeaderRecord;
import io.kvpool.etcd.MasterLocator;
import io.kvpool.node.disk.DiskStore;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.FrameStatus;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.RemoteException;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.MasterMessages.Heartbeat;
import io.kvpool.protocol.msg.MasterMessages.HeartbeatReply;
import io.kvpool.protocol.msg.MasterMessages.Inventory;
import io.kvpool.protocol.msg.MasterMessages.InventoryItem;
import io.kvpool.protocol.msg.MasterMessages.RegisterNode;
import io.kvpool.protocol.msg.MasterMessages.RegisterReply;
import io.kvpool.protocol.msg.MasterMessages;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;

/**
 * Keeps a node registered with the master: registers, uploads the inventory, heartbeats, and starts
 * over whenever the master forgets the node (master restart, or the node was dropped for silence).
 *
 * <h2>Registration</h2>
 * REGISTER_NODE offers the segment with the newest epoch this node has seen. The master answers with
 * a segment id, its epoch, and whether the node's objects are current. If they are, the node lists
 * them in NODE_INVENTORY chunks, each object re-read and checked from its self-describing header
 * and value checksum; the master rebuilds its metadata from them and answers ALREADY_EXISTS for
 * objects it will not take, which the node then drops. The segment takes new puts only after the
 * last chunk, so nothing is placed over an object the master has not heard of yet. Each
 * REGISTER_NODE carries a control token drawn for it ({@link LocalSegment#newRegistration}): from
 * then on the node takes frees, resets and copies only from the master it went to, and the reply's
 * term is the only thing that moves the node's term ({@link LocalSegment#followTerm}).
 *
 * <h2>Heartbeats and beacons</h2>
 * Every heartbeat interval the link tells the master it is alive. One time in {@link #HEARTBEAT_EVERY} that is a
 * NODE_HEARTBEAT, which the master answers; in between it is a NODE_BEACON (version 18), which the master
 * answers only with news: the node unknown to it, a newer epoch, another term. A thousand nodes then cost the
 * master one reply in five instead of one each (on loopback a reply's write is about half of a heartbeat's
 * master time, docs/benchmarks.md "Scale"). An answer to a beacon is read before the next one is sent (or while
 * a later call waits), so news reaches the node within one interval more than before; the first heartbeat on a
 * connection, after a registration and after a new term, is a full one. Under TLS every heartbeat is a full one
 * ({@link FrameConnection#pollsNotices}).
 *
 * <h2>Failures</h2>
 * Lost connection: retry every heartbeat interval, logging once per outage. A heartbeat answered
 * NOT_FOUND: register again at once. A heartbeat carrying a newer epoch than ours: we missed a
 * reset, so drop everything.
 *
 * <h2>Elected masters</h2>
 * Given {@code etcd://...}, the link follows the leader record ({@link MasterLocator}): it connects to
 * the leader even while that one is still rebuilding (it rebuilds from registrations like this one),
 * and moves to a new leader as soon as the record names one, without waiting for the old connection
 * to fail (an old leader paused past its lease can look alive). A registration answered with an
 * older term than the node already follows is a deposed leader's: the link drops it and looks again.
 */
final class MasterLink implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(MasterLink.class);
    /** Longest wait before trying an elected leader again. */
    static final Duration ELECTED_RETRY = Duration.ofMillis(100);
    /** One heartbeat in this many is a NODE_HEARTBEAT, answered; the others are NODE_BEACONs, answered with news only. */
    static final int HEARTBEAT_EVERY = 5;
    /** Objects per NODE_INVENTORY frame. */
    static final int INVENTORY_CHUNK = 4096;

    private final LocalSegment node;
    /** The SSD tier, or null. */
    private final DiskTier disk;
    /** What a registration lists (NODE_INVENTORY). */
    private final InventoryUpload inventory;
    /** Where the token of the last registration the master accepted is kept for the next run. */
    private final RegistrationFile kept;
    /**
     * The control token of the last registration a master accepted (from the previous run at first):
     * presented in the next REGISTER_NODE as the proof that it is the same node (protocol 4.16).
     */
    private ControlToken accepted;
    /** Stopping for a restart: the master was told, and this link registers no more. */
    private volatile boolean draining;
    private final NodeConfig config;
    private final MasterLocator masters;
    /** The master this link's connection goes to (null while not connected). */
    private volatile MasterLocator.Leader master;
    private final long incarnation = ThreadLocalRandom.current().nextLong();
    private final Thread thread;
    private final ReentrantLock lock = new ReentrantLock();
    private final Condition state = lock.newCondition();
    private volatile boolean running = true;
    private volatile boolean registered;
    /** When the master last acknowledged a heartbeat (epoch ms; 0: never). */
    private volatile long lastHeartbeatMillis;
    /** Volatile: a leader change closes it from the watch's thread, to end a call stuck on a deposed leader. */
    private volatile FrameConnection conn;
    private int segmentId = -1;
    /** Beacons this connection may send before its next full heartbeat; 0: a full one is due. */
    private int beaconsLeft;
    private boolean outageLogged;
    /** A refused registration's reason, logged again only when it changes or every {@link #REFUSAL_LOG_EVERY}. */
    private String lastRefusal;
    private long lastRefusalLoggedNanos;
    static final Duration REFUSAL_LOG_EVERY = Duration.ofSeconds(30);
    /** A wake that came while the loop was not sleeping. */
    @GuardedBy("lock")
    private boolean wakeRequested;

    MasterLink(LocalSegment node, DiskTier disk, NodeConfig config, MasterLocator masters, RegistrationFile kept) {
        this.node = node;
        this.disk = disk;
        this.kept = kept;
        this.accepted = kept.read();
        this.inventory = new InventoryUpload(node, disk, incarnation);
        this.config = config;
        this.masters = masters;
        if (masters.elected()) {
            masters.onChange(this::leaderChanged);
        }
        this.thread = Thread.ofPlatform().daemon().name("kvpool-node-link").start(this::run);
    }

    boolean isRegistered() {
        return registered;
    }

    /** The master this node is registered with now, or null while it is not registered. */
    MasterLocator.Leader registeredMaster() {
        MasterLocator.Leader l = master;
        return registered ? l : null;
    }

    /** When the master last acknowledged a heartbeat, epoch ms; 0 if it never did. */
    long lastHeartbeatMillis() {
        return lastHeartbeatMillis;
    }

    /** The master this link talks to now, as text (the leader's address once located). */
    String masterName() {
        MasterLocator.Leader l = master;
        return l == null ? masters.toString() : l.address().toString();
    }

    /**
     * Something to report (disk additions or drops, a new leader): run the loop now instead of at the
     * next heartbeat. A wake while the loop is busy is kept and cuts its next sleep short.
     */
    void wake() {
        lock.lock();
        try {
            wakeRequested = true;
            state.signalAll();
        } finally {
            lock.unlock();
        }
    }

    boolean awaitRegistered(Duration timeout) throws InterruptedException {
        long deadline = System.nanoTime() + timeout.toNanos();
        lock.lock();
        try {
            while (!registered) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    return false;
                }
                state.awaitNanos(left);
            }
            return true;
        } finally {
            lock.unlock();
        }
    }

    private void setRegistered(boolean v) {
        lock.lock();
        try {
            registered = v;
            node.segmentId(v ? segmentId : -1);
            state.signalAll();
        } finally {
            lock.unlock();
        }
    }

    private Duration rpcTimeout() {
        return Duration.ofSeconds(30);
    }

    private void run() {
        while (running) {
            try {
                if (conn != null && masters.elected() && !sameLeader(masters.latest())) {
                    log.info("node {}: the leader changed to {}; leaving {}", node.name(), masters.latest(), master);
                    closeConn();
                    // the segment id is kept: a standby promoted with the leader's metadata knows it (a heartbeat
                    // answers OK and names its term); any other leader answers NOT_FOUND, and the node registers
                    setRegistered(false);
                }
                if (conn == null || conn.isBroken()) {
                    closeConn();
                    MasterLocator.Leader l = masters.locate(config.heartbeatInterval().multipliedBy(3), false);
                    conn = FrameConnection.connect(l.address(), Duration.ofSeconds(3), config.limits(), config.secrets());
                    master = l;
                    beaconsLeft = 0;
                    hello();
                }
                if (segmentId < 0 && (draining || !register())) {
                    closeConn();
                    sleep(config.heartbeatInterval());
                    continue;
                }
                // after a reconnect the heartbeat tells whether the master still knows us
                HeartbeatReply hb = news();
                if (hb == null && beaconsLeft > 0 && registered) {
                    beacon();
                    reportDisk();
                    sleep(config.heartbeatInterval());
                    continue;
                }
                if (hb == null) {
                    hb = heartbeat();
                }
                beaconsLeft = HEARTBEAT_EVERY - 1;
                if (hb.code() != ResultCode.OK) {
                    log.info("node {}: master does not know this node (restarted, or dropped us); registering again",
                            node.name());
                    segmentId = -1;
                    setRegistered(false);
                    beaconsLeft = 0;
                    continue;
                }
                if (hb.term() != node.term()) {
                    beaconsLeft = 0;
                    // a new leader that kept this registration (a promoted standby): follow its term, then heartbeat
                    // again at once, which tells it the node refuses the old leader's writes from now on
                    if (!node.followTerm(hb.term())) {
                        log.warn("node {}: master {} answered with term {}, older than term {} this node follows;"
                                + " looking for the leader again", node.name(), master, hb.term(), node.term());
                        closeConn();
                        sleep(retryInterval());
                    } else {
                        log.info("node {}: kept segment {} under the leader of term {}", node.name(), segmentId,
                                hb.term());
                    }
                    continue;
                }
                setRegistered(true);
                lastHeartbeatMillis = System.currentTimeMillis();
                if (hb.epoch() > node.ledger().epoch()) {
                    long n = node.ledger().reset(hb.epoch());
                    log.warn("node {}: missed a reset; now at epoch {}, dropped {} objects", node.name(), hb.epoch(), n);
                }
                if (outageLogged) {
                    log.info("node {}: master {} reachable again", node.name(), master);
                    outageLogged = false;
                }
                reportDisk();
                sleep(config.heartbeatInterval());
            } catch (IOException | RemoteException e) {
                if (!running) {
                    return;
                }
                if (!outageLogged) {
                    log.warn("node {}: master {} unreachable ({}); retrying every {}", node.name(),
                            master == null ? masters : master,
                            e.getMessage(), Durations.format(retryInterval()));
                    outageLogged = true;
                }
                closeConn();
                // keep the segment id: if the master still knows us after the outage, a heartbeat resumes
                setRegistered(false);
                sleep(retryInterval());
            } catch (RuntimeException e) {
                if (!running) {
                    return;
                }
                log.error("node {}: unexpected failure talking to the master", node.name(), e);
                closeConn();
                segmentId = -1;
                setRegistered(false);
                sleep(config.heartbeatInterval());
            }
        }
    }

    private void hello() throws IOException {
        BodyWriter w = new BodyWriter();
        new MasterMessages.Hello(MasterMessages.Role.NODE, new UUID(incarnation, incarnation),
                node.advertiseHost(), ProcessHandle.current().pid()).write(w);
        conn.call(Opcode.HELLO, w, rpcTimeout());
    }

    /**
     * How soon to try again after the master could not be reached: the heartbeat interval, or with
     * elected masters at most {@link #ELECTED_RETRY} (a new leader publishes its address a moment
     * before it listens, and its rebuild waits for this node).
     */
    private Duration retryInterval() {
        return masters.elected() && config.heartbeatInterval().compareTo(ELECTED_RETRY) > 0
                ? ELECTED_RETRY : config.heartbeatInterval();
    }

    /**
     * The leader record changed. If it names another master than the one connected to, close that
     * connection now: a call waiting on a frozen or cut-off leader fails at once and the loop moves
     * to the new one, instead of after the call's timeout.
     */
    private void leaderChanged() {
        FrameConnection c = conn;
        if (c != null && !sameLeader(masters.latest())) {
            try {
                c.close();
            } catch (IOException ignored) {
                // the loop reconnects
            }
        }
        wake();
    }

    /** Whether the leader record still names the master this link is connected to. */
    private boolean sameLeader(LeaderRecord r) {
        MasterLocator.Leader m = master;
        return r == null || m == null || (r.term() == m.term() && r.address().equals(m.address().toString()));
    }

    /**
     * Registers and uploads the inventory; false when the master is a deposed leader (older term).
     * Writes are refused from the start of the registration until its inventory is in ({@link WriteGate}),
     * and those admitted before it end first, so every object that ever becomes readable here is in
     * this inventory or was refused.
     */
    private boolean register() throws IOException {
        RegionLedger ledger = node.ledger();
        try {
            if (!node.gate().close(config.regionWait())) {
                log.warn("node {}: {} writes still in progress after {}; registering without them (they are not made"
                        + " readable)", node.name(), node.gate().inProgress(), Durations.format(config.regionWait()));
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IOException("interrupted while waiting for writes in progress before registering", e);
        }
        BodyWriter w = new BodyWriter();
        // a token of its own for this registration: from now on only the master it goes to administers us;
        // the last accepted one proves that this is the same node, should that master still hold it
        ControlToken token = node.newRegistration();
        new RegisterNode(node.name(), node.advertiseHost(), node.port(), node.capacity(), ledger.epoch(), incarnation,
                ledger.objectCount(), node.shmPath(), token, accepted).write(w);
        RegisterReply reply;
        try {
            reply = RegisterReply.read(conn.call(Opcode.REGISTER_NODE, w, rpcTimeout()).body());
        } catch (RemoteException e) {
            if (e.status() != FrameStatus.BAD_REQUEST) {
                throw e;
            }
            // refused (another live node holds this segment, or the request was invalid): say why, try again
            long now = System.nanoTime();
            if (!e.getMessage().equals(lastRefusal) || now - lastRefusalLoggedNanos > REFUSAL_LOG_EVERY.toNanos()) {
                log.warn("node {}: master {} refused the registration: {}; trying again every {}", node.name(), master,
                        e.getMessage(), Durations.format(config.heartbeatInterval()));
                lastRefusal = e.getMessage();
                lastRefusalLoggedNanos = now;
            }
            return false;
        }
        lastRefusal = null;
        accepted = token;
        kept.write(token);
        if (!node.followTerm(reply.term())) {
            log.warn("node {}: master {} answered with term {}, older than term {} this node follows; not registering",
                    node.name(), master, reply.term(), node.term());
            return false;
        }
        // becomes our segment id only once the whole inventory is in; a failure midway registers afresh
        int id = reply.segmentId();
        List<RegionLedger.Region> regions = List.of();
        if (!reply.keepInventory()) {
            long n = ledger.reset(reply.epoch());
            if (n > 0) {
                log.warn("node {}: master is at epoch {}; dropped {} objects from an older epoch", node.name(),
                        reply.epoch(), n);
            }
        } else {
            ledger.adoptEpoch(reply.epoch());
            // taken once the master has the registration: an object a same-machine writer stamped and the master
            // accepted (COMMIT) against the registration this one replaces is settled and listed here, since
            // every COMMIT the master took before it is after its stamp; one it takes after it is refused
            regions = ledger.completeRegions();
        }
        InventoryUpload.Counts listed = inventory.send(conn, rpcTimeout(), id, reply.keepInventory(), reply.epoch(),
                regions);
        segmentId = id;
        node.gate().open(); // before it says it is registered: whoever waits for that may put at once
        setRegistered(true);
        log.info("node {}: registered as segment {} at epoch {}{} ({} objects kept, {} dropped, {} failed verification)",
                node.name(), id, reply.epoch(), reply.term() > 0 ? ", term " + reply.term() : "", listed.kept(),
                listed.dropped(), listed.corrupt());
        forgetNews(); // what earlier beacons were told predates this registration
        return true;
    }

    /**
     * The node stops for a restart: tells the master (NODE_DRAIN, on a connection of its own so that a
     * call in flight on the link's does not hold it up), which places nothing more on this segment;
     * from now on the link registers no more. True when the master answered OK within {@code timeout}.
     */
    boolean drain(Duration timeout) {
        draining = true;
        int id = node.segmentId();
        MasterLocator.Leader m = master;
        if (id < 0 || m == null) {
            return false;
        }
        try (FrameConnection c = FrameConnection.connect(m.address(), timeout, config.limits(), config.secrets())) {
            BodyWriter w = new BodyWriter(16);
            new MasterMessages.NodeDrain(id, incarnation).write(w);
            List<ResultCode> codes = MasterMessages.Codes.read(c.call(Opcode.NODE_DRAIN, w, timeout).body()).codes();
            return codes.size() == 1 && codes.getFirst() == ResultCode.OK;
        } catch (IOException | RemoteException e) {
            log.warn("node {}: could not tell master {} that it stops for a restart ({}); it learns at the next"
                    + " registration", node.name(), m.address(), e.getMessage());
            return false;
        }
    }

    /** The node stops for good: its next start is not a restart, and proves nothing. */
    void forgetRegistration() {
        kept.delete();
    }

    /** Per-tier counters for the heartbeat. */
    private MasterMessages.TierStats tierStats() {
        return disk == null
                ? new MasterMessages.TierStats(node.bytesRead(), node.bytesWritten(), node.memoryReads(),
                0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
                : disk.stats(node.bytesRead(), node.bytesWritten(), node.memoryReads());
    }

    private HeartbeatReply heartbeat() throws IOException {
        HeartbeatReply r = HeartbeatReply.read(conn.call(Opcode.NODE_HEARTBEAT, heartbeatBody(), rpcTimeout()).body());
        forgetNews();
        return r;
    }

    /**
     * Drops the answers to earlier beacons that a call just set aside: they came before its reply, so they are older
     * than what the link learns from it (a heartbeat's reply, a registration), and acting on them later would undo
     * it (a NOT_FOUND read after the node registered again would make it register once more).
     */
    private void forgetNews() throws IOException {
        conn.notices(rpcTimeout());
    }

    /** A heartbeat the master answers only with news ({@link #news} reads that answer). */
    private void beacon() throws IOException {
        conn.notify(Opcode.NODE_BEACON, heartbeatBody(), rpcTimeout());
        beaconsLeft--;
    }

    private BodyWriter heartbeatBody() {
        BodyWriter w = new BodyWriter(152);
        new Heartbeat(segmentId, incarnation, node.ledger().epoch(), node.ledger().objectCount(), tierStats(),
                node.term()).write(w);
        return w;
    }

    /**
     * The newest answer to this connection's beacons that has arrived, or null: the master's news, which the
     * link acts on as on a heartbeat's reply. Null at once on a connection that cannot look without waiting (TLS), where every
     * heartbeat is a full one.
     */
    private HeartbeatReply news() throws IOException {
        if (!conn.pollsNotices()) {
            beaconsLeft = 0;
            return null;
        }
        List<FrameConnection.Reply> answers = conn.notices(rpcTimeout());
        return answers.isEmpty() ? null : HeartbeatReply.read(answers.getLast().body());
    }

    /**
     * Reports what the SSD tier stored (NODE_DISK_ADD: the master lists those objects again, as disk
     * copies) and let go (NODE_DISK_DROP). Objects the master refuses to list are removed from disk.
     */
    private void reportDisk() throws IOException {
        if (disk == null) {
            return;
        }
        for (List<DiskStore.Entry> batch = disk.takeAdded(); !batch.isEmpty(); batch = disk.takeAdded()) {
            List<ResultCode> codes;
            try {
                codes = sendDisk(Opcode.NODE_DISK_ADD, batch);
            } catch (IOException | RuntimeException e) {
                disk.requeueAdded(batch); // reported again once the master is reachable
                throw e;
            }
            for (int i = 0; i < batch.size(); i++) {
                if (codes.get(i) != ResultCode.OK) {
                    disk.rejected(batch.get(i));
                }
            }
        }
        for (List<DiskStore.Entry> batch = disk.takeDropped(); !batch.isEmpty(); batch = disk.takeDropped()) {
            try {
                sendDisk(Opcode.NODE_DISK_DROP, batch);
            } catch (IOException | RuntimeException e) {
                disk.requeueDropped(batch);
                throw e;
            }
        }
    }

    private List<ResultCode> sendDisk(Opcode op, List<DiskStore.Entry> batch) throws IOException {
        List<InventoryItem> items = new ArrayList<>(batch.size());
        for (DiskStore.Entry e : batch) {
            items.add(new InventoryItem(0, e.generation(), e.epoch(), e.key(), e.valueLength(), Tier.DISK));
        }
        BodyWriter w = new BodyWriter(64 + items.size() * 128);
        new Inventory(segmentId, incarnation, false, items).write(w);
        return MasterMessages.Codes.read(conn.call(op, w, rpcTimeout()).body()).codes();
    }

    private void sleep(Duration d) {
        lock.lock();
        try {
            long left = d.toNanos();
            while (running && !wakeRequested && left > 0) {
                left = state.awaitNanos(left);
            }
            wakeRequested = false;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            running = false;
        } finally {
            lock.unlock();
        }
    }

    private void closeConn() {
        if (conn != null) {
            try {
                conn.close();
            } catch (IOException ignored) {
                // reconnecting anyway
            }
            conn = null;
        }
    }

    @Override
    public void close() {
        running = false;
        lock.lock();
        try {
            state.signalAll();
        } finally {
            lock.unlock();
        }
        closeConn();
        try {
            thread.join(2000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
