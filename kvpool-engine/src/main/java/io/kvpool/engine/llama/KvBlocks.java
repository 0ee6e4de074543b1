package io.kvpool.engine.llama;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * The paged KV cache's storage: {@code numBlocks} blocks of {@code blockSize} tokens, each one
 * contiguous off-heap region holding every layer's keys and values for its tokens, float32
 * little-endian, so a block moves to or from the pool as one object:
 *
 * <pre>
 *   block b, at b * blockBytes:
 *   +-------------------------------+-------------------------------+----
 *   | layer 0: K                    | layer 0: V                    | layer 1: K ...
 *   |  [token in block][kv head][d] |  [token in block][kv head][d] |
 *   +-------------------------------+-------------------------------+----
 *   one K or V part: blockSize * nKvHeads * headDim floats
 *   blockBytes = nLayers * 2 * blockSize * nKvHeads * headDim * 4
 * </pre>
 *
 * Storage only: which block ids are free is the engine's business. The arena is shared, so the
 * connector's threads can copy blocks while the engine's thread computes others.
 */
public final class KvBlocks implements AutoCloseable {

    private static final ValueLayout.OfFloat F = ValueLayout.JAVA_FLOAT_UNALIGNED;

    private final Arena arena = Arena.ofShared();
    private final MemorySegment all;
    private final int numBlocks;
    private final int blockSize;
    private final int kvDim;
    private final long partBytes;
    private final long blockBytes;

    public KvBlocks(ModelConfig model, int numBlocks, int blockSize) {
        if (numBlocks < 1 || blockSize < 1) {
            throw new IllegalArgumentException("KV cache: numBlocks and blockSize must be at least 1, got " + numBlocks
                    + " and " + blockSize);
        }
        this.numBlocks = numBlocks;
        this.blockSize = blockSize;
        this.kvDim = model.kvDim();
        this.partBytes = (long) blockSize * kvDim * Float.BYTES;
        this.blockBytes = 2L * model.nLayers() * partBytes;
        this.all = arena.allocate(blockBytes * numBlocks, 64);
    }

    public int numBlocks() {
        return numBlocks;
    }

    public int blockSize() {
        return blockSize;
    }

    public long blockBytes() {
        return blockBytes;
    }

    public MemorySegment block(int id) {
        if (id < 0 || id >= numBlocks) {
            throw new IndexOutOfBoundsException("KV block " + id + " outside 0.." + (numBlocks - 1));
        }
        return all.asSlice(id * blockBytes, blockBytes);
    }

    /** Byte offset in {@link #all} of the K (v = 0) or V (v = 1) vector of a token slot. */
    long offset(int block, int layer, int v, int slot) {
        return block * blockBytes + (2L * layer + v) * partBytes + (long) slot * kvDim * Float.BYTES;
    }

    void write(int block, int layer, int v, int slot, float[] src, int from) {
        MemorySegment.copy(src, from, all, F, offset(block, layer, v, slot), kvDim);
    }

    void read(int block, int layer, int v, int slot, float[] dst, int to) {
        MemorySegment.copy(all, F, offset(block, layer, v, slot), dst, to, kvDim);
    }

    @Override
    public void close() {
        arena.close();
    }
}
