package io.kvpool.cli;

import io.kvpool.client.KvPoolClient;
import io.kvpool.config.Size;
import io.kvpool.connector.PoolConnector;
import io.kvpool.connector.hash.BlockHasher;
import io.kvpool.connector.hash.KeyFormat;
import io.kvpool.engine.Completion;
import io.kvpool.engine.Engine;
import io.kvpool.engine.EngineConfig;
import io.kvpool.engine.llama.ModelConfig;
import io.kvpool.engine.llama.Weights;
import io.kvpool.engine.workload.ChatWorkload;
import io.kvpool.engine.workload.WorkloadRunner;
import io.kvpool.master.MasterConfig;
import io.kvpool.node.NodeConfig;
import me.tongfei.progressbar.ProgressBar;
import me.tongfei.progressbar.ProgressBarBuilder;
import me.tongfei.progressbar.ProgressBarStyle;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

import java.util.Arrays;
import java.util.HashMap;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.Callable;

/**
 * {@code kvpool demo}: the reference engine on a multi-turn chat workload, run twice on the same
 * requests: first with only its own prefix cache, then with an embedded kvpool behind it. Prints
 * time to first token, throughput, hit rates and tokens restored from the pool against tokens
 * computed; exits 1 if any answer differs between the two runs (greedy decoding: KV loaded from the
 * pool must give exactly what recomputing gives).
 */
@Command(name = "demo", mixinStandardHelpOptions = true,
        description = "Run the reference engine on a multi-turn chat workload without and with an embedded pool.")
final class DemoCommand implements Callable<Integer> {

    @Option(names = "--conversations", paramLabel = "N", description = "Conversations (default: ${DEFAULT-VALUE}).")
    int conversations = 20;

    @Option(names = "--turns", paramLabel = "N", description = "Turns per conversation (default: ${DEFAULT-VALUE}).")
    int turns = 6;

    @Option(names = "--concurrency", paramLabel = "N", description = "Conversations in flight at once (default: ${DEFAULT-VALUE}).")
    int concurrency = 4;

    @Option(names = "--system-prompts", paramLabel = "N", description = "Distinct shared system prompts (default: ${DEFAULT-VALUE}).")
    int systemPrompts = 2;

    @Option(names = "--system-tokens", paramLabel = "N", description = "Tokens per system prompt (default: ${DEFAULT-VALUE}).")
    int systemTokens = 256;

    @Option(names = "--user-tokens", paramLabel = "N", description = "Tokens per user message (default: ${DEFAULT-VALUE}).")
    int userTokens = 64;

    @Option(names = "--answer-tokens", paramLabel = "N", description = "Tokens per answer (default: ${DEFAULT-VALUE}).")
    int answerTokens = 16;

    @Option(names = "--pool-size", paramLabel = "SIZE", description = "Memory of the embedded node (default: 1GiB).")
    Size poolSize = Size.ofGiB(1);

    @Mixin
    EngineOptions engine;

    /** The most conversations and turns: every request's completion is kept to compare the two runs. */
    static final int MAX_REQUESTS = 1_000_000;

    /** The most conversations in flight: one thread each. */
    static final int MAX_CONCURRENCY = 1024;

    @Override
    public Integer call() throws Exception {
        Bounds.range("--conversations", conversations, 1, MAX_REQUESTS, null);
        Bounds.range("--turns", turns, 1, MAX_REQUESTS, null);
        engine.granularity(); // a bad --kv-granularity before anything starts
        Bounds.productAtMost("--conversations", conversations, "--turns", turns, MAX_REQUESTS, "requests",
                "every completion is kept to compare the two runs");
        Bounds.range("--concurrency", concurrency, 1, MAX_CONCURRENCY, "a thread each");
        Bounds.range("--system-prompts", systemPrompts, 1, MAX_REQUESTS, null);
        Bounds.atLeast("--system-tokens", systemTokens, 0);
        Bounds.atLeast("--user-tokens", userTokens, 1);
        Bounds.atLeast("--answer-tokens", answerTokens, 1);
        ModelConfig mc = engine.modelConfig();
        // in long: a large --turns must not wrap around into a prompt that seems to fit
        long longest = 1L + systemTokens + (long) turns * userTokens + (long) (turns - 1) * answerTokens;
        if (longest + answerTokens > mc.maxSeqLen()) {
            throw new IllegalArgumentException("--system-tokens " + systemTokens + ", --turns " + turns + ", --user-tokens "
                    + userTokens + " and --answer-tokens " + answerTokens + " make a longest prompt of " + longest
                    + " tokens, which with its answer does not fit the model's context (" + mc.maxSeqLen() + ")");
        }
        Bounds.sizeAtLeast("--pool-size", poolSize, 1 << 20);
        Bounds.fitsMemory("--pool-size " + poolSize, poolSize.bytes());
        ChatWorkload w = new ChatWorkload(conversations, turns, systemPrompts, systemTokens, userTokens, answerTokens,
                concurrency, 42);
        Weights weights = engine.weights(mc);
        EngineConfig ec = engine.engineConfig(mc, 160);
        System.out.printf(Locale.ROOT, "kvpool demo: %s (%d layers, dim %d), %d KV blocks of %d tokens;"
                        + " %d conversations x %d turns, %d at a time, prompts up to %d tokens%n", ec.modelName(),
                mc.nLayers(), mc.dim(), ec.numBlocks(), ec.blockSize(), conversations, turns, concurrency,
                w.maxPromptTokens());

        WorkloadRunner.Result without;
        try (Engine e = new Engine(ec, mc, weights, engine.weightsVersion, null)) {
            without = run("without pool", e, w);
        }
        WorkloadRunner.Result with;
        MasterConfig masterConfig = MasterConfig.defaults().withListen("127.0.0.1", 0, 0)
                .withSummaryInterval(java.time.Duration.ZERO);
        try (OnExit exit = OnExit.start("demo", NodeConfig.DEFAULT_SHM_DIR)) { // on SIGTERM too
            EmbeddedPool pool = exit.add(new EmbeddedPool(masterConfig,
                    m -> NodeConfig.defaults(m, poolSize).withListen("127.0.0.1", 0)));
            try (KvPoolClient client = KvPoolClient.connect(pool.masterAddress());
                 Engine e = new Engine(ec, mc, weights, engine.weightsVersion, new PoolConnector(client,
                         new BlockHasher(ec.blockSize(), ec.hashSeed()), KeyFormat.of(ec.modelName(),
                         engine.weightsVersion, "f32"), PoolConnector.ResetScope.ALL_FENCED, engine.granularity()))) {
                with = run("with kvpool", e, w);
                e.connector().waitForSave();
            }
        }
        long kvPerToken = 2L * mc.nLayers() * mc.nKvHeads() * mc.headDim() * Float.BYTES;
        print(without, with, kvPerToken);
        int differ = compare(without, with);
        if (differ > 0) {
            System.out.printf("FAILED: %d answers differ between the two runs%n", differ);
            return 1;
        }
        if (without.failed() + with.failed() > 0) {
            System.out.printf("FAILED: %d requests failed%n", without.failed() + with.failed());
            return 1;
        }
        System.out.println("every answer is identical in both runs");
        return 0;
    }

    private WorkloadRunner.Result run(String name, Engine e, ChatWorkload w) throws Exception {
        try (ProgressBar bar = new ProgressBarBuilder().setTaskName(name).setInitialMax((long) w.conversations() * w.turns())
                .setStyle(ProgressBarStyle.ASCII).setUpdateIntervalMillis(200).continuousUpdate().build()) {
            return WorkloadRunner.run(e, w, bar::stepTo);
        }
    }

    private static void print(WorkloadRunner.Result a, WorkloadRunner.Result b, long kvPerToken) {
        String row = "%-28s %14s %14s %10s%n";
        System.out.printf(Locale.ROOT, row, "", "without pool", "with kvpool", "ratio");
        line(row, "TTFT p50 (ms)", a.ttftMillis(0.5), b.ttftMillis(0.5));
        line(row, "TTFT p90 (ms)", a.ttftMillis(0.9), b.ttftMillis(0.9));
        line(row, "wall time (s)", a.wallNanos() / 1e9, b.wallNanos() / 1e9);
        line(row, "output tokens/s", a.outputTokensPerSecond(), b.outputTokensPerSecond());
        line(row, "requests/s", a.requestsPerSecond(), b.requestsPerSecond());
        System.out.printf(Locale.ROOT, row, "prompt hit rate", pct(a.hitRate()), pct(b.hitRate()), "");
        System.out.printf(Locale.ROOT, row, "  local prefix cache tokens", a.localHitTokens(), b.localHitTokens(), "");
        System.out.printf(Locale.ROOT, row, "  restored from pool tokens", a.restoredTokens(), b.restoredTokens(), "");
        System.out.printf(Locale.ROOT, row, "prompt tokens computed", a.recomputedTokens(), b.recomputedTokens(), "");
        System.out.printf(Locale.ROOT, "KV per token %d bytes; restored %s from the pool%n", kvPerToken,
                Size.human(b.restoredTokens() * kvPerToken));
    }

    private static void line(String row, String name, double x, double y) {
        System.out.printf(Locale.ROOT, row, name, String.format(Locale.ROOT, "%.1f", x), String.format(Locale.ROOT, "%.1f", y),
                String.format(Locale.ROOT, "%.2fx", y / x));
    }

    private static String pct(double f) {
        return String.format(Locale.ROOT, "%.1f%%", 100 * f);
    }

    /** Answers to the same prompt must be the same in both runs. */
    private static int compare(WorkloadRunner.Result a, WorkloadRunner.Result b) {
        Map<String, int[]> first = new HashMap<>();
        for (Completion c : a.completions()) {
            first.put(Arrays.toString(c.promptTokens()), c.outputTokens());
        }
        int differ = 0;
        for (Completion c : b.completions()) {
            int[] o = first.get(Arrays.toString(c.promptTokens()));
            if (o == null || !Arrays.equals(o, c.outputTokens())) {
                differ++;
            }
        }
        return differ;
    }
}
