package io.kvpool.master;

import io.kvpool.protocol.BadRequestException;
import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.MasterMessages.Inventory;
import io.kvpool.protocol.msg.MasterMessages.InventoryItem;
import io.kvpool.protocol.msg.MasterMessages.NodeDrain;
import io.kvpool.protocol.msg.MasterMessages.PutEndItem;
import io.kvpool.protocol.msg.MasterMessages.PutStart;
import io.kvpool.protocol.msg.MasterMessages.PutStartItem;
import io.kvpool.protocol.msg.MasterMessages.PutStartResult;
import io.kvpool.protocol.msg.MasterMessages.RegisterNode;
import io.kvpool.protocol.msg.MasterMessages.RegisterReply;
import io.kvpool.protocol.msg.MasterMessages.SegmentInfo;
import io.kvpool.protocol.msg.WriteLeaseMessages.Grant;
import io.kvpool.protocol.msg.WriteLeaseMessages.Granted;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.SplittableRandom;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * Who may replace a registered segment (issue 32, "a node is who it was"), and a node draining for a
 * restart ("a planned stop drains"), on the master alone with a manual clock.
 */
class RegistrationTest {

    private static final int VALUE = 1000;
    private static final long REGION = ObjectLayout.regionLength(5, VALUE);

    private ManualClock clock;
    private MasterService svc;

    @BeforeEach
    void setUp() {
        clock = new ManualClock(1_700_000_000_000L);
        svc = new MasterService(MasterConfig.defaults(), clock, new SplittableRandom(5), NodeNotifier.NONE);
    }

    /** A node's registration on master connection {@code peer}, with its inventory in. */
    private RegisterReply join(String name, long incarnation, ControlToken token, ControlToken previous, String peer,
                               List<InventoryItem> items) {
        RegisterReply r = svc.membership().registerNode(new RegisterNode(name, "10.0.0.9", 7000, 1 << 20, svc.epoch(),
                incarnation, items.size(), "", token, previous), peer);
        svc.membership().inventory(new Inventory(r.segmentId(), incarnation, true, items));
        return r;
    }

    private static byte[] k(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    /** Puts {@code key} with one copy, wherever the master places it; the replica's segment id. */
    private int put(String key) {
        PutStartResult r = svc.putStart(new PutStart(false, 1, "", 0, List.of(new PutStartItem(k(key), VALUE))))
                .results().getFirst();
        assertThat(r.code()).as("put " + key).isEqualTo(ResultCode.OK);
        assertThat(svc.putEnd(List.of(new PutEndItem(k(key), r.generation(), 0))).getFirst()).isEqualTo(ResultCode.OK);
        return r.replicas().getFirst().segmentId();
    }

    private SegmentInfo info(int id) {
        return svc.segmentInfos().stream().filter(i -> i.id() == id).findFirst().orElseThrow();
    }

    @Test
    void aSecondRegistrationOfALiveNodesSegmentIsRefusedAndChangesNothing() {
        ControlToken token = ControlToken.random();
        RegisterReply live = join("n:1", 1, token, ControlToken.NONE, "10.0.0.9:41000", List.of());
        put("kept1");
        put("kept2");
        long used = info(live.segmentId()).used();
        // a forged registration (or a second node given the same address): fresh token, no proof, another connection
        assertThatThrownBy(() -> svc.membership().registerNode(new RegisterNode("n:1", "10.0.0.66", 7000, 1 << 20,
                svc.epoch(), 2, 0, "", ControlToken.random(), ControlToken.NONE), "10.0.0.66:50000"))
                .isInstanceOf(BadRequestException.class)
                .hasMessageContaining("register_node of segment n:1")
                .hasMessageContaining("--advertise-host");
        assertThat(svc.segmentInfos()).hasSize(1);
        assertThat(info(live.segmentId()).state()).isEqualTo(SegmentInfo.STATE_ACTIVE);
        assertThat(info(live.segmentId()).used()).isEqualTo(used);
        assertThat(svc.getReplicaList(List.of(k("kept1"), k("kept2"))))
                .allSatisfy(rl -> assertThat(rl.code()).isEqualTo(ResultCode.OK));
        // the next put is not placed over the objects held
        PutStartResult next = svc.putStart(new PutStart(false, 1, "", 0, List.of(new PutStartItem(k("next1"), VALUE))))
                .results().getFirst();
        assertThat(next.replicas().getFirst().offset()).isGreaterThanOrEqualTo(2 * REGION);
        assertThat(svc.membership().refusedRegistrations.get()).isEqualTo(1);
    }

    @Test
    void theSameNodesNextRunReplacesItsSegmentByProvingItsPreviousRegistration() {
        ControlToken token = ControlToken.random();
        RegisterReply live = join("n:1", 1, token, ControlToken.NONE, "10.0.0.9:41000", List.of());
        // its connection is still open as far as the master knows (a kill whose close has not arrived)
        RegisterReply next = join("n:1", 2, ControlToken.random(), token, "10.0.0.9:41001", List.of());
        assertThat(next.segmentId()).isNotEqualTo(live.segmentId());
        assertThat(svc.segmentInfos()).extracting(SegmentInfo::id).containsExactly(next.segmentId());
    }

    @Test
    void aRegistrationOnTheConnectionTheOldOneSpokeOnReplacesIt() {
        RegisterReply live = join("n:1", 1, ControlToken.random(), ControlToken.NONE, "10.0.0.9:41000", List.of());
        RegisterReply again = join("n:1", 1, ControlToken.random(), ControlToken.NONE, "10.0.0.9:41000", List.of());
        assertThat(svc.segmentInfos()).extracting(SegmentInfo::id).containsExactly(again.segmentId());
        assertThat(again.segmentId()).isNotEqualTo(live.segmentId());
    }

    @Test
    void aRegistrationWhoseConnectionClosedOrThatWentSilentMayBeReplacedWithoutProof() {
        join("n:1", 1, ControlToken.random(), ControlToken.NONE, "10.0.0.9:41000", List.of());
        svc.membership().linkClosed("10.0.0.9:41000");
        RegisterReply second = join("n:1", 2, ControlToken.random(), ControlToken.NONE, "10.0.0.9:41001", List.of());
        assertThat(svc.segmentInfos()).extracting(SegmentInfo::id).containsExactly(second.segmentId());

        // a heartbeat on a new connection makes that one the registration's: closing the old one changes nothing
        svc.membership().heartbeat(second.segmentId(), 2, null, "10.0.0.9:41002");
        svc.membership().linkClosed("10.0.0.9:41001");
        assertThatThrownBy(() -> join("n:1", 3, ControlToken.random(), ControlToken.NONE, "10.0.0.9:41003", List.of()))
                .isInstanceOf(BadRequestException.class);

        clock.advance(MasterConfig.defaults().nodeTtl().plusMillis(1));
        RegisterReply third = join("n:1", 3, ControlToken.random(), ControlToken.NONE, "10.0.0.9:41003", List.of());
        assertThat(svc.segmentInfos()).extracting(SegmentInfo::id).containsExactly(third.segmentId());
    }

    @Test
    void nothingIsPlacedOnADrainingSegmentAndItsObjectsStayListed() {
        RegisterReply a = join("a:1", 1, ControlToken.random(), ControlToken.NONE, "p:1", List.of());
        RegisterReply b = join("b:1", 2, ControlToken.random(), ControlToken.NONE, "p:2", List.of());
        for (int i = 0; i < 20; i++) {
            put("before" + i);
        }
        assertThat(svc.membership().drain(new NodeDrain(a.segmentId(), 1))).isEqualTo(ResultCode.OK);
        assertThat(info(a.segmentId()).state()).isEqualTo(SegmentInfo.STATE_DRAINING);
        for (int i = 0; i < 20; i++) {
            assertThat(put("after" + i)).as("placed on the segment that is not draining").isEqualTo(b.segmentId());
        }
        Granted g = svc.writeLease(new Grant("a:1", REGION, 64 << 10, 8));
        assertThat(g.code()).isEqualTo(ResultCode.OK);
        assertThat(g.segmentId()).as("a lease asked for on the draining segment goes elsewhere").isEqualTo(b.segmentId());
        for (int i = 0; i < 20; i++) {
            assertThat(svc.getReplicaList(List.of(k("before" + i))).getFirst().code()).isEqualTo(ResultCode.OK);
        }
        assertThat(svc.membership().drain(new NodeDrain(a.segmentId(), 99))).as("another incarnation")
                .isEqualTo(ResultCode.NOT_FOUND);
    }

    @Test
    void aPoolWhoseOnlyNodeDrainsRefusesPutsWithoutEvictingAnything() {
        RegisterReply a = join("a:1", 1, ControlToken.random(), ControlToken.NONE, "p:1", List.of());
        int stored = 0;
        while (svc.putStart(new PutStart(false, 1, "", 0, List.of(new PutStartItem(k("f" + stored), VALUE))))
                .results().getFirst().code() == ResultCode.OK) {
            stored++;
        }
        long keys = svc.keyCount();
        svc.membership().drain(new NodeDrain(a.segmentId(), 1));
        PutStartResult r = svc.putStart(new PutStart(false, 1, "", 0, List.of(new PutStartItem(k("late"), VALUE))))
                .results().getFirst();
        assertThat(r.code()).isEqualTo(ResultCode.NO_SEGMENT);
        assertThat(svc.writeLease(new Grant("", REGION, REGION, 1)).code()).isEqualTo(ResultCode.NO_SEGMENT);
        assertThat(svc.keyCount()).as("nothing evicted for room nobody could use").isEqualTo(keys);
    }

    @Test
    void theDrainingNodesNextRegistrationReplacesItAndTakesPutsAgain() {
        ControlToken token = ControlToken.random();
        RegisterReply a = join("a:1", 1, token, ControlToken.NONE, "p:1", List.of());
        svc.membership().drain(new NodeDrain(a.segmentId(), 1));
        svc.membership().linkClosed("p:1"); // the node stopped
        clock.advance(Duration.ofSeconds(1));
        RegisterReply back = join("a:1", 2, ControlToken.random(), token, "p:9", List.of());
        assertThat(info(back.segmentId()).state()).isEqualTo(SegmentInfo.STATE_ACTIVE);
        assertThat(put("again")).isEqualTo(back.segmentId());
    }

    @Test
    void anObjectCaughtMidPromotionWhenItsNodeRestartedKeepsOneCopy() {
        ControlToken token = ControlToken.random();
        byte[] x = k("x/1");
        long g1 = 5_000;
        // the node's SSD tier holds x (listed as a disk copy)
        RegisterReply a = join("a:1", 1, token, ControlToken.NONE, "p:1",
                List.of(new InventoryItem(0, g1, svc.epoch(), x, VALUE, io.kvpool.protocol.Tier.DISK)));
        assertThat(svc.getReplicaList(List.of(x)).getFirst().generation()).isEqualTo(g1);
        // the node promotes it: a conditional upsert placed in its memory; it writes the copy, then is killed
        PutStartResult promo = svc.putStart(new PutStart(true, 1, "a:1", 0, List.of(new PutStartItem(x, VALUE, g1))))
                .results().getFirst();
        assertThat(promo.code()).isEqualTo(ResultCode.OK);
        long g2 = promo.generation();
        long offset = promo.replicas().getFirst().offset();
        // its next run lists both: the disk copy (g1) and the memory copy it wrote (g2)
        svc.membership().linkClosed("p:1");
        RegisterReply back = svc.membership().registerNode(new RegisterNode("a:1", "10.0.0.9", 7000, 1 << 20,
                svc.epoch(), 2, 2, "", ControlToken.random(), token), "p:2");
        List<ResultCode> codes = svc.membership().inventory(new Inventory(back.segmentId(), 2, true, List.of(
                new InventoryItem(0, g1, svc.epoch(), x, VALUE, io.kvpool.protocol.Tier.DISK),
                new InventoryItem(offset, g2, svc.epoch(), x, VALUE))));
        assertThat(codes).as("the disk copy first, then the newer memory copy wins (and frees the older)")
                .containsExactly(ResultCode.OK, ResultCode.OK);
        var where = svc.getReplicaList(List.of(x)).getFirst();
        assertThat(where.code()).isEqualTo(ResultCode.OK);
        assertThat(where.generation()).isEqualTo(g2);
        assertThat(where.replicas()).hasSize(1);
        assertThat(where.replicas().getFirst().tier()).isEqualTo(io.kvpool.protocol.Tier.MEMORY);
        // the promotion's PUT_END, sent late, finds its object stored
        assertThat(svc.putEnd(List.of(new PutEndItem(x, g2, 0))).getFirst()).isEqualTo(ResultCode.OK);
        assertThat(a.segmentId()).isNotEqualTo(back.segmentId());
    }
}
