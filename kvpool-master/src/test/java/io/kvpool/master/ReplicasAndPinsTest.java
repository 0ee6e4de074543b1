package io.kvpool.master;

import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.MasterMessages.Inventory;
import io.kvpool.protocol.msg.MasterMessages.PutEndItem;
import io.kvpool.protocol.msg.MasterMessages.PutStart;
import io.kvpool.protocol.msg.MasterMessages.PutStartItem;
import io.kvpool.protocol.msg.MasterMessages.PutStartResult;
import io.kvpool.protocol.msg.MasterMessages.RegisterNode;
import io.kvpool.protocol.msg.MasterMessages.RegisterReply;
import io.kvpool.protocol.msg.MasterMessages.ReplicaList;
import io.kvpool.protocol.msg.NodeMessages.ReplicateItem;
import io.kvpool.protocol.msg.Replica;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.SplittableRandom;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.function.Function;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * Copies and pins at the master, driven by a manual clock: the copies wanted are remembered and a
 * background repair restores them after a node is lost; eviction and removeAll(force) account for
 * every copy; pinned objects leave memory only after unpinned ones, within their cap.
 */
class ReplicasAndPinsTest {

    private static final int VALUE = 1000;
    private static final long REGION = ObjectLayout.regionLength(6, VALUE);

    private ManualClock clock;
    private FakeNodes nodes;
    private MasterService svc;
    private long incarnations;
    private final List<long[]> joined = new ArrayList<>();

    /** Nodes as the master sees them: copies succeed (or do what a test says), resets are recorded. */
    private static final class FakeNodes implements NodeNotifier {
        final List<ReplicateItem> copied = new CopyOnWriteArrayList<>();
        final List<int[]> pairs = new CopyOnWriteArrayList<>();
        final List<Integer> resetSegments = new CopyOnWriteArrayList<>();
        /** What a NODE_REPLICATE answers; by default every copy lands. */
        volatile Function<List<ReplicateItem>, ResultCode> answer = items -> ResultCode.OK;

        @Override
        public List<ResultCode> replicate(Segment source, Segment target, long epoch, List<ReplicateItem> items) {
            ResultCode code = answer.apply(items);
            if (code == ResultCode.OK) {
                copied.addAll(items);
                pairs.add(new int[]{source.id, target.id});
            }
            return Collections.nCopies(items.size(), code);
        }

        @Override
        public void free(Segment segment, long offset, long generation, Tier tier, boolean spill) {
        }

        @Override
        public void flush() {
        }

        @Override
        public void reset(Collection<Segment> segments, long epoch) {
            for (Segment s : segments) {
                resetSegments.add(s.id);
            }
        }

        @Override
        public void forget(Segment segment) {
        }

        @Override
        public void close() {
        }
    }

    @BeforeEach
    void setUp() {
        clock = new ManualClock(1_700_000_000_000L);
        nodes = new FakeNodes();
        svc = service(MasterConfig.defaults());
    }

    private MasterService service(MasterConfig config) {
        return new MasterService(config, clock, new SplittableRandom(11), nodes);
    }

    private static byte[] k(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    /** Registers an empty segment of its own host and activates it; returns its id. */
    private int join(String name, long capacity) {
        long inc = ++incarnations;
        RegisterReply r = svc.membership().registerNode(new RegisterNode(name, "10.0.1." + inc, 50052, capacity,
                svc.epoch(), inc, 0, "", ControlToken.random()));
        svc.membership().inventory(new Inventory(r.segmentId(), inc, true, List.of()));
        joined.add(new long[]{r.segmentId(), inc});
        return r.segmentId();
    }

    /** Lets time pass second by second; the nodes heartbeat except those in {@code silent}. */
    private void passTime(Duration d, Set<Integer> silent) {
        for (long t = 0; t < d.toSeconds(); t++) {
            clock.advance(Duration.ofSeconds(1));
            for (long[] seg : joined) {
                if (!silent.contains((int) seg[0])) {
                    svc.membership().heartbeat((int) seg[0], seg[1]);
                }
            }
            svc.tick();
        }
    }

    private PutStartResult start(String key, int replicas, int pinSeconds) {
        return svc.putStart(new PutStart(false, replicas, "", pinSeconds, List.of(new PutStartItem(k(key), VALUE))))
                .results().getFirst();
    }

    /** A put written to every copy placed; returns the PUT_START result. */
    private PutStartResult put(String key, int replicas, int pinSeconds) {
        PutStartResult r = start(key, replicas, pinSeconds);
        if (r.code() == ResultCode.OK) {
            assertThat(svc.putEnd(List.of(new PutEndItem(k(key), r.generation(), 0))).getFirst()).isEqualTo(ResultCode.OK);
        }
        return r;
    }

    private ReplicaList where(String key) {
        return svc.getReplicaList(List.of(k(key))).getFirst();
    }

    private static Set<Integer> segmentsOf(ReplicaList rl) {
        Set<Integer> s = new HashSet<>();
        for (Replica r : rl.replicas()) {
            s.add(r.segmentId());
        }
        return s;
    }

    // ================================================================== copies wanted and repair

    @Test
    void aPutPlacedOnFewerSegmentsThanAskedIsRepairedOnceThereIsRoom() {
        int a = join("a:1", 1 << 20);
        PutStartResult r = put("key-01", 2, 0);
        assertThat(r.replicas()).hasSize(1);
        assertThat(svc.repair().runOnce()).isZero();
        assertThat(svc.repair().underReplicated.get()).isOne();
        assertThat(svc.repair().noRoom.get()).isOne();

        int b = join("b:1", 1 << 20); // a segment joining marks the repair dirty
        long before = svc.allocated();
        assertThat(svc.repair().runOnce()).isOne();
        ReplicaList rl = where("key-01");
        assertThat(segmentsOf(rl)).containsExactlyInAnyOrder(a, b);
        assertThat(svc.allocated()).isEqualTo(before + REGION);
        assertThat(nodes.pairs).singleElement().satisfies(p -> assertThat(p).containsExactly(a, b));
        assertThat(nodes.copied.getFirst().generation()).isEqualTo(r.generation());
        assertThat(nodes.copied.getFirst().offset()).isEqualTo(r.replicas().getFirst().offset());
        // the next round finds nothing to do and says so
        svc.repair().markDirty();
        assertThat(svc.repair().runOnce()).isZero();
        assertThat(svc.repair().underReplicated.get()).isZero();
    }

    @Test
    void aRepairHeldOffRunsNothingUntilItsTimeThenRepairs() {
        join("a:1", 1 << 20);
        put("key-01", 2, 0); // one copy of two: below its copies
        svc.repair().holdOff(5_000); // as a master that just took over from a standby's copy
        join("b:1", 1 << 20); // marks the repair dirty
        assertThat(svc.repair().runOnce()).as("held off: no scan").isZero();
        assertThat(svc.repair().underReplicated.get()).as("not even counted").isZero();
        clock.advance(Duration.ofMillis(4_999));
        assertThat(svc.repair().runOnce()).isZero();
        clock.advance(Duration.ofMillis(1));
        assertThat(svc.repair().runOnce()).as("its time came: the copy is made").isOne();
        assertThat(where("key-01").replicas()).hasSize(2);
    }

    @Test
    void aLostNodeLosesNoObjectWithTwoCopiesAndRepairBringsEachBackToTwo() {
        int a = join("a:1", 1 << 20);
        int b = join("b:1", 1 << 20);
        int c = join("c:1", 1 << 20);
        for (int i = 0; i < 60; i++) {
            assertThat(put(String.format("key-%02d", i), 2, 0).replicas()).hasSize(2);
        }
        passTime(Duration.ofSeconds(MasterConfig.DEFAULT_NODE_TTL.toSeconds() + 2), Set.of(c));
        assertThat(svc.segmentInfos()).extracting(i -> i.id()).containsExactlyInAnyOrder(a, b);
        int single = 0;
        for (int i = 0; i < 60; i++) {
            ReplicaList rl = where(String.format("key-%02d", i));
            assertThat(rl.code()).isEqualTo(ResultCode.OK); // zero lost
            single += rl.replicas().size() == 1 ? 1 : 0;
        }
        assertThat(single).isPositive(); // c held copies, or the test proves nothing

        assertThat(svc.repair().runOnce()).isEqualTo(single);
        for (int i = 0; i < 60; i++) {
            ReplicaList rl = where(String.format("key-%02d", i));
            assertThat(rl.replicas()).hasSize(2);
            assertThat(segmentsOf(rl)).containsExactlyInAnyOrder(a, b);
        }
        assertThat(svc.allocated()).isEqualTo(60 * 2 * REGION);
        svc.repair().markDirty();
        svc.repair().runOnce();
        assertThat(svc.repair().underReplicated.get()).isZero();
    }

    @Test
    void aCopyThatDoesNotLandGivesItsRegionBackAndIsTriedAgain() {
        join("a:1", 1 << 20);
        put("key-01", 2, 0);
        join("b:1", 1 << 20);
        nodes.answer = items -> ResultCode.FAILED;
        long before = svc.allocated();
        assertThat(svc.repair().runOnce()).isZero();
        assertThat(svc.allocated()).isEqualTo(before);
        assertThat(svc.repair().copiesFailed.get()).isOne();
        assertThat(where("key-01").replicas()).hasSize(1);

        nodes.answer = items -> ResultCode.OK; // the round after a failure runs at once (still dirty)
        assertThat(svc.repair().runOnce()).isOne();
        assertThat(where("key-01").replicas()).hasSize(2);
    }

    @Test
    void aCopyOfAnObjectRemovedWhileItWasMadeIsDropped() {
        join("a:1", 1 << 20);
        put("key-01", 2, 0);
        join("b:1", 1 << 20);
        nodes.answer = items -> {
            svc.remove(List.of(k("key-01")));
            return ResultCode.OK;
        };
        assertThat(svc.repair().runOnce()).isZero();
        assertThat(where("key-01").code()).isEqualTo(ResultCode.NOT_FOUND);
        assertThat(svc.allocated()).isZero(); // the object's region and the copy's both came back
    }

    @Test
    void aResetWhileCopiesAreMadeLeavesNothingBehind() {
        join("a:1", 1 << 20);
        for (int i = 0; i < 5; i++) {
            put("key-0" + i, 2, 0);
        }
        join("b:1", 1 << 20);
        nodes.answer = items -> {
            svc.removeAll(true);
            return ResultCode.OK;
        };
        assertThat(svc.repair().runOnce()).isZero();
        assertThat(svc.keyCount()).isZero();
        assertThat(svc.allocated()).isZero();
    }

    // ================================================================== every copy accounted for

    @Test
    void evictionFreesEveryCopyAndRemoveAllForceResetsEveryNodeHoldingOne() {
        int a = join("a:1", 64 * REGION);
        int b = join("b:1", 64 * REGION);
        int c = join("c:1", 64 * REGION);
        for (int i = 0; i < 20; i++) {
            put(String.format("key-%02d", i), 2, 0);
        }
        assertThat(svc.allocated()).isEqualTo(20 * 2 * REGION);
        long freed = svc.eviction().evict(2 * REGION);
        assertThat(freed % (2 * REGION)).isZero(); // whole objects: both copies at once
        assertThat(svc.allocated()).isEqualTo(20 * 2 * REGION - freed);
        assertThat(svc.keyCount()).isEqualTo(20 - freed / (2 * REGION));

        PutStartResult inFlight = start("key-late", 2, 0);
        assertThat(svc.removeAll(true)).isPositive();
        assertThat(nodes.resetSegments).containsExactlyInAnyOrder(a, b, c);
        assertThat(svc.allocated()).isZero();
        assertThat(svc.putEnd(List.of(new PutEndItem(k("key-late"), inFlight.generation(), 0))).getFirst())
                .isEqualTo(ResultCode.FENCED);
    }

    // ================================================================== pins

    @Test
    void pinnedObjectsLeaveMemoryOnlyAfterUnpinnedOnes() {
        join("a:1", 40 * REGION);
        assertThat(put("key-p0", 1, PutStart.PIN_FOREVER).pinned()).isTrue();
        assertThat(put("key-p1", 1, 3600).pinned()).isTrue();
        for (int i = 0; i < 20; i++) {
            clock.advance(Duration.ofMillis(50)); // read later than the pinned ones: LRU would take those first
            assertThat(put(String.format("key-%02d", i), 1, 0).pinned()).isFalse();
        }
        svc.eviction().evict(10 * REGION);
        assertThat(where("key-p0").code()).isEqualTo(ResultCode.OK);
        assertThat(where("key-p1").code()).isEqualTo(ResultCode.OK);
        assertThat(svc.keyCount()).isEqualTo(2 + 20 - 10);

        // with nothing unpinned left to take, pinned objects go too
        svc.eviction().evict(40 * REGION);
        assertThat(svc.keyCount()).isZero();
        assertThat(svc.eviction().pinnedEvictions.get()).isOne();
        assertThat(svc.pinnedBytes()).isZero();
    }

    @Test
    void aPinThatRanOutIsAnOrdinaryObject() {
        join("a:1", 40 * REGION);
        put("key-p0", 1, 10);
        clock.advance(Duration.ofMillis(50));
        put("key-01", 1, 0);
        passTime(Duration.ofSeconds(11), Set.of());
        assertThat(svc.pinnedBytes()).isZero();
        svc.eviction().evict(REGION);
        assertThat(where("key-p0").code()).isEqualTo(ResultCode.NOT_FOUND); // least recently read, no longer pinned
        assertThat(where("key-01").code()).isEqualTo(ResultCode.OK);
    }

    @Test
    void pinsStopAtTheirCapAndTheObjectIsStoredUnpinned() {
        svc = service(MasterConfig.defaults().withMaxPinned(0.1));
        join("a:1", 100 * REGION);
        int granted = 0;
        for (int i = 0; i < 20; i++) {
            PutStartResult r = put(String.format("key-%02d", i), 1, PutStart.PIN_FOREVER);
            assertThat(r.code()).isEqualTo(ResultCode.OK);
            granted += r.pinned() ? 1 : 0;
        }
        assertThat(granted).isEqualTo(10);
        assertThat(svc.pinnedBytes()).isEqualTo(10 * REGION).isLessThanOrEqualTo((long) (0.1 * svc.capacity()));
        assertThat(svc.pinsRefused.get()).isEqualTo(10);
        // removing or replacing a pinned object gives its share back
        svc.remove(List.of(k("key-00")));
        assertThat(svc.pinnedBytes()).isEqualTo(9 * REGION);
    }

    @Test
    void pinsCountEveryCopyAgainstTheCap() {
        svc = service(MasterConfig.defaults().withMaxPinned(0.1));
        join("a:1", 50 * REGION);
        join("b:1", 50 * REGION);
        int granted = 0;
        for (int i = 0; i < 20; i++) {
            granted += put(String.format("key-%02d", i), 2, PutStart.PIN_FOREVER).pinned() ? 1 : 0;
        }
        assertThat(granted).isEqualTo(5);
        assertThat(svc.pinnedBytes()).isEqualTo(5 * 2 * REGION);
    }
}
