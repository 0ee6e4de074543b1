package io.kvpool.master.events;

import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;

/** The master's side of the publisher never waits: a full queue drops and counts. */
class EventQueueTest {

    @Test
    void aFullQueueDropsAndCountsAndNeverBlocks() {
        EventQueue q = new EventQueue(4);
        byte[] key = {'k'};
        // nobody takes from the queue: every offer past the fourth must return at once, dropped
        for (int i = 0; i < 10; i++) {
            q.stored(List.of(key), Medium.CPU);
        }
        q.allCleared();
        assertThat(q.size()).isEqualTo(4);
        assertThat(q.dropped()).isEqualTo(7);
        List<KvEvent> got = new ArrayList<>();
        assertThat(q.drainTo(got, 100)).isEqualTo(4);
        assertThat(got).allMatch(e -> e instanceof KvEvent.Stored s && s.medium() == Medium.CPU);
        q.removed(List.of(key), Medium.STORAGE);
        assertThat(q.size()).as("room again once taken").isOne();
        assertThat(q.dropped()).isEqualTo(7);
    }
}
