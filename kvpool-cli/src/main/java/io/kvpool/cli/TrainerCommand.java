package io.kvpool.cli;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.kvpool.config.Durations;
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
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.SplittableRandom;
import java.util.UUID;
import java.util.concurrent.Callable;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;

/**
 * {@code kvpool trainer}: a stand-in RL trainer. Each step it sends a batch of rollouts (prompts
 * sharing a long task prefix) to each engine in turn and logs the prefix hit rate, split into the
 * engines' own prefix caches and the pool; every {@code --update-every} steps it updates the
 * weights through the engines' control API: pause (abort) all engines, update_weights on each,
 * reset the caches (mode {@code reset}: the local prefix cache and the pool, one cascade) or rely on
 * versioned keys (mode {@code versioned}), resume. Mode {@code none} applies no remedy: a negative
 * control, under which {@code --verify} must find stale outputs. The log shows each update and the
 * hit rate falling and recovering after it.
 *
 * <h2>Verification</h2>
 * With {@code --verify}, right after each weights version is in place (and before the first step)
 * every distinct prompt is sent once more, spread over the engines, with a fresh random
 * {@code cache_salt} (so no cache, local or pool, can serve any of it: checked, its hit count must be
 * 0) and greedy sampling: the version's <i>recompute</i>. Every completed rollout is then compared
 * with the recompute of the prompt under the weights it ran with (which the trainer knows: a step's
 * rollouts run under the weights loaded before it, and a rollout racing an update under the ones
 * before the update, since the update waits for every racing rollout; the version name the rollout
 * reports is checked against it): its output must equal the recompute's first tokens. A rollout
 * computed over KV of other weights differs. An aborted rollout's partial output is checked the same
 * way. Nothing is sampled: every completed rollout is checked. A run with {@code --verify} starts by
 * emptying the pool and the engines' caches ({@code /reset_prefix_cache}), since an earlier run on
 * the same pool may have left KV under the same version names.
 *
 * <h2>One version name ({@code --fixed-name})</h2>
 * The engines switch their keys to each new version name, so old KV is out of reach whatever else
 * happens. With {@code --fixed-name} every update loads new weights under the start-up name
 * ({@code v1}), so that nothing but the remedy keeps the old KV out: with mode {@code reset}, the
 * reset cascade alone is tested; with mode {@code none}, the old KV must be served, and the
 * verification must see it (the negative control).
 *
 * <h2>Racing the update ({@code --race})</h2>
 * A trainer does not wait for its engines to go idle before it updates the weights. With
 * {@code --race}, each update first sends every engine {@code --rollouts} more rollouts of random
 * length (up to {@code --race-tokens}, seeded by {@code --seed}), waits until an engine reports one in
 * flight ({@code /health}), then sends one more rollout to each engine together with the pause
 * requests. Each racing rollout completes before the pause (verified like any other), is aborted
 * by it (its partial output checked), or is refused because the engine is already paused; the run
 * waits for all of them before loading the new weights, so none can run after the resume and the
 * first step under the new weights starts from empty caches. The pause answers how many requests it
 * aborted and how many block saves were still in flight in the engine's connector; the summary
 * counts the updates that found either.
 *
 * <p>With {@code --freeze-pid}, the process given (a pool node: {@code KVPOOL_NODE_PIDS}, set by
 * {@code kvpool launch --run}) is stopped with SIGSTOP just before the engines are paused for a
 * weight update and continued (SIGCONT) after the first step under the new weights: a fault drill
 * for the reset cascade.
 *
 * <h2>Faults ({@code --fault K:COMMAND})</h2>
 * At weight update K, just before its racing rollouts and its pause, the trainer logs the fault
 * (update number and time) and runs {@code bash -c COMMAND}, waiting for it to exit (it must exit 0):
 * the command injects a fault (kills or stops a process of the pool) and may leave in the background
 * whatever brings the pool back; the trainer goes on at once. The summary then gives the prefix hit
 * rate by update: the baseline (the updates before the first fault) and, for each fault, how far the
 * hit rate fell, how long until it was back to the baseline, and what it cost (see
 * {@link RolloutTally#faultSummary}).
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
            description = "reset (pause, update, reset caches, resume), versioned (keys carry the version), or none (no"
                    + " remedy: a negative control for --verify, which must then find stale outputs) (default: ${DEFAULT-VALUE}).")
    String mode = "reset";

    @Option(names = "--verify",
            description = "Check every completed rollout against a recompute with a fresh cache_salt under the weights it"
                    + " ran with; log 'stale outputs: M of N verified' at the end, exit code 1 if M > 0.")
    boolean verify;

    @Option(names = "--race",
            description = "Race every weight update with rollouts: some sent before the pause (it waits until one is"
                    + " running), one per engine with the pause requests; counts what the pauses found in flight.")
    boolean race;

    @Option(names = "--race-tokens", paramLabel = "N",
            description = "Racing rollouts generate between --max-tokens and N tokens, at random (default: ${DEFAULT-VALUE}).")
    int raceTokens = 32;

    @Option(names = "--seed", paramLabel = "N", description = "Seeds the racing rollouts' lengths and prompts (default: ${DEFAULT-VALUE}).")
    long seed = 1;

    @Option(names = "--fixed-name",
            description = "Load every new version under the start-up name v1, so that only the remedy keeps old KV out"
                    + " (reset: the reset cascade alone; none: the negative control). Not with --mode versioned.")
    boolean fixedName;

    @Option(names = "--quiet",
            description = "Log a progress line every 100 updates instead of every step and update (stale outputs and"
                    + " the summary are always logged).")
    boolean quiet;

    @Option(names = "--freeze-pid", paramLabel = "PID",
            description = "Fault drill: SIGSTOP this process (a pool node) just before pausing the engines for weight"
                    + " update --freeze-at-update, and SIGCONT it after the first step under the new weights.")
    Long freezePid;

    @Option(names = "--freeze-at-update", paramLabel = "K",
            description = "The weight update --freeze-pid spans, counting from 1 (default: ${DEFAULT-VALUE}).")
    int freezeAtUpdate = 1;

    @Option(names = "--reset-retry", paramLabel = "DURATION",
            description = "A reset cascade that fails (a master failover, say) is tried again, the engines staying paused,"
                    + " for up to this long before the trainer stops (default: ${DEFAULT-VALUE}: stop at once).")
    Duration resetRetry = Duration.ZERO;

    @Option(names = "--fault", paramLabel = "K:COMMAND",
            description = "Fault drill: at weight update K, just before its pause, run bash -c COMMAND and wait for it"
                    + " (exit 0 required; what it leaves in the background runs on); the summary gives the hit rate"
                    + " before the first fault and after each. Repeatable.")
    List<String> faults = new ArrayList<>();

    @Option(names = "--hit-window", paramLabel = "N",
            description = "With --fault: the hit rate is compared over windows of N updates (default: ${DEFAULT-VALUE}).")
    int hitWindow = 10;

    @Option(names = "--updates-csv", paramLabel = "FILE",
            description = "Write the steps' prefix hit tokens by update (and the faults) to this CSV file at the end.")
    Path updatesCsv;

    @Option(names = "--api-token-file", paramLabel = "FILE",
            description = "File holding the engines' API token (default: env KVPOOL_ENGINE_TOKEN_FILE or"
                    + " KVPOOL_ENGINE_TOKEN; none: the engines' APIs are open).")
    Path apiTokenFile;

    /** The most rollouts per engine per step: they are sent at once. */
    static final int MAX_ROLLOUTS = 1024;

    /** The most tokens of the task prefix and of a rollout. */
    static final int MAX_TOKENS = 1_000_000;

    /** One rollout's answer, with where it came from. */
    private record Rollout(String engine, String prompt, int weights, JsonNode answer) {
    }

    /** An HTTP answer whatever its status (racing rollouts may be refused). */
    private record Answer(int status, JsonNode body) {
    }

    private final RolloutTally tally = new RolloutTally();
    /** The recompute of each distinct prompt (its output tokens), by weights version: the current and the previous one. */
    @com.google.errorprone.annotations.concurrent.GuardedBy("recomputes")
    private final Map<Integer, Map<String, JsonNode>> recomputes = new LinkedHashMap<>();
    /** The weights the engines run now (1: their start-up weights; k: the seed the k-th version was loaded from). */
    private int version = 1;
    private List<String> prompts;
    private SplittableRandom random;
    /** Whether --freeze-pid is stopped now (read by the shutdown hook too). */
    private volatile boolean frozen;
    private long frozenAt;

    private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();
    /** Runs the concurrent calls: one virtual thread each, whatever the machine's core count. */
    private final ExecutorService calls = Executors.newVirtualThreadPerTaskExecutor();
    private final ObjectMapper json = new ObjectMapper();

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

    private void log(String fmt, Object... args) {
        System.out.println(LocalTime.now().format(DateTimeFormatter.ofPattern("HH:mm:ss.SSS")) + " trainer: "
                + String.format(Locale.ROOT, fmt, args));
        System.out.flush();
    }

    /** A line of the per-step and per-update log: not logged with --quiet. */
    private void detail(String fmt, Object... args) {
        if (!quiet) {
            log(fmt, args);
        }
    }

    /** POSTs and returns the answer whatever its status; a body that is not JSON throws, naming the endpoint. */
    private Answer send(String base, String path, String body) throws Exception {
        HttpResponse<String> r = http.send(authorized(HttpRequest.newBuilder(URI.create(base + path)))
                .timeout(Duration.ofMinutes(5)).POST(HttpRequest.BodyPublishers.ofString(body)).build(),
                HttpResponse.BodyHandlers.ofString());
        try {
            return new Answer(r.statusCode(), json.readTree(r.body()));
        } catch (com.fasterxml.jackson.core.JsonProcessingException e) {
            throw new IllegalStateException(base + path + " answered " + r.statusCode() + " with a body that is not JSON: "
                    + r.body());
        }
    }

    /** POSTs and returns the JSON answer; anything but 200 throws, naming the endpoint, the status and why. */
    private JsonNode post(String base, String path, String body) throws Exception {
        Answer a = send(base, path, body);
        if (a.status() != 200) {
            // errors carry {"error": {"message"}}; a failed reset carries {"success": false, "message"}
            JsonNode n = a.body();
            String why = n.path("error").path("message").asText(n.path("message").asText(n.toString()));
            throw new IllegalStateException(base + path + " answered " + a.status() + ": " + why);
        }
        return a.body();
    }

    private String get(String base, String path) throws Exception {
        HttpResponse<String> r = http.send(HttpRequest.newBuilder(URI.create(base + path)).timeout(Duration.ofMinutes(1))
                .GET().build(), HttpResponse.BodyHandlers.ofString());
        if (r.statusCode() != 200) {
            throw new IllegalStateException(base + path + " answered " + r.statusCode() + ": " + r.body());
        }
        return r.body();
    }

    /** A completion request: greedy, so a recompute under the same weights gives the same tokens. */
    private String completion(String prompt, int tokens, String cacheSalt) {
        ObjectNode b = json.createObjectNode().put("prompt", prompt).put("max_tokens", tokens).put("temperature", 0);
        if (cacheSalt != null) {
            b.put("cache_salt", cacheSalt);
        }
        return b.toString();
    }

    private <T> CompletableFuture<T> async(Callable<T> call) {
        return CompletableFuture.supplyAsync(() -> {
            try {
                return call.call();
            } catch (Exception ex) {
                throw new IllegalStateException(ex.getMessage(), ex);
            }
        }, calls);
    }

    /** The same call to every engine at once; their answers in engine order. */
    private List<JsonNode> onEveryEngine(String path, String body) {
        List<CompletableFuture<JsonNode>> all = new ArrayList<>();
        for (String e : engines) {
            all.add(async(() -> post(e, path, body)));
        }
        return all.stream().map(CompletableFuture::join).toList();
    }

    @Override
    public Integer call() throws Exception {
        if (!mode.equals("reset") && !mode.equals("versioned") && !mode.equals("none")) {
            throw new IllegalArgumentException("--mode must be reset, versioned or none, got " + mode);
        }
        if (steps < 1 || updateEvery < 1 || rollouts < 1 || prefixTokens < 1 || maxTokens < 1) {
            throw new IllegalArgumentException("--steps, --update-every, --rollouts, --prefix-tokens and --max-tokens must be >= 1");
        }
        if (fixedName && mode.equals("versioned")) {
            throw new IllegalArgumentException("--fixed-name with --mode versioned: versioned keys need a new name per version");
        }
        if (race && raceTokens < maxTokens) {
            throw new IllegalArgumentException("--race-tokens (" + raceTokens + ") must be at least --max-tokens (" + maxTokens + ")");
        }
        Bounds.range("--rollouts", rollouts, 1, MAX_ROLLOUTS, "sent to every engine at once each step");
        Bounds.range("--prefix-tokens", prefixTokens, 1, MAX_TOKENS, null);
        Bounds.range("--max-tokens", maxTokens, 1, MAX_TOKENS, null);
        Bounds.range("--race-tokens", raceTokens, 1, MAX_TOKENS, null);
        int updates = (steps - 1) / updateEvery;
        if (freezePid != null && freezePid <= 0) {
            throw new IllegalArgumentException("--freeze-pid: a process id, got " + freezePid);
        }
        if (freezePid != null && (freezeAtUpdate < 1 || freezeAtUpdate > updates)) {
            throw new IllegalArgumentException("--freeze-at-update: got " + freezeAtUpdate + ", but --steps " + steps
                    + " with --update-every " + updateEvery + " make " + updates + " weight update(s) to freeze at"
                    + " (counting from 1)");
        }
        Map<Integer, List<String>> faultsAt = new java.util.TreeMap<>();
        for (String f : faults) {
            int colon = f.indexOf(':');
            int at;
            try {
                at = colon < 1 ? -1 : Integer.parseInt(f.substring(0, colon).trim());
            } catch (NumberFormatException e) {
                at = -1;
            }
            if (at < 1 || at > updates || f.substring(colon + 1).isBlank()) {
                throw new IllegalArgumentException("--fault: K:COMMAND with K a weight update from 1 to " + updates
                        + " (--steps " + steps + ", --update-every " + updateEvery + "), got '" + f + "'");
            }
            faultsAt.computeIfAbsent(at, k -> new ArrayList<>()).add(f.substring(colon + 1).trim());
        }
        Bounds.range("--hit-window", hitWindow, 1, 1_000_000, null);
        if (resetRetry.isNegative()) {
            throw new IllegalArgumentException("--reset-retry: a duration of 0s or more, got " + Durations.format(resetRetry));
        }
        StringBuilder task = new StringBuilder();
        String[] words = "solve the task step by step using the tools given and report the final answer".split(" ");
        for (int i = 0; task.length() < prefixTokens; i++) {
            task.append(words[i % words.length]).append(' ');
        }
        String prefix = task.substring(0, prefixTokens);
        List<String> distinct = new ArrayList<>();
        for (int r = 0; r < Math.min(rollouts, 4); r++) {
            distinct.add(prefix + " problem " + r + ":");
        }
        prompts = List.copyOf(distinct);
        random = new SplittableRandom(seed);
        log("%d engines, %d rollouts each per step, update every %d steps (%d updates), mode %s%s%s", engines.size(),
                rollouts, updateEvery, updates, mode, verify ? ", verifying every output" : "",
                race ? ", rollouts racing each update (seed " + seed + ")" : "");
        long[] before = engineCounters();
        long t0 = System.nanoTime();
        // stopped by a signal while it holds a node stopped: the node is continued on the way out
        Thread thawOnExit = new Thread(() -> {
            if (frozen) {
                try {
                    signal("CONT");
                } catch (Exception e) {
                    System.err.println("kvpool trainer: could not continue pid " + freezePid + ": " + e.getMessage()
                            + "; continue it by hand: kill -CONT " + freezePid);
                }
            }
        }, "kvpool-trainer-thaw");
        if (freezePid != null) {
            Runtime.getRuntime().addShutdownHook(thawOnExit);
        }
        try {
            if (verify) {
                // an earlier run on this pool may have left KV under the names this one uses
                onEveryEngine("/reset_prefix_cache?reset_connector=true", "");
            }
            CompletableFuture<Void> recomputed = verify ? recompute(1) : null;
            for (int step = 1; step <= steps; step++) {
                boolean first = step == 1;
                if (step > 1 && (step - 1) % updateEvery == 0) {
                    first = true;
                    int update = version; // weight updates so far, this one included
                    if (freezePid != null && update == freezeAtUpdate) {
                        signal("STOP");
                        frozen = true;
                        frozenAt = System.nanoTime();
                        log("froze pid %d (a pool node) before the weight update", freezePid);
                    }
                    for (String f : faultsAt.getOrDefault(update, List.of())) {
                        fault(update, f);
                    }
                    tally.updateStarted(update, System.nanoTime());
                    update();
                    if (verify) {
                        recomputed = recompute(version); // runs alongside the step: salted, it shares no KV
                    }
                    if (quiet && update % 100 == 0) {
                        log("update %d of %d: %d rollouts completed, %d verified, %d stale; prefix hit %.1f%% overall,"
                                        + " %.1f%% in first steps", update, updates, tally.completed(), tally.verified,
                                tally.stale, tally.hitPercent(null), tally.hitPercent(RolloutTally.Phase.FIRST_STEP));
                    }
                }
                long s0 = System.nanoTime();
                List<Rollout> done = rollouts(prefix);
                tally.stepNanos += System.nanoTime() - s0;
                logStep(step, done, first ? RolloutTally.Phase.FIRST_STEP : RolloutTally.Phase.LATER_STEP);
                if (frozen) {
                    thaw(); // the first step under the new weights ran with the node stopped
                }
                if (verify) {
                    long w0 = System.nanoTime();
                    recomputed.join();
                    tally.referenceNanos += System.nanoTime() - w0;
                    int stale = 0;
                    for (Rollout r : done) {
                        stale += check("step " + step, r, false);
                    }
                    detail("step %2d  verified %d outputs, %d stale", step, done.size(), stale);
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
            calls.shutdown();
            if (freezePid != null) {
                try {
                    Runtime.getRuntime().removeShutdownHook(thawOnExit);
                } catch (IllegalStateException shuttingDown) {
                    // the hook runs
                }
            }
        }
        long wall = System.nanoTime() - t0;
        long[] after = engineCounters();
        for (String line : tally.summary(mode, wall, after[0] - before[0], after[1] - before[1], verify, race)) {
            log("%s", line);
        }
        if (!faults.isEmpty()) {
            for (String line : tally.faultSummary(hitWindow)) {
                log("%s", line);
            }
        }
        if (updatesCsv != null) {
            java.nio.file.Files.write(updatesCsv, tally.updatesCsv());
            log("hit tokens by update written to %s", updatesCsv);
        }
        if (verify) {
            log("stale outputs: %d of %d verified", tally.stale, tally.verified + tally.partialsChecked);
            return tally.stale > 0 ? 1 : 0;
        }
        return 0;
    }

    /** One step's rollouts: every engine in turn gets its batch, sent concurrently. */
    private List<Rollout> rollouts(String prefix) {
        // engines get their rollouts in turn, as a trainer dispatches batches: an engine later in the
        // step can restore from the pool what an earlier one saved
        List<Rollout> done = new ArrayList<>();
        for (String e : engines) {
            List<CompletableFuture<Rollout>> batch = new ArrayList<>();
            for (int r = 0; r < rollouts; r++) {
                String prompt = prompts.get(r % prompts.size());
                int weights = version;
                batch.add(async(() -> new Rollout(e, prompt, weights, post(e, "/v1/completions",
                        completion(prompt, maxTokens, null)))));
            }
            batch.forEach(c -> done.add(c.join()));
        }
        return done;
    }

    /** Counts the step's rollouts and logs its line: hit rate (local and pool) and TTFT over its rollouts only. */
    private void logStep(int step, List<Rollout> done, RolloutTally.Phase phase) {
        long prompt = 0;
        long local = 0;
        long external = 0;
        double[] ttft = new double[done.size()];
        String weights = "";
        for (int i = 0; i < done.size(); i++) {
            JsonNode n = done.get(i).answer();
            count(n, phase);
            prompt += n.path("usage").path("prompt_tokens").asLong();
            local += n.path("kvpool").path("prefix_cache_hit_tokens").asLong();
            external += n.path("kvpool").path("external_hit_tokens").asLong();
            ttft[i] = n.path("kvpool").path("ttft_ms").asDouble();
            weights = n.path("kvpool").path("weights_version").asText();
        }
        Arrays.sort(ttft);
        tally.stepUnder(version - 1, prompt, local, external);
        detail("step %2d  weights %s  rollouts %d  prefix hit %5.1f%% (local %5.1f%%, pool %5.1f%%)  ttft p50 %6.1f ms",
                step, weights, done.size(), 100.0 * (local + external) / prompt, 100.0 * local / prompt,
                100.0 * external / prompt, ttft[ttft.length / 2]);
    }

    private void count(JsonNode answer, RolloutTally.Phase phase) {
        tally.completed(phase, answer.path("usage").path("prompt_tokens").asLong(),
                answer.path("kvpool").path("prefix_cache_hit_tokens").asLong(),
                answer.path("kvpool").path("external_hit_tokens").asLong());
    }

    /** The output of a completion: its token ids. */
    private static JsonNode output(JsonNode answer) {
        return answer.path("choices").path(0).path("token_ids");
    }

    /** Tokens a recompute generates: as many as the longest rollout asks for. */
    private int recomputeTokens() {
        return race ? raceTokens : maxTokens;
    }

    /**
     * Recomputes each distinct prompt once under weights {@code weights}, which every engine must be running
     * now, with a fresh random cache_salt so that no cache can serve any of it; keeps the outputs for
     * {@link #check} when the returned future completes. Not part of the hit rates (its answers are
     * not rollouts); it may run alongside a step, since a salted request shares no KV with it.
     */
    private CompletableFuture<Void> recompute(int weights) {
        String name = name(weights);
        Map<String, CompletableFuture<JsonNode>> calls = new LinkedHashMap<>();
        int i = 0;
        for (String p : prompts) {
            String engine = engines.get(i++ % engines.size());
            String salt = "verify-" + UUID.randomUUID();
            calls.put(p, async(() -> post(engine, "/v1/completions", completion(p, recomputeTokens(), salt))));
        }
        return CompletableFuture.allOf(calls.values().toArray(CompletableFuture[]::new)).thenRun(() -> {
            Map<String, JsonNode> outputs = new HashMap<>();
            for (var c : calls.entrySet()) {
                JsonNode want = c.getValue().join();
                long hits = want.path("kvpool").path("prefix_cache_hit_tokens").asLong()
                        + want.path("kvpool").path("external_hit_tokens").asLong();
                if (hits != 0) {
                    throw new IllegalStateException("a recompute with a fresh cache_salt got " + hits + " cached tokens;"
                            + " the engine does not honour cache_salt, so nothing can be verified");
                }
                String got = want.path("kvpool").path("weights_version").asText();
                if (!got.equals(name)) {
                    throw new IllegalStateException("the recompute for weights " + name + " ran under " + got);
                }
                outputs.put(c.getKey(), output(want));
            }
            synchronized (recomputes) {
                recomputes.put(weights, outputs);
                while (recomputes.size() > 2) {
                    recomputes.remove(recomputes.keySet().iterator().next());
                }
                tally.references += outputs.size();
            }
        });
    }

    /**
     * Checks one rollout's output against the recompute of its prompt under the weights it ran with:
     * it must be the recompute's first tokens (all of them for a completed rollout, as many as it got
     * for an aborted one). Returns 1 if it is stale, else 0.
     */
    private int check(String where, Rollout r, boolean partial) {
        String version = r.answer().path("kvpool").path("weights_version").asText();
        if (!version.equals(name(r.weights()))) {
            throw new IllegalStateException(where + ": a rollout on " + r.engine() + " reports weights " + version
                    + ", but ran while the engines had " + name(r.weights()));
        }
        Map<String, JsonNode> outputs;
        String recomputed;
        synchronized (recomputes) { // written under this monitor by the recompute that may finish now
            outputs = recomputes.get(r.weights());
            recomputed = recomputes.keySet().toString();
        }
        if (outputs == null) {
            throw new IllegalStateException(where + ": a rollout on " + r.engine() + " ran under weights "
                    + r.weights() + ", which have no recompute (recomputed: " + recomputed + ")");
        }
        JsonNode want = outputs.get(r.prompt());
        JsonNode got = output(r.answer());
        boolean same = got.size() <= want.size();
        for (int i = 0; same && i < got.size(); i++) {
            same = got.get(i).asInt() == want.get(i).asInt();
        }
        if (partial) {
            tally.partialsChecked++;
        } else {
            tally.verified++;
        }
        if (same) {
            return 0;
        }
        tally.stale++;
        log("stale output: %s, %s, weights %s (seed %d)%s (hit tokens: local %d, pool %d): got %s, a recompute gives %s",
                where, r.engine(), version, r.weights(), partial ? " (aborted, partial)" : "",
                r.answer().path("kvpool").path("prefix_cache_hit_tokens").asLong(),
                r.answer().path("kvpool").path("external_hit_tokens").asLong(), got, want);
        return 1;
    }

    /** Between tries of a failed reset cascade (--reset-retry). */
    static final Duration RESET_RETRY_PAUSE = Duration.ofMillis(500);

    /**
     * The reset cascade on one engine: {@code reset} answers the engine's JSON ({@code success},
     * {@code removed}, {@code message}) or throws IllegalStateException (the engine answered an error).
     * A failure is tried again after {@code pause} while less than {@code retryFor} has passed since
     * {@code startNanos} (the engines stay paused meanwhile: nothing runs over the old KV); then it
     * throws, naming the engine and why. Returns {objects removed, tries again}.
     */
    static long[] resetCascade(Callable<JsonNode> reset, String engine, long startNanos, Duration retryFor, Duration pause,
                               java.util.function.Consumer<String> log) throws Exception {
        int retries = 0;
        while (true) {
            String failure;
            try {
                JsonNode r = reset.call();
                if (r.path("success").asBoolean()) {
                    return new long[]{r.path("removed").asLong(), retries};
                }
                failure = engine + ": " + r.path("message").asText(r.toString());
            } catch (IllegalStateException ex) {
                failure = ex.getMessage();
            }
            long spent = System.nanoTime() - startNanos;
            if (spent >= retryFor.toNanos()) {
                throw new IllegalStateException("reset cascade failed" + (retries > 0 ? " (tried " + (retries + 1)
                        + " times in " + spent / 1_000_000 + " ms)" : "") + ", stopping (KV of the old weights could be"
                        + " served): " + failure);
            }
            retries++;
            log.accept("reset cascade failed (" + failure + "); the engines stay paused; trying again (--reset-retry "
                    + Durations.format(retryFor) + ")");
            Thread.sleep(pause.toMillis());
        }
    }

    /** The most a --fault command may take to inject its fault (it leaves the rest in the background). */
    static final Duration FAULT_TIMEOUT = Duration.ofMinutes(2);

    /** Runs a --fault command before weight update {@code update} and waits for it; anything but exit 0 stops the run. */
    private void fault(int update, String command) throws Exception {
        String clock = LocalTime.now().format(DateTimeFormatter.ofPattern("HH:mm:ss.SSS"));
        long at = System.nanoTime();
        log("fault at update %d: running %s", update, command);
        Process p = new ProcessBuilder("bash", "-c", command).inheritIO().start();
        if (!p.waitFor(FAULT_TIMEOUT.toSeconds(), java.util.concurrent.TimeUnit.SECONDS)) {
            p.destroyForcibly();
            throw new IllegalStateException("fault at update " + update + ": '" + command + "' did not finish within "
                    + FAULT_TIMEOUT.toSeconds() + " s (stopped); the drill is void");
        }
        if (p.exitValue() != 0) {
            throw new IllegalStateException("fault at update " + update + ": '" + command + "' exited " + p.exitValue()
                    + "; the drill is void");
        }
        log("fault at update %d injected in %d ms; going on", update, (System.nanoTime() - at) / 1_000_000);
        tally.fault(update, command, at, clock);
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

    /** A racing rollout: sent at once, its answer whatever the status. */
    private CompletableFuture<Rollout> raceOne(String engine) {
        String prompt = prompts.get(random.nextInt(prompts.size()));
        int weights = version;
        int tokens = maxTokens + random.nextInt(raceTokens - maxTokens + 1);
        return async(() -> {
            Answer a = send(engine, "/v1/completions", completion(prompt, tokens, null));
            String reason = a.body().path("choices").path(0).path("finish_reason").asText();
            if (a.status() != 200 && !(reason.equals("abort") && a.body().has("error"))) {
                throw new IllegalStateException(engine + "/v1/completions answered " + a.status() + " to a rollout racing"
                        + " an update: " + a.body());
            }
            return new Rollout(engine, prompt, weights, a.body());
        });
    }

    /** Polls the engines' /health until one has a request in flight, or every racing rollout is over (bounded: 10 s). */
    private void awaitInFlight(List<CompletableFuture<Rollout>> racing) throws Exception {
        long deadline = System.nanoTime() + 10_000_000_000L;
        while (System.nanoTime() < deadline && !racing.stream().allMatch(CompletableFuture::isDone)) {
            for (String e : engines) {
                if (json.readTree(get(e, "/health")).path("in_flight").asInt() > 0) {
                    return;
                }
            }
        }
    }

    /** Sorts the racing rollouts, all over now (the engines are paused), by outcome, and checks their outputs. */
    private void settle(String where, List<CompletableFuture<Rollout>> racing) {
        for (CompletableFuture<Rollout> f : racing) {
            Rollout r = f.join();
            tally.raced++;
            String reason = r.answer().path("choices").path(0).path("finish_reason").asText();
            if (!reason.equals("abort")) {
                tally.racedCompleted++;
                count(r.answer(), RolloutTally.Phase.RACING);
                if (verify) {
                    check(where, r, false);
                }
            } else if (r.answer().has("error")) {
                tally.racedRefused++; // the engine was paused already: never admitted
            } else {
                tally.racedAborted++;
                if (verify) {
                    check(where, r, true);
                }
            }
        }
    }

    /** The version name weights {@code k} are loaded under. */
    private String name(int k) {
        return fixedName ? "v1" : "v" + k;
    }

    /** Loads the next weights (seed: their number) on every engine, with the remedy of --mode. */
    private void update() throws Exception {
        int next = version + 1;
        String v = name(next);
        long t0 = System.nanoTime();
        List<CompletableFuture<Rollout>> racing = new ArrayList<>();
        if (race) {
            for (String e : engines) {
                for (int r = 0; r < rollouts; r++) {
                    racing.add(raceOne(e));
                }
            }
            awaitInFlight(racing);
            for (String e : engines) {
                racing.add(raceOne(e)); // on its way with the pause
            }
        }
        List<JsonNode> paused = onEveryEngine("/pause_generation?mode=abort", "");
        int aborted = 0;
        int saves = 0;
        for (JsonNode p : paused) {
            aborted += p.path("aborted").asInt();
            saves += p.path("saves_in_flight").asInt();
        }
        detail("weight update to %s%s: paused %d engines (%d rollouts in flight aborted, %d block saves in flight)", v,
                fixedName ? " (weights " + next + ", under the start-up name)" : "", engines.size(), aborted, saves);
        long raced = tally.raced;
        long completed = tally.racedCompleted;
        long refused = tally.racedRefused;
        settle("racing the update to weights " + next, racing);
        if (race) {
            detail("racing rollouts: %d sent, %d completed before the pause, %d refused while paused", tally.raced - raced,
                    tally.racedCompleted - completed, tally.racedRefused - refused);
        }
        onEveryEngine("/update_weights", json.createObjectNode().put("seed", next).put("version", v).toString());
        version = next;
        detail("weights %s loaded on every engine", v);
        if (mode.equals("reset")) {
            long removed = 0;
            long r0 = System.nanoTime();
            int retries = 0;
            for (String e : engines) {
                // a reset that did not succeed may leave KV of the old weights servable: never go on (the engines
                // stay paused); with --reset-retry, try the whole cascade on that engine again meanwhile
                long[] done = resetCascade(() -> post(e, "/reset_prefix_cache?reset_connector=true", ""), e, r0,
                        resetRetry, RESET_RETRY_PAUSE, m -> log("%s", m));
                removed += done[0];
                retries += (int) done[1];
            }
            tally.resetRetried(retries);
            detail("reset cascade done in %d ms: local prefix caches and the pool emptied (%d blocks removed)",
                    (System.nanoTime() - r0) / 1_000_000, removed);
        } else if (mode.equals("versioned")) {
            detail("versioned keys: engines now use %s keys; old keys are unreachable and reclaimed in the background", v);
        } else {
            detail("no remedy (mode none): the pool keeps the KV of the old weights under the same keys");
        }
        onEveryEngine("/resume", "");
        tally.update(System.nanoTime() - t0, aborted, saves);
        detail("resumed");
    }

    /** Sums of the engines' dropped saves and failed loads (their /metrics counters). */
    private long[] engineCounters() throws Exception {
        long[] sums = new long[2];
        for (String e : engines) {
            for (String line : get(e, "/metrics").split("\n")) {
                if (line.startsWith("engine_kv_saves_dropped_total ")) {
                    sums[0] += (long) Double.parseDouble(line.substring(line.indexOf(' ') + 1).trim());
                } else if (line.startsWith("engine_load_failures_total ")) {
                    sums[1] += (long) Double.parseDouble(line.substring(line.indexOf(' ') + 1).trim());
                }
            }
        }
        return sums;
    }
}
