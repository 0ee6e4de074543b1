package io.kvpool.protocol.msg;

import io.kvpool.protocol.BadRequestException;
import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameStatus;
import io.kvpool.protocol.Keys;
import io.kvpool.protocol.MalformedFrameException;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.MasterMessages.ClusterStats;
import io.kvpool.protocol.msg.MasterMessages.Codes;
import io.kvpool.protocol.msg.MasterMessages.Flags;
import io.kvpool.protocol.msg.MasterMessages.Heartbeat;
import io.kvpool.protocol.msg.MasterMessages.HeartbeatReply;
import io.kvpool.protocol.msg.MasterMessages.Hello;
import io.kvpool.protocol.msg.MasterMessages.HelloReply;
import io.kvpool.protocol.msg.MasterMessages.Inventory;
import io.kvpool.protocol.msg.MasterMessages.InventoryItem;
import io.kvpool.protocol.msg.MasterMessages.Ping;
import io.kvpool.protocol.msg.MasterMessages.Prefix;
import io.kvpool.protocol.msg.MasterMessages.PutEnd;
import io.kvpool.protocol.msg.MasterMessages.PutEndItem;
import io.kvpool.protocol.msg.MasterMessages.PutStart;
import io.kvpool.protocol.msg.MasterMessages.PutStartItem;
import io.kvpool.protocol.msg.MasterMessages.PutStartReply;
import io.kvpool.protocol.msg.MasterMessages.PutStartResult;
import io.kvpool.protocol.msg.MasterMessages.RegisterNode;
import io.kvpool.protocol.msg.MasterMessages.RegisterReply;
import io.kvpool.protocol.msg.MasterMessages.RemoveAll;
import io.kvpool.protocol.msg.MasterMessages.Removed;
import io.kvpool.protocol.msg.MasterMessages.ReplicaList;
import io.kvpool.protocol.msg.MasterMessages.ReplicaListReply;
import io.kvpool.protocol.msg.MasterMessages.Role;
import io.kvpool.protocol.msg.MasterMessages.SegmentInfo;
import io.kvpool.protocol.msg.MasterMessages.Sizes;
import io.kvpool.protocol.msg.MasterMessages.TierStats;
import org.junit.jupiter.api.Test;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.UUID;
import java.util.function.BiConsumer;
import java.util.function.Function;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * Every message body written and read back. Records holding byte arrays do not compare arrays in
 * {@code equals}, so results are compared field by field, recursively, with arrays by content.
 */
class MessageRoundTripTest {

    private static final long SEED = 0x4D5347L;
    private final Random rnd = new Random(SEED);

    private static byte[] key(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    private byte[] randomKey() {
        byte[] k = new byte[1 + rnd.nextInt(Keys.MAX_KEY_BYTES)];
        rnd.nextBytes(k);
        return k;
    }

    /** Writes {@code msg}, reads it back, checks the body was consumed exactly and every field matches. */
    private byte[] randomMac() {
        byte[] mac = new byte[WriteGrant.MAC_BYTES];
        rnd.nextBytes(mac);
        return mac;
    }

    private WriteGrant randomGrant() {
        return new WriteGrant(64L * rnd.nextInt(1 << 20), rnd.nextLong() >>> 1, rnd.nextLong(), rnd.nextInt(), randomMac());
    }

    private static <T> T roundTrip(T msg, BiConsumer<T, BodyWriter> write, Function<BodyReader, T> read) {
        BodyWriter w = new BodyWriter(1);
        write.accept(msg, w);
        BodyReader r = new BodyReader(w.buffer());
        T back = read.apply(r);
        r.end(msg.getClass().getSimpleName());
        assertThat(back).as("seed=%d", SEED).usingRecursiveComparison().isEqualTo(msg);
        // every strict prefix of the body must be rejected cleanly, never misread
        byte[] all = new byte[w.length()];
        w.buffer().get(all);
        for (int cut = 0; cut < all.length; cut++) {
            BodyReader partial = new BodyReader(ByteBuffer.wrap(all, 0, cut));
            int c = cut;
            assertThatThrownBy(() -> {
                read.apply(partial);
                partial.end("prefix");
            }).as("%s cut at %d of %d", msg.getClass().getSimpleName(), c, all.length)
                    .isInstanceOf(MalformedFrameException.class);
        }
        return back;
    }

    @Test
    void recursiveComparisonSeesArrayContents() {
        // guards the helper: a changed key byte must be noticed
        PutEnd a = new PutEnd(List.of(new PutEndItem(key("abc"), 1, 0)));
        PutEnd b = new PutEnd(List.of(new PutEndItem(key("abd"), 1, 0)));
        assertThatThrownBy(() -> assertThat(b).usingRecursiveComparison().isEqualTo(a)).isInstanceOf(AssertionError.class);
        Flags f1 = new Flags(new boolean[]{true, false});
        Flags f2 = new Flags(new boolean[]{true, true});
        assertThatThrownBy(() -> assertThat(f2).usingRecursiveComparison().isEqualTo(f1)).isInstanceOf(AssertionError.class);
    }

    // ------------------------------------------------------------------ shared pieces

    @Test
    void keyList() {
        roundTrip(new KeyList(List.of()), KeyList::write, KeyList::read);
        roundTrip(new KeyList(List.of(key("a"))), KeyList::write, KeyList::read);
        List<byte[]> keys = new ArrayList<>();
        for (int i = 0; i < 40; i++) {
            keys.add(randomKey());
        }
        keys.add(key("k".repeat(512)));
        KeyList back = roundTrip(new KeyList(keys), KeyList::write, KeyList::read);
        assertThat(back.keys()).hasSize(41);
    }

    @Test
    void blockInfoList() {
        BlockInfoList l = new BlockInfoList(List.of(key("a"), randomKey(), key("k".repeat(512))), List.of(
                new io.kvpool.protocol.BlockInfo(-1L, 16, new int[]{0, 5, Integer.MAX_VALUE}, Long.MIN_VALUE, "lora-é", "s"),
                io.kvpool.protocol.BlockInfo.of(null, 1, new int[0]),
                new io.kvpool.protocol.BlockInfo(7L, 65_536, new int[]{1}, null, null, "")));
        BlockInfoList back = roundTrip(l, BlockInfoList::write, BlockInfoList::read);
        assertThat(back.infos()).isEqualTo(l.infos());
    }

    @Test
    void blockInfoListRejectsUnknownFlagsAndBadFieldsAsBadRequests() {
        BodyWriter flags = new BodyWriter().i32(1).bytes(key("a")).u8(16).i32(16).i32(0);
        assertThatThrownBy(() -> BlockInfoList.read(new BodyReader(flags.buffer())))
                .isInstanceOf(BadRequestException.class).hasMessageContaining("flags");
        BodyWriter size = new BodyWriter().i32(1).bytes(key("a")).u8(0).i32(0).i32(0);
        assertThatThrownBy(() -> BlockInfoList.read(new BodyReader(size.buffer())))
                .isInstanceOf(BadRequestException.class).hasMessageContaining("block size 0");
        BodyWriter token = new BodyWriter().i32(1).bytes(key("a")).u8(0).i32(16).i32(1).i32(-3);
        assertThatThrownBy(() -> BlockInfoList.read(new BodyReader(token.buffer())))
                .isInstanceOf(BadRequestException.class).hasMessageContaining("token id -3");
        BodyWriter tokens = new BodyWriter().i32(1).bytes(key("a")).u8(0).i32(16).i32(1000);
        assertThatThrownBy(() -> BlockInfoList.read(new BodyReader(tokens.buffer())))
                .isInstanceOf(MalformedFrameException.class).hasMessageContaining("token count");
    }

    @Test
    void keyListRejectsEmptyAndOverlongKeys() {
        // a bad key length is invalid content, not broken framing: BAD_REQUEST, connection kept
        BodyWriter empty = new BodyWriter().i32(1).bytes(new byte[0]).u8(0).u8(0);
        assertThatThrownBy(() -> KeyList.read(new BodyReader(empty.buffer())))
                .isInstanceOf(BadRequestException.class).hasMessageContaining("0 bytes");
        assertThatThrownBy(() -> KeyList.readKey(new BodyReader(new BodyWriter().bytes(new byte[0]).buffer())))
                .isInstanceOf(BadRequestException.class).hasMessageContaining("0 bytes");
        assertThatThrownBy(() -> KeyList.readKey(new BodyReader(new BodyWriter().bytes(new byte[513]).buffer())))
                .isInstanceOf(BadRequestException.class).hasMessageContaining("513");
        assertThat(KeyList.readKey(new BodyReader(new BodyWriter().bytes(new byte[512]).buffer()))).hasSize(512);
        assertThat(KeyList.readKey(new BodyReader(new BodyWriter().bytes(new byte[1]).buffer()))).hasSize(1);
    }

    @Test
    void keyListRejectsImplausibleCount() {
        BodyWriter w = new BodyWriter().i32(1_000_000).bytes(key("a"));
        assertThatThrownBy(() -> KeyList.read(new BodyReader(w.buffer())))
                .isInstanceOf(MalformedFrameException.class).hasMessageContaining("key count");
    }

    @Test
    void replica() {
        roundTrip(new Replica(0, 0), Replica::write, Replica::read);
        roundTrip(new Replica(Integer.MAX_VALUE, Long.MAX_VALUE & -64), Replica::write, Replica::read);
        roundTrip(new Replica(-1, 64), Replica::write, Replica::read);
        roundTrip(new Replica(7, Tier.DISK, 0), Replica::write, Replica::read);
        assertThat(new BodyWriter().i32(1).u8(0).i64(2).length()).isEqualTo(Replica.WIRE_BYTES);
        assertThatThrownBy(() -> Replica.read(new BodyReader(new BodyWriter().i32(1).u8(0).i64(-64).buffer())))
                .isInstanceOf(MalformedFrameException.class).hasMessageContaining("offset");
        assertThatThrownBy(() -> Replica.read(new BodyReader(new BodyWriter().i32(1).u8(9).i64(64).buffer())))
                .isInstanceOf(MalformedFrameException.class).hasMessageContaining("tier");
    }

    // ------------------------------------------------------------------ master messages

    @Test
    void hello() {
        for (Role role : Role.values()) {
            roundTrip(new Hello(role, UUID.randomUUID(), "host-\u00e9", rnd.nextLong()), Hello::write, Hello::read);
        }
        roundTrip(new Hello(Role.CLIENT, new UUID(0, 0), "", 0), Hello::write, Hello::read);
        BodyWriter w = new BodyWriter().u8(3).i64(1).i64(2).string("h").i64(3);
        assertThatThrownBy(() -> Hello.read(new BodyReader(w.buffer())))
                .isInstanceOf(MalformedFrameException.class).hasMessageContaining("role 3");
    }

    @Test
    void helloReplyAndPing() {
        roundTrip(new HelloReply(rnd.nextLong(), 7, Keys.MAX_KEY_BYTES, 1L << 40, 3, rnd.nextLong()), HelloReply::write, HelloReply::read);
        roundTrip(new HelloReply(Long.MIN_VALUE, Long.MAX_VALUE, -1, 0, 255, Long.MAX_VALUE), HelloReply::write, HelloReply::read);
        roundTrip(new Ping(UUID.randomUUID()), Ping::write, Ping::read);
    }

    @Test
    void putStart() {
        roundTrip(new PutStart(false, 1, "", List.of()), PutStart::write, PutStart::read);
        List<PutStartItem> items = new ArrayList<>();
        for (int i = 0; i < 30; i++) {
            items.add(new PutStartItem(randomKey(), rnd.nextLong() & Long.MAX_VALUE));
        }
        items.add(new PutStartItem(key("x"), 0));
        items.add(new PutStartItem(key("y"), 10, rnd.nextLong()));
        roundTrip(new PutStart(true, 255, "seg-\u00e9", items), PutStart::write, PutStart::read);
        roundTrip(new PutStart(false, 0, "node-1", List.of(new PutStartItem(key("k"), 1))), PutStart::write,
                PutStart::read);
    }

    @Test
    void writeLeaseMessages() {
        roundTrip(new WriteLeaseMessages.Grant("", 64, 1L << 26, 1), WriteLeaseMessages.Grant::write,
                WriteLeaseMessages.Grant::read);
        roundTrip(new WriteLeaseMessages.Grant("seg-\u00e9", 0, Long.MAX_VALUE, Integer.MAX_VALUE),
                WriteLeaseMessages.Grant::write, WriteLeaseMessages.Grant::read);
        roundTrip(new WriteLeaseMessages.Granted(ResultCode.OK, rnd.nextLong(), 3, rnd.nextLong(), 7, 4096, 1L << 26, rnd.nextLong(),
                64, 30_000, randomMac()), WriteLeaseMessages.Granted::write, WriteLeaseMessages.Granted::read);
        roundTrip(new NodeMessages.ShmLease(rnd.nextLong(), rnd.nextLong(), 4096, 1L << 26, randomGrant()),
                NodeMessages.ShmLease::write, NodeMessages.ShmLease::read);
        for (ResultCode c : List.of(ResultCode.POOL_FULL, ResultCode.NO_SEGMENT, ResultCode.TOO_LARGE)) {
            roundTrip(WriteLeaseMessages.Granted.refused(c), WriteLeaseMessages.Granted::write,
                    WriteLeaseMessages.Granted::read);
        }
        List<WriteLeaseMessages.CommitItem> items = new ArrayList<>();
        for (int i = 0; i < 20; i++) {
            items.add(new WriteLeaseMessages.CommitItem(randomKey(), i * 4096L, rnd.nextLong() & Long.MAX_VALUE,
                    rnd.nextLong()));
        }
        roundTrip(new WriteLeaseMessages.Commit(9, true, items), WriteLeaseMessages.Commit::write,
                WriteLeaseMessages.Commit::read);
        roundTrip(new WriteLeaseMessages.Commit(-1, false, List.of()), WriteLeaseMessages.Commit::write,
                WriteLeaseMessages.Commit::read);
        for (WriteLeaseMessages.Commit c : List.of(new WriteLeaseMessages.Commit(9, true, items),
                new WriteLeaseMessages.Commit(-1, false, List.of()))) {
            BodyWriter sized = new BodyWriter(c.bodyBytes());
            c.write(sized);
            assertThat(sized.position()).isEqualTo(c.bodyBytes()); // the writer presized by it never grows
        }
        roundTrip(new WriteLeaseMessages.Release(rnd.nextLong()), WriteLeaseMessages.Release::write,
                WriteLeaseMessages.Release::read);
        // a negative offset is refused by name, before it reaches the lease checks
        BodyWriter w = new BodyWriter();
        new WriteLeaseMessages.Commit(1, false, List.of(new WriteLeaseMessages.CommitItem(key("k"), -64, 1, 1))).write(w);
        assertThatThrownBy(() -> WriteLeaseMessages.Commit.read(new BodyReader(w.buffer())))
                .isInstanceOf(MalformedFrameException.class).hasMessageContaining("offset");
    }

    @Test
    void putStartRejectsNegativeValueLength() {
        BodyWriter w = new BodyWriter();
        new PutStart(false, 1, "", List.of(new PutStartItem(key("k"), -1))).write(w);
        assertThatThrownBy(() -> PutStart.read(new BodyReader(w.buffer())))
                .isInstanceOf(MalformedFrameException.class).hasMessageContaining("value length");
    }

    @Test
    void putStartReply() {
        roundTrip(new PutStartReply(0, 0, List.of()), PutStartReply::write, PutStartReply::read);
        List<PutStartResult> results = new ArrayList<>();
        results.add(new PutStartResult(ResultCode.OK, 99, List.of(new Replica(1, 64), new Replica(2, 128))));
        results.add(new PutStartResult(ResultCode.OK, 100, List.of()));
        results.add(new PutStartResult(ResultCode.OK, 101, List.of(new Replica(3, 0), new Replica(4, 4096)), true,
                List.of(randomMac(), randomMac())));
        for (ResultCode c : ResultCode.values()) {
            if (c != ResultCode.OK) {
                results.add(PutStartResult.of(c));
            }
        }
        List<Replica> many = new ArrayList<>();
        for (int i = 0; i < 255; i++) {
            many.add(new Replica(i, 64L * i));
        }
        results.add(new PutStartResult(ResultCode.OK, Long.MAX_VALUE, many));
        PutStartReply back = roundTrip(new PutStartReply(12, Long.MAX_VALUE, results), PutStartReply::write, PutStartReply::read);
        assertThat(back.results()).extracting(PutStartResult::code).contains(ResultCode.POOL_FULL, ResultCode.FENCED);
    }

    @Test
    void putEnd() {
        roundTrip(new PutEnd(List.of()), PutEnd::write, PutEnd::read);
        List<PutEndItem> items = new ArrayList<>();
        for (int i = 0; i < 25; i++) {
            items.add(new PutEndItem(randomKey(), rnd.nextLong(), rnd.nextLong()));
        }
        roundTrip(new PutEnd(items), PutEnd::write, PutEnd::read);
    }

    @Test
    void codes() {
        roundTrip(new Codes(List.of()), Codes::write, Codes::read);
        roundTrip(new Codes(List.of(ResultCode.values())), Codes::write, Codes::read);
        BodyWriter w = new BodyWriter().i32(1).u8(200);
        assertThatThrownBy(() -> Codes.read(new BodyReader(w.buffer())))
                .isInstanceOf(MalformedFrameException.class).hasMessageContaining("200");
    }

    @Test
    void replicaListReply() {
        roundTrip(new ReplicaListReply(List.of()), ReplicaListReply::write, ReplicaListReply::read);
        List<ReplicaList> items = List.of(
                new ReplicaList(ResultCode.OK, 1000, 5, List.of(new Replica(3, 4096))),
                ReplicaList.NOT_FOUND,
                new ReplicaList(ResultCode.OK, 0, Long.MIN_VALUE, List.of()),
                new ReplicaList(ResultCode.OK, Long.MAX_VALUE, 6, List.of(new Replica(1, 0), new Replica(2, 64),
                        new Replica(3, 128))),
                ReplicaList.NOT_FOUND);
        roundTrip(new ReplicaListReply(items), ReplicaListReply::write, ReplicaListReply::read);
    }

    @Test
    void flagsAndSizes() {
        roundTrip(new Flags(new boolean[0]), Flags::write, Flags::read);
        roundTrip(new Flags(new boolean[]{true, false, false, true, true}), Flags::write, Flags::read);
        roundTrip(new Sizes(new long[0]), Sizes::write, Sizes::read);
        roundTrip(new Sizes(new long[]{-1, 0, 1, Long.MAX_VALUE, 123456789}), Sizes::write, Sizes::read);
        assertThatThrownBy(() -> Flags.read(new BodyReader(new BodyWriter().i32(1).u8(2).buffer())))
                .isInstanceOf(MalformedFrameException.class).hasMessageContaining("flag");
    }

    @Test
    void prefixRemoveAllRemoved() {
        roundTrip(new Prefix(new byte[0]), Prefix::write, Prefix::read);
        roundTrip(new Prefix(key("model/llama/")), Prefix::write, Prefix::read);
        roundTrip(new RemoveAll(true), RemoveAll::write, RemoveAll::read);
        roundTrip(new RemoveAll(false), RemoveAll::write, RemoveAll::read);
        roundTrip(new Removed(0, 0), Removed::write, Removed::read);
        roundTrip(new Removed(Long.MAX_VALUE, 17), Removed::write, Removed::read);
    }

    @Test
    void clusterStats() {
        roundTrip(new ClusterStats(1, 2, 3, 4, 5, 6, 7, List.of()), ClusterStats::write, ClusterStats::read);
        List<SegmentInfo> segs = List.of(
                new SegmentInfo(0, "seg-a", "10.0.0.1", 50052, 1L << 34, 1L << 20, 17, SegmentInfo.STATE_ACTIVE, 250, "/dev/shm/kvpool-a.seg",
                        new TierStats(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14)),
                new SegmentInfo(1, "", "", 0, 0, 0, 0, SegmentInfo.STATE_JOINING, 0, "", TierStats.NONE),
                new SegmentInfo(Integer.MAX_VALUE, "\u00e9\u20ac", "::1", 65535, Long.MAX_VALUE, -1, Long.MIN_VALUE,
                        255, Long.MAX_VALUE, "/dev/shm/\u00e9", TierStats.NONE));
        roundTrip(new ClusterStats(rnd.nextLong(), 9, 100, 2, 1L << 30, 1L << 40, 12, segs), ClusterStats::write,
                ClusterStats::read);
    }

    @Test
    void registerNodeAndReply() {
        roundTrip(new RegisterNode("seg-1", "10.0.0.2", 50052, 8L << 30, 3, rnd.nextLong(), 1000, "/dev/shm/x.seg",
                ControlToken.random()),
                RegisterNode::write, RegisterNode::read);
        roundTrip(new RegisterNode("", "h", 0, 0, 0, 0, 0, "", ControlToken.NONE), RegisterNode::write,
                RegisterNode::read);
        roundTrip(new RegisterReply(5, 6, true, 9), RegisterReply::write, RegisterReply::read);
        roundTrip(new RegisterReply(-1, 0, false, Long.MAX_VALUE), RegisterReply::write, RegisterReply::read);
        BodyWriter w = new BodyWriter();
        new RegisterNode("s", "h", 1, -1, 0, 0, 0, "", ControlToken.random()).write(w);
        assertThatThrownBy(() -> RegisterNode.read(new BodyReader(w.buffer())))
                .isInstanceOf(MalformedFrameException.class).hasMessageContaining("capacity");
    }

    @Test
    void standbyFeedMessages() {
        byte[] records = new byte[1 + rnd.nextInt(64)];
        rnd.nextBytes(records);
        roundTrip(new StandbyMessages.Follow(-1, 1 << 20, 200, "standby-1"), StandbyMessages.Follow::write,
                StandbyMessages.Follow::read);
        roundTrip(new StandbyMessages.Follow(rnd.nextLong(1L << 62), 8, 0, ""), StandbyMessages.Follow::write,
                StandbyMessages.Follow::read);
        roundTrip(new StandbyMessages.FeedBatch(rnd.nextLong(), 7, true, rnd.nextLong(), 3, records),
                StandbyMessages.FeedBatch::write, StandbyMessages.FeedBatch::read);
        roundTrip(new StandbyMessages.Snapshot(-1, 0, 0), StandbyMessages.Snapshot::write, StandbyMessages.Snapshot::read);
        roundTrip(new StandbyMessages.Snapshot(63, 2, 3), StandbyMessages.Snapshot::write, StandbyMessages.Snapshot::read);
        roundTrip(new StandbyMessages.SnapshotPart(rnd.nextLong(), 4, 9, records), StandbyMessages.SnapshotPart::write,
                StandbyMessages.SnapshotPart::read);
    }

    @Test
    void heartbeatAndReply() {
        roundTrip(new Heartbeat(3, rnd.nextLong(), 4, 5000), Heartbeat::write, Heartbeat::read);
        roundTrip(new Heartbeat(3, rnd.nextLong(), 4, 5000, new TierStats(rnd.nextLong(), 2, 3, 1L << 40, 5, 6, 7, 8,
                9, 10, 11, 12, 13, Long.MAX_VALUE), rnd.nextLong()), Heartbeat::write, Heartbeat::read);
        for (ResultCode c : ResultCode.values()) {
            roundTrip(new HeartbeatReply(c, 42, rnd.nextLong()), HeartbeatReply::write, HeartbeatReply::read);
        }
    }

    @Test
    void inventory() {
        roundTrip(new Inventory(1, 2, true, List.of()), Inventory::write, Inventory::read);
        List<InventoryItem> items = new ArrayList<>();
        for (int i = 0; i < 20; i++) {
            items.add(new InventoryItem(64L * rnd.nextInt(1 << 20), rnd.nextLong(), rnd.nextLong(), randomKey(),
                    rnd.nextLong() & Long.MAX_VALUE));
        }
        items.add(new InventoryItem(0, rnd.nextLong(), rnd.nextLong(), randomKey(), 9, Tier.DISK));
        roundTrip(new Inventory(7, rnd.nextLong(), false, items), Inventory::write, Inventory::read);
    }

    // ------------------------------------------------------------------ node messages

    @Test
    void nodeWrite() {
        roundTrip(new NodeMessages.Write(0, 0, List.of()), NodeMessages.Write::write, NodeMessages.Write::read);
        List<NodeMessages.WriteItem> items = new ArrayList<>();
        for (int i = 0; i < 20; i++) {
            items.add(new NodeMessages.WriteItem(64L * rnd.nextInt(1 << 20), rnd.nextLong(), randomKey(),
                    rnd.nextInt(1 << 20), rnd.nextInt(), i % 2 == 0 ? randomGrant() : WriteGrant.none()));
        }
        NodeMessages.Write w = new NodeMessages.Write(rnd.nextLong(), rnd.nextLong(), items);
        roundTrip(w, NodeMessages.Write::write, NodeMessages.Write::read);
        long total = items.stream().mapToLong(NodeMessages.WriteItem::valueLength).sum();
        assertThat(w.payloadLength()).isEqualTo(total);
        assertThat(new NodeMessages.Write(1, 1, List.of()).payloadLength()).isZero();
    }

    @Test
    void nodeReadFreeReset() {
        roundTrip(new NodeMessages.Read(List.of()), NodeMessages.Read::write, NodeMessages.Read::read);
        roundTrip(new NodeMessages.Read(List.of(new NodeMessages.ReadItem(0, 1, 2),
                        new NodeMessages.ReadItem(Long.MAX_VALUE, Long.MIN_VALUE, Long.MAX_VALUE),
                        new NodeMessages.ReadItem(0, 7, 9, Tier.DISK))),
                NodeMessages.Read::write, NodeMessages.Read::read);
        roundTrip(new NodeMessages.Free(0, ControlToken.NONE, List.of()), NodeMessages.Free::write, NodeMessages.Free::read);
        roundTrip(new NodeMessages.Free(Long.MAX_VALUE, ControlToken.random(), List.of(new NodeMessages.FreeItem(64, 9),
                new NodeMessages.FreeItem(0, -9),
                new NodeMessages.FreeItem(0, 5, Tier.DISK, false),
                new NodeMessages.FreeItem(128, 6, Tier.MEMORY, true))),
                NodeMessages.Free::write, NodeMessages.Free::read);
        roundTrip(new NodeMessages.Reset(0, 0, ControlToken.NONE), NodeMessages.Reset::write, NodeMessages.Reset::read);
        roundTrip(new NodeMessages.Reset(Long.MAX_VALUE, 12, ControlToken.random()), NodeMessages.Reset::write, NodeMessages.Reset::read);
    }

    @Test
    void aControlTokenIsSixteenBytesMatchesOnlyItselfAndNeverShows() {
        ControlToken t = ControlToken.random();
        assertThat(t.matches(new ControlToken(t.bytes()))).isTrue();
        assertThat(t.matches(ControlToken.random())).isFalse();
        assertThat(t.matches(null)).isFalse();
        assertThat(ControlToken.NONE.matches(ControlToken.NONE)).as("no token administers nothing").isFalse();
        assertThat(t.toString()).doesNotContain(java.util.HexFormat.of().formatHex(t.bytes()).substring(0, 8))
                .isEqualTo("ControlToken[hidden]");
        assertThatThrownBy(() -> new ControlToken(new byte[15])).hasMessageContaining("16 bytes, got 15");
        BodyWriter w = new BodyWriter();
        t.write(w);
        assertThat(w.length()).isEqualTo(ControlToken.BYTES);
    }

    @Test
    void nodeWriteRejectsBadKeys() {
        BodyWriter w = new BodyWriter().i64(1).i64(2).i32(1).i64(0).i64(1).bytes(new byte[0]).i64(0).i32(0);
        WriteGrant.none().write(w);
        w.u8(0); // keeps the item count plausible (an item with a key of at least one byte)
        assertThatThrownBy(() -> NodeMessages.Write.read(new BodyReader(w.buffer())))
                .isInstanceOf(BadRequestException.class).hasMessageContaining("key of 0 bytes");
    }
}
