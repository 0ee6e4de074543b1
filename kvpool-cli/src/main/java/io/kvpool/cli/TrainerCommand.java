package io.kvpool.cli;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.kvpool.engine.ApiToken;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Path;
import java.time.Duration;
import java.time.LocalTime;
import java.time.format.DateTimeFormatter;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Callable;

/**
 * {@code kvpool trainer}: a stand-in RL trainer. Each step it sends a batch of rollouts (prompts
 * sharing a long task prefix) to each engine in turn and logs the prefix hit rate, split into the
 * engines' own prefix caches and the pool; every
 * {@code --update-every} steps it updates the weights through the engines' control API:
 * pause (abort) all engines, update_weights on each, reset the caches (mode {@code reset}: the
 * local prefix cache and the pool, one cascade) or rely on versioned keys (mode {@code versioned}),
 * resume. The log shows each update and the hit rate falling to zero and recovering after it.
 *
 * <p>With {@code --verify}, every rollout is checked against a recompute under the same weights:
 * each distinct prompt of the step is sent once more, to one engine, with a fresh random
 * {@code cache_salt} (so no cache, local or pool, can serve any of it) and greedy sampling; a rollout
 * whose output differs from it was computed over stale KV. With {@code --freeze-pid}, the process
 * given (a pool node: {@code KVPOOL_NODE_PIDS}, set by {@code kvpool launch --run}) is stopped with
 * SIGSTOP just before the engines are paused for a weight update and continued (SIGCONT) after the
 * first step under the new weights: a fault drill for the reset cascade.
 */
@Command(name = "trainer", mixinStandardHelpOptions = true,
        description = "Drive engines like an RL trainer: rollouts each step, a weight update every N steps.")
final class TrainerCommand implements Callable<Integer> {

    @Option(names = "--engines", split = ",", required = true, paramLabel = "URL",
            description = "Engine base URLs, e.g. http://127.0.0.1:8001,http://127.0.0.1:8002.")
    List<String> engines;

    @Option(names = "--steps", paramLabel = "N", description = "Training steps (default: ${DEFAULT-VALUE}).")
    int steps = 12;

    @Option(names = "--update-every", paramLabel = "N", description = "Steps between weight updates (default: ${DEFAULT-VALUE}).")
    int updateEvery = 4;

    @Option(names = "--rollouts", paramLabel = "N", description = "Rollouts per engine per step (default: ${DEFAULT-VALUE}).")
    int rollouts = 4;

    @Option(names = "--prefix-tokens", paramLabel = "N", description = "Tokens of the shared task prompt (default: ${DEFAULT-VALUE}).")
    int prefixTokens = 256;

    @Option(names = "--max-tokens", paramLabel = "N", description = "Tokens per rollout (default: ${DEFAULT-VALUE}).")
    int maxTokens = 8;

    @Option(names = "--mode", paramLabel = "MODE",
            description = "reset (pause, update, reset caches, resume) or versioned (keys carry the version) (default: ${DEFAULT-VALUE}).")
    String mode = "reset";

    @Option(names = "--verify",
            description = "After every step, recompute each distinct prompt with a fresh cache_salt and compare every"
                    + " rollout's output with it; log 'stale outputs: M of N verified' at the end, exit code 1 if M > 0.")
    boolean verify;

    @Option(names = "--freeze-pid", paramLabel = "PID",
            description = "Fault drill: SIGSTOP this process (a pool node) just before pausing the engines for weight"
                    + " update --freeze-at-update, and SIGCONT it after the first step under the new weights.")
    Long freezePid;

    @Option(names = "--freeze-at-update", paramLabel = "K",
            description = "The weight update --freeze-pid spans, counting from 1 (default: ${DEFAULT-VALUE}).")
    int freezeAtUpdate = 1;

    /** One rollout's answer, with where it came from. */
    private record Rollout(String engine, String prompt, JsonNode answer) {
    }

    private long verifiedOutputs;
    private long staleOutputs;
    private boolean frozen;
    private long frozenAt;

    private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();

    @Option(names = "--api-token-file", paramLabel = "FILE",
            description = "File holding the engines' API token (default: env KVPOOL_ENGINE_TOKEN_FILE or"
                    + " KVPOOL_ENGINE_TOKEN; none: the engines' APIs are open).")
    Path apiTokenFile;

    /** The engines' API token, loaded on first use (null: none). */
    private ApiToken token;
    private boolean tokenLoaded;

    private HttpRequest.Builder authorized(HttpRequest.Builder b) {
        if (!tokenLoaded) {
            token = ApiToken.load(apiTokenFile);
            tokenLoaded = true;
        }
        return token == null ? b : b.header("Authorization", token.header());
    }
    private final ObjectMapper json = new ObjectMapper();

    private void log(String fmt, Object... args) {
        System.out.println(LocalTime.now().format(DateTimeFormatter.ofPattern("HH:mm:ss.SSS")) + " trainer: "
                + String.format(Locale.ROOT, fmt, args));
        System.out.flush();
    }

    /** POSTs and returns the JSON answer; anything but 200 throws, naming the endpoint, the status and why. */
    private JsonNode post(String base, String path, String body) throws Exception {
        HttpResponse<String> r = http.send(authorized(HttpRequest.newBuilder(URI.create(base + path)))
                .timeout(Duration.ofMinutes(5)).POST(HttpRequest.BodyPublishers.ofString(body)).build(),
                HttpResponse.BodyHandlers.ofString());
        JsonNode n;
        try {
            n = json.readTree(r.body());
        } catch (com.fasterxml.jackson.core.JsonProcessingException e) {
            throw new IllegalStateException(base + path + " answered " + r.statusCode() + " with a body that is not JSON: "
                    + r.body());
        }
        if (r.statusCode() != 200) {
            // errors carry {"error": {"message"}}; a failed reset carries {"success": false, "message"}
            String why = n.path("error").path("message").asText(n.path("message").asText(r.body()));
            throw new IllegalStateException(base + path + " answered " + r.statusCode() + ": " + why);
        }
        return n;
    }

    /** A completion request: greedy, so a recompute under the same weights gives the same tokens. */
    private String completion(String prompt, String cacheSalt) {
        ObjectNode b = json.createObjectNode().put("prompt", prompt).put("max_tokens", maxTokens).put("temperature", 0);
        if (cacheSalt != null) {
            b.put("cache_salt", cacheSalt);
        }
        return b.toString();
    }

    private CompletableFuture<JsonNode> postAsync(String base, String path, String body) {
        return CompletableFuture.supplyAsync(() -> {
            try {
                return post(base, path, body);
            } catch (Exception ex) {
                throw new IllegalStateException(ex.getMessage(), ex);
            }
        });
    }

    @Override
    public Integer call() throws Exception {
        if (!mode.equals("reset") && !mode.equals("versioned")) {
            throw new IllegalArgumentException("--mode must be reset or versioned, got " + mode);
        }
        if (steps < 1 || updateEvery < 1 || rollouts < 1 || prefixTokens < 1 || maxTokens < 1) {
            throw new IllegalArgumentException("--steps, --update-every, --rollouts, --prefix-tokens and --max-tokens must be >= 1");
        }
        int updates = (steps - 1) / updateEvery;
        if (freezePid != null && freezePid <= 0) {
            throw new IllegalArgumentException("--freeze-pid: a process id, got " + freezePid);
        }
        if (freezePid != null && (freezeAtUpdate < 1 || freezeAtUpdate > updates)) {
            throw new IllegalArgumentException("--freeze-at-update: got " + freezeAtUpdate + ", but --steps " + steps
                    + " with --update-every " + updateEvery + " make " + updates + " weight update(s) to freeze at"
                    + " (counting from 1)");
        }
        StringBuilder task = new StringBuilder();
        String[] words = "solve the task step by step using the tools given and report the final answer".split(" ");
        for (int i = 0; task.length() < prefixTokens; i++) {
            task.append(words[i % words.length]).append(' ');
        }
        String prefix = task.substring(0, prefixTokens);
        int version = 1;
        log("%d engines, %d rollouts each per step, update every %d steps, mode %s%s", engines.size(), rollouts, updateEvery,
                mode, verify ? ", verifying every output" : "");
        try {
            for (int step = 1; step <= steps; step++) {
                if (step > 1 && (step - 1) % updateEvery == 0) {
                    version++;
                    int update = version - 1; // weight updates so far, this one included
                    if (freezePid != null && update == freezeAtUpdate) {
                        signal("STOP");
                        frozen = true;
                        frozenAt = System.nanoTime();
                        log("froze pid %d (a pool node) before the weight update", freezePid);
                    }
                    update(version);
                }
                List<Rollout> done = rollouts(prefix);
                logStep(step, done);
                if (frozen) {
                    thaw(); // the first step under the new weights ran with the node stopped
                }
                if (verify) {
                    verify(step, done);
                }
            }
        } finally {
            if (frozen) {
                try {
                    thaw();
                } catch (Exception e) {
                    log("could not thaw pid %d: %s; continue it by hand: kill -CONT %d", freezePid, e.getMessage(), freezePid);
                }
            }
        }
        if (verify) {
            log("stale outputs: %d of %d verified", staleOutputs, verifiedOutputs);
            return staleOutputs > 0 ? 1 : 0;
        }
        return 0;
    }

    /** One step's rollouts: every engine in turn gets its batch, sent concurrently. */
    private List<Rollout> rollouts(String prefix) {
        // engines get their rollouts in turn, as a trainer dispatches batches: an engine later in the
        // step can restore from the pool what an earlier one saved
        List<Rollout> done = new ArrayList<>();
        for (String e : engines) {
            List<CompletableFuture<Rollout>> calls = new ArrayList<>();
            for (int r = 0; r < rollouts; r++) {
                String prompt = prefix + " problem " + (r % 4) + ":";
                calls.add(postAsync(e, "/v1/completions", completion(prompt, null)).thenApply(n -> new Rollout(e, prompt, n)));
            }
            calls.forEach(c -> done.add(c.join()));
        }
        return done;
    }

    /** The step's line: hit rate (local and pool) and TTFT over its rollouts only. */
    private void logStep(int step, List<Rollout> done) {
        long prompt = 0;
        long local = 0;
        long external = 0;
        double[] ttft = new double[done.size()];
        String weights = "";
        for (int i = 0; i < done.size(); i++) {
            JsonNode n = done.get(i).answer();
            prompt += n.path("usage").path("prompt_tokens").asLong();
            local += n.path("kvpool").path("prefix_cache_hit_tokens").asLong();
            external += n.path("kvpool").path("external_hit_tokens").asLong();
            ttft[i] = n.path("kvpool").path("ttft_ms").asDouble();
            weights = n.path("kvpool").path("weights_version").asText();
        }
        Arrays.sort(ttft);
        log("step %2d  weights %s  rollouts %d  prefix hit %5.1f%% (local %5.1f%%, pool %5.1f%%)  ttft p50 %6.1f ms",
                step, weights, done.size(), 100.0 * (local + external) / prompt, 100.0 * local / prompt,
                100.0 * external / prompt, ttft[ttft.length / 2]);
    }

    /** The output of a completion: its token ids, or its text if the engine gives no ids. */
    private static JsonNode output(JsonNode answer) {
        JsonNode choice = answer.path("choices").path(0);
        return choice.has("token_ids") ? choice.get("token_ids") : choice.path("text");
    }

    /**
     * Recomputes each distinct prompt of the step once, with a fresh random cache_salt so that no cache
     * can serve any of it, and compares every rollout of that prompt with it. Not part of the step's
     * hit rate (its answers are not the rollouts').
     */
    private void verify(int step, List<Rollout> done) {
        Map<String, List<Rollout>> byPrompt = new LinkedHashMap<>();
        for (Rollout r : done) {
            byPrompt.computeIfAbsent(r.prompt(), p -> new ArrayList<>()).add(r);
        }
        Map<String, CompletableFuture<JsonNode>> recomputes = new LinkedHashMap<>();
        int i = 0;
        for (String p : byPrompt.keySet()) {
            String engine = engines.get(i++ % engines.size());
            String salt = "verify-" + UUID.randomUUID();
            recomputes.put(p, postAsync(engine, "/v1/completions", completion(p, salt)));
        }
        int checked = 0;
        int stale = 0;
        for (var e : byPrompt.entrySet()) {
            JsonNode want = recomputes.get(e.getKey()).join();
            long hits = want.path("kvpool").path("prefix_cache_hit_tokens").asLong()
                    + want.path("kvpool").path("external_hit_tokens").asLong();
            if (hits != 0) {
                throw new IllegalStateException("verification of step " + step + ": a request with a fresh cache_salt got "
                        + hits + " cached tokens; the engine does not honour cache_salt, so nothing can be verified");
            }
            String wantVersion = want.path("kvpool").path("weights_version").asText();
            for (Rollout r : e.getValue()) {
                String version = r.answer().path("kvpool").path("weights_version").asText();
                if (!version.equals(wantVersion)) {
                    throw new IllegalStateException("verification of step " + step + ": rollout on " + r.engine()
                            + " ran under weights " + version + ", the recompute under " + wantVersion);
                }
                checked++;
                if (!output(r.answer()).equals(output(want))) {
                    stale++;
                    log("stale output: step %d, %s, weights %s (hit tokens: local %d, pool %d): got %s, a recompute gives %s",
                            step, r.engine(), version, r.answer().path("kvpool").path("prefix_cache_hit_tokens").asLong(),
                            r.answer().path("kvpool").path("external_hit_tokens").asLong(), output(r.answer()), output(want));
                }
            }
        }
        verifiedOutputs += checked;
        staleOutputs += stale;
        log("step %2d  verified %d outputs, %d stale", step, checked, stale);
    }

    /** Sends a signal to --freeze-pid with kill(1). */
    private void signal(String sig) throws Exception {
        Process p = new ProcessBuilder("kill", "-" + sig, Long.toString(freezePid)).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), java.nio.charset.StandardCharsets.UTF_8).trim();
        if (p.waitFor() != 0) {
            throw new IllegalStateException("kill -" + sig + " " + freezePid + " failed: " + out);
        }
    }

    private void thaw() throws Exception {
        frozen = false;
        signal("CONT");
        log("thawed pid %d (stopped for %d ms)", freezePid, (System.nanoTime() - frozenAt) / 1_000_000);
    }

    private void update(int version) throws Exception {
        String v = "v" + version;
        log("weight update to %s: pausing %d engines (aborting rollouts in flight)", v, engines.size());
        for (String e : engines) {
            post(e, "/pause_generation?mode=abort", "");
        }
        for (String e : engines) {
            post(e, "/update_weights", json.createObjectNode().put("seed", version).put("version", v).toString());
        }
        log("weights %s loaded on every engine", v);
        if (mode.equals("reset")) {
            long removed = 0;
            long t0 = System.nanoTime();
            for (String e : engines) {
                // a reset that did not succeed may leave KV of the old weights servable: never go on
                JsonNode r;
                try {
                    r = post(e, "/reset_prefix_cache?reset_connector=true", "");
                } catch (IllegalStateException ex) {
                    throw new IllegalStateException("reset cascade failed, stopping (KV of the old weights could be"
                            + " served): " + ex.getMessage(), ex);
                }
                if (!r.path("success").asBoolean()) {
                    throw new IllegalStateException("reset cascade failed on " + e + ", stopping (KV of the old weights"
                            + " could be served): " + r.path("message").asText(r.toString()));
                }
                removed += r.path("removed").asLong();
            }
            log("reset cascade done in %d ms: local prefix caches and the pool emptied (%d blocks removed)",
                    (System.nanoTime() - t0) / 1_000_000, removed);
        } else {
            log("versioned keys: engines now use %s keys; old keys are unreachable and reclaimed in the background", v);
        }
        for (String e : engines) {
            post(e, "/resume", "");
        }
        log("resumed");
    }
}
