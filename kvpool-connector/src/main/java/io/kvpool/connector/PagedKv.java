package io.kvpool.connector;

import java.lang.foreign.MemorySegment;

/**
 * The engine's paged KV memory, as a connector reads and fills it: fixed-size blocks of
 * {@link #blockSize()} tokens, each one contiguous region holding every layer's K and V for its
 * tokens. A block is the unit a connector saves and loads: one pool object per block.
 *
 * <p>Segments must be accessible from any thread (a shared or global arena): loads and saves run on
 * the connector's threads.
 */
public interface PagedKv {

    /** Tokens per block. */
    int blockSize();

    /** Layers: {@link KvConnector#waitForLayerLoad} and {@link KvConnector#saveKvLayer} count them. */
    int numLayers();

    /** Bytes of one block, every layer. */
    long blockBytes();

    /** Block {@code id}'s memory, {@link #blockBytes()} long. */
    MemorySegment block(int id);
}
