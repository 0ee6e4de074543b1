package io.kvpool.master.events;

import java.util.List;

/**
 * What the master tells about the objects it lists, for routers: an object became visible in a
 * medium, left one, or everything went at once. Keys are the pool's object keys; turning them into
 * block hashes and frames is the publisher's business, off the master's threads.
 *
 * <p>Contract for implementations: every call returns at once and never blocks (the master calls
 * them under a shard's lock, on its request threads); an event that cannot be kept is dropped and
 * counted, never waited for. Calls are linearizable: one call that returns before another starts
 * is published before it ({@code ObjectEvents} relies on this to keep a remove_all exact).
 */
public interface KvEventSink {

    /** {@code keys} are now listed in {@code medium} (a put committed, a spill landed, a copy added). */
    void stored(List<byte[]> keys, Medium medium);

    /** {@code keys} are no longer listed in {@code medium} (removed, evicted, lost with a node, moved). */
    void removed(List<byte[]> keys, Medium medium);

    /** Every object is gone (a reset). */
    void allCleared();

    /** Whether anything listens: when not, the master skips collecting what it would say. */
    default boolean enabled() {
        return true;
    }

    /** Says nothing to nobody: the master with events off. */
    KvEventSink NONE = new KvEventSink() {
        @Override
        public void stored(List<byte[]> keys, Medium medium) {
        }

        @Override
        public void removed(List<byte[]> keys, Medium medium) {
        }

        @Override
        public void allCleared() {
        }

        @Override
        public boolean enabled() {
            return false;
        }
    };
}
