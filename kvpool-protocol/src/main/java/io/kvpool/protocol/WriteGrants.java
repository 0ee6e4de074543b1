package io.kvpool.protocol;

import io.kvpool.protocol.msg.WriteGrant;

import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.util.Arrays;

/**
 * Makes and checks {@link WriteGrant}s (protocol version 9, docs/security.md "Write admission").
 *
 * <h2>Why</h2>
 * Authentication (version 8) tells a node that a connection knows the cluster secret, not which
 * regions that client may write: any tenant with the secret could overwrite another's stored value
 * in place with the offset and generation a replica list hands out. So the master, which reserves
 * every region, signs what it reserved, and a node writes for a cluster-secret connection only what a
 * grant covers. Connections that proved the admin secret (the master, a node replicating to another)
 * need no grant.
 *
 * <h2>The MAC</h2>
 * <pre>
 *   key = HMAC-SHA256(admin secret, "kvpool write grant v9")
 *   mac = first 16 bytes of HMAC-SHA256(key, segment id (i32) | term (i64) | offset (i64) |
 *                                           length (i64) | first generation (i64) | count (i32))
 *         (little-endian, 40 bytes)
 * </pre>
 * The segment id keeps a grant for one node from opening another; the term keeps a deposed master's
 * grants from being used under its successor (whose writes carry the new term). Generations never
 * repeat within a term, so a grant cannot reach an object that someone else's put created.
 *
 * <p>Without the admin secret there is no key: {@link #sign} gives a zero MAC and {@link #check}
 * refuses everything; a node in that state accepts writes only from admin connections, which it
 * cannot verify either, i.e. a secured pool needs the admin secret on the master and every node.
 * Thread-safe.
 */
public final class WriteGrants {

    /** No key: zero MACs, nothing verifies (an open pool, where nodes check no grant). */
    public static final WriteGrants UNSIGNED = new WriteGrants(null);

    private static final byte[] LABEL = "kvpool write grant v9".getBytes(StandardCharsets.US_ASCII);
    private static final byte[] ZERO = new byte[WriteGrant.MAC_BYTES];

    private final SecretKeySpec key;
    private final ThreadLocal<Mac> macs;

    private WriteGrants(byte[] derived) {
        this.key = derived == null ? null : new SecretKeySpec(derived, "HmacSHA256");
        this.macs = derived == null ? null : ThreadLocal.withInitial(this::newMac);
    }

    /** The grants of a process holding {@code secrets}: keyed when it holds the admin secret. */
    public static WriteGrants of(Secrets secrets) {
        return secrets.hasAdmin() ? new WriteGrants(Handshake.hmac(secrets.key(Access.ADMIN), LABEL)) : UNSIGNED;
    }

    /** Whether grants made here carry a real MAC. */
    public boolean keyed() {
        return key != null;
    }

    private Mac newMac() {
        try {
            Mac m = Mac.getInstance("HmacSHA256");
            m.init(key);
            return m;
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("HmacSHA256 is not available", e);
        }
    }

    private byte[] mac(int segmentId, long term, long offset, long length, long firstGeneration, int count) {
        if (key == null) {
            return ZERO.clone();
        }
        ByteBuffer in = ByteBuffer.allocate(40).order(ByteOrder.LITTLE_ENDIAN);
        in.putInt(segmentId).putLong(term).putLong(offset).putLong(length).putLong(firstGeneration).putInt(count);
        Mac m = macs.get();
        byte[] full = m.doFinal(in.array());
        return Arrays.copyOf(full, WriteGrant.MAC_BYTES);
    }

    /** A grant of {@code [offset, offset + length)} and {@code count} generations from {@code firstGeneration}. */
    public WriteGrant sign(int segmentId, long term, long offset, long length, long firstGeneration, int count) {
        return new WriteGrant(offset, length, firstGeneration, count,
                mac(segmentId, term, offset, length, firstGeneration, count));
    }

    /** Whether {@code g} was made by a holder of the same admin secret, for this segment and term. */
    public boolean check(WriteGrant g, int segmentId, long term) {
        if (key == null) {
            return false;
        }
        byte[] want = mac(segmentId, term, g.offset(), g.length(), g.firstGeneration(), g.generationCount());
        return MessageDigest.isEqual(want, g.mac());
    }

    /**
     * Checks that {@code g} allows writing {@code regionLength} bytes at {@code offset} under
     * {@code generation} into segment {@code segmentId} for a master of {@code term}; the reason it
     * does not, or null when it does.
     */
    public String refusal(WriteGrant g, int segmentId, long term, long offset, long regionLength, long generation) {
        if (segmentId < 0) {
            return "this node is not registered with a master yet";
        }
        if (!check(g, segmentId, term)) {
            return key == null ? "this node holds no admin secret to check write grants with"
                    : "the write grant was not made by this pool's master for segment " + segmentId + " and term " + term;
        }
        if (!g.covers(offset, regionLength, generation)) {
            return "the write grant (" + g + ") does not cover " + regionLength + " bytes at offset " + offset
                    + " under generation " + generation;
        }
        return null;
    }

    @Override
    public String toString() {
        return key == null ? "WriteGrants[unsigned]" : "WriteGrants[keyed]";
    }
}
