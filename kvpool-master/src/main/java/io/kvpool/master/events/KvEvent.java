package io.kvpool.master.events;

import java.util.List;

/** One event as the master handed it over, waiting in the queue for the publisher: keys, not hashes yet. */
sealed interface KvEvent {

    /** Objects now listed in a medium: vLLM's {@code BlockStored}. */
    record Stored(List<byte[]> keys, Medium medium) implements KvEvent {
    }

    /** Objects no longer listed in a medium: vLLM's {@code BlockRemoved}. */
    record Removed(List<byte[]> keys, Medium medium) implements KvEvent {
    }

    /** Everything went: vLLM's {@code AllBlocksCleared}. */
    record AllCleared() implements KvEvent {
    }
}
