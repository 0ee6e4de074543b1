package io.kvpool.node;

import io.kvpool.config.HostPort;
import io.kvpool.protocol.BadRequestException;
import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.Channels;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.Secrets;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.RemoteException;
import io.kvpool.protocol.Request;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.MasterMessages.Codes;
import io.kvpool.protocol.msg.NodeMessages;
import io.kvpool.protocol.msg.WriteGrant;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * NODE_REPLICATE: the master's repair asks this node to copy objects it holds to another node. Each
 * copy is read where it is (a memory region, pinned for the read and checked by generation, or the
 * SSD tier's copy) and sent to the target as an ordinary NODE_WRITE under the master's epoch and term,
 * so the target admits or fences it exactly as it would a client's write. Values stream from the
 * segment; nothing is copied on the way except out of the SSD tier.
 *
 * <p>Refused as a whole when the master's term is older than one this node follows: a deposed master
 * cannot make copies.
 */
final class Replication {

    private static final Logger log = LoggerFactory.getLogger(Replication.class);
    /** Bound on connecting to the target and on its answer. */
    static final Duration TARGET_TIMEOUT = Duration.ofSeconds(30);

    private final String name;
    private final LocalSegment local;
    private final RegionLedger ledger;
    private final MemorySegment segment;
    /** Null without an SSD tier. */
    private final DiskTier disk;
    private final Limits limits;
    private final Secrets secrets;

    Replication(String name, LocalSegment local, RegionLedger ledger, MemorySegment segment, DiskTier disk, Limits limits,
                Secrets secrets) {
        this.secrets = secrets;
        this.name = name;
        this.local = local;
        this.ledger = ledger;
        this.segment = segment;
        this.disk = disk;
        this.limits = limits;
    }

    void serve(Request req) throws IOException {
        BodyReader body = req.body();
        NodeMessages.Replicate rp = NodeMessages.Replicate.read(body);
        body.end("node_replicate");
        local.checkAdmin("node_replicate", rp.term(), rp.token());
        List<NodeMessages.ReplicateItem> items = rp.items();
        ResultCode[] codes = new ResultCode[items.size()];
        List<RegionLedger.Region> pinned = new ArrayList<>();
        List<DiskTier.Staged> staged = new ArrayList<>();
        try {
            List<NodeMessages.WriteItem> writes = new ArrayList<>(items.size());
            List<ByteBuffer> views = new ArrayList<>(items.size());
            int[] itemOf = new int[items.size()];
            long total = 0;
            for (int i = 0; i < items.size(); i++) {
                NodeMessages.ReplicateItem it = items.get(i);
                MemorySegment value = source(it, pinned, staged);
                if (value == null) {
                    codes[i] = ResultCode.NOT_FOUND;
                    continue;
                }
                total += it.valueLength();
                if (total > limits.maxPayloadBytes()) {
                    throw new BadRequestException("node_replicate of " + items.size() + " items exceeds the "
                            + limits.maxPayloadBytes() + "-byte payload limit of segment " + name);
                }
                itemOf[writes.size()] = i;
                writes.add(new NodeMessages.WriteItem(it.targetOffset(), it.generation(), it.key(), it.valueLength(),
                        ObjectLayout.valueCrc(value), WriteGrant.none())); // an admin connection: no grant needed
                Channels.addViews(views, value);
            }
            if (!writes.isEmpty()) {
                ResultCode[] landed = send(rp, writes, views);
                for (int w = 0; w < writes.size(); w++) {
                    codes[itemOf[w]] = landed[w];
                }
            }
        } finally {
            for (RegionLedger.Region r : pinned) {
                ledger.endRead(r);
            }
            for (DiskTier.Staged st : staged) {
                st.close();
            }
        }
        BodyWriter out = new BodyWriter(8 + codes.length);
        new Codes(Arrays.asList(codes)).write(out);
        req.reply(out);
    }

    /** The copy's value bytes, held (pinned or staged) until the reply; null when this node no longer has it. */
    private MemorySegment source(NodeMessages.ReplicateItem it, List<RegionLedger.Region> pinned,
                                 List<DiskTier.Staged> staged) throws IOException {
        // read where this node holds the generation now, whatever the tier named, as NodeReads does
        RegionLedger.Region r = ledger.beginRead(it.offset(), it.generation());
        if (r == null && disk != null) {
            DiskTier.Staged st = disk.read(it.generation(), it.valueLength());
            if (st == null) {
                return null;
            }
            staged.add(st);
            return st.value;
        }
        if (r == null) {
            return null;
        }
        pinned.add(r);
        if (r.valueLength != it.valueLength() || !Arrays.equals(r.key, it.key())) {
            return null; // not the object the master means
        }
        return segment.asSlice(r.valueOffset(), r.valueLength);
    }

    /** One NODE_WRITE to the target; every item FAILED when it cannot be reached or errs. */
    private ResultCode[] send(NodeMessages.Replicate rp, List<NodeMessages.WriteItem> writes, List<ByteBuffer> views) {
        ResultCode[] out = new ResultCode[writes.size()];
        BodyWriter w = new BodyWriter(32 + writes.size() * 64);
        new NodeMessages.Write(rp.epoch(), rp.term(), writes).write(w);
        HostPort target = new HostPort(rp.targetHost(), rp.targetPort());
        try (FrameConnection conn = FrameConnection.connect(target, TARGET_TIMEOUT, limits, secrets)) {
            List<ResultCode> got = Codes.read(conn.call(Opcode.NODE_WRITE, w, TARGET_TIMEOUT,
                    views.toArray(ByteBuffer[]::new)).body()).codes();
            for (int i = 0; i < out.length; i++) {
                out[i] = i < got.size() ? got.get(i) : ResultCode.FAILED;
            }
        } catch (IOException | RemoteException e) {
            log.warn("segment {}: copying {} objects to {} failed: {}", name, writes.size(), target, e.getMessage());
            Arrays.fill(out, ResultCode.FAILED);
        }
        return out;
    }
}
