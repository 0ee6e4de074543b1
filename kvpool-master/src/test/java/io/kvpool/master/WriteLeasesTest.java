package io.kvpool.master;

import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.MasterMessages.Inventory;
import io.kvpool.protocol.msg.MasterMessages.InventoryItem;
import io.kvpool.protocol.msg.MasterMessages.PutEndItem;
import io.kvpool.protocol.msg.MasterMessages.PutStart;
import io.kvpool.protocol.msg.MasterMessages.PutStartItem;
import io.kvpool.protocol.msg.MasterMessages.PutStartResult;
import io.kvpool.protocol.msg.MasterMessages.RegisterNode;
import io.kvpool.protocol.msg.MasterMessages.RegisterReply;
import io.kvpool.protocol.msg.MasterMessages.ReplicaList;
import io.kvpool.protocol.msg.WriteLeaseMessages.Commit;
import io.kvpool.protocol.msg.WriteLeaseMessages.CommitItem;
import io.kvpool.protocol.msg.WriteLeaseMessages.Grant;
import io.kvpool.protocol.msg.WriteLeaseMessages.Granted;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * Write leases on the master alone, with a manual clock: visibility only at COMMIT, the lease's
 * bounds, fencing by removeAll(force), and the space accounting (nothing leaked, nothing freed twice)
 * against a model.
 */
class WriteLeasesTest {

    private static final int VALUE = 1000;
    /** Region of a 6-byte key and a 1000-byte value. */
    private static final long REGION = ObjectLayout.regionLength(6, VALUE);

    private ManualClock clock;
    private MasterService svc;
    private int segment;
    private long incarnation;

    @BeforeEach
    void setUp() {
        clock = new ManualClock(1_700_000_000_000L);
        svc = new MasterService(MasterConfig.defaults(), clock, new SplittableRandom(3), NodeNotifier.NONE);
        segment = join("a:1", 8 << 20);
    }

    private int join(String name, long capacity) {
        long inc = ++incarnation;
        RegisterReply r = svc.membership().registerNode(new RegisterNode(name, "10.0.0." + inc, 50052, capacity,
                svc.epoch(), inc, 0, "", ControlToken.random()));
        svc.membership().inventory(new Inventory(r.segmentId(), inc, true, List.of()));
        return r.segmentId();
    }

    private static byte[] k(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    private Granted lease(long least, long wanted, int generations) {
        Granted g = svc.writeLease(new Grant("", least, wanted, generations));
        assertThat(g.code()).isEqualTo(ResultCode.OK);
        return g;
    }

    private ResultCode commit(Granted g, boolean upsert, String key, long offset, long generation) {
        return svc.commit(new Commit(g.leaseId(), upsert, List.of(new CommitItem(k(key), offset, VALUE, generation))))
                .getFirst();
    }

    private ReplicaList where(String key) {
        return svc.getReplicaList(List.of(k(key))).getFirst();
    }

    @Test
    void anObjectIsVisibleOnlyOnceCommittedWhereTheWriterPutIt() {
        Granted g = lease(REGION, 1 << 20, 4);
        assertThat(g.segmentId()).isEqualTo(segment);
        assertThat(g.length()).isEqualTo(1 << 20);
        assertThat(g.generationCount()).isEqualTo(4);
        // written but not committed: nobody sees it
        assertThat(where("key-01").code()).isEqualTo(ResultCode.NOT_FOUND);
        assertThat(svc.keyCount()).isZero();
        assertThat(commit(g, false, "key-01", g.offset(), g.firstGeneration())).isEqualTo(ResultCode.OK);
        ReplicaList rl = where("key-01");
        assertThat(rl.code()).isEqualTo(ResultCode.OK);
        assertThat(rl.generation()).isEqualTo(g.firstGeneration());
        assertThat(rl.replicas()).singleElement().satisfies(r -> {
            assertThat(r.segmentId()).isEqualTo(segment);
            assertThat(r.offset()).isEqualTo(g.offset());
        });
        assertThat(svc.segmentInfos().getFirst().objects()).isEqualTo(1);
        // the same COMMIT again (a retry after a lost reply) is answered OK and changes nothing
        assertThat(commit(g, false, "key-01", g.offset(), g.firstGeneration())).isEqualTo(ResultCode.OK);
        assertThat(svc.keyCount()).isEqualTo(1);
        assertThat(svc.segmentInfos().getFirst().objects()).isEqualTo(1);
    }

    @Test
    void itemsOutsideTheLeaseOrItsGenerationsAreRefusedAndChangeNothing() {
        Granted g = lease(REGION, 4 * REGION, 3);
        long gen = g.firstGeneration();
        assertThat(commit(g, false, "key-a1", g.offset() + 1, gen)).as("misaligned").isEqualTo(ResultCode.FAILED);
        assertThat(commit(g, false, "key-a2", g.offset() + g.length() - 64, gen)).as("past the end")
                .isEqualTo(ResultCode.FAILED);
        assertThat(commit(g, false, "key-a3", g.offset(), gen + 3)).as("generation outside the block")
                .isEqualTo(ResultCode.FAILED);
        assertThat(commit(g, false, "key-a4", g.offset(), gen - 1)).as("generation below the block")
                .isEqualTo(ResultCode.FAILED);
        assertThat(svc.keyCount()).isZero();
        assertThat(commit(g, false, "key-b1", g.offset() + REGION, gen + 1)).isEqualTo(ResultCode.OK);
        // below what was committed, or a generation not above the last one: refused
        assertThat(commit(g, false, "key-b2", g.offset(), gen + 2)).as("offset below the last commit")
                .isEqualTo(ResultCode.FAILED);
        assertThat(commit(g, false, "key-b3", g.offset() + 2 * REGION, gen + 1)).as("generation reused")
                .isEqualTo(ResultCode.FAILED);
        assertThat(commit(g, false, "key-b4", g.offset() + 2 * REGION, gen + 2)).isEqualTo(ResultCode.OK);
        assertThat(svc.keyCount()).isEqualTo(2);
        // the gap before key-b1 was freed at its commit; the rest of the range goes back at release
        svc.release(g.leaseId());
        assertThat(svc.allocated()).isEqualTo(2 * REGION);
        assertThat(commit(g, false, "key-b5", g.offset() + 3 * REGION, gen + 2)).isEqualTo(ResultCode.EXPIRED);
    }

    @Test
    void aForcedRemoveAllFencesEveryLeaseGrantedBeforeIt() {
        Granted g = lease(REGION, 1 << 20, 8);
        assertThat(commit(g, false, "key-01", g.offset(), g.firstGeneration())).isEqualTo(ResultCode.OK);
        svc.removeAll(true);
        assertThat(svc.epoch()).isEqualTo(g.epoch() + 1);
        // a write planned in the old epoch never becomes visible after the reset
        assertThat(commit(g, false, "key-02", g.offset() + REGION, g.firstGeneration() + 1))
                .isEqualTo(ResultCode.FENCED);
        assertThat(where("key-02").code()).isEqualTo(ResultCode.NOT_FOUND);
        assertThat(where("key-01").code()).isEqualTo(ResultCode.NOT_FOUND);
        // the lease is gone, and its space was reclaimed by the reset, not freed a second time
        assertThat(svc.writeLeases.size()).isZero();
        assertThat(svc.allocated()).isZero();
        svc.release(g.leaseId());
        svc.tick();
        assertThat(svc.allocated()).isZero();
        Granted fresh = lease(REGION, 1 << 20, 8);
        assertThat(fresh.epoch()).isEqualTo(svc.epoch());
        assertThat(commit(fresh, false, "key-02", fresh.offset(), fresh.firstGeneration())).isEqualTo(ResultCode.OK);
    }

    @Test
    void anIdleLeaseIsReclaimedAndTheWriterLosesOnlyWhatItDidNotCommit() {
        Granted g = lease(REGION, 1 << 20, 8);
        assertThat(commit(g, false, "key-01", g.offset(), g.firstGeneration())).isEqualTo(ResultCode.OK);
        assertThat(svc.allocated()).isEqualTo(1 << 20);
        // the writer dies: nothing commits or releases for longer than the put timeout
        for (int s = 0; s <= MasterConfig.DEFAULT_PUT_TIMEOUT.toSeconds() + 1; s++) {
            clock.advance(Duration.ofSeconds(1));
            svc.membership().heartbeat(segment, incarnation);
            svc.tick();
        }
        assertThat(svc.writeLeases.size()).isZero();
        assertThat(svc.allocated()).isEqualTo(REGION);
        assertThat(where("key-01").code()).isEqualTo(ResultCode.OK);
        assertThat(commit(g, false, "key-02", g.offset() + REGION, g.firstGeneration() + 1))
                .isEqualTo(ResultCode.EXPIRED);
        // the committed object is an ordinary one: removing it frees its region exactly once
        assertThat(svc.remove(List.of(k("key-01")))).containsExactly(ResultCode.OK);
        assertThat(svc.allocated()).isZero();
        assertThat(svc.segmentInfos().getFirst().objects()).isZero();
    }

    @Test
    void aTakenKeyIsRefusedUnlessUpsertedAndARefusedRegionGoesBackAtOnce() {
        Granted g = lease(REGION, 1 << 20, 8);
        long gen = g.firstGeneration();
        assertThat(commit(g, false, "key-01", g.offset(), gen)).isEqualTo(ResultCode.OK);
        assertThat(commit(g, false, "key-01", g.offset() + REGION, gen + 1)).isEqualTo(ResultCode.ALREADY_EXISTS);
        assertThat(where("key-01").generation()).isEqualTo(gen);
        assertThat(commit(g, true, "key-01", g.offset() + 2 * REGION, gen + 2)).isEqualTo(ResultCode.OK);
        ReplicaList rl = where("key-01");
        assertThat(rl.generation()).isEqualTo(gen + 2);
        assertThat(rl.replicas().getFirst().offset()).isEqualTo(g.offset() + 2 * REGION);
        svc.release(g.leaseId());
        // the first version was freed when the upsert replaced it, the refused one at its commit
        assertThat(svc.allocated()).isEqualTo(REGION);
        assertThat(svc.keyCount()).isEqualTo(1);
    }

    @Test
    void aLeaseOnASegmentThatLeftIsVoid() {
        Granted g = lease(REGION, 1 << 20, 8);
        // the node falls silent past its TTL and is dropped
        for (int s = 0; s <= MasterConfig.DEFAULT_NODE_TTL.toSeconds() + 1; s++) {
            clock.advance(Duration.ofSeconds(1));
            svc.tick();
        }
        assertThat(svc.segmentInfos()).isEmpty();
        assertThat(commit(g, false, "key-01", g.offset(), g.firstGeneration())).isEqualTo(ResultCode.EXPIRED);
        assertThat(svc.keyCount()).isZero();
    }

    /**
     * A node that restarted and adopted its segment file registers again: a writer on its machine that
     * has not heard of it may still copy into its lease's range through the file, before any node sees
     * the copy. That range must stay out of placement on the new segment until the lease's deadline
     * (before, it was free at once, and puts placed there had their bytes overwritten).
     */
    @Test
    void theUnusedRangeOfALeaseOutlivesItsNodesRestartWithTheSameFile() {
        RegisterReply first = svc.membership().registerNode(new RegisterNode("b:1", "10.0.1.1", 50052, 1 << 20,
                svc.epoch(), 100, 0, "/dev/shm/kvpool-b_1-7.seg", ControlToken.random()));
        svc.membership().inventory(new Inventory(first.segmentId(), 100, true, List.of()));
        Granted g = svc.writeLease(new Grant("b:1", REGION, 64 << 10, 8));
        assertThat(g.code()).isEqualTo(ResultCode.OK);
        assertThat(commit(g, false, "key-01", g.offset(), g.firstGeneration())).isEqualTo(ResultCode.OK);
        long from = g.offset() + REGION;
        long to = g.offset() + g.length();

        // the node restarts and comes back with its file (adopted, so renamed to its new pid) and its one object
        RegisterReply again = svc.membership().registerNode(new RegisterNode("b:1", "10.0.1.1", 50052, 1 << 20,
                svc.epoch(), 101, 1, "/dev/shm/kvpool-b_1-8.seg", ControlToken.random()));
        svc.membership().inventory(new Inventory(again.segmentId(), 101, true, List.of(new InventoryItem(g.offset(),
                g.firstGeneration(), svc.epoch(), k("key-01"), VALUE))));
        assertThat(commit(g, false, "key-02", from, g.firstGeneration() + 1)).isEqualTo(ResultCode.EXPIRED);
        assertThat(usedOn("b:1")).isEqualTo(REGION + (to - from));
        // fill the segment: no put lands in the old lease's unused range
        List<Long> offsets = fill("b:1");
        assertThat(offsets).isNotEmpty().allSatisfy(o -> assertThat(o + REGION <= from || o >= to)
                .as("a put at %d inside the held range [%d, %d)", o, from, to).isTrue());

        // past the lease's deadline (and the fill's puts' timeout) the range is free again
        for (long s = 0; s <= MasterConfig.DEFAULT_PUT_TIMEOUT.toSeconds(); s++) {
            clock.advance(Duration.ofSeconds(1));
            svc.membership().heartbeat(again.segmentId(), 101); // the node is alive
            svc.tick();
        }
        assertThat(fill("b:1")).isNotEmpty().anySatisfy(o -> assertThat(o >= from && o < to).isTrue());
    }

    /**
     * Ranges held for a node that came back are no leases any writer can use: they must not count
     * against the room live leases may take (before, a restarted node's held ranges left every new
     * lease at its first object's bytes until they expired).
     */
    @Test
    void rangesHeldForANodeThatCameBackDoNotShrinkNewLeases() {
        RegisterReply first = svc.membership().registerNode(new RegisterNode("b:1", "10.0.1.1", 50052, 8 << 20,
                svc.epoch(), 100, 0, "/dev/shm/kvpool-b_1-7.seg", ControlToken.random()));
        svc.membership().inventory(new Inventory(first.segmentId(), 100, true, List.of()));
        // leases until live leases hold the most the pool allows unwritten (an eighth of 16 MiB)
        long held = 0;
        while (held < (16L << 20) / WriteLeases.UNUSED_FRACTION) {
            Granted g = svc.writeLease(new Grant("b:1", REGION, 1 << 20, 8));
            assertThat(g.code()).isEqualTo(ResultCode.OK);
            assertThat(g.length()).as("room beyond the first object while under the bound").isGreaterThan(REGION);
            held += g.length();
        }
        RegisterReply again = svc.membership().registerNode(new RegisterNode("b:1", "10.0.1.1", 50052, 8 << 20,
                svc.epoch(), 101, 0, "/dev/shm/kvpool-b_1-8.seg", ControlToken.random()));
        svc.membership().inventory(new Inventory(again.segmentId(), 101, true, List.of()));
        assertThat(usedOn("b:1")).isEqualTo(held);
        Granted fresh = svc.writeLease(new Grant("b:1", REGION, 1 << 20, 8));
        assertThat(fresh.code()).isEqualTo(ResultCode.OK);
        assertThat(fresh.length()).as("a new lease's room").isGreaterThan(REGION);
    }

    @Test
    void aNodeThatRegistersAgainHoldsWhatItsOldLeasesAndPendingPutsPlacedUntilTheirDeadlines() {
        RegisterReply first = svc.membership().registerNode(new RegisterNode("b:1", "10.0.1.1", 50052, 1 << 20,
                svc.epoch(), 100, 0, "", ControlToken.random()));
        svc.membership().inventory(new Inventory(first.segmentId(), 100, true, List.of()));
        Granted g = svc.writeLease(new Grant("b:1", REGION, 64 << 10, 8));
        assertThat(g.code()).isEqualTo(ResultCode.OK);
        PutStartResult pending = svc.putStart(new PutStart(false, 1, "b:1", 0, List.of(new PutStartItem(k("slow"), VALUE))))
                .results().getFirst();
        assertThat(pending.replicas().getFirst().segmentId()).isEqualTo(first.segmentId());
        // no segment file either time: a writer that still holds the old placements sends them over TCP once
        // the node serves again, so their space must not be handed to anyone else before their deadlines
        RegisterReply again = svc.membership().registerNode(new RegisterNode("b:1", "10.0.1.1", 50052, 1 << 20,
                svc.epoch(), 101, 0, "", ControlToken.random()));
        svc.membership().inventory(new Inventory(again.segmentId(), 101, true, List.of()));
        assertThat(usedOn("b:1")).as("the lease's range and the pending put's region, held").isEqualTo(g.length() + REGION);
        for (int i = 0; i < 40; i++) {
            PutStartResult r = svc.putStart(new PutStart(false, 1, "b:1", 0,
                    List.of(new PutStartItem(k("new-" + i), VALUE)))).results().getFirst();
            long off = r.replicas().getFirst().offset();
            assertThat(svc.putEnd(List.of(new PutEndItem(k("new-" + i), r.generation(), 0))).getFirst())
                    .isEqualTo(ResultCode.OK);
            assertThat(off + REGION <= g.offset() || off >= g.offset() + g.length())
                    .as("a new put at " + off + " lies outside the old lease [" + g.offset() + ", +" + g.length() + ")")
                    .isTrue();
            assertThat(off + REGION <= pending.replicas().getFirst().offset()
                    || off >= pending.replicas().getFirst().offset() + REGION)
                    .as("a new put lies outside the pending put's region").isTrue();
        }
        assertThat(svc.commit(new Commit(g.leaseId(), false, List.of(new CommitItem(k("late"), g.offset(), VALUE,
                g.firstGeneration())))).getFirst()).as("a COMMIT against the replaced registration").isEqualTo(ResultCode.EXPIRED);
        long newObjects = 40 * REGION;
        for (int i = 0; i <= MasterConfig.defaults().putTimeout().toSeconds(); i++) {
            clock.advance(Duration.ofSeconds(1));
            svc.membership().heartbeat(again.segmentId(), 101);
            svc.tick();
        }
        assertThat(usedOn("b:1")).as("held until the deadlines, then given back").isEqualTo(newObjects);
    }

    @Test
    void aNodeDroppedForSilenceAndBackLaterHoldsWhatItsOldLeasesPlaced() {
        RegisterReply first = svc.membership().registerNode(new RegisterNode("b:1", "10.0.1.1", 50052, 1 << 20,
                svc.epoch(), 100, 0, "/dev/shm/kvpool-b_1-7.seg", ControlToken.random()));
        svc.membership().inventory(new Inventory(first.segmentId(), 100, true, List.of()));
        Granted g = svc.writeLease(new Grant("b:1", REGION, 64 << 10, 8));
        assertThat(g.code()).isEqualTo(ResultCode.OK);
        // the node is killed and its restart outlasts the TTL: the master drops it for silence first
        clock.advance(MasterConfig.defaults().nodeTtl().plusSeconds(1));
        svc.tick();
        assertThat(svc.segmentInfos().stream().noneMatch(i -> i.name().equals("b:1"))).isTrue();
        RegisterReply again = svc.membership().registerNode(new RegisterNode("b:1", "10.0.1.1", 50052, 1 << 20,
                svc.epoch(), 101, 0, "/dev/shm/kvpool-b_1-8.seg", ControlToken.random()));
        svc.membership().inventory(new Inventory(again.segmentId(), 101, true, List.of()));
        // a same-machine writer with the old lease copies into the file at its range: nothing else may be there
        assertThat(usedOn("b:1")).as("the old lease's unused range, held").isEqualTo(g.length());
        for (int i = 0; i < 20; i++) {
            PutStartResult r = svc.putStart(new PutStart(false, 1, "b:1", 0,
                    List.of(new PutStartItem(k("n" + i), VALUE)))).results().getFirst();
            long off = r.replicas().getFirst().offset();
            assertThat(off + REGION <= g.offset() || off >= g.offset() + g.length())
                    .as("a new put at " + off + " lies outside the old lease [" + g.offset() + ", +" + g.length() + ")")
                    .isTrue();
        }
    }

    private long usedOn(String name) {
        return svc.segmentInfos().stream().filter(i -> i.name().equals(name)).findFirst().orElseThrow().used();
    }

    /** Offsets of single-copy puts on segment {@code name} of a 1000-byte value each, until it is full. */
    private List<Long> fill(String name) {
        List<Long> offsets = new ArrayList<>();
        for (int i = 0; ; i++) {
            PutStartResult r = svc.putStart(new PutStart(false, 1, name, 0,
                    List.of(new PutStartItem(k("fill-" + offsets.size() + "-" + i + "-" + clock.millis()), VALUE))))
                    .results().getFirst();
            if (r.code() != ResultCode.OK || r.replicas().getFirst().segmentId() != segmentIdOf(name)) {
                return offsets;
            }
            offsets.add(r.replicas().getFirst().offset());
        }
    }

    private int segmentIdOf(String name) {
        return svc.segmentInfos().stream().filter(i -> i.name().equals(name)).findFirst().orElseThrow().id();
    }

    @Test
    void leasesWithoutAPreferenceGoToTheSegmentWithTheMostRoomInTurn() {
        int second = join("b:1", 8 << 20);
        int third = join("c:1", 8 << 20);
        java.util.Set<Integer> used = new java.util.HashSet<>();
        for (int i = 0; i < 3; i++) {
            used.add(lease(REGION, 1 << 20, 4).segmentId());
        }
        assertThat(used).containsExactlyInAnyOrder(segment, second, third);
        // a named segment is honoured
        assertThat(svc.writeLease(new Grant("b:1", REGION, 1 << 20, 4)).segmentId()).isEqualTo(second);
    }

    @Test
    void aLeaseNeverTakesMoreThanAnEighthOfASegmentUnlessOneBatchNeedsIt() {
        Granted small = lease(REGION, 1L << 40, 8);
        assertThat(small.length()).isEqualTo((8 << 20) / WriteLeases.SEGMENT_FRACTION);
        Granted big = lease(3 << 20, 1L << 40, 8);
        assertThat(big.length()).isEqualTo(3 << 20);
        assertThat(svc.writeLease(new Grant("", 16 << 20, 16 << 20, 1)).code()).isEqualTo(ResultCode.POOL_FULL);
    }

    @Test
    void leasesTogetherHoldAtMostAnEighthOfThePoolUnwritten() {
        Granted first = lease(REGION, 1L << 40, 8);
        assertThat(first.length()).isEqualTo((8 << 20) / WriteLeases.UNUSED_FRACTION);
        // the eighth is held empty by the first: the next writer gets room for its batch only
        Granted second = lease(REGION, 1L << 40, 8);
        assertThat(second.length()).isEqualTo(REGION);
        svc.release(first.leaseId());
        Granted third = lease(REGION, 1L << 40, 8);
        assertThat(third.length()).isEqualTo((8 << 20) / WriteLeases.UNUSED_FRACTION - REGION);
    }

    /** Commits objects through leases until they take {@code fraction} of the 8 MiB pool; returns how many. */
    private int fill(double fraction) {
        return fill(fraction, Duration.ZERO);
    }

    /** {@link #fill(double)}, the clock moving {@code perLease} after each lease (its objects' access tick). */
    private int fill(double fraction, Duration perLease) {
        long target = (long) (fraction * (8 << 20));
        int n = svc.keyCount() == 0 ? 0 : (int) svc.keyCount();
        for (int round = 0; svc.allocated() + REGION <= target; round++) {
            assertThat(round).as("filling made no progress").isLessThan(100_000);
            Granted g = lease(REGION, 64 * REGION, 64);
            List<CommitItem> items = new ArrayList<>();
            long room = Math.min(g.length(), target - svc.allocated()) / REGION;
            for (int i = 0; i < Math.max(1, room); i++) {
                items.add(new CommitItem(k(String.format("f%05d", n++)), g.offset() + i * REGION, VALUE,
                        g.firstGeneration() + i));
            }
            svc.commit(new Commit(g.leaseId(), false, items));
            svc.release(g.leaseId());
            clock.advance(perLease);
        }
        return (int) svc.keyCount();
    }

    /**
     * Bytes a lease holds unwritten are no object: the watermark does not evict objects for them, and a
     * lease on a full pool evicts for its batch, not for the room it would like. Before, a writer's empty
     * lease pushed a pool over the watermark and the tick evicted cached objects for nothing.
     */
    @Test
    void emptyLeaseSpaceNeverEvictsObjects() {
        int objects = fill(0.86);
        Granted held = lease(REGION, 1L << 40, 8);
        assertThat(held.length()).isGreaterThan(REGION);
        assertThat(svc.allocated()).as("over the watermark, counting the lease").isGreaterThan((long) (0.9 * (8 << 20)));
        svc.tick();
        assertThat(svc.eviction().evictedKeyCount()).as("objects evicted for an empty lease").isZero();
        assertThat(svc.keyCount()).isEqualTo(objects);
        svc.release(held.leaseId());

        fill(0.99);
        long evictedBefore = svc.eviction().evictedBytes.get();
        long freeBefore = (8 << 20) - svc.allocated();
        Granted onFull = lease(REGION, 1L << 40, 8);
        assertThat(onFull.length()).as("a full pool: room for the batch, or what was free anyway")
                .isLessThanOrEqualTo(Math.max(REGION, freeBefore));
        long evicted = svc.eviction().evictedBytes.get() - evictedBefore;
        assertThat(evicted).as("evicted for one region")
                .isLessThanOrEqualTo(Math.max(REGION, (long) ((8 << 20) * MasterConfig.DEFAULT_EVICTION_RATIO)) + REGION);
    }

    /**
     * A pool at its watermark has free space only in ranges shorter than the room a lease would like.
     * A lease there takes the longest halving of that room a free range holds, not its batch alone:
     * before, every lease on a full pool was one batch long, so each put paid a WRITE_LEASE and a
     * RELEASE besides its COMMIT.
     */
    @Test
    void aLeaseOnAFullPoolTakesTheRoomOfAFreeRangeShorterThanItWanted() {
        int objects = fill(0.99);
        List<byte[]> run = new ArrayList<>();
        for (int i = 100; i < 300; i++) {
            run.add(k(String.format("f%05d", i)));
        }
        svc.remove(run);
        long hole = 200 * REGION;
        long wanted = (8 << 20) / WriteLeases.SEGMENT_FRACTION;
        assertThat(hole).as("the hole is shorter than the room a lease wants").isLessThan(wanted);
        Granted g = lease(REGION, 1L << 40, 8);
        assertThat(g.length()).as("a free range's worth, not one batch").isGreaterThan(hole / 2);
        assertThat(svc.keyCount()).as("nothing evicted for it").isEqualTo(objects - 200);
    }

    /**
     * Objects written together lie side by side, and an eviction round takes the oldest of them: the
     * room it frees must be one run, long enough for the next write leases, not holes scattered over
     * the last access tick it touched. Before, the round took that tick's objects in index (hash) order
     * until it had freed enough, which left dozens of short holes per round; a pool at its watermark
     * then had only short free ranges and every write lease was a batch long.
     */
    @Test
    void anEvictionRoundFreesOneRunOfWhatWasWrittenTogether() {
        int objects = fill(0.95, Duration.ofMillis(20));
        long rangesBefore = svc.freeRanges();
        svc.tick();
        long evicted = objects - svc.keyCount();
        assertThat(evicted).as("the watermark evicted").isPositive();
        assertThat(svc.freeRanges() - rangesBefore).as("free ranges the round added").isLessThanOrEqualTo(1);
        assertThat(svc.longestFree()).as("the longest free range").isGreaterThanOrEqualTo(evicted * REGION);
        assertThat(svc.allocated()).as("the round at most doubled its target")
                .isGreaterThanOrEqualTo((long) ((8 << 20) * (MasterConfig.DEFAULT_HIGH_WATERMARK
                        - 3 * MasterConfig.DEFAULT_EVICTION_RATIO)));
    }

    /**
     * Random grants, commits (good and bad items), releases, removals and expiries. After every step
     * the allocator's use equals the model's: the regions of live objects plus the unused part of live
     * leases. A leak or a double free (which the allocator refuses loudly) fails it.
     */
    @Test
    void spaceAccountingMatchesAModelThroughRandomOperations() {
        SplittableRandom rnd = new SplittableRandom(11);
        record Held(Granted g, long[] next, long[] gen) {
        }
        List<Held> held = new ArrayList<>();
        Map<String, Long> objects = new HashMap<>();
        for (int step = 0; step < 3000; step++) {
            int op = rnd.nextInt(10);
            if ((op < 2 || held.isEmpty()) && held.size() < 20) {
                Granted g = svc.writeLease(new Grant("", REGION, rnd.nextLong(REGION, 64 * REGION), 1 + rnd.nextInt(20)));
                if (g.code() == ResultCode.OK) {
                    held.add(new Held(g, new long[]{g.offset()}, new long[]{g.firstGeneration()}));
                }
            } else if (op < 7 && !held.isEmpty()) {
                Held h = held.get(rnd.nextInt(held.size()));
                List<CommitItem> items = new ArrayList<>();
                int n = 1 + rnd.nextInt(4);
                for (int i = 0; i < n; i++) {
                    long skip = rnd.nextInt(4) == 0 ? REGION : 0; // a write that failed leaves a gap
                    boolean bad = rnd.nextInt(10) == 0;
                    long off = bad ? h.next[0] - 64 : h.next[0] + skip;
                    String key = "k" + rnd.nextInt(2000);
                    items.add(new CommitItem(k(key), off, VALUE, h.gen[0]));
                    if (!bad) {
                        h.next[0] = off + ObjectLayout.regionLength(key.length(), VALUE);
                        h.gen[0]++;
                    }
                }
                List<ResultCode> codes = svc.commit(new Commit(h.g.leaseId(), false, items));
                for (int i = 0; i < n; i++) {
                    if (codes.get(i) == ResultCode.OK) {
                        objects.put(new String(items.get(i).key(), StandardCharsets.UTF_8),
                                ObjectLayout.regionLength(items.get(i).key().length, VALUE));
                    }
                }
                if (codes.contains(ResultCode.EXPIRED)) {
                    held.remove(h);
                }
            } else if (op < 8 && !held.isEmpty()) {
                Held h = held.remove(rnd.nextInt(held.size()));
                svc.release(h.g.leaseId());
            } else if (op < 9 && !objects.isEmpty()) {
                String key = objects.keySet().iterator().next();
                svc.remove(List.of(k(key)));
                objects.remove(key);
            } else {
                clock.advance(Duration.ofSeconds(rnd.nextInt(4)));
                svc.membership().heartbeat(segment, incarnation);
                svc.tick();
                held.removeIf(h -> !svc.writeLeases.live(h.g.leaseId()));
            }
            long model = objects.values().stream().mapToLong(Long::longValue).sum() + svc.writeLeases.unusedBytes();
            assertThat(svc.allocated()).as("step %d", step).isEqualTo(model);
            assertThat(svc.keyCount()).as("step %d", step).isEqualTo(objects.size());
        }
    }
}
