package io.kvpool.cli;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.time.LocalTime;
import java.time.format.DateTimeFormatter;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
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

    private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();
    private final ObjectMapper json = new ObjectMapper();

    private void log(String fmt, Object... args) {
        System.out.println(LocalTime.now().format(DateTimeFormatter.ofPattern("HH:mm:ss.SSS")) + " trainer: "
                + String.format(Locale.ROOT, fmt, args));
        System.out.flush();
    }

    private JsonNode post(String base, String path, String body) throws Exception {
        HttpResponse<String> r = http.send(HttpRequest.newBuilder(URI.create(base + path)).timeout(Duration.ofMinutes(5))
                .POST(HttpRequest.BodyPublishers.ofString(body)).build(), HttpResponse.BodyHandlers.ofString());
        JsonNode n = json.readTree(r.body());
        if (r.statusCode() != 200) {
            throw new IllegalStateException(base + path + " answered " + r.statusCode() + ": " + n.path("error").path("message").asText(r.body()));
        }
        return n;
    }

    @Override
    public Integer call() throws Exception {
        if (!mode.equals("reset") && !mode.equals("versioned")) {
            throw new IllegalArgumentException("--mode must be reset or versioned, got " + mode);
        }
        if (steps < 1 || updateEvery < 1 || rollouts < 1 || prefixTokens < 1 || maxTokens < 1) {
            throw new IllegalArgumentException("--steps, --update-every, --rollouts, --prefix-tokens and --max-tokens must be >= 1");
        }
        StringBuilder task = new StringBuilder();
        String[] words = "solve the task step by step using the tools given and report the final answer".split(" ");
        for (int i = 0; task.length() < prefixTokens; i++) {
            task.append(words[i % words.length]).append(' ');
        }
        String prefix = task.substring(0, prefixTokens);
        int version = 1;
        log("%d engines, %d rollouts each per step, update every %d steps, mode %s", engines.size(), rollouts, updateEvery, mode);
        for (int step = 1; step <= steps; step++) {
            if (step > 1 && (step - 1) % updateEvery == 0) {
                version++;
                update(version);
            }
            // engines get their rollouts in turn, as a trainer dispatches batches: an engine later in the
            // step can restore from the pool what an earlier one saved
            List<JsonNode> answers = new ArrayList<>();
            for (String e : engines) {
                List<CompletableFuture<JsonNode>> calls = new ArrayList<>();
                for (int r = 0; r < rollouts; r++) {
                    String prompt = prefix + " problem " + (r % 4) + ":";
                    String body = json.createObjectNode().put("prompt", prompt).put("max_tokens", maxTokens).toString();
                    calls.add(CompletableFuture.supplyAsync(() -> {
                        try {
                            return post(e, "/v1/completions", body);
                        } catch (Exception ex) {
                            throw new IllegalStateException(ex.getMessage(), ex);
                        }
                    }));
                }
                calls.forEach(c -> answers.add(c.join()));
            }
            long prompt = 0;
            long local = 0;
            long external = 0;
            double[] ttft = new double[answers.size()];
            String weights = "";
            for (int i = 0; i < answers.size(); i++) {
                JsonNode n = answers.get(i);
                prompt += n.path("usage").path("prompt_tokens").asLong();
                local += n.path("kvpool").path("prefix_cache_hit_tokens").asLong();
                external += n.path("kvpool").path("external_hit_tokens").asLong();
                ttft[i] = n.path("kvpool").path("ttft_ms").asDouble();
                weights = n.path("kvpool").path("weights_version").asText();
            }
            Arrays.sort(ttft);
            log("step %2d  weights %s  rollouts %d  prefix hit %5.1f%% (local %5.1f%%, pool %5.1f%%)  ttft p50 %6.1f ms",
                    step, weights, answers.size(), 100.0 * (local + external) / prompt, 100.0 * local / prompt,
                    100.0 * external / prompt, ttft[ttft.length / 2]);
        }
        return 0;
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
            for (String e : engines) {
                JsonNode r = post(e, "/reset_prefix_cache?reset_connector=true", "");
                if (!r.path("success").asBoolean()) {
                    throw new IllegalStateException(e + ": reset failed: " + r.path("message").asText());
                }
                removed += r.path("removed").asLong();
            }
            log("reset cascade done: local prefix caches and the pool emptied (%d blocks removed)", removed);
        } else {
            log("versioned keys: engines now use %s keys; old keys are unreachable and reclaimed in the background", v);
        }
        for (String e : engines) {
            post(e, "/resume", "");
        }
        log("resumed");
    }
}
