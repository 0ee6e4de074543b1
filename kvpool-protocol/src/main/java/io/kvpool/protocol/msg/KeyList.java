package io.kvpool.protocol.msg;

import io.kvpool.protocol.BodyReader;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.Keys;
import io.kvpool.protocol.BadRequestException;

import java.util.ArrayList;
import java.util.List;

/**
 * The body of every request that names keys only (get_replica_list, exist_key, prefix_match,
 * object_size, remove and their batch forms).
 *
 * <pre>
 *  +-------------+------------------+-----------+------------------+-----------+-----
 *  | count (i32) | key 0 len (u16)  | key 0 ... | key 1 len (u16)  | key 1 ... | ...
 *  +-------------+------------------+-----------+------------------+-----------+-----
 * </pre>
 */
public record KeyList(List<byte[]> keys) {

    public void write(BodyWriter w) {
        w.i32(keys.size());
        for (byte[] k : keys) {
            w.bytes(k);
        }
    }

    public static KeyList read(BodyReader r) {
        int n = r.count("key count", 3);
        List<byte[]> keys = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            keys.add(readKey(r));
        }
        return new KeyList(keys);
    }

    /**
     * A key list read as the keys' digests (a {@link DigestList}), with each key's length checked as {@link #read}
     * checks it and no key copied out of the body: how the master answers PREFIX_MATCH, by digest.
     */
    public static DigestList readDigests(BodyReader r) {
        int n = r.count("key count", 3);
        long[] d = new long[2 * n];
        for (int i = 0; i < n; i++) {
            int len = r.digest("key", d, 2 * i);
            if (len == 0 || len > Keys.MAX_KEY_BYTES) {
                throw badKey(len);
            }
        }
        return new DigestList(d, n);
    }

    /** Reads one key and checks its length, so a malformed key never reaches the index. */
    public static byte[] readKey(BodyReader r) {
        byte[] k = r.bytes("key");
        if (k.length == 0 || k.length > Keys.MAX_KEY_BYTES) {
            throw badKey(k.length);
        }
        return k;
    }

    private static BadRequestException badKey(int length) {
        // well framed but invalid content: the body was read whole, so the connection stays in step
        return new BadRequestException("key of " + length + " bytes is outside the allowed 1.."
                + Keys.MAX_KEY_BYTES + " UTF-8 bytes");
    }
}
