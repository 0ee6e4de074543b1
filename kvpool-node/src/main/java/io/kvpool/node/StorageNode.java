package io.kvpool.node;

import io.kvpool.config.HostPort;
import io.kvpool.config.LocalHost;
import io.kvpool.config.Size;
import io.kvpool.etcd.MasterLocator;
import io.kvpool.protocol.BadRequestException;
import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameServer;
import io.kvpool.protocol.FrameStatus;
import io.kvpool.protocol.MalformedFrameException;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.Request;
import io.kvpool.protocol.RequestHandler;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.NodeMessages;
import io.kvpool.web.StatusPages;
import com.sun.net.httpserver.HttpServer;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.net.InetSocketAddress;
import java.time.Duration;
import java.time.InstantSource;

/**
 * A storage node: contributes one off-heap segment to the pool, serves reads and writes of object
 * bytes over TCP, and keeps itself registered with the master (see {@link MasterLink}).
 *
 * <p>The node never decides placement: the master reserves a region and the writer sends its bytes
 * here with the region's offset and generation. The node's own job is the {@link RegionLedger}
 * guarantee (a read returns exactly the object it names, or a miss) and moving bytes between the
 * socket and the segment with no copy through the heap.
 *
 * <p>Lifecycle: constructed = serving and registering; {@link #close()} stops heartbeats, stops
 * serving, waits briefly for transfers in progress, then frees the segment. Closing twice is harmless.
 */
public final class StorageNode implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(StorageNode.class);
    /**
     * Bound on how far one NODE_RESET may move the epoch. A master moves it by one per reset; a node
     * that missed resets catches up through its heartbeat instead, which this does not bound.
     */
    static final long MAX_EPOCH_STEP = 1L << 32;

    private final NodeConfig config;
    private final SegmentMemory memory;
    /** The segment as this node's parts see it (memory, ledger, name, term, counters). */
    private final LocalSegment local;
    private final MemorySegment segment;
    private final RegionLedger ledger;
    private final FrameServer server;
    private final MasterLink link;
    /** Where the master is: fixed, or the leader elected through etcd. */
    private final MasterLocator masters;
    private final String name;
    /** The SSD tier, or null when none is configured (then no disk thread, file or buffer exists). */
    private final DiskTier disk;
    /** Writes by clients on this machine, which copy the values themselves. */
    private final SameMachineWrites sameMachine;
    /** Writes whose values arrive in the frame (NODE_WRITE, NODE_WRITE_COMMIT). */
    private final TcpWrites tcpWrites;
    /** The COMMITs this node sends for its writers (NODE_WRITE_COMMIT). */
    private final ForwardedCommits commits;
    /** Writes whose values arrive in parts (NODE_PART_BEGIN, WRITE, END). */
    private final PartWrites parts;
    /** NODE_READ and NODE_READ_RANGE. */
    private final NodeReads reads;
    /** Copies to other nodes that the master's repair asks for. */
    private final Replication replication;
    /** Dead nodes' segment files in the shared-memory directory (null without one), and who reclaims them. */
    private final OrphanedSegments orphans;
    private final ShmKeeper shmKeeper;
    /** The status page mounted by {@link #mountStatus}, closed with the node; null until then. */
    private volatile StatusPages pages;
    private volatile boolean closed;
    /** Open once the constructor finished (or failed): until then the server's connections wait. */
    private final java.util.concurrent.CountDownLatch started = new java.util.concurrent.CountDownLatch(1);

    public StorageNode(NodeConfig config) throws IOException {
        this.config = config;
        String advertiseHost = config.advertiseHost() != null ? config.advertiseHost()
                : (!"0.0.0.0".equals(config.listenHost()) && !"::".equals(config.listenHost()) ? config.listenHost()
                : LocalHost.defaultAdvertiseAddress());
        this.server = new FrameServer("node", new InetSocketAddress(config.listenHost(), config.port()), config.limits(),
                config.frameTimeout(), Opcode::isNodeOp, new Handler(), config.secrets(), Opcode::access);
        try {
            this.name = new HostPort(advertiseHost, server.port()).toString();
            this.orphans = config.shmDir() == null ? null
                    : new OrphanedSegments(config.shmDir().path(), config.shmDir().orphanGrace(), InstantSource.system());
            this.memory = SegmentMemory.allocate(config.segmentSize().bytes(), config.shmDir(), name, config.prefault(),
                    config.adoptSegment(), orphans);
        } catch (RuntimeException e) {
            server.close();
            throw e;
        }
        this.local = new LocalSegment(config, memory, name, advertiseHost, server.port());
        if (memory.adopted()) {
            adopt(memory, local.ledger());
        }
        this.masters = MasterLocator.of(config.master(), Duration.ofSeconds(2));
        this.segment = local.segment();
        this.ledger = local.ledger();
        this.sameMachine = new SameMachineWrites(local, config);
        DiskTier d = null;
        try {
            d = config.diskDir() == null ? null : new DiskTier(local, config, masters);
        } catch (IOException e) {
            masters.close();
            memory.close();
            server.close();
            throw new IOException("disk tier at " + config.diskDir() + ": " + e.getMessage(), e);
        } catch (RuntimeException e) {
            masters.close();
            memory.close();
            server.close();
            throw e;
        }
        this.disk = d;
        this.parts = new PartWrites(local, config);
        this.reads = new NodeReads(local, disk, config.limits().maxPayloadBytes());
        this.replication = new Replication(name, local, ledger, segment, disk, config.limits(), config.secrets());
        this.link = new MasterLink(local, disk, config, masters, new RegistrationFile(config.diskDir(), memory.file()));
        this.commits = new ForwardedCommits(local, link, config);
        this.tcpWrites = new TcpWrites(local, config, commits);
        this.shmKeeper = orphans == null ? null : new ShmKeeper(orphans, config.shmDir().sweepInterval(), true);
        if (disk != null) {
            disk.onChange(link::wake);
        }
        started.countDown();
        log.info("node {} serving a {} segment, master {}", name, Size.human(segment.byteSize()), config.master());
    }

    /** The segment's name: {@code host:port} as clients reach this node. */
    public String name() {
        return name;
    }

    public String advertiseHost() {
        return local.advertiseHost();
    }

    public int port() {
        return server.port();
    }

    /** Connections closed because their authentication failed or a request needed more than they proved. */
    public long refusedAuth() {
        return server.refusedAuth();
    }

    /** Connections refused for TLS (failed handshake, plain client of a TLS node or the reverse); each is logged. */
    public long tlsHandshakeFailures() {
        return server.tlsHandshakeFailures();
    }

    /** The shared-memory file backing the segment, or "" when it is anonymous memory. */
    public String shmPath() {
        return local.shmPath();
    }

    public long capacity() {
        return segment.byteSize();
    }

    public long objectCount() {
        return ledger.objectCount();
    }

    /** Objects same-machine writers stamped in their lease ranges that this node settled (protocol 4.28, version 16). */
    public long stampedObjects() {
        return ledger.stampedObjects();
    }

    public long epoch() {
        return ledger.epoch();
    }

    /** The highest master term this node has heard of (0 with a single master). */
    public long term() {
        return local.term();
    }

    /** NODE_FREE, NODE_RESET and NODE_REPLICATE frames refused: not from the master it registered with, or deposed. */
    public long refusedAdmin() {
        return local.refusedAdmin();
    }

    /**
     * The control token of this node's current registration, which its master presents to free, reset
     * or copy anything here (null before the first registration). For a test in this process that
     * stands in for the master; nothing logs or exports it.
     */
    public ControlToken controlToken() {
        return local.controlToken();
    }

    /** True once the master has accepted this node's registration and inventory. */
    public boolean isRegistered() {
        return link.isRegistered();
    }

    /** Waits until registered with the master, up to {@code timeout}. */
    public boolean awaitRegistered(Duration timeout) throws InterruptedException {
        return link.awaitRegistered(timeout);
    }

    /**
     * Registers the series only this node can export (what its port refused, its link to the master,
     * its SSD tier's writer; see {@link NodeMetrics}) in {@code registry}: the node's own, or the
     * master's in {@code kvpool serve}.
     */
    public void registerMetrics(PrometheusRegistry registry) {
        NodeMetrics.register(server, local, link, disk, commits, registry);
    }

    /**
     * Mounts this node's status page on {@code http} under {@code prefix}, and {@code /metrics} from
     * {@code registry} (with JVM metrics) unless it is null. The caller starts and stops the server;
     * the page's sampler stops with the node.
     */
    public void mountStatus(HttpServer http, String prefix, PrometheusRegistry registry) {
        NodeStatus status = new NodeStatus(server, local, link, disk);
        pages = StatusPages.mount(http, prefix, registry, status::view, status.history);
    }

    /**
     * The master at {@code address} runs in this process ({@code kvpool serve}): the COMMITs this node sends
     * for its writers (NODE_WRITE_COMMIT) go to it as calls while the node is registered there, not as frames.
     */
    public void commitInProcess(HostPort address, InProcessCommits master) {
        commits.inProcess(address, master);
    }

    /** Objects this node committed at its master for writers (NODE_WRITE_COMMIT, version 17). */
    public long forwardedCommits() {
        return commits.forwarded.get();
    }

    /** NODE_WRITE_COMMITs whose COMMIT this node left to the writer (not registered, another term, master unreachable). */
    public long commitsLeftToWriters() {
        return commits.leftToWriter.get();
    }

    /** Whether this node runs an SSD tier (its store, writer thread and staging memory exist only then). */
    public boolean hasDiskTier() {
        return disk != null;
    }

    private final class Handler implements RequestHandler {
        @Override
        public void handle(Request req) throws IOException {
            awaitStarted(req);
            if (req.opcode() != Opcode.NODE_WRITE && req.opcode() != Opcode.NODE_WRITE_COMMIT
                    && req.opcode() != Opcode.NODE_PART_WRITE && req.payloadLength() != 0) {
                throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, req.requestId(), req.opcode().metricName
                        + " carries " + req.payloadLength() + " payload bytes but takes none");
            }
            switch (req.opcode()) {
                case NODE_WRITE -> tcpWrites.write(req);
                case NODE_WRITE_COMMIT -> tcpWrites.writeCommit(req);
                case NODE_READ -> reads.read(req);
                case NODE_READ_RANGE -> reads.readRange(req);
                case NODE_PART_BEGIN -> parts.begin(req);
                case NODE_PART_WRITE -> parts.write(req);
                case NODE_PART_END -> parts.end(req);
                case NODE_FREE -> free(req);
                case NODE_RESET -> reset(req);
                case NODE_SHM_WRITE_BEGIN -> sameMachine.begin(req);
                case NODE_SHM_WRITE_END -> sameMachine.end(req);
                case NODE_SHM_LEASE -> sameMachine.lease(req);
                case NODE_SHM_LEASE_WRITE -> sameMachine.leaseWrite(req);
                case NODE_REPLICATE -> replication.serve(req);
                default -> throw new MalformedFrameException(FrameStatus.UNKNOWN_OPCODE, req.requestId(),
                        req.opcode().metricName + " is not served by nodes");
            }
        }

        @Override
        public void connectionClosed(String peer) {
            // a same-machine writer that went away leaves its begun writes: they never become readable
            if (started.getCount() == 0 && sameMachine != null) {
                sameMachine.connectionClosed(peer);
            }
            if (started.getCount() == 0 && parts != null) {
                parts.connectionClosed(peer);
            }
        }
    }

    /**
     * The server listens before the node is built (its port names the node and its segment file), so
     * a client that knew this address before a restart can send a frame while the segment is still
     * being adopted: it waits here, up to the frame timeout, instead of reaching half-built parts.
     */
    private void awaitStarted(Request req) throws IOException {
        try {
            if (!started.await(config.frameTimeout().toMillis(), java.util.concurrent.TimeUnit.MILLISECONDS)
                    || ledger == null) {
                throw new IOException("node " + name + " is still starting (or failed to start); "
                        + req.opcode().metricName + " not served");
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IOException("interrupted while the node starts", e);
        }
    }

    private void free(Request req) throws IOException {
        BodyReader body = req.body();
        NodeMessages.Free f = NodeMessages.Free.read(body);
        body.end("node_free");
        local.checkAdmin("node_free", f.term(), f.token());
        long n = 0;
        for (NodeMessages.FreeItem it : f.items()) {
            if (it.tier() == Tier.DISK) {
                n += disk != null && disk.remove(it.generation()) ? 1 : 0;
                ledger.dropRetired(it.generation()); // the memory copy kept on the way to the disk, if any
                continue;
            }
            if (it.spill() && disk != null) {
                // the header stays until the space is written again: a kill before the disk copy is made
                // loses nothing (RegionLedger.retire)
                spill(it.offset(), it.generation());
                if (ledger.retire(it.offset(), it.generation())) {
                    n++;
                }
                continue;
            }
            if (ledger.free(it.offset(), it.generation())) {
                n++;
            }
        }
        req.reply(new BodyWriter(8).i64(n));
    }

    /** Copies an evicted object into the SSD tier's staging queue while its region is pinned. */
    private void spill(long offset, long generation) {
        RegionLedger.Region r = ledger.beginRead(offset, generation);
        if (r == null) {
            return; // already overwritten or freed: nothing to keep
        }
        try {
            disk.spill(r.key, r.generation, r.epoch, segment.asSlice(r.valueOffset(), r.valueLength),
                    DiskTier.headerCrc(segment, r.offset));
        } finally {
            ledger.endRead(r);
        }
    }

    private void reset(Request req) throws IOException {
        BodyReader body = req.body();
        NodeMessages.Reset r = NodeMessages.Reset.read(body);
        body.end("node_reset");
        local.checkAdmin("node_reset", r.term(), r.token());
        checkResetEpoch(r.epoch());
        long n = ledger.reset(r.epoch());
        if (disk != null) {
            n += disk.reset(r.epoch());
        }
        log.info("segment {}: reset to epoch {}, dropped {} objects", name, r.epoch(), n);
        req.reply(new BodyWriter(8).i64(n));
    }

    /** Rebuilds the ledger from the objects a previous run left in the adopted segment file. */
    private void adopt(SegmentMemory m, RegionLedger ledger) {
        long t0 = System.nanoTime();
        try {
            SegmentAdoption.Result r = SegmentAdoption.scan(m.channel(), m.segment(), ledger);
            log.info("segment {}: adopted segment file {}: {} objects kept ({}), {} not complete, {} failed"
                            + " verification; epoch {}; scanned in {} ms", name, m.file(), r.kept(),
                    Size.human(r.keptBytes()), r.skipped(), r.corrupt(), r.epoch(), (System.nanoTime() - t0) / 1_000_000);
        } catch (IOException e) {
            log.warn("segment {}: reading the adopted file {} failed ({}); keeping the {} objects verified so far",
                    name, m.file(), e.toString(), ledger.objectCount());
        }
    }

    /**
     * Refuses a reset to a negative epoch, or to one more than {@link #MAX_EPOCH_STEP} ahead, naming
     * both epochs; nothing is dropped then. A reset to the epoch the node is at, or an older one (a
     * late frame), drops nothing: epochs only move forward ({@link RegionLedger#reset}).
     */
    private void checkResetEpoch(long epoch) {
        long at = ledger.epoch();
        if (epoch < 0) {
            throw new BadRequestException("node_reset to epoch " + epoch + " refused: an epoch is never negative;"
                    + " segment " + name + " stays at epoch " + at);
        }
        if (epoch - at > MAX_EPOCH_STEP) {
            throw new BadRequestException("node_reset to epoch " + epoch + " refused: segment " + name + " is at epoch "
                    + at + ", and one reset moves it by at most " + MAX_EPOCH_STEP + " (a master's reset moves it by one)");
        }
    }

    /** Value bytes stored since start. */
    public long bytesWritten() {
        return local.bytesWritten();
    }

    /** Value bytes served since start. */
    public long bytesRead() {
        return local.bytesRead();
    }

    /**
     * Stops as {@link #close()} does but keeps the segment file, for this node to adopt when it is
     * started again on the same address with the same segment size (a rolling restart). Until then
     * the master answers its objects as on a lost node; the next run re-offers every object that
     * verifies. Without a segment file (anonymous memory) this is {@link #close()}.
     */
    public void closeForRestart() {
        memory.keepFileOnClose();
        drain();
        close(true);
    }

    /**
     * Before a stop for a restart: the master places nothing more here (NODE_DRAIN), new writes are
     * refused (NO_SEGMENT: their writers ask the master for another place), and the writes already
     * admitted end; so nothing is acknowledged on this node that its next run will not offer again.
     */
    private void drain() {
        long t0 = System.nanoTime();
        boolean told = link.drain(Duration.ofSeconds(2));
        boolean quiet;
        try {
            quiet = local.gate().drain(config.regionWait());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            quiet = false;
        }
        log.info("node {}: drained for a restart in {} ms ({}; {})", name, (System.nanoTime() - t0) / 1_000_000,
                told ? "the master places nothing more here" : "the master was not told",
                quiet ? "no write in progress" : local.gate().inProgress() + " writes still in progress are dropped");
    }

    @Override
    public void close() {
        close(false);
    }

    private void close(boolean forRestart) {
        if (closed) {
            return;
        }
        closed = true;
        if (!forRestart) {
            link.forgetRegistration();
        }
        StatusPages p = pages;
        if (p != null) {
            p.close();
        }
        link.close();
        commits.close();
        masters.close();
        if (shmKeeper != null) {
            shmKeeper.close();
        }
        if (disk != null) {
            disk.close();
        }
        try {
            server.close();
            // transfers in flight get half a second to finish (a loopback transfer takes milliseconds); a
            // process stopping on SIGTERM must be gone within a second, and clients in the same process
            // keep the ledger busy until it halts
            ledger.awaitIdle(Duration.ofMillis(500));
        } catch (IOException e) {
            log.warn("node {}: error stopping server: {}", name, e.toString());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        memory.close();
        log.info("node {} stopped", name);
    }
}
