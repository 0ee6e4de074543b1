package io.kvpool.bench;

import java.time.Duration;

/**
 * Something that stores and returns values by key, measured the same way whatever it is: kvpool
 * over TCP, kvpool over shared memory, Redis, or a baseline that only moves bytes (raw loopback TCP,
 * raw memory copy). Implementations prepare what a get needs (stored keys) themselves.
 */
public interface StoreTarget extends AutoCloseable {

    /** Short name used in tables, JSON and charts, e.g. {@code kvpool-tcp}, {@code redis}, {@code raw-tcp}. */
    String name();

    /** {@code clients} clients each putting values of {@code valueSize} bytes for {@code duration}. */
    Measurement put(int valueSize, int clients, Duration warmup, Duration duration) throws Exception;

    /** {@code clients} clients each getting values of {@code valueSize} bytes (stored beforehand) for {@code duration}. */
    Measurement get(int valueSize, int clients, Duration warmup, Duration duration) throws Exception;

    /** Drops what this target stored, so the next configuration starts empty. */
    default void clear() throws Exception {
    }

    @Override
    default void close() throws Exception {
    }
}
