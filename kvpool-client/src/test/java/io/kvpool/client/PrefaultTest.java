package io.kvpool.client;

import io.kvpool.config.HostPort;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.RandomAccessFile;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;

import static io.kvpool.client.Prefault.MADV_POPULATE_READ;
import static io.kvpool.client.Prefault.WINDOW;
import static org.assertj.core.api.Assertions.assertThat;

/** Prefaulting of shared-segment mappings: once per window, and never again after a refusal. */
class PrefaultTest {

    private record Call(long offset, long length, int advice) {
    }

    /** Records the advice instead of giving it; refuses from call {@code refuseFrom} on. */
    private static final class Recorder implements Prefault.Advisor {
        final long base;
        final int refuseFrom;
        final List<Call> calls = new ArrayList<>();

        Recorder(long base, int refuseFrom) {
            this.base = base;
            this.refuseFrom = refuseFrom;
        }

        @Override
        public synchronized boolean advise(long address, long length, int advice) {
            calls.add(new Call(address - base, length, advice));
            return calls.size() < refuseFrom;
        }
    }

    /** A mapping-sized segment that is never touched (the recorder stands in for the kernel). */
    private static MemorySegment fakeMapping(long size) {
        return MemorySegment.ofAddress(1L << 30).reinterpret(size);
    }

    @Test
    void eachWindowIsPopulatedOnce() {
        long size = 3 * WINDOW + 4096;
        MemorySegment m = fakeMapping(size);
        Recorder r = new Recorder(m.address(), Integer.MAX_VALUE);
        Prefault.Windows w = new Prefault.Windows("s", m, r);

        w.populate(100, 1 << 20);
        w.populate(WINDOW - 4096, 4096);
        w.populate(5, 10);
        assertThat(r.calls).containsExactly(new Call(0, WINDOW, MADV_POPULATE_READ));
        assertThat(w.populatedAt(WINDOW - 1)).isTrue();
        assertThat(w.populatedAt(WINDOW)).isFalse();

        // a copy across windows populates each; the last window ends with the mapping
        r.calls.clear();
        w.populate(2 * WINDOW - 10, WINDOW + 20);
        assertThat(r.calls).containsExactly(new Call(WINDOW, WINDOW, MADV_POPULATE_READ),
                new Call(2 * WINDOW, WINDOW, MADV_POPULATE_READ), new Call(3 * WINDOW, 4096, MADV_POPULATE_READ));
        assertThat(w.populatedAt(3 * WINDOW + 1)).isTrue();

        // empty copies and copies of populated windows ask for nothing
        r.calls.clear();
        w.populate(0, 0);
        w.populate(0, size);
        assertThat(r.calls).isEmpty();
    }

    @Test
    void aWritePopulatesTheWindowAfterItsEndOnceInTheBackground() {
        long size = 3 * WINDOW + 4096;
        MemorySegment m = fakeMapping(size);
        Recorder r = new Recorder(m.address(), Integer.MAX_VALUE);
        List<Runnable> queued = new ArrayList<>();
        Prefault.Windows w = new Prefault.Windows("s", m, r, queued::add);

        w.populateAhead(100, 1 << 20);
        w.populateAhead(WINDOW - 4096, 4096); // the same window after it: asked for already
        assertThat(queued).as("handed to the background, not run on the writer's thread").hasSize(1);
        assertThat(r.calls).isEmpty();
        queued.removeFirst().run();
        assertThat(r.calls).containsExactly(new Call(WINDOW, WINDOW, MADV_POPULATE_READ));
        assertThat(w.populatedAt(WINDOW)).isTrue();

        // a write that ends in window 1 asks for window 2; one that reaches the last window asks for nothing
        r.calls.clear();
        w.populateAhead(WINDOW, 10);
        w.populateAhead(3 * WINDOW, 4096);
        w.populateAhead(2 * WINDOW - 10, WINDOW + 20);
        assertThat(queued).hasSize(1);
        queued.removeFirst().run();
        assertThat(r.calls).containsExactly(new Call(2 * WINDOW, WINDOW, MADV_POPULATE_READ));
        // a window populated by then is not populated again
        w.populate(3 * WINDOW, 1);
        r.calls.clear();
        w.populateAhead(2 * WINDOW, 1);
        assertThat(queued).isEmpty();
        assertThat(r.calls).isEmpty();
    }

    @Test
    void aRefusalInTheBackgroundIsLeftToTheWriter() {
        MemorySegment m = fakeMapping(4 * WINDOW);
        Recorder r = new Recorder(m.address(), 1); // refuses every call
        Prefault.Windows w = new Prefault.Windows("s", m, r, Runnable::run);
        w.populateAhead(0, 10);
        assertThat(r.calls).containsExactly(new Call(WINDOW, WINDOW, MADV_POPULATE_READ));
        assertThat(w.populatedAt(WINDOW)).isFalse();
        assertThat(w.prefaulting()).as("the background does not decide for the writer").isTrue();
        w.populate(WINDOW, 10);
        assertThat(w.prefaulting()).isFalse();
        w.populateAhead(WINDOW, 10);
        assertThat(r.calls).as("nothing asked once prefaulting is off").hasSize(2);
    }

    @Test
    void aRefusalStopsPrefaultingThatMapping() {
        MemorySegment m = fakeMapping(4 * WINDOW);
        Recorder r = new Recorder(m.address(), 2);
        Prefault.Windows w = new Prefault.Windows("s", m, r);
        w.populate(0, 10);
        w.populate(WINDOW, 10); // refused
        w.populate(2 * WINDOW, 10);
        w.populate(3 * WINDOW, 10);
        assertThat(r.calls).hasSize(2);
        assertThat(w.prefaulting()).isFalse();
        assertThat(w.populatedAt(0)).isTrue();
        assertThat(w.populatedAt(WINDOW)).isFalse();
    }

    @Test
    void withoutAnAdvisorNothingIsPopulated() {
        Prefault.Windows w = new Prefault.Windows("s", fakeMapping(WINDOW), null);
        w.populate(0, 100);
        assertThat(w.prefaulting()).isFalse();
        assertThat(w.populatedAt(0)).isFalse();
    }

    @Test
    void concurrentCopiesMarkEveryWindow() throws Exception {
        long windows = 200; // more than one word of the bitset
        MemorySegment m = fakeMapping(windows * WINDOW);
        Recorder r = new Recorder(m.address(), Integer.MAX_VALUE);
        Prefault.Windows w = new Prefault.Windows("s", m, r);
        List<Thread> threads = new ArrayList<>();
        for (int t = 0; t < 4; t++) {
            int first = t;
            threads.add(Thread.ofPlatform().start(() -> {
                for (long i = first; i < windows; i += 2) {
                    w.populate(i * WINDOW + 1, 10);
                }
            }));
        }
        for (Thread t : threads) {
            t.join();
        }
        for (long i = 0; i < windows; i++) {
            assertThat(w.populatedAt(i * WINDOW)).as("window %d", i).isTrue();
        }
        // each window by at most the two threads that raced for it
        assertThat(r.calls.size()).isBetween((int) windows, 2 * (int) windows);
    }

    @Test
    void aRealMappingIsPopulatedAndCopiedInto(@TempDir Path dir) throws Exception {
        Path file = dir.resolve("seg");
        long size = 2 * WINDOW + (4 << 20);
        try (RandomAccessFile f = new RandomAccessFile(file.toFile(), "rw")) {
            f.setLength(size);
        }
        SharedSegments shared = new SharedSegments(true);
        SegmentDirectory.Entry e = new SegmentDirectory.Entry(9, "seg-9", new HostPort("127.0.0.1", 1), true, true,
                size, size, file.toString());
        MemorySegment m = shared.mapping(e);
        assertThat(m).isNotNull();
        Prefault.Windows w = SharedSegments.windows(m);
        assertThat(w).isNotNull();

        byte[] value = new byte[3 << 20];
        for (int i = 0; i < value.length; i++) {
            value[i] = (byte) (i * 7);
        }
        long at = WINDOW - (1 << 20); // crosses into the second window
        SharedSegments.write(m, at, MemorySegment.ofArray(value));
        assertThat(m.asSlice(at, value.length).toArray(ValueLayout.JAVA_BYTE)).isEqualTo(value);
        if (Prefault.NATIVE != null && w.prefaulting()) {
            // this kernel took the advice (Linux 5.14+; the build runs with native access)
            assertThat(w.populatedAt(at)).isTrue();
            assertThat(w.populatedAt(at + value.length - 1)).isTrue();
        }

        // a read of an object in a window not populated yet populates it
        byte[] key = "k".getBytes(java.nio.charset.StandardCharsets.UTF_8);
        long obj = 2 * WINDOW + 4096;
        io.kvpool.protocol.ObjectLayout.writeHeader(m, obj, io.kvpool.protocol.ObjectLayout.STATE_COMPLETE, key, 1000,
                5, 1, 0);
        MemorySegment dst = MemorySegment.ofArray(new byte[1000]);
        assertThat(SharedSegments.read(m, obj, 5, 1000, dst)).isTrue();
        if (Prefault.NATIVE != null && w.prefaulting()) {
            assertThat(w.populatedAt(obj)).isTrue();
        }

        // a mapping the client dropped is no longer registered: copies into it still work, without prefaulting
        shared.retain(Set.of());
        assertThat(SharedSegments.windows(m)).isNull();
        SharedSegments.write(m, 0, MemorySegment.ofArray(new byte[]{1, 2, 3}));
        assertThat(m.get(ValueLayout.JAVA_BYTE, 2)).isEqualTo((byte) 3);
        shared.close();
        try (Arena arena = Arena.ofConfined()) {
            assertThat(SharedSegments.windows(arena.allocate(64))).as("not a mapping").isNull();
        }
    }
}
