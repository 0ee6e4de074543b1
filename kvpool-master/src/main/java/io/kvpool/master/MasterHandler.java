package io.kvpool.master;

import io.kvpool.master.events.KvEventPublisher;
import io.kvpool.protocol.BadRequestException;
import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameStatus;
import io.kvpool.protocol.Keys;
import io.kvpool.protocol.MalformedFrameException;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.Request;
import io.kvpool.protocol.RequestHandler;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.BlockInfoList;
import io.kvpool.protocol.msg.DigestList;
import io.kvpool.protocol.msg.KeyList;
import io.kvpool.protocol.msg.LeaseMessages;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.MasterMessages.Codes;
import io.kvpool.protocol.msg.StandbyMessages;
import io.kvpool.protocol.msg.WriteLeaseMessages;

import java.io.IOException;
import java.util.List;
import java.util.function.BooleanSupplier;

/**
 * Decodes master requests, runs them on the {@link MasterService}, encodes replies and counts them.
 * Single-item opcodes must carry exactly one item; their batch twins any number.
 */
final class MasterHandler implements RequestHandler {

    private final MasterService service;
    private final MasterMetrics metrics;
    private final BooleanSupplier leading;
    /** KV events for routers, or null when they are off (BLOCK_INFO then keeps nothing). */
    private final KvEventPublisher events;

    MasterHandler(MasterService service, MasterMetrics metrics, BooleanSupplier leading, KvEventPublisher events) {
        this.service = service;
        this.metrics = metrics;
        this.leading = leading;
        this.events = events;
    }

    @Override
    public void handle(Request req) throws IOException {
        Opcode op = req.opcode();
        if (!leading.getAsBoolean()) {
            // a deposed leader answers nothing: the connection closes and the peer looks for the leader
            throw new IOException("master of term " + service.config().term() + " is no longer the leader");
        }
        if (req.payloadLength() != 0) {
            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, req.requestId(),
                    op.metricName + " carries " + req.payloadLength() + " payload bytes; object bytes never go to the master");
        }
        BodyReader body = req.body();
        BodyWriter out = new BodyWriter();
        try {
            switch (op) {
                case HELLO -> {
                    MasterMessages.Hello h = MasterMessages.Hello.read(body);
                    end(body, op);
                    if (h.role() == MasterMessages.Role.CLIENT) {
                        service.clientSeen(h.clientId());
                    }
                    new MasterMessages.HelloReply(service.incarnation(), service.epoch(), Keys.MAX_KEY_BYTES,
                            service.config().maxValueSize().bytes(), service.config().defaultReplicas(),
                            service.config().term()).write(out);
                    metrics.record(op, 1, 0, 0, false);
                }
                case PING -> {
                    MasterMessages.Ping p = MasterMessages.Ping.read(body);
                    end(body, op);
                    service.clientSeen(p.clientId());
                    out.i64(service.epoch());
                    metrics.record(op, 1, 0, 0, false);
                }
                case LEASE -> {
                    LeaseMessages.LeaseRequest lr = LeaseMessages.LeaseRequest.read(body);
                    end(body, op);
                    LeaseMessages.LeaseReply reply = service.renewLease(lr);
                    reply.write(out);
                    metrics.record(op, Math.max(1, reply.records().size()), 0, 0, false);
                }
                case PUT_START, BATCH_PUT_START -> {
                    MasterMessages.PutStart ps = MasterMessages.PutStart.read(body);
                    end(body, op);
                    checkSingle(op, ps.items().size());
                    MasterMessages.PutStartReply reply = service.putStart(ps);
                    reply.write(out);
                    int failed = 0;
                    for (MasterMessages.PutStartResult r : reply.results()) {
                        failed += r.code() == ResultCode.OK ? 0 : 1;
                    }
                    recordCodes(op, ps.items().size(), failed, 0);
                }
                case PUT_END, BATCH_PUT_END, PUT_REVOKE, BATCH_PUT_REVOKE -> {
                    MasterMessages.PutEnd pe = MasterMessages.PutEnd.read(body);
                    end(body, op);
                    checkSingle(op, pe.items().size());
                    boolean end = op == Opcode.PUT_END || op == Opcode.BATCH_PUT_END;
                    List<ResultCode> codes = end ? service.putEnd(pe.items()) : service.putRevoke(pe.items());
                    new Codes(codes).write(out);
                    recordCodes(op, codes.size(), countNot(codes, ResultCode.OK), 0);
                }
                case WRITE_LEASE -> {
                    WriteLeaseMessages.Grant g = WriteLeaseMessages.Grant.read(body);
                    end(body, op);
                    WriteLeaseMessages.Granted reply = service.writeLease(g);
                    reply.write(out);
                    recordCodes(op, 1, reply.code() == ResultCode.OK ? 0 : 1, 0);
                }
                case COMMIT -> {
                    WriteLeaseMessages.Commit c = WriteLeaseMessages.Commit.read(body);
                    end(body, op);
                    List<ResultCode> codes = service.commit(c);
                    new Codes(codes).write(out);
                    recordCodes(op, codes.size(), countNot(codes, ResultCode.OK), 0);
                }
                case RELEASE -> {
                    WriteLeaseMessages.Release r = WriteLeaseMessages.Release.read(body);
                    end(body, op);
                    service.release(r.leaseId());
                    metrics.record(op, 1, 0, 0, false);
                }
                case GET_REPLICA_LIST, BATCH_GET_REPLICA_LIST -> {
                    KeyList kl = KeyList.read(body);
                    end(body, op);
                    checkSingle(op, kl.keys().size());
                    List<MasterMessages.ReplicaList> r = service.getReplicaList(kl.keys());
                    new MasterMessages.ReplicaListReply(r).write(out);
                    int miss = 0;
                    for (MasterMessages.ReplicaList x : r) {
                        miss += x.code() == ResultCode.OK ? 0 : 1;
                    }
                    metrics.record(op, r.size(), 0, miss, false);
                }
                case EXIST_KEY, BATCH_EXIST_KEY -> {
                    KeyList kl = KeyList.read(body);
                    end(body, op);
                    checkSingle(op, kl.keys().size());
                    boolean[] present = service.probes().exists(kl.keys());
                    new MasterMessages.Flags(present).write(out);
                    int miss = 0;
                    for (boolean b : present) {
                        miss += b ? 0 : 1;
                    }
                    metrics.record(op, present.length, 0, miss, false);
                }
                case PREFIX_MATCH -> {
                    // answered by the keys' digests, read in place: no key is copied out of the body, and each
                    // lookup compares a digest where a key compare would fetch the stored key (docs/protocol.md 4.10)
                    DigestList dl = KeyList.readDigests(body);
                    end(body, op);
                    int n = service.probes().prefixMatchDigests(dl.digests(), dl.count());
                    out.i32(n);
                    metrics.record(op, dl.count(), 0, dl.count() - n, false);
                }
                case BLOCK_INFO -> {
                    BlockInfoList bl = BlockInfoList.read(body);
                    end(body, op);
                    out.i32(events == null ? 0 : events.describe(bl.keys(), bl.infos()));
                    metrics.record(op, bl.keys().size(), 0, 0, false);
                }
                case TIER_LOOKUP -> {
                    KeyList kl = KeyList.read(body);
                    end(body, op);
                    byte[] tiers = service.probes().tiers(kl.keys());
                    new MasterMessages.TierCodes(tiers).write(out);
                    metrics.record(op, tiers.length, 0, 0, false);
                }
                case PREFIX_MATCH_DIGEST -> {
                    DigestList dl = DigestList.read(body);
                    end(body, op);
                    int n = service.probes().prefixMatchDigests(dl.digests(), dl.count());
                    out.i32(n);
                    metrics.record(op, dl.count(), 0, dl.count() - n, false);
                }
                case BATCH_EXIST_DIGEST -> {
                    DigestList dl = DigestList.read(body);
                    end(body, op);
                    boolean[] present = service.probes().existsDigests(dl.digests(), dl.count());
                    new MasterMessages.Flags(present).write(out);
                    int miss = 0;
                    for (boolean b : present) {
                        miss += b ? 0 : 1;
                    }
                    metrics.record(op, present.length, 0, miss, false);
                }
                case OBJECT_SIZE -> {
                    KeyList kl = KeyList.read(body);
                    end(body, op);
                    long[] sizes = service.probes().sizes(kl.keys());
                    new MasterMessages.Sizes(sizes).write(out);
                    int miss = 0;
                    for (long s : sizes) {
                        miss += s < 0 ? 1 : 0;
                    }
                    metrics.record(op, sizes.length, 0, miss, false);
                }
                case REMOVE, BATCH_REMOVE -> {
                    KeyList kl = KeyList.read(body);
                    end(body, op);
                    checkSingle(op, kl.keys().size());
                    List<ResultCode> codes = service.remove(kl.keys());
                    new Codes(codes).write(out);
                    metrics.record(op, codes.size(), 0, countNot(codes, ResultCode.OK), false);
                }
                case REMOVE_BY_PREFIX -> {
                    MasterMessages.Prefix p = MasterMessages.Prefix.read(body);
                    end(body, op);
                    if (p.prefix().length == 0) {
                        throw new BadRequestException("remove_by_prefix with an empty prefix; use remove_all to empty the pool");
                    }
                    if (p.prefix().length > Keys.MAX_KEY_BYTES) {
                        throw new BadRequestException("remove_by_prefix with a " + p.prefix().length
                                + "-byte prefix, longer than any key (" + Keys.MAX_KEY_BYTES + " bytes)");
                    }
                    new MasterMessages.Removed(service.removeByPrefix(p.prefix()), service.epoch()).write(out);
                    metrics.record(op, 1, 0, 0, false);
                }
                case REMOVE_ALL -> {
                    MasterMessages.RemoveAll ra = MasterMessages.RemoveAll.read(body);
                    end(body, op);
                    long n = service.removeAll(ra.force());
                    new MasterMessages.Removed(n, service.epoch()).write(out);
                    metrics.record(op, 1, 0, 0, false);
                }
                case CLUSTER_STATS -> {
                    end(body, op);
                    service.stats().write(out);
                    metrics.record(op, 1, 0, 0, false);
                }
                case REGISTER_NODE -> {
                    MasterMessages.RegisterNode r = MasterMessages.RegisterNode.read(body);
                    end(body, op);
                    service.membership().registerNode(r, req.peer()).write(out);
                    metrics.record(op, 1, 0, 0, false);
                }
                case NODE_HEARTBEAT, NODE_BEACON -> {
                    MasterMessages.Heartbeat hb = MasterMessages.Heartbeat.read(body);
                    end(body, op);
                    MasterMessages.HeartbeatReply r = service.membership().heartbeat(hb.segmentId(),
                            hb.nodeIncarnation(), hb.tiers(), req.peer(), hb.term());
                    metrics.record(op, 1, 0, 0, false);
                    if (op == Opcode.NODE_BEACON && !r.newsFor(hb)) {
                        req.answerNothing(); // the node learns nothing from an OK in its own epoch and term
                        return;
                    }
                    r.write(out);
                }
                case NODE_DRAIN -> {
                    MasterMessages.NodeDrain d = MasterMessages.NodeDrain.read(body);
                    end(body, op);
                    ResultCode code = service.membership().drain(d);
                    new Codes(List.of(code)).write(out);
                    metrics.record(op, 1, code == ResultCode.OK ? 0 : 1, 0, false);
                }
                case NODE_DISK_ADD, NODE_DISK_DROP -> {
                    MasterMessages.Inventory inv = MasterMessages.Inventory.read(body);
                    end(body, op);
                    List<ResultCode> codes = op == Opcode.NODE_DISK_ADD ? service.membership().diskAdd(inv) : service.membership().diskDrop(inv);
                    new Codes(codes).write(out);
                    metrics.record(op, codes.size(), countNot(codes, ResultCode.OK), 0, false);
                }
                case NODE_INVENTORY -> {
                    MasterMessages.Inventory inv = MasterMessages.Inventory.read(body);
                    end(body, op);
                    List<ResultCode> codes = service.membership().inventory(inv);
                    new Codes(codes).write(out);
                    metrics.record(op, codes.size(), countNot(codes, ResultCode.OK), 0, false);
                }
                case FEED_FOLLOW -> {
                    StandbyMessages.Follow f = StandbyMessages.Follow.read(body);
                    end(body, op);
                    StandbyMessages.FeedBatch b;
                    try {
                        b = service.feed.follow(f);
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                        throw new java.io.InterruptedIOException("feed_follow interrupted");
                    }
                    b.write(out);
                    metrics.record(op, Math.max(1, b.count()), 0, 0, false);
                }
                case FEED_SNAPSHOT -> {
                    StandbyMessages.Snapshot sn = StandbyMessages.Snapshot.read(body);
                    end(body, op);
                    StandbyMessages.SnapshotPart p = service.feed.snapshot(sn);
                    p.write(out);
                    metrics.record(op, Math.max(1, p.count()), 0, 0, false);
                }
                default -> throw new MalformedFrameException(FrameStatus.UNKNOWN_OPCODE, req.requestId(),
                        op.metricName + " is not served by the master");
            }
        } catch (RuntimeException e) {
            metrics.recordError(op);
            throw e;
        }
        if (SYNCED.contains(op)) {
            service.feed.replicated(); // the standbys in sync have it before the writer hears OK
        }
        req.reply(out);
    }

    /** Writes acknowledged only once the standbys in sync have read them ({@link SyncSet}). */
    private static final java.util.Set<Opcode> SYNCED = java.util.EnumSet.of(Opcode.PUT_END, Opcode.BATCH_PUT_END,
            Opcode.COMMIT, Opcode.REMOVE, Opcode.BATCH_REMOVE, Opcode.REMOVE_BY_PREFIX, Opcode.REMOVE_ALL,
            Opcode.NODE_DISK_ADD);

    @Override
    public void connectionClosed(String peer) {
        // a node's registration whose connection closed has nobody behind it: another may replace it
        service.membership().linkClosed(peer);
    }

    private void recordCodes(Opcode op, int n, int failed, int missed) {
        metrics.record(op, n, failed, missed, !op.isBatch() && failed > 0);
    }

    /** Codes in {@code codes} other than {@code c}. */
    static int countNot(List<ResultCode> codes, ResultCode c) {
        int n = 0;
        for (ResultCode x : codes) {
            n += x == c ? 0 : 1;
        }
        return n;
    }

    private static void end(BodyReader body, Opcode op) {
        body.end(op.metricName);
    }

    private static void checkSingle(Opcode op, int n) {
        if (!op.isBatch() && n != 1) {
            throw new BadRequestException(op.metricName + " carries " + n + " items; the single form takes exactly one"
                    + " (use the batch form)");
        }
    }
}
