package io.kvpool.protocol;

import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.DigestList;
import io.kvpool.protocol.msg.KeyList;
import io.kvpool.protocol.msg.LeaseMessages;
import io.kvpool.protocol.msg.MasterMessages;
import io.kvpool.protocol.msg.NodeMessages;
import io.kvpool.protocol.msg.Replica;
import io.kvpool.protocol.msg.WriteGrant;
import io.kvpool.protocol.msg.WriteLeaseMessages;

import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.function.Consumer;

/**
 * Golden frames for the other clients of the protocol. Prints, one per line, {@code name hex}: the
 * header and the bodies this Java code writes for fixed inputs, and the opcode, result-code and
 * status tables, and the digests of a few keys. The Python client's test suite (python/tests/test_protocol.py) encodes the same
 * inputs and decodes these bytes, so a change on either side that the other does not follow fails a
 * test. Run: {@code java -cp kvpool.jar io.kvpool.protocol.WireVectors}.
 */
public final class WireVectors {

    private WireVectors() {
    }

    /** The vectors, by name, in a fixed order. */
    public static Map<String, byte[]> vectors() {
        Map<String, byte[]> out = new LinkedHashMap<>();
        ByteBuffer h = FrameHeader.write(FrameHeader.allocate(), 0x81, true, 5, 0x0102030405060708L, 0x11223344,
                0x0055667788990011L);
        byte[] hb = new byte[FrameHeader.LENGTH];
        h.get(hb);
        out.put("header_node_read_reply", hb);
        UUID id = new UUID(0x1122334455667788L, -0x123456789abcdefL);
        byte[] k1 = "model@0@abc".getBytes(StandardCharsets.UTF_8);
        byte[] k2 = "ключ-é".getBytes(StandardCharsets.UTF_8);
        out.put("hello", body(w -> new MasterMessages.Hello(MasterMessages.Role.CLIENT, id, "host-1", 4242).write(w)));
        out.put("hello_reply", body(w -> new MasterMessages.HelloReply(77, 3, 512, 256L << 20, 2, 0x0A0B0C0DL).write(w)));
        out.put("ping", body(w -> new MasterMessages.Ping(id).write(w)));
        out.put("block_info", body(w -> new io.kvpool.protocol.msg.BlockInfoList(List.of(k1, k2), List.of(
                new BlockInfo(-2L, 16, new int[]{1, 2, 70000}, 3L, "adapter-é", "salt"),
                BlockInfo.of(null, 16, new int[0]))).write(w)));
        out.put("put_start", body(w -> new MasterMessages.PutStart(true, 2, "127.0.0.1:50052", 3600, List.of(
                new MasterMessages.PutStartItem(k1, 1 << 20, 0), new MasterMessages.PutStartItem(k2, 0, 0))).write(w)));
        out.put("put_start_pin_forever", body(w -> new MasterMessages.PutStart(false, 0, "",
                MasterMessages.PutStart.PIN_FOREVER, List.of(new MasterMessages.PutStartItem(k1, 7, 0))).write(w)));
        byte[] mac1 = new byte[WriteGrant.MAC_BYTES];
        byte[] mac2 = new byte[WriteGrant.MAC_BYTES];
        for (int i = 0; i < mac1.length; i++) {
            mac1[i] = (byte) (0xA0 + i);
            mac2[i] = (byte) (0x10 + i);
        }
        out.put("put_start_reply", body(w -> new MasterMessages.PutStartReply(9, 0x0A0B0C0DL, List.of(
                new MasterMessages.PutStartResult(ResultCode.OK, 1234, List.of(new Replica(1, Tier.MEMORY, 4096),
                        new Replica(2, Tier.DISK, 0)), true, List.of(mac1, mac2)),
                new MasterMessages.PutStartResult(ResultCode.OK, 1235, List.of(new Replica(3, Tier.MEMORY, 0))),
                new MasterMessages.PutStartResult(ResultCode.POOL_FULL, 0, List.of()))).write(w)));
        out.put("put_end", body(w -> new MasterMessages.PutEnd(List.of(new MasterMessages.PutEndItem(k1, 1234, 2),
                new MasterMessages.PutEndItem(k2, -5, -1))).write(w)));
        out.put("write_lease", body(w -> new WriteLeaseMessages.Grant("127.0.0.1:50052", 1 << 20, 64L << 20, 16)
                .write(w)));
        out.put("write_lease_reply", body(w -> new WriteLeaseMessages.Granted(ResultCode.OK, 0x0102030405L, 7, 0x0A0B0C0DL, 3,
                4096, 64L << 20, 5000, 16, 30_000, mac1).write(w)));
        out.put("write_lease_refused", body(w -> WriteLeaseMessages.Granted.refused(ResultCode.POOL_FULL).write(w)));
        out.put("commit", body(w -> new WriteLeaseMessages.Commit(0x0102030405L, true, List.of(
                new WriteLeaseMessages.CommitItem(k1, 4096, 1 << 20, 5000),
                new WriteLeaseMessages.CommitItem(k2, 4096 + (2L << 20), 0, 5001))).write(w)));
        out.put("shm_lease", body(w -> new NodeMessages.ShmLease(7, 0x0A0B0C0DL, 4096, 64L << 20,
                new WriteGrant(4096, 64L << 20, 5000, 16, mac1)).write(w)));
        // an object header and key as a same-machine writer stamps them (section 8; version 16, section 4.28)
        MemorySegment stamped = MemorySegment.ofArray(new byte[(int) ObjectLayout.valueOffset(k2.length)]);
        ObjectLayout.stamp(stamped, 0, k2, 1 << 20, 5001, 7, 0x1A2B3C4D);
        out.put("object_header", stamped.toArray(java.lang.foreign.ValueLayout.JAVA_BYTE));
        out.put("shm_lease_reply", body(w -> new NodeMessages.ShmLeaseReply(ResultCode.OK, true).write(w)));
        out.put("shm_lease_reply_record", body(w -> new NodeMessages.ShmLeaseReply(ResultCode.FENCED, false).write(w)));
        out.put("release", body(w -> new WriteLeaseMessages.Release(0x0102030405L).write(w)));
        out.put("lease", body(w -> new LeaseMessages.LeaseRequest(id, 77, 12, 500, false).write(w)));
        out.put("lease_end", body(w -> new LeaseMessages.LeaseRequest(id, 77, 15, 0, true).write(w)));
        out.put("lease_reply", body(w -> new LeaseMessages.LeaseReply(77, 15, 2000, false, List.of(
                LeaseMessages.Invalidation.keys(13, List.of(k1, k2)), LeaseMessages.Invalidation.prefix(14, k2),
                LeaseMessages.Invalidation.all(15))).write(w)));
        out.put("lease_reply_resync", body(w -> new LeaseMessages.LeaseReply(78, 20, 2000, true, List.of()).write(w)));
        out.put("codes", body(w -> new MasterMessages.Codes(List.of(ResultCode.values())).write(w)));
        out.put("keys", body(w -> new KeyList(List.of(k1, k2)).write(w)));
        out.put("replica_lists", body(w -> new MasterMessages.ReplicaListReply(List.of(
                new MasterMessages.ReplicaList(ResultCode.OK, 1 << 20, 1234, List.of(new Replica(3, Tier.MEMORY, 128))),
                new MasterMessages.ReplicaList(ResultCode.NOT_FOUND, 0, 0, List.of()))).write(w)));
        out.put("flags", body(w -> new MasterMessages.Flags(new boolean[] {true, false, true}).write(w)));
        out.put("sizes", body(w -> new MasterMessages.Sizes(new long[] {1 << 20, -1}).write(w)));
        out.put("prefix", body(w -> new MasterMessages.Prefix(k1).write(w)));
        out.put("remove_all", body(w -> new MasterMessages.RemoveAll(true).write(w)));
        byte[] tb = new byte[ControlToken.BYTES];
        for (int i = 0; i < tb.length; i++) {
            tb[i] = (byte) (0xC0 + i);
        }
        ControlToken token = new ControlToken(tb);
        out.put("node_free", body(w -> new NodeMessages.Free(0x0A0B0C0DL, token, List.of(new NodeMessages.FreeItem(4096, 1234),
                new NodeMessages.FreeItem(0, 7, Tier.DISK, false), new NodeMessages.FreeItem(64, 9, Tier.MEMORY, true)))
                .write(w)));
        out.put("node_replicate", body(w -> new NodeMessages.Replicate(4, 0x0A0B0C0DL, token, "10.0.0.7", 50053, List.of(
                new NodeMessages.ReplicateItem(k1, 1234, 1 << 20, Tier.MEMORY, 4096, 8192),
                new NodeMessages.ReplicateItem(k2, 1235, 0, Tier.DISK, 0, 64))).write(w)));
        out.put("node_reset", body(w -> new NodeMessages.Reset(4, 0x0A0B0C0DL, token).write(w)));
        out.put("register_reply", body(w -> new MasterMessages.RegisterReply(3, 4, true, 0x0A0B0C0DL).write(w)));
        out.put("removed", body(w -> new MasterMessages.Removed(12, 4).write(w)));
        MasterMessages.TierStats tiers = new MasterMessages.TierStats(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14);
        out.put("cluster_stats", body(w -> new MasterMessages.ClusterStats(77, 3, 10, 1, 4096, 1 << 30, 2, List.of(
                new MasterMessages.SegmentInfo(1, "127.0.0.1:50052", "127.0.0.1", 50052, 1 << 30, 4096, 10,
                        MasterMessages.SegmentInfo.STATE_ACTIVE, 250, "/dev/shm/kvpool-x.seg", tiers),
                // version 12: a node stopping for a restart
                new MasterMessages.SegmentInfo(2, "127.0.0.1:50053", "127.0.0.1", 50053, 1 << 30, 0, 0,
                        MasterMessages.SegmentInfo.STATE_DRAINING, 900, "", MasterMessages.TierStats.NONE))).write(w)));
        out.put("node_write", body(w -> new NodeMessages.Write(3, 0x0A0B0C0DL, List.of(
                new NodeMessages.WriteItem(4096, 1234, k1, 1 << 20, 0xE3069283, WriteGrant.region(4096, 1 << 21, 1234, mac2)),
                new NodeMessages.WriteItem(0, 1, k2, 0, 0, WriteGrant.none()))).write(w)));
        // version 17: a put over TCP whose node commits it for the writer
        out.put("node_write_commit", body(w -> new NodeMessages.WriteCommit(0x0102030405L, true, 3,
                new NodeMessages.Write(7, 0x0A0B0C0DL, List.of(new NodeMessages.WriteItem(4096, 5000, k1, 1 << 20,
                        0xE3069283, new WriteGrant(4096, 64L << 20, 5000, 16, mac1))))).write(w)));
        out.put("node_write_commit_reply", body(w -> new NodeMessages.WriteCommitReply(true,
                List.of(ResultCode.OK, ResultCode.OK, ResultCode.FENCED),
                List.of(ResultCode.OK, ResultCode.EXPIRED, ResultCode.FAILED)).write(w)));
        out.put("node_write_commit_reply_not_asked", body(w -> new NodeMessages.WriteCommitReply(false,
                List.of(ResultCode.OK, ResultCode.DEPOSED), List.of(ResultCode.FAILED, ResultCode.FAILED)).write(w)));
        out.put("node_read", body(w -> new NodeMessages.Read(List.of(
                new NodeMessages.ReadItem(4096, 1234, 1 << 20, Tier.MEMORY),
                new NodeMessages.ReadItem(0, 7, 9, Tier.DISK))).write(w)));
        // version 11: ranged reads and writes in parts (NODE_PART_BEGIN's body is node_write's)
        out.put("node_read_range", body(w -> new NodeMessages.ReadRange(List.of(
                new NodeMessages.RangeItem(new NodeMessages.ReadItem(4096, 1234, 1 << 21, Tier.MEMORY), 1 << 16, 1 << 16),
                new NodeMessages.RangeItem(new NodeMessages.ReadItem(0, 7, 9, Tier.DISK), 9, 0))).write(w)));
        out.put("part_write", body(w -> new NodeMessages.PartWrite(List.of(
                new NodeMessages.PartItem(4096, 1234, 31L << 16, 1 << 16), new NodeMessages.PartItem(64, 5, 0, 3)))
                .write(w)));
        out.put("part_end", body(w -> new NodeMessages.PartEnd(List.of(
                new NodeMessages.PartEndItem(4096, 1234, 0xE3069283, true), new NodeMessages.PartEndItem(64, 5, 7, false)))
                .write(w)));
        out.put("shm_write_end", body(w -> new NodeMessages.ShmWriteEnd(List.of(
                new NodeMessages.ShmWriteEndItem(4096, 1234, true), new NodeMessages.ShmWriteEndItem(64, 5, false)))
                .write(w)));
        out.put("digest_list", body(w -> DigestList.of(List.of(k1, k2), 0, 2).write(w)));
        // the authentication exchange (version 8) with fixed nonces and the secrets named in AUTH_*_SECRET
        byte[] cn = new byte[Handshake.NONCE_BYTES];
        byte[] sn = new byte[Handshake.NONCE_BYTES];
        for (int i = 0; i < cn.length; i++) {
            cn[i] = (byte) i;
            sn[i] = (byte) (0x80 + i);
        }
        Secrets s = Secrets.of(AUTH_CLUSTER_SECRET, AUTH_ADMIN_SECRET);
        out.put("auth_begin", body(w -> w.bytes(cn)));
        out.put("auth_begin_reply", body(w -> w.u8(Handshake.MODE_SECURED).bytes(sn)
                .bytes(Handshake.serverProof(s.key(Access.DATA), cn, sn))));
        out.put("auth_begin_reply_open", body(w -> w.u8(Handshake.MODE_OPEN).bytes(sn).bytes(new byte[0])));
        out.put("auth_prove_data", body(w -> w.u8(Access.DATA.code)
                .bytes(Handshake.clientProof(s.key(Access.DATA), Access.DATA, sn, cn))));
        out.put("auth_prove_admin", body(w -> w.u8(Access.ADMIN.code)
                .bytes(Handshake.clientProof(s.key(Access.ADMIN), Access.ADMIN, sn, cn))));
        out.put("auth_prove_reply", body(w -> w.u8(Access.ADMIN.code)));
        // a write grant (version 9) signed with the admin secret of the auth vectors: segment 3, term 0x0A0B0C0D
        out.put("write_grant", body(w -> WriteGrants.of(s).sign(3, 0x0A0B0C0DL, 4096, 64L << 20, 5000, 16).write(w)));
        for (String k : List.of("a", "12345678", "123456789", "kvp1/m/v1/tp0of1-pp0of1/f32/" + "0f".repeat(32), "ключ-é")) {
            long[] d = KeyDigest.of(k.getBytes(StandardCharsets.UTF_8));
            out.put("digest:" + HexFormat.of().formatHex(k.getBytes(StandardCharsets.UTF_8)),
                    body(w -> w.i64(d[0]).i64(d[1])));
        }
        return out;
    }

    /** The secrets of the auth vectors (test values, never a deployment's). */
    static final String AUTH_CLUSTER_SECRET = "cluster-secret-for-vectors-0123";
    static final String AUTH_ADMIN_SECRET = "admin-secret-for-vectors-456789";

    /** The tables as name=code lines. */
    public static Map<String, Integer> tables() {
        Map<String, Integer> out = new LinkedHashMap<>();
        for (Opcode o : Opcode.values()) {
            out.put("opcode." + o.name(), o.code);
        }
        for (ResultCode c : ResultCode.values()) {
            out.put("result." + c.name(), c.code);
        }
        for (FrameStatus s : FrameStatus.values()) {
            out.put("status." + s.name(), s.code);
        }
        out.put("version", (int) FrameHeader.VERSION);
        return out;
    }

    private static byte[] body(Consumer<BodyWriter> f) {
        BodyWriter w = new BodyWriter(256);
        f.accept(w);
        ByteBuffer b = w.buffer();
        byte[] out = new byte[b.remaining()];
        b.get(out);
        return out;
    }

    public static void main(String[] args) {
        HexFormat hex = HexFormat.of();
        vectors().forEach((k, v) -> System.out.println(k + " " + hex.formatHex(v)));
        tables().forEach((k, v) -> System.out.println(k + " " + v));
    }
}
