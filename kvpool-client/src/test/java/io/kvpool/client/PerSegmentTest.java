package io.kvpool.client;

import org.junit.jupiter.api.Test;

import java.util.concurrent.atomic.AtomicIntegerArray;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** Parts run once each, on at most the lanes asked for, and a part's failure reaches the caller. */
class PerSegmentTest {

    @Test
    void everyPartRunsExactlyOnce() {
        try (PerSegment tasks = new PerSegment()) {
            for (int lanes : new int[]{1, 2, 4, 100}) {
                AtomicIntegerArray runs = new AtomicIntegerArray(37);
                tasks.runParts(37, lanes, p -> runs.incrementAndGet(p));
                for (int p = 0; p < 37; p++) {
                    assertThat(runs.get(p)).as("part %d with %d lanes", p, lanes).isEqualTo(1);
                }
            }
            tasks.runParts(0, 4, p -> {
                throw new AssertionError("no parts");
            });
        }
    }

    @Test
    void oneLaneRunsOnTheCallersThreadInOrder() {
        try (PerSegment tasks = new PerSegment()) {
            Thread caller = Thread.currentThread();
            StringBuilder order = new StringBuilder();
            tasks.runParts(5, 1, p -> {
                assertThat(Thread.currentThread()).isSameAs(caller);
                order.append(p);
            });
            assertThat(order).hasToString("01234");
        }
    }

    @Test
    void aFailingPartIsRethrownAfterTheOthersStopped() {
        try (PerSegment tasks = new PerSegment()) {
            assertThatThrownBy(() -> tasks.runParts(20, 4, p -> {
                if (p == 3) {
                    throw new IllegalStateException("part 3");
                }
            })).isInstanceOf(IllegalStateException.class).hasMessage("part 3");
        }
    }
}
