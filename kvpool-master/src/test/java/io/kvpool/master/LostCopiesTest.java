package io.kvpool.master;

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
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * A node that comes back after the master dropped it brings back the objects whose only copy it held,
 * except those whose key was removed or stored again meanwhile ({@link LostCopies}; the soak's stale
 * reads of a key removed while its only copy sat on a killed node). The master alone, manual clock.
 */
class LostCopiesTest {

    private static final int VALUE = 1000;

    private ManualClock clock;
    private MasterService svc;

    @BeforeEach
    void setUp() {
        clock = new ManualClock(1_700_000_000_000L);
        svc = new MasterService(MasterConfig.defaults(), clock, new SplittableRandom(7), NodeNotifier.NONE);
    }

    private static byte[] k(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    /** A node that registers its segment {@code name}, on master connection {@code peer}. */
    private RegisterReply register(String name, long incarnation, ControlToken token, ControlToken previous,
                                   String peer) {
        return svc.membership().registerNode(new RegisterNode(name, "10.0.0.9", 7000, 1 << 20, svc.epoch(),
                incarnation, 0, "", token, previous), peer);
    }

    private List<ResultCode> list(RegisterReply r, long incarnation, List<InventoryItem> items) {
        return svc.membership().inventory(new Inventory(r.segmentId(), incarnation, true, items));
    }

    /** Puts {@code key} with one copy; the copy as its node would list it. */
    private InventoryItem put(String key) {
        PutStartResult r = svc.putStart(new PutStart(false, 1, "", 0, List.of(new PutStartItem(k(key), VALUE))))
                .results().getFirst();
        assertThat(r.code()).as("put " + key).isEqualTo(ResultCode.OK);
        assertThat(svc.putEnd(List.of(new PutEndItem(k(key), r.generation(), 0))).getFirst()).isEqualTo(ResultCode.OK);
        return new InventoryItem(r.replicas().getFirst().offset(), r.generation(), svc.epoch(), k(key), VALUE);
    }

    private ReplicaList where(String key) {
        return svc.getReplicaList(List.of(k(key))).getFirst();
    }

    /** Silence past the node TTL for every segment but {@code alive}'s; the timer drops them. */
    private void silenceAllBut(RegisterReply alive, long incarnation) {
        clock.advance(MasterConfig.defaults().nodeTtl().plusMillis(1));
        if (alive != null) {
            svc.membership().heartbeat(alive.segmentId(), incarnation, null, null);
        }
        svc.tick();
    }

    @Test
    void aDroppedNodeBringsBackOnlyTheLostObjectsWhoseKeyNobodyRemovedOrStoredSince() {
        RegisterReply a = register("a:1", 1, ControlToken.random(), ControlToken.NONE, "p:a1");
        list(a, 1, List.of());
        List<InventoryItem> onA = new ArrayList<>();
        for (String key : List.of("kept", "removed", "stored-then-removed", "p/by-prefix", "stored")) {
            onA.add(put(key));
        }
        silenceAllBut(null, 0);
        assertThat(svc.segmentInfos()).isEmpty();
        assertThat(svc.lostCopies()).isEqualTo(5);
        assertThat(svc.lostOn()).as("named for the next leader until the node lists its segment").containsExactly("a:1");
        assertThat(where("kept").code()).as("a miss while its node is away").isEqualTo(ResultCode.NOT_FOUND);

        // another node joins; meanwhile the keys are removed, stored again, or both
        RegisterReply b = register("b:1", 1, ControlToken.random(), ControlToken.NONE, "p:b1");
        list(b, 1, List.of());
        assertThat(svc.remove(List.of(k("removed")))).as("nothing to remove: the index lost it")
                .containsExactly(ResultCode.NOT_FOUND);
        put("stored-then-removed");
        assertThat(svc.remove(List.of(k("stored-then-removed")))).containsExactly(ResultCode.OK);
        assertThat(svc.removeByPrefix(k("p/"))).isZero();
        long storedAgain = put("stored").generation();
        assertThat(svc.lostCopies()).as("each removal and store revoked its key's lost copy").isEqualTo(1);

        // a's node comes back on its segment file and lists all five
        RegisterReply back = register("a:1", 2, ControlToken.random(), ControlToken.NONE, "p:a2");
        List<ResultCode> codes = list(back, 2, onA);
        assertThat(codes).as("only the untouched key is taken back; the node drops the others").containsExactly(
                ResultCode.OK, ResultCode.ALREADY_EXISTS, ResultCode.ALREADY_EXISTS, ResultCode.ALREADY_EXISTS,
                ResultCode.ALREADY_EXISTS);
        assertThat(where("kept").code()).isEqualTo(ResultCode.OK);
        assertThat(where("kept").generation()).isEqualTo(onA.get(0).generation());
        for (String gone : List.of("removed", "stored-then-removed", "p/by-prefix")) {
            assertThat(where(gone).code()).as(gone).isEqualTo(ResultCode.NOT_FOUND);
        }
        assertThat(where("stored").generation()).as("the version stored since stays").isEqualTo(storedAgain);
        assertThat(svc.lostOn()).isEmpty();
        assertThat(svc.lostCopies()).isZero();
    }

    @Test
    void aKeyLostTwiceComesBackOnlyFromItsLaterLoss() {
        RegisterReply a = register("a:1", 1, ControlToken.random(), ControlToken.NONE, "p:a1");
        list(a, 1, List.of());
        InventoryItem first = put("x");
        silenceAllBut(null, 0);
        RegisterReply b = register("b:1", 1, ControlToken.random(), ControlToken.NONE, "p:b1");
        list(b, 1, List.of());
        InventoryItem second = put("x");
        silenceAllBut(null, 0);
        assertThat(svc.lostOn()).containsExactlyInAnyOrder("a:1", "b:1");
        assertThat(svc.lostCopies()).isEqualTo(1);

        RegisterReply aBack = register("a:1", 2, ControlToken.random(), ControlToken.NONE, "p:a2");
        assertThat(list(aBack, 2, List.of(first))).as("superseded by the put that made the later copy")
                .containsExactly(ResultCode.ALREADY_EXISTS);
        RegisterReply bBack = register("b:1", 2, ControlToken.random(), ControlToken.NONE, "p:b2");
        assertThat(list(bBack, 2, List.of(second))).containsExactly(ResultCode.OK);
        assertThat(where("x").generation()).isEqualTo(second.generation());
    }

    @Test
    void aRemovalBetweenANodesRestartAndItsInventoryIsNotUndone() {
        ControlToken token = ControlToken.random();
        RegisterReply a = register("a:1", 1, token, ControlToken.NONE, "p:a1");
        list(a, 1, List.of());
        InventoryItem x = put("x");
        InventoryItem y = put("y");
        // the node's next run registers (its previous segment goes, and its objects with it) ...
        RegisterReply next = register("a:1", 2, ControlToken.random(), token, "p:a2");
        assertThat(where("x").code()).isEqualTo(ResultCode.NOT_FOUND);
        // ... a client removes x before the inventory arrives ...
        assertThat(svc.remove(List.of(k("x")))).containsExactly(ResultCode.NOT_FOUND);
        // ... and the inventory lists both
        assertThat(list(next, 2, List.of(x, y))).containsExactly(ResultCode.ALREADY_EXISTS, ResultCode.OK);
        assertThat(where("x").code()).isEqualTo(ResultCode.NOT_FOUND);
        assertThat(where("y").generation()).isEqualTo(y.generation());
        assertThat(svc.lostOn()).isEmpty();
        assertThat(svc.lostCopies()).isZero();
    }

    @Test
    void aForcedResetRevokesEveryLostCopy() {
        RegisterReply a = register("a:1", 1, ControlToken.random(), ControlToken.NONE, "p:a1");
        list(a, 1, List.of());
        put("x");
        put("y");
        silenceAllBut(null, 0);
        assertThat(svc.lostCopies()).isEqualTo(2);
        svc.removeAll(true);
        assertThat(svc.lostCopies()).isZero();
        svc.removeAll(false);
        assertThat(svc.lostCopies()).isZero();
    }

    @Test
    void aRemoveAllWithoutForceRevokesEveryLostCopy() {
        RegisterReply a = register("a:1", 1, ControlToken.random(), ControlToken.NONE, "p:a1");
        list(a, 1, List.of());
        InventoryItem x = put("x");
        silenceAllBut(null, 0);
        svc.removeAll(false);
        assertThat(svc.lostCopies()).isZero();
        RegisterReply back = register("a:1", 2, ControlToken.random(), ControlToken.NONE, "p:a2");
        assertThat(list(back, 2, List.of(x))).containsExactly(ResultCode.ALREADY_EXISTS);
        assertThat(where("x").code()).isEqualTo(ResultCode.NOT_FOUND);
    }
}
