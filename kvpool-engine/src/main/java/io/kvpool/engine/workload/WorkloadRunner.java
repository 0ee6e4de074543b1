package io.kvpool.engine.workload;

import io.kvpool.engine.Completion;
import io.kvpool.engine.Engine;
import io.kvpool.engine.SamplingParams;
import io.kvpool.engine.llama.ByteTokenizer;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.IntConsumer;

/** Drives an engine with a {@link ChatWorkload} and summarises what happened. */
public final class WorkloadRunner {

    /**
     * What a run measured.
     *
     * @param completions     every request, in completion order
     * @param wallNanos       from the first request to the last answer
     */
    public record Result(List<Completion> completions, long wallNanos) {

        public double ttftMillis(double q) {
            long[] t = completions.stream().mapToLong(Completion::ttftNanos).filter(x -> x >= 0).sorted().toArray();
            if (t.length == 0) {
                return Double.NaN;
            }
            return t[(int) Math.min(t.length - 1, Math.max(0, Math.ceil(q * t.length) - 1))] / 1e6;
        }

        public long promptTokens() {
            return completions.stream().mapToLong(c -> c.promptTokens().length).sum();
        }

        public long outputTokens() {
            return completions.stream().mapToLong(c -> c.outputTokens().length).sum();
        }

        public long localHitTokens() {
            return completions.stream().mapToLong(Completion::localHitTokens).sum();
        }

        /** Prompt tokens whose KV was loaded from the pool instead of computed. */
        public long restoredTokens() {
            return completions.stream().mapToLong(Completion::externalHitTokens).sum();
        }

        /** Prompt tokens computed (not from either cache), recomputation after failed loads included. */
        public long recomputedTokens() {
            return completions.stream().mapToLong(c -> c.promptTokens().length - c.localHitTokens()
                    - c.externalHitTokens() + c.recomputedTokens()).sum();
        }

        public double hitRate() {
            long p = promptTokens();
            return p == 0 ? 0 : (double) (localHitTokens() + restoredTokens()) / p;
        }

        public double outputTokensPerSecond() {
            return outputTokens() / (wallNanos / 1e9);
        }

        public double requestsPerSecond() {
            return completions.size() / (wallNanos / 1e9);
        }

        public long failed() {
            return completions.stream().filter(c -> !c.ok()).count();
        }
    }

    private WorkloadRunner() {
    }

    /**
     * Runs the workload in rounds, as chat traffic arrives: round t sends turn t of every conversation
     * ({@code concurrency} at a time), so between two turns of a conversation every other
     * conversation has run; its history is then found in whichever cache kept it. {@code progress}
     * is told each finished request's number (any thread).
     */
    public static Result run(Engine engine, ChatWorkload w, IntConsumer progress) throws Exception {
        ByteTokenizer tok = new ByteTokenizer();
        List<Completion> done = Collections.synchronizedList(new ArrayList<>());
        AtomicInteger finished = new AtomicInteger();
        int[][] history = new int[w.conversations()][];
        boolean[] alive = new boolean[w.conversations()];
        for (int c = 0; c < w.conversations(); c++) {
            history[c] = tok.encode(w.systemPrompt(c), true);
            alive[c] = true;
        }
        long t0 = System.nanoTime();
        try (ExecutorService pool = Executors.newVirtualThreadPerTaskExecutor()) {
            for (int t = 0; t < w.turns(); t++) {
                int turn = t;
                AtomicInteger next = new AtomicInteger();
                List<Future<?>> workers = new ArrayList<>();
                for (int k = 0; k < w.concurrency(); k++) {
                    workers.add(pool.submit(() -> {
                        for (int c = next.getAndIncrement(); c < w.conversations(); c = next.getAndIncrement()) {
                            if (!alive[c]) {
                                continue;
                            }
                            int[] prompt = concat(history[c], tok.encode(w.userMessage(c, turn), false));
                            Completion r = engine.generate(prompt, new SamplingParams(w.answerTokens(), 0, 1, c, false),
                                    null).get();
                            done.add(r);
                            progress.accept(finished.incrementAndGet());
                            if (r.ok()) {
                                history[c] = concat(prompt, r.outputTokens());
                            } else {
                                alive[c] = false; // a failed turn ends its conversation
                            }
                        }
                        return null;
                    }));
                }
                for (Future<?> f : workers) {
                    f.get();
                }
            }
        }
        return new Result(List.copyOf(done), System.nanoTime() - t0);
    }

    static int[] concat(int[] a, int[] b) {
        int[] out = Arrays.copyOf(a, a.length + b.length);
        System.arraycopy(b, 0, out, a.length, b.length);
        return out;
    }
}
