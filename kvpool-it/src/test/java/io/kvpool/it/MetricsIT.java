package io.kvpool.it;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.config.Size;
import org.junit.jupiter.api.Test;

import java.lang.foreign.MemorySegment;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import static org.assertj.core.api.Assertions.assertThat;

/** The master's /metrics (Prometheus text), /health, and the periodic summary line. */
class MetricsIT {

    private static String get(int port, String path) throws Exception {
        HttpResponse<String> r = HttpClient.newHttpClient().send(
                HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + path)).build(),
                HttpResponse.BodyHandlers.ofString());
        assertThat(r.statusCode()).as(path).isEqualTo(200);
        return r.body();
    }

    private static double value(String metrics, String series) {
        Matcher m = Pattern.compile("^" + Pattern.quote(series) + " (\\S+)$", Pattern.MULTILINE).matcher(metrics);
        assertThat(m.find()).as("series " + series + " in:\n" + metrics).isTrue();
        return Double.parseDouble(m.group(1));
    }

    @Test
    void metricsCountWhatHappened() throws Exception {
        // no location cache: every read asks the master, so the counts below are exact
        try (InProcessCluster cluster = new InProcessCluster(2, Size.ofMiB(8));
             KvPoolClient c = cluster.client(cfg -> cfg.withLocationCache(0))) {
            assertThat(c.put("a", new byte[1000])).isEqualTo(PutStatus.OK);
            assertThat(c.put("a", new byte[1000])).isEqualTo(PutStatus.ALREADY_EXISTS);
            assertThat(c.putBatch(List.of("b", "c"), List.of(MemorySegment.ofArray(new byte[10]),
                    MemorySegment.ofArray(new byte[10])))).containsOnly(PutStatus.OK);
            c.get("a");
            c.get("nope");
            c.getBatch(List.of("a", "b", "zz"));
            c.exists("a");
            c.batchExists(List.of("a", "b", "q"));
            c.prefixMatch(List.of("a", "b", "q", "c"));
            c.remove("c");
            // fill past the memory so eviction runs
            for (int i = 0; i < 20; i++) {
                c.put("fill/" + i, new byte[1 << 20]);
            }
            long keys = c.stats().keys();

            int port = cluster.master.httpPort();
            String m = get(port, "/metrics");
            assertThat(value(m, "master_objects")).isEqualTo(keys);
            assertThat(value(m, "master_total_capacity_bytes")).isEqualTo(2 * (8 << 20));
            assertThat(value(m, "master_allocated_bytes")).isPositive();
            assertThat(value(m, "master_active_clients")).isGreaterThanOrEqualTo(1);
            for (var node : cluster.nodes) {
                assertThat(value(m, "segment_total_capacity_bytes{segment=\"" + node.name() + "\"}")).isEqualTo(8 << 20);
                assertThat(m).contains("segment_allocated_bytes{segment=\"" + node.name() + "\"}");
            }
            assertThat(value(m, "master_requests_total{op=\"put_start\"}")).isGreaterThanOrEqualTo(22);
            assertThat(value(m, "master_request_failures_total{op=\"put_start\"}")).as("ALREADY_EXISTS").isGreaterThanOrEqualTo(1);
            assertThat(value(m, "master_requests_total{op=\"put_end\"}")).isGreaterThanOrEqualTo(21);
            assertThat(value(m, "master_requests_total{op=\"batch_put_start\"}")).isEqualTo(1);
            assertThat(value(m, "master_request_items_total{op=\"batch_put_start\"}")).isEqualTo(2);
            assertThat(value(m, "master_requests_total{op=\"get_replica_list\"}")).isEqualTo(2);
            assertThat(value(m, "master_request_misses_total{op=\"get_replica_list\"}")).isEqualTo(1);
            assertThat(value(m, "master_request_items_total{op=\"batch_get_replica_list\"}")).isEqualTo(3);
            assertThat(value(m, "master_requests_total{op=\"exist_key\"}")).isEqualTo(1);
            assertThat(value(m, "master_request_items_total{op=\"batch_exist_digest\"}")).isEqualTo(3);
            assertThat(value(m, "master_request_items_total{op=\"prefix_match_digest\"}")).isEqualTo(4);
            assertThat(value(m, "master_requests_total{op=\"remove\"}")).isEqualTo(1);
            assertThat(m).contains("master_requests_total{op=\"remove_all\"}").contains("master_requests_total{op=\"ping\"}")
                    .contains("master_requests_total{op=\"put_revoke\"}");
            assertThat(value(m, "master_eviction_attempts_total")).isPositive();
            assertThat(value(m, "master_eviction_successes_total")).isPositive();
            assertThat(value(m, "master_evicted_keys_total")).isPositive();
            assertThat(value(m, "master_evicted_bytes_total")).isPositive();
            assertThat(m).contains("# TYPE master_requests_total counter").contains("# TYPE master_objects gauge");

            String health = get(port, "/health");
            assertThat(health).contains("\"status\":\"ok\"").contains("\"segments\":2");

            String summary = cluster.master.metrics().summaryLine();
            assertThat(summary).contains("mem ").contains("keys " + keys).contains("clients ").contains("put_start")
                    .contains("evicted");
            // the next line covers only what happened since: nothing
            assertThat(cluster.master.metrics().summaryLine()).doesNotContain("put_start");
        }
    }
}
