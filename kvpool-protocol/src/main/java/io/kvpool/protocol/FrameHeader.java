package io.kvpool.protocol;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * The fixed 32-byte header that starts every frame, in both directions, on every kvpool connection
 * (client to master, client to node, node to master, master to node). All integers are
 * little-endian.
 *
 * <pre>
 *   0               1               2               3
 *   0 1 2 3 4 5 6 7 0 1 2 3 4 5 6 7 0 1 2 3 4 5 6 7 0 1 2 3 4 5 6 7
 *  +-------------------------------+---------------+---------------+
 *  |         magic 0x504B ("KP")   |    version    |    opcode     |  0
 *  +---------------+---------------+---------------+---------------+
 *  |     flags     |   reserved    |         status (u16)          |  4
 *  +---------------+---------------+-------------------------------+
 *  |                                                               |  8
 *  +                     request id (u64)                          +
 *  |                                                               |
 *  +---------------------------------------------------------------+
 *  |                     body length (u32)                         | 16
 *  +---------------------------------------------------------------+
 *  |                     reserved (u32, zero)                      | 20
 *  +---------------------------------------------------------------+
 *  |                                                               | 24
 *  +                    payload length (u64)                       +
 *  |                                                               |
 *  +---------------------------------------------------------------+
 *  |  body (body length bytes): the operation's fields             | 32
 *  +---------------------------------------------------------------+
 *  |  payload (payload length bytes): raw object bytes, if any     |
 *  +---------------------------------------------------------------+
 * </pre>
 *
 * <ul>
 *   <li><b>flags</b>: bit 0 {@link #FLAG_REPLY} is set on replies; all other bits are zero.</li>
 *   <li><b>status</b>: zero in requests; in replies a {@link FrameStatus} code. A reply with a
 *       non-OK status carries a UTF-8 message as its body (u16 length + bytes).</li>
 *   <li><b>request id</b>: chosen by the requester, echoed in the reply.</li>
 *   <li><b>body</b>: small structured fields, read into memory whole and bounded by the receiver's
 *       {@link Limits#maxBodyBytes()}.</li>
 *   <li><b>payload</b>: object bytes only, never parsed; the node streams it straight between the
 *       socket and its segment, so payload never passes through the Java heap.</li>
 * </ul>
 */
public final class FrameHeader {

    public static final int LENGTH = 32;
    public static final short MAGIC = 0x504B; // bytes 'K','P' when written little-endian
    /**
     * The protocol version: 1 was the pool core; 2 added the SSD tier (a tier byte in replicas and in
     * NODE_READ, NODE_FREE and inventory items, {@code ifGeneration} in PUT_START items, tier
     * statistics in heartbeats and CLUSTER_STATS, NODE_DISK_ADD and NODE_DISK_DROP); 3 added LEASE
     * (read leases and the invalidations that come with them); 4 added the lookups by key digest
     * (PREFIX_MATCH_DIGEST, BATCH_EXIST_DIGEST); 5 added write leases (WRITE_LEASE, COMMIT, RELEASE)
     * and the master's default replica count in the HELLO reply; 6 added the master's term (masters
     * elected through etcd) to the HELLO, PUT_START, WRITE_LEASE and REGISTER_NODE replies and to
     * NODE_WRITE, NODE_SHM_WRITE_BEGIN, NODE_SHM_LEASE, NODE_FREE and NODE_RESET, and the result code DEPOSED;
     * 7 added pins, replica counts in put results and repair; 8 authentication (AUTH_BEGIN, AUTH_PROVE,
     * the status UNAUTHORIZED); 9 write grants: the master's signed permission for each region it
     * reserves, in the PUT_START and WRITE_LEASE replies and relayed in every node write item and
     * NODE_SHM_LEASE ({@link WriteGrants}); 10 node control tokens: a node takes NODE_FREE,
     * NODE_RESET and NODE_REPLICATE only from the master it registered with, which presents the token
     * the node sent in REGISTER_NODE ({@link io.kvpool.protocol.msg.ControlToken}); 11 ranged reads
     * and writes in parts (NODE_READ_RANGE, NODE_PART_BEGIN, NODE_PART_WRITE, NODE_PART_END), which
     * layer-by-layer loads and saves use; 12 restarts that lose nothing: NODE_DRAIN (a node stopping
     * for a restart is placed on no more), the segment state DRAINING, the previous registration's
     * control token in REGISTER_NODE (the proof that a registration is the same node's next one), and
     * NO_SEGMENT from a node that takes no writes while it registers or drains; 13 TIER_LOOKUP, the tier of
     * each key, for routers; 14 BLOCK_INFO (what the engine knows of a block, for the KV events) and the result
     * code QUOTA_EXCEEDED (a namespace over its quota); 15 FEED_FOLLOW and FEED_SNAPSHOT, the leader's
     * change feed that standby masters follow, and the terms in NODE_HEARTBEAT and its reply; 16 stamped
     * same-machine puts (the writer stamps the header, the NODE_SHM_LEASE reply says whether it may); 17
     * NODE_WRITE_COMMIT, a put over TCP whose node commits it for the writer; 18 NODE_BEACON, a heartbeat the
     * master answers only with news.
     */
    public static final byte VERSION = 18;
    public static final byte FLAG_REPLY = 0x01;

    public static final int MAGIC_OFFSET = 0;
    public static final int VERSION_OFFSET = 2;
    public static final int OPCODE_OFFSET = 3;
    public static final int FLAGS_OFFSET = 4;
    public static final int RESERVED8_OFFSET = 5;
    public static final int STATUS_OFFSET = 6;
    public static final int REQUEST_ID_OFFSET = 8;
    public static final int BODY_LENGTH_OFFSET = 16;
    public static final int RESERVED32_OFFSET = 20;
    public static final int PAYLOAD_LENGTH_OFFSET = 24;

    private FrameHeader() {
    }

    /** A new direct buffer sized for one header, in the wire byte order. */
    public static ByteBuffer allocate() {
        return ByteBuffer.allocateDirect(LENGTH).order(ByteOrder.LITTLE_ENDIAN);
    }

    /** Writes a header into {@code buf} at positions 0..31 and flips it ready for writing out. */
    public static ByteBuffer write(ByteBuffer buf, int opcode, boolean reply, int status, long requestId,
                                   int bodyLength, long payloadLength) {
        buf.clear();
        buf.putShort(MAGIC_OFFSET, MAGIC);
        buf.put(VERSION_OFFSET, VERSION);
        buf.put(OPCODE_OFFSET, (byte) opcode);
        buf.put(FLAGS_OFFSET, reply ? FLAG_REPLY : 0);
        buf.put(RESERVED8_OFFSET, (byte) 0);
        buf.putShort(STATUS_OFFSET, (short) status);
        buf.putLong(REQUEST_ID_OFFSET, requestId);
        buf.putInt(BODY_LENGTH_OFFSET, bodyLength);
        buf.putInt(RESERVED32_OFFSET, 0);
        buf.putLong(PAYLOAD_LENGTH_OFFSET, payloadLength);
        buf.limit(LENGTH).position(0);
        return buf;
    }

    /** A decoded header. */
    public record Decoded(int opcode, boolean reply, int status, long requestId, int bodyLength, long payloadLength) {
    }

    /**
     * Decodes and validates a header received in full in {@code buf} (positions 0..31).
     *
     * @throws MalformedFrameException naming the field that is wrong
     */
    public static Decoded decode(ByteBuffer buf, Limits limits) {
        short magic = buf.getShort(MAGIC_OFFSET);
        if (magic != MAGIC) {
            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME,
                    String.format("bad magic 0x%04x (expected 0x%04x): not a kvpool frame", magic & 0xFFFF, MAGIC));
        }
        int version = buf.get(VERSION_OFFSET) & 0xFF;
        long requestId = buf.getLong(REQUEST_ID_OFFSET);
        if (version != VERSION) {
            throw new MalformedFrameException(FrameStatus.UNSUPPORTED_VERSION, requestId,
                    "protocol version " + version + " is not supported (this side speaks version " + VERSION + ")");
        }
        int flags = buf.get(FLAGS_OFFSET) & 0xFF;
        if ((flags & ~FLAG_REPLY) != 0 || buf.get(RESERVED8_OFFSET) != 0 || buf.getInt(RESERVED32_OFFSET) != 0) {
            throw new MalformedFrameException(FrameStatus.MALFORMED_FRAME, requestId,
                    "reserved header bits are set (flags=0x" + Integer.toHexString(flags) + ")");
        }
        int bodyLength = buf.getInt(BODY_LENGTH_OFFSET);
        if (bodyLength < 0 || bodyLength > limits.maxBodyBytes()) {
            throw new MalformedFrameException(FrameStatus.FRAME_TOO_LARGE, requestId,
                    "body length " + Integer.toUnsignedString(bodyLength) + " exceeds the limit of "
                            + limits.maxBodyBytes() + " bytes");
        }
        long payloadLength = buf.getLong(PAYLOAD_LENGTH_OFFSET);
        if (payloadLength < 0 || payloadLength > limits.maxPayloadBytes()) {
            throw new MalformedFrameException(FrameStatus.FRAME_TOO_LARGE, requestId,
                    "payload length " + Long.toUnsignedString(payloadLength) + " exceeds the limit of "
                            + limits.maxPayloadBytes() + " bytes");
        }
        return new Decoded(buf.get(OPCODE_OFFSET) & 0xFF, (flags & FLAG_REPLY) != 0,
                buf.getShort(STATUS_OFFSET) & 0xFFFF, requestId, bodyLength, payloadLength);
    }
}
