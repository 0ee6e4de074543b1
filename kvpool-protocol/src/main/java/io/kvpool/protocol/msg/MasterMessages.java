package io.kvpool.protocol.msg;

import io.kvpool.protocol.BadRequestException;
import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameStatus;
import io.kvpool.protocol.MalformedFrameException;
import io.kvpool.protocol.ResultCode;
import io.kvpool.protocol.Tier;

import java.util.ArrayList;
import java.util.List;
import java.util.UUID;

/**
 * Bodies of requests served by the master and of their replies. Each record writes itself with
 * {@code write} and is parsed by its static {@code read}; the layouts are drawn in docs/protocol.md.
 */
public final class MasterMessages {

    private MasterMessages() {
    }

    /** Who is on the other end of a connection. */
    public enum Role {
        CLIENT, NODE, ADMIN;

        static Role of(int code) {
            if (code < 0 || code >= values().length) {
                throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME,
                        "unknown role " + code);
            }
            return values()[code];
        }
    }

    static void writeUuid(BodyWriter w, UUID id) {
        w.i64(id.getMostSignificantBits()).i64(id.getLeastSignificantBits());
    }

    static UUID readUuid(BodyReader r) {
        return new UUID(r.i64("id high"), r.i64("id low"));
    }

    // ------------------------------------------------------------------ HELLO / PING

    /** HELLO: the first request on a connection; registers a client for the active-client count. */
    public record Hello(Role role, UUID clientId, String host, long pid) {
        public void write(BodyWriter w) {
            w.u8(role.ordinal());
            writeUuid(w, clientId);
            w.string(host).i64(pid);
        }

        public static Hello read(BodyReader r) {
            return new Hello(Role.of(r.u8("role")), readUuid(r), r.string("host"), r.i64("pid"));
        }
    }

    /**
     * HELLO reply.
     *
     * @param incarnation random per master process: a change tells a client the master restarted and
     *                    its cached segment table is void
     * @param defaultReplicas copies per object when a put asks for 0 (since version 5: a client puts under a
     *                        write lease only when one copy is wanted)
     * @param term the master's leadership term (since version 6; 0 for a master not elected through etcd)
     */
    public record HelloReply(long incarnation, long epoch, int maxKeyBytes, long maxValueBytes, int defaultReplicas,
                             long term) {
        public void write(BodyWriter w) {
            w.i64(incarnation).i64(epoch).i32(maxKeyBytes).i64(maxValueBytes).u8(defaultReplicas).i64(term);
        }

        public static HelloReply read(BodyReader r) {
            return new HelloReply(r.i64("incarnation"), r.i64("epoch"), r.i32("max key bytes"), r.i64("max value bytes"),
                    r.u8("default replicas"), r.i64("term"));
        }
    }

    /** PING: a client's keep-alive; reply is the current epoch. */
    public record Ping(UUID clientId) {
        public void write(BodyWriter w) {
            writeUuid(w, clientId);
        }

        public static Ping read(BodyReader r) {
            return new Ping(readUuid(r));
        }
    }

    // ------------------------------------------------------------------ PUT_START

    /**
     * One object of a PUT_START.
     *
     * @param ifGeneration for an upsert: replace only the object of this generation (and do nothing,
     *                     answering ALREADY_EXISTS, if the key now holds another); 0 replaces whatever is there
     */
    public record PutStartItem(byte[] key, long valueLength, long ifGeneration) {
        public PutStartItem(byte[] key, long valueLength) {
            this(key, valueLength, 0);
        }
    }

    /**
     * PUT_START / BATCH_PUT_START: reserve space for objects.
     *
     * @param upsert           replace an existing object instead of reporting ALREADY_EXISTS
     * @param replicas         copies wanted (best effort, on distinct segments)
     * @param preferredSegment segment name to try first, or empty
     * @param pinSeconds       keep the objects in memory until unpinned ones are gone, for this many
     *                         seconds ({@link #PIN_FOREVER}: until removed; 0: no pin). Granted while the
     *                         pool's pins stay under their cap (the reply says so per object)
     */
    public record PutStart(boolean upsert, int replicas, String preferredSegment, int pinSeconds,
                           List<PutStartItem> items) {
        /** A pin that lasts until the object is removed or replaced. */
        public static final int PIN_FOREVER = -1;

        public PutStart(boolean upsert, int replicas, String preferredSegment, List<PutStartItem> items) {
            this(upsert, replicas, preferredSegment, 0, items);
        }

        public PutStart {
            if (pinSeconds < PIN_FOREVER) {
                throw new IllegalArgumentException("pin seconds " + pinSeconds + ": 0 (none), a positive count, or "
                        + PIN_FOREVER + " (until removed)");
            }
        }

        public void write(BodyWriter w) {
            w.bool(upsert).u8(replicas).string(preferredSegment).i32(pinSeconds).i32(items.size());
            for (PutStartItem it : items) {
                w.bytes(it.key).i64(it.valueLength).i64(it.ifGeneration);
            }
        }

        public static PutStart read(BodyReader r) {
            boolean upsert = r.bool("upsert");
            int replicas = r.u8("replicas");
            String pref = r.string("preferred segment");
            int pin = r.i32("pin seconds");
            if (pin < PIN_FOREVER) {
                throw new BadRequestException("put_start pin seconds " + pin + ": 0 (none), a positive count, or "
                        + PIN_FOREVER + " (until removed)");
            }
            int n = r.count("item count", 19);
            List<PutStartItem> items = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                items.add(new PutStartItem(KeyList.readKey(r), r.length("value length"), r.i64("if generation")));
            }
            return new PutStart(upsert, replicas, pref, pin, items);
        }
    }

    /**
     * Outcome for one key of a PUT_START: where to write it, under which generation, whether the
     * pin the put asked for was granted (false when none was asked for), and for each replica the MAC
     * of its {@link WriteGrant} (since version 9: the grant of that region and generation, which the
     * writer rebuilds from the key and value lengths and relays to the node).
     */
    public record PutStartResult(ResultCode code, long generation, List<Replica> replicas, boolean pinned,
                                 List<byte[]> macs) {
        public PutStartResult {
            if (macs.size() != replicas.size()) {
                throw new IllegalArgumentException(replicas.size() + " replicas but " + macs.size() + " grant MACs");
            }
        }

        /** Unsigned grants (an open master, tests). */
        public PutStartResult(ResultCode code, long generation, List<Replica> replicas, boolean pinned) {
            this(code, generation, replicas, pinned, replicas.stream().map(r -> new byte[WriteGrant.MAC_BYTES]).toList());
        }

        public PutStartResult(ResultCode code, long generation, List<Replica> replicas) {
            this(code, generation, replicas, false);
        }

        /** The grant of replica {@code i}, a region of {@code regionLength} bytes. */
        public WriteGrant grant(int i, long regionLength) {
            return WriteGrant.region(replicas.get(i).offset(), regionLength, generation, macs.get(i));
        }

        public static PutStartResult of(ResultCode code) {
            return new PutStartResult(code, 0, List.of());
        }
    }

    /**
     * PUT_START reply: the epoch and the master's term the reservation belongs to (node writes carry
     * both), and one result per item.
     */
    public record PutStartReply(long epoch, long term, List<PutStartResult> results) {
        public void write(BodyWriter w) {
            w.i64(epoch).i64(term).i32(results.size());
            for (PutStartResult res : results) {
                w.u8(res.code.code);
                if (res.code == ResultCode.OK) {
                    w.i64(res.generation).u8(res.pinned ? 1 : 0).u8(res.replicas.size());
                    for (int j = 0; j < res.replicas.size(); j++) {
                        res.replicas.get(j).write(w);
                        w.fixed(res.macs.get(j));
                    }
                }
            }
        }

        public static PutStartReply read(BodyReader r) {
            long epoch = r.i64("epoch");
            long term = r.i64("term");
            int n = r.count("result count", 1);
            List<PutStartResult> out = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                ResultCode code = ResultCode.of(r.u8("result"));
                if (code != ResultCode.OK) {
                    out.add(PutStartResult.of(code));
                    continue;
                }
                long gen = r.i64("generation");
                int flags = r.u8("flags");
                int nr = r.u8("replica count");
                List<Replica> reps = new ArrayList<>(nr);
                List<byte[]> macs = new ArrayList<>(nr);
                for (int j = 0; j < nr; j++) {
                    reps.add(Replica.read(r));
                    macs.add(r.fixed(WriteGrant.MAC_BYTES, "grant mac"));
                }
                out.add(new PutStartResult(code, gen, reps, (flags & 1) != 0, macs));
            }
            return new PutStartReply(epoch, term, out);
        }
    }

    // ------------------------------------------------------------------ PUT_END / PUT_REVOKE

    /**
     * One item of PUT_END or PUT_REVOKE.
     *
     * @param failedReplicas for PUT_END, a bit per replica (in PUT_START order) whose write failed;
     *                       the master frees those and keeps the rest. Zero for PUT_REVOKE.
     */
    public record PutEndItem(byte[] key, long generation, long failedReplicas) {
    }

    /** PUT_END / PUT_REVOKE and their batch forms. */
    public record PutEnd(List<PutEndItem> items) {
        public void write(BodyWriter w) {
            w.i32(items.size());
            for (PutEndItem it : items) {
                w.bytes(it.key).i64(it.generation).i64(it.failedReplicas);
            }
        }

        public static PutEnd read(BodyReader r) {
            int n = r.count("item count", 19);
            List<PutEndItem> items = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                items.add(new PutEndItem(KeyList.readKey(r), r.i64("generation"), r.i64("failed replicas")));
            }
            return new PutEnd(items);
        }
    }

    /** A reply that is one result code per item (put_end, put_revoke, remove, node_write, node_inventory). */
    public record Codes(List<ResultCode> codes) {
        public void write(BodyWriter w) {
            w.i32(codes.size());
            for (ResultCode c : codes) {
                w.u8(c.code);
            }
        }

        public static Codes read(BodyReader r) {
            int n = r.count("result count", 1);
            List<ResultCode> out = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                out.add(ResultCode.of(r.u8("result")));
            }
            return new Codes(out);
        }
    }

    // ------------------------------------------------------------------ GET_REPLICA_LIST

    /** Where to read one object: its value length, generation and replicas, or NOT_FOUND. */
    public record ReplicaList(ResultCode code, long valueLength, long generation, List<Replica> replicas) {
        public static final ReplicaList NOT_FOUND = new ReplicaList(ResultCode.NOT_FOUND, 0, 0, List.of());
    }

    /** GET_REPLICA_LIST reply. */
    public record ReplicaListReply(List<ReplicaList> items) {
        public void write(BodyWriter w) {
            w.i32(items.size());
            for (ReplicaList it : items) {
                w.u8(it.code.code);
                if (it.code == ResultCode.OK) {
                    w.i64(it.valueLength).i64(it.generation).u8(it.replicas.size());
                    for (Replica rep : it.replicas) {
                        rep.write(w);
                    }
                }
            }
        }

        public static ReplicaListReply read(BodyReader r) {
            int n = r.count("item count", 1);
            List<ReplicaList> out = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                ResultCode code = ResultCode.of(r.u8("result"));
                if (code != ResultCode.OK) {
                    out.add(ReplicaList.NOT_FOUND);
                    continue;
                }
                long len = r.length("value length");
                long gen = r.i64("generation");
                int nr = r.u8("replica count");
                List<Replica> reps = new ArrayList<>(nr);
                for (int j = 0; j < nr; j++) {
                    reps.add(Replica.read(r));
                }
                out.add(new ReplicaList(code, len, gen, reps));
            }
            return new ReplicaListReply(out);
        }
    }

    // ------------------------------------------------------------------ EXIST / SIZE / PREFIX

    /** EXIST_KEY reply: one byte (0 or 1) per key. */
    public record Flags(boolean[] values) {
        public void write(BodyWriter w) {
            w.i32(values.length);
            for (boolean v : values) {
                w.bool(v);
            }
        }

        public static Flags read(BodyReader r) {
            int n = r.count("flag count", 1);
            boolean[] v = new boolean[n];
            for (int i = 0; i < n; i++) {
                v[i] = r.bool("flag");
            }
            return new Flags(v);
        }
    }

    /**
     * TIER_LOOKUP reply: one byte per key, {@link io.kvpool.protocol.TierCounts#ABSENT},
     * {@link io.kvpool.protocol.TierCounts#MEMORY} (a copy in memory) or {@link io.kvpool.protocol.TierCounts#STORAGE}
     * (copies on the SSD tier only).
     */
    public record TierCodes(byte[] codes) {
        public void write(BodyWriter w) {
            w.i32(codes.length).fixed(codes);
        }

        public static TierCodes read(BodyReader r) {
            byte[] c = r.fixed(r.count("tier count", 1), "tier codes");
            for (byte b : c) {
                if (b < 0 || b > io.kvpool.protocol.TierCounts.STORAGE) {
                    throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, "tier code " + b + " is not 0, 1 or 2");
                }
            }
            return new TierCodes(c);
        }
    }

    /** OBJECT_SIZE reply: one i64 per key, -1 for a key that is not present. */
    public record Sizes(long[] values) {
        public void write(BodyWriter w) {
            w.i32(values.length);
            for (long v : values) {
                w.i64(v);
            }
        }

        public static Sizes read(BodyReader r) {
            int n = r.count("size count", 8);
            long[] v = new long[n];
            for (int i = 0; i < n; i++) {
                v[i] = r.i64("size");
            }
            return new Sizes(v);
        }
    }

    // ------------------------------------------------------------------ REMOVE_BY_PREFIX / REMOVE_ALL

    /** REMOVE_BY_PREFIX request: the prefix (u16 length + UTF-8 bytes; may be any length up to the key limit). */
    public record Prefix(byte[] prefix) {
        public void write(BodyWriter w) {
            w.bytes(prefix);
        }

        public static Prefix read(BodyReader r) {
            return new Prefix(r.bytes("prefix"));
        }
    }

    /** REMOVE_ALL request. {@code force} also fences puts in flight by moving to a new epoch. */
    public record RemoveAll(boolean force) {
        public void write(BodyWriter w) {
            w.bool(force);
        }

        public static RemoveAll read(BodyReader r) {
            return new RemoveAll(r.bool("force"));
        }
    }

    /** REMOVE_BY_PREFIX / REMOVE_ALL reply: how many objects were removed and the epoch after it. */
    public record Removed(long count, long epoch) {
        public void write(BodyWriter w) {
            w.i64(count).i64(epoch);
        }

        public static Removed read(BodyReader r) {
            return new Removed(r.i64("count"), r.i64("epoch"));
        }
    }

    // ------------------------------------------------------------------ CLUSTER_STATS

    /**
     * One segment as the master sees it.
     *
     * @param shmPath the shared-memory file backing the segment on its node's machine, or empty: a
     *                client on that machine maps it to read and write without TCP
     */
    public record SegmentInfo(int id, String name, String host, int port, long capacity, long used, long objects,
                              int state, long heartbeatAgeMillis, String shmPath, TierStats tiers) {
        public static final int STATE_JOINING = 0;
        public static final int STATE_ACTIVE = 1;
        /** (version 12) Its node is stopping for a restart: nothing new is placed on it; what it holds is read. */
        public static final int STATE_DRAINING = 2;

        void write(BodyWriter w) {
            w.i32(id).string(name).string(host).i32(port).i64(capacity).i64(used).i64(objects).u8(state)
                    .i64(heartbeatAgeMillis).string(shmPath);
            tiers.write(w);
        }

        static SegmentInfo read(BodyReader r) {
            return new SegmentInfo(r.i32("segment id"), r.string("segment name"), r.string("host"), r.i32("port"),
                    r.i64("capacity"), r.i64("used"), r.i64("objects"), r.u8("state"), r.i64("heartbeat age"),
                    r.string("shm path"), TierStats.read(r));
        }
    }

    /** CLUSTER_STATS reply. */
    public record ClusterStats(long incarnation, long epoch, long keys, long pendingPuts, long allocatedBytes,
                               long capacityBytes, int activeClients, List<SegmentInfo> segments) {
        public void write(BodyWriter w) {
            w.i64(incarnation).i64(epoch).i64(keys).i64(pendingPuts).i64(allocatedBytes).i64(capacityBytes)
                    .i32(activeClients).i32(segments.size());
            for (SegmentInfo s : segments) {
                s.write(w);
            }
        }

        public static ClusterStats read(BodyReader r) {
            long inc = r.i64("incarnation");
            long epoch = r.i64("epoch");
            long keys = r.i64("keys");
            long pending = r.i64("pending puts");
            long alloc = r.i64("allocated bytes");
            long cap = r.i64("capacity bytes");
            int clients = r.i32("active clients");
            int n = r.count("segment count", 40);
            List<SegmentInfo> segs = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                segs.add(SegmentInfo.read(r));
            }
            return new ClusterStats(inc, epoch, keys, pending, alloc, cap, clients, segs);
        }
    }

    // ------------------------------------------------------------------ membership

    /**
     * REGISTER_NODE: a node offers its segment. A node re-registers (with its objects) after a master
     * restart or after being dropped for silence.
     *
     * @param nodeIncarnation random per node process, so the master tells a restart from a reconnect
     * @param epoch           the newest cluster epoch this node has seen
     * @param inventoryCount  how many objects the node will list in NODE_INVENTORY frames
     * @param shmPath         the shared-memory file backing the segment, or empty for anonymous memory
     * @param controlToken    drawn by the node for this registration (version 10): the master presents it
     *                        in every NODE_FREE, NODE_RESET and NODE_REPLICATE to this node ({@link ControlToken})
     * @param previousToken   (version 12) the control token of this node's previous registration under the same
     *                        name, kept in memory by the same process and in a file by its next run; the proof a
     *                        master asks of a registration that would replace a segment whose node still looks
     *                        alive. {@link ControlToken#NONE} when the node has none
     */
    public record RegisterNode(String name, String host, int port, long capacity, long epoch, long nodeIncarnation,
                               long inventoryCount, String shmPath, ControlToken controlToken,
                               ControlToken previousToken) {

        /** A registration without a previous token (a node's first, or one that kept nothing). */
        public RegisterNode(String name, String host, int port, long capacity, long epoch, long nodeIncarnation,
                            long inventoryCount, String shmPath, ControlToken controlToken) {
            this(name, host, port, capacity, epoch, nodeIncarnation, inventoryCount, shmPath, controlToken,
                    ControlToken.NONE);
        }

        public void write(BodyWriter w) {
            w.string(name).string(host).i32(port).i64(capacity).i64(epoch).i64(nodeIncarnation).i64(inventoryCount)
                    .string(shmPath);
            controlToken.write(w);
            previousToken.write(w);
        }

        public static RegisterNode read(BodyReader r) {
            return new RegisterNode(r.string("segment name"), r.string("host"), r.i32("port"), r.length("capacity"),
                    r.i64("epoch"), r.i64("node incarnation"), r.length("inventory count"), r.string("shm path"),
                    ControlToken.read(r), ControlToken.read(r));
        }
    }

    /**
     * NODE_DRAIN (version 12): a node about to stop for a restart asks the master to place nothing more
     * on its segment. Reply: one {@link Codes} item, OK, or NOT_FOUND when the master does not know
     * this registration.
     */
    public record NodeDrain(int segmentId, long nodeIncarnation) {
        public void write(BodyWriter w) {
            w.i32(segmentId).i64(nodeIncarnation);
        }

        public static NodeDrain read(BodyReader r) {
            return new NodeDrain(r.i32("segment id"), r.i64("node incarnation"));
        }
    }

    /**
     * REGISTER_NODE reply.
     *
     * @param keepInventory false when the node's objects are from an older epoch and must be dropped
     */
    public record RegisterReply(int segmentId, long epoch, boolean keepInventory, long term) {
        public void write(BodyWriter w) {
            w.i32(segmentId).i64(epoch).bool(keepInventory).i64(term);
        }

        public static RegisterReply read(BodyReader r) {
            return new RegisterReply(r.i32("segment id"), r.i64("epoch"), r.bool("keep inventory"), r.i64("term"));
        }
    }

    /**
     * A node's counters per tier, sent with every heartbeat and shown by the master's metrics and
     * status. Counters only grow; the disk fields are zero on a node without an SSD tier.
     */
    public record TierStats(long memoryReadBytes, long memoryWrittenBytes, long memoryReads, long diskCapacity,
                            long diskUsed, long diskObjects, long diskHits, long diskReadBytes, long diskWrittenBytes,
                            long diskQueueBytes, long diskDrops, long diskEvictions, long diskPromotions,
                            long diskChecksumFailures) {
        public static final TierStats NONE = new TierStats(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);

        public void write(BodyWriter w) {
            w.i64(memoryReadBytes).i64(memoryWrittenBytes).i64(memoryReads).i64(diskCapacity).i64(diskUsed)
                    .i64(diskObjects).i64(diskHits).i64(diskReadBytes).i64(diskWrittenBytes).i64(diskQueueBytes)
                    .i64(diskDrops).i64(diskEvictions).i64(diskPromotions).i64(diskChecksumFailures);
        }

        public static TierStats read(BodyReader r) {
            return new TierStats(r.i64("memory read bytes"), r.i64("memory written bytes"), r.i64("memory reads"),
                    r.i64("disk capacity"), r.i64("disk used"), r.i64("disk objects"), r.i64("disk hits"),
                    r.i64("disk read bytes"), r.i64("disk written bytes"), r.i64("disk queue bytes"),
                    r.i64("disk drops"), r.i64("disk evictions"), r.i64("disk promotions"),
                    r.i64("disk checksum failures"));
        }

        public boolean hasDisk() {
            return diskCapacity > 0;
        }
    }

    /** NODE_HEARTBEAT; {@code term}: the master term the node follows (version 15). */
    public record Heartbeat(int segmentId, long nodeIncarnation, long epoch, long objects, TierStats tiers, long term) {
        public Heartbeat(int segmentId, long nodeIncarnation, long epoch, long objects) {
            this(segmentId, nodeIncarnation, epoch, objects, TierStats.NONE, 0);
        }

        public void write(BodyWriter w) {
            w.i32(segmentId).i64(nodeIncarnation).i64(epoch).i64(objects);
            tiers.write(w);
            w.i64(term);
        }

        public static Heartbeat read(BodyReader r) {
            return new Heartbeat(r.i32("segment id"), r.i64("node incarnation"), r.i64("epoch"), r.i64("objects"),
                    TierStats.read(r), r.i64("term"));
        }
    }

    /**
     * NODE_HEARTBEAT reply: OK, or NOT_FOUND when the master does not know the node (it must re-register);
     * {@code term}: the master's (version 15), which a node that kept its registration across a promotion follows.
     */
    public record HeartbeatReply(ResultCode code, long epoch, long term) {
        public HeartbeatReply(ResultCode code, long epoch) {
            this(code, epoch, 0);
        }

        public void write(BodyWriter w) {
            w.u8(code.code).i64(epoch).i64(term);
        }

        public static HeartbeatReply read(BodyReader r) {
            return new HeartbeatReply(ResultCode.of(r.u8("result")), r.i64("epoch"), r.i64("term"));
        }

        /**
         * Whether this reply tells the node that sent {@code hb} anything it must act on: register again
         * (NOT_FOUND), a reset it missed (a newer epoch), or another master's term. A NODE_BEACON is answered only
         * then (version 18).
         */
        public boolean newsFor(Heartbeat hb) {
            return code != ResultCode.OK || epoch > hb.epoch() || term != hb.term();
        }
    }

    /**
     * One object a node holds, as listed to the master at registration, in NODE_DISK_ADD (an object
     * the node just spilled to its SSD tier) and NODE_DISK_DROP (one its SSD tier let go of).
     */
    public record InventoryItem(long offset, long generation, long epoch, byte[] key, long valueLength, Tier tier) {
        public InventoryItem(long offset, long generation, long epoch, byte[] key, long valueLength) {
            this(offset, generation, epoch, key, valueLength, Tier.MEMORY);
        }
    }

    /** NODE_INVENTORY: a chunk of a node's object list. Reply: {@link Codes}, ALREADY_EXISTS for objects to drop. */
    public record Inventory(int segmentId, long nodeIncarnation, boolean last, List<InventoryItem> items) {
        public void write(BodyWriter w) {
            w.i32(segmentId).i64(nodeIncarnation).bool(last).i32(items.size());
            for (InventoryItem it : items) {
                w.i64(it.offset).i64(it.generation).i64(it.epoch).bytes(it.key).i64(it.valueLength).u8(it.tier.code);
            }
        }

        public static Inventory read(BodyReader r) {
            int seg = r.i32("segment id");
            long inc = r.i64("node incarnation");
            boolean last = r.bool("last");
            int n = r.count("item count", 36);
            List<InventoryItem> items = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                items.add(new InventoryItem(r.length("offset"), r.i64("generation"), r.i64("epoch"), KeyList.readKey(r),
                        r.length("value length"), Tier.of(r.u8("tier"))));
            }
            return new Inventory(seg, inc, last, items);
        }
    }
}
