package io.kvpool.engine;

import io.kvpool.connector.ConnectorMeta;
import io.kvpool.connector.ConnectorRequest;
import io.kvpool.connector.ResetResult;
import io.kvpool.connector.ScheduledRequest;
import io.kvpool.engine.llama.ModelConfig;
import io.kvpool.engine.llama.Weights;
import org.junit.jupiter.api.Test;

import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * What a pause reports (requests aborted, saves still in flight), and pauses that overlap. The
 * connector here holds the step thread at its first layer when told to, so a pause is queued while a
 * request is certainly running, and keeps every save in flight until released: nothing depends on
 * timing.
 */
class EnginePauseTest {

    private static final ModelConfig MODEL = ModelConfig.tiny();

    private static Engine engine(HeldSaves c) {
        return new Engine(EngineConfig.defaults().withNumBlocks(64), MODEL, Weights.random(MODEL, 1), "v1", c);
    }

    private static int[] prompt(int n, char first) {
        int[] p = new int[n];
        for (int i = 0; i < n; i++) {
            p[i] = first + i % 26;
        }
        return p;
    }

    @Test
    void aPauseReportsTheRequestsItAbortedAndTheSavesStillInFlight() throws Exception {
        HeldSaves c = new HeldSaves();
        try (Engine e = engine(c)) {
            // 40 tokens: two full blocks of 16 fill in the prefill, and their saves stay in flight
            assertThat(e.generate(prompt(40, 'a'), SamplingParams.greedy(2), null).get(30, TimeUnit.SECONDS).ok()).isTrue();
            assertThat(c.savesInFlight()).isEqualTo(2);
            c.holdNextStep();
            // another prefix (no local hit): its first block fills in this step
            CompletableFuture<Completion> running = e.generate(prompt(20, 'A'), SamplingParams.greedy(500), null);
            assertThat(c.stepHeld.await(30, TimeUnit.SECONDS)).as("the second request's step started").isTrue();
            CompletableFuture<Engine.Paused> pause = e.pauseGeneration(false, true);
            c.releaseStep();
            Engine.Paused p = pause.get(30, TimeUnit.SECONDS);
            assertThat(p.aborted()).as("the running request").isEqualTo(1);
            assertThat(p.savesInFlight()).as("the first request's two blocks and the second's first").isEqualTo(3);
            assertThat(p.reset().success()).isTrue();
            assertThat(running.get(30, TimeUnit.SECONDS).finishReason()).isEqualTo(FinishReason.ABORT);
            c.releaseSaves();
            e.resume();
            assertThat(e.pauseGeneration(false, true).get(30, TimeUnit.SECONDS))
                    .as("nothing in flight any more").isEqualTo(new Engine.Paused(ResetResult.ok(0), 0, 0));
        }
    }

    /** Before the fix, the first pause's future never completed: the second one replaced it. */
    @Test
    void aSecondPauseWhileTheFirstDrainsCompletesBoth() throws Exception {
        HeldSaves c = new HeldSaves();
        try (Engine e = engine(c)) {
            c.holdNextStep();
            CompletableFuture<Completion> running = e.generate(prompt(20, 'A'), SamplingParams.greedy(4), null);
            assertThat(c.stepHeld.await(30, TimeUnit.SECONDS)).isTrue();
            CompletableFuture<Engine.Paused> first = e.pauseGeneration(false, false); // drain
            CompletableFuture<Engine.Paused> second = e.pauseGeneration(false, false);
            c.releaseStep();
            assertThat(second.get(30, TimeUnit.SECONDS).aborted()).isZero();
            assertThat(first.get(30, TimeUnit.SECONDS)).as("the first caller hears the pause too").isNotNull();
            assertThat(running.get(30, TimeUnit.SECONDS).finishReason()).as("drained, not aborted")
                    .isEqualTo(FinishReason.LENGTH);
            assertThat(e.isPaused()).isTrue();
        }
    }

    /** No matches; every block that fills is a save held in flight until {@link #releaseSaves}. */
    private static final class HeldSaves extends EmptyConnector {
        private final Map<String, Integer> pending = new HashMap<>();
        private final Set<String> finishedWithSaves = new HashSet<>();
        private final Set<String> done = new HashSet<>();
        private volatile CountDownLatch hold;
        final CountDownLatch stepHeld = new CountDownLatch(1);

        void holdNextStep() {
            hold = new CountDownLatch(1);
        }

        void releaseStep() {
            hold.countDown();
        }

        synchronized void releaseSaves() {
            pending.clear();
            done.addAll(finishedWithSaves);
            finishedWithSaves.clear();
        }

        @Override
        public synchronized ConnectorMeta buildConnectorMeta(List<ScheduledRequest> scheduled) {
            for (ScheduledRequest s : scheduled) {
                int filled = s.computedAfter() / 16 - s.computedBefore() / 16;
                if (filled > 0) {
                    pending.merge(s.request().id(), filled, Integer::sum);
                }
            }
            return ConnectorMeta.EMPTY;
        }

        @Override
        public synchronized boolean requestFinished(ConnectorRequest r, int[] blockIds) {
            if (pending.containsKey(r.id())) {
                finishedWithSaves.add(r.id());
                return true;
            }
            return false;
        }

        @Override
        public void waitForLayerLoad(int layer) {
            CountDownLatch h = hold;
            if (h != null) {
                stepHeld.countDown();
                try {
                    h.await();
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
                hold = null;
            }
        }

        @Override
        public synchronized Set<String> getFinished(Set<String> finished) {
            Set<String> out = Set.copyOf(done);
            done.clear();
            return out;
        }

        @Override
        public synchronized int savesInFlight() {
            return pending.values().stream().mapToInt(Integer::intValue).sum();
        }
    }
}
