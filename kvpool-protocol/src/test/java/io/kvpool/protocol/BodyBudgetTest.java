package io.kvpool.protocol;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * {@link BodyBudget} on its own: whole reservations served in the order they were asked for, a
 * waiting reservation refused as a value when its wait ends, and nobody left waiting for room that
 * is free. Every assertion waits for a state (a thread parked, a reservation granted), never for a
 * clock; the class timeout only guards against hangs.
 */
@Timeout(60)
class BodyBudgetTest {

    private static final Duration LONG = Duration.ofSeconds(30);

    /** Asks for {@code n} bytes on a platform thread of its own (so its state can be watched). */
    private static Taker take(BodyBudget budget, int n, Duration wait) {
        CompletableFuture<Boolean> granted = new CompletableFuture<>();
        Thread t = Thread.ofPlatform().daemon().name("taker-" + n).start(() -> {
            try {
                granted.complete(budget.take(n, wait));
            } catch (Throwable e) {
                granted.completeExceptionally(e);
            }
        });
        return new Taker(t, granted);
    }

    private record Taker(Thread thread, CompletableFuture<Boolean> granted) {
        /** Waits until the taker is parked inside the budget, waiting for room. */
        Taker parked() throws InterruptedException {
            while (thread.getState() != Thread.State.TIMED_WAITING && !granted.isDone()) {
                Thread.sleep(2);
            }
            assertThat(granted).as("%s should be waiting", thread.getName()).isNotDone();
            return this;
        }

        boolean result() throws Exception {
            return granted.get(LONG.toSeconds(), TimeUnit.SECONDS);
        }
    }

    @Test
    void aSmallerReservationWaitsBehindALargerOneAskedForFirst() throws Exception {
        BodyBudget budget = new BodyBudget(100, "this test's");
        assertThat(budget.take(60, Duration.ZERO)).isTrue();
        Taker large = take(budget, 80, LONG).parked();
        // 40 bytes are free and 30 would fit, but the larger body asked first: served in order, a stream
        // of small bodies cannot starve a large one
        assertThat(budget.take(30, Duration.ZERO)).as("a small reservation overtaking a waiting large one").isFalse();
        Taker small = take(budget, 30, LONG).parked();
        budget.give(60);
        assertThat(large.result()).isTrue();
        assertThat(small.granted()).as("30 more do not fit beside the 80 granted").isNotDone();
        budget.give(80);
        assertThat(small.result()).isTrue();
        assertThat(budget.inUse()).isEqualTo(30);
        assertThat(budget.peak()).isEqualTo(80);
    }

    @Test
    void aReservationWhoseWaitEndsIsRefusedAndTheOneBehindItIsServed() throws Exception {
        BodyBudget budget = new BodyBudget(100, "this test's");
        assertThat(budget.take(60, Duration.ZERO)).isTrue();
        // the head of the line gives up (its wait is short; when it ends does not matter to the outcome)
        Taker large = take(budget, 80, Duration.ofMillis(200)).parked();
        Taker small = take(budget, 30, LONG);
        assertThat(large.result()).as("80 bytes never came free within its wait").isFalse();
        // the 40 free bytes go to the next in line without anything being given back
        assertThat(small.result()).isTrue();
        assertThat(budget.inUse()).isEqualTo(90);
    }

    @Test
    void aRefusedReservationTakesNothing() throws Exception {
        BodyBudget budget = new BodyBudget(1 << 20, "this test's");
        assertThat(budget.take(1 << 20, Duration.ZERO)).isTrue();
        assertThat(budget.take(1, Duration.ofMillis(20))).isFalse();
        assertThat(budget.inUse()).isEqualTo(1 << 20);
        budget.give(1 << 20);
        assertThat(budget.inUse()).isZero();
        assertThat(budget.take(1 << 20, Duration.ZERO)).isTrue();
    }
}
