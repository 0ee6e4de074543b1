package io.kvpool.connector;

import org.junit.jupiter.api.Test;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.AbstractExecutorService;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** {@link LoadBudget}, {@link PoolBreaker} and {@link PrefillRate} on a clock the test moves. */
class LoadBudgetTest {

    private final AtomicLong now = new AtomicLong(1_000);

    @Test
    void aPoolThatMissedADeadlineIsLeftAloneAndProbedOffTheRequestsPathWithABackoffThatDoubles() {
        List<Runnable> started = new ArrayList<>(); // probes the breaker started, run when the test says
        PoolBreaker b = new PoolBreaker(now::get, started::add);
        AtomicBoolean answers = new AtomicBoolean(false);
        AtomicInteger asked = new AtomicInteger();
        PoolBreaker.Probe probe = () -> {
            asked.incrementAndGet();
            if (!answers.get()) {
                throw new IllegalStateException("still frozen");
            }
            return true;
        };
        assertThat(b.admit()).isTrue();
        b.failed("test", probe);
        assertThat(b.admit()).isFalse();
        assertThat(b.isClosed()).isFalse();
        now.addAndGet(PoolBreaker.FIRST_BACKOFF_NANOS - 1);
        assertThat(b.admit()).isFalse();
        assertThat(started).as("no probe before the backoff passed").isEmpty();
        now.addAndGet(1);
        assertThat(b.admit()).as("the request never waits for the probe").isFalse();
        assertThat(b.admit()).isFalse();
        assertThat(started).as("one probe at a time").hasSize(1);
        started.removeFirst().run(); // it fails: the backoff doubles, from now
        assertThat(asked).hasValue(1);
        now.addAndGet(2 * PoolBreaker.FIRST_BACKOFF_NANOS - 1);
        assertThat(b.admit()).isFalse();
        assertThat(started).isEmpty();
        now.addAndGet(1);
        assertThat(b.admit()).isFalse();
        for (int i = 0; i < 10; i++) {
            started.removeFirst().run();
            now.addAndGet(PoolBreaker.MAX_BACKOFF_NANOS);
            assertThat(b.admit()).as("the backoff stops at 30 s").isFalse();
        }
        answers.set(true);
        started.removeFirst().run();
        assertThat(b.isClosed()).isTrue();
        assertThat(b.admit()).isTrue();
        assertThat(b.skipped()).isEqualTo(16);
        assertThat(b.trips()).isEqualTo(1);
        b.failed("again", probe); // closed before: the backoff starts over at 1 s
        now.addAndGet(PoolBreaker.FIRST_BACKOFF_NANOS);
        assertThat(b.admit()).isFalse();
        assertThat(started).hasSize(1);
        b.succeeded(); // loads landed meanwhile
        assertThat(b.admit()).isTrue();
    }

    @Test
    void theMeasuredPrefillRateGivesTheTimeRecomputingWouldTake() {
        PrefillRate r = new PrefillRate();
        assertThat(r.deadlineNanos(100, 1)).as("unknown before any step").isEqualTo(-1);
        r.observe(128, 128 * 50_000L); // 50 µs a token
        assertThat(r.deadlineNanos(100, 1)).as("unknown before 256 tokens were timed").isEqualTo(-1);
        r.observe(128, 128 * 50_000L);
        assertThat(r.deadlineNanos(100, 1)).isEqualTo(100 * 50_000L);
        assertThat(r.deadlineNanos(100, 0.5)).isEqualTo(50 * 50_000L);
        assertThat(r.deadlineNanos(1, 0.01)).as("never below the floor").isEqualTo(PrefillRate.FLOOR_NANOS);
        for (int i = 0; i < 200; i++) {
            r.observe(2048, 2048 * 20_000L); // the engine got faster: the estimate follows
        }
        assertThat(r.nanosPerToken()).isBetween(19_999.0, 20_100.0);
        r.observe(0, 5);
        r.observe(5, 0);
        assertThat(r.nanosPerToken()).as("empty steps are not counted").isBetween(19_999.0, 20_100.0);
    }

    @Test
    void theShorterOfTheBudgetAndTheMeasuredTimeHoldsAndSlowLookupsAreMisses() throws Exception {
        LoadBudget b = new LoadBudget(now::get, Runnable::run); // probes inline
        assertThat(b.active()).isFalse();
        assertThat(b.deadlineNanos(1000)).isEqualTo(-1);
        SwitchableIo io = new SwitchableIo();
        try {
            assertThat(b.lookup(() -> {
                throw new IllegalStateException("no master");
            }, 10, io, 0)).as("without a deadline a failure is a miss, the pool stays in use").isZero();
            assertThat(b.admit()).isTrue();

            b.fixed(Duration.ofMillis(300));
            assertThat(b.deadlineNanos(1000)).isEqualTo(300_000_000L);
            b.fromPrefill(1.0);
            b.planned(512);
            b.started(false);
            now.addAndGet(512 * 100_000L); // 100 µs a token
            b.layerDone(3, 4);
            assertThat(b.deadlineNanos(1000)).as("recomputing 1000 tokens: 100 ms, under the budget")
                    .isEqualTo(100_000_000L);
            assertThat(b.deadlineNanos(10_000)).as("the budget is shorter").isEqualTo(300_000_000L);

            b.planned(512);
            b.started(true); // a step with loads is not timed
            now.addAndGet(512 * 900_000L);
            b.layerDone(3, 4);
            assertThat(b.deadlineNanos(1000)).isEqualTo(100_000_000L);

            CountDownLatch hold = new CountDownLatch(1);
            assertThat(b.lookup(() -> {
                await(hold);
                return 7;
            }, 1, io, 0)).as("a lookup past its deadline is a miss").isZero();
            hold.countDown();
            assertThat(b.admit()).as("and the pool is left alone").isFalse();
            assertThat(b.poolInUse()).isFalse();
            now.addAndGet(PoolBreaker.FIRST_BACKOFF_NANOS);
            // the probe waits for its lookup in real time, at most the deadline (100 µs here): a lookup on a thread
            // of its own could miss that on a busy machine (it did, once in a fresh clone), so it runs inline
            io.inline = true;
            assertThat(b.admit()).as("the probe (the lookup again, answering now) runs off the request").isFalse();
            assertThat(b.poolInUse()).isTrue();
            assertThat(b.admit()).isTrue();
            b.abandoned(2, () -> false);
            assertThat(b.poolInUse()).isFalse();
            b.landed();
            assertThat(b.poolInUse()).isTrue();
        } finally {
            io.shutdownNow();
        }
        assertThatThrownBy(() -> b.fromPrefill(0)).hasMessageContaining("(0, 100]");
        assertThatThrownBy(() -> b.fixed(Duration.ZERO)).hasMessageContaining("must be positive");
    }

    /** Tasks on virtual threads, or, once {@code inline}, on the submitting thread (done when submit returns). */
    private static final class SwitchableIo extends AbstractExecutorService {
        volatile boolean inline;
        private final ExecutorService threads = Executors.newVirtualThreadPerTaskExecutor();

        @Override
        public void execute(Runnable task) {
            if (inline) {
                task.run();
            } else {
                threads.execute(task);
            }
        }

        @Override
        public void shutdown() {
            threads.shutdown();
        }

        @Override
        public List<Runnable> shutdownNow() {
            return threads.shutdownNow();
        }

        @Override
        public boolean isShutdown() {
            return threads.isShutdown();
        }

        @Override
        public boolean isTerminated() {
            return threads.isTerminated();
        }

        @Override
        public boolean awaitTermination(long timeout, TimeUnit unit) throws InterruptedException {
            return threads.awaitTermination(timeout, unit);
        }
    }

    private static void await(CountDownLatch l) {
        try {
            l.await(30, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
