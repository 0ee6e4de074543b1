package io.kvpool.master;

import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;
import io.kvpool.protocol.msg.NodeMessages.ReplicateItem;

import java.util.Collection;
import java.util.Collections;
import java.util.List;

/**
 * How the master tells nodes about decisions that change what their regions mean. Frees are
 * advisory and may be batched (a node also drops a region when a write overlaps it); resets are
 * synchronous, because a removeAll must not return before nodes refuse writes from the old epoch.
 */
interface NodeNotifier extends AutoCloseable {

    /**
     * A copy on {@code segment} was freed: a memory region (offset, generation) or a disk-tier copy
     * (generation). With {@code spill} the node moves a memory object to its SSD tier instead of
     * dropping it. May be delivered later, in a batch.
     */
    void free(Segment segment, long offset, long generation, Tier tier, boolean spill);

    /**
     * Delivers every free queued so far and returns once nodes acknowledged them (or timed out). Called
     * after explicit removals, so a removed object cannot come back through a node's inventory if the
     * master restarts right afterwards.
     */
    void flush();

    /**
     * {@link #flush()} after an explicit removal: returns once nodes acknowledged or a bound (the read
     * lease) passed. Readers do not depend on it (read leases keep removals absolute); it keeps a
     * removed object from coming back through a node's inventory if the master restarts right after.
     */
    default void flushRemovals() {
        flush();
    }

    /**
     * Every object on these segments is void; accept writes only from {@code epoch} on. Returns when
     * every reachable node acknowledged or a bound (the read lease) passed; a node that missed it
     * learns the epoch from its next heartbeat reply.
     */
    void reset(Collection<Segment> segments, long epoch);

    /**
     * Asks the node of {@code source} to write these copies to the node of {@code target}
     * (NODE_REPLICATE under {@code epoch} and this master's term) and waits for it. One code per item;
     * every item FAILED when the source cannot be reached or does not answer in time. Used by
     * {@link Repair}; no lock may be held.
     */
    default List<ResultCode> replicate(Segment source, Segment target, long epoch, List<ReplicateItem> items) {
        return Collections.nCopies(items.size(), ResultCode.FAILED);
    }

    /** The segment is gone; what was queued for it stays owed to its name ({@link UndeliveredFrees}). */
    void forget(Segment segment);

    /** Whether the node of this segment name missed so many frees that it must come back empty. */
    default boolean mustComeBackEmpty(String segmentName) {
        return false;
    }

    /**
     * The segment of this name was dropped for silence: the index no longer knows its copies, so no
     * later removal can be owed to it. {@code elsewhere}: the generations of its objects that kept
     * copies on other segments; when it comes back, those are taken only while still live.
     */
    default void silenced(String segmentName, Collection<Long> elsewhere) {
    }

    /** Whether this generation had copies elsewhere when the segment of this name was dropped for silence. */
    default boolean copiedElsewhere(String segmentName, long generation) {
        return false;
    }

    /**
     * Whether a free of {@code generation} to the node of this segment name was never delivered: the
     * copy it offers in its inventory was removed or evicted meanwhile, and must be refused.
     */
    default boolean freedWhileAway(String segmentName, long generation) {
        return false;
    }

    /** The node of this segment name finished its inventory: nothing owed to it is needed any more. */
    default void inventoryTaken(String segmentName) {
    }

    /** Frees owed to nodes that could not be reached (a gauge). */
    default long undeliveredFrees() {
        return 0;
    }

    @Override
    void close();

    /** For tests of the master alone: delivers nothing. */
    NodeNotifier NONE = new NodeNotifier() {
        @Override
        public void free(Segment segment, long offset, long generation, Tier tier, boolean spill) {
        }

        @Override
        public void flush() {
        }

        @Override
        public void reset(Collection<Segment> segments, long epoch) {
        }

        @Override
        public void forget(Segment segment) {
        }

        @Override
        public void close() {
        }
    };
}
