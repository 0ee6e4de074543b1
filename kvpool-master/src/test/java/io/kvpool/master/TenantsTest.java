package io.kvpool.master;

import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.msg.ControlToken;
import io.kvpool.protocol.msg.MasterMessages.Inventory;
import io.kvpool.protocol.msg.MasterMessages.PutEndItem;
import io.kvpool.protocol.msg.MasterMessages.PutStart;
import io.kvpool.protocol.msg.MasterMessages.PutStartItem;
import io.kvpool.protocol.msg.MasterMessages.PutStartResult;
import io.kvpool.protocol.msg.MasterMessages.RegisterNode;
import io.kvpool.protocol.msg.MasterMessages.RegisterReply;
import org.junit.jupiter.api.Test;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** Tenants on the master's state machine alone: what each namespace holds, its quota, and whose objects go. */
class TenantsTest {

    private static final int VALUE = 1000;
    /** Every key here is 8 bytes ("a/000001"), so every object takes one region of this size. */
    private static final long REGION = ObjectLayout.regionLength(8, VALUE);

    private final ManualClock clock = new ManualClock(1_700_000_000_000L);

    private MasterService service(List<Tenant> tenants) {
        return new MasterService(MasterConfig.defaults().withTenants(tenants), clock, new SplittableRandom(7),
                NodeNotifier.NONE);
    }

    private static void join(MasterService s, long capacity) {
        RegisterReply r = s.membership().registerNode(new RegisterNode("n:1", "10.0.0.1", 50052, capacity, s.epoch(),
                1, 0, "", ControlToken.random()));
        s.membership().inventory(new Inventory(r.segmentId(), 1, true, List.of()));
    }

    private static byte[] k(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    private static String key(String ns, int i) {
        return "%s/%06d".formatted(ns, i);
    }

    private ResultCode put(MasterService s, String key) {
        clock.advance(Duration.ofMillis(20)); // a later access tick than the put before: LRU order is put order
        PutStartResult r = s.putStart(new PutStart(false, 1, "", List.of(new PutStartItem(k(key), VALUE))))
                .results().getFirst();
        return r.code() == ResultCode.OK ? s.putEnd(List.of(new PutEndItem(k(key), r.generation(), 0))).getFirst()
                : r.code();
    }

    private static boolean exists(MasterService s, String key) {
        return s.probes().exists(List.of(k(key)))[0];
    }

    private static Tenant tenant(String name, String prefix, long memory, Tenant.OverQuota over) {
        return new Tenant(name, List.of(prefix), memory, -1, over);
    }

    @Test
    void eachNamespaceCountsItsOwnRegionsThroughPutsRemovalsAndResets() {
        MasterService s = service(List.of(tenant("a", "a/", -1, Tenant.OverQuota.REFUSE),
                tenant("b", "b/", -1, Tenant.OverQuota.REFUSE)));
        join(s, 1 << 20);
        for (int i = 0; i < 5; i++) {
            assertThat(put(s, key("a", i))).isEqualTo(ResultCode.OK);
        }
        for (int i = 0; i < 3; i++) {
            assertThat(put(s, key("b", i))).isEqualTo(ResultCode.OK);
        }
        assertThat(put(s, key("c", 0))).as("a key of no tenant").isEqualTo(ResultCode.OK);
        Tenants t = s.tenants();
        assertThat(t.memoryUsed(1)).isEqualTo(5 * REGION);
        assertThat(t.memoryUsed(2)).isEqualTo(3 * REGION);
        assertThat(t.memoryUsed(0)).isEqualTo(REGION);
        s.remove(List.of(k(key("a", 0)), k(key("a", 1))));
        assertThat(t.memoryUsed(1)).isEqualTo(3 * REGION);
        s.removeByPrefix(k("b/"));
        assertThat(t.memoryUsed(2)).isZero();
        // a new configuration counts again: "a/00000" now names a tenant of its own
        s.configureTenants(List.of(tenant("a", "a/", -1, Tenant.OverQuota.REFUSE),
                tenant("a4", "a/000004", -1, Tenant.OverQuota.REFUSE)));
        assertThat(t.memoryUsed(1)).isEqualTo(2 * REGION);
        assertThat(t.memoryUsed(2)).isEqualTo(REGION);
        s.removeAll(true);
        assertThat(t.memoryUsed(1) + t.memoryUsed(2) + t.memoryUsed(0)).isZero();
    }

    @Test
    void aTenantSetToRefuseIsRefusedAtItsQuotaAndNobodyElseNotices() {
        MasterService s = service(List.of(tenant("a", "a/", 3 * REGION, Tenant.OverQuota.REFUSE)));
        join(s, 1 << 20);
        for (int i = 0; i < 3; i++) {
            assertThat(put(s, key("a", i))).isEqualTo(ResultCode.OK);
        }
        assertThat(put(s, key("a", 3))).isEqualTo(ResultCode.QUOTA_EXCEEDED);
        assertThat(exists(s, key("a", 3))).isFalse();
        assertThat(s.tenants().refusedPuts(1)).isOne();
        for (int i = 0; i < 20; i++) {
            assertThat(put(s, key("b", i))).as("a key of no tenant").isEqualTo(ResultCode.OK);
        }
        for (int i = 0; i < 3; i++) {
            assertThat(exists(s, key("a", i))).isTrue();
        }
    }

    @Test
    void aTenantSetToEvictLosesItsOwnOldestObjectsAndNeverAnothers() {
        MasterService s = service(List.of(tenant("a", "a/", 4 * REGION, Tenant.OverQuota.EVICT_OWN),
                tenant("b", "b/", -1, Tenant.OverQuota.REFUSE)));
        join(s, 1 << 20);
        for (int i = 0; i < 10; i++) {
            assertThat(put(s, key("b", i))).isEqualTo(ResultCode.OK);
        }
        for (int i = 0; i < 12; i++) {
            assertThat(put(s, key("a", i))).isEqualTo(ResultCode.OK);
            assertThat(s.tenants().memoryUsed(1)).isLessThanOrEqualTo(4 * REGION);
        }
        assertThat(exists(s, key("a", 11))).as("the newest stays").isTrue();
        assertThat(exists(s, key("a", 0))).as("the oldest went").isFalse();
        for (int i = 0; i < 10; i++) {
            assertThat(exists(s, key("b", i))).as(key("b", i)).isTrue();
        }
        assertThat(s.tenants().ownEvictions(1)).isPositive();
        // an object larger than the whole quota is refused even so
        PutStartResult big = s.putStart(new PutStart(false, 1, "", List.of(new PutStartItem(k("a/big"), 5 * REGION))))
                .results().getFirst();
        assertThat(big.code()).isEqualTo(ResultCode.QUOTA_EXCEEDED);
    }

    /** A full pool evicts from tenants over their quota first: here the quota shrank under a tenant's objects. */
    @Test
    void evictionForRoomTakesFromTenantsOverTheirQuotaFirst() {
        long capacity = 64 * REGION;
        MasterService s = service(List.of(tenant("a", "a/", -1, Tenant.OverQuota.REFUSE),
                tenant("b", "b/", -1, Tenant.OverQuota.REFUSE)));
        join(s, capacity);
        for (int i = 0; i < 20; i++) { // b's first: the least recently read of all
            assertThat(put(s, key("b", i))).isEqualTo(ResultCode.OK);
        }
        int a = 0;
        while (s.tenants().memoryUsed(1) + s.tenants().memoryUsed(2) + REGION <= capacity) {
            assertThat(put(s, key("a", a++))).isEqualTo(ResultCode.OK);
        }
        s.configureTenants(List.of(tenant("a", "a/", 10 * REGION, Tenant.OverQuota.EVICT_OWN),
                tenant("b", "b/", -1, Tenant.OverQuota.REFUSE)));
        for (int i = 20; i < 30; i++) {
            assertThat(put(s, key("b", i))).isEqualTo(ResultCode.OK);
        }
        for (int i = 0; i < 30; i++) {
            assertThat(exists(s, key("b", i))).as("b is within its quota: " + key("b", i)).isTrue();
        }
        assertThat(s.tenants().memoryUsed(1)).isLessThan((long) a * REGION);
    }

    /**
     * A tenant's SSD quota: eviction spills its objects only while they fit it, counting the spills of the same round
     * (not on the tier yet), and drops the rest; another tenant's objects spill as before.
     */
    @Test
    void spillsStopAtATenantsSsdQuota() {
        MasterServiceTest.RecordingNotifier notifier = new MasterServiceTest.RecordingNotifier();
        MasterService s = new MasterService(MasterConfig.defaults().withTenants(List.of(
                new Tenant("a", List.of("a/"), -1, 3 * REGION, Tenant.OverQuota.REFUSE))), clock, new SplittableRandom(7),
                notifier);
        RegisterReply r = s.membership().registerNode(new RegisterNode("n:1", "10.0.0.1", 50052, 16 * REGION, s.epoch(),
                1, 0, "", ControlToken.random()));
        s.membership().inventory(new Inventory(r.segmentId(), 1, true, List.of()));
        s.membership().heartbeat(r.segmentId(), 1, new io.kvpool.protocol.msg.MasterMessages.TierStats(0, 0, 0, 1L << 30,
                0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
        Map<Long, String> byGeneration = new HashMap<>();
        for (int i = 0; i < 40; i++) { // 40 regions through 16: a's oldest evicted, some spilled
            String key = key(i % 2 == 0 ? "a" : "b", i);
            PutStartResult p = s.putStart(new PutStart(false, 1, "", List.of(new PutStartItem(k(key), VALUE))))
                    .results().getFirst();
            assertThat(p.code()).as(key).isEqualTo(ResultCode.OK);
            assertThat(s.putEnd(List.of(new PutEndItem(k(key), p.generation(), 0))).getFirst()).isEqualTo(ResultCode.OK);
            byGeneration.put(p.generation(), key);
        }
        List<Long> spilled = notifier.freed.stream().filter(MasterServiceTest.Freed::spill)
                .map(MasterServiceTest.Freed::generation).toList();
        long aSpills = spilled.stream().filter(g -> byGeneration.get(g).startsWith("a/")).count();
        long bSpills = spilled.stream().filter(g -> byGeneration.get(g).startsWith("b/")).count();
        assertThat(aSpills).as("a's spills, none on the tier yet: its quota holds 3").isEqualTo(3);
        assertThat(bSpills).as("b has no quota: every evicted object of b spilled").isGreaterThan(3);
    }

    /** Random puts, removals, resets and reconfigurations: every namespace's count is what its live objects hold. */
    @Test
    void theCountsMatchAReferenceModel() {
        SplittableRandom rnd = new SplittableRandom(42);
        MasterService s = service(List.of());
        join(s, 1 << 30);
        Map<String, Boolean> live = new HashMap<>();
        List<List<Tenant>> configs = List.of(List.of(), List.of(tenant("x", "x/", -1, Tenant.OverQuota.REFUSE)),
                List.of(tenant("x", "x/00", -1, Tenant.OverQuota.REFUSE), tenant("y", "y/", -1, Tenant.OverQuota.REFUSE)));
        List<Tenant> now = List.of();
        for (int step = 0; step < 3000; step++) {
            int op = rnd.nextInt(100);
            String key = (rnd.nextBoolean() ? "x" : rnd.nextBoolean() ? "y" : "z") + "/%06d".formatted(rnd.nextInt(400));
            if (op < 60) {
                if (put(s, key) == ResultCode.OK) {
                    live.put(key, true);
                }
            } else if (op < 90) {
                s.remove(List.of(k(key)));
                live.remove(key);
            } else if (op < 99) {
                now = configs.get(rnd.nextInt(configs.size()));
                s.configureTenants(now);
            } else {
                s.removeAll(rnd.nextBoolean());
                live.clear();
            }
            Tenants t = s.tenants();
            for (int ns = 0; ns < t.namespaces(); ns++) {
                long want = 0;
                for (String k : live.keySet()) {
                    want += t.namespace(k(k)) == ns ? REGION : 0;
                }
                if (!t.active()) {
                    continue; // without tenants nothing is counted
                }
                assertThat(t.memoryUsed(ns)).as("step %d, namespace %d", step, ns).isEqualTo(want);
            }
        }
    }

    @Test
    void badTenantsAreRefusedNamingWhatIsWrong() {
        assertThatThrownBy(() -> Tenant.parse("a")).hasMessageContaining("NAME=PREFIX");
        assertThatThrownBy(() -> Tenant.parse("a=x/:lots")).hasMessageContaining("bad size 'lots'");
        assertThatThrownBy(() -> Tenant.parse("a=x/:1GiB:none:drop")).hasMessageContaining("refuse or evict");
        assertThatThrownBy(() -> Tenant.parse("a b=x/:1GiB")).hasMessageContaining("tenant name");
        assertThatThrownBy(() -> Tenant.checked(List.of(Tenant.parse("a=x/:1GiB"), Tenant.parse("b=x/:1GiB"))))
                .hasMessageContaining("'x/' is given to two tenants");
        Tenant t = Tenant.parse("team-a=kvp1/llama/,kvp1/qwen/:8GiB:64GiB:evict");
        assertThat(t.prefixes()).containsExactly("kvp1/llama/", "kvp1/qwen/");
        assertThat(t.memoryBytes()).isEqualTo(8L << 30);
        assertThat(t.diskBytes()).isEqualTo(64L << 30);
        assertThat(t.overQuota()).isEqualTo(Tenant.OverQuota.EVICT_OWN);
        assertThat(Tenant.parse(t.spec())).isEqualTo(t);
        assertThat(new ArrayList<>(List.of(Tenant.parse("c=p:none"))).getFirst().memoryBytes()).isEqualTo(-1);
    }
}
