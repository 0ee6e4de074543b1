package io.kvpool.engine;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.kvpool.connector.ResetResult;
import io.kvpool.engine.llama.ModelConfig;
import io.kvpool.engine.llama.Weights;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.net.Socket;
import java.net.SocketException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

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

    /** Sends {@code head} and then {@code bodyBytes} zero bytes on a raw connection; returns it. */
    private Socket raw(String head, int bodyBytes) throws Exception {
        Socket s = new Socket("127.0.0.1", server.port());
        s.setSoTimeout(60_000);
        s.getOutputStream().write(head.getBytes(StandardCharsets.US_ASCII));
        s.getOutputStream().write(new byte[bodyBytes]);
        s.getOutputStream().flush();
        return s;
    }

    private static String readAll(Socket s) throws Exception {
        try (s) {
            return new String(s.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        } catch (SocketException reset) {
            return "";
        }
    }

    @Test
    void withATokenEveryPostNeedsItAndHealthAndMetricsStayOpen() throws Exception {
        ModelConfig c = ModelConfig.tiny();
        Engine other = new Engine(EngineConfig.defaults().withNumBlocks(64), c, Weights.random(c, 1), "v1", null);
        EngineServer secured = new EngineServer(other, "127.0.0.1", 0, ApiToken.of("engine-token-for-this-test"));
        try {
            String base = "http://127.0.0.1:" + secured.port();
            for (String auth : new String[]{null, "Bearer not-the-engine-token-at-all", "Basic engine-token-for-this-test"}) {
                HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(base + "/pause_generation"))
                        .POST(HttpRequest.BodyPublishers.noBody());
                if (auth != null) {
                    b.header("Authorization", auth);
                }
                HttpResponse<String> r = http.send(b.build(), HttpResponse.BodyHandlers.ofString());
                assertThat(r.statusCode()).as(String.valueOf(auth)).isEqualTo(401);
                assertThat(r.body()).contains("needs the engine's API token").doesNotContain("engine-token-for-this-test");
            }
            assertThat(other.isPaused()).isFalse();
            HttpResponse<String> ok = http.send(HttpRequest.newBuilder(URI.create(base + "/v1/completions"))
                    .header("Authorization", ApiToken.of("engine-token-for-this-test").header())
                    .POST(HttpRequest.BodyPublishers.ofString("{\"prompt\": \"hi\", \"max_tokens\": 2}")).build(),
                    HttpResponse.BodyHandlers.ofString());
            assertThat(ok.statusCode()).isEqualTo(200);
            for (String open : new String[]{"/health", "/metrics"}) {
                assertThat(http.send(HttpRequest.newBuilder(URI.create(base + open)).build(),
                        HttpResponse.BodyHandlers.ofString()).statusCode()).isEqualTo(200);
            }
        } finally {
            secured.close();
            other.close();
        }
    }

    @Test
    void concurrentRequestsEachGetTheAnswerToTheirOwnPrompt() throws Exception {
        // each prompt's answer alone, then all of them at once: every request must read its own body
        List<String> prompts = new ArrayList<>();
        List<JsonNode> alone = new ArrayList<>();
        for (int i = 0; i < 12; i++) {
            prompts.add("{\"prompt\": \"prompt number " + i + " of a concurrency test\", \"max_tokens\": 3}");
            alone.add(JSON.readTree(post("/v1/completions", prompts.get(i)).body()).path("choices").get(0).path("token_ids"));
        }
        List<CompletableFuture<HttpResponse<String>>> together = new ArrayList<>();
        for (String p : prompts) {
            together.add(http.sendAsync(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + server.port()
                    + "/v1/completions")).POST(HttpRequest.BodyPublishers.ofString(p)).build(),
                    HttpResponse.BodyHandlers.ofString()));
        }
        for (int i = 0; i < prompts.size(); i++) {
            assertThat(JSON.readTree(together.get(i).get().body()).path("choices").get(0).path("token_ids"))
                    .as(prompts.get(i)).isEqualTo(alone.get(i));
        }
    }

    @Test
    void theTokenComesFromAFileOrTheEnvironmentAndIsNeverShown(@TempDir Path dir) throws Exception {
        Path f = Files.writeString(dir.resolve("token"), "a-token-from-a-file-here\n");
        assertThat(ApiToken.load(f, Map.of()).header()).isEqualTo("Bearer a-token-from-a-file-here");
        assertThat(ApiToken.load(null, Map.of("KVPOOL_ENGINE_TOKEN_FILE", f.toString())).header())
                .isEqualTo("Bearer a-token-from-a-file-here");
        assertThat(ApiToken.load(null, Map.of("KVPOOL_ENGINE_TOKEN", "a-token-in-the-environment"))).isNotNull();
        assertThat(ApiToken.load(null, Map.of())).isNull();
        assertThatThrownBy(() -> ApiToken.of("short")).hasMessageContaining("at least 16").hasMessageNotContaining("short\"");
        assertThat(ApiToken.of("a-token-from-a-file-here").toString()).doesNotContain("a-token");
    }

    @Test
    void anOversizedBodyGets413WithoutBeingRead() throws Exception {
        String head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1610612736\r\n\r\n";
        String reply = readAll(raw(head, 100));
        assertThat(reply).startsWith("HTTP/1.1 413").contains("over the engine's limit of " + EngineServer.MAX_BODY_BYTES);
        // without a declared length (chunked), the limit holds on what arrives
        Socket s = raw("POST /update_weights HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", 0);
        String size = Integer.toHexString(EngineServer.MAX_BODY_BYTES + 16);
        s.getOutputStream().write((size + "\r\n").getBytes(StandardCharsets.US_ASCII));
        s.getOutputStream().write(new byte[EngineServer.MAX_BODY_BYTES + 16]);
        s.getOutputStream().flush();
        assertThat(readAll(s)).startsWith("HTTP/1.1 413");
        assertThat(get("/health").statusCode()).isEqualTo(200);
    }

    @Test
    void aRequestWhoseBodyStopsArrivingIsClosed() throws Exception {
        // the engine module's tests run with sun.net.httpserver.maxReqTime=2 (the engine's default is 30 s)
        Socket slow = raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n", 10);
        assertThat(get("/health").statusCode()).isEqualTo(200); // others are served meanwhile
        assertThat(readAll(slow)).as("the server closes it without an answer").isEmpty();
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
    void theSummaryPageShowsWhatTheEngineDid() throws Exception {
        assertThat(get("/").statusCode()).isEqualTo(200);
        assertThat(post("/v1/completions", "{\"prompt\": \"hello summary, a prompt long enough to fill several blocks of the paged KV cache\", \"max_tokens\": 2}").statusCode())
                .isEqualTo(200);
        assertThat(post("/v1/completions", "{\"prompt\": \"hello summary, a prompt long enough to fill several blocks of the paged KV cache\", \"max_tokens\": 2}").statusCode())
                .isEqualTo(200);
        JsonNode s = JSON.readTree(get("/api/status").body());
        assertThat(s.path("role").asText()).isEqualTo("engine");
        java.util.Map<String, JsonNode> cards = new java.util.HashMap<>();
        s.path("cards").forEach(c -> cards.put(c.path("id").asText(), c));
        assertThat(cards.get("ttft_p50").path("value").asDouble()).isPositive();
        assertThat(cards.get("ttft_p50").path("detail").asText()).startsWith("2 requests");
        assertThat(cards.get("weights").path("value").asText()).isEqualTo("v1");
        // the second request found the first one's prompt blocks in the local prefix cache
        assertThat(cards.get("local_hit_rate").path("value").asDouble()).isPositive();
        assertThat(get("/metrics").body()).contains("engine_prompt_tokens_total", "jvm_threads_current");
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
        HttpResponse<String> refusedReply = post("/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 2}");
        assertThat(refusedReply.statusCode()).as("paused: come back later").isEqualTo(503);
        assertThat(refusedReply.headers().firstValue("Retry-After")).hasValue("1");
        JsonNode refused = JSON.readTree(refusedReply.body());
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
    void malformedBodiesGet400NamingTheFieldAndNeverA500() throws Exception {
        String[][] cases = {
                {"/v1/completions", "{\"prompt\": \"x\", \"stream\": \"yes\"}", "stream must be true or false"},
                {"/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 2.5}", "max_tokens must be an integer"},
                {"/v1/completions", "{\"prompt\": \"x\", \"temperature\": 1e999}", "temperature must be a finite number"},
                {"/v1/completions", "{\"prompt\": \"x\", \"prompt\": \"y\"}", "Duplicate field 'prompt'"},
                {"/v1/completions", "{\"prompt\": \"x\"} trailing", "not valid JSON"},
                {"/update_weights", "{\"seed\": \"7\", \"version\": \"v2\"}", "seed must be a 64-bit integer"},
                {"/update_weights", "{\"seed\": 7, \"version\": 2}", "version must be a non-empty string"},
                {"/update_weights", "{\"path\": \"/m/\\u0000\", \"version\": \"v2\"}", "path is not a valid path"},
        };
        for (String[] c : cases) {
            HttpResponse<String> r = post(c[0], c[1]);
            assertThat(r.statusCode()).as(c[1]).isEqualTo(400);
            assertThat(JSON.readTree(r.body()).path("error").path("message").asText()).as(c[1]).contains(c[2]);
        }
        // a campaign finding: bytes Jackson reads as UTF-32 were answered 500
        HttpResponse<String> utf32 = http.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + server.port()
                + "/v1/completions")).POST(HttpRequest.BodyPublishers.ofByteArray(new byte[]{0, 0, 0, 0, 0, 'T', 'T', 'T'}))
                .build(), HttpResponse.BodyHandlers.ofString());
        assertThat(utf32.statusCode()).isEqualTo(400);
        assertThat(engine.weightsVersion()).as("no refused update reached the engine").isEqualTo("v1");
    }

    @Test
    void aCacheSaltKeepsARequestOffCachedKvAndMustBeANonEmptyString() throws Exception {
        String prompt = "\"prompt\": \"abcdefghijklmnopqrstuvwxyz0123456789\", \"max_tokens\": 4";
        JsonNode plain = JSON.readTree(post("/v1/completions", "{" + prompt + "}").body());
        HttpResponse<String> r = post("/v1/completions", "{" + prompt + ", \"cache_salt\": \"run-7\"}");
        assertThat(r.statusCode()).isEqualTo(200);
        JsonNode salted = JSON.readTree(r.body());
        assertThat(salted.path("kvpool").path("prefix_cache_hit_tokens").asInt()).isZero();
        assertThat(salted.path("choices").get(0).path("token_ids")).isEqualTo(plain.path("choices").get(0).path("token_ids"));
        JsonNode again = JSON.readTree(post("/v1/completions", "{" + prompt + ", \"cache_salt\": \"run-7\"}").body());
        assertThat(again.path("kvpool").path("prefix_cache_hit_tokens").asInt()).as("same salt").isEqualTo(32);
        assertThat(post("/v1/completions", "{" + prompt + ", \"cache_salt\": null}").statusCode()).as("null: none")
                .isEqualTo(200);
        for (String bad : new String[]{"\"\"", "7", "[\"a\"]"}) {
            HttpResponse<String> b = post("/v1/completions", "{" + prompt + ", \"cache_salt\": " + bad + "}");
            assertThat(b.statusCode()).as(bad).isEqualTo(400);
            assertThat(JSON.readTree(b.body()).path("error").path("message").asText()).as(bad)
                    .startsWith("cache_salt must be a non-empty string");
        }
    }

    @Test
    void aFailedResetAnswers500WithItsMessage() throws Exception {
        ModelConfig c = ModelConfig.tiny();
        try (Engine failing = new Engine(EngineConfig.defaults().withNumBlocks(64), c, Weights.random(c, 1), "v1",
                new ResetFailsConnector())) {
            EngineServer s = new EngineServer(failing, "127.0.0.1", 0);
            try {
                HttpResponse<String> r = http.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + s.port()
                        + "/reset_prefix_cache")).POST(HttpRequest.BodyPublishers.noBody()).build(),
                        HttpResponse.BodyHandlers.ofString());
                assertThat(r.statusCode()).isEqualTo(500);
                JsonNode j = JSON.readTree(r.body());
                assertThat(j.path("success").asBoolean(true)).isFalse();
                assertThat(j.path("message").asText()).isEqualTo("master unreachable");
                HttpResponse<String> local = http.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + s.port()
                        + "/reset_prefix_cache?reset_connector=false")).POST(HttpRequest.BodyPublishers.noBody()).build(),
                        HttpResponse.BodyHandlers.ofString());
                assertThat(local.statusCode()).as("the local cache alone resets").isEqualTo(200);
            } finally {
                s.close();
            }
        }
    }

    /** An external cache whose reset always fails; otherwise empty. */
    private static final class ResetFailsConnector extends EmptyConnector {
        @Override
        public ResetResult resetCache() {
            return ResetResult.failed("master unreachable");
        }
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
