package io.kvpool.jmh;

import io.kvpool.protocol.ObjectLayout;
import org.openjdk.jmh.annotations.AuxCounters;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Fork;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Measurement;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;
import org.openjdk.jmh.annotations.Warmup;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.SplittableRandom;
import java.util.concurrent.TimeUnit;

/**
 * Moving and checksumming object values in memory: what a same-machine client does when it copies
 * a value out of a node's shared-memory segment, and what both sides do to compute or verify a
 * value's CRC32C.
 *
 * <ul>
 *   <li>{@link #copyToNative}: {@code MemorySegment.copy} of {@code size} bytes from a random
 *       64-byte-aligned offset in a 1 GiB native source (far larger than any cache, like a segment)
 *       into a native destination (like {@code getInto} a caller's off-heap buffer).</li>
 *   <li>{@link #copyToHeap}: the same into a {@code byte[]} (like {@code get} returning an array).</li>
 *   <li>{@link #valueCrc}: {@link ObjectLayout#valueCrc} (CRC32C, hardware-assisted) over {@code size}
 *       bytes at a random offset of the same source.</li>
 * </ul>
 *
 * <p>Why it matters: these are the per-byte costs on the data path; they should run near memory
 * bandwidth, so that the pool's throughput is bounded by the network or DRAM, not by the JVM.
 *
 * <p><b>Units.</b> The primary result is JMH's ops/s, where one operation moves or checksums
 * {@code size} bytes; the secondary result {@code :bytes} (an {@link AuxCounters} counter) is the
 * same rate already multiplied out, in <b>bytes per second</b>.
 * To get GB/s: {@code ops/s * size / 1e9}, or {@code bytes / 1e9} (GiB/s: divide by 2^30 instead).
 */
@BenchmarkMode(Mode.Throughput)
@OutputTimeUnit(TimeUnit.SECONDS)
@Warmup(iterations = 3, time = 1)
@Measurement(iterations = 5, time = 1)
@Fork(1)
public class CopyBench {

    static final long SOURCE_BYTES = 1L << 30;
    static final int OFFSETS = 4096;

    @State(Scope.Thread)
    public static class Buffers {

        /** Bytes per operation: 64 KiB, 1 MiB and 4 MiB values. */
        @Param({"65536", "1048576", "4194304"})
        public int size;

        Arena arena;
        MemorySegment source;
        MemorySegment nativeDestination;
        byte[] heapDestination;
        long[] offsets;
        int next;

        @Setup(Level.Trial)
        public void setUp() {
            arena = Arena.ofShared();
            source = arena.allocate(SOURCE_BYTES, 4096);
            // touch every page with non-trivial content (a random 1 MiB pattern repeated)
            SplittableRandom rnd = new SplittableRandom(5);
            byte[] pattern = new byte[1 << 20];
            rnd.nextBytes(pattern);
            for (long off = 0; off < SOURCE_BYTES; off += pattern.length) {
                MemorySegment.copy(pattern, 0, source, ValueLayout.JAVA_BYTE, off, pattern.length);
            }
            nativeDestination = arena.allocate(size, 4096);
            nativeDestination.fill((byte) 0);
            heapDestination = new byte[size];
            offsets = new long[OFFSETS];
            for (int i = 0; i < OFFSETS; i++) {
                offsets[i] = ObjectLayout.align(rnd.nextLong(SOURCE_BYTES - size - ObjectLayout.ALIGNMENT));
            }
        }

        long nextOffset() {
            int i = next;
            next = (i + 1) & (OFFSETS - 1);
            return offsets[i];
        }

        @TearDown(Level.Trial)
        public void tearDown() {
            arena.close();
        }
    }

    /** Bytes processed, reported by JMH as a rate (bytes/s) next to the primary ops/s. */
    @State(Scope.Thread)
    @AuxCounters(AuxCounters.Type.OPERATIONS)
    public static class Bytes {

        public long bytes;

        @Setup(Level.Iteration)
        public void reset() {
            bytes = 0;
        }
    }

    @Benchmark
    public MemorySegment copyToNative(Buffers b, Bytes counter) {
        MemorySegment.copy(b.source, b.nextOffset(), b.nativeDestination, 0, b.size);
        counter.bytes += b.size;
        return b.nativeDestination;
    }

    @Benchmark
    public byte[] copyToHeap(Buffers b, Bytes counter) {
        MemorySegment.copy(b.source, ValueLayout.JAVA_BYTE, b.nextOffset(), b.heapDestination, 0, b.size);
        counter.bytes += b.size;
        return b.heapDestination;
    }

    @Benchmark
    public int valueCrc(Buffers b, Bytes counter) {
        int crc = ObjectLayout.valueCrc(b.source.asSlice(b.nextOffset(), b.size));
        counter.bytes += b.size;
        return crc;
    }
}
