package io.kvpool.node;

import io.kvpool.protocol.ObjectLayout;
import io.kvpool.protocol.ResultCode;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Queue;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReferenceArray;

import static org.assertj.core.api.Assertions.assertThat;

@Timeout(60) // a guard against hangs only; no assertion depends on timing
class RegionLedgerTest {

    private static final Duration NO_WAIT = Duration.ZERO;
    private static final Duration SHORT = Duration.ofMillis(50);
    private static final byte[] KEY = "k".getBytes(StandardCharsets.UTF_8);

    private Arena arena;
    private MemorySegment memory;
    private RegionLedger ledger;

    @BeforeEach
    void setUp() {
        arena = Arena.ofConfined();
        memory = arena.allocate(1 << 16, 64);
        ledger = new RegionLedger(memory);
    }

    @AfterEach
    void tearDown() {
        arena.close();
    }

    private RegionLedger.Region admit(long offset, long length, long generation, long epoch) throws InterruptedException {
        RegionLedger.WriteAdmission a = ledger.beginWrite(offset, length, generation, epoch, KEY, length - 64, NO_WAIT);
        assertThat(a.refusal()).as("write of [%d, %d) gen %d", offset, offset + length, generation).isNull();
        assertThat(a.region()).isNotNull();
        return a.region();
    }

    /** Writes a complete, readable region. */
    private RegionLedger.Region store(long offset, long length, long generation) throws InterruptedException {
        RegionLedger.Region r = admit(offset, length, generation, ledger.epoch());
        ObjectLayout.writeHeader(memory, offset, ObjectLayout.STATE_WRITING, KEY, length - 64, generation,
                ledger.epoch(), 0);
        assertThat(ledger.endWrite(r, true)).isTrue();
        return r;
    }

    /** Sets a lease range aside, with no wait, with generations 1 to 1000. */
    private RegionLedger.LeaseRange lease(long offset, long length, long epoch) throws InterruptedException {
        RegionLedger.LeaseAdmission a = ledger.beginLease(offset, length, epoch, 1, 1000, NO_WAIT);
        assertThat(a.refusal()).isNull();
        return a.range();
    }

    @Test
    void aLeaseRegionIsCarvedFromItsFrontAndOnlyCarvedObjectsAreReadable() throws InterruptedException {
        store(1024, 256, 3);
        RegionLedger.Region pinned = ledger.beginRead(1024, 3);
        // the old object under the lease is pinned by a reader: the lease waits for it, then gives up
        assertThat(ledger.beginLease(0, 4096, 0, 1, 1000, SHORT).refusal()).isEqualTo(ResultCode.FAILED);
        ledger.endRead(pinned);
        RegionLedger.LeaseRange l = lease(0, 4096, 0);
        // the old object's header is dead the moment the lease takes its space: no reader gets it after
        assertThat(ObjectLayout.state(memory, 1024)).isEqualTo(ObjectLayout.STATE_DEAD);
        assertThat(ledger.beginRead(1024, 3)).isNull();
        assertThat(ledger.beginRead(0, -1)).as("the lease region itself is never readable").isNull();
        // nothing else may be written in the lease meanwhile: it is being written
        assertThat(ledger.beginWrite(2048, 128, 9, 0, KEY, 64, SHORT).refusal()).isEqualTo(ResultCode.FAILED);

        assertThat(ledger.carve(l, 128, 256, 10, 0, KEY, 192, 0x1234)).isEqualTo(ResultCode.OK);
        assertThat(ledger.front(l).offset).isEqualTo(384);
        assertThat(ledger.front(l).end()).isEqualTo(4096);
        assertThat(ObjectLayout.state(memory, 128)).isEqualTo(ObjectLayout.STATE_COMPLETE);
        RegionLedger.Region r = ledger.beginRead(128, 10);
        assertThat(r).isNotNull();
        assertThat(r.valueLength).isEqualTo(192);
        ledger.endRead(r);
        // below the lease range's front (the part before the carved object went with it), or past its end
        assertThat(ledger.carve(l, 0, 128, 11, 0, KEY, 64, 0)).isEqualTo(ResultCode.FAILED);
        assertThat(ledger.carve(l, 4032, 128, 11, 0, KEY, 64, 0)).isEqualTo(ResultCode.FAILED);
        assertThat(ledger.carve(l, 3968, 128, 12, 0, KEY, 64, 0)).isEqualTo(ResultCode.OK);
        assertThat(ledger.front(l)).as("nothing left").isNull();
        assertThat(ledger.carve(l, 3968, 128, 13, 0, KEY, 64, 0)).as("a used-up range").isEqualTo(ResultCode.FAILED);
        assertThat(ledger.objectCount()).isEqualTo(2);
        assertThat(ledger.completeRegions()).extracting(x -> x.generation).containsExactly(10L, 12L);
        // the space between the objects is no one's: a write there is admitted at once
        admit(384, 256, 13, 0);
    }

    @Test
    void aLeaseRegionEndsWithItsConnectionAndIsFencedByAReset() throws InterruptedException {
        RegionLedger.LeaseRange l = lease(0, 4096, 0);
        assertThat(ledger.carve(l, 0, 256, 1, 0, KEY, 192, 0)).isEqualTo(ResultCode.OK);
        ledger.endLease(l);
        assertThat(ledger.front(l)).isNull();
        admit(1024, 256, 2, 0); // the rest is free again at the node
        assertThat(ledger.beginRead(0, 1)).as("what was carved stays").isNotNull();

        RegionLedger.LeaseRange m = lease(2048, 2048, 0);
        assertThat(ledger.reset(1)).as("the object carved in epoch 0").isEqualTo(1);
        assertThat(ledger.carve(m, 2048, 256, 3, 0, KEY, 192, 0)).isEqualTo(ResultCode.FENCED);
        assertThat(ledger.beginLease(2048, 1024, 0, 1, 1000, NO_WAIT).refusal()).as("an old epoch")
                .isEqualTo(ResultCode.FENCED);
        ledger.endLease(m);
        RegionLedger.LeaseRange n = lease(2048, 2048, 1);
        assertThat(ledger.carve(n, 2048, 256, 4, 0, KEY, 192, 0)).as("an item of an old epoch")
                .isEqualTo(ResultCode.FENCED);
        assertThat(ledger.carve(n, 2048, 256, 4, 1, KEY, 192, 0)).isEqualTo(ResultCode.OK);
    }

    /** Stamps an object as a same-machine writer does: value, then header, COMPLETE last. Returns its region length. */
    private long stamp(long offset, long generation, long epoch, int valueLength) {
        MemorySegment value = memory.asSlice(offset + ObjectLayout.valueOffset(KEY.length), valueLength);
        value.fill((byte) generation);
        ObjectLayout.stamp(memory, offset, KEY, valueLength, generation, epoch, ObjectLayout.valueCrc(value));
        return ObjectLayout.regionLength(KEY.length, valueLength);
    }

    @Test
    void objectsAWriterStampedAreSettledWhenAReadOrAFreeFirstAsksForThem() throws InterruptedException {
        RegionLedger.LeaseRange l = lease(0, 8192, 0);
        long a = stamp(0, 1, 0, 100);
        long b = stamp(a, 2, 0, 1000);
        long c = stamp(a + b, 3, 0, 64);
        // a read of the second settles the first two, and the third (the walk goes on while headers verify)
        RegionLedger.Region r = ledger.beginRead(a, 2);
        assertThat(r).isNotNull();
        assertThat(r.valueLength).isEqualTo(1000);
        assertThat(r.key).isEqualTo(KEY);
        ledger.endRead(r);
        assertThat(ledger.front(l).offset).isEqualTo(a + b + c);
        assertThat(ledger.objectCount()).isEqualTo(3);
        assertThat(ledger.stampedObjects()).isEqualTo(3);
        // a free of one stamped later is settled first, then done
        long d = stamp(a + b + c, 4, 0, 64);
        assertThat(ledger.free(a + b + c, 4)).isTrue();
        assertThat(ObjectLayout.state(memory, a + b + c)).isEqualTo(ObjectLayout.STATE_DEAD);
        assertThat(ledger.beginRead(a + b + c, 4)).isNull();
        assertThat(ledger.front(l).offset).isEqualTo(a + b + c + d);
        // the wrong generation at a stamped offset is still a miss
        assertThat(ledger.beginRead(0, 2)).isNull();
    }

    @Test
    void theCountsSettleWhatWasStampedSoANodesPagesAndHeartbeatsSeeIt() throws InterruptedException {
        lease(0, 8192, 0);
        long a = stamp(0, 1, 0, 100);
        stamp(a, 2, 0, 300);
        assertThat(ledger.objectCount()).isEqualTo(2);
        assertThat(ledger.stampedBytes()).isEqualTo(400);
        assertThat(ledger.objectBytes()).isEqualTo(a + ObjectLayout.regionLength(KEY.length, 300));
    }

    @Test
    void theWalkStopsAtAHeaderNotCompleteOfAnotherEpochOrOutsideTheLeasesGenerations() throws InterruptedException {
        RegionLedger.LeaseRange l = lease(0, 16384, 0);
        long a = stamp(0, 5, 0, 100);
        // a header being written: everything but the state is in place
        long b = stamp(a, 6, 0, 100);
        ObjectLayout.setState(memory, a, ObjectLayout.STATE_WRITING);
        long c = stamp(a + b, 7, 0, 100);
        assertThat(ledger.beginRead(a + b, 7)).as("past a header not complete yet").isNull();
        assertThat(ledger.objectCount()).isEqualTo(1);
        ObjectLayout.setState(memory, a, ObjectLayout.STATE_COMPLETE);
        RegionLedger.Region r = ledger.beginRead(a + b, 7);
        assertThat(r).as("found once the writer finished the one before").isNotNull();
        ledger.endRead(r);

        long at = a + b + c;
        // a stale complete header of this epoch from an earlier lease: its generation is not this lease's
        long stale = stamp(at, 5000, 0, 100);
        assertThat(ledger.beginRead(at, 5000)).isNull();
        // nor one at or below a generation already taken
        stamp(at, 6, 0, 100);
        assertThat(ledger.beginRead(at, 6)).isNull();
        // nor one of another epoch
        stamp(at, 9, 1, 100);
        assertThat(ledger.beginRead(at, 9)).isNull();
        // a torn header (a field changed after its checksum) is no object either
        stamp(at, 9, 0, 100);
        memory.set(ValueLayout.JAVA_LONG_UNALIGNED, at + ObjectLayout.GENERATION_OFFSET, 10L);
        assertThat(ledger.beginRead(at, 10)).isNull();
        assertThat(ledger.beginRead(at, 9)).isNull();
        assertThat(ledger.front(l).offset).isEqualTo(at);
        assertThat(stale).isPositive();
        stamp(at, 10, 0, 100);
        assertThat(ledger.completeRegions()).as("a registration settles first").extracting(x -> x.generation)
                .containsExactly(5L, 6L, 7L, 10L);
    }

    @Test
    void whatAWriterStampedSurvivesTheEndOfItsRangeAndTheRestIsLetGo() throws InterruptedException {
        RegionLedger.LeaseRange l = lease(0, 8192, 0);
        long a = stamp(0, 1, 0, 100);
        ledger.endLease(l);
        RegionLedger.Region r = ledger.beginRead(0, 1);
        assertThat(r).as("stamped before the range ended").isNotNull();
        ledger.endRead(r);
        // the rest is free at the node: a write there is admitted at once, and a stamp after the end is no object
        stamp(a, 2, 0, 100);
        assertThat(ledger.beginRead(a, 2)).isNull();
        admit(a, 256, 3, 0);
        // a reset drops a range of an older epoch, and nothing stamped in it is settled after
        RegionLedger.LeaseRange m = lease(4096, 4096, 0);
        ledger.reset(1);
        stamp(4096, 4, 0, 100);
        assertThat(ledger.beginRead(4096, 4)).isNull();
        assertThat(ledger.front(m)).isNotNull();
        assertThat(ledger.carve(m, 4096, 256, 5, 1, KEY, 192, 0)).isEqualTo(ResultCode.FENCED);
    }

    @Test
    void withVerifiedWritesAStampWhoseValueDoesNotMatchItsChecksumIsSkipped() throws InterruptedException {
        RegionLedger verifying = new RegionLedger(memory, true);
        RegionLedger.LeaseRange l = verifying.beginLease(0, 8192, 0, 1, 10, NO_WAIT).range();
        long a = stamp(0, 1, 0, 100);
        long b = stamp(a, 2, 0, 100);
        long c = stamp(a + b, 3, 0, 100);
        memory.set(ValueLayout.JAVA_BYTE, a + ObjectLayout.valueOffset(KEY.length) + 7, (byte) 0x55);
        RegionLedger.Region r = verifying.beginRead(a + b, 3);
        assertThat(r).as("the walk goes past the bad value to the next object").isNotNull();
        verifying.endRead(r);
        assertThat(verifying.beginRead(a, 2)).isNull();
        assertThat(ObjectLayout.state(memory, a)).isEqualTo(ObjectLayout.STATE_DEAD);
        assertThat(verifying.refusedStamps()).isEqualTo(1);
        assertThat(verifying.objectCount()).isEqualTo(2);
        assertThat(verifying.front(l).offset).isEqualTo(a + b + c);
    }


    @Test
    void unknownOffsetOrGenerationIsNotReadable() throws InterruptedException {
        assertThat(ledger.beginRead(0, 1)).isNull();
        assertThat(ledger.beginRead(4096, 0)).isNull();
        store(128, 256, 7);
        assertThat(ledger.beginRead(128, 8)).isNull();
        assertThat(ledger.beginRead(192, 7)).as("inside the region, not its start").isNull();
        assertThat(ledger.beginRead(0, 7)).isNull();
        assertThat(ledger.free(128, 8)).as("free with the wrong generation").isFalse();
        assertThat(ledger.free(0, 7)).isFalse();
        assertThat(ledger.objectCount()).isEqualTo(1);
    }

    @Test
    void writeThenEndWriteMakesItReadableUnderItsGenerationOnly() throws InterruptedException {
        RegionLedger.Region w = admit(256, 128, 42, 0);
        assertThat(w.offset).isEqualTo(256);
        assertThat(w.length).isEqualTo(128);
        assertThat(w.generation).isEqualTo(42);
        assertThat(ledger.beginRead(256, 42)).as("not readable while being written").isNull();
        assertThat(ledger.objectCount()).isZero();

        ObjectLayout.writeHeader(memory, 256, ObjectLayout.STATE_WRITING, KEY, 64, 42, 0, 0);
        assertThat(ledger.endWrite(w, true)).isTrue();
        assertThat(ObjectLayout.state(memory, 256)).isEqualTo(ObjectLayout.STATE_COMPLETE);

        RegionLedger.Region r = ledger.beginRead(256, 42);
        assertThat(r).isNotNull();
        assertThat(r.generation).isEqualTo(42);
        assertThat(r.offset).isEqualTo(256);
        assertThat(r.valueLength).isEqualTo(64);
        assertThat(r.valueOffset()).isEqualTo(256 + 64);
        assertThat(ledger.beginRead(256, 41)).isNull();
        assertThat(ledger.beginRead(256, 43)).isNull();
        // several readers may pin one region
        RegionLedger.Region r2 = ledger.beginRead(256, 42);
        assertThat(r2).isSameAs(r);
        ledger.endRead(r);
        ledger.endRead(r2);
        assertThat(ledger.beginRead(256, 42)).isNotNull();
        assertThat(ledger.completeRegions()).extracting(x -> x.generation).containsExactly(42L);
    }

    @Test
    void failedWriteIsDroppedAndMarkedDead() throws InterruptedException {
        RegionLedger.Region w = admit(0, 128, 5, 0);
        ObjectLayout.writeHeader(memory, 0, ObjectLayout.STATE_WRITING, KEY, 64, 5, 0, 0);
        assertThat(ledger.endWrite(w, false)).isFalse();
        assertThat(ObjectLayout.state(memory, 0)).isEqualTo(ObjectLayout.STATE_DEAD);
        assertThat(ledger.beginRead(0, 5)).isNull();
        assertThat(ledger.objectCount()).isZero();
        assertThat(ledger.completeRegions()).isEmpty();
        // the range is free for the next write at once
        admit(0, 128, 6, 0);
    }

    @Test
    void writeOverlappingAPinnedRegionWaitsThenFails() throws InterruptedException {
        store(0, 256, 1);
        RegionLedger.Region pinned = ledger.beginRead(0, 1);
        assertThat(pinned).isNotNull();

        for (long[] range : new long[][]{{0, 256}, {64, 64}, {192, 128}, {0, 64}, {128, 512}}) {
            RegionLedger.WriteAdmission a = ledger.beginWrite(range[0], range[1], 2, 0, KEY, 0, SHORT);
            assertThat(a.region()).as("write [%d, +%d) over a pinned region", range[0], range[1]).isNull();
            assertThat(a.refusal()).isEqualTo(ResultCode.FAILED);
        }
        // the pinned object is untouched and still readable
        assertThat(ObjectLayout.state(memory, 0)).isEqualTo(ObjectLayout.STATE_COMPLETE);
        RegionLedger.Region again = ledger.beginRead(0, 1);
        assertThat(again).isSameAs(pinned);
        ledger.endRead(again);
        // a write that only touches the pinned region's end is admitted
        assertThat(ledger.beginWrite(256, 64, 3, 0, KEY, 0, NO_WAIT).region()).isNotNull();

        ledger.endRead(pinned);
        RegionLedger.WriteAdmission a = ledger.beginWrite(64, 128, 4, 0, KEY, 0, SHORT);
        assertThat(a.refusal()).isNull();
        assertThat(a.region()).isNotNull();
        assertThat(ledger.beginRead(0, 1)).as("old region is gone once an overlapping write is admitted").isNull();
        assertThat(ObjectLayout.state(memory, 0)).isEqualTo(ObjectLayout.STATE_DEAD);
        assertThat(ledger.objectCount()).isZero();
    }

    /**
     * The writer may wait far longer than the test could take, so it is admitted only if the reader
     * finishing wakes it; a lost wake-up shows as a hang, which the timeout turns into a failure.
     */
    @Test
    @Timeout(value = 20, threadMode = Timeout.ThreadMode.SEPARATE_THREAD)
    void waitingWriterIsAdmittedWhenTheReaderFinishes() throws Exception {
        RegionLedger l = new RegionLedger(Arena.ofAuto().allocate(1 << 12, 64));
        RegionLedger.Region w = l.beginWrite(0, 128, 1, 0, KEY, 64, NO_WAIT).region();
        assertThat(l.endWrite(w, true)).isTrue();
        RegionLedger.Region pinned = l.beginRead(0, 1);
        CompletableFuture<RegionLedger.WriteAdmission> writer = new CompletableFuture<>();
        Thread writerThread = Thread.ofPlatform().daemon().name("waiting-writer").start(() -> {
            try {
                writer.complete(l.beginWrite(0, 128, 2, 0, KEY, 64, Duration.ofHours(1)));
            } catch (Throwable t) {
                writer.completeExceptionally(t);
            }
        });
        // proceed once the writer is parked waiting for the region (its only timed wait)
        while (writerThread.getState() != Thread.State.TIMED_WAITING) {
            assertThat(writer.isDone()).as("writer must wait for the pinned region").isFalse();
            Thread.onSpinWait();
        }
        l.endRead(pinned);
        RegionLedger.WriteAdmission a = writer.get();
        assertThat(a.refusal()).isNull();
        assertThat(a.region().generation).isEqualTo(2);
        assertThat(l.beginRead(0, 1)).isNull();
    }

    @Test
    void overlappingWriteDropsEveryCompleteRegionItTouches() throws InterruptedException {
        store(0, 128, 1);
        store(128, 128, 2);
        store(256, 128, 3);
        store(512, 64, 4);
        assertThat(ledger.objectCount()).isEqualTo(4);
        assertThat(ledger.objectBytes()).isEqualTo(448);
        RegionLedger.Region w = admit(64, 256, 5, 0); // [64, 320) touches 1, 2 and 3
        assertThat(ledger.beginRead(0, 1)).isNull();
        assertThat(ledger.beginRead(128, 2)).isNull();
        assertThat(ledger.beginRead(256, 3)).isNull();
        assertThat(ledger.objectCount()).isEqualTo(1);
        assertThat(ledger.objectBytes()).isEqualTo(64);
        for (long off : new long[]{0, 128, 256}) {
            assertThat(ObjectLayout.state(memory, off)).as("header at %d", off).isEqualTo(ObjectLayout.STATE_DEAD);
        }
        RegionLedger.Region r4 = ledger.beginRead(512, 4);
        assertThat(r4).isNotNull();
        ledger.endRead(r4);
        assertThat(ledger.endWrite(w, true)).isTrue();
        assertThat(ledger.objectCount()).isEqualTo(2);
        assertThat(ledger.objectBytes()).isEqualTo(256 + 64);
    }

    @Test
    void writeIntoABusyWritingRangeIsRefused() throws InterruptedException {
        RegionLedger.Region w = admit(0, 256, 1, 0);
        RegionLedger.WriteAdmission second = ledger.beginWrite(128, 256, 2, 0, KEY, 0, SHORT);
        assertThat(second.region()).isNull();
        assertThat(second.refusal()).isEqualTo(ResultCode.FAILED);
        assertThat(ledger.endWrite(w, true)).isTrue();
        assertThat(ledger.beginWrite(128, 256, 2, 0, KEY, 0, NO_WAIT).region()).isNotNull();
    }

    @Test
    void freeOfAPinnedRegionHidesItAtOnceButTheReaderFinishes() throws InterruptedException {
        store(0, 256, 9);
        RegionLedger.Region pinned = ledger.beginRead(0, 9);
        assertThat(pinned).isNotNull();
        assertThat(ledger.free(0, 9)).isTrue();
        assertThat(ledger.beginRead(0, 9)).as("no new readers after free").isNull();
        assertThat(ledger.objectCount()).isZero();
        assertThat(ledger.objectBytes()).isZero();
        assertThat(ledger.completeRegions()).isEmpty();
        assertThat(ObjectLayout.state(memory, 0)).isEqualTo(ObjectLayout.STATE_DEAD);
        // free never waits, but the bytes stay put while the reader holds them
        RegionLedger.WriteAdmission blocked = ledger.beginWrite(0, 256, 10, 0, KEY, 0, NO_WAIT);
        assertThat(blocked.refusal()).isEqualTo(ResultCode.FAILED);

        ledger.endRead(pinned);
        assertThat(ledger.objectCount()).isZero();
        assertThat(ledger.free(0, 9)).as("gone once the reader finished").isFalse();
        RegionLedger.WriteAdmission a = ledger.beginWrite(0, 256, 10, 0, KEY, 0, NO_WAIT);
        assertThat(a.refusal()).isNull();
        assertThat(ledger.awaitIdle(NO_WAIT)).isFalse();
        assertThat(ledger.endWrite(a.region(), true)).isTrue();
        assertThat(ledger.awaitIdle(NO_WAIT)).isTrue();
    }

    @Test
    void freeOfARegionBeingWrittenKeepsItFromBecomingReadable() throws InterruptedException {
        RegionLedger.Region w = admit(0, 128, 3, 0);
        assertThat(ledger.free(0, 3)).isTrue();
        assertThat(ledger.endWrite(w, true)).isFalse();
        assertThat(ledger.beginRead(0, 3)).isNull();
        assertThat(ObjectLayout.state(memory, 0)).isEqualTo(ObjectLayout.STATE_DEAD);
        assertThat(ledger.objectCount()).isZero();
        admit(0, 128, 4, 0);
    }

    @Test
    void resetDropsEverythingAndFencesOlderWrites() throws InterruptedException {
        store(0, 128, 1);
        store(128, 128, 2);
        store(1024, 512, 3);
        RegionLedger.Region pinned = ledger.beginRead(1024, 3);
        assertThat(ledger.epoch()).isZero();

        assertThat(ledger.reset(5)).isEqualTo(3);
        assertThat(ledger.epoch()).isEqualTo(5);
        assertThat(ledger.objectCount()).isZero();
        assertThat(ledger.objectBytes()).isZero();
        assertThat(ledger.completeRegions()).isEmpty();
        assertThat(ledger.beginRead(0, 1)).isNull();
        assertThat(ledger.beginRead(128, 2)).isNull();
        assertThat(ledger.beginRead(1024, 3)).isNull();
        ledger.endRead(pinned); // the pinned reader still finishes cleanly

        RegionLedger.WriteAdmission old = ledger.beginWrite(2048, 128, 4, 4, KEY, 64, SHORT);
        assertThat(old.region()).isNull();
        assertThat(old.refusal()).isEqualTo(ResultCode.FENCED);
        RegionLedger.WriteAdmission veryOld = ledger.beginWrite(2048, 128, 4, 0, KEY, 64, NO_WAIT);
        assertThat(veryOld.refusal()).isEqualTo(ResultCode.FENCED);

        RegionLedger.Region current = admit(0, 128, 5, 5);
        assertThat(ledger.endWrite(current, true)).isTrue();
        RegionLedger.Region newer = admit(128, 128, 6, 6);
        assertThat(ledger.endWrite(newer, true)).isTrue();
        assertThat(ledger.objectCount()).isEqualTo(2);

        // the epoch never moves backwards, and a stale reset drops nothing of the current epoch
        assertThat(ledger.reset(3)).isZero();
        assertThat(ledger.epoch()).isEqualTo(5);
        assertThat(ledger.objectCount()).isEqualTo(2);
        assertThat(ledger.beginWrite(1024, 128, 7, 4, KEY, 64, NO_WAIT).refusal()).isEqualTo(ResultCode.FENCED);
        assertThat(ledger.reset(0)).isZero();

        // moving to epoch 6 drops the epoch-5 object and keeps the one written at epoch 6
        assertThat(ledger.reset(6)).isEqualTo(1);
        assertThat(ledger.beginRead(0, 5)).isNull();
        RegionLedger.Region kept = ledger.beginRead(128, 6);
        assertThat(kept).isNotNull();
        ledger.endRead(kept);
        assertThat(ledger.objectCount()).isEqualTo(1);
        assertThat(ledger.objectBytes()).isEqualTo(128);
    }

    @Test
    void endWriteOfARegionResetDuringItsWriteReturnsFalse() throws InterruptedException {
        RegionLedger.Region w = admit(0, 128, 1, 0);
        ObjectLayout.writeHeader(memory, 0, ObjectLayout.STATE_WRITING, KEY, 64, 1, 0, 0);
        assertThat(ledger.reset(1)).isZero();
        // the writer may still be stamping the header after the reset marked it dead
        ObjectLayout.setState(memory, 0, ObjectLayout.STATE_WRITING);
        assertThat(ledger.endWrite(w, true)).isFalse();
        assertThat(ObjectLayout.state(memory, 0)).isEqualTo(ObjectLayout.STATE_DEAD);
        assertThat(ledger.beginRead(0, 1)).isNull();
        assertThat(ledger.objectCount()).isZero();
        assertThat(ledger.awaitIdle(NO_WAIT)).isTrue();
        admit(0, 128, 2, 1);
    }

    @Test
    void writeOfTheNewEpochAdmittedBeforeTheResetSurvivesIt() throws InterruptedException {
        // the master placed a put of epoch 2 before this node heard of the reset to epoch 2
        RegionLedger.Region early = admit(0, 128, 1, 2);
        RegionLedger.Region stale = admit(256, 128, 2, 0);
        assertThat(ledger.reset(2)).isZero();
        assertThat(ledger.endWrite(early, true)).isTrue();
        assertThat(ledger.endWrite(stale, true)).isFalse();
        RegionLedger.Region r = ledger.beginRead(0, 1);
        assertThat(r).isNotNull();
        ledger.endRead(r);
        assertThat(ledger.beginRead(256, 2)).isNull();
        assertThat(ledger.objectCount()).isEqualTo(1);
    }

    @Test
    void adoptEpochRaisesWithoutDropping() throws InterruptedException {
        store(0, 128, 1);
        ledger.adoptEpoch(4);
        assertThat(ledger.epoch()).isEqualTo(4);
        ledger.adoptEpoch(2);
        assertThat(ledger.epoch()).isEqualTo(4);
        assertThat(ledger.objectCount()).isEqualTo(1);
        RegionLedger.Region r = ledger.beginRead(0, 1);
        assertThat(r).isNotNull();
        ledger.endRead(r);
        assertThat(ledger.beginWrite(256, 128, 2, 3, KEY, 64, NO_WAIT).refusal()).isEqualTo(ResultCode.FENCED);
    }

    @Test
    void objectCountAndBytesBookkeeping() throws InterruptedException {
        assertThat(ledger.objectCount()).isZero();
        assertThat(ledger.objectBytes()).isZero();
        store(0, 128, 1);
        store(128, 256, 2);
        store(4096, 64, 3);
        assertThat(ledger.objectCount()).isEqualTo(3);
        assertThat(ledger.objectBytes()).isEqualTo(128 + 256 + 64);
        assertThat(ledger.completeRegions()).hasSize(3);

        ledger.free(128, 2);
        assertThat(ledger.objectCount()).isEqualTo(2);
        assertThat(ledger.objectBytes()).isEqualTo(192);

        // overwrite in place: same offset, new generation
        RegionLedger.Region w = admit(0, 128, 4, 0);
        assertThat(ledger.objectCount()).isEqualTo(1);
        assertThat(ledger.objectBytes()).isEqualTo(64);
        assertThat(ledger.endWrite(w, true)).isTrue();
        assertThat(ledger.objectCount()).isEqualTo(2);
        assertThat(ledger.objectBytes()).isEqualTo(192);

        // a failed write leaves the counts alone
        RegionLedger.Region f = admit(1024, 512, 5, 0);
        assertThat(ledger.endWrite(f, false)).isFalse();
        assertThat(ledger.objectCount()).isEqualTo(2);
        assertThat(ledger.objectBytes()).isEqualTo(192);

        // dropping a pinned region counts it out at once, and only once
        RegionLedger.Region pinned = ledger.beginRead(4096, 3);
        ledger.free(4096, 3);
        assertThat(ledger.objectCount()).isEqualTo(1);
        ledger.endRead(pinned);
        assertThat(ledger.objectCount()).isEqualTo(1);
        assertThat(ledger.objectBytes()).isEqualTo(128);

        assertThat(ledger.reset(1)).isEqualTo(1);
        assertThat(ledger.objectCount()).isZero();
        assertThat(ledger.objectBytes()).isZero();
    }

    // ------------------------------------------------------------------ concurrency

    /** A half-open byte range with who holds it, for the invariant checker. */
    private record Hold(long start, long end, long generation, String what) {
        boolean overlaps(long s, long e) {
            return start < e && s < end;
        }
    }

    @ParameterizedTest
    @ValueSource(longs = {1L, 7L, 0xBEEFL})
    void concurrentReadsWritesAndFreesKeepReadsExact(long seed) throws Exception {
        final int threads = 6;
        final int opsPerThread = 4000;
        final int slots = 32;                   // region starts at multiples of 64 within 32 slots
        final long segmentBytes = (slots + 8) * 64L;
        final ValueLayout.OfLong LONG = ValueLayout.JAVA_LONG_UNALIGNED;

        try (Arena shared = Arena.ofShared()) {
            MemorySegment mem = shared.allocate(segmentBytes, 64);
            RegionLedger l = new RegionLedger(mem);
            AtomicLong generations = new AtomicLong(1);
            AtomicLong epoch = new AtomicLong();
            Map<Long, Hold> pins = new ConcurrentHashMap<>();   // token -> pinned range
            Map<Long, Hold> writes = new ConcurrentHashMap<>(); // token -> admitted write range
            AtomicLong tokens = new AtomicLong();
            // {offset, generation} of the most recent completed writes, as a ring
            AtomicReferenceArray<long[]> published = new AtomicReferenceArray<>(1024);
            AtomicLong publishedCount = new AtomicLong();
            Queue<String> violations = new ConcurrentLinkedQueue<>();
            AtomicLong reads = new AtomicLong();
            AtomicLong admitted = new AtomicLong();
            AtomicLong refused = new AtomicLong();

            List<Future<?>> futures = new ArrayList<>();
            try (ExecutorService ex = Executors.newFixedThreadPool(threads)) {
                for (int t = 0; t < threads; t++) {
                    long threadSeed = seed * 31 + t;
                    futures.add(ex.submit(() -> {
                        Random rnd = new Random(threadSeed);
                        for (int op = 0; op < opsPerThread; op++) {
                            int kind = rnd.nextInt(100);
                            long known = Math.min(publishedCount.get(), published.length());
                            if (kind < 45 && known > 0) {
                                long[] p = published.get(rnd.nextInt((int) known));
                                if (p == null) {
                                    continue;
                                }
                                RegionLedger.Region r = l.beginRead(p[0], p[1]);
                                if (r == null) {
                                    continue;
                                }
                                reads.incrementAndGet();
                                long token = tokens.incrementAndGet();
                                if (r.generation != p[1] || r.offset != p[0]) {
                                    violations.add("seed=" + seed + ": beginRead(" + p[0] + ", " + p[1]
                                            + ") returned offset " + r.offset + " generation " + r.generation);
                                }
                                pins.put(token, new Hold(r.offset, r.end(), r.generation, "read"));
                                for (Hold w : writes.values()) {
                                    if (w.overlaps(r.offset, r.end())) {
                                        violations.add("seed=" + seed + ": pinned [" + r.offset + ", " + r.end()
                                                + ") gen " + r.generation + " while write " + w + " is admitted");
                                    }
                                }
                                // the pinned bytes are exactly what the writer of this generation left
                                for (int pass = 0; pass < 2; pass++) {
                                    for (long at = r.offset + 64; at + 8 <= r.end(); at += 8) {
                                        long v = mem.get(LONG, at);
                                        if (v != r.generation) {
                                            violations.add("seed=" + seed + ": region [" + r.offset + ", " + r.end()
                                                    + ") gen " + r.generation + " holds " + v + " at " + at);
                                            break;
                                        }
                                    }
                                    Thread.yield();
                                }
                                pins.remove(token);
                                l.endRead(r);
                            } else if (kind < 85) {
                                long offset = 64L * rnd.nextInt(slots);
                                long length = 64L * (2 + rnd.nextInt(6));
                                long gen = generations.getAndIncrement();
                                long e = epoch.get();
                                RegionLedger.WriteAdmission a = l.beginWrite(offset, length, gen, e, KEY, length - 64,
                                        Duration.ofMillis(rnd.nextInt(3)));
                                if (a.region() == null) {
                                    refused.incrementAndGet();
                                    if (a.refusal() != ResultCode.FAILED && a.refusal() != ResultCode.FENCED) {
                                        violations.add("seed=" + seed + ": unexpected refusal " + a.refusal());
                                    }
                                    if (a.refusal() == ResultCode.FENCED && e >= l.epoch()) {
                                        violations.add("seed=" + seed + ": FENCED at current epoch " + e);
                                    }
                                    continue;
                                }
                                admitted.incrementAndGet();
                                RegionLedger.Region r = a.region();
                                long token = tokens.incrementAndGet();
                                writes.put(token, new Hold(offset, offset + length, gen, "write"));
                                for (Hold p : pins.values()) {
                                    if (p.overlaps(offset, offset + length)) {
                                        violations.add("seed=" + seed + ": write [" + offset + ", " + (offset + length)
                                                + ") gen " + gen + " admitted while " + p + " is pinned");
                                    }
                                }
                                for (long at = offset + 64; at + 8 <= offset + length; at += 8) {
                                    mem.set(LONG, at, gen);
                                }
                                Thread.yield();
                                writes.remove(token);
                                boolean ok = rnd.nextInt(10) != 0;
                                if (l.endWrite(r, ok)) {
                                    published.set((int) (publishedCount.getAndIncrement() % published.length()),
                                            new long[]{offset, gen});
                                } else if (ok && !r.dead) {
                                    violations.add("seed=" + seed + ": endWrite(ok) of a live region refused");
                                }
                            } else if (kind < 99 && known > 0) {
                                long[] p = published.get(rnd.nextInt((int) known));
                                if (p != null) {
                                    l.free(p[0], p[1]);
                                }
                            } else if (kind == 99) {
                                l.reset(epoch.incrementAndGet());
                            }
                        }
                        return null;
                    }));
                }
                for (Future<?> f : futures) {
                    f.get();
                }
            }

            assertThat(violations).as("seed=%d", seed).isEmpty();
            assertThat(reads.get()).as("seed=%d: the run should have read something", seed).isPositive();
            assertThat(admitted.get()).as("seed=%d", seed).isPositive();

            // quiescent: nothing busy, counts agree with the regions, regions do not overlap and read back exactly
            assertThat(l.awaitIdle(NO_WAIT)).as("seed=%d", seed).isTrue();
            List<RegionLedger.Region> complete = new ArrayList<>(l.completeRegions());
            complete.sort((a, b) -> Long.compare(a.offset, b.offset));
            assertThat(l.objectCount()).as("seed=%d", seed).isEqualTo(complete.size());
            assertThat(l.objectBytes()).as("seed=%d", seed).isEqualTo(complete.stream().mapToLong(r -> r.length).sum());
            for (int i = 1; i < complete.size(); i++) {
                assertThat(complete.get(i).offset).as("seed=%d: complete regions overlap", seed)
                        .isGreaterThanOrEqualTo(complete.get(i - 1).end());
            }
            for (RegionLedger.Region c : complete) {
                RegionLedger.Region r = l.beginRead(c.offset, c.generation);
                assertThat(r).as("seed=%d", seed).isSameAs(c);
                for (long at = r.offset + 64; at + 8 <= r.end(); at += 8) {
                    assertThat(mem.get(LONG, at)).as("seed=%d offset %d", seed, at).isEqualTo(r.generation);
                }
                assertThat(ObjectLayout.state(mem, r.offset)).as("seed=%d", seed).isEqualTo(ObjectLayout.STATE_COMPLETE);
                l.endRead(r);
            }
        }
    }

    // ------------------------------------------------------------------ objects on their way to the SSD tier

    @Test
    void aRetiredObjectIsNoLongerReadableButKeepsItsHeaderUntilItsSpaceIsWritten() throws Exception {
        RegionLedger.Region r = admit(0, 1024, 7, 0);
        assertThat(ledger.endWrite(r, true)).isTrue();
        assertThat(ledger.retire(0, 7)).isTrue();
        assertThat(ledger.beginRead(0, 7)).as("the master moved it to disk: not read from memory").isNull();
        assertThat(ledger.objectCount()).isZero();
        assertThat(ledger.completeRegions()).isEmpty();
        assertThat(ObjectLayout.state(memory, 0)).as("a restart still finds it").isEqualTo(ObjectLayout.STATE_COMPLETE);
        // a write over part of its value (not its header) marks the header dead before it is admitted
        RegionLedger.Region next = admit(512, 1024, 8, 0);
        assertThat(ObjectLayout.state(memory, 0)).isEqualTo(ObjectLayout.STATE_DEAD);
        ledger.endWrite(next, true);
        assertThat(ledger.dropRetired(7)).as("gone already").isFalse();
    }

    @Test
    void aRetiredObjectWhoseDiskCopyIsLetGoIsDeadInMemoryToo() throws Exception {
        RegionLedger.Region r = admit(0, 1024, 7, 0);
        ledger.endWrite(r, true);
        ledger.retire(0, 7);
        assertThat(ledger.dropRetired(7)).isTrue();
        assertThat(ObjectLayout.state(memory, 0)).isEqualTo(ObjectLayout.STATE_DEAD);
        assertThat(ledger.dropRetired(7)).isFalse();
    }

    @Test
    void aResetDropsRetiredObjectsOfOlderEpochs() throws Exception {
        RegionLedger.Region r = admit(0, 1024, 7, 0);
        ledger.endWrite(r, true);
        ledger.retire(0, 7);
        ledger.reset(1);
        assertThat(ObjectLayout.state(memory, 0)).isEqualTo(ObjectLayout.STATE_DEAD);
    }
}
