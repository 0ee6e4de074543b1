package io.kvpool.connector;

import com.google.errorprone.annotations.concurrent.GuardedBy;
import io.kvpool.connector.hash.BlockHash;
import io.kvpool.connector.hash.BlockHasher;
import io.kvpool.connector.hash.KeyFormat;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayDeque;
import java.util.HashSet;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.LongAdder;
import java.util.zip.CRC32C;

/**
 * Native offload: KV blocks kept inside the engine process, no servers. A CPU tier of fixed-size
 * slots in off-heap memory and an optional disk tier of fixed-size slots in one file, both LRU:
 *
 * <pre>
 *   save:  block -> free CPU slot (the least recently used CPU block moves to a disk slot first,
 *          or is dropped without a disk tier; the least recently used disk block is dropped)
 *   load:  CPU slot -> block (memory copy), or disk slot -> block (a positional read, CRC32C checked)
 *   index: key (KeyFormat, so weight versions separate) -> slot, in one access-ordered map
 * </pre>
 *
 * Every block has the engine's block size, so slots need no allocator beyond free lists. Saves and
 * loads run on the caller's (worker) thread: a memory copy costs less than handing it off, and
 * nothing outlives the step, so {@link #requestFinished} never asks the engine to keep blocks. The
 * same contract as {@link PoolConnector}, and the same scheduler side ({@link Planner}): misses and
 * failed loads are values, a reset (or a weight-version switch) drops everything and voids loads
 * planned (or matches offered) before it, and a block computed over a failed load is never saved.
 */
public final class LocalOffloadConnector implements KvConnector, VersionedKeys {

    private static final Logger log = LoggerFactory.getLogger(LocalOffloadConnector.class);

    private record Slot(boolean disk, int index, int crc) {
    }

    private final BlockHasher hasher;
    private volatile KeyFormat keys;
    private final long blockBytes;
    private final Arena arena = Arena.ofShared();
    private final MemorySegment cpu;
    private final int cpuSlots;
    private final FileChannel disk;
    private final Path diskFile;
    private final int diskSlots;
    @GuardedBy("this")
    private final ArrayDeque<Integer> freeCpu = new ArrayDeque<>();
    @GuardedBy("this")
    private final ArrayDeque<Integer> freeDisk = new ArrayDeque<>();
    /** key -> slot; access order: the first entries are the least recently used. */
    @GuardedBy("this")
    private final LinkedHashMap<String, Slot> index = new LinkedHashMap<>(1024, 0.75f, true);
    @GuardedBy("this")
    private long generation = 1;

    private final Planner planner;
    // worker side
    @GuardedBy("this")
    private ConnectorMeta current = ConnectorMeta.EMPTY;
    private boolean savesStarted = true;
    private final Set<Integer> loadErrors = ConcurrentHashMap.newKeySet();
    private final Set<Integer> stepLoadErrors = new HashSet<>();

    private final LongAdder lookups = new LongAdder();
    private final LongAdder matchedTokens = new LongAdder();
    private final LongAdder loadedBlocks = new LongAdder();
    private final LongAdder loadedBytes = new LongAdder();
    private final LongAdder failedLoads = new LongAdder();
    private final LongAdder savedBlocks = new LongAdder();
    private final LongAdder savedBytes = new LongAdder();
    private final LongAdder skippedSaves = new LongAdder();
    private final LongAdder droppedSaves = new LongAdder();
    private final LongAdder resets = new LongAdder();

    /**
     * @param cpuBytes   the CPU tier: {@code cpuBytes / blockBytes} blocks (at least one)
     * @param diskDir    the disk tier's directory, or null for none
     * @param diskBytes  the disk tier's size (ignored without a directory)
     */
    public LocalOffloadConnector(BlockHasher hasher, KeyFormat keys, long blockBytes, long cpuBytes, Path diskDir,
                                 long diskBytes) throws IOException {
        this.hasher = hasher;
        this.planner = new Planner(hasher);
        this.keys = keys;
        this.blockBytes = blockBytes;
        if (blockBytes <= 0 || cpuBytes < blockBytes) {
            throw new IllegalArgumentException("native offload: cpu (" + cpuBytes + " bytes) must hold at least one"
                    + " block of " + blockBytes + " bytes");
        }
        long n = cpuBytes / blockBytes;
        if (n > Integer.MAX_VALUE) {
            throw new IllegalArgumentException("native offload: cpu holds too many blocks (" + n + ")");
        }
        this.cpuSlots = (int) n;
        this.cpu = arena.allocate(blockBytes * cpuSlots, 64);
        for (int i = 0; i < cpuSlots; i++) {
            freeCpu.add(i);
        }
        if (diskDir != null && diskBytes >= blockBytes) {
            Files.createDirectories(diskDir);
            this.diskFile = diskDir.resolve("kvpool-native-offload.slots");
            this.disk = FileChannel.open(diskFile, StandardOpenOption.CREATE, StandardOpenOption.READ,
                    StandardOpenOption.WRITE, StandardOpenOption.TRUNCATE_EXISTING);
            this.diskSlots = (int) Math.min(Integer.MAX_VALUE, diskBytes / blockBytes);
            for (int i = 0; i < diskSlots; i++) {
                freeDisk.add(i);
            }
        } else {
            this.disk = null;
            this.diskFile = null;
            this.diskSlots = 0;
        }
        log.info("native offload: {} CPU blocks{}", cpuSlots, disk == null ? "" : ", " + diskSlots + " disk blocks in "
                + diskFile);
    }

    public int cpuBlocks() {
        return cpuSlots;
    }

    public int diskBlocks() {
        return diskSlots;
    }

    /** Blocks held in each tier (CPU, disk). */
    public synchronized int[] held() {
        int d = 0;
        for (Slot s : index.values()) {
            d += s.disk ? 1 : 0;
        }
        return new int[]{index.size() - d, d};
    }

    // ---------------------------------------------------------------- scheduler side

    @Override
    public synchronized Match getNumNewMatchedTokens(ConnectorRequest request, int numComputedTokens) {
        lookups.increment();
        int start = planner.firstBlock(request, numComputedTokens);
        int b = start;
        if (start >= 0) {
            List<BlockHash> h = planner.hashes(request);
            KeyFormat k = keys;
            while (b < h.size() && index.containsKey(k.keyString(h.get(b)))) { // containsKey: no LRU touch
                b++;
            }
        }
        Match m = planner.answer(request, numComputedTokens, start, b - start);
        matchedTokens.add(m.tokens());
        return m;
    }

    @Override
    public synchronized void updateStateAfterAlloc(ConnectorRequest request, int[] blockIds, int numExternalTokens) {
        planner.alloc(request, blockIds, numExternalTokens, keys);
    }

    @Override
    public synchronized ConnectorMeta buildConnectorMeta(List<ScheduledRequest> scheduled) {
        return planner.build(scheduled, keys, generation);
    }

    @Override
    public synchronized boolean requestFinished(ConnectorRequest request, int[] blockIds) {
        planner.forget(request.id());
        return false; // saves complete within the step
    }

    @Override
    public synchronized ResetResult resetCache() {
        long n = index.size();
        clear();
        resets.increment();
        return ResetResult.ok(n);
    }

    @GuardedBy("this")
    private void clear() {
        generation++;
        index.clear();
        freeCpu.clear();
        freeDisk.clear();
        for (int i = 0; i < cpuSlots; i++) {
            freeCpu.add(i);
        }
        for (int i = 0; i < diskSlots; i++) {
            freeDisk.add(i);
        }
        planner.voidAll();
    }

    /** Keys carry the weight version: switching empties the store (nothing of the old version can be used again). */
    @Override
    public synchronized CompletableFuture<Long> switchWeights(String weightsVersion, boolean reclaim) {
        long n = index.size();
        keys = keys.withWeights(weightsVersion);
        clear();
        return CompletableFuture.completedFuture(n);
    }

    // ---------------------------------------------------------------- worker side

    @Override
    public synchronized void startLoadKv(ConnectorMeta meta, PagedKv kv) {
        current = meta;
        savesStarted = false;
        loadErrors.clear();
        stepLoadErrors.clear();
        for (ConnectorMeta.Load l : meta.voidLoads()) { // accepted before a reset: nothing to read
            stepLoadErrors.add(l.blockId());
            failedLoads.increment();
        }
        for (ConnectorMeta.Load l : meta.loads()) {
            Slot s = meta.generation() == generation ? index.get(l.key()) : null;
            if (s == null || !read(s, kv.block(l.blockId()))) {
                stepLoadErrors.add(l.blockId());
                failedLoads.increment();
            } else {
                loadedBlocks.increment();
                loadedBytes.add(blockBytes);
            }
        }
        loadErrors.addAll(stepLoadErrors);
    }

    private boolean read(Slot s, MemorySegment dst) {
        if (!s.disk) {
            MemorySegment.copy(cpu, (long) s.index * blockBytes, dst, 0, blockBytes);
            return true;
        }
        try {
            var b = dst.asByteBuffer();
            long pos = (long) s.index * blockBytes;
            while (b.hasRemaining()) {
                if (disk.read(b, pos + b.position()) < 0) {
                    return false;
                }
            }
            return crc(dst) == s.crc;
        } catch (IOException e) {
            log.warn("native offload: reading disk slot {} failed: {}", s.index, e.toString());
            return false;
        }
    }

    private static int crc(MemorySegment m) {
        CRC32C c = new CRC32C();
        c.update(m.asByteBuffer());
        return (int) c.getValue();
    }

    @Override
    public void waitForLayerLoad(int layer) {
        // loads completed in startLoadKv
    }

    @Override
    public synchronized void saveKvLayer(int layer, PagedKv kv) {
        if (layer != kv.numLayers() - 1 || savesStarted) {
            return;
        }
        savesStarted = true; // a step's saves happen once
        List<ConnectorMeta.Save> saves = current.savesNotOverFailedLoads(stepLoadErrors);
        droppedSaves.add(current.saves().size() - saves.size());
        for (ConnectorMeta.Save s : saves) {
            if (current.generation() != generation) {
                droppedSaves.increment();
                continue;
            }
            if (index.containsKey(s.key())) {
                skippedSaves.increment();
                continue;
            }
            Integer slot = freeCpu.poll();
            if (slot == null) {
                slot = evictCpu();
            }
            if (slot == null) {
                skippedSaves.increment();
                continue;
            }
            MemorySegment.copy(kv.block(s.blockId()), 0, cpu, (long) slot * blockBytes, blockBytes);
            index.put(s.key(), new Slot(false, slot, 0));
            savedBlocks.increment();
            savedBytes.add(blockBytes);
        }
    }

    /** Frees a CPU slot: its least recently used block moves to disk (if there is a disk tier) or is dropped. */
    @GuardedBy("this")
    private Integer evictCpu() {
        for (Iterator<Map.Entry<String, Slot>> it = index.entrySet().iterator(); it.hasNext(); ) {
            Map.Entry<String, Slot> e = it.next();
            Slot s = e.getValue();
            if (s.disk) {
                continue;
            }
            it.remove();
            if (disk != null) {
                Integer d = freeDisk.poll();
                if (d == null) {
                    d = evictDisk();
                }
                if (d != null) {
                    MemorySegment src = cpu.asSlice((long) s.index * blockBytes, blockBytes);
                    try {
                        var b = src.asByteBuffer();
                        long pos = (long) d * blockBytes;
                        while (b.hasRemaining()) {
                            disk.write(b, pos + b.position());
                        }
                        index.put(e.getKey(), new Slot(true, d, crc(src)));
                    } catch (IOException ex) {
                        log.warn("native offload: writing disk slot {} failed: {}", d, ex.toString());
                        freeDisk.add(d);
                    }
                }
            }
            return s.index;
        }
        return null;
    }

    @GuardedBy("this")
    private Integer evictDisk() {
        for (Iterator<Map.Entry<String, Slot>> it = index.entrySet().iterator(); it.hasNext(); ) {
            Slot s = it.next().getValue();
            if (s.disk) {
                it.remove();
                return s.index;
            }
        }
        return null;
    }

    /** For tests: forgets one block, as eviction would; true if it was held. */
    synchronized boolean drop(String key) {
        Slot s = index.remove(key);
        if (s == null) {
            return false;
        }
        (s.disk ? freeDisk : freeCpu).add(s.index);
        return true;
    }

    /** For tests: the keys held, in either tier. */
    synchronized Set<String> heldKeys() {
        return Set.copyOf(index.keySet());
    }

    @Override
    public void waitForSave() {
        // saves complete within the step
    }

    @Override
    public Set<String> getFinished(Set<String> finishedRequestIds) {
        return Set.of();
    }

    @Override
    public Set<Integer> blockIdsWithLoadErrors() {
        Set<Integer> out = Set.copyOf(loadErrors);
        loadErrors.removeAll(out);
        return out;
    }

    @Override
    public ConnectorStats stats() {
        return new ConnectorStats(lookups.sum(), matchedTokens.sum(), loadedBlocks.sum(), loadedBytes.sum(),
                failedLoads.sum(), savedBlocks.sum(), savedBytes.sum(), skippedSaves.sum(), droppedSaves.sum(),
                resets.sum());
    }

    @Override
    public synchronized void close() {
        try {
            if (disk != null) {
                disk.close();
                Files.deleteIfExists(diskFile);
            }
        } catch (IOException e) {
            log.warn("native offload: closing the disk tier: {}", e.toString());
        }
        arena.close();
    }
}
