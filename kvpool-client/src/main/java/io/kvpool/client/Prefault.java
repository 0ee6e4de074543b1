package io.kvpool.client;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandle;
import java.util.concurrent.Executor;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicLongArray;

/**
 * Prefaulting of a shared-segment mapping in windows of {@link #WINDOW} bytes, each the first time a
 * copy (into or out of the segment) touches it, with {@code madvise(MADV_POPULATE_READ)} (Linux
 * 5.14+). Why: see {@link SharedSegments}.
 *
 * <p>Read population serves writes too: on a shared tmpfs mapping the kernel tracks no dirty pages,
 * so the entries a read fault installs are writable, and a read fault maps up to 16 pages at once
 * (fault-around) where a write fault maps one. Measured on a 1 GiB {@code /dev/shm} file here
 * (1 MiB copies, each window populated when first touched): populating costs 78 ms per GiB for
 * reading against 184 for writing; first-touch writes ran at 2.8-3.0 GB/s unpopulated, 3.1-4.3
 * after {@code MADV_POPULATE_WRITE} and 7.2-7.5 after {@code MADV_POPULATE_READ} (warm: 16).
 * First-touch reads ran at 7.4-7.7 GB/s either way (read faults already map 16 pages at once), so
 * for reads the prefault is about even; it is done anyway, one window at a time, because it readies
 * the window for writes too. On a kernel that did install read-only entries, a first write would
 * still take a (cheap, write-protect) fault per page: slower, never wrong.
 *
 * <p>Which windows are populated is one bit per window in an {@link AtomicLongArray}: the check
 * before every copy is a volatile read. Two threads reaching a fresh window together may both
 * populate it, which is harmless (the second call finds the pages mapped). If the kernel refuses the
 * advice (an older kernel, memory it cannot map), the mapping stops prefaulting and copies fault page
 * by page as before.
 *
 * <p><b>Ahead of writes.</b> Populating a window of pages the node already committed still costs the
 * kernel about 4.6 ms here (page-table entries for 16,384 pages, 72 ms per GiB), and a writer pays it
 * in the middle of a put: a 1 MiB put took 85 us at p50 and 4.6 ms once every 64 puts, a quarter of a
 * fresh client's time over its first pass of a 6 GiB segment. Writes under a lease go up through the
 * segment, so a write also asks a background thread to populate the window after the one it ends in
 * ({@link Windows#populateAhead}); by the time the writer gets there it is mapped, and the cost moved
 * to a core that is otherwise idle in a same-machine put (the node does little for one). That thread
 * is one per process, a daemon, and never fails a write: advice it cannot give is left to the writer.
 * Reads land anywhere, so they populate only what they touch.
 */
final class Prefault {

    private static final Logger log = LoggerFactory.getLogger(Prefault.class);

    /** Linux's advice number (include/uapi/asm-generic/mman-common.h). */
    static final int MADV_POPULATE_READ = 22;
    /** Bytes prefaulted at once, the first time a copy touches them. */
    static final long WINDOW = 64L << 20;

    /** Runs the populations ahead of writers ({@link Windows#populateAhead}), one at a time, off their threads. */
    private static final class Background {
        static final ExecutorService EXECUTOR = Executors.newSingleThreadExecutor(r -> {
            Thread t = new Thread(r, "kvpool-prefault");
            t.setDaemon(true);
            return t;
        });
    }

    /** The background thread's executor, made on first use. */
    static Executor background() {
        return Background.EXECUTOR;
    }

    /** Gives the kernel advice about [address, address + length); false if it refused. */
    interface Advisor {
        boolean advise(long address, long length, int advice);
    }

    /** madvise(2) through java.lang.foreign, or null where it is unavailable or not allowed. */
    static final Advisor NATIVE = nativeAdvisor();

    private Prefault() {
    }

    private static Advisor nativeAdvisor() {
        if (!System.getProperty("os.name", "").startsWith("Linux") || ValueLayout.ADDRESS.byteSize() != 8) {
            return null;
        }
        if (!Prefault.class.getModule().isNativeAccessEnabled()) {
            log.info("same-machine copies are not prefaulted (first touches of each page fault): run with "
                    + "--enable-native-access=ALL-UNNAMED to let the client call madvise");
            return null;
        }
        try {
            Linker linker = Linker.nativeLinker();
            MemorySegment fn = linker.defaultLookup().find("madvise").orElse(null);
            if (fn == null) {
                return null;
            }
            MethodHandle madvise = linker.downcallHandle(fn, FunctionDescriptor.of(ValueLayout.JAVA_INT,
                    ValueLayout.ADDRESS, ValueLayout.JAVA_LONG, ValueLayout.JAVA_INT));
            return (address, length, advice) -> {
                try {
                    return (int) madvise.invokeExact(MemorySegment.ofAddress(address), length, advice) == 0;
                } catch (Throwable t) {
                    return false;
                }
            };
        } catch (RuntimeException | LinkageError e) {
            log.info("same-machine copies are not prefaulted: madvise is unavailable ({})", e.toString());
            return null;
        }
    }

    /**
     * The populated windows of one mapping. Thread-safe. It keeps the mapping's address and size, not
     * the mapping: a registry of these does not keep mappings from being unmapped.
     */
    static final class Windows {
        private final String name;
        private final long base;
        private final long size;
        private final Advisor advisor;
        private final AtomicLongArray populated;
        private volatile boolean off;

        /** Windows handed to the background thread, so each is asked for once. */
        private final AtomicLongArray requested;
        private final Executor ahead;

        /** @param advisor null: never prefault */
        Windows(String name, MemorySegment mapping, Advisor advisor) {
            this(name, mapping, advisor, background());
        }

        /** @param ahead where {@link #populateAhead} runs its advice */
        Windows(String name, MemorySegment mapping, Advisor advisor, Executor ahead) {
            this.name = name;
            this.base = mapping.address();
            this.size = mapping.byteSize();
            this.advisor = advisor;
            this.ahead = ahead;
            int words = (int) (((size + WINDOW - 1) / WINDOW + 63) >>> 6);
            this.populated = new AtomicLongArray(words);
            this.requested = new AtomicLongArray(words);
            this.off = advisor == null;
        }

        /** True if {@code seg} is the whole mapping these windows belong to. */
        boolean covers(MemorySegment seg) {
            return seg.address() == base && seg.byteSize() == size;
        }

        /** Prefaults the windows of [offset, offset + length) of the mapping not populated yet. */
        void populate(long offset, long length) {
            if (off || length <= 0) {
                return;
            }
            long last = Math.min(offset + length, size) - 1;
            for (long w = offset / WINDOW; w <= last / WINDOW; w++) {
                if (populated(w)) {
                    continue;
                }
                long lo = w * WINDOW;
                if (!advisor.advise(base + lo, Math.min(WINDOW, size - lo), MADV_POPULATE_READ)) {
                    off = true;
                    log.info("segment {}: the kernel refused to prefault the mapping (madvise MADV_POPULATE_READ); "
                            + "same-machine copies fault page by page", name);
                    return;
                }
                set(populated, w);
            }
        }

        /**
         * After a write to [offset, offset + length): has the background thread populate the window that
         * follows it, if nobody did or asked yet (see the class comment). Costs two volatile reads when
         * there is nothing to do.
         */
        void populateAhead(long offset, long length) {
            if (off || length <= 0) {
                return;
            }
            long next = (Math.min(offset + length, size) - 1) / WINDOW + 1;
            if (next * WINDOW >= size || populated(next) || isSet(requested, next)) {
                return;
            }
            if (!set(requested, next)) {
                return; // another writer asked for it first
            }
            long lo = next * WINDOW;
            ahead.execute(() -> {
                if (!off && !populated(next) && advisor.advise(base + lo, Math.min(WINDOW, size - lo), MADV_POPULATE_READ)) {
                    set(populated, next);
                }
                // refused: the writer gives the advice itself when it gets there, and decides then
            });
        }

        /** True once the window holding {@code offset} was populated. */
        boolean populatedAt(long offset) {
            return populated(offset / WINDOW);
        }

        /** False once the kernel refused the advice (or there is no way to give it). */
        boolean prefaulting() {
            return !off;
        }

        private boolean populated(long window) {
            return isSet(populated, window);
        }

        private static boolean isSet(AtomicLongArray bits, long window) {
            int word = (int) (window >>> 6);
            return word < bits.length() && (bits.get(word) & (1L << window)) != 0;
        }

        /** Sets the window's bit; true if this call set it. */
        private static boolean set(AtomicLongArray bits, long window) {
            long bit = 1L << window;
            return (bits.getAndAccumulate((int) (window >>> 6), bit, (v, b) -> v | b) & bit) == 0;
        }
    }
}
