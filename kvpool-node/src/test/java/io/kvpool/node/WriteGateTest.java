package io.kvpool.node;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The node's write gate (issue 32): writes only while a registration is served; a registration (or a
 * stop) closes it after the writes in flight end, and one that outlives the wait never becomes
 * readable after the gate closed.
 */
@Timeout(60) // a guard against hangs only; no assertion depends on timing
class WriteGateTest {

    private static final byte[] KEY = "k".getBytes(StandardCharsets.UTF_8);

    private Arena arena;
    private RegionLedger ledger;
    private WriteGate gate;

    @BeforeEach
    void setUp() {
        arena = Arena.ofShared();
        MemorySegment memory = arena.allocate(1 << 16, 64);
        ledger = new RegionLedger(memory);
        gate = new WriteGate(ledger);
    }

    @AfterEach
    void tearDown() {
        arena.close();
    }

    private RegionLedger.Region admit(long offset, long generation) throws InterruptedException {
        return ledger.beginWrite(offset, 1024, generation, 0, KEY, 960, Duration.ZERO).region();
    }

    @Test
    void closedUntilOpenedAndAgainWhileClosing() throws Exception {
        assertThat(gate.enter()).as("not registered yet").isFalse();
        gate.open();
        assertThat(gate.enter()).isTrue();
        gate.exit();
        assertThat(gate.close(Duration.ZERO)).isTrue();
        assertThat(gate.enter()).isFalse();
        assertThat(gate.carryOn()).as("a continuation after the close").isFalse();
        gate.open();
        assertThat(gate.enter()).isTrue();
        gate.exit();
    }

    @Test
    void aRegistrationWaitsForTheWritesInFlightAndTheyAreInItsSnapshot() throws Exception {
        gate.open();
        assertThat(gate.enter()).isTrue();
        RegionLedger.Region r = admit(0, 7);
        CountDownLatch closing = new CountDownLatch(1);
        CompletableFuture<Boolean> closed = CompletableFuture.supplyAsync(() -> {
            closing.countDown();
            try {
                return gate.close(Duration.ofSeconds(30));
            } catch (InterruptedException e) {
                throw new IllegalStateException(e);
            }
        });
        closing.await();
        // the write in flight ends while the registration waits
        assertThat(gate.endWrite(r, true)).isTrue();
        gate.exit();
        assertThat(closed.get()).isTrue();
        assertThat(ledger.completeRegions()).extracting(x -> x.generation).containsExactly(7L);
    }

    @Test
    void aWriteStillRunningWhenTheWaitRanOutNeverBecomesReadable() throws Exception {
        gate.open();
        assertThat(gate.enter()).isTrue();
        RegionLedger.Region r = admit(0, 7);
        assertThat(gate.close(Duration.ofMillis(1))).as("the wait ran out").isFalse();
        int snapshot = ledger.completeRegions().size(); // what the registration lists
        assertThat(gate.endWrite(r, true)).as("too late: the inventory was taken without it").isFalse();
        gate.exit();
        assertThat(snapshot).isZero();
        assertThat(ledger.beginRead(0, 7)).isNull();
        assertThat(ledger.objectCount()).isZero();
    }

    @Test
    void aDrainedGateNeverOpensAgain() throws Exception {
        gate.open();
        assertThat(gate.drain(Duration.ZERO)).isTrue();
        gate.open();
        assertThat(gate.enter()).isFalse();
        assertThat(gate.draining()).isTrue();
    }
}
