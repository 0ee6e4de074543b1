package io.kvpool.bench.soak;

import org.junit.jupiter.api.Test;

import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;

/** The soak's value encoding and its model of what a read may return. */
class SoakModelTest {

    private final SoakValues values = new SoakValues(32, 4096);

    @Test
    void aValueNamesItsVersionAndEveryFlippedByteCounts() {
        byte[] v = values.valueOf("soak/g0/k1", 42);
        assertThat(v.length).isEqualTo(values.sizeOf("soak/g0/k1", 42)).isBetween(32, 4096);
        assertThat(values.check("soak/g0/k1", v)).isEqualTo(new SoakValues.Checked(42, 0));
        v[v.length - 1] ^= 1;
        v[SoakValues.HEADER] ^= (byte) 0x80;
        assertThat(values.check("soak/g0/k1", v).wrongBytes()).isEqualTo(2);
        // another key's value, a cut value, garbage: no version, and bytes counted wrong
        assertThat(values.check("soak/g0/k2", values.valueOf("soak/g0/k1", 42)).version()).isEqualTo(-1);
        byte[] cut = java.util.Arrays.copyOf(values.valueOf("soak/g0/k1", 42), 20);
        assertThat(values.check("soak/g0/k1", cut).wrongBytes()).isEqualTo(20);
        assertThat(values.check("soak/g0/k1", new byte[100]).wrongBytes()).isEqualTo(100);
    }

    /** A history driven by hand: operations' times are the clock when begin and finish are called. */
    @Test
    void aRemovalThatReturnedBeforeAReadMakesTheOldVersionStaleButARacingOneDoesNot() throws Exception {
        String k = "soak/g0/k0";
        History h = new History(List.of(k));
        History.Op put = h.begin(k, History.Kind.PUT, 1);
        put.finish(History.Outcome.STORED, true);
        long afterPut = tick();
        assertThat(h.judge(k, 1, afterPut, tick())).isEqualTo(History.Verdict.HIT);
        assertThat(h.judge(k, -1, afterPut, tick())).as("acknowledged, nothing removed it")
                .isEqualTo(History.Verdict.ACKNOWLEDGED_MISS);
        assertThat(h.judge(k, 7, afterPut, tick())).as("never put").isEqualTo(History.Verdict.PHANTOM);

        long readStart = tick();
        History.Op racing = h.begin(k, History.Kind.REMOVE, 0);
        tick();
        racing.finish(History.Outcome.DONE, false);
        long readEnd = tick();
        assertThat(h.judge(k, 1, readStart, readEnd)).as("removal overlapping the read").isEqualTo(History.Verdict.HIT);
        assertThat(h.judge(k, -1, readStart, readEnd)).isEqualTo(History.Verdict.MISS);
        assertThat(h.judge(k, 1, tick(), tick())).as("read after the removal returned").isEqualTo(History.Verdict.STALE);

        History.Op refused = h.begin(k, History.Kind.PUT, 2);
        refused.finish(History.Outcome.NOT_STORED, false);
        assertThat(h.judge(k, 2, tick(), tick())).isEqualTo(History.Verdict.REFUSED_VISIBLE);
        History.Op threw = h.begin(k, History.Kind.PUT, 3);
        threw.finish(History.Outcome.THREW, false);
        assertThat(h.judge(k, 3, tick(), tick())).as("a put that threw may have stored").isEqualTo(History.Verdict.HIT);
        assertThat(h.mustExist(k)).as("the last acknowledged put was removed").isFalse();

        History.Op again = h.begin(k, History.Kind.PUT, 4);
        again.finish(History.Outcome.STORED, true);
        tick();
        assertThat(h.mustExist(k)).isTrue();
        assertThat(h.judge(k, 4, tick(), tick())).isEqualTo(History.Verdict.HIT);
    }

    @Test
    void aRemovalThatThrewIsNoProofButExcusesAMiss() throws Exception {
        String k = "soak/g0/k0";
        History h = new History(List.of(k));
        h.begin(k, History.Kind.PUT, 1).finish(History.Outcome.STORED, true);
        tick();
        h.begin(k, History.Kind.REMOVE, 0).finish(History.Outcome.THREW, false);
        assertThat(h.judge(k, 1, tick(), tick())).isEqualTo(History.Verdict.HIT);
        assertThat(h.judge(k, -1, tick(), tick())).isEqualTo(History.Verdict.MISS);
        assertThat(h.mustExist(k)).isFalse();
    }

    /** Moves the clock on: System.nanoTime advances by at least a microsecond. */
    private static long tick() throws InterruptedException {
        long t = System.nanoTime();
        while (System.nanoTime() - t < 1000) {
            Thread.onSpinWait();
        }
        return System.nanoTime();
    }
}
