package io.kvpool.web;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.sun.net.httpserver.HttpServer;
import io.prometheus.metrics.core.metrics.Counter;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.time.InstantSource;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

class StatusPagesTest {

    private final HttpClient client = HttpClient.newHttpClient();
    private HttpServer http;
    private StatusPages pages;

    @AfterEach
    void stop() {
        if (pages != null) {
            pages.close();
        }
        if (http != null) {
            http.stop(0);
        }
    }

    private HttpResponse<String> get(String path) throws Exception {
        return client.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + http.getAddress().getPort() + path))
                .build(), HttpResponse.BodyHandlers.ofString());
    }

    private void start(String prefix, PrometheusRegistry registry) throws Exception {
        http = StatusPages.listen("test", "127.0.0.1", 0);
        History h = History.builder().chart("c", "C", Unit.COUNT).gauge("v", "v", () -> 3).build(10);
        pages = StatusPages.mount(http, prefix, registry, () -> {
            StatusView v = new StatusView("test", "A test", 1234).card("objects", "Objects", 42, Unit.COUNT)
                    .card("who", "Who", "me", "detail");
            v.table("t", "Table").column("name", "Name", Unit.TEXT).column("n", "N", Unit.BYTES).row("a", 1L)
                    .row("b", Double.NaN).empty("nothing");
            return v;
        }, h, InstantSource.system(), Duration.ofMillis(10));
        http.start();
    }

    @Test
    void servesThePageItsAssetsItsJsonAndMetricsWithTheJvms() throws Exception {
        PrometheusRegistry registry = new PrometheusRegistry();
        Counter.builder().name("test_things_total").help("things").register(registry).inc(5);
        start("/", registry);
        HttpResponse<String> page = get("/");
        assertThat(page.statusCode()).isEqualTo(200);
        assertThat(page.headers().firstValue("Content-Type")).hasValue("text/html; charset=utf-8");
        assertThat(page.body()).contains("assets/status.js").doesNotContain("http://", "https://");
        for (String a : new String[] {"status.js", "status.css", "uPlot.min.js", "uPlot.min.css"}) {
            HttpResponse<String> r = get("/assets/" + a);
            assertThat(r.statusCode()).as(a).isEqualTo(200);
            assertThat(r.body()).as(a).isNotEmpty();
        }
        assertThat(get("/assets/../status.html").statusCode()).isEqualTo(404);
        assertThat(get("/assets/Weights.class").statusCode()).isEqualTo(404);
        assertThat(get("/nope").statusCode()).isEqualTo(404);

        JsonNode s = new ObjectMapper().readTree(get("/api/status").body());
        assertThat(s.get("role").asText()).isEqualTo("test");
        assertThat(s.at("/cards/0/value").asLong()).isEqualTo(42);
        assertThat(s.at("/cards/1/value").asText()).isEqualTo("me");
        assertThat(s.at("/tables/0/rows/1/1").isNull()).isTrue();
        assertThat(s.at("/tables/0/empty").asText()).isEqualTo("nothing");
        // the sampler runs by itself
        JsonNode h;
        do {
            h = new ObjectMapper().readTree(get("/api/history").body());
        } while (h.get("t").size() == 0);
        assertThat(h.at("/charts/0/series/0/values/0").asDouble()).isEqualTo(3.0);

        String metrics = get("/metrics").body();
        assertThat(metrics).contains("test_things_total 5.0", "jvm_memory_used_bytes", "jvm_threads_current",
                "jvm_buffer_pool_used_bytes");
    }

    @Test
    void aPageUnderAPrefixAndReadOnlyRoutes() throws Exception {
        start("/node/", null);
        assertThat(get("/node/").statusCode()).isEqualTo(200);
        assertThat(get("/node/api/status").statusCode()).isEqualTo(200);
        assertThat(get("/node/assets/status.js").statusCode()).isEqualTo(200);
        assertThat(get("/metrics").statusCode()).isEqualTo(404); // no registry given
        HttpResponse<String> post = client.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:"
                + http.getAddress().getPort() + "/node/api/status")).POST(HttpRequest.BodyPublishers.noBody()).build(),
                HttpResponse.BodyHandlers.ofString());
        assertThat(post.statusCode()).isEqualTo(405);
        assertThat(post.body()).contains("read-only");
    }

    @Test
    void badPrefixesAndDuplicateCardsAreRefused() {
        assertThatThrownBy(() -> StatusPages.mount(StatusPages.listen("t", "127.0.0.1", 0), "node", null,
                () -> null, History.none())).hasMessageContaining("must start and end with '/'");
        assertThatThrownBy(() -> new StatusView("r", "t", 0).card("a", "A", 1, Unit.COUNT).card("a", "A", 2, Unit.COUNT))
                .hasMessageContaining("two cards named 'a'");
        assertThatThrownBy(() -> new StatusView("r", "t", 0).table("t", "T").column("a", "A", Unit.TEXT).row("x", "y"))
                .hasMessageContaining("a row of 2 cells for 1 columns");
    }
}
