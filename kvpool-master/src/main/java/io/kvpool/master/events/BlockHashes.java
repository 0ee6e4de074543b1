package io.kvpool.master.events;

import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;

/**
 * The block hash a router is told for a pool object. The pool knows keys, not blocks, so the hash
 * comes from the key:
 * <ul>
 *   <li>A key whose last {@code /}-separated part is 64 hex digits (every connector key,
 *       {@code kvp1/{model}/{weights}/{ranks}/{dtype}/{block hash}}) names the engine's 32-byte block
 *       hash. The router is told vLLM's int form of it, as vLLM sends with
 *       {@code VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1} (its default): {@code int.from_bytes(hash, "big")
 *       & (2**64 - 1)}, the low 64 bits, which are the key's last 16 hex digits.</li>
 *   <li>Any other key gets the same int form of the SHA-256 of its bytes: stable across masters and
 *       restarts, and reproducible by anyone holding the key ({@code
 *       int.from_bytes(hashlib.sha256(key).digest(), "big") & (2**64 - 1)}).</li>
 * </ul>
 * The value is an unsigned 64-bit number carried in a {@code long}: negative longs are the values of
 * 2^63 and above, and are written as msgpack uint64.
 */
final class BlockHashes {

    /** Hex digits of a 32-byte block hash. */
    static final int HEX_DIGITS = 64;

    private BlockHashes() {
    }

    /** The unsigned 64-bit hash a router is told for {@code key}. */
    static long of(byte[] key) {
        int start = lastPart(key);
        if (key.length - start == HEX_DIGITS && allHex(key, start)) {
            long v = 0;
            for (int i = key.length - 16; i < key.length; i++) {
                v = (v << 4) | Character.digit(key[i], 16);
            }
            return v;
        }
        byte[] d = sha256().digest(key);
        long v = 0;
        for (int i = d.length - 8; i < d.length; i++) {
            v = (v << 8) | (d[i] & 0xFF);
        }
        return v;
    }

    private static int lastPart(byte[] key) {
        for (int i = key.length - 1; i >= 0; i--) {
            if (key[i] == '/') {
                return i + 1;
            }
        }
        return 0;
    }

    private static boolean allHex(byte[] key, int from) {
        for (int i = from; i < key.length; i++) {
            if (Character.digit(key[i], 16) < 0) {
                return false;
            }
        }
        return true;
    }

    private static MessageDigest sha256() {
        try {
            return MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("every JDK has SHA-256", e);
        }
    }
}
