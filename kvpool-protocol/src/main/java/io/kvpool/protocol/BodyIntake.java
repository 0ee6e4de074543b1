package io.kvpool.protocol;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.ReadableByteChannel;
import java.time.Duration;

/**
 * Where one connection's request bodies are read: a standing buffer for small bodies, and for a
 * larger one a buffer of exactly its size, allocated only once its whole size has been reserved from
 * the process's {@link BodyBudget} (see there for why whole, and in what order). One per connection,
 * used by one thread at a time; the frame's server gives the reservation back through
 * {@link #release} once the frame has been handled, whatever happened.
 *
 * <p>Bodies live on the heap: parsing copies many small fields (keys) out of them, which is far
 * cheaper from a heap buffer than from a direct one. Payloads never come through here.
 */
final class BodyIntake {

    /**
     * A connection's standing body buffer, kept for its life: a body that fits takes nothing from the
     * budget. Every authentication frame fits ({@link Handshake#maxBodyBytes}).
     */
    static final int STANDING_BYTES = 4 << 10;

    private final BodyBudget budget;
    private final ByteBuffer standing = ByteBuffer.allocate(STANDING_BYTES).order(ByteOrder.LITTLE_ENDIAN);
    /** Bytes the body being handled reserved; 0 when it fit the standing buffer. */
    private int reserved;

    BodyIntake(BodyBudget budget) {
        this.budget = budget;
    }

    /**
     * Reads a body of {@code length} bytes from {@code in}: the buffer holding it, flipped for reading;
     * or null, with nothing read and nothing reserved, when a body larger than the standing buffer
     * could not reserve its size within {@code wait}. The caller must {@link #release} after handling
     * the body, and after a failed read.
     */
    ByteBuffer read(ReadableByteChannel in, int length, Duration wait) throws IOException, InterruptedException {
        if (reserved != 0) {
            throw new IllegalStateException("a body was read before the last one's " + reserved + " bytes were released");
        }
        ByteBuffer b = standing;
        if (length > STANDING_BYTES) {
            if (!budget.take(length, wait)) {
                return null;
            }
            reserved = length;
            b = ByteBuffer.allocate(length).order(ByteOrder.LITTLE_ENDIAN);
        }
        b.clear().limit(length);
        Channels.readFully(in, b);
        return b.flip();
    }

    /** Gives back what the last body reserved (its buffer becomes garbage); nothing if it reserved nothing. */
    void release() {
        if (reserved != 0) {
            budget.give(reserved);
            reserved = 0;
        }
    }
}
