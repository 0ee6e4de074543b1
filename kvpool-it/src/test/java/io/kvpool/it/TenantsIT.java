package io.kvpool.it;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.config.Size;
import io.kvpool.etcd.LeaderRecord;
import io.kvpool.master.Tenant;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * Tenants end to end: one tenant's burst leaves another tenant's objects in place (and, in the same run without
 * tenants, the same burst evicts them: the test would fail without quotas); quotas changed over HTTP at run time;
 * quotas set at run time survive a failover of elected masters.
 */
class TenantsIT {

    private static final int VALUE = 64 << 10;
    private static final String A = "kvp1/model-a/";
    private static final String B = "kvp1/model-b/";

    private static String key(String prefix, int i) {
        return prefix + "v1/" + "%06d".formatted(i);
    }

    private static List<Tenant> tenants(Tenant.OverQuota aOver, long aMemory) {
        return List.of(new Tenant("a", List.of(A), aMemory, -1, aOver), new Tenant("b", List.of(B), -1, -1,
                Tenant.OverQuota.REFUSE));
    }

    /** B's working set, then A's burst of four pools; returns how many of B's objects are still there. */
    private static int burst(KvPoolClient c, PutStatus aExpectedLate) {
        for (int i = 0; i < 100; i++) { // 6.4 MiB of 16
            assertThat(c.put(key(B, i), new byte[VALUE])).isEqualTo(PutStatus.OK);
        }
        for (int i = 0; i < 1000; i++) { // 64 MiB
            PutStatus s = c.put(key(A, i), new byte[VALUE]);
            if (i >= 100) { // past any quota here
                assertThat(s).as(key(A, i)).isEqualTo(aExpectedLate);
            }
        }
        int left = 0;
        for (int i = 0; i < 100; i++) {
            left += c.exists(key(B, i)) ? 1 : 0;
        }
        return left;
    }

    @ParameterizedTest
    @EnumSource(Tenant.OverQuota.class)
    void oneTenantsBurstLeavesAnotherTenantsObjectsInPlace(Tenant.OverQuota over) throws Exception {
        try (InProcessCluster noQuotas = new InProcessCluster(1, Size.ofMiB(16));
             KvPoolClient c = noQuotas.client()) {
            int left = burst(c, PutStatus.OK);
            System.out.println("tenants: without quotas, A's burst left " + left + " of B's 100 objects");
            assertThat(left).as("without quotas the burst evicts the other tenant").isLessThan(100);
        }
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(16), m -> m.withTenants(tenants(over,
                4L << 20)), n -> n);
             KvPoolClient c = cluster.client()) {
            assertThat(burst(c, over == Tenant.OverQuota.REFUSE ? PutStatus.QUOTA_EXCEEDED : PutStatus.OK))
                    .as("with quotas every object of B stays").isEqualTo(100);
            String view = get(cluster.master.httpPort());
            assertThat(view).contains("\"name\":\"a\"").contains("\"memory_quota_bytes\":4194304");
            if (over == Tenant.OverQuota.REFUSE) {
                java.util.regex.Matcher m = java.util.regex.Pattern.compile("\"name\":\"a\".*?\"refused_puts\":(\\d+)")
                        .matcher(view);
                assertThat(m.find()).as(view).isTrue();
                assertThat(Long.parseLong(m.group(1))).as("A's puts refused").isGreaterThanOrEqualTo(900);
                assertThat(c.exists(key(A, 0))).as("the first of A's objects stay").isTrue();
            } else {
                assertThat(c.exists(key(A, 999))).as("A's newest object").isTrue();
                assertThat(c.exists(key(A, 0))).as("A's oldest went, for A's own puts").isFalse();
            }
        }
    }

    @Test
    void quotasChangeAtRunTimeOverHttp() throws Exception {
        try (InProcessCluster cluster = new InProcessCluster(1, Size.ofMiB(16), m -> m.withTenants(
                tenants(Tenant.OverQuota.REFUSE, -1)), n -> n);
             KvPoolClient c = cluster.client()) {
            int http = cluster.master.httpPort();
            for (int i = 0; i < 20; i++) {
                assertThat(c.put(key(A, i), new byte[VALUE])).isEqualTo(PutStatus.OK);
            }
            assertThat(put(http, "{\"tenants\": [{\"name\": \"a\", \"prefixes\": [\"" + A + "\"], \"memory\": \"512KiB\"}]}"))
                    .as("a new list").startsWith("200");
            assertThat(c.put(key(A, 20), new byte[VALUE])).isEqualTo(PutStatus.QUOTA_EXCEEDED);
            assertThat(c.put(key(B, 0), new byte[VALUE])).as("B is no tenant now").isEqualTo(PutStatus.OK);
            assertThat(get(http)).contains("\"memory_quota_bytes\":524288").doesNotContain("\"name\":\"b\"");
            assertThat(put(http, "{\"tenants\": [{\"name\": \"a\", \"prefix\": [\"x\"]}]}")).startsWith("400")
                    .contains("unknown field 'prefix'");
            assertThat(put(http, "{\"tenants\": [{\"name\": \"a\", \"prefixes\": [\"x\"], \"memory\": \"lots\"}]}"))
                    .startsWith("400").contains("bad size 'lots'");
            assertThat(get(http)).as("a bad list changes nothing").contains("\"memory_quota_bytes\":524288");
        }
    }

    @Test
    void quotasSetAtRunTimeSurviveAFailover() throws Exception {
        int[] http = {ProcessCluster.freePort(), ProcessCluster.freePort()};
        try (HaCluster ha = new HaCluster("tenants-failover", 0)) {
            ha.startMaster("m1", "--http-port", "" + http[0]);
            LeaderRecord first = ha.awaitLeader(LeaderRecord::ready, "the first leader");
            ha.startMaster("m2", "--http-port", "" + http[1]);
            ha.startNode("64MiB");
            try (KvPoolClient c = KvPoolClient.connect(ClientConfig.forMaster(ha.url))) {
                ProcessCluster.awaitActive(c, 1, "the node registered");
                assertThat(put(http[0], Tenant.toJson(List.of(new Tenant("a", List.of(A), 10L * VALUE, -1,
                        Tenant.OverQuota.REFUSE))))).startsWith("200");
                int stored = 0;
                for (int i = 0; i < 12; i++) {
                    stored += c.put(key(A, i), new byte[VALUE]) == PutStatus.OK ? 1 : 0;
                }
                assertThat(stored).as("A's objects within its quota").isBetween(8, 10);
                ha.awaitNodesListed(1);
                ha.master(first.id()).kill9();
                LeaderRecord next = ha.awaitLeader(r -> r.ready() && r.term() > first.term(), "a new leader");
                assertThat(next.id()).isEqualTo("m2");
                Await.untilChecked("the new leader lists A's objects", java.time.Duration.ofSeconds(60),
                        () -> c.exists(key(A, 0)));
                assertThat(get(http[1])).contains("\"name\":\"a\"").contains("\"memory_quota_bytes\":" + 10L * VALUE);
                assertThat(c.put(key(A, 100), new byte[VALUE])).as("the quota holds under the new leader")
                        .isEqualTo(PutStatus.QUOTA_EXCEEDED);
            }
        }
    }

    private static String get(int port) throws Exception {
        HttpResponse<String> r = HttpClient.newHttpClient().send(HttpRequest.newBuilder(
                URI.create("http://127.0.0.1:" + port + "/api/tenants")).build(), HttpResponse.BodyHandlers.ofString());
        assertThat(r.statusCode()).as(r.body()).isEqualTo(200);
        return r.body();
    }

    /** The status code, a space, and the body. */
    private static String put(int port, String json) throws Exception {
        HttpResponse<String> r = HttpClient.newHttpClient().send(HttpRequest.newBuilder(
                URI.create("http://127.0.0.1:" + port + "/api/tenants")).PUT(HttpRequest.BodyPublishers.ofString(json))
                .build(), HttpResponse.BodyHandlers.ofString());
        return r.statusCode() + " " + r.body();
    }
}
