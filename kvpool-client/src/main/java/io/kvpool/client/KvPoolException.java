package io.kvpool.client;

/**
 * A failure of the pool itself rather than an expected outcome: the master is unreachable, or a peer
 * broke the protocol. Misses, "already exists" and "pool full" are never exceptions. Bad arguments
 * (an over-long key, an oversized value) raise {@link IllegalArgumentException} instead.
 */
public class KvPoolException extends RuntimeException {

    public KvPoolException(String message) {
        super(message);
    }

    public KvPoolException(String message, Throwable cause) {
        super(message, cause);
    }
}
