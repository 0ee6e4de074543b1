package io.kvpool.cli;

import org.junit.jupiter.api.Test;

import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;

/** The trainer's hit rate by update with faults: baseline, the dip after each fault, when it was back. */
class RolloutTallyTest {

    /** A step of 100 prompt tokens under update {@code u}: {@code local} and {@code pool} of them hit. */
    private static void step(RolloutTally t, int u, int local, int pool) {
        t.stepUnder(u, 100, local, pool);
    }

    @Test
    void withoutFaultsThereIsNoFaultSummary() {
        RolloutTally t = new RolloutTally();
        step(t, 0, 50, 0);
        assertThat(t.faultSummary(10)).isEmpty();
    }

    @Test
    void aFaultsDipAndRecoveryAreMeasuredAgainstTheBaselinesWindows() {
        RolloutTally t = new RolloutTally();
        // updates 1 to 19 alternate between 70% and 80% (two steps each: 60 + 10 pool, or 70 + 10 pool)
        for (int u = 0; u <= 40; u++) {
            long at = u * 1_000_000_000L; // an update a second
            if (u > 0) {
                t.updateStarted(u, at);
            }
            if (u == 20) {
                t.fault(20, "/some/dir/rl-fault.sh kill-node", at - 1, "12:00:00.000");
            }
            boolean hurt = u >= 20 && u < 24; // the pool is gone for four updates: no pool hits
            int local = u % 2 == 0 ? 60 : 70;
            step(t, u, local, hurt ? 0 : 10);
            step(t, u, local, hurt ? 0 : 10);
        }
        List<String> s = t.faultSummary(4);
        assertThat(s).hasSize(2);
        assertThat(s.get(0)).contains("baseline, updates 1 to 19 (before the first fault): 75.3% (local 65.3%, pool 10.0%)")
                .contains("its windows of 4 updates 75.0% to 75.0%, 4.0 s each (median)");
        // the first window from the fault: 65%; the span is five windows (20 updates); 4 updates of 200
        // tokens lost 10 points each: 80 tokens, and the rest is at the alternating rate
        assertThat(s.get(1)).startsWith("summary: fault 1 at update 20 (12:00:00.000), rl-fault.sh kill-node:")
                .contains("first 4 updates 65.0% (local 65.0%, pool 0.0%) in 4.0 s; no pool hit until update 24 (4 updates, 4.0 s after"
                        + " the fault);").contains("updates 20 to 39 73.0% (local 65.0%, pool 8.0%)")
                .contains("back to the baseline's lowest window (75.0%) from update 24, 4 updates and 4.0 s after the fault");
    }

    @Test
    void aFaultWithoutADipSaysSoAndOneThatNeverRecoversToo() {
        RolloutTally t = new RolloutTally();
        for (int u = 0; u <= 30; u++) {
            t.updateStarted(u, u);
            step(t, u, 50, u >= 20 ? 0 : 25); // from update 20 on, the pool never hits again
        }
        t.fault(10, "freeze", 10, "12:00:00.000");
        t.fault(20, "kill-leader", 20, "12:00:01.000");
        List<String> s = t.faultSummary(5);
        assertThat(s.get(0)).contains("baseline, updates 1 to 9").contains("75.0% to 75.0%");
        assertThat(s.get(1)).contains("fault 1 at update 10").contains("updates 10 to 19 75.0%")
                .contains("+0.0 points against the baseline (0 prompt tokens fewer hit)")
                .contains("the pool hit from its first update;").contains("its first window not below the baseline's lowest (75.0%)");
        assertThat(s.get(2)).contains("fault 2 at update 20").contains("updates 20 to 30 50.0%")
                .contains("-25.0 points against the baseline (275 prompt tokens fewer hit)")
                .contains("no pool hit through update 30;").contains("not back to the baseline's lowest window (75.0%) by update 30");
    }

    @Test
    void theCsvHasALinePerUpdateWithItsTimeAndFault() {
        RolloutTally t = new RolloutTally();
        for (int u = 0; u <= 2; u++) {
            if (u > 0) {
                t.updateStarted(u, 5_000_000_000L + u * 1_500_000_000L);
            }
            step(t, u, 40 + u, u);
        }
        t.fault(2, "/x/rl-fault.sh kill-node", 0, "12:00:00.000");
        assertThat(t.updatesCsv()).containsExactly("update,started_s,prompt_tokens,local_hit_tokens,pool_hit_tokens,fault",
                "0,,100,40,0,", "1,0.000,100,41,1,", "2,1.500,100,42,2,rl-fault.sh kill-node");
    }

    @Test
    void aFaultAtTheFirstUpdateHasNoBaseline() {
        RolloutTally t = new RolloutTally();
        for (int u = 0; u <= 3; u++) {
            step(t, u, 50, 0);
        }
        t.fault(1, "x", 0, "12:00:00.000");
        assertThat(t.faultSummary(2)).first().asString().contains("no baseline");
    }
}
