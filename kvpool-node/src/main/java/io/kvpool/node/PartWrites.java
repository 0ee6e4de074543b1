package io.kvpool.node;

import io.kvpool.protocol.BadRequestException;
import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameStatus;
import io.kvpool.protocol.MalformedFrameException;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.Request;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.MasterMessages.Codes;
import io.kvpool.protocol.msg.NodeMessages;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Writes whose values arrive in parts (protocol version 11; docs/protocol.md, section 4.35): the
 * primitive of a layer-by-layer save, where each layer of a block is written as soon as it is
 * computed, in any order, and the block becomes readable once all of it is there.
 *
 * <h2>The exchange</h2>
 * <ol>
 *   <li><b>NODE_PART_BEGIN</b> (NODE_WRITE's body, no payload) admits each object's region exactly as
 *       NODE_WRITE does: the write grant checked, older epochs refused (FENCED), a deposed master's
 *       placements refused (DEPOSED), readers and writers of the space waited for (bounded by the
 *       region wait, then FAILED), what overlaps dropped. The header is stamped WRITING; the region
 *       is held for <em>this connection</em>.</li>
 *   <li><b>NODE_PART_WRITE</b> carries parts: per item the region, a range of its value, and that many
 *       payload bytes, streamed from the socket straight into the segment. A writer on the node's
 *       machine copies its parts into the mapped segment itself instead and sends none.</li>
 *   <li><b>NODE_PART_END</b> gives each value's CRC32C (known only once every part was written) and
 *       whether the writer wrote all of it. The node stamps the checksum into the header (checking it
 *       against the value with {@code --verify-writes}) and makes the object readable, or drops it.</li>
 * </ol>
 *
 * <h2>Fencing</h2>
 * The rules of {@link RegionLedger} hold throughout: a region being written is busy, so no other
 * write is admitted over it and no read names it until the end; a reset or free meanwhile marks it
 * dead, parts for it are then refused (FENCED) without moving their bytes, and its end makes nothing
 * readable. A master of a newer term met since the begin makes its parts and end DEPOSED. When the
 * connection closes, every write begun on it and not ended is dropped, never readable.
 */
final class PartWrites {

    /** A write begun on a connection, and the master term of the frame that began it. */
    private record Open(RegionLedger.Region region, long term) {
    }

    private final LocalSegment node;
    private final RegionLedger ledger;
    private final MemorySegment segment;
    private final NodeConfig config;
    /** Writes begun and not ended, by connection (peer) and generation. */
    private final Map<String, Map<Long, Open>> begun = new ConcurrentHashMap<>();

    PartWrites(LocalSegment node, NodeConfig config) {
        this.node = node;
        this.ledger = node.ledger();
        this.segment = node.segment();
        this.config = config;
    }

    /** NODE_PART_BEGIN: admits the writes and holds them for this connection. */
    void begin(Request req) throws IOException {
        BodyReader body = req.body();
        NodeMessages.Write w = NodeMessages.Write.read(body);
        body.end("node_part_begin");
        node.checkWrites(req.access(), w);
        if (!node.currentTerm(w.term())) {
            for (int i = 0; i < w.items().size(); i++) {
                node.refusedWrite();
            }
            reply(req, Collections.nCopies(w.items().size(), ResultCode.DEPOSED));
            return;
        }
        if (!node.gate().enter()) {
            for (int i = 0; i < w.items().size(); i++) {
                node.refusedWrite();
            }
            reply(req, Collections.nCopies(w.items().size(), ResultCode.NO_SEGMENT));
            return;
        }
        try {
            Map<Long, Open> open = begun.computeIfAbsent(req.peer(), p -> new ConcurrentHashMap<>());
            reply(req, node.admitHeld(w, (it, region) -> {
                Open previous = open.put(it.generation(), new Open(region, w.term()));
                if (previous != null) {
                    ledger.endWrite(previous.region, false);
                }
            }));
        } finally {
            node.gate().exit();
        }
    }

    /**
     * NODE_PART_WRITE: streams each part into the value of a write begun on this connection. Every
     * item is checked before any payload byte is read: a range outside its value is BAD_REQUEST for
     * the whole frame. Codes per item: OK; NOT_FOUND (no such write begun on this connection, or
     * ended); FENCED (a reset or free since the begin); DEPOSED (a newer master since the begin).
     * A refused item's bytes are read and dropped, so the next item's still line up.
     */
    void write(Request req) throws IOException {
        BodyReader body = req.body();
        NodeMessages.PartWrite pw = NodeMessages.PartWrite.read(body);
        body.end("node_part_write");
        if (pw.payloadLength() != req.payloadLength()) {
            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, req.requestId(), "node_part_write items total "
                    + pw.payloadLength() + " bytes but the frame carries " + req.payloadLength());
        }
        Map<Long, Open> open = begun.getOrDefault(req.peer(), Map.of());
        Open[] found = new Open[pw.items().size()];
        for (int i = 0; i < found.length; i++) {
            NodeMessages.PartItem it = pw.items().get(i);
            Open o = open.get(it.generation());
            found[i] = o != null && o.region.offset == it.offset() ? o : null;
            long limit = found[i] == null ? Long.MAX_VALUE : found[i].region.valueLength;
            if (it.rangeOffset() < 0 || it.rangeLength() < 0 || it.rangeOffset() > limit - it.rangeLength()) {
                throw new BadRequestException("node_part_write item " + i + ": range [" + it.rangeOffset() + ", "
                        + it.rangeOffset() + " + " + it.rangeLength() + ") of the write at offset " + it.offset()
                        + " generation " + it.generation() + " on segment " + node.name() + " is outside its value"
                        + (found[i] == null ? "" : " of " + limit + " bytes"));
            }
        }
        List<ResultCode> codes = new ArrayList<>(found.length);
        long bytes = 0;
        boolean admitted = node.gate().carryOn();
        try {
            for (int i = 0; i < found.length; i++) {
                bytes += writePart(req, pw.items().get(i), found[i], admitted, codes);
            }
        } finally {
            if (admitted) {
                node.gate().exit();
            }
        }
        node.partsWritten(found.length, bytes);
        reply(req, codes);
    }

    /** One item of NODE_PART_WRITE: its bytes stored, or read past; its code added. Returns the bytes stored. */
    private long writePart(Request req, NodeMessages.PartItem it, Open found, boolean admitted, List<ResultCode> codes)
            throws IOException {
        ResultCode code = found == null ? ResultCode.NOT_FOUND
                : !node.currentTerm(found.term) ? ResultCode.DEPOSED
                : !admitted ? ResultCode.NO_SEGMENT
                : !ledger.stillWritable(found.region) ? ResultCode.FENCED : ResultCode.OK;
        codes.add(code);
        if (code == ResultCode.OK) {
            RegionLedger.Region r = found.region;
            req.readPayload(segment.asSlice(r.valueOffset() + it.rangeOffset(), it.rangeLength()));
            return it.rangeLength();
        }
        node.refusedWrite();
        req.skipPayload(it.rangeLength());
        return 0;
    }

    /**
     * NODE_PART_END: stamps each value's checksum and makes the object readable (OK), or drops it:
     * FAILED when the writer says it did not write all of it or (with {@code --verify-writes}) the
     * value does not match the checksum, FENCED after a reset, DEPOSED after a newer master, NOT_FOUND
     * when no such write was begun on this connection.
     */
    void end(Request req) throws IOException {
        BodyReader body = req.body();
        NodeMessages.PartEnd end = NodeMessages.PartEnd.read(body);
        body.end("node_part_end");
        Map<Long, Open> open = begun.getOrDefault(req.peer(), Map.of());
        List<ResultCode> codes = new ArrayList<>(end.items().size());
        boolean admitted = node.gate().carryOn();
        try {
            for (NodeMessages.PartEndItem it : end.items()) {
                codes.add(endOne(open, it, admitted));
            }
        } finally {
            if (admitted) {
                node.gate().exit();
            }
        }
        reply(req, codes);
    }

    /** One item of NODE_PART_END. */
    private ResultCode endOne(Map<Long, Open> open, NodeMessages.PartEndItem it, boolean admitted) {
        Open o = open.get(it.generation());
        if (o == null || o.region.offset != it.offset()) {
            return ResultCode.NOT_FOUND;
        }
        open.remove(it.generation());
        RegionLedger.Region r = o.region;
        if (!node.currentTerm(o.term) || !admitted) {
            ledger.endWrite(r, false);
            node.refusedWrite();
            return node.currentTerm(o.term) ? ResultCode.NO_SEGMENT : ResultCode.DEPOSED;
        }
        boolean ok = false;
        if (it.complete()) {
            ObjectLayout.writeHeader(segment, r.offset, ObjectLayout.STATE_WRITING, r.key, r.valueLength,
                    r.generation, r.epoch, it.valueCrc());
            ok = !config.verifyWrites()
                    || ObjectLayout.valueCrc(segment.asSlice(r.valueOffset(), r.valueLength)) == it.valueCrc();
        }
        if (node.gate().endWrite(r, ok)) {
            node.wrote(r.valueLength);
            node.partObjectDone();
            return ResultCode.OK;
        }
        node.refusedWrite();
        return ledger.epoch() > r.epoch ? ResultCode.FENCED : ResultCode.FAILED;
    }

    /** A connection closed: what it began and did not end is dropped. */
    void connectionClosed(String peer) {
        Map<Long, Open> open = begun.remove(peer);
        if (open != null) {
            for (Open o : open.values()) {
                ledger.endWrite(o.region, false);
            }
        }
    }

    private static void reply(Request req, List<ResultCode> codes) throws IOException {
        BodyWriter out = new BodyWriter(8 + codes.size());
        new Codes(codes).write(out);
        req.reply(out);
    }
}
