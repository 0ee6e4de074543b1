package io.kvpool.master;

import io.kvpool.master.events.KvEventPublisher;
import io.kvpool.master.events.KvEventsConfig;
import org.junit.jupiter.api.Test;

import java.time.Duration;

import static org.assertj.core.api.Assertions.assertThat;

/** The server's side of KV events: on when configured, numbered from its leadership's start. */
class MasterKvEventsTest {

    private static MasterConfig config(long term, KvEventsConfig events) {
        return MasterConfig.defaults().withListen("127.0.0.1", 0, -1).withSummaryInterval(Duration.ZERO).withTerm(term)
                .withReadLease(MasterConfig.MIN_READ_LEASE)
                .withKvEvents(events);
    }

    /** A reset is one event; returns the sequence number of the batch it went out in. */
    private static long resetAndAwaitItsBatch(MasterServer m) throws InterruptedException {
        m.service().removeAll(true);
        long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
        while (m.kvEvents().lastSequence() < 0) {
            assertThat(System.nanoTime()).as("the reset is published").isLessThan(deadline);
            Thread.sleep(10);
        }
        return m.kvEvents().lastSequence();
    }

    @Test
    void aLaterLeadershipNumbersItsBatchesAboveAnEarlierOnes() throws Exception {
        KvEventsConfig on = KvEventsConfig.at("tcp://127.0.0.1:*");
        long earlier;
        try (MasterServer m = new MasterServer(config(3, on))) {
            earlier = resetAndAwaitItsBatch(m);
            assertThat(earlier).isEqualTo(KvEventPublisher.firstSequence(3));
        }
        try (MasterServer m = new MasterServer(config(4, on))) {
            assertThat(resetAndAwaitItsBatch(m)).isGreaterThan(earlier).isEqualTo(4L << 32);
        }
    }

    @Test
    void offByDefault() throws Exception {
        try (MasterServer m = new MasterServer(config(0, KvEventsConfig.OFF))) {
            assertThat(m.kvEvents()).isNull();
            m.service().removeAll(true);
        }
    }
}
