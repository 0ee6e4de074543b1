package io.kvpool.node;

import io.kvpool.config.HostPort;
import io.kvpool.etcd.MasterLocator;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.WriteLeaseMessages;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The COMMITs a node sends for its writers (NODE_WRITE_COMMIT, protocol version 17, section 4.41).
 *
 * <h2>Why</h2>
 * A put over TCP under a write lease used to be two exchanges in a row: the values to the node
 * (NODE_WRITE), then the COMMIT to the master. With NODE_WRITE_COMMIT the writer sends the values once
 * and the node, once they landed, sends the COMMIT the writer would have sent to the master it is
 * registered with, and answers the writer with the master's codes: the writer waits for one exchange.
 * When the master runs in this process ({@code kvpool serve}) the COMMIT is a call, not a frame
 * ({@link #inProcess}), so such a put is one network round trip in all.
 *
 * <h2>Why it is safe</h2>
 * The COMMIT is the writer's own, byte for byte, sent after the objects became readable here, exactly as
 * the writer would have sent it after NODE_WRITE's reply; the master checks it as it checks any COMMIT (the
 * lease, its range and generations, the epoch). So every argument about the writer's COMMIT (docs/protocol.md
 * 4.27, and "Nothing acknowledged is lost across a restart" in docs/architecture.md) holds unchanged.
 * The node asks only the master it is registered with, for a lease of its own segment there and of the
 * term it follows; otherwise, or when that master cannot be reached, it asks nobody and says so, and the
 * writer sends the COMMIT itself (COMMIT is idempotent: one sent twice finds its own objects, OK).
 *
 * <p>Thread-safe: the node's request threads forward at once, each on a pooled connection.
 */
final class ForwardedCommits implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(ForwardedCommits.class);
    /** Idle connections to the master kept for the next forward. */
    static final int MAX_IDLE = 8;

    private final LocalSegment local;
    private final MasterLink link;
    private final NodeConfig config;
    private volatile InProcessCommits inProcess;
    /** The address of the master {@link #inProcess} serves: used only while the node is registered there. */
    private volatile HostPort inProcessAt;
    private final ArrayDeque<FrameConnection> idle = new ArrayDeque<>();
    /** The master the idle connections go to. */
    private HostPort idleTo;
    private boolean closed;
    /** Objects committed for writers, and NODE_WRITE_COMMITs whose COMMIT the node left to its writer. */
    final AtomicLong forwarded = new AtomicLong();
    final AtomicLong leftToWriter = new AtomicLong();

    ForwardedCommits(LocalSegment local, MasterLink link, NodeConfig config) {
        this.local = local;
        this.link = link;
        this.config = config;
    }

    /** Commits go to {@code master}, at {@code address} in this process, by calling it (no connection). */
    void inProcess(HostPort address, InProcessCommits master) {
        this.inProcessAt = address;
        this.inProcess = master;
    }

    /**
     * The master's codes for {@code commit}, asked for a writer whose lease is of segment {@code segmentId}
     * and term {@code term}; null when this node did not ask (not registered, another segment or term, the
     * master unreachable or failing): the writer then commits itself.
     */
    List<ResultCode> commit(int segmentId, long term, WriteLeaseMessages.Commit commit) {
        MasterLocator.Leader master = link.registeredMaster();
        if (master == null || segmentId != local.segmentId() || term != local.term()) {
            leftToWriter.incrementAndGet();
            return null;
        }
        List<ResultCode> codes;
        InProcessCommits here = inProcess;
        try {
            codes = here != null && master.address().equals(inProcessAt) ? here.commit(commit) : overTcp(master.address(), commit);
        } catch (IOException | RuntimeException e) { // RemoteException included: the master refused the frame
            log.debug("node {}: COMMIT of lease {} left to its writer: {}", local.name(), commit.leaseId(), e.toString());
            leftToWriter.incrementAndGet();
            return null;
        }
        if (codes.size() != commit.items().size()) {
            log.warn("node {}: the master answered {} codes for a COMMIT of {} items; left to the writer", local.name(),
                    codes.size(), commit.items().size());
            leftToWriter.incrementAndGet();
            return null;
        }
        for (ResultCode c : codes) {
            if (c == ResultCode.OK) {
                forwarded.incrementAndGet();
            }
        }
        return codes;
    }

    private List<ResultCode> overTcp(HostPort master, WriteLeaseMessages.Commit commit) throws IOException {
        BodyWriter w = new BodyWriter(32 + commit.items().size() * 64);
        commit.write(w);
        FrameConnection c = borrow(master);
        boolean ok = false;
        try {
            List<ResultCode> codes = MasterMessages.Codes.read(c.call(Opcode.COMMIT, w, config.frameTimeout()).body()).codes();
            ok = true;
            return codes;
        } finally {
            if (ok) {
                giveBack(master, c);
            } else {
                c.close();
            }
        }
    }

    private FrameConnection borrow(HostPort master) throws IOException {
        synchronized (this) {
            if (closed) {
                throw new IOException("node stopping");
            }
            if (master.equals(idleTo)) {
                FrameConnection c = idle.pollFirst();
                if (c != null && !c.isBroken()) {
                    return c;
                }
                if (c != null) {
                    c.close();
                }
            }
        }
        return FrameConnection.connect(master, Duration.ofSeconds(3), config.limits(), config.secrets());
    }

    private void giveBack(HostPort master, FrameConnection c) throws IOException {
        FrameConnection drop = null;
        synchronized (this) {
            if (!master.equals(idleTo)) {
                // the node follows another master now: the connections to the old one go
                for (FrameConnection old : idle) {
                    old.close();
                }
                idle.clear();
                idleTo = master;
            }
            if (closed || idle.size() >= MAX_IDLE) {
                drop = c;
            } else {
                idle.addFirst(c);
            }
        }
        if (drop != null) {
            drop.close();
        }
    }

    @Override
    public void close() {
        synchronized (this) {
            closed = true;
            for (FrameConnection c : idle) {
                try {
                    c.close();
                } catch (IOException e) {
                    // closing anyway
                }
            }
            idle.clear();
        }
    }
}
