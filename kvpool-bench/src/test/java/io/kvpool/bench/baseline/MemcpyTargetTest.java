package io.kvpool.bench.baseline;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.kvpool.bench.Measurement;

import java.time.Duration;

import org.junit.jupiter.api.Test;

class MemcpyTargetTest {

    private static final Duration WARMUP = Duration.ofMillis(20);
    private static final Duration RUN = Duration.ofMillis(150);

    @Test
    void getsAndPutsCountTheValueSizePerOperation() throws Exception {
        try (MemcpyTarget t = new MemcpyTarget(64L << 20)) {
            assertThat(t.name()).isEqualTo("memcpy");
            for (int clients : new int[] {1, 2}) {
                for (int size : new int[] {4096, 1 << 20, 100_000}) {
                    Measurement g = t.get(size, clients, WARMUP, RUN);
                    assertThat(g.ops()).isPositive();
                    assertThat(g.bytes()).isEqualTo(g.ops() * size);
                    assertThat(g.latenciesNanos()).hasSize((int) g.ops());
                    Measurement p = t.put(size, clients, WARMUP, RUN);
                    assertThat(p.ops()).isPositive();
                    assertThat(p.bytes()).isEqualTo(p.ops() * size);
                }
            }
        }
    }

    @Test
    void aValueAsLargeAsTheRegionFits() throws Exception {
        try (MemcpyTarget t = new MemcpyTarget(1L << 20)) {
            Measurement g = t.get(1 << 20, 1, Duration.ZERO, Duration.ofMillis(20));
            assertThat(g.bytes()).isEqualTo(g.ops() << 20);
        }
    }

    @Test
    void rejectsSizesThatDoNotFit() {
        try (MemcpyTarget t = new MemcpyTarget(1L << 20)) {
            assertThatThrownBy(() -> t.get((1 << 20) + 1, 1, Duration.ZERO, RUN))
                    .isInstanceOf(IllegalArgumentException.class);
            assertThatThrownBy(() -> t.put(0, 1, Duration.ZERO, RUN))
                    .isInstanceOf(IllegalArgumentException.class);
        }
    }
}
