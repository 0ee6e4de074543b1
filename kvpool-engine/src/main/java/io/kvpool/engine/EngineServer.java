package io.kvpool.engine;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import io.kvpool.connector.ResetResult;
import io.kvpool.engine.llama.ByteTokenizer;
import io.kvpool.engine.llama.Weights;
import io.kvpool.web.StatusPages;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Executors;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * The engine over HTTP: an OpenAI-style {@code POST /v1/completions} (optionally streamed as
 * server-sent events), the control endpoints an RL trainer drives, {@code /health} and
 * {@code /metrics}.
 *
 * <pre>
 *   POST /v1/completions        {"prompt": "text" | [token ids], "max_tokens": 16, "temperature": 0,
 *                                "top_p": 1, "seed": 0, "stream": false, "cache_salt": "..."}
 *                               (cache_salt: optional, vLLM's; hashed into the first block only, so
 *                               the request shares no cached KV with requests not carrying it)
 *   POST /pause_generation      ?clear_cache=true|false  &amp;mode=abort|wait    (default: false, abort)
 *                               (200 {"status": "paused", "success": true, "removed": N, "aborted": requests
 *                               aborted, "saves_in_flight": KV blocks whose saves were still running})
 *   POST /resume
 *   POST /abort_all_requests
 *   POST /reset_prefix_cache    ?reset_connector=true|false                  (default: true)
 *                               (200 {"success": true, "removed": N}; 500 with success false and
 *                               the message when the reset failed)
 *   POST /update_weights        {"seed": 7} or {"path": "/models/dir"}, "version": "step-12"
 *                               (the engine must be paused)
 *   GET  /health, GET /metrics, GET / (the summary page: TTFT, hit rates, loads and saves; see EngineStatus)
 * </pre>
 * With an {@link ApiToken}, every POST needs {@code Authorization: Bearer TOKEN} (401 otherwise);
 * {@code /health} and {@code /metrics} stay open and read-only.
 * Errors answer 400 (bad request: the message names the field), 409 (wrong state, e.g. update
 * without pause) or 500, with {@code {"error": {"message": ...}}}. A completion refused or aborted
 * because the engine is paused answers 503 with {@code Retry-After} (its body still says
 * {@code "finish_reason": "abort"}).
 *
 * <p>Limits: a request body over {@link #MAX_BODY_BYTES} is answered 413 without being read (its
 * declared length is checked first); a request whose headers and body do not all arrive within
 * {@link #MAX_REQUEST_SECONDS} is closed (the JDK server's {@code sun.net.httpserver.maxReqTime},
 * which this class sets for the process unless it is set already). A POST's body is read before its
 * handler runs, so a long-running handler (a pause waiting for requests in flight) is not a slow
 * request.
 */
public final class EngineServer implements AutoCloseable {

    private static final Logger log = LoggerFactory.getLogger(EngineServer.class);
    private static final ObjectMapper JSON = new ObjectMapper();

    /** Largest request body accepted: a prompt of a million token ids fits. */
    public static final int MAX_BODY_BYTES = 8 << 20;
    /** The {@code Retry-After} of a completion refused while the engine is paused (a weight update). */
    static final int RETRY_AFTER_PAUSED_SECONDS = 1;
    /** How long a request's headers and body may take to arrive, in seconds. */
    public static final int MAX_REQUEST_SECONDS = 30;
    /**
     * POST bodies read before their handlers run, by exchange. Not exchange attributes: the JDK server
     * keeps those in the context's map, shared by every request to the same path at once.
     */
    private final Map<HttpExchange, byte[]> bodies = new ConcurrentHashMap<>();

    static {
        limitRequestTime();
    }

    /**
     * Bounds how long any request to this process's JDK HTTP servers (engines, the master's
     * {@code /metrics}) may take to arrive, unless the operator set {@code sun.net.httpserver.maxReqTime}.
     * The JDK reads it when its first HTTP server starts, so a program that starts other HTTP servers
     * before an engine calls this first.
     */
    public static void limitRequestTime() {
        if (System.getProperty("sun.net.httpserver.maxReqTime") == null) {
            System.setProperty("sun.net.httpserver.maxReqTime", Integer.toString(MAX_REQUEST_SECONDS));
        }
    }

    private final Engine engine;
    private final HttpServer http;
    private final StatusPages pages;
    private final ByteTokenizer tokenizer = new ByteTokenizer();
    /** Null: the API is open (loopback, or the operator said --insecure). */
    private final ApiToken token;

    public EngineServer(Engine engine, String host, int port) throws IOException {
        this(engine, host, port, null);
    }

    /**
     * An engine's HTTP API; with a {@code token}, every POST needs {@code Authorization: Bearer TOKEN}
     * (401 otherwise), while {@code /health} and {@code /metrics} stay open.
     */
    public EngineServer(Engine engine, String host, int port, ApiToken token) throws IOException {
        this.engine = engine;
        this.token = token;
        this.http = HttpServer.create(new InetSocketAddress(host, port), 128);
        http.setExecutor(Executors.newVirtualThreadPerTaskExecutor());
        http.createContext("/v1/completions", ex -> handle(ex, "POST", this::completions));
        http.createContext("/pause_generation", ex -> handle(ex, "POST", this::pause));
        http.createContext("/resume", ex -> handle(ex, "POST", e -> {
            engine.resume();
            json(e, 200, JSON.createObjectNode().put("status", "resumed"));
        }));
        http.createContext("/abort_all_requests", ex -> handle(ex, "POST", e ->
                json(e, 200, JSON.createObjectNode().put("aborted", engine.abortAllRequests()))));
        http.createContext("/reset_prefix_cache", ex -> handle(ex, "POST", e -> {
            boolean connector = !"false".equals(query(e).get("reset_connector"));
            ResetResult r = engine.resetPrefixCache(connector);
            json(e, r.success() ? 200 : 500, reset(r));
        }));
        http.createContext("/update_weights", ex -> handle(ex, "POST", this::updateWeights));
        http.createContext("/health", ex -> handle(ex, "GET", e -> json(e, 200, JSON.createObjectNode()
                .put("status", "ok").put("paused", engine.isPaused()).put("weights_version", engine.weightsVersion())
                .put("in_flight", engine.inFlight()))));
        // the summary page at /, and /metrics with the JVM's series
        EngineStatus status = new EngineStatus(engine);
        String address = host + ":" + http.getAddress().getPort();
        this.pages = StatusPages.mount(http, "/", engine.metrics().registry(engine::connectorStats,
                engine::prefixCacheStats), () -> status.view(address), status.history);
        http.start();
    }

    public int port() {
        return http.getAddress().getPort();
    }

    private interface Handler {
        void handle(HttpExchange e) throws Exception;
    }

    private static final class HttpError extends RuntimeException {
        final int status;

        HttpError(int status, String message) {
            super(message);
            this.status = status;
        }
    }

    private void handle(HttpExchange e, String method, Handler h) throws IOException {
        // not try-with-resources: the exchange must stay open until the catch blocks have answered
        try {
            if (!method.equals(e.getRequestMethod())) {
                throw new HttpError(405, e.getRequestURI().getPath() + " takes " + method);
            }
            if ("POST".equals(method)) {
                if (token != null && !token.admits(e.getRequestHeaders().getFirst("Authorization"))) {
                    e.getResponseHeaders().set("WWW-Authenticate", "Bearer");
                    throw new HttpError(401, e.getRequestURI().getPath() + " needs the engine's API token: send"
                            + " 'Authorization: Bearer TOKEN' (the token the engine was given in KVPOOL_ENGINE_TOKEN_FILE"
                            + " or --api-token-file)");
                }
                bodies.put(e, readBody(e));
            }
            h.handle(e);
        } catch (HttpError err) {
            error(e, err.status, err.getMessage());
        } catch (IllegalArgumentException err) {
            error(e, 400, err.getMessage());
        } catch (IllegalStateException err) {
            error(e, 409, err.getMessage());
        } catch (ExecutionException | java.util.concurrent.CompletionException err) {
            Throwable c = err.getCause();
            error(e, c instanceof IllegalStateException ? 409 : c instanceof IllegalArgumentException ? 400 : 500,
                    String.valueOf(c.getMessage()));
        } catch (Exception err) {
            log.warn("{} {} failed", e.getRequestMethod(), e.getRequestURI(), err);
            error(e, 500, err.toString());
        } finally {
            bodies.remove(e);
            e.close();
        }
    }

    private static void error(HttpExchange e, int status, String message) {
        try {
            ObjectNode n = JSON.createObjectNode();
            n.putObject("error").put("message", message);
            json(e, status, n);
        } catch (IOException ignored) {
            // the client went away
        }
    }

    private static void json(HttpExchange e, int status, JsonNode body) throws IOException {
        byte[] b = JSON.writeValueAsBytes(body);
        e.getResponseHeaders().set("Content-Type", "application/json");
        e.sendResponseHeaders(status, b.length);
        try (OutputStream o = e.getResponseBody()) {
            o.write(b);
        }
    }

    /** The request body, at most {@link #MAX_BODY_BYTES} (413 past it, checked on the declared length first). */
    private static byte[] readBody(HttpExchange e) throws IOException {
        String declared = e.getRequestHeaders().getFirst("Content-Length");
        if (declared != null && Long.parseLong(declared.trim()) > MAX_BODY_BYTES) {
            throw new HttpError(413, "the request body of " + declared.trim() + " bytes is over the engine's limit of "
                    + MAX_BODY_BYTES + " bytes");
        }
        byte[] b = e.getRequestBody().readNBytes(MAX_BODY_BYTES + 1);
        if (b.length > MAX_BODY_BYTES) {
            throw new HttpError(413, "the request body is over the engine's limit of " + MAX_BODY_BYTES + " bytes");
        }
        return b;
    }

    /** The POST body read before the handler ran. */
    private byte[] body(HttpExchange e) throws IOException {
        byte[] read = bodies.get(e);
        return read != null ? read : readBody(e);
    }

    private static Map<String, String> query(HttpExchange e) {
        Map<String, String> q = new HashMap<>();
        URI u = e.getRequestURI();
        if (u.getRawQuery() != null) {
            for (String kv : u.getRawQuery().split("&")) {
                int i = kv.indexOf('=');
                q.put(i < 0 ? kv : kv.substring(0, i), i < 0 ? "" : java.net.URLDecoder.decode(kv.substring(i + 1),
                        StandardCharsets.UTF_8));
            }
        }
        return q;
    }

    private void completions(HttpExchange e) throws Exception {
        RequestBodies.CompletionRequest r = RequestBodies.completion(body(e));
        int[] prompt = r.prompt();
        SamplingParams params = r.params();
        String salt = r.cacheSalt();
        String model = engine.config().modelName();
        if (!r.stream()) {
            Completion c = engine.generate(prompt, params, salt, null).get();
            int status = 200;
            if (c.error() != null && c.finishReason() == FinishReason.ABORT) {
                // refused or aborted by a pause (a weight update): come back once the engine resumes
                status = 503;
                e.getResponseHeaders().set("Retry-After", String.valueOf(RETRY_AFTER_PAUSED_SECONDS));
            } else if (c.error() != null) {
                status = 500;
            }
            json(e, status, completionJson(c, model));
            return;
        }
        LinkedBlockingQueue<Integer> tokens = new LinkedBlockingQueue<>();
        var future = engine.generate(prompt, params, salt, (id, t) -> tokens.add(t));
        e.getResponseHeaders().set("Content-Type", "text/event-stream");
        e.getResponseHeaders().set("Cache-Control", "no-cache");
        e.sendResponseHeaders(200, 0);
        try (OutputStream o = e.getResponseBody()) {
            while (!future.isDone() || !tokens.isEmpty()) {
                Integer t = tokens.poll(50, TimeUnit.MILLISECONDS);
                if (t != null) {
                    ObjectNode chunk = JSON.createObjectNode().put("object", "text_completion").put("model", model);
                    ObjectNode choice = chunk.putArray("choices").addObject();
                    choice.put("index", 0).put("text", tokenizer.decode(new int[]{t})).putNull("finish_reason");
                    choice.putArray("token_ids").add(t);
                    o.write(("data: " + JSON.writeValueAsString(chunk) + "\n\n").getBytes(StandardCharsets.UTF_8));
                    o.flush();
                }
            }
            Completion c = future.get();
            ObjectNode last = completionJson(c, model);
            ((ObjectNode) last.get("choices").get(0)).put("text", "");
            o.write(("data: " + JSON.writeValueAsString(last) + "\n\ndata: [DONE]\n\n").getBytes(StandardCharsets.UTF_8));
        }
    }

    private ObjectNode completionJson(Completion c, String model) {
        ObjectNode n = JSON.createObjectNode();
        n.put("id", "cmpl-" + c.requestId()).put("object", "text_completion")
                .put("created", System.currentTimeMillis() / 1000).put("model", model);
        ObjectNode choice = n.putArray("choices").addObject();
        choice.put("index", 0).put("text", tokenizer.decode(c.outputTokens())).put("finish_reason", c.finishReason().wireName());
        ArrayNode ids = choice.putArray("token_ids");
        for (int t : c.outputTokens()) {
            ids.add(t);
        }
        n.putObject("usage").put("prompt_tokens", c.promptTokens().length)
                .put("completion_tokens", c.outputTokens().length)
                .put("total_tokens", c.promptTokens().length + c.outputTokens().length);
        ObjectNode k = n.putObject("kvpool");
        k.put("prefix_cache_hit_tokens", c.localHitTokens()).put("external_hit_tokens", c.externalHitTokens())
                .put("recomputed_tokens", c.recomputedTokens()).put("weights_version", c.weightsVersion())
                .put("ttft_ms", c.ttftNanos() < 0 ? -1 : c.ttftNanos() / 1e6);
        if (c.error() != null) {
            n.putObject("error").put("message", c.error());
        }
        return n;
    }

    private void pause(HttpExchange e) throws Exception {
        Map<String, String> q = query(e);
        boolean clear = "true".equals(q.get("clear_cache"));
        String mode = q.getOrDefault("mode", "abort");
        if (!mode.equals("abort") && !mode.equals("wait")) {
            throw new IllegalArgumentException("mode must be abort or wait, got " + mode);
        }
        Engine.Paused p = engine.pauseGeneration(clear, mode.equals("abort")).get();
        ObjectNode n = reset(p.reset());
        n.put("status", "paused").put("aborted", p.aborted()).put("saves_in_flight", p.savesInFlight());
        json(e, p.reset().success() ? 200 : 500, n);
    }

    private static ObjectNode reset(ResetResult r) {
        ObjectNode n = JSON.createObjectNode().put("success", r.success()).put("removed", r.removed());
        if (!r.success()) {
            n.put("message", r.message());
        }
        return n;
    }

    private void updateWeights(HttpExchange e) throws Exception {
        RequestBodies.WeightUpdateRequest r = RequestBodies.weightUpdate(body(e));
        String version = r.version();
        if (r.path() != null) {
            Path dir = r.path();
            engine.updateWeights(() -> {
                try {
                    return Weights.load(dir);
                } catch (IOException err) {
                    throw new IllegalArgumentException("cannot load weights from " + dir + ": " + err.getMessage(), err);
                }
            }, version);
        } else {
            long seed = r.seed();
            engine.updateWeights(() -> Weights.random(engine.modelConfig(), seed), version);
        }
        json(e, 200, JSON.createObjectNode().put("status", "updated").put("weights_version", version));
    }

    @Override
    public void close() {
        pages.close();
        http.stop(0);
    }
}
