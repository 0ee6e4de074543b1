package io.kvpool.client;

/** Outcome of a put or upsert. Every value here is an expected outcome, never an exception. */
public enum PutStatus {
    /** Stored and visible to every client. */
    OK,
    /** A put found the key present (stored, or being written by someone else); nothing changed. */
    ALREADY_EXISTS,
    /** No segment has room even after eviction. */
    POOL_FULL,
    /** No node has joined the pool yet. */
    NO_SEGMENT,
    /** A removeAll(force) happened while this put was in flight, so it was discarded. */
    FENCED,
    /** The bytes could not be written (node unreachable or gone, or the reservation expired). Not stored. */
    FAILED,
    /**
     * The key's tenant is at its memory quota and refuses puts over it, or could not make room from its own objects
     * (docs/operations.md, "Tenants"). Not stored; nobody else's objects were touched.
     */
    QUOTA_EXCEEDED
}
