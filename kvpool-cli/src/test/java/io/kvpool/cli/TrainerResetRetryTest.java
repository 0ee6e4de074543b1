package io.kvpool.cli;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.junit.jupiter.api.Test;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** The trainer's reset cascade on one engine: a failure stops the run, or with --reset-retry is tried again. */
class TrainerResetRetryTest {

    private static final ObjectMapper JSON = new ObjectMapper();

    private static JsonNode ok(long removed) {
        return JSON.createObjectNode().put("success", true).put("removed", removed);
    }

    @Test
    void withoutRetryAFailureStopsAtOnceNamingWhy() {
        AtomicInteger calls = new AtomicInteger();
        assertThatThrownBy(() -> TrainerCommand.resetCascade(() -> {
            calls.incrementAndGet();
            throw new IllegalStateException("http://e1/reset_prefix_cache answered 500: kvpool reset failed: master gone");
        }, "http://e1", System.nanoTime(), Duration.ZERO, Duration.ZERO, m -> { }))
                .isInstanceOf(IllegalStateException.class)
                .hasMessage("reset cascade failed, stopping (KV of the old weights could be served): http://e1/reset_prefix_cache"
                        + " answered 500: kvpool reset failed: master gone");
        assertThat(calls).hasValue(1);
    }

    @Test
    void withRetryFailuresAreTriedAgainUntilOneSucceeds() throws Exception {
        AtomicInteger calls = new AtomicInteger();
        List<String> logged = new ArrayList<>();
        long[] done = TrainerCommand.resetCascade(() -> {
            int n = calls.incrementAndGet();
            if (n == 1) {
                throw new IllegalStateException("answered 500: kvpool reset failed: connection closed");
            }
            // a 200 that says it did not succeed counts as a failure too
            return n == 2 ? JSON.createObjectNode().put("success", false).put("message", "not yet") : ok(42);
        }, "http://e1", System.nanoTime(), Duration.ofHours(1), Duration.ZERO, logged::add);
        assertThat(done).containsExactly(42, 2);
        assertThat(logged).hasSize(2);
        assertThat(logged.get(0)).contains("connection closed").contains("the engines stay paused; trying again");
        assertThat(logged.get(1)).contains("http://e1: not yet");
    }

    @Test
    void withRetryAFailureThatOutlastsTheBudgetStopsTheRunSayingHowOftenItTried() {
        AtomicInteger calls = new AtomicInteger();
        long longAgo = System.nanoTime() - Duration.ofMinutes(2).toNanos(); // the budget is spent after the first try
        assertThatThrownBy(() -> TrainerCommand.resetCascade(() -> {
            calls.incrementAndGet();
            throw new IllegalStateException("still failing");
        }, "http://e1", longAgo, Duration.ofMinutes(1), Duration.ZERO, m -> { }))
                .hasMessageStartingWith("reset cascade failed, stopping").hasMessageEndingWith("still failing");
        assertThat(calls).hasValue(1);
    }
}
