package io.kvpool.master;

import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.MasterMessages.Inventory;
import io.kvpool.protocol.msg.MasterMessages.PutEndItem;
import io.kvpool.protocol.msg.MasterMessages.PutStart;
import io.kvpool.protocol.msg.MasterMessages.PutStartItem;
import io.kvpool.protocol.msg.MasterMessages.PutStartReply;
import io.kvpool.protocol.msg.MasterMessages.PutStartResult;
import io.kvpool.protocol.msg.MasterMessages.RegisterNode;
import io.kvpool.protocol.msg.MasterMessages.RegisterReply;
import io.kvpool.protocol.msg.StandbyMessages.FeedBatch;
import io.kvpool.protocol.msg.StandbyMessages.Follow;
import io.kvpool.protocol.msg.StandbyMessages.Snapshot;
import io.kvpool.protocol.msg.StandbyMessages.SnapshotPart;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;

import io.kvpool.config.HostPort;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.List;
import java.util.SplittableRandom;
import java.util.TreeMap;
import java.util.function.Consumer;
import java.util.stream.Stream;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * A standby's copy against the leader it follows: a leader driven by random operations (puts with several
 * copies and failed replicas, upserts, pins, removals by key and prefix, remove_all, resets, a node lost and a
 * new one registered), a follower that turns the feed on, snapshots shard by shard while the operations go on
 * between the shards, then follows; at the end the copy holds exactly what the leader holds. Hashes are squeezed
 * as in {@link IndexModelTest} so keys collide. Failures name the seed.
 */
class StandbyFeedTest {

    static Stream<Arguments> runs() {
        List<Arguments> out = new ArrayList<>();
        for (int mask : new int[]{-1, 0x3, 0xFC00_0001, 0}) {
            for (long seed = 1; seed <= 6; seed++) {
                out.add(Arguments.of(seed * 7_919 + mask, mask));
            }
        }
        return out.stream();
    }

    /** A leader, its index, and the operations a test drives it with. */
    private static final class Leader {
        final ManualClock clock = new ManualClock(1_700_000_000_000L);
        final ObjectIndex index;
        final MasterService svc;
        final SplittableRandom rnd;
        final List<byte[]> keys;
        final List<Integer> segments = new ArrayList<>();
        int nodes;

        /** Whether nodes may be lost (the clock is this test's). */
        final boolean manual;

        Leader(long seed, int mask) {
            this(seed, new ObjectIndex(mask));
        }

        Leader(long seed, ObjectIndex index) {
            this(seed, null, index);
        }

        /** Drives {@code svc} (a running server's) when not null, else a service of its own over {@code index}. */
        Leader(long seed, MasterService svc, ObjectIndex index) {
            rnd = new SplittableRandom(seed);
            this.index = index;
            this.manual = svc == null;
            this.svc = svc != null ? svc
                    : new MasterService(MasterConfig.defaults(), clock, new SplittableRandom(seed), NodeNotifier.NONE, index);
            keys = IndexModelTest.keys(rnd, 200);
            for (int i = 0; i < 3; i++) {
                register();
            }
        }

        final java.util.Map<Integer, Long> incarnations = new java.util.HashMap<>();

        long nodeIncarnation(int segmentId) {
            return incarnations.get(segmentId);
        }

        void register() {
            int i = ++nodes;
            RegisterReply r = svc.membership().registerNode(new RegisterNode("n" + i + ":1", "10.0.0." + i, 1,
                    1L << 30, svc.epoch(), i, 0, "", ControlToken.random(), ControlToken.NONE));
            svc.membership().inventory(new Inventory(r.segmentId(), i, true, List.of()));
            segments.add(r.segmentId());
            incarnations.put(r.segmentId(), (long) i);
        }

        /** One random operation. */
        void step() {
            int op = rnd.nextInt(100);
            List<byte[]> batch = new ArrayList<>();
            for (int i = 0, n = 1 + rnd.nextInt(12); i < n; i++) {
                batch.add(keys.get(rnd.nextInt(keys.size())));
            }
            if (op < 50) {
                boolean upsert = rnd.nextInt(3) == 0;
                int replicas = 1 + rnd.nextInt(3);
                int pin = rnd.nextInt(5) == 0 ? (rnd.nextBoolean() ? PutStart.PIN_FOREVER : 60) : 0;
                List<PutStartItem> items = new ArrayList<>();
                for (byte[] k : batch) {
                    items.add(new PutStartItem(k, rnd.nextInt(1, 1 << 14)));
                }
                PutStartReply reply = svc.putStart(new PutStart(upsert, replicas, "", pin, items));
                List<PutEndItem> ends = new ArrayList<>();
                for (int i = 0; i < items.size(); i++) {
                    PutStartResult r = reply.results().get(i);
                    if (r.code() == io.kvpool.protocol.ResultCode.OK && rnd.nextInt(8) != 0) {
                        long failed = rnd.nextInt(6) == 0 ? rnd.nextLong() & ((1L << r.replicas().size()) - 1) : 0;
                        ends.add(new PutEndItem(batch.get(i), r.generation(), failed));
                    }
                }
                svc.putEnd(ends);
            } else if (op < 70) {
                svc.remove(batch);
            } else if (op < 73) {
                byte[] k = batch.getFirst();
                svc.removeByPrefix(Arrays.copyOf(k, Math.min(k.length, 1 + rnd.nextInt(3))));
            } else if (op < 74) {
                svc.removeAll(rnd.nextBoolean());
            } else if (op < 76 && manual) {
                // a node falls silent and is dropped with every replica on it; a new one joins
                clock.advance(Duration.ofSeconds(1));
                int gone = segments.remove(rnd.nextInt(segments.size()));
                for (int s : segments) {
                    svc.membership().heartbeat(s, 0);
                }
                clock.advance(MasterConfig.defaults().nodeTtl().plus(Duration.ofSeconds(1)));
                for (int s : segments) {
                    svc.membership().heartbeat(s, 0);
                }
                svc.membership().dropSilent(clock.millis());
                assertThat(svc.segmentInfos()).noneMatch(i -> i.id() == gone);
                register();
            } else {
                svc.probes().exists(batch);
            }
        }
    }

    /** Every object of an index, by key: length, generation, copies wanted, pin, replicas. */
    static TreeMap<String, String> dump(ObjectIndex index) {
        TreeMap<String, String> out = new TreeMap<>();
        @SuppressWarnings("GuardedBy") // forEachShard runs it under the shard's lock
        Consumer<ObjectIndex.Shard> each = s -> {
            ObjectTable t = s.objects;
            for (int slot = 0; slot < t.size(); slot++) {
                StringBuilder sb = new StringBuilder();
                sb.append(t.valueLength(slot)).append(" gen ").append(t.generation(slot)).append(" wanted ")
                        .append(t.wanted(slot)).append(" pin ").append(t.pinnedUntil(slot)).append(" at");
                for (int i = 0; i < t.replicas(slot); i++) {
                    sb.append(' ').append(Integer.toHexString(t.segment(slot, i))).append(':').append(t.offset(slot, i));
                }
                assertThat(out.put(HexFormat.of().formatHex(t.key(slot)), sb.toString())).as("a key listed twice").isNull();
            }
        };
        index.forEachShard(each);
        return out;
    }

    static TreeMap<Integer, String> segmentsOf(MasterService svc) {
        TreeMap<Integer, String> out = new TreeMap<>();
        svc.segmentInfos().forEach(i -> out.put(i.id(), i.name()));
        return out;
    }

    static TreeMap<Integer, String> segmentsOf(StandbyCopy copy) {
        TreeMap<Integer, String> out = new TreeMap<>();
        copy.segments.forEach((id, s) -> out.put(id, s.name()));
        return out;
    }

    /** Applies every part of every shard's snapshot, and the segments', running {@code between} before each. */
    static void snapshot(FeedSource source, StandbyCopy copy, Runnable between) {
        for (int shard = -1; shard < ObjectIndex.SHARDS; shard++) {
            between.run();
            SnapshotPart first = source.snapshot(new Snapshot(shard, 0, 0));
            copy.apply(first.records(), first.count());
            for (int p = 1; p < first.parts(); p++) {
                between.run();
                SnapshotPart part = source.snapshot(new Snapshot(shard, p, first.parts()));
                copy.apply(part.records(), part.count());
            }
        }
    }

    /** Follows from {@code from} until the feed's end; returns the position reached. */
    static long drain(FeedSource source, StandbyCopy copy, long from, int maxBytes) throws Exception {
        long at = from;
        while (true) {
            FeedBatch b = source.follow(new Follow(at, maxBytes, 0, ""));
            assertThat(b.behind()).as("the follower fell behind at " + at).isFalse();
            copy.apply(b.records(), b.count());
            if (b.count() == 0) {
                return at;
            }
            assertThat(b.next()).isEqualTo(at + b.count());
            at = b.next();
        }
    }

    @ParameterizedTest(name = "seed {0}, hash mask {1}")
    @MethodSource("runs")
    void aStandbyThatSnapshotsWhileTheLeaderChangesEndsWithTheLeadersObjects(long seed, int mask) throws Exception {
        Leader leader = new Leader(seed, mask);
        for (int i = 0, n = leader.rnd.nextInt(400); i < n; i++) {
            leader.step();
        }
        StandbyCopy copy = new StandbyCopy(new ObjectIndex(mask));
        FeedSource source = leader.svc.feed;
        long at = source.follow(new Follow(-1, 1 << 20, 0, "")).next();
        snapshot(source, copy, () -> {
            for (int i = 0, n = leader.rnd.nextInt(6); i < n; i++) {
                leader.step();
            }
        });
        for (int round = 0; round < 20; round++) {
            for (int i = 0, n = leader.rnd.nextInt(40); i < n; i++) {
                leader.step();
            }
            // small batches now and then, so a batch ends in the middle of a change's records
            at = drain(source, copy, at, leader.rnd.nextBoolean() ? 1 : 1 << 20);
            String why = "seed " + seed + ", mask " + Integer.toHexString(mask) + ", round " + round;
            if (round == 0) {
                copy.settle(); // drained to the end, after the snapshot's last part: as the follower does
            }
            assertKeptAllocatorsMatch(copy, why);
            assertThat(dump(copy.index)).as(why).isEqualTo(dump(leader.index));
            assertThat(segmentsOf(copy)).as(why).isEqualTo(segmentsOf(leader.svc));
            assertThat(copy.epoch()).as(why).isEqualTo(leader.svc.epoch());
        }
        // a promoted standby hands out generations above every one the leader used
        assertThat(dump(leader.index).values()).allSatisfy(v ->
                assertThat(Long.parseLong(v.split(" ")[2])).isLessThanOrEqualTo(copy.generations()));
    }

    @Test
    void aFollowerBehindTheKeptRecordsIsToldSoAndAFreshSnapshotCatchesUp() throws Exception {
        ChangeFeed small = new ChangeFeed(4096);
        Leader leader = new Leader(42, new ObjectIndex(-1, small));
        FeedSource source = leader.svc.feed;
        long start = source.follow(new Follow(-1, 1 << 20, 0, "")).next();
        for (int i = 0; i < 300; i++) {
            leader.step();
        }
        assertThat(small.bytes()).isLessThanOrEqualTo(4096);
        assertThat(small.dropped()).isPositive();
        assertThat(source.follow(new Follow(start, 1 << 20, 0, "")).behind()).as("records were dropped").isTrue();
        StandbyCopy copy = new StandbyCopy(new ObjectIndex());
        long at = source.follow(new Follow(-1, 1 << 20, 0, "")).next();
        snapshot(source, copy, () -> { });
        drain(source, copy, at, 1 << 20);
        assertThat(dump(copy.index)).isEqualTo(dump(leader.index)).isNotEmpty();
    }

    @Test
    void positionsOfAnotherFeedAreBehindOrRefused() throws Exception {
        FeedSource source = new Leader(7, -1).svc.feed;
        assertThat(source.follow(new Follow(5, 1024, 0, "")).behind()).as("the feed is off: another master's position").isTrue();
        long end = source.follow(new Follow(-1, 1024, 0, "")).next();
        assertThatThrownBy(() -> source.follow(new Follow(end + 5, 1024, 0, "")))
                .isInstanceOf(io.kvpool.protocol.BadRequestException.class).hasMessageContaining("past the end");
        FeedBatch waited = source.follow(new Follow(end, 1024, 1, ""));
        assertThat(waited.count()).as("nothing changed: the wait ends empty").isZero();
        assertThat(waited.next()).isEqualTo(end);
    }

    @Test
    void aFollowerOverTheWireKeepsUpWithTheLeader() throws Exception {
        MasterConfig cfg = MasterConfig.defaults().withListen("127.0.0.1", 0, -1).withNodeTtl(Duration.ofHours(1))
                .withSummaryInterval(Duration.ZERO);
        try (MasterServer m = new MasterServer(cfg)) {
            Leader leader = new Leader(99, m.service(), null);
            for (int i = 0; i < 300; i++) {
                leader.step();
            }
            StandbyCopy copy = new StandbyCopy(new ObjectIndex());
            try (Follower f = new Follower("standby-1", copy, () -> new HostPort("127.0.0.1", m.port()), cfg.limits(),
                    io.kvpool.protocol.Secrets.NONE)) {
                for (int round = 0; round < 5; round++) {
                    for (int i = 0; i < 200; i++) {
                        leader.step();
                    }
                    StandbyCopy now = new StandbyCopy(new ObjectIndex());
                    snapshot(m.service().feed, now, () -> { });
                    TreeMap<String, String> want = dump(now.index);
                    long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
                    while (!(f.following() && dump(copy.index).equals(want))) {
                        assertThat(System.nanoTime()).as("the follower catches up, round " + round).isLessThan(deadline);
                        Thread.sleep(10);
                    }
                    assertThat(segmentsOf(copy)).isEqualTo(segmentsOf(m.service()));
                }
                f.close(); // what a promotion does first: the copy stands still
                assertKeptAllocatorsMatch(copy, "over the wire");
                assertThat(f.snapshots.get()).as("one snapshot, then the feed alone").isEqualTo(1);
                assertThat(f.records.get()).isPositive();
            }
        }
    }

    /**
     * Through the master's port: once a standby is in sync, a PUT_END acknowledged OK is already in its copy and a
     * REMOVE acknowledged is already gone from it, checked the moment each returns, with no wait; on a master that
     * did not wait for the standby these checks would fail whenever the standby was slower than the reply.
     */
    @Test
    void whatTheLeaderAcknowledgesIsInTheCopyOfAStandbyInSync() throws Exception {
        MasterConfig cfg = MasterConfig.defaults().withListen("127.0.0.1", 0, -1).withNodeTtl(Duration.ofHours(1))
                .withSummaryInterval(Duration.ZERO);
        try (MasterServer m = new MasterServer(cfg)) {
            new Leader(5, m.service(), null); // registers three nodes
            // a minute before a late standby is dropped: a loaded machine cannot drop it within this test
            m.service().feed.publishSyncTo(SyncSet.UNPUBLISHED, Duration.ofMinutes(1));
            StandbyCopy copy = new StandbyCopy(new ObjectIndex());
            HostPort at = new HostPort("127.0.0.1", m.port());
            try (Follower f = new Follower("standby-1", copy, () -> at, cfg.limits(), io.kvpool.protocol.Secrets.NONE);
                 io.kvpool.protocol.FrameConnection c = io.kvpool.protocol.FrameConnection.connect(at,
                         Duration.ofSeconds(10), cfg.limits())) {
                long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
                while (!m.service().feed.sync().published().contains("standby-1")) {
                    assertThat(System.nanoTime()).as("the standby joins the sync set").isLessThan(deadline);
                    Thread.sleep(5);
                }
                for (int i = 0; i < 200; i++) {
                    byte[] key = ("acked/" + i).getBytes(java.nio.charset.StandardCharsets.US_ASCII);
                    io.kvpool.protocol.BodyWriter w = new io.kvpool.protocol.BodyWriter();
                    new PutStart(false, 1, "", 0, List.of(new PutStartItem(key, 4096))).write(w);
                    PutStartReply started = PutStartReply.read(c.call(io.kvpool.protocol.Opcode.PUT_START, w,
                            Duration.ofSeconds(10)).body());
                    w = new io.kvpool.protocol.BodyWriter();
                    new io.kvpool.protocol.msg.MasterMessages.PutEnd(List.of(new PutEndItem(key,
                            started.results().getFirst().generation(), 0))).write(w);
                    assertThat(io.kvpool.protocol.msg.MasterMessages.Codes.read(c.call(io.kvpool.protocol.Opcode.PUT_END, w,
                            Duration.ofSeconds(10)).body()).codes()).containsExactly(io.kvpool.protocol.ResultCode.OK);
                    assertThat(dump(copy.index)).as("put %d acknowledged", i).containsKey(HexFormat.of().formatHex(key));
                    w = new io.kvpool.protocol.BodyWriter();
                    new io.kvpool.protocol.msg.KeyList(List.of(key)).write(w);
                    c.call(io.kvpool.protocol.Opcode.REMOVE, w, Duration.ofSeconds(10));
                    assertThat(dump(copy.index)).as("removal %d acknowledged", i).doesNotContainKey(HexFormat.of().formatHex(key));
                }
                assertThat(m.service().feed.sync().dropped()).as("the standby kept up").isZero();
            }
        }
    }

    /**
     * A promoted standby's master over its copy ({@link TakeOver}): it answers every lookup as the old leader did,
     * lists the same segments, places nothing until a node heartbeats in its term, then places new objects beside
     * the copied ones (never over one) with generations above every copied generation.
     */
    @ParameterizedTest(name = "seed {0}, hash mask {1}")
    @MethodSource("runs")
    void aPromotedCopyAnswersAsTheLeaderDidAndPlacesBesideWhatItHolds(long seed, int mask) throws Exception {
        promote(seed, mask, false);
    }

    /** The same with a copy that kept the allocators record by record: the promotion takes them as they are. */
    @ParameterizedTest(name = "seed {0}, hash mask {1}")
    @MethodSource("runs")
    void aPromotedCopyThatKeptItsAllocatorsPlacesBesideWhatItHolds(long seed, int mask) throws Exception {
        promote(seed, mask, true);
    }

    private static void promote(long seed, int mask, boolean settle) throws Exception {
        Leader leader = new Leader(seed, mask);
        for (int i = 0; i < 300; i++) {
            leader.step();
        }
        StandbyCopy copy = new StandbyCopy(new ObjectIndex(mask));
        FeedSource source = leader.svc.feed;
        long at = source.follow(new Follow(-1, 1 << 20, 0, "")).next();
        snapshot(source, copy, leader::step);
        at = drain(source, copy, at, 1 << 20);
        if (settle) {
            copy.settle();
            for (int i = 0; i < 100; i++) {
                leader.step();
            }
            drain(source, copy, at, 1 << 20);
            assertThat(copy.allocators()).as("kept through 100 more changes").isNotNull();
        }
        TreeMap<String, String> objects = dump(leader.index);
        // the standby's clock is where the leader's started: generations from the clock alone would repeat old ones
        MasterService promoted = MasterService.serving(MasterConfig.defaults(), new ManualClock(1_700_000_000_000L),
                new SplittableRandom(seed), NodeNotifier.NONE, copy);
        String why = "seed " + seed + ", mask " + Integer.toHexString(mask) + (settle ? ", allocators kept" : "");
        assertThat(promoted.getReplicaList(leader.keys)).as(why).isEqualTo(leader.svc.getReplicaList(leader.keys));
        assertThat(segmentsOf(promoted)).as(why).isEqualTo(segmentsOf(leader.svc));
        byte[] fresh = "after-the-promotion".getBytes(java.nio.charset.StandardCharsets.US_ASCII);
        PutStart one = new PutStart(false, 1, "", 0, List.of(new PutStartItem(fresh, 1 << 14)));
        assertThat(promoted.putStart(one).results().getFirst().code()).as("no node follows the new term yet: " + why)
                .isEqualTo(io.kvpool.protocol.ResultCode.NO_SEGMENT);
        for (io.kvpool.protocol.msg.MasterMessages.SegmentInfo seg : promoted.segmentInfos()) {
            assertThat(promoted.membership().heartbeat(seg.id(), leader.nodeIncarnation(seg.id()), null, null,
                    MasterConfig.defaults().term()).code()).isEqualTo(io.kvpool.protocol.ResultCode.OK);
        }
        long copied = 0;
        for (String v : objects.values()) {
            String[] f = v.split(" ");
            copied = Math.max(copied, Long.parseLong(f[2]));
        }
        for (int i = 0; i < 40; i++) {
            byte[] k = ("new/" + i).getBytes(java.nio.charset.StandardCharsets.US_ASCII);
            PutStartResult r = promoted.putStart(new PutStart(false, 1, "", 0, List.of(new PutStartItem(k, 1 << 14))))
                    .results().getFirst();
            assertThat(r.code()).as(why).isEqualTo(io.kvpool.protocol.ResultCode.OK);
            assertThat(r.generation()).as(why).isGreaterThan(copied);
            assertThat(promoted.putEnd(List.of(new PutEndItem(k, r.generation(), 0))))
                    .containsExactly(io.kvpool.protocol.ResultCode.OK);
        }
        // every region in memory, old and new, on its own: the allocators hold what the copy placed
        TreeMap<Integer, TreeMap<Long, Long>> regions = new TreeMap<>();
        @SuppressWarnings("GuardedBy") // forEachShard runs it under the shard's lock
        Consumer<ObjectIndex.Shard> each = sh -> {
            ObjectTable t = sh.objects;
            for (int slot = 0; slot < t.size(); slot++) {
                for (int i = 0; i < t.replicas(slot); i++) {
                    if (!StoredSegment.onDisk(t.segment(slot, i))) {
                        Long clash = regions.computeIfAbsent(t.segment(slot, i), x -> new TreeMap<>())
                                .put(t.offset(slot, i), t.regionLength(slot));
                        assertThat(clash).as("two objects at one offset, %s", why).isNull();
                    }
                }
            }
        };
        copy.index.forEachShard(each);
        regions.forEach((segId, byOffset) -> {
            long end = -1;
            for (var e : byOffset.entrySet()) {
                assertThat(e.getKey()).as("regions overlap on segment %d, %s", segId, why).isGreaterThanOrEqualTo(end);
                end = e.getKey() + e.getValue();
            }
        });
    }

    /**
     * The allocators the copy kept record by record hold exactly what one built from the copy's objects in one pass
     * holds: the same bytes, the same regions, the same free ranges.
     */
    static void assertKeptAllocatorsMatch(StandbyCopy copy, String why) {
        assertThat(copy.misfits()).as("regions that did not fit the kept allocators, " + why).isZero();
        java.util.Map<Integer, RangeAllocator> kept = copy.allocators();
        assertThat(kept).as("allocators kept, " + why).isNotNull();
        java.util.Map<Integer, RangeAllocator> built = new java.util.HashMap<>();
        copy.segments.values().forEach(r -> built.put(r.id(), new RangeAllocator(r.capacity())));
        assertThat(RegionsBuild.reserveAll(copy.index, built::get)).as(why).isZero();
        assertThat(kept.keySet()).as(why).isEqualTo(built.keySet());
        built.forEach((id, b) -> {
            RangeAllocator k = kept.get(id);
            assertThat(new long[]{k.used(), k.allocations(), k.freeRanges()}).as("segment %d: used, regions, free"
                    + " ranges, %s", id, why).containsExactly(b.used(), b.allocations(), b.freeRanges());
        });
    }
}
