package io.kvpool.master.events;

import io.kvpool.protocol.BlockInfo;
import org.junit.jupiter.api.Test;

import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;

import static org.assertj.core.api.Assertions.assertThat;

/** Stores wait for their parents, a bounded number of cycles, and never past a removal. */
class ChainOrderTest {

    private final Map<String, BlockInfo> infos = new HashMap<>();
    /** The holds' clock, moved by the tests only. */
    private final AtomicLong nanos = new AtomicLong(1_000);
    private final ChainOrder order = new ChainOrder(k -> infos.get(new String(k, StandardCharsets.US_ASCII)),
            nanos::get);

    /** A connector key whose block hash is {@code h}, described as the child of {@code parent} (null: a first block). */
    private byte[] block(long h, Long parent) {
        String k = "kvp1/m/v/r/bf16/" + "0".repeat(48) + "%016x".formatted(h);
        infos.put(k, BlockInfo.of(parent, 1, new int[]{(int) h}));
        return k.getBytes(StandardCharsets.US_ASCII);
    }

    private static KvEvent.Stored stored(byte[] key) {
        return new KvEvent.Stored(List.of(key), Medium.CPU);
    }

    private static List<Long> hashes(List<KvEvent> events) {
        return events.stream().flatMap(e -> ((KvEvent.Stored) e).keys().stream()).map(BlockHashes::of).toList();
    }

    @Test
    void aChildWaitsForItsParentThenBothGoOutParentFirst() {
        byte[] a = block(1, null);
        byte[] b = block(2, 1L);
        byte[] c = block(3, 2L);
        assertThat(order.next(List.of(stored(c)))).as("c's parent unknown: held").isEmpty();
        assertThat(order.next(List.of(stored(b)))).as("b's parent unknown, c waits on b").isEmpty();
        List<KvEvent> out = order.next(List.of(stored(a)));
        assertThat(hashes(out)).containsExactly(1L, 2L, 3L);
        assertThat(order.holding()).isFalse();
        // the codec puts them in chain order, as one event
        EventBatchReader.Batch batch = EventBatchReader.read(EventBatchCodec.encode(1.0, out,
                k -> infos.get(new String(k, StandardCharsets.US_ASCII))));
        assertThat(batch.events()).hasSize(1);
        assertThat(batch.events().getFirst().blockHashes()).containsExactly(1L, 2L, 3L);
        // a later child of an announced parent goes out at once
        assertThat(hashes(order.next(List.of(stored(block(4, 3L)))))).containsExactly(4L);
    }

    @Test
    void anOrphanGoesOutAfterTheHoldAndNothingIsHeldPastARemoval() {
        byte[] orphan = block(9, 8L);
        assertThat(order.next(List.of(stored(orphan)))).isEmpty();
        // a burst of publisher cycles in no time lets nothing out: the hold is time, not cycles
        for (int i = 1; i < 1000; i++) {
            assertThat(order.next(List.of())).as("cycle %d", i).isEmpty();
        }
        nanos.addAndGet(ChainOrder.HOLD_NANOS - 1);
        assertThat(order.next(List.of())).as("a nanosecond short of the hold").isEmpty();
        nanos.incrementAndGet();
        assertThat(hashes(order.next(List.of()))).containsExactly(9L);
        assertThat(order.holding()).isFalse();

        byte[] other = block(20, 19L);
        assertThat(order.next(List.of(stored(other)))).isEmpty();
        KvEvent.Removed removed = new KvEvent.Removed(List.of(other), Medium.CPU);
        assertThat(order.next(List.of(removed))).containsExactly(stored(other), removed);
        assertThat(order.holding()).isFalse();
    }

    /** A spill: the child lands on the SSD tier while its parent, out of memory, is not listed anywhere yet. */
    @Test
    void aChildWaitsWhileItsParentIsBetweenTiers() {
        byte[] a = block(1, null);
        byte[] b = block(2, 1L);
        assertThat(hashes(order.next(List.of(stored(a), stored(b))))).containsExactly(1L, 2L);
        KvEvent.Removed aOut = new KvEvent.Removed(List.of(a), Medium.CPU);
        KvEvent.Removed bOut = new KvEvent.Removed(List.of(b), Medium.CPU);
        assertThat(order.next(List.of(aOut, bOut))).containsExactly(aOut, bOut);
        KvEvent.Stored bDisk = new KvEvent.Stored(List.of(b), Medium.STORAGE);
        assertThat(order.next(List.of(bDisk))).as("a's spill has not landed: b waits").isEmpty();
        KvEvent.Stored aDisk = new KvEvent.Stored(List.of(a), Medium.STORAGE);
        assertThat(order.next(List.of(aDisk))).containsExactly(aDisk, bDisk);
    }

    @Test
    void storesWithoutInfosPassUntouched() {
        byte[] bare = "blk/1".getBytes(StandardCharsets.US_ASCII);
        List<KvEvent> batch = List.of(stored(bare), new KvEvent.AllCleared());
        assertThat(order.next(batch)).isSameAs(batch);
    }
}
