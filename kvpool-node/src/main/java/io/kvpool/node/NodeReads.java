package io.kvpool.node;

import io.kvpool.protocol.BadRequestException;
import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.Channels;
import io.kvpool.protocol.Request;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.MasterMessages.Codes;
import io.kvpool.protocol.msg.NodeMessages;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;

/**
 * Reads served by a node: NODE_READ (whole values) and NODE_READ_RANGE (a byte range of each value,
 * version 11). Both name each object exactly (offset, generation, value length, tier) and get it or
 * a miss, never another object's bytes: a memory object is pinned in the {@link RegionLedger} from
 * its check until the reply's last byte was sent; a disk object is staged whole, its checksum
 * verified, and the range sliced out of the staged copy.
 *
 * <p>A ranged read is the whole-value read with a window: the same admission, pins and limits, and a
 * reply payload of the windows instead of the values. A range outside {@code [0, value length]} is
 * the requester's mistake: the whole frame is answered BAD_REQUEST naming the item, before anything
 * is pinned.
 */
final class NodeReads {

    private final LocalSegment local;
    private final RegionLedger ledger;
    private final MemorySegment segment;
    /** Null without an SSD tier. */
    private final DiskTier disk;
    private final long maxPayloadBytes;

    NodeReads(LocalSegment local, DiskTier disk, long maxPayloadBytes) {
        this.local = local;
        this.ledger = local.ledger();
        this.segment = local.segment();
        this.disk = disk;
        this.maxPayloadBytes = maxPayloadBytes;
    }

    /** NODE_READ: whole values. */
    void read(Request req) throws IOException {
        BodyReader body = req.body();
        NodeMessages.Read rd = NodeMessages.Read.read(body);
        body.end("node_read");
        List<NodeMessages.RangeItem> items = new ArrayList<>(rd.items().size());
        for (NodeMessages.ReadItem it : rd.items()) {
            items.add(new NodeMessages.RangeItem(it, 0, it.valueLength()));
        }
        serve(req, "node_read", items);
    }

    /** NODE_READ_RANGE: a range of each value. */
    void readRange(Request req) throws IOException {
        BodyReader body = req.body();
        NodeMessages.ReadRange rd = NodeMessages.ReadRange.read(body);
        body.end("node_read_range");
        for (int i = 0; i < rd.items().size(); i++) {
            NodeMessages.RangeItem it = rd.items().get(i);
            long length = it.object().valueLength();
            if (it.rangeOffset() < 0 || it.rangeLength() < 0 || it.rangeOffset() > length - it.rangeLength()) {
                throw new BadRequestException("node_read_range item " + i + ": range [" + it.rangeOffset() + ", "
                        + it.rangeOffset() + " + " + it.rangeLength() + ") of the object at offset "
                        + it.object().offset() + " generation " + it.object().generation() + " on segment "
                        + local.name() + " is outside its value of " + length + " bytes");
            }
        }
        serve(req, "node_read_range", rd.items());
        local.servedRanges(rd.items().size());
    }

    private void serve(Request req, String op, List<NodeMessages.RangeItem> items) throws IOException {
        List<RegionLedger.Region> pinned = new ArrayList<>(items.size());
        List<DiskTier.Staged> staged = new ArrayList<>();
        try {
            List<ResultCode> codes = new ArrayList<>(items.size());
            List<ByteBuffer> views = new ArrayList<>(items.size());
            long total = 0;
            long fromDisk = 0;
            for (NodeMessages.RangeItem ri : items) {
                NodeMessages.ReadItem it = ri.object();
                MemorySegment value;
                // whatever the tier named, the object is read where this node holds its generation now (never
                // reused, so nothing else matches): the region at the offset, else the SSD tier (queued or
                // written). A copy on its way to disk is listed there from its eviction on, with the offset its
                // memory copy had, and is read from that region until this node takes the spill; a reader that
                // found an object in memory just before it was spilled finds it in the SSD tier
                RegionLedger.Region r = ledger.beginRead(it.offset(), it.generation());
                if (r == null && disk != null) {
                    DiskTier.Staged st = disk.read(it.generation(), it.valueLength());
                    if (st == null) {
                        codes.add(ResultCode.NOT_FOUND);
                        continue;
                    }
                    staged.add(st);
                    value = st.value;
                    fromDisk += ri.rangeLength();
                } else {
                    if (r == null) {
                        codes.add(ResultCode.NOT_FOUND);
                        continue;
                    }
                    pinned.add(r);
                    if (r.valueLength != it.valueLength()) {
                        // generation matches but length does not: the request is wrong, not the data
                        throw new BadRequestException(op + " of offset " + it.offset() + " generation "
                                + it.generation() + " on segment " + local.name() + " asks for " + it.valueLength()
                                + " bytes; the object has " + r.valueLength);
                    }
                    value = segment.asSlice(r.valueOffset(), r.valueLength);
                }
                if (total + ri.rangeLength() > maxPayloadBytes) {
                    throw new BadRequestException(op + " of " + items.size() + " items exceeds the "
                            + maxPayloadBytes + "-byte payload limit of segment " + local.name() + "; split the batch");
                }
                total += ri.rangeLength();
                codes.add(ResultCode.OK);
                Channels.addViews(views, value.asSlice(ri.rangeOffset(), ri.rangeLength()));
            }
            BodyWriter out = new BodyWriter(8 + codes.size());
            new Codes(codes).write(out);
            req.reply(out, views.toArray(ByteBuffer[]::new));
            local.served(total - fromDisk, pinned.size());
        } finally {
            for (RegionLedger.Region r : pinned) {
                ledger.endRead(r);
            }
            for (DiskTier.Staged st : staged) {
                st.close();
            }
        }
    }
}
