package io.kvpool.protocol.msg;

import io.kvpool.protocol.BadRequestException;
import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameStatus;
import io.kvpool.protocol.MalformedFrameException;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;

import java.util.ArrayList;
import java.util.List;

/** Bodies of requests served by nodes. Layouts are drawn in docs/protocol.md. */
public final class NodeMessages {

    private NodeMessages() {
    }

    /**
     * One object in a NODE_WRITE. Its value bytes follow in the frame payload, in item order.
     *
     * @param offset      region start, as reserved by the master
     * @param generation  from PUT_START; identifies this object version in every later read
     * @param valueCrc    CRC32C of the value, computed by the writer, stored in the object header
     * @param grant       the master's permission covering this write (since version 9), relayed by the writer
     */
    public record WriteItem(long offset, long generation, byte[] key, long valueLength, int valueCrc, WriteGrant grant) {
    }

    /** NODE_WRITE: values for regions the master reserved, fenced by the writer's epoch. */
    public record Write(long epoch, long term, List<WriteItem> items) {
        public void write(BodyWriter w) {
            w.i64(epoch).i64(term).i32(items.size());
            for (WriteItem it : items) {
                w.i64(it.offset).i64(it.generation).bytes(it.key).i64(it.valueLength).i32(it.valueCrc);
                it.grant.write(w);
            }
        }

        public static Write read(BodyReader r) {
            long epoch = r.i64("epoch");
            long term = r.i64("term");
            int n = r.count("item count", 31 + WriteGrant.WIRE_BYTES);
            List<WriteItem> items = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                items.add(new WriteItem(r.length("offset"), r.i64("generation"), KeyList.readKey(r),
                        r.length("value length"), r.i32("value crc"), WriteGrant.read(r)));
            }
            return new Write(epoch, term, items);
        }

        public long payloadLength() {
            long n = 0;
            for (WriteItem it : items) {
                n += it.valueLength;
            }
            return n;
        }
    }

    /** One object in a NODE_READ: a memory region at {@code offset}, or a disk-tier copy found by generation. */
    public record ReadItem(long offset, long generation, long valueLength, Tier tier) {
        public ReadItem(long offset, long generation, long valueLength) {
            this(offset, generation, valueLength, Tier.MEMORY);
        }
    }

    /**
     * NODE_READ: values to send back. The reply body is {@link MasterMessages.Codes}; its payload is
     * the values of the OK items, in item order.
     */
    public record Read(List<ReadItem> items) {
        public void write(BodyWriter w) {
            w.i32(items.size());
            for (ReadItem it : items) {
                w.i64(it.offset).i64(it.generation).i64(it.valueLength).u8(it.tier.code);
            }
        }

        public static Read read(BodyReader r) {
            int n = r.count("item count", 25);
            List<ReadItem> items = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                items.add(new ReadItem(r.length("offset"), r.i64("generation"), r.length("value length"),
                        Tier.of(r.u8("tier"))));
            }
            return new Read(items);
        }
    }

    /**
     * One item of a NODE_READ_RANGE (version 11): the object, named exactly as in NODE_READ, and the
     * range {@code [rangeOffset, rangeOffset + rangeLength)} of its value. The node answers a range
     * outside {@code [0, value length]} BAD_REQUEST; so the offsets are read as plain i64 here and
     * checked there, where the message can name the item.
     */
    public record RangeItem(ReadItem object, long rangeOffset, long rangeLength) {
    }

    /**
     * NODE_READ_RANGE: byte ranges of objects' values. The reply body is {@link MasterMessages.Codes};
     * its payload is the ranges of the OK items, in item order.
     */
    public record ReadRange(List<RangeItem> items) {
        /** Bytes of one item on the wire. */
        public static final int ITEM_BYTES = 41;

        public void write(BodyWriter w) {
            w.i32(items.size());
            for (RangeItem it : items) {
                ReadItem o = it.object;
                w.i64(o.offset).i64(o.generation).i64(o.valueLength).u8(o.tier.code).i64(it.rangeOffset)
                        .i64(it.rangeLength);
            }
        }

        public static ReadRange read(BodyReader r) {
            int n = r.count("item count", ITEM_BYTES);
            List<RangeItem> items = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                ReadItem o = new ReadItem(r.length("offset"), r.i64("generation"), r.length("value length"),
                        Tier.of(r.u8("tier")));
                items.add(new RangeItem(o, r.i64("range offset"), r.i64("range length")));
            }
            return new ReadRange(items);
        }
    }

    /**
     * One item of a NODE_PART_WRITE (version 11): {@code rangeLength} bytes of the payload go to
     * {@code [rangeOffset, rangeOffset + rangeLength)} of the value of the write begun on this
     * connection at {@code offset} with {@code generation}.
     */
    public record PartItem(long offset, long generation, long rangeOffset, long rangeLength) {
    }

    /** NODE_PART_WRITE: parts of values begun with NODE_PART_BEGIN; the payload is the parts in item order. */
    public record PartWrite(List<PartItem> items) {
        /** Bytes of one item on the wire. */
        public static final int ITEM_BYTES = 32;

        public void write(BodyWriter w) {
            w.i32(items.size());
            for (PartItem it : items) {
                w.i64(it.offset).i64(it.generation).i64(it.rangeOffset).i64(it.rangeLength);
            }
        }

        public static PartWrite read(BodyReader r) {
            int n = r.count("item count", ITEM_BYTES);
            List<PartItem> items = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                items.add(new PartItem(r.length("offset"), r.i64("generation"), r.i64("range offset"),
                        r.i64("range length")));
            }
            return new PartWrite(items);
        }

        /** The payload the items announce; a negative length (answered BAD_REQUEST by the node) counts as 0. */
        public long payloadLength() {
            long n = 0;
            for (PartItem it : items) {
                n += Math.max(0, it.rangeLength);
            }
            return n;
        }
    }

    /**
     * One item of NODE_PART_END (version 11): the write begun on this connection at {@code offset}
     * with {@code generation}, the CRC32C of its whole value, and whether the writer wrote all of it.
     */
    public record PartEndItem(long offset, long generation, int valueCrc, boolean complete) {
    }

    /** NODE_PART_END: ends writes begun with NODE_PART_BEGIN. Reply: {@link MasterMessages.Codes}. */
    public record PartEnd(List<PartEndItem> items) {
        /** Bytes of one item on the wire. */
        public static final int ITEM_BYTES = 21;

        public void write(BodyWriter w) {
            w.i32(items.size());
            for (PartEndItem it : items) {
                w.i64(it.offset).i64(it.generation).i32(it.valueCrc).bool(it.complete);
            }
        }

        public static PartEnd read(BodyReader r) {
            int n = r.count("item count", ITEM_BYTES);
            List<PartEndItem> items = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                items.add(new PartEndItem(r.length("offset"), r.i64("generation"), r.i32("value crc"),
                        r.bool("complete")));
            }
            return new PartEnd(items);
        }
    }

    /** One item of NODE_SHM_WRITE_END: whether the client copied the value of this write in full. */
    public record ShmWriteEndItem(long offset, long generation, boolean copied) {
    }

    /**
     * NODE_SHM_WRITE_END: finishes writes begun with NODE_SHM_WRITE_BEGIN (whose body is a {@link Write}
     * without payload). Reply: {@link MasterMessages.Codes}.
     */
    public record ShmWriteEnd(List<ShmWriteEndItem> items) {
        public void write(BodyWriter w) {
            w.i32(items.size());
            for (ShmWriteEndItem it : items) {
                w.i64(it.offset).i64(it.generation).bool(it.copied);
            }
        }

        public static ShmWriteEnd read(BodyReader r) {
            int n = r.count("item count", 17);
            List<ShmWriteEndItem> items = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                items.add(new ShmWriteEndItem(r.length("offset"), r.i64("generation"), r.bool("copied")));
            }
            return new ShmWriteEnd(items);
        }
    }

    /**
     * NODE_WRITE_COMMIT (version 17): a NODE_WRITE of objects placed in write lease {@code leaseId} of
     * segment {@code segmentId}, after which the node commits the objects that landed at its master for
     * the writer (the COMMIT the writer would send, {@code upsert} as there). The values follow as
     * payload, in item order, as in NODE_WRITE. Reply: {@link WriteCommitReply}.
     */
    public record WriteCommit(long leaseId, boolean upsert, int segmentId, Write write) {
        public void write(BodyWriter w) {
            w.i64(leaseId).bool(upsert).i32(segmentId);
            write.write(w);
        }

        public static WriteCommit read(BodyReader r) {
            return new WriteCommit(r.i64("lease id"), r.bool("upsert"), r.i32("segment id"), Write.read(r));
        }
    }

    /**
     * NODE_WRITE_COMMIT reply (version 17): whether the node committed what landed ({@code committed};
     * false: it did not ask its master, and the writer sends the COMMIT itself), then per item the node's
     * write code and, for an item that landed while {@code committed}, the master's COMMIT code (else
     * FAILED).
     */
    public record WriteCommitReply(boolean committed, List<ResultCode> written, List<ResultCode> commit) {
        public WriteCommitReply {
            if (written.size() != commit.size()) {
                throw new IllegalArgumentException(written.size() + " write codes but " + commit.size() + " commit codes");
            }
        }

        public void write(BodyWriter w) {
            w.bool(committed).i32(written.size());
            for (int i = 0; i < written.size(); i++) {
                w.u8(written.get(i).code).u8(commit.get(i).code);
            }
        }

        public static WriteCommitReply read(BodyReader r) {
            boolean committed = r.bool("committed");
            int n = r.count("result count", 2);
            List<ResultCode> written = new ArrayList<>(n);
            List<ResultCode> commit = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                written.add(ResultCode.of(r.u8("write result")));
                commit.add(ResultCode.of(r.u8("commit result")));
            }
            return new WriteCommitReply(committed, written, commit);
        }
    }

    /**
     * NODE_SHM_LEASE: a same-machine writer asks the node to set {@code [offset, offset + length)} of
     * its write lease aside for it, so that it can copy values there and have the node record each
     * object with one NODE_SHM_LEASE_WRITE (whose body is a {@link Write} without payload). Reply:
     * {@link MasterMessages.Codes} with one code. {@code grant}: the lease's (since version 9), which
     * must cover the range.
     */
    public record ShmLease(long epoch, long term, long offset, long length, WriteGrant grant) {
        public void write(BodyWriter w) {
            w.i64(epoch).i64(term).i64(offset).i64(length);
            grant.write(w);
        }

        public static ShmLease read(BodyReader r) {
            return new ShmLease(r.i64("epoch"), r.i64("term"), r.length("offset"), r.length("length"),
                    WriteGrant.read(r));
        }
    }

    /**
     * NODE_SHM_LEASE reply (version 16): the result-code list with one code, then whether the writer may
     * stamp its objects in the range and tell only the master ({@code stamps}), or must record each with
     * NODE_SHM_LEASE_WRITE (a node that verifies writes, {@code --verify-writes}: it checks every value before
     * it becomes readable, which a stamp would skip).
     */
    public record ShmLeaseReply(ResultCode code, boolean stamps) {
        public void write(BodyWriter w) {
            w.i32(1).u8(code.code).bool(stamps);
        }

        public static ShmLeaseReply read(BodyReader r) {
            int n = r.count("result count", 1);
            if (n != 1) {
                throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME,
                        "node_shm_lease reply has " + n + " results, not 1");
            }
            return new ShmLeaseReply(ResultCode.of(r.u8("result")), r.bool("stamps"));
        }
    }

    /**
     * One object in a NODE_FREE: a memory region (by offset and generation) or a disk-tier copy (by
     * generation). {@code spill}: the master evicted a memory object and wants it moved to this
     * node's SSD tier (if it has one) rather than dropped.
     */
    public record FreeItem(long offset, long generation, Tier tier, boolean spill) {
        public FreeItem(long offset, long generation) {
            this(offset, generation, Tier.MEMORY, false);
        }
    }

    /**
     * NODE_FREE (master to node): regions the master of {@code term} freed. Reply: i64 count of
     * regions dropped. {@code token}: the one the node registered with that master under (since
     * version 10, {@link ControlToken}); a node refuses the frame from anyone else, and from a master
     * of an older term.
     */
    public record Free(long term, ControlToken token, List<FreeItem> items) {
        public void write(BodyWriter w) {
            w.i64(term);
            token.write(w);
            w.i32(items.size());
            for (FreeItem it : items) {
                w.i64(it.offset).i64(it.generation).u8(it.tier.code).bool(it.spill);
            }
        }

        public static Free read(BodyReader r) {
            long term = r.i64("term");
            ControlToken token = ControlToken.read(r);
            int n = r.count("item count", 18);
            List<FreeItem> items = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                items.add(new FreeItem(r.length("offset"), r.i64("generation"),
                        Tier.of(r.u8("tier")), r.bool("spill")));
            }
            return new Free(term, token, items);
        }
    }

    /**
     * NODE_RESET (master to node): drop every object, accept writes only from {@code epoch} on. Reply:
     * i64 count. Refused, as NODE_FREE is, without the node's {@code token} or from an older term; and
     * a negative epoch, or one too far ahead, is refused too (docs/protocol.md, section 4.22).
     */
    public record Reset(long epoch, long term, ControlToken token) {
        public void write(BodyWriter w) {
            w.i64(epoch).i64(term);
            token.write(w);
        }

        public static Reset read(BodyReader r) {
            return new Reset(r.i64("epoch"), r.i64("term"), ControlToken.read(r));
        }
    }

    /**
     * One object of a NODE_REPLICATE: the source node's copy (a memory region at {@code offset}, or
     * its disk-tier copy found by generation) and the region the master reserved for it on the target.
     */
    public record ReplicateItem(byte[] key, long generation, long valueLength, Tier tier, long offset,
                                long targetOffset) {
    }

    /**
     * NODE_REPLICATE (master to the node holding a copy): write these objects to the node at
     * {@code targetHost:targetPort} (a NODE_WRITE of the master's {@code epoch} and {@code term}, so the
     * target fences it exactly as a client's write). Reply: {@link MasterMessages.Codes}, one per item:
     * OK once the target stored it; NOT_FOUND when this node no longer holds that copy; the target's
     * code otherwise (FAILED when it could not be reached). {@code token}: the source node's, as in
     * NODE_FREE (since version 10).
     */
    public record Replicate(long epoch, long term, ControlToken token, String targetHost, int targetPort,
                            List<ReplicateItem> items) {
        public void write(BodyWriter w) {
            w.i64(epoch).i64(term);
            token.write(w);
            w.string(targetHost).i32(targetPort).i32(items.size());
            for (ReplicateItem it : items) {
                w.bytes(it.key).i64(it.generation).i64(it.valueLength).u8(it.tier.code).i64(it.offset)
                        .i64(it.targetOffset);
            }
        }

        public static Replicate read(BodyReader r) {
            long epoch = r.i64("epoch");
            long term = r.i64("term");
            ControlToken token = ControlToken.read(r);
            String host = r.string("target host");
            int port = r.i32("target port");
            if (port < 1 || port > 65535) {
                throw new BadRequestException("node_replicate target port " + port
                        + " is not a TCP port");
            }
            int n = r.count("item count", 36);
            List<ReplicateItem> items = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                items.add(new ReplicateItem(KeyList.readKey(r), r.i64("generation"), r.length("value length"),
                        Tier.of(r.u8("tier")), r.length("offset"), r.length("target offset")));
            }
            return new Replicate(epoch, term, token, host, port, items);
        }
    }
}
