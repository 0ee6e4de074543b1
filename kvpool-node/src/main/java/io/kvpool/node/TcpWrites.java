package io.kvpool.node;

import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameStatus;
import io.kvpool.protocol.Keys;
import io.kvpool.protocol.MalformedFrameException;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Request;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.MasterMessages.Codes;
import io.kvpool.protocol.msg.NodeMessages;
import io.kvpool.protocol.msg.WriteLeaseMessages;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/**
 * Writes whose values arrive in the frame: NODE_WRITE (the master's repair and two-phase puts, and puts
 * under a write lease in batches too large for one frame) and NODE_WRITE_COMMIT (a put under a write lease
 * whose COMMIT this node sends for the writer, {@link ForwardedCommits}).
 *
 * <p>Each item's region is admitted as the master reserved it (its write grant, the epoch; a deposed
 * master's writes DEPOSED, none while registering or draining: NO_SEGMENT, see {@link WriteGate}), its
 * header written as WRITING, its value read from the socket straight into the segment, and the object made
 * readable (checked against its checksum first with {@code --verify-writes}). A refused item's value is
 * read past, so the frame's other items still land.
 */
final class TcpWrites {

    private static final Logger log = LoggerFactory.getLogger(TcpWrites.class);

    private final LocalSegment local;
    private final NodeConfig config;
    private final MemorySegment segment;
    private final ForwardedCommits commits;

    TcpWrites(LocalSegment local, NodeConfig config, ForwardedCommits commits) {
        this.local = local;
        this.config = config;
        this.segment = local.segment();
        this.commits = commits;
    }

    /** NODE_WRITE: a code per item. */
    void write(Request req) throws IOException {
        BodyReader body = req.body();
        NodeMessages.Write w = NodeMessages.Write.read(body);
        body.end("node_write");
        List<ResultCode> codes = land(req, w, "node_write");
        BodyWriter out = new BodyWriter(8 + codes.size());
        new Codes(codes).write(out);
        req.reply(out);
    }

    /**
     * NODE_WRITE_COMMIT: the items land as in NODE_WRITE, then the ones that landed are committed at the
     * master for the writer, after this frame left the write gate (a registration waiting on the gate does
     * not wait on the master's answer).
     */
    void writeCommit(Request req) throws IOException {
        BodyReader body = req.body();
        NodeMessages.WriteCommit wc = NodeMessages.WriteCommit.read(body);
        body.end("node_write_commit");
        NodeMessages.Write w = wc.write();
        List<ResultCode> written = land(req, w, "node_write_commit");
        List<WriteLeaseMessages.CommitItem> landed = new ArrayList<>(written.size());
        for (int i = 0; i < written.size(); i++) {
            if (written.get(i) == ResultCode.OK) {
                NodeMessages.WriteItem it = w.items().get(i);
                landed.add(new WriteLeaseMessages.CommitItem(it.key(), it.offset(), it.valueLength(), it.generation()));
            }
        }
        List<ResultCode> got = landed.isEmpty() ? List.of()
                : commits.commit(wc.segmentId(), w.term(), new WriteLeaseMessages.Commit(wc.leaseId(), wc.upsert(), landed));
        List<ResultCode> commit = new ArrayList<>(Collections.nCopies(written.size(), ResultCode.FAILED));
        if (got != null) {
            int c = 0;
            for (int i = 0; i < written.size(); i++) {
                if (written.get(i) == ResultCode.OK) {
                    commit.set(i, got.get(c++));
                }
            }
        }
        BodyWriter out = new BodyWriter(8 + 2 * written.size());
        new NodeMessages.WriteCommitReply(got != null, written, commit).write(out);
        req.reply(out);
    }

    /** Lands every item of {@code w} whose region is admitted, reading its value from the frame; a code per item. */
    private List<ResultCode> land(Request req, NodeMessages.Write w, String what) throws IOException {
        if (w.payloadLength() != req.payloadLength()) {
            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, req.requestId(), what + " items total "
                    + w.payloadLength() + " value bytes but the frame carries " + req.payloadLength());
        }
        local.checkWrites(req.access(), w);
        List<ResultCode> codes = new ArrayList<>(w.items().size());
        if (!local.currentTerm(w.term())) {
            // placed by a master that lost its leadership: refuse, whatever the epoch
            refuseAll(req, w, ResultCode.DEPOSED, codes);
        } else if (!local.gate().enter()) {
            // registering or draining: what lands now might be in no inventory (WriteGate)
            refuseAll(req, w, ResultCode.NO_SEGMENT, codes);
        } else {
            try {
                // one bound on waiting for busy regions per frame, however many items it carries
                long waitDeadline = System.nanoTime() + config.regionWait().toNanos();
                for (NodeMessages.WriteItem it : w.items()) {
                    codes.add(writeOne(req, w.epoch(), it, waitDeadline));
                }
            } finally {
                local.gate().exit();
            }
        }
        return codes;
    }

    /** Answers every item of a write {@code code}, reading its value bytes past. */
    private void refuseAll(Request req, NodeMessages.Write w, ResultCode code, List<ResultCode> codes) throws IOException {
        for (NodeMessages.WriteItem it : w.items()) {
            local.refusedWrite();
            req.skipPayload(it.valueLength());
            codes.add(code);
        }
    }

    private ResultCode writeOne(Request req, long epoch, NodeMessages.WriteItem it, long waitDeadline) throws IOException {
        RegionLedger.WriteAdmission adm = local.admit(it, epoch, waitDeadline);
        if (adm.region() == null) {
            local.refusedWrite();
            req.skipPayload(it.valueLength());
            return adm.refusal();
        }
        RegionLedger.Region r = adm.region();
        boolean ok = false;
        try {
            ObjectLayout.writeHeader(segment, r.offset, ObjectLayout.STATE_WRITING, it.key(), it.valueLength(),
                    it.generation(), epoch, it.valueCrc());
            MemorySegment dst = segment.asSlice(r.valueOffset(), it.valueLength());
            req.readPayload(dst);
            ok = !config.verifyWrites() || ObjectLayout.valueCrc(dst) == it.valueCrc();
            if (!ok) {
                log.warn("segment {}: value of '{}' at offset {} does not match its checksum; write refused", local.name(),
                        Keys.decode(it.key()), it.offset());
            }
        } finally {
            ok = local.gate().endWrite(r, ok);
        }
        if (ok) {
            local.wrote(it.valueLength());
            return ResultCode.OK;
        }
        return local.ledger().epoch() > epoch ? ResultCode.FENCED
                : local.gate().state() == WriteGate.State.CLOSED ? ResultCode.NO_SEGMENT : ResultCode.FAILED;
    }
}
