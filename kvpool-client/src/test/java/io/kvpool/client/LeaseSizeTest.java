package io.kvpool.client;

import org.junit.jupiter.api.Test;

import static org.assertj.core.api.Assertions.assertThat;

/** How much a write lease asks for, as leases are used up quickly, slowly, or let go idle. */
class LeaseSizeTest {

    private static final long MIB = 1L << 20;

    @Test
    void startsAtTheBaseAndNeverAsksForLessThanTheBatch() {
        LeaseSize s = new LeaseSize();
        assertThat(s.bytes(MIB)).isEqualTo(32 * MIB);
        assertThat(s.generations(1)).isEqualTo(1024);
        assertThat(s.bytes(100 * MIB)).as("a batch larger than the ask").isEqualTo(100 * MIB);
        assertThat(s.generations(5000)).isEqualTo(5000);
    }

    @Test
    void aStreamingWriterDoublesItsAskUpToEightTimes() {
        LeaseSize s = new LeaseSize();
        long[] asks = new long[5];
        for (int i = 0; i < asks.length; i++) {
            s.usedUp(LeaseSize.FAST_NANOS - 1);
            asks[i] = s.bytes(0);
        }
        assertThat(asks).containsExactly(64 * MIB, 128 * MIB, 256 * MIB, 256 * MIB, 256 * MIB);
        assertThat(s.generations(0)).isEqualTo(8 * 1024);
    }

    @Test
    void aLeaseUsedUpInAboutASecondOrMoreLeavesTheAskAlone() {
        LeaseSize s = new LeaseSize();
        s.usedUp(0);
        s.usedUp(LeaseSize.FAST_NANOS); // not under a second: no growth
        s.usedUp(LeaseSize.SLOW_NANOS); // not over ten: no shrink
        assertThat(s.factor()).isEqualTo(2);
    }

    @Test
    void aSlowLeaseHalvesTheAskAndAnIdleOneResetsIt() {
        LeaseSize s = new LeaseSize();
        for (int i = 0; i < 3; i++) {
            s.usedUp(0);
        }
        assertThat(s.factor()).isEqualTo(8);
        s.usedUp(LeaseSize.SLOW_NANOS + 1);
        assertThat(s.factor()).isEqualTo(4);
        s.idled();
        assertThat(s.factor()).isEqualTo(1);
        s.usedUp(LeaseSize.SLOW_NANOS + 1);
        assertThat(s.factor()).as("never under 1").isEqualTo(1);
    }
}
