package io.kvpool.master;

import io.kvpool.config.HostPort;
import io.kvpool.protocol.msg.ControlToken;

/**
 * A node's segment as the master sees it: identity, address, liveness, and the allocator for its
 * space. A segment gets a new id every time its node registers, so a stale reference (a pending
 * put, a client's cached table) to an earlier registration can never reach the new one by mistake.
 */
final class Segment {

    final int id;
    final String name;
    final HostPort address;
    final long nodeIncarnation;
    /** The node's shared-memory file, or empty (see {@link io.kvpool.protocol.msg.MasterMessages.RegisterNode}). */
    final String shmPath;
    /**
     * What the node drew for this registration: every NODE_FREE, NODE_RESET and NODE_REPLICATE to it
     * carries it, or the node refuses them. Never shown (not in stats, pages or logs).
     */
    final ControlToken controlToken;
    final RangeAllocator allocator;
    /** False while the node is still listing its objects: no new puts are placed here until then. */
    volatile boolean active;
    /**
     * Its node is stopping for a restart (NODE_DRAIN): nothing new is placed here, what it holds is still
     * listed and read until the node stops, and its next registration replaces this one.
     */
    volatile boolean draining;
    /**
     * Taken over by a promoted standby from the leader before it: listed and read at once, placed on only once
     * its node heartbeats in this master's term ({@link Membership#heartbeat}).
     */
    volatile boolean awaitingTerm;
    /**
     * Its node missed frees this master (or the leader before it) owed it, so what it held may include removed
     * objects: its inventory is listed and every item refused, which makes the node drop them
     * ({@link Membership#registerNode}, {@link NodeReports#inventory}). Set at registration, before the inventory.
     */
    volatile boolean comesBackEmpty;
    /**
     * The peer address of the master connection this registration last spoke on (its registration or a
     * heartbeat), or null once that connection closed: a registration with nobody behind it any more,
     * which another may replace without proof ({@link Membership#registerNode}). Null too for a
     * registration made in-process (tests), which any other may replace.
     */
    volatile String link;
    volatile long lastHeartbeatMillis;
    /** The node's per-tier counters from its last heartbeat; {@code hasDisk()} tells whether it has an SSD tier. */
    volatile io.kvpool.protocol.msg.MasterMessages.TierStats tiers = io.kvpool.protocol.msg.MasterMessages.TierStats.NONE;

    Segment(int id, String name, HostPort address, long capacity, long nodeIncarnation, String shmPath,
            ControlToken controlToken, long nowMillis) {
        this(id, name, address, nodeIncarnation, shmPath, controlToken, nowMillis, new RangeAllocator(capacity));
    }

    /** A segment whose space is {@code allocator}'s (a promoted standby's copy kept it: {@link TakeOver}). */
    Segment(int id, String name, HostPort address, long nodeIncarnation, String shmPath, ControlToken controlToken,
            long nowMillis, RangeAllocator allocator) {
        this.controlToken = controlToken;
        this.id = id;
        this.shmPath = shmPath;
        this.name = name;
        this.address = address;
        this.nodeIncarnation = nodeIncarnation;
        this.allocator = allocator;
        this.lastHeartbeatMillis = nowMillis;
    }

    /** Whether new objects may be placed here: its inventory is in, and its node is not draining. */
    boolean placeable() {
        return active && !draining;
    }

    @Override
    public String toString() {
        return "segment " + name + " (id " + id + ")";
    }
}
