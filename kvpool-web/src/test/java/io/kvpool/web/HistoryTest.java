package io.kvpool.web;

import com.fasterxml.jackson.databind.JsonNode;
import org.junit.jupiter.api.Test;

import java.util.concurrent.atomic.AtomicLong;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

class HistoryTest {

    @Test
    void ratesAreTheCounterDeltaOverTheSampleGapAndGaugesAreAsRead() {
        AtomicLong puts = new AtomicLong();
        AtomicLong used = new AtomicLong();
        History h = History.builder().chart("ops", "Operations", Unit.PER_SECOND).rate("puts", "puts", puts::get)
                .chart("mem", "Memory", Unit.BYTES).gauge("used", "used", used::get).build(4);
        h.sample(1_000);
        assertThat(h.latest("puts")).isNaN(); // no rate before a second sample
        puts.set(10);
        used.set(7);
        h.sample(3_000); // 10 puts over 2 s
        assertThat(h.latest("puts")).isEqualTo(5.0);
        assertThat(h.latest("used")).isEqualTo(7.0);
        puts.set(4); // a counter that went back (a restarted source): a gap, not a negative rate
        h.sample(4_000);
        assertThat(h.latest("puts")).isNaN();
        puts.set(6);
        h.sample(5_000);
        assertThat(h.latest("puts")).isEqualTo(2.0);
    }

    @Test
    void theRingKeepsTheNewestSamplesOldestFirst() {
        AtomicLong v = new AtomicLong();
        History h = History.builder().chart("c", "C", Unit.COUNT).gauge("v", "v", v::get).build(3);
        for (int i = 1; i <= 5; i++) {
            v.set(i * 10);
            h.sample(i * 1000L);
        }
        JsonNode j = h.toJson();
        assertThat(j.get("t").toString()).isEqualTo("[3000,4000,5000]");
        assertThat(j.at("/charts/0/series/0/values").toString()).isEqualTo("[30.0,40.0,50.0]");
        assertThat(j.at("/charts/0/unit").asText()).isEqualTo("count");
        assertThat(h.size()).isEqualTo(3);
    }

    @Test
    void aTimeThatDoesNotMoveForwardIsIgnoredAndAFailingSourceLeavesAGap() {
        AtomicLong v = new AtomicLong(1);
        History h = History.builder().chart("c", "C", Unit.COUNT).gauge("v", "v", v::get)
                .gauge("bad", "bad", () -> {
                    throw new IllegalStateException("not now");
                }).build(4);
        h.sample(2000);
        h.sample(2000);
        h.sample(1000);
        assertThat(h.size()).isEqualTo(1);
        assertThat(h.toJson().at("/charts/0/series/1/values").toString()).isEqualTo("[null]");
        assertThatThrownBy(() -> h.latest("nope")).hasMessageContaining("no series 'nope'");
        assertThatThrownBy(() -> History.builder().gauge("x", "x", () -> 1)).hasMessageContaining("add a chart");
    }
}
