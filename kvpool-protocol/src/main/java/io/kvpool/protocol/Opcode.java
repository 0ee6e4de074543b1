package io.kvpool.protocol;

/**
 * Every operation on the wire. Codes 0x01-0x7F are served by the master, 0x80-0xFF by nodes.
 * Single and batch forms of an operation share one body layout (a count and items); the single form
 * requires exactly one item. They have separate opcodes so that metrics count them separately.
 * The body of each is documented in docs/protocol.md and in {@code io.kvpool.protocol.msg}.
 */
public enum Opcode {
    // ---- master: session ----
    HELLO(0x01, "hello"),
    PING(0x02, "ping"),
    /**
     * A client's read lease: renews it, acknowledges the invalidations the client applied, and waits
     * (long poll) for new ones. Body: {@code LeaseMessages.LeaseRequest} / {@code LeaseReply}.
     */
    LEASE(0x03, "lease"),
    /**
     * (version 8) The first half of a connection's authentication, served by masters and nodes alike:
     * the client's nonce; the reply is the server's nonce and its proof. See {@link Handshake}.
     */
    AUTH_BEGIN(0x04, "auth_begin"),
    /** (version 8) The second half: the level the client claims and its proof; the reply is the level granted. */
    AUTH_PROVE(0x05, "auth_prove"),

    // ---- master: writes (two-phase put) ----
    PUT_START(0x10, "put_start"),
    BATCH_PUT_START(0x11, "batch_put_start"),
    PUT_END(0x12, "put_end"),
    BATCH_PUT_END(0x13, "batch_put_end"),
    PUT_REVOKE(0x14, "put_revoke"),
    BATCH_PUT_REVOKE(0x15, "batch_put_revoke"),
    // ---- master: writes under a write lease (version 5; docs/architecture.md, "Write leases") ----
    /** A range of one segment for a writer to place objects in. Body: {@code WriteLeaseMessages.Grant} / {@code Granted}. */
    WRITE_LEASE(0x16, "write_lease"),
    /** Objects written inside a lease become visible. Body: {@code WriteLeaseMessages.Commit} / {@code Codes}. */
    COMMIT(0x17, "commit"),
    /** The writer gives back what it did not use of a lease. Body: {@code WriteLeaseMessages.Release} / empty. */
    RELEASE(0x18, "release"),

    // ---- master: reads and probes ----
    GET_REPLICA_LIST(0x20, "get_replica_list"),
    BATCH_GET_REPLICA_LIST(0x21, "batch_get_replica_list"),
    EXIST_KEY(0x22, "exist_key"),
    BATCH_EXIST_KEY(0x23, "batch_exist_key"),
    PREFIX_MATCH(0x24, "prefix_match"),
    OBJECT_SIZE(0x25, "object_size"),
    /** PREFIX_MATCH with 16-byte key digests ({@link KeyDigest}) instead of keys. Body: {@code DigestList}. */
    PREFIX_MATCH_DIGEST(0x26, "prefix_match_digest"),
    /** BATCH_EXIST_KEY with 16-byte key digests instead of keys. Body: {@code DigestList}. */
    BATCH_EXIST_DIGEST(0x27, "batch_exist_digest"),
    /** In which tier each key is: memory, only the SSD tier, or absent (version 13). Body: {@code KeyList}. */
    TIER_LOOKUP(0x28, "tier_lookup"),
    /**
     * What the engine knows of blocks the client is about to save (tokens, parent hash, block size, LoRA, salt),
     * for the master's KV events (version 14). Body: {@code BlockInfoList}; reply: i32, infos kept.
     */
    BLOCK_INFO(0x29, "block_info"),

    // ---- master: removal ----
    REMOVE(0x30, "remove"),
    BATCH_REMOVE(0x31, "batch_remove"),
    REMOVE_BY_PREFIX(0x32, "remove_by_prefix"),
    REMOVE_ALL(0x33, "remove_all"),

    // ---- master: introspection ----
    CLUSTER_STATS(0x40, "cluster_stats"),

    // ---- master: membership (from nodes) ----
    REGISTER_NODE(0x50, "register_node"),
    NODE_HEARTBEAT(0x51, "node_heartbeat"),
    NODE_INVENTORY(0x52, "node_inventory"),
    /** A node spilled objects to its SSD tier: the master lists them again, as disk replicas. Body: Inventory. */
    NODE_DISK_ADD(0x53, "node_disk_add"),
    /** A node's SSD tier let objects go (its watermark, a checksum failure). Body: Inventory. */
    NODE_DISK_DROP(0x54, "node_disk_drop"),
    /**
     * (version 12) A node stopping for a restart: the master places nothing more on its segment, which
     * keeps serving what it holds until its node stops. Body: {@code MasterMessages.NodeDrain}; reply: one code.
     */
    NODE_DRAIN(0x55, "node_drain"),

    // ---- master to master: a standby follows the leader (version 15; docs/architecture.md, "Hot standby") ----
    /**
     * (version 15) The leader's change feed from a position: full-state records of what changed, waiting a
     * little when there is nothing yet. Body: {@code StandbyMessages.Follow} / {@code FeedBatch}.
     */
    FEED_FOLLOW(0x56, "feed_follow"),
    /**
     * (version 15) One part of one shard of the leader's index as records (or the segments and the epoch), what a
     * standby starts from before it follows. Body: {@code StandbyMessages.Snapshot} / {@code SnapshotPart}.
     */
    FEED_SNAPSHOT(0x57, "feed_snapshot"),
    /**
     * (version 18) A heartbeat the master answers only with news: a NODE_HEARTBEAT body, and the NODE_HEARTBEAT
     * reply when that reply would tell the node something (NOT_FOUND, a newer epoch, another term); otherwise no
     * reply at all. A node sends these between full heartbeats.
     */
    NODE_BEACON(0x58, "node_beacon"),

    // ---- node: object bytes ----
    NODE_WRITE(0x80, "node_write"),
    NODE_READ(0x81, "node_read"),
    // ---- node: control (from the master) ----
    NODE_FREE(0x82, "node_free"),
    NODE_RESET(0x83, "node_reset"),
    // ---- node: same-machine writes (the client copies the bytes into the shared segment itself) ----
    NODE_SHM_WRITE_BEGIN(0x84, "node_shm_write_begin"),
    NODE_SHM_WRITE_END(0x85, "node_shm_write_end"),
    /** A same-machine writer sets the unwritten part of its write lease aside. Body: {@code NodeMessages.ShmLease}. */
    NODE_SHM_LEASE(0x86, "node_shm_lease"),
    /** Objects copied into that range become readable on the node. Body: {@code NodeMessages.Write}, no payload. */
    NODE_SHM_LEASE_WRITE(0x87, "node_shm_lease_write"),
    /**
     * The master asks a node holding a copy to write it to another node (a repair of an object below
     * its copies). Body: {@code NodeMessages.Replicate}; reply: one result code per item.
     */
    NODE_REPLICATE(0x88, "node_replicate"),
    /**
     * (version 11) A byte range of each object's value, the object named as in NODE_READ. Body:
     * {@code NodeMessages.ReadRange}; reply: result codes and the OK items' ranges as payload.
     */
    NODE_READ_RANGE(0x89, "node_read_range"),
    /**
     * (version 11) Admits writes whose values arrive in parts: NODE_WRITE's body without payload (the
     * checksums come with the end). The regions stay being written for this connection until
     * NODE_PART_END. Reply: result codes.
     */
    NODE_PART_BEGIN(0x8A, "node_part_begin"),
    /** (version 11) Byte ranges of values begun on this connection. Body: {@code NodeMessages.PartWrite} + payload. */
    NODE_PART_WRITE(0x8B, "node_part_write"),
    /** (version 11) Ends writes begun on this connection: each value's CRC32C, readable or dropped. Body: {@code NodeMessages.PartEnd}. */
    NODE_PART_END(0x8C, "node_part_end"),
    /**
     * (version 17) NODE_WRITE of objects under a write lease whose node then commits what landed at its
     * master on the writer's behalf: a put over TCP in one exchange. Body: {@code NodeMessages.WriteCommit}
     * + the values as payload; reply: {@code NodeMessages.WriteCommitReply}.
     */
    NODE_WRITE_COMMIT(0x8D, "node_write_commit");

    private static final Opcode[] BY_CODE = new Opcode[256];

    static {
        for (Opcode op : values()) {
            BY_CODE[op.code] = op;
        }
    }

    public final int code;
    /** The operation's name in metrics and logs, e.g. {@code put_start}. */
    public final String metricName;

    Opcode(int code, String metricName) {
        this.code = code;
        this.metricName = metricName;
    }

    /** The opcode with this code, or null if this protocol version has none. */
    public static Opcode of(int code) {
        return code >= 0 && code < 256 ? BY_CODE[code] : null;
    }

    /** True for the forms that carry many items in one round trip. */
    public boolean isBatch() {
        return metricName.startsWith("batch_") || this == PREFIX_MATCH || this == PREFIX_MATCH_DIGEST
                || this == OBJECT_SIZE || this == COMMIT || this == TIER_LOOKUP || this == BLOCK_INFO;
    }

    /** True for operations served by nodes rather than the master. */
    public boolean isNodeOp() {
        return code >= 0x80;
    }

    /**
     * The secret a connection must have proven for this request on a secured server (version 8): the
     * admin secret for destructive operations and for node administration (a node's registration and
     * reports to the master, the master's frees, resets and copies to a node), the cluster secret for
     * everything else.
     */
    public Access access() {
        return switch (this) {
            case REMOVE_ALL, REMOVE_BY_PREFIX, REGISTER_NODE, NODE_HEARTBEAT, NODE_BEACON, NODE_INVENTORY, NODE_DISK_ADD,
                 NODE_DISK_DROP, NODE_DRAIN, NODE_FREE, NODE_RESET, NODE_REPLICATE, FEED_FOLLOW, FEED_SNAPSHOT -> Access.ADMIN;
            default -> Access.DATA;
        };
    }

    /** True for the authentication exchange, which every server serves whatever its role. */
    public boolean isAuth() {
        return this == AUTH_BEGIN || this == AUTH_PROVE;
    }
}
