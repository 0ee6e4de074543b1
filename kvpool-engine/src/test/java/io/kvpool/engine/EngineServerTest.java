package io.kvpool.engine;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.kvpool.engine.llama.ModelConfig;
import io.kvpool.engine.llama.Weights;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;

import static org.assertj.core.api.Assertions.assertThat;

/** The HTTP API of an engine with no external cache. */
class EngineServerTest {

    private static final ObjectMapper JSON = new ObjectMapper();
    private Engine engine;
    private EngineServer server;
    private final HttpClient http = HttpClient.newHttpClient();

    @BeforeEach
    void start() throws Exception {
        ModelConfig c = ModelConfig.tiny();
        engine = new Engine(EngineConfig.defaults().withNumBlocks(64), c, Weights.random(c, 1), "v1", null);
        server = new EngineServer(engine, "127.0.0.1", 0);
    }

    @AfterEach
    void stop() {
        server.close();
        engine.close();
    }

    private HttpResponse<String> post(String path, String body) throws Exception {
        return http.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + server.port() + path))
                .POST(HttpRequest.BodyPublishers.ofString(body)).build(), HttpResponse.BodyHandlers.ofString());
    }

    private HttpResponse<String> get(String path) throws Exception {
        return http.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + server.port() + path)).build(),
                HttpResponse.BodyHandlers.ofString());
    }

    @Test
    void completionsAnswerLikeOpenAiAndRepeatThemselvesGreedily() throws Exception {
        HttpResponse<String> r = post("/v1/completions", "{\"prompt\": \"hello kv cache\", \"max_tokens\": 5}");
        assertThat(r.statusCode()).isEqualTo(200);
        JsonNode j = JSON.readTree(r.body());
        assertThat(j.path("object").asText()).isEqualTo("text_completion");
        assertThat(j.path("choices").get(0).path("token_ids")).hasSizeLessThanOrEqualTo(5);
        assertThat(j.path("usage").path("prompt_tokens").asInt()).isEqualTo(15); // BOS + 14 bytes
        JsonNode again = JSON.readTree(post("/v1/completions", "{\"prompt\": \"hello kv cache\", \"max_tokens\": 5}").body());
        assertThat(again.path("choices").get(0).path("token_ids")).isEqualTo(j.path("choices").get(0).path("token_ids"));
        assertThat(again.path("kvpool").path("weights_version").asText()).isEqualTo("v1");
    }

    @Test
    void streamingSendsEachTokenThenDone() throws Exception {
        HttpResponse<String> r = post("/v1/completions",
                "{\"prompt\": [256, 1, 2, 3], \"max_tokens\": 4, \"stream\": true}");
        assertThat(r.statusCode()).isEqualTo(200);
        assertThat(r.headers().firstValue("Content-Type")).hasValue("text/event-stream");
        String[] events = r.body().split("\n\n");
        assertThat(events[events.length - 1]).isEqualTo("data: [DONE]");
        long tokenEvents = java.util.Arrays.stream(events).filter(e -> e.contains("\"finish_reason\":null")).count();
        JsonNode last = JSON.readTree(events[events.length - 2].substring("data: ".length()));
        assertThat(tokenEvents).isEqualTo(last.path("usage").path("completion_tokens").asLong());
    }

    @Test
    void theWeightUpdateFlowWorksWithoutAConnector() throws Exception {
        assertThat(post("/update_weights", "{\"seed\": 2, \"version\": \"v2\"}").statusCode()).as("not paused").isEqualTo(409);
        JsonNode paused = JSON.readTree(post("/pause_generation?clear_cache=true", "").body());
        assertThat(paused.path("success").asBoolean()).as("no connector: a quiet success").isTrue();
        assertThat(JSON.readTree(get("/health").body()).path("paused").asBoolean()).isTrue();
        JsonNode refused = JSON.readTree(post("/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 2}").body());
        assertThat(refused.path("choices").get(0).path("finish_reason").asText()).isEqualTo("abort");
        assertThat(post("/update_weights", "{\"seed\": 2, \"version\": \"v2\"}").statusCode()).isEqualTo(200);
        assertThat(post("/reset_prefix_cache", "").statusCode()).isEqualTo(200);
        assertThat(post("/resume", "").statusCode()).isEqualTo(200);
        JsonNode after = JSON.readTree(post("/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 2}").body());
        assertThat(after.path("kvpool").path("weights_version").asText()).isEqualTo("v2");
        assertThat(engine.metrics().weightUpdates()).isEqualTo(1);
    }

    @Test
    void badRequestsGet400NamingTheField() throws Exception {
        HttpResponse<String> r = post("/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": \"many\"}");
        assertThat(r.statusCode()).isEqualTo(400);
        assertThat(r.body()).contains("max_tokens");
        assertThat(post("/v1/completions", "{not json").body()).contains("not valid JSON");
        assertThat(post("/v1/completions", "{\"prompt\": [999]}").body()).contains("outside the vocabulary");
        assertThat(post("/v1/completions", "{}").body()).contains("prompt is required");
        assertThat(post("/pause_generation?mode=later", "").body()).contains("mode must be abort or wait");
        assertThat(get("/v1/completions").statusCode()).isEqualTo(405);
        assertThat(post("/update_weights", "{\"seed\": 1}").body()).contains("version is required");
    }

    @Test
    void metricsExposeTtftAndCacheCounters() throws Exception {
        post("/v1/completions", "{\"prompt\": \"abcdefghijklmnopqrstuvwxyz0123456789\", \"max_tokens\": 2}");
        post("/v1/completions", "{\"prompt\": \"abcdefghijklmnopqrstuvwxyz0123456789\", \"max_tokens\": 2}");
        String m = get("/metrics").body();
        assertThat(m).contains("engine_time_to_first_token_seconds_count 2")
                .contains("engine_prefix_cache_hit_tokens_total 32.0").contains("engine_kv_load_bytes_total 0.0");
    }
}
