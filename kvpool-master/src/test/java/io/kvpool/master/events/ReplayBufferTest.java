package io.kvpool.master.events;

import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;

/** The replay ring keeps the newest batches, oldest first, from a start sequence on. */
class ReplayBufferTest {

    private static List<Long> from(ReplayBuffer b, long start) {
        List<Long> out = new ArrayList<>();
        b.forEachFrom(start, (seq, payload) -> {
            assertThat(payload).containsExactly((byte) seq);
            out.add(seq);
        });
        return out;
    }

    @Test
    void keepsTheNewestBatches() {
        ReplayBuffer b = new ReplayBuffer(3);
        assertThat(from(b, 0)).isEmpty();
        for (long s = 10; s < 15; s++) {
            b.add(s, new byte[]{(byte) s});
        }
        assertThat(b.size()).isEqualTo(3);
        assertThat(from(b, 0)).containsExactly(12L, 13L, 14L);
        assertThat(from(b, 13)).containsExactly(13L, 14L);
        assertThat(from(b, 15)).isEmpty();
        assertThat(from(b, -1)).as("2^64 - 1, unsigned: past everything").isEmpty();
    }
}
